"""An import's entries stored a chunk at a time, and judged as they go.

An import judges and stores all of a file's new entries in one transaction
(a line that refuses the file leaves nothing written), but it holds only
:data:`CHUNK` of them at a time, never the file: each chunk is checked
against what the session holds (ids stored before the import are skipped,
an id the import itself wrote earlier is a duplicate), inserted, then
judged entry by entry in file order, as an append would be
(``pairing_checks.check``: the calls open at the entry's parent, remembered
for the last :data:`OPENINGS` entries judged or read back from the entries
written so far; a compaction's kept tail read back as far as its first kept
entry). Held between chunks is only that: the calls open at recent entries,
the ids new entries named as a parent that was missing when they came, and
the first fault found while a branch could still change.

An entry whose parent is missing when it comes (an unparseable line, a
parent further down the file) is judged as the root of its branch, as
replay walks it then. If a later entry supplies such a parent, or a parent
an entry the session held before names (a read per chunk of a session that
existed), branches change under entries already judged, and the whole tree
is judged again at the end, as ``turnkeeper audit`` judges one
(:func:`judge_tree`, which holds the session's entries: only in that case).
So a fault found while that may still happen (a parent is missing, or the
session held entries before) is raised at the end, once it is known that
no branch changed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.clear_facts import clear_facts
from turnkeeper.spec.entries import RESERVED_ENTRY_SUFFIXES, EntryKind
from turnkeeper.spec.records import Entry

from ..backend import Tx, keyed
from ..codec import from_json
from ..crypto.keyring import UNREAD
from ..pairing import Opening, cycles, restart, tree_faults
from . import entry_rows, pairing_checks, session_rows, usage
from .entry_rows import ENTRY_COLUMNS, OF_SESSION

Row = tuple[str, str | None, str, datetime, str, Mapping[str, Any] | None]
"""An entry to import: ``(id, parent_id, kind, timestamp, payload_json, payload)``,
``payload`` the decoded JSON when the caller holds it (the judge reads it
instead of decoding ``payload_json`` a second time), else ``None``."""

CHUNK = 2000
"""Entries an import holds at a time (read, checked, inserted and judged together)."""

OPENINGS = 2 * CHUNK
"""Entries whose open calls an import remembers (least recently judged dropped);
an entry's parent older than that is read back from the entries written."""


def payload_of(row: Row) -> Mapping[str, Any]:
    """The row's payload, decoded."""
    decoded = row[5]
    return from_json(row[4]) if decoded is None else decoded


def run_owns(run_id: str, entry_id: str) -> bool:
    """Whether ``entry_id`` is one the store derives from ``run_id`` (a run's
    turn entries, reply and the results its end writes)."""
    return entry_id.startswith(f"{run_id}:") and entry_id.endswith(RESERVED_ENTRY_SUFFIXES)


def _chunks(rows: Iterable[Row]) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass
class Added:
    """What :func:`add_entries` did: entries ``added`` and ``skipped`` (stored
    before), usage records added, the last title a new ``session_info`` gave."""

    added: int = 0
    skipped: int = 0
    usage_added: int = 0
    title: str | None = None


@dataclass
class _Judge:
    """The pairing judge's state between chunks (see the module docstring)."""

    session_id: str
    start: int
    live_run: str | None
    existed: bool
    """The session held entries before: a branch to a new entry may change
    (a later entry may supply a stored entry's missing parent)."""
    missing: set[str] = field(default_factory=set)
    """Ids a new entry named as its parent while no entry had it."""
    openings: OrderedDict[str, Opening] = field(default_factory=OrderedDict)
    supplied: bool = False
    """A new entry took an id of :attr:`missing`: judge the whole tree at the end."""
    deferred: errors.TurnkeeperError | None = None

    def entry(self, tx: Tx, row: Row, seq: int) -> None:
        """Judge ``row``, stored at ``seq`` (see the module docstring)."""
        entry_id, parent, kind, ts = row[:4]
        if self.live_run is not None and run_owns(self.live_run, entry_id):
            raise errors.EntryIdReservedError(self.session_id, entry_id, "run", self.live_run)
        if self.supplied:
            return
        here = None if parent is None else self.openings.get(parent)
        if parent is not None and here is None:
            found = entry_rows.entry(tx, self.session_id, parent)
            if found is None or found.seq >= seq:  # missing (for now): a root
                if self.live_run is not None and run_owns(self.live_run, parent):
                    raise errors.EntryIdReservedError(self.session_id, parent, "run", self.live_run)
                self.missing.add(parent)
                here = Opening(parent, seq)
            else:
                here = pairing_checks.opening_at(tx, self.session_id, parent, seq)
        if entry_id in self.missing:  # it supplies a parent: branches change
            self.supplied = True
            return
        if self.deferred is not None:  # refused at the end, or the whole tree judged
            return
        here = Opening(None, seq) if here is None else replace(here, next_seq=seq)
        new = Entry(self.session_id, entry_id, parent, kind, seq, ts, payload_of(row))
        try:
            if kind == EntryKind.COMPACTION:
                context, faults = restart(new, self._kept(tx, new))
                pairing_checks.refuse(self.session_id, faults)
                after: Opening | None = context.opening(entry_id, seq + 1)
            else:
                after = pairing_checks.check(tx, self.session_id, parent, seq, [new], here)
        except errors.ToolCallPairingError as exc:
            if not (self.existed or self.missing):
                raise
            self.deferred = self.deferred or exc
            after = None
        if after is None:  # not a message (or a deferred fault): the calls open stay
            after = Opening(entry_id, seq + 1, here.holder, here.optional, here.calls)
        self.openings[entry_id] = after
        while len(self.openings) > OPENINGS:
            self.openings.popitem(last=False)

    def _kept(self, tx: Tx, compaction: Entry) -> list[Entry]:
        """A compaction's kept tail (:func:`~turnkeeper.storage.pairing.restart`),
        read back from its parent one entry at a time as far as its
        ``firstKeptEntryId`` (the whole branch only when that is not on it)."""
        first_kept = compaction.payload.get("firstKeptEntryId")
        tail: list[Entry] = []
        node = compaction.parent_id
        seen: set[str] = set()
        while node is not None and node not in seen:
            found = entry_rows.entry(tx, self.session_id, node)
            if found is None or found.seq >= compaction.seq:
                break
            seen.add(node)
            tail.append(found)
            if found.id == first_kept:
                return tail[::-1]
            node = found.parent_id
        return []

    def finish(self, tx: Tx) -> None:
        """Raise what the import brings that no write may make (see the module
        docstring)."""
        if self.supplied:
            judge_tree(tx, self.session_id, self.start, self.live_run)
        elif self.deferred is not None:
            raise self.deferred


def add_entries(
    tx: Tx,
    session_id: str,
    rows: Iterable[Row],
    next_seq: int,
    created: bool,
    live_run: str | None,
    tail: bool = False,
    version: int | None = UNREAD,
) -> Added:
    """Store the entries of ``rows`` (file order) the session lacks, :data:`CHUNK`
    at a time from ``next_seq``, judged as they go, and the usage their
    assistant messages carry that the session has not recorded (from the
    entry as the session holds it, when it held it before). Does not move the
    session's head (the caller does, with :attr:`Added.added`). ``version``:
    the session row's data key version as the caller read it (see
    ``Keyring.sealing``).

    Raises:
        ToolCallPairingError: the new entries break the tool-call pairing
            (``ToolCallsUnansweredError`` among them).
        EntryCycleError, EntryIdReservedError: see :func:`judge_tree`.
        InvalidInputError: two rows share an id.
        ImportTailStoredError: ``tail`` (the rows are the lines appended to
            a file since its last import) and a row's id is stored.
    """
    judge = _Judge(session_id, next_seq, live_run, not created)
    done = Added()
    now = tx.now
    responses: set[str] = set()
    for chunk in _chunks(rows):
        ids = [r[0] for r in chunk]
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            twice = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise errors.InvalidInputError("entries", f"duplicate entry id {twice!r} in the batch")
        stored: dict[str, Entry] = {}
        if not created or done.added:
            for e in _existing(tx, session_id, ids):
                if e.seq >= judge.start:
                    raise errors.InvalidInputError(
                        "entries", f"duplicate entry id {e.id!r} in the batch"
                    )
                stored[e.id] = e
        if tail and stored:  # a repeated line of the file, or an entry stored otherwise
            raise errors.ImportTailStoredError(session_id, next(iter(stored)))
        new = [r for r in chunk if r[0] not in stored]
        if (
            new
            and not created
            and session_rows.named_as_parent(tx, session_id, [r[0] for r in new])
        ):
            judge.supplied = True  # an entry the session held hangs under a new one
        if new:
            sealed, _ = entry_rows.seal_payloads(
                tx, session_id, [(r[0], r[4]) for r in new], version
            )
            tx.insert_rows(
                "entries",
                ENTRY_COLUMNS,
                [
                    (
                        session_id,
                        r[0],
                        r[1],
                        r[2],
                        next_seq + i,
                        r[3],
                        text,
                        None,
                        now,
                        *clear_facts(r[2], payload_of(r)),
                    )
                    for i, (r, text) in enumerate(zip(new, sealed, strict=True))
                ],
            )
            for i, r in enumerate(new):
                judge.entry(tx, r, next_seq + i)
                if r[2] == EntryKind.SESSION_INFO:
                    name = payload_of(r).get("name")
                    done.title = name if isinstance(name, str) else done.title
        next_seq += len(new)
        done.added += len(new)
        done.skipped += len(chunk) - len(new)
        messages = [
            (held.id, held.kind, held.timestamp, held.payload)
            if (held := stored.get(r[0])) is not None
            else (r[0], r[2], r[3], payload_of(r))
            for r in chunk
            if r[2] == EntryKind.MESSAGE and '"usage"' in r[4]
        ]
        done.usage_added += usage.import_usage(tx, session_id, messages, responses)
    judge.finish(tx)
    return done


def _existing(tx: Tx, session_id: str, ids: Sequence[str]) -> list[Entry]:
    """The entries of the session among ``ids`` (one statement)."""
    return [
        entry_rows.entry_row(tx, r)
        for r in tx.rows(
            f"SELECT {entry_rows.entry_columns(tx)} FROM entries "
            f"WHERE {keyed('id', OF_SESSION, 'ANY(?::VARCHAR[])')}",
            [list(ids), session_id],
            replan=True,  # a list of ids (see Tx.rows)
        )
    ]


def judge_tree(tx: Tx, session_id: str, start: int, live_run: str | None) -> None:
    """Judge the session's whole tree as ``turnkeeper audit`` judges one, the
    entries from seq ``start`` on being the import's: refuse a cycle of parents
    through a new entry; a new entry whose missing parent ``live_run`` owns;
    a fault of the tool-call pairing a new entry brings (one the tree held
    before is not the import's: an entry's faults depend only on the branch
    to it, unless the import supplies an entry's missing parent, and then the
    faults it brings are the ones that are new). Holds the session's entries.

    Raises:
        EntryCycleError: the first cycle through a new entry.
        EntryIdReservedError: (``reason`` ``"run"``) a missing parent ``live_run`` owns.
        ToolCallPairingError: the first fault the import brings.
    """
    tree = {
        e.id: e
        for e in (
            entry_rows.entry_row(tx, row)
            for row in tx.rows(
                f"SELECT {entry_rows.entry_columns(tx)} FROM entries WHERE session_id = ? "
                "ORDER BY seq",
                [session_id],
            )
        )
    }
    stored = {i: e for i, e in tree.items() if e.seq < start}
    added = {i for i, e in tree.items() if e.seq >= start}
    for cycle in cycles(tree):
        if added.intersection(cycle):
            raise errors.EntryCycleError(session_id, tuple(cycle))
    if live_run is not None:
        for entry_id in added:
            parent = tree[entry_id].parent_id
            if parent is not None and parent not in tree and run_owns(live_run, parent):
                raise errors.EntryIdReservedError(session_id, parent, "run", live_run)
    before = set(tree_faults(stored)) if stored else set()
    pairing_checks.refuse(session_id, [f for f in tree_faults(tree) if f not in before])
