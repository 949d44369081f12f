"""Session forks on DuckDB (session seed ForkSession).

A fork is one transaction:

1. the request: the ``session_forks`` row keyed by the request id's digest;
   the same request returns the stored fork (even if the source has moved
   on or become active since), a different one conflicts;
2. the source: it exists; with a fork lease, the lease is fenced (a write
   to its row) and must be of purpose ``fork``; the source has no
   non-terminal run and, without a lease, no live lease held by anyone;
3. the boundary: a completed turn (``spec.fork``), the latest one or the
   one named; its ``turn_end`` entry must be in the transcript;
4. the copy (:func:`plan_copy`, pure): the branch from the root to that
   ``turn_end`` entry, plus the branch of every entry a copied entry refers
   to (a branch summary's ``fromId`` is the leaf it abandoned, as a rule
   on another branch), repeated until closed. The copied entries get new
   ids, their parents and references are rewritten, seq, kind, timestamp
   and every other payload field are kept, so the fork's replay equals the
   source's replay at the boundary apart from entry ids;
5. the writes: the new session (header ``parentSession``,
   ``forkBoundarySeq``, ``seedLength``, ``forkKind``), its entries, and the
   ``session_forks`` row.

Two concurrent forks under one request id both insert a ``session_forks``
row with the same key: DuckDB reports the loser's duplicate key as a
conflict, the transaction boundary retries it, and the retry finds the
winner's row and returns its fork. The source's session and entry rows
are only read, so a fork never blocks or invalidates the source's writers.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import uuid6

from turnkeeper.spec import LeasePurpose, errors
from turnkeeper.spec.entries import EntryKind, is_known_kind
from turnkeeper.spec.fork import (
    COMPLETED_TURN_STATUSES,
    ENTRY_REFERENCES,
    Fork,
    ForkKind,
    check_request_id,
    referenced_id,
    remap_reference,
)
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import Entry, Lease

from ..backend import Tx, keyed, present, utc
from ..codec import check_id, from_json, to_json
from ..crypto.keyring import PAYLOAD
from ..pairing import tree_faults
from ..validate import check_int, check_session_lease
from . import leases, session_rows
from .base import Area
from .entry_rows import CLEAR_COLUMNS, ENTRY_COLUMNS, seal_payloads
from .session_rows import ID_HEAD, new_entry_id

_FORK_COLS = (
    "source_session_id, fork_session_id, kind, boundary_turn_id, boundary_entry_id, "
    "boundary_seq, leaf_id, entries_copied, created_at"
)
_COMPLETED = sorted(COMPLETED_TURN_STATUSES)
_IN_COMPLETED = f"status IN ({', '.join('?' for _ in _COMPLETED)})"


@dataclass(frozen=True, slots=True)
class Request:
    """A fork request, checked: what the caller asked for."""

    request_id: str
    digest: str
    fingerprint: str
    source_session_id: str
    fork_session_id: str
    boundary_turn_id: str | None
    at_seq: int | None
    lease: Lease | None

    @property
    def kind(self) -> ForkKind:
        named = self.boundary_turn_id is not None or self.at_seq is not None
        return ForkKind.MESSAGE if named else ForkKind.SESSION


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """A source entry as stored; ``payload`` is the stored JSON text, ``clear``
    its clear facts as stored (``entry_rows.CLEAR_COLUMNS``)."""

    id: str
    parent_id: str | None
    kind: str
    seq: int
    ts: datetime
    payload: str
    clear: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class CopiedEntry:
    """One entry of the fork, in the fork's sequence order."""

    id: str
    parent_id: str | None
    kind: str
    ts: datetime
    payload: str
    source_id: str
    clear: tuple[str | None, ...]
    """The source entry's clear facts, copied as they are."""


def _fork(request_id: str, row: Sequence[Any]) -> Fork:
    return Fork(
        request_id=request_id,
        source_session_id=row[0],
        fork_session_id=row[1],
        kind=ForkKind(row[2]),
        boundary_turn_id=row[3],
        boundary_entry_id=row[4],
        boundary_seq=row[5],
        leaf_id=row[6],
        entries_copied=row[7],
        created_at=utc(row[8]),
    )


def get(tx: Tx, request_id: str, digest: str) -> Fork | None:
    """The fork made under the request id with this digest, or ``None``."""
    row = tx.one(f"SELECT {_FORK_COLS} FROM session_forks WHERE request_digest = ?", [digest])
    return None if row is None else _fork(request_id, row)


def _check_source(tx: Tx, req: Request) -> None:
    """The source exists and is idle; a fork lease is fenced.

    Raises:
        ForkSessionNotFoundError, ForkSessionActiveError (a non-terminal
        run), ForkSessionBusyError (no lease, and someone holds the source),
        LeaseLostError, LeasePurposeError.
    """
    sid = req.source_session_id
    if tx.one("SELECT 1 FROM sessions WHERE id = ?", [sid]) is None:
        raise errors.ForkSessionNotFoundError(sid)
    target = session_target(sid)
    if req.lease is not None:  # its purpose is fork (forks.fork), and the row's (the fence)
        leases.fence(tx, req.lease)
    run = tx.one("SELECT run_id FROM active_runs WHERE session_id = ?", [sid])
    if run is not None:
        raise errors.ForkSessionActiveError(sid, detail=f"run {run[0]!r} is not terminal")
    if req.lease is None:
        try:
            leases.fence_or_unheld(tx, target, None)
        except errors.BusyError as busy:
            raise errors.ForkSessionBusyError(
                sid, busy.target, busy.holder, detail=busy.detail
            ) from None


def _boundary(tx: Tx, req: Request) -> tuple[str, int]:
    """The boundary turn's id and its ``end_seq``.

    Raises:
        ForkNoCompletedTurnError, ForkUnavailableError, ForkInvalidBoundaryError.
    """
    sid = req.source_session_id
    latest = tx.one(
        f"SELECT id, end_seq FROM conversation_turns WHERE session_id = ? AND {_IN_COMPLETED} "
        "AND end_seq IS NOT NULL ORDER BY end_seq DESC LIMIT 1",
        [sid, *_COMPLETED],
    )
    if latest is None:
        raise errors.ForkNoCompletedTurnError(sid)
    if req.boundary_turn_id is not None:
        turn = tx.one(
            "SELECT id, status, end_seq FROM conversation_turns "
            f"WHERE {keyed('id', 'session_id = ?')}",
            [req.boundary_turn_id, sid],
        )
        if turn is None:
            raise errors.ForkUnavailableError(
                sid, detail=f"the session has no turn {req.boundary_turn_id!r}"
            )
    elif req.at_seq is not None:
        if tx.one("SELECT 1 FROM entries WHERE session_id = ? AND seq = ?", [sid, req.at_seq]):
            turn = tx.one(
                "SELECT id, status, end_seq FROM conversation_turns WHERE session_id = ? "
                "AND start_seq <= ? AND (end_seq IS NULL OR end_seq >= ?) "
                "ORDER BY start_seq DESC LIMIT 1",
                [sid, req.at_seq, req.at_seq],
            )
        else:
            raise errors.ForkUnavailableError(sid, detail=f"the session has no entry {req.at_seq}")
        if turn is None:
            raise errors.ForkInvalidBoundaryError(
                sid, detail=f"entry {req.at_seq} is not inside a conversation turn"
            )
    else:
        return latest[0], latest[1]
    turn_id, status, end_seq = turn
    if status not in COMPLETED_TURN_STATUSES or end_seq is None:
        raise errors.ForkInvalidBoundaryError(sid, detail=f"turn {turn_id!r} is {status}")
    return turn_id, end_seq


def _source_entries(tx: Tx, session_id: str) -> dict[str, SourceEntry]:
    rows = tx.rows(
        f"SELECT id, parent_id, kind, seq, ts, payload, {', '.join(CLEAR_COLUMNS)} "
        "FROM entries WHERE session_id = ? ORDER BY seq",
        [session_id],
    )
    keys = tx.keys  # a sealed payload is opened: the fork's copy is sealed under its own key
    return {
        r[0]: SourceEntry(
            r[0],
            r[1],
            r[2],
            r[3],
            utc(r[4]),
            keys.open_text(tx, session_id, r[0], PAYLOAD, r[5]),
            r[6:],
        )
        for r in rows
    }


def _walk(source: Mapping[str, SourceEntry], leaf: str) -> list[SourceEntry]:
    """Root → ``leaf`` through ``source``, as replay walks it (``storage.replay.path_to``):
    it stops at a missing parent or a cycle."""
    path: list[SourceEntry] = []
    seen: set[str] = set()
    node = source.get(leaf)
    while node is not None and node.id not in seen:
        seen.add(node.id)
        path.append(node)
        node = source.get(node.parent_id) if node.parent_id is not None else None
    path.reverse()
    return path


def _as_entry(session_id: str, e: SourceEntry) -> Entry:
    return Entry(session_id, e.id, e.parent_id, e.kind, e.seq, e.ts, from_json(e.payload), None)


def plan_copy(
    session_id: str,
    source: Mapping[str, SourceEntry],
    boundary_id: str,
    boundary_seq: int,
    new_id: Callable[[], str],
) -> list[CopiedEntry]:
    """The fork's entries, in the source's sequence order (pure; see the module docstring).

    ``new_id()`` returns a fresh entry id. Each copied branch is walked as
    replay walks it (it stops at a missing parent or a cycle), and each
    copied entry's parent is the entry before it on that walk, so the
    fork's branch to its leaf is exactly the source's branch to the
    boundary.

    Raises:
        ForkUnsupportedEntryError: a copied entry is of a kind the seed does
            not define (its payload may name entries a fork cannot rewrite),
            lies after the boundary, or refers to an entry the source lacks
            or wrote after the boundary; or a copied entry breaks the
            tool-call pairing on a branch of the copy (``storage/pairing.py``,
            judged as ``turnkeeper audit`` judges a tree: ``entry_id`` names
            the message at fault).
    """
    parent_of: dict[str, str | None] = {}
    pending: list[SourceEntry] = []

    def take(leaf: str) -> None:
        previous: str | None = None
        for entry in _walk(source, leaf):
            if entry.id not in parent_of:
                parent_of[entry.id] = previous
                pending.append(entry)
            previous = entry.id

    take(boundary_id)
    while pending:
        entry = pending.pop()
        if not is_known_kind(entry.kind) or entry.seq > boundary_seq:
            raise errors.ForkUnsupportedEntryError(session_id, entry.id)
        if entry.kind in ENTRY_REFERENCES:
            ref = referenced_id(entry.kind, from_json(entry.payload))
            if ref is not None and ref not in parent_of:
                target = source.get(ref)
                if target is None or target.seq > boundary_seq:
                    raise errors.ForkUnsupportedEntryError(session_id, entry.id)
                take(ref)
    copied = {
        i: dataclasses.replace(_as_entry(session_id, source[i]), parent_id=parent)
        for i, parent in parent_of.items()
    }
    fault = next(iter(tree_faults(copied)), None)
    if fault is not None:  # every branch of a fork must replay valid: never copy a broken pairing
        raise errors.ForkUnsupportedEntryError(
            session_id,
            fault.message_id,
            detail=f"it breaks the pairing of tool call {fault.tool_call_id!r} ({fault.reason})",
        )
    ordered = sorted((source[i] for i in parent_of), key=lambda e: e.seq)
    new_ids: dict[str, str] = {}
    used: set[str] = set()
    for entry in ordered:
        fresh = new_id()
        while fresh in used:
            fresh = new_id()
        used.add(fresh)
        new_ids[entry.id] = fresh
    out: list[CopiedEntry] = []
    for entry in ordered:
        parent = parent_of[entry.id]
        payload = entry.payload
        if entry.kind in ENTRY_REFERENCES:
            changed = remap_reference(entry.kind, from_json(payload), new_ids)
            if changed is not None:
                payload = to_json(changed, "payload")
        out.append(
            CopiedEntry(
                new_ids[entry.id],
                None if parent is None else new_ids[parent],
                entry.kind,
                entry.ts,
                payload,
                entry.id,
                entry.clear,
            )
        )
    return out


def _fork_header(source_header: str, req: Request, boundary_seq: int, copied: int) -> str:
    """The source's header fields, less those naming the source file, plus the fork's."""
    header = {
        k: v
        for k, v in from_json(source_header).items()
        if k not in ("type", "id", "timestamp", "cwd")
    }
    header.update(
        parentSession=req.source_session_id,
        forkBoundarySeq=boundary_seq,
        seedLength=copied,
        forkKind=req.kind.value,
    )
    return to_json(header, "header")


def fork(tx: Tx, req: Request, new_id: Callable[[], str]) -> Fork:
    """Fork ``req.source_session_id`` (see the module docstring).

    Raises:
        ForkRequestConflictError, ForkSessionNotFoundError, ForkSessionActiveError,
        ForkNoCompletedTurnError, ForkUnavailableError, ForkInvalidBoundaryError,
        ForkUnsupportedEntryError, SessionIDExistsError, LeaseLostError,
        LeasePurposeError.
    """
    sid = req.source_session_id
    stored = tx.one(
        f"SELECT request_fingerprint, {_FORK_COLS} FROM session_forks WHERE request_digest = ?",
        [req.digest],
    )
    if stored is not None:
        if stored[0] != req.fingerprint:
            raise errors.ForkRequestConflictError(sid, req.request_id, stored[2])
        return _fork(req.request_id, stored[1:])
    _check_source(tx, req)
    turn_id, boundary_seq = _boundary(tx, req)
    source = _source_entries(tx, sid)
    boundary = next((e for e in source.values() if e.seq == boundary_seq), None)
    if (
        boundary is None
        or boundary.kind != EntryKind.TURN_END
        or from_json(boundary.payload).get("turnId") != turn_id
    ):
        raise errors.ForkUnavailableError(
            sid, detail=f"the turn_end entry of turn {turn_id!r} is not in the transcript"
        )
    if req.at_seq is not None:
        on_branch = {e.id for e in _walk(source, boundary.id)}
        named = next(e for e in source.values() if e.seq == req.at_seq)
        if named.id not in on_branch:
            raise errors.ForkInvalidBoundaryError(
                sid, detail=f"entry {req.at_seq} is not on the branch of turn {turn_id!r}"
            )
    fid = req.fork_session_id
    taken = tx.one(session_rows.TAKEN, [fid, fid])
    if taken is not None:
        raise errors.SessionIDExistsError(
            fid, detail=None if taken[0] == 1 else "a deleted session's id is never reused"
        )
    copied = plan_copy(sid, source, boundary.id, boundary_seq, new_id)
    head = tx.one("SELECT cwd, header FROM sessions WHERE id = ?", [sid])
    head = present(head, "the source session's row, read before in this transaction")
    now = tx.now
    assert now is not None  # always set inside a transaction
    leaf = next(c.id for c in copied if c.source_id == boundary.id)
    titles = [from_json(c.payload) for c in copied if c.kind == EntryKind.SESSION_INFO]
    n = len(copied)
    tx.exec(
        "INSERT INTO sessions (id, cwd, created_at, updated_at, leaf_id, title, entry_count, "
        "next_seq, header, id_head) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            fid,
            head[0],
            now,
            now,
            leaf,
            titles[-1]["name"] if titles else None,
            n,
            n + 1,
            _fork_header(head[1], req, boundary_seq, n),
            fid[:ID_HEAD],
        ],
    )
    version = tx.keys.new_session(tx, fid)
    sealed, _ = seal_payloads(tx, fid, [(c.id, c.payload) for c in copied], version)
    tx.insert_rows(
        "entries",
        ENTRY_COLUMNS,
        [
            (fid, c.id, c.parent_id, c.kind, i, c.ts, text, None, now, *c.clear)
            for i, (c, text) in enumerate(zip(copied, sealed, strict=True), start=1)
        ],
    )
    row = tx.one(
        f"INSERT INTO session_forks (request_digest, request_fingerprint, {_FORK_COLS}, "
        "lease_epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        f"RETURNING {_FORK_COLS}",
        [
            req.digest,
            req.fingerprint,
            sid,
            fid,
            req.kind.value,
            turn_id,
            boundary.id,
            boundary_seq,
            leaf,
            n,
            now,
            None if req.lease is None else req.lease.epoch,
        ],
    )
    row = present(row, "the fork row its INSERT returns")
    return _fork(req.request_id, row)


# -- the store's methods ------------------------------------------------------------


def _digest(request_id: str) -> str:
    return hashlib.sha256(request_id.encode("utf-8")).hexdigest()


class Forks(Area):
    """Forks: copy a session up to a completed turn into a new session, once per request id."""

    def fork(
        self,
        source_session_id: str,
        *,
        request_id: str,
        boundary_turn_id: str | None = None,
        at_seq: int | None = None,
        fork_session_id: str | None = None,
        lease: Lease | None = None,
    ) -> Fork:
        """Fork ``source_session_id`` at a completed turn into a new session
        (session seed ForkSession), in one transaction; returns the :class:`Fork`.

        The boundary is the source's latest completed turn (a ``session``
        fork), or, for a ``message`` fork, the completed turn named by
        ``boundary_turn_id`` or the one holding the entry with sequence
        number ``at_seq`` (seed ``ForkOptions.AtSeq``; that entry must be on
        the turn's branch). A turn is completed when it ended ``succeeded``.
        The new session (``fork_session_id``, or a UUIDv7) holds the branch
        from the root to the turn's ``turn_end`` entry, plus the branches of
        the entries a copied compaction (``firstKeptEntryId``), label
        (``targetId``) or branch summary (``fromId``) refers to, under new
        entry ids with parents and those references rewritten; kinds,
        timestamps and the other payload fields are kept, so its replay is
        the source's replay at the boundary apart from ids. Its leaf is the
        copied ``turn_end`` entry; its header records ``parentSession`` (the
        source id), ``forkBoundarySeq``, ``seedLength`` and ``forkKind``. The
        fork starts with no runs and no conversation turns of its own.

        ``request_id`` makes the fork idempotent: the same id with the same
        request (source, boundary arguments, ``fork_session_id``) returns
        the stored fork, even after the source moved on; only a sha256
        digest of the id is stored. ``lease``, if given, is a ``fork``
        lease on ``session:<source_session_id>`` (seed AcquireFork), fenced
        in the transaction; without one, a live lease on the source held by
        anyone makes it active.

        Raises:
            ForkRequestIDRequiredError: ``request_id`` is ``None``, empty or blank.
            ForkRequestIDTooLongError: ``request_id`` is over
                ``FORK_REQUEST_ID_MAX_BYTES`` UTF-8 bytes.
            ForkRequestConflictError: the id was used for a different request
                (``fork_session_id`` names the fork it made).
            ForkSessionNotFoundError: no session ``source_session_id``.
            ForkSessionActiveError: the source has a non-terminal run.
            ForkSessionBusyError: (a ``ForkSessionActiveError`` and a
                ``BusyError``) no ``lease`` given and someone holds the source.
            ForkNoCompletedTurnError: the source has no completed turn.
            ForkUnavailableError: the named turn is not the source's, no
                entry has sequence ``at_seq``, or the turn's ``turn_end``
                entry is missing from the transcript.
            ForkInvalidBoundaryError: the named turn is open or ended other
                than ``succeeded``, or ``at_seq`` is not inside a completed
                turn on its branch.
            ForkUnsupportedEntryError: a copied entry has a kind the seed does
                not define, or refers to an entry the source lacks or wrote
                after the boundary, or the replayed context at the boundary
                holds a ``toolResult`` without its ``toolCall`` (an imported
                transcript's; ``entry_id`` names the copied entry).
            SessionIDExistsError: ``fork_session_id`` is taken.
            LeaseLostError: ``lease`` is no longer held.
            LeasePurposeError: ``lease`` is not of purpose ``fork``.
            InvalidInputError: a malformed argument (both ``boundary_turn_id``
                and ``at_seq``, ``at_seq`` below 1, a lease on another target …).
        On any error nothing is written.
        """
        check_id(source_session_id, "source_session_id")
        request_id = check_id(check_request_id(source_session_id, request_id), "request_id")
        if boundary_turn_id is not None:
            check_id(boundary_turn_id, "boundary_turn_id")
        if at_seq is not None:
            check_int(at_seq, "at_seq", 1)
        if boundary_turn_id is not None and at_seq is not None:
            raise errors.InvalidInputError("at_seq", "name the boundary by turn id or by seq")
        fid = str(uuid6.uuid7()) if fork_session_id is None else fork_session_id
        check_id(fid, "fork_session_id")
        check_session_lease(source_session_id, lease)
        if lease is not None and lease.purpose != LeasePurpose.FORK:
            raise errors.LeasePurposeError(lease.target, lease.purpose, LeasePurpose.FORK.value)
        fingerprint = hashlib.sha256(
            orjson.dumps(
                {
                    "source": source_session_id,
                    "turn": boundary_turn_id,
                    "seq": at_seq,
                    "fork": fork_session_id,
                },
                option=orjson.OPT_SORT_KEYS,
            )
        ).hexdigest()
        req = Request(
            request_id=request_id,
            digest=_digest(request_id),
            fingerprint=fingerprint,
            source_session_id=source_session_id,
            fork_session_id=fid,
            boundary_turn_id=boundary_turn_id,
            at_seq=at_seq,
            lease=lease,
        )

        def body(tx: Tx) -> Fork:
            return fork(tx, req, new_entry_id)

        self.db.keyring.prepare(fid)  # the fork's data key wrapped before the transaction
        return self._fenced("fork_session", lease, body)

    def get(self, request_id: str) -> Fork | None:
        """The fork made under ``request_id``, or ``None`` when there is none.

        Raises:
            InvalidInputError: ``request_id`` is not a non-empty string.
        """
        check_id(request_id, "request_id")
        digest = _digest(request_id)
        return self.db.read("get_fork", lambda tx: get(tx, request_id, digest))
