"""The sessions machine's model (:mod:`.sessions`), and how the machine
reads the store's answers (:func:`attempt`, :func:`seen_context`) and loses
a committed write's reply (:func:`lost_reply`).

The model is a plain tree per session: entry id → :class:`Node` (its
parent, and what it adds to the context), with the leaf, the latest
completed turn and the time of the last write; :class:`ForkModel` is what
a fork made under a request id must hold.
The replay rule is pi's, restated without the store (``storage/replay.py``):
the last compaction on the path to the leaf gives its summary, then the
entries from its ``firstKeptEntryId``, then those after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hypothesis import currently_in_test_context, note

from turnkeeper import (
    BaseStore,
    Entry,
    EntryExistsError,
    EntryKind,
    ForkRequestConflictError,
    OperationalError,
    Replay,
    SessionModifiedError,
)

Context = list[tuple[str, str, str]]
"""A replayed context as compared: (entry id, role, text) per message."""


@dataclass(frozen=True)
class Node:
    """One entry: its ``parent`` (an entry id, or ``None`` for a root) and what
    it adds to the context: a message's ``role`` and ``text`` (``role`` None:
    nothing), a compaction's summary (``text``) and ``first_kept`` entry id,
    a ``session_info`` entry's ``title``, a label entry's ``target`` entry id
    and ``label`` (``None``: it clears the target's label)."""

    parent: str | None
    role: str | None = None
    text: str = ""
    first_kept: str | None = None  # a compaction's firstKeptEntryId
    compaction: bool = False
    title: str | None = None  # a session_info entry's name
    target: str | None = None  # a label entry's targetId
    label: str | None = None  # its label (None: it clears)


@dataclass
class SessionModel:
    """A session as the model holds it: ``nodes`` in sequence order, the
    ``leaf`` (``None``: before the first entry, or branched to a new root),
    ``turn_end`` (the latest completed turn's ``turn_end`` entry id) and
    ``updated`` (the last write's time, aware UTC; a refused write leaves it)."""

    updated: datetime
    nodes: dict[str, Node] = field(default_factory=dict)
    leaf: str | None = None
    turn_end: str | None = None

    def path(self, leaf: str | None = None) -> list[str]:
        """Entry ids from the root to ``leaf`` (default: the leaf). Raises
        ``KeyError`` for an id the session does not hold."""
        out, at = [], self.leaf if leaf is None else leaf
        while at is not None:
            out.append(at)
            at = self.nodes[at].parent
        return out[::-1]

    def context(self, leaf: str | None = None) -> Context:
        """The replay at ``leaf`` (default: the leaf), by pi's rule."""
        path = self.path(leaf)
        cut = max((i for i, e in enumerate(path) if self.nodes[e].compaction), default=-1)

        def said(ids: list[str]) -> Context:
            return [
                (e, n.role, n.text) for e in ids if (n := self.nodes[e]).role and not n.compaction
            ]

        if cut < 0:
            return said(path)
        comp = self.nodes[path[cut]]
        before = path[:cut]
        kept = before[before.index(comp.first_kept) :] if comp.first_kept in before else []
        return [(path[cut], "compactionSummary", comp.text), *said(kept), *said(path[cut + 1 :])]

    def title(self, among: Iterable[str] | None = None) -> str | None:
        """The latest title written (``set_title``: the latest one wins, on any
        branch), among the entries ``among`` if given (a fork's: those it copied)."""
        keep = set(self.nodes if among is None else among)
        titles = [n.title for e, n in self.nodes.items() if e in keep and n.title is not None]
        return titles[-1] if titles else None

    def labels(self, among: Iterable[str] | None = None) -> dict[str, str]:
        """Target entry id → label, by the label entries (in order; a ``None``
        label clears) among ``among`` if given."""
        keep = set(self.nodes if among is None else among)
        out: dict[str, str] = {}
        for e, n in self.nodes.items():
            if e in keep and n.target is not None:
                if n.label is None:
                    out.pop(n.target, None)
                else:
                    out[n.target] = n.label
        return out

    def copied(self, boundary: str) -> set[str]:
        """The entry ids a fork at ``boundary`` copies: the path to it, and the
        path to every entry a copied entry refers to (compaction, label),
        until closed."""
        taken: set[str] = set()
        pending = [boundary]
        while pending:
            for e in self.path(pending.pop()):
                if e not in taken:
                    taken.add(e)
                    node = self.nodes[e]
                    ref = node.first_kept if node.compaction else node.target
                    if ref is not None and ref not in taken:
                        pending.append(ref)
        return taken


@dataclass
class ForkModel:
    """What the fork a request id made must hold: its ``source`` session, its
    replay as (role, text) pairs (a fork's entries have new ids), its entry
    ``count``, ``title``, ``labels`` as (the labelled entry's text, label)
    pairs, sorted, its ``created`` time, and its ``fork_id`` (``None``: made
    by an ambiguous commit, its id not learned yet)."""

    source: str
    context: list[tuple[str, str]]
    count: int
    title: str | None
    labels: list[tuple[str, str]]
    created: datetime
    fork_id: str | None = None


def text_of(entry: Entry) -> str:
    """An entry's text as the model holds it: a message's content, a
    compaction's summary, else empty."""
    payload: Any = entry.payload
    if entry.kind == EntryKind.MESSAGE:
        return str(payload["message"]["content"])
    if entry.kind == EntryKind.COMPACTION:
        return str(payload["summary"])
    return ""


def seen_context(replay: Replay) -> Context:
    """A store's replay as the model holds it: (entry id, role, text) per
    message, a compaction summary's text being its summary."""
    messages: list[Any] = list(replay.messages)
    return [
        (e, m["role"], m["summary"] if m["role"] == "compactionSummary" else m["content"])
        for e, m in zip(replay.entry_ids, messages, strict=True)
    ]


LOST = "connection lost: the COMMIT's outcome is unknown"
"""The detail of the ``OperationalError`` :func:`lost_reply` raises."""


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """Run a store call and say what its caller saw: ``("ok", value)``,
    ``("modified", actual_leaf)``, ``("exists",)``, ``("conflict",)`` or
    ``("unknown",)`` (an ``OperationalError``: the caller cannot tell whether
    it committed); other errors propagate."""
    try:
        return ("ok", fn(*args, **kwargs))
    except SessionModifiedError as e:
        return ("modified", e.actual_leaf)
    except EntryExistsError:
        return ("exists",)
    except ForkRequestConflictError:
        return ("conflict",)
    except OperationalError:
        return ("unknown",)  # the ambiguous commit: the caller cannot tell


def say(step: str) -> None:
    """``note`` the step (so that a shrunk failure reads as a script), when
    Hypothesis runs it (a stored counterexample replays outside a test)."""
    if currently_in_test_context():
        note(step)


@contextmanager
def lost_reply(store: BaseStore, operation: str) -> Iterator[None]:
    """Within the block, the first write named ``operation`` (a backend
    operation name: ``"append"``, ``"branch"``, ``"fork_session"`` …) of
    ``store`` that commits raises ``OperationalError`` (detail :data:`LOST`)
    to its caller after its commit, as a connection lost with the COMMIT in
    flight. A write that refuses raises its own error, and a one-statement
    append that wrote nothing (it returns ``None``, and the store retries it
    in a transaction) is no commit. The patch is an instance attribute of
    ``store``'s backend, removed on exit."""
    db: Any = store.db
    real = db.write
    fired: list[str] = []

    def write(name: str, body: Callable[..., Any], **kw: Any) -> Any:
        result = real(name, body, **kw)
        wrote = result is not None or kw.get("transaction", True)
        if name == operation and wrote and not fired:
            fired.append(name)
            raise OperationalError(detail=LOST)
        return result

    own = vars(db).get("write")  # an instance attribute already there (another patch)
    db.write = write
    try:
        yield
    finally:
        if own is None:
            del db.write  # the class's method again
        else:
            db.write = own
