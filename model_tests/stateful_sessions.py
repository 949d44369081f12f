"""The differential state machine for sessions and forks (issue 22).

Writers race on the sessions' leaves as explicit steps: each writer remembers
the leaf it last saw (``look``) and appends, appends a batch, branches or
compacts with ``expected_leaf`` set to it, a compare-and-set on the leaf; a
stale one must be refused with ``SessionModifiedError`` and nothing written.
Blind writers append, title and label without it; turns (a run admitted and finished
``succeeded``) add their entries under the leaf; forks copy a session up to
its latest completed turn, once per request id (the same request gives the
same fork, even after the source moved on; another source under it
conflicts). Ambiguous commits: the write commits, but its caller sees
``OperationalError`` (``store.db.write`` wrapped on the instance, test-only),
and retries: an append given its own ``entry_id`` is then refused by name
(``SessionModifiedError`` whose ``actual_leaf`` is that id, then
``EntryExistsError`` without ``expected_leaf``), a fork's request id answers
with the fork it made. All on an injected clock.

The model is a plain tree per session (entry id → parent and what it adds to
the context); after every step:

- each session's leaf, entry count, title, labels and entries are the model's, and
  its replay is the context the model builds at the leaf (pi's rule: the last
  compaction on the path gives its summary, then the entries from its
  ``firstKeptEntryId``, then those after it);
- each fork's replay is its source's at the turn it was made at, and its
  entry count, title and labels are those of what it copied (the path to that
  turn, and the path to every entry a copied compaction or label names,
  until closed); and the store holds exactly the model's sessions (a fork retried
  after an ambiguous commit made no second one).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import conftest
from conftest import close_backend, open_backend
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from turnkeeper import (
    EntryExistsError,
    EntryKind,
    ForkRequestConflictError,
    NewEntry,
    OperationalError,
    SessionModifiedError,
)
from turnkeeper.fuzz import FakeClock

SESSIONS = ("s1", "s2")
WRITERS = ("w1", "w2", "w3")
REQUESTS = ("f1", "f2", "f3")
REPLY = {"role": "assistant", "content": "done"}

Context = list[tuple[str, str, str]]
"""A replayed context as compared: (entry id, role, text) per message."""


@dataclass(frozen=True)
class Node:
    """One entry: its parent, and what it adds to the context (``role`` None: nothing)."""

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
    updated: datetime  # the last write's time (a refused write leaves it)
    nodes: dict[str, Node] = field(default_factory=dict)
    leaf: str | None = None
    turn_end: str | None = None  # the latest completed turn's turn_end entry

    def path(self, leaf: str | None = None) -> list[str]:
        """Entry ids from the root to ``leaf`` (default: the leaf)."""
        out, at = [], self.leaf if leaf is None else leaf
        while at is not None:
            out.append(at)
            at = self.nodes[at].parent
        return out[::-1]

    def context(self, leaf: str | None = None) -> Context:
        """The replay at ``leaf`` (``storage/replay.py``'s rule, restated)."""
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
        """Target → label, by the label entries (in order; ``None`` clears) among ``among``."""
        keep, out = set(self.nodes if among is None else among), {}
        for e, n in self.nodes.items():
            if e in keep and n.target is not None:
                if n.label is None:
                    out.pop(n.target, None)
                else:
                    out[n.target] = n.label
        return out

    def copied(self, boundary: str) -> set[str]:
        """What a fork at ``boundary`` copies: the path to it, and the path to
        every entry a copied entry refers to (compaction, label), until closed."""
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
    source: str
    context: list[tuple[str, str]]  # roles and texts (a fork's entries have new ids)
    count: int
    title: str | None
    labels: list[tuple[str, str]]  # (the labelled entry's text, its label), sorted
    created: datetime
    fork_id: str | None = None  # None: made by an ambiguous commit, not yet learned


def attempt(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
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


def text_of(entry: Any) -> str:
    """An entry's text as the model holds it (a message's content, else empty)."""
    if entry.kind == EntryKind.MESSAGE:
        return str(entry.payload["message"]["content"])
    if entry.kind == EntryKind.COMPACTION:
        return str(entry.payload["summary"])
    return ""


def seen_context(replay: Any) -> Context:
    """A replay as the model holds it."""
    return [
        (e, m["role"], m["summary"] if m["role"] == "compactionSummary" else m["content"])
        for e, m in zip(replay.entry_ids, replay.messages, strict=True)
    ]


class SessionsMachine(RuleBasedStateMachine):
    backend: ClassVar[str] = "duckdb"
    """The backend each example's store is opened on (see :func:`on`)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store = open_backend(self.backend, None, self.clock)
        self.other = self.store
        if conftest.engine(self.backend) == "postgres":  # another worker's store object
            keys = conftest.TEST_KEYS if self.backend in conftest.ENCRYPTED else None
            url = conftest._OPENED[id(self.store)]
            self.other = conftest.open_pg(url, clock=self.clock, encryption=keys)
        # w3 writes through its own store object on PostgreSQL (its own caches:
        # the replay cache, the calls open at each session's head), as a
        # worker process of its own would
        self.of = {"w1": self.store, "w2": self.store, "w3": self.other}
        self.sessions: dict[str, SessionModel] = {}
        self.seen: dict[tuple[str, str], str | None] = {}  # (writer, session) -> leaf it saw
        self.forks: dict[str, ForkModel] = {}  # request id -> the fork it made
        self.n = 0

    @initialize()
    def create_sessions(self) -> None:
        """Each session begins with one completed turn (so that forks can succeed)."""
        for sid in SESSIONS:
            self.store.sessions.create(sid)
            self.sessions[sid] = SessionModel(self.clock())
            self.turn(sid)
            for writer in WRITERS:
                self.seen[writer, sid] = self.sessions[sid].leaf

    def teardown(self) -> None:
        if self.other is not self.store:
            self.other.close()
        close_backend(self.store)

    def _next(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def _message(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "user", "content": text}}

    @contextmanager
    def _ambiguous(self, store: Any, operation: str) -> Iterator[None]:
        """The first ``operation`` write that commits raises OperationalError
        after its commit, as a connection lost with the COMMIT in flight."""
        real = store.db.write
        fired: list[str] = []

        def write(name: str, body: Any, **kw: Any) -> Any:
            result = real(name, body, **kw)
            # a one-statement append that wrote nothing returns None: not a commit
            wrote = result is not None or kw.get("transaction", True)
            if name == operation and wrote and not fired:
                fired.append(name)
                raise OperationalError(detail="connection lost: the COMMIT's outcome is unknown")
            return result

        store.db.write = write
        try:
            yield
        finally:
            del store.db.write  # the class's method again

    @rule(seconds=st.sampled_from((0.5, 2.0)))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        say(f"clock +{seconds} s")

    # -- writers with a view of the leaf -------------------------------------------

    @rule(writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS))
    def look(self, writer: str, session: str) -> None:
        """The writer reads the session's leaf."""
        got = self.of[writer].sessions.get(session)
        assert got is not None and got.leaf_id == self.sessions[session].leaf
        self.seen[writer, session] = got.leaf_id
        say(f"{writer} sees {session} at {got.leaf_id}")

    def _expected(self, writer: str, session: str) -> tuple[str | None, tuple[Any, ...] | None]:
        """The writer's expected leaf, and the refusal it gets (None: the append goes in)."""
        expected, leaf = self.seen[writer, session], self.sessions[session].leaf
        return expected, (None if expected == leaf else ("modified", leaf))

    @rule(writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS))
    def append(self, writer: str, session: str) -> None:
        expected, refused = self._expected(writer, session)
        text = self._next("note ")
        got = attempt(
            self.of[writer].sessions.append,
            session,
            EntryKind.MESSAGE,
            self._message(text),
            expected_leaf=expected,
        )
        say(f"{writer} appends {text!r} to {session} at {expected}: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got[0] == "ok", got
        self._add(session, got[1].id, Node(expected, "user", text))
        self.seen[writer, session] = got[1].id

    @rule(
        writer=st.sampled_from(WRITERS),
        session=st.sampled_from(SESSIONS),
        size=st.integers(2, 3),
    )
    def append_many(self, writer: str, session: str, size: int) -> None:
        expected, refused = self._expected(writer, session)
        texts = [self._next("batch ") for _ in range(size)]
        got = attempt(
            self.of[writer].sessions.append_many,
            session,
            [(EntryKind.MESSAGE, self._message(t)) for t in texts],
            expected_leaf=expected,
        )
        say(f"{writer} appends {texts!r} to {session} at {expected}: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got[0] == "ok" and len(got[1]) == size, got
        parent = expected
        for entry, text in zip(got[1], texts, strict=True):
            self._add(session, entry.id, Node(parent, "user", text))
            parent = entry.id
        self.seen[writer, session] = parent

    @rule(
        writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS), pick=st.integers(0, 30)
    )
    def branch(self, writer: str, session: str, pick: int) -> None:
        """Move the leaf to an earlier entry (any branch's), or to none (a new root)."""
        model = self.sessions[session]
        ids = list(model.nodes)  # in sequence order: a script replays alike
        target = None if pick == 0 else ids[pick % len(ids)]
        expected, refused = self._expected(writer, session)
        got = attempt(self.of[writer].sessions.branch, session, target, expected_leaf=expected)
        say(f"{writer} branches {session} from {expected} to {target}: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got == ("ok", None), got
        model.leaf, model.updated = target, self.clock()
        self.seen[writer, session] = target

    @rule(
        writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS), keep=st.integers(0, 9)
    )
    def compact(self, writer: str, session: str, keep: int) -> None:
        """A compaction entry keeping the path from one of its entries (or none)."""
        model = self.sessions[session]
        path = model.path()
        first_kept = path[-1 - keep] if keep < len(path) else None
        summary = self._next("summary ")
        payload = {"summary": summary, "firstKeptEntryId": first_kept, "tokensBefore": 100}
        expected, refused = self._expected(writer, session)
        got = attempt(
            self.of[writer].sessions.append,
            session,
            EntryKind.COMPACTION,
            payload,
            expected_leaf=expected,
        )
        say(f"{writer} compacts {session} at {expected} keeping from {first_kept}: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got[0] == "ok", got
        node = Node(expected, "compactionSummary", summary, first_kept, compaction=True)
        self._add(session, got[1].id, node)
        self.seen[writer, session] = got[1].id

    # -- blind writers ---------------------------------------------------------------

    @rule(session=st.sampled_from(SESSIONS))
    def blind_append(self, session: str) -> None:
        """An append without ``expected_leaf``: under whatever the leaf is."""
        text = self._next("blind ")
        entry = self.store.sessions.append(session, EntryKind.MESSAGE, self._message(text))
        say(f"blind append {text!r} to {session}")
        self._add(session, entry.id, Node(self.sessions[session].leaf, "user", text))

    @rule(session=st.sampled_from(SESSIONS))
    def title(self, session: str) -> None:
        name = self._next("title ")
        entry = self.store.sessions.set_title(session, name)
        say(f"title {session} {name!r}")
        self._add(session, entry.id, Node(self.sessions[session].leaf, title=name))

    @rule(session=st.sampled_from(SESSIONS), pick=st.integers(0, 30), clear=st.booleans())
    def label(self, session: str, pick: int, clear: bool) -> None:
        """Label an entry (of any branch), or clear its label: a label entry under the leaf."""
        model = self.sessions[session]
        ids = list(model.nodes)  # in sequence order: a script replays alike
        target, name = ids[pick % len(ids)], None if clear else self._next("label ")
        entry = self.store.sessions.set_label(session, target, name)
        say(f"label {target} of {session} {name!r}")
        self._add(session, entry.id, Node(model.leaf, target=target, label=name))

    @rule(session=st.sampled_from(SESSIONS))
    def turn(self, session: str) -> None:
        """A run admitted and finished ``succeeded``: its entries go under the leaf,
        a chain whose messages are the ask and the reply and whose last entry
        is the turn's ``turn_end``."""
        model = self.sessions[session]
        before = self.store.sessions.get(session)
        assert before is not None
        ask = self._next("ask ")
        run = self.store.runs.admit(
            session, {"q": ask}, user_message={"role": "user", "content": ask}, start=True
        )
        self.store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
        say(f"turn on {session}: {ask!r}")
        new = [e for e in self.store.sessions.entries(session) if e.seq >= before.next_seq]
        parent, said = model.leaf, []
        for e in new:
            assert e.parent_id == parent, (e, parent)  # a chain under the leaf
            message = e.payload.get("message") if e.kind == EntryKind.MESSAGE else None
            if message is not None:
                said.append((message["role"], message["content"]))
            role = None if message is None else message["role"]
            self._add(
                session, e.id, Node(parent, role, "" if message is None else message["content"])
            )
            parent = e.id
        assert said == [("user", ask), ("assistant", REPLY["content"])], said
        assert new[-1].kind == EntryKind.TURN_END, new[-1]
        model.turn_end = new[-1].id

    def _add(self, session: str, entry_id: str, node: Node) -> None:
        model = self.sessions[session]
        assert entry_id not in model.nodes, entry_id
        model.nodes[entry_id] = node
        model.leaf, model.updated = entry_id, self.clock()

    # -- forks -------------------------------------------------------------------------

    def _fork_outcome(self, session: str, request: str) -> tuple[str, ForkModel | None]:
        made = self.forks.get(request)
        if made is not None:
            return ("same" if made.source == session else "conflict"), made
        model = self.sessions[session]
        assert model.turn_end is not None  # every session has a completed turn
        context = [(role, text) for _, role, text in model.context(model.turn_end)]
        copied = model.copied(model.turn_end)
        labels = sorted((model.nodes[t].text, v) for t, v in model.labels(copied).items())
        title = model.title(copied)
        return "new", ForkModel(session, context, len(copied), title, labels, self.clock())

    @rule(session=st.sampled_from(SESSIONS), request=st.sampled_from(REQUESTS))
    def fork(self, session: str, request: str) -> None:
        """A fork by request id: new, the same fork again, or a conflict."""
        outcome, made = self._fork_outcome(session, request)
        got = attempt(self.store.forks.fork, session, request_id=request)
        say(f"fork {session} as {request}: {got[0]} ({outcome})")
        if outcome == "conflict":
            assert got == ("conflict",), got
            return
        assert got[0] == "ok" and made is not None, got
        fork = got[1]
        assert fork.source_session_id == session and fork.entries_copied == made.count, fork
        if made.fork_id is None:  # new, or made by an ambiguous commit: learned now
            assert fork.fork_session_id not in self.sessions, fork
            made.fork_id = fork.fork_session_id
        assert fork.fork_session_id == made.fork_id, (fork, made)
        self.forks[request] = made

    @rule(session=st.sampled_from(SESSIONS), request=st.sampled_from(REQUESTS))
    def ambiguous_fork(self, session: str, request: str) -> None:
        """A fork that commits while its caller sees OperationalError; a later
        fork under the same request id must answer with it."""
        outcome, made = self._fork_outcome(session, request)
        with self._ambiguous(self.store, "fork_session"):
            got = attempt(self.store.forks.fork, session, request_id=request)
        say(f"fork {session} as {request}, outcome unknown: {got[0]} ({outcome})")
        if outcome == "conflict":
            assert got == ("conflict",), got
            return
        assert got == ("unknown",), got  # it committed (a new fork, or the same one read)
        assert made is not None
        self.forks[request] = made  # a new fork's id is not known yet

    @rule(
        writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS), size=st.integers(1, 3)
    )
    def ambiguous_append(self, writer: str, session: str, size: int) -> None:
        """An append (``size`` 1) or a batch, each entry with its own id, that
        commits while its caller sees OperationalError, retried as the README
        says (look before writing it again): the retry under the same
        ``expected_leaf`` is refused with the leaf now its last id, and one
        without is refused as its first id taken."""
        store = self.of[writer]
        expected, refused = self._expected(writer, session)
        ids = [self._next("own-") for _ in range(size)]
        texts = [self._next("own ") for _ in ids]
        if size == 1:
            operation, args = "append", (session, EntryKind.MESSAGE, self._message(texts[0]))
            call = store.sessions.append
        else:
            batch = [
                NewEntry(EntryKind.MESSAGE, self._message(t), entry_id=e)
                for e, t in zip(ids, texts, strict=True)
            ]
            operation, args, call = "append_many", (session, batch), store.sessions.append_many
        own = {"entry_id": ids[0]} if size == 1 else {}
        with self._ambiguous(store, operation):
            got = attempt(call, *args, expected_leaf=expected, **own)
        say(f"{writer} appends {ids} to {session} at {expected}, outcome unknown: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got == ("unknown",), got
        parent = expected
        for e, t in zip(ids, texts, strict=True):
            self._add(session, e, Node(parent, "user", t))
            parent = e
        again = attempt(call, *args, expected_leaf=expected, **own)
        assert again == ("modified", ids[-1]), again  # the leaf is its last entry: it committed
        blind = attempt(call, *args, **own)
        assert blind == ("exists",), blind
        self.seen[writer, session] = ids[-1]

    @rule(
        writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS), pick=st.integers(0, 30)
    )
    def ambiguous_branch(self, writer: str, session: str, pick: int) -> None:
        """A branch that commits while its caller sees OperationalError; its
        retry under the same ``expected_leaf`` is refused with the leaf its
        target (or, the target being that leaf, moves nothing)."""
        model = self.sessions[session]
        ids = list(model.nodes)  # in sequence order: a script replays alike
        target = None if pick == 0 else ids[pick % len(ids)]
        expected, refused = self._expected(writer, session)
        with self._ambiguous(self.of[writer], "branch"):
            got = attempt(self.of[writer].sessions.branch, session, target, expected_leaf=expected)
        say(f"{writer} branches {session} from {expected} to {target}, outcome unknown: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got == ("unknown",), got
        model.leaf, model.updated = target, self.clock()
        again = attempt(self.of[writer].sessions.branch, session, target, expected_leaf=expected)
        assert again == (("ok", None) if target == expected else ("modified", target)), again
        self.seen[writer, session] = target

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def sessions_are_the_models(self) -> None:
        for sid, model in self.sessions.items():
            got = self.store.sessions.get(sid)
            assert got is not None, sid
            assert got.leaf_id == model.leaf, (sid, got.leaf_id, model.leaf)
            assert got.entry_count == len(model.nodes), (sid, got.entry_count, len(model.nodes))
            assert got.title == model.title(), (sid, got.title)
            assert got.updated_at == model.updated, (sid, got.updated_at, model.updated)
            assert self.store.sessions.labels(sid) == model.labels(), sid
            stored = {e.id: e.parent_id for e in self.store.sessions.entries(sid)}
            assert stored == {e: n.parent for e, n in model.nodes.items()}, sid
            for store in {id(self.store): self.store, id(self.other): self.other}.values():
                context = seen_context(store.sessions.replay(sid))
                assert context == model.context(), (sid, context, model.context())

    @invariant()
    def forks_are_the_models(self) -> None:
        rows = self.store.db.read(
            "test-sessions", lambda tx: tx.one("SELECT count(*) FROM sessions")
        )
        assert rows == (len(self.sessions) + len(self.forks),), (rows, self.forks)
        for request, made in self.forks.items():
            if made.fork_id is None:
                continue
            got = self.store.sessions.get(made.fork_id)
            assert got is not None and got.entry_count == made.count, (request, got)
            assert got.title == made.title, (request, got.title, made.title)
            assert got.updated_at == made.created, (request, got.updated_at, made.created)
            texts = {e.id: text_of(e) for e in self.store.sessions.entries(made.fork_id)}
            labels = self.store.sessions.labels(made.fork_id)
            assert sorted((texts[t], v) for t, v in labels.items()) == made.labels, request
            context = [(r, t) for _, r, t in seen_context(self.store.sessions.replay(made.fork_id))]
            assert context == made.context, (request, context, made.context)


def on(backend: str) -> type[SessionsMachine]:
    """The machine with its stores on ``backend``."""
    return type(f"SessionsMachine_{backend}", (SessionsMachine,), {"backend": backend})
