"""Sessions and their entry trees (session seed Store / Manager).

The API's appends are in ``appends.py`` and replay in ``replays.py``; this
module holds the session rows, the entry rows and the transactional append
they share. An append is one transaction: read the session's leaf and next
sequence, fence the lease if one is given (a write to the lease row), check
the caller's expected leaf, judge the entries by the tool-call pairing rule
(``storage/pairing.py``, through ``pairing_checks.check``), compare-and-set
the session row (leaf, sequence, count, title) and insert the entries. A
concurrent append to the same session is a DuckDB write-write conflict on
the session row, retried by the transaction boundary; the retry re-reads
the leaf, so a stale expected leaf raises ``SessionModifiedError`` and never
creates a second child.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import uuid6

from turnkeeper.spec import errors
from turnkeeper.spec.clear_facts import ClearFacts, clear_facts
from turnkeeper.spec.entries import RESERVED_ENTRY_SUFFIXES, EntryKind, validate_payload
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import (
    ANY_LEAF,
    Entry,
    Lease,
    NewEntry,
    Session,
)

from ..backend import Conflict, Dialect, Tx, keyed, present, utc
from ..codec import check_id, check_instant, check_text, from_json, to_json, to_json_exact
from ..crypto.keyring import UNREAD
from ..pairing import Opening
from ..validate import (
    check_expected_leaf,
    check_header,
    check_session_lease,
)
from . import leases, pairing_checks, run_events
from .base import Area
from .entry_rows import (
    CLEAR_COLUMNS,
    ENTRY_COLUMNS,
    OF_SESSION,
    entry,
    entry_columns,
    entry_row,
    path_to_leaf,
    payload_of,
    seal_payloads,
)

NOW = leases.NOW

SESSION_COLS = (
    "id, cwd, created_at, updated_at, leaf_id, title, entry_count, next_seq, header, sub_agent_of, "
    "channel_type, channel_id"
)
ID_HEAD = 8
"""Characters of a session id kept in ``sessions.id_head`` (DuckDB's index of an
id prefix; PostgreSQL indexes ``substr(id, 1, 8)``): see ``open_ids.py``."""
_MARKS = ", ".join("?" * len(ENTRY_COLUMNS))

HELD_ROWS = 256
"""A held chain (``append_chain(hold=True)``) of up to this many entries is
inserted by one statement of one array per column, which a server sends with
the other held writes; a longer one is bulk loaded (``Tx.insert_rows``)."""

_ENTRY_TYPES = (
    ("VARCHAR",) * 4
    + ("BIGINT", "TIMESTAMPTZ", "VARCHAR", "BIGINT", "TIMESTAMPTZ")
    + ("VARCHAR",) * len(CLEAR_COLUMNS)
)
"""The SQL type of each of :data:`ENTRY_COLUMNS`, in its order."""


@functools.cache
def _insert_arrays(dialect: Dialect) -> str:
    """The entries' insert from one array per column (:data:`ENTRY_COLUMNS`' order)."""
    arrays = ", ".join(f"unnest({dialect.typed(kind + '[]')})" for kind in _ENTRY_TYPES)
    return f"INSERT INTO entries ({', '.join(ENTRY_COLUMNS)}) SELECT {arrays}"


HEAD_IS = "next_seq = ? AND leaf_id IS NOT DISTINCT FROM ? AND key_version IS NOT DISTINCT FROM ?"
"""A session row whose head is still this next seq and leaf, and whose
payloads are still sealed under this data key version (``NULL``: clear): an
append's compare-and-set."""


TAKEN = (
    "SELECT 1 FROM sessions WHERE id = ? UNION ALL "
    "SELECT 2 FROM deleted_sessions WHERE session_id = ?"
)
"""A session id in use (1) or deleted (2, never reused): no row when it is free."""


def session_row(row: Sequence[Any]) -> Session:
    return Session(
        id=row[0],
        cwd=row[1],
        created_at=utc(row[2]),
        updated_at=utc(row[3]),
        leaf_id=row[4],
        title=row[5],
        entry_count=row[6],
        next_seq=row[7],
        header=from_json(row[8]),
        sub_agent_of=row[9],
        channel_type=row[10],
        channel_id=row[11],
    )


def create(
    tx: Tx,
    session_id: str,
    cwd: str,
    header_json: str,
    created_at: datetime | None,
    sub_agent_of: str | None = None,
) -> Session:
    """Insert a new session row (``sub_agent_of``: the parent of a sub-agent), local
    (``store.bindings`` binds it).

    Raises:
        SessionIDExistsError: the id is taken (the row is never updated) or was
            a deleted session's.
    """
    taken = tx.one(TAKEN, [session_id, session_id])
    if taken is not None:
        raise errors.SessionIDExistsError(
            session_id, detail=None if taken[0] == 1 else "a deleted session's id is never reused"
        )
    row = tx.one(
        f"INSERT INTO sessions ({SESSION_COLS}, id_head) VALUES "
        f"(?, ?, coalesce(?::TIMESTAMPTZ, {NOW}), {NOW}, NULL, NULL, 0, 1, ?, ?, NULL, NULL, ?) "
        f"RETURNING {SESSION_COLS}",
        [
            session_id,
            cwd,
            created_at,
            tx.now,
            tx.now,
            header_json,
            sub_agent_of,
            session_id[:ID_HEAD],
        ],
    )
    row = present(row, "the session row its INSERT returns")
    tx.keys.new_session(tx, session_id)
    return session_row(row)


def get(tx: Tx, session_id: str) -> Session | None:
    """The session row, or ``None``."""
    row = tx.one(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?", [session_id])
    return None if row is None else session_row(row)


def existing(tx: Tx, session_id: str, ids: Sequence[str]) -> set[str]:
    """Which of ``ids`` are entries of the session (one statement)."""
    if not ids:
        return set()
    if len(ids) == 1:
        row = tx.one(
            f"SELECT id FROM entries WHERE {keyed('id', OF_SESSION)}", [ids[0], session_id]
        )
        return set() if row is None else {row[0]}
    rows = tx.rows(
        f"SELECT id FROM entries WHERE {keyed('id', OF_SESSION, 'ANY(?::VARCHAR[])')}",
        [list(ids), session_id],
        replan=True,  # a list of ids (see Tx.rows)
    )
    return {r[0] for r in rows}


def _exists(tx: Tx, session_id: str, entry_id: str) -> bool:
    return bool(existing(tx, session_id, [entry_id]))


def named_as_parent(tx: Tx, session_id: str, ids: Sequence[str]) -> dict[str, str]:
    """Which of ``ids`` an entry of the session names as its parent, each with
    the first such entry (by seq): an id no entry has (it would be taken) that
    an entry names is the missing parent of an entry imported without it. A
    read of the session's entries (there is no index by parent)."""
    if not ids:
        return {}
    rows = tx.rows(
        "SELECT parent_id, id FROM entries WHERE session_id = ? "
        "AND parent_id = ANY(?::VARCHAR[]) ORDER BY seq",
        [session_id, sorted(set(ids))],
    )
    out: dict[str, str] = {}
    for parent, child in rows:
        out.setdefault(parent, child)
    return out


@dataclass(frozen=True, slots=True)
class Draft:
    """One entry to append, validated: its payload as stored JSON and as the
    dict it decodes to, its id (``chosen``: it may be taken, checked; ``caller``:
    the caller's own) and its own timestamp (``None``: the store's now)."""

    kind: str
    payload_json: str
    payload: Mapping[str, Any]
    entry_id: str
    chosen: bool
    timestamp: datetime | None = None
    caller: bool = False
    """The caller chose the id: an entry imported without its parent may name
    it as that parent (checked: ``EntryIdReservedError``)."""

    @property
    def clear(self) -> ClearFacts:
        """The clear facts of its payload, for ``entries``' last columns
        (:data:`~.entry_rows.CLEAR_COLUMNS`)."""
        return clear_facts(self.kind, self.payload)


def append(
    tx: Tx,
    session_id: str,
    kind: str,
    payload_json: str,
    payload: Mapping[str, Any],
    *,
    entry_id: str,
    caller_chose_id: bool,
    timestamp: datetime | None,
    expected_leaf: Any,
    lease: Lease | None,
    parent_override: str | None = None,
) -> Entry:
    """Append one entry: :func:`append_drafts` of one draft."""
    draft = Draft(
        kind, payload_json, payload, entry_id, caller_chose_id, timestamp, caller=caller_chose_id
    )
    return append_drafts(
        tx,
        session_id,
        [draft],
        expected_leaf=expected_leaf,
        lease=lease,
        parent_override=parent_override,
    )[0]


@dataclass(frozen=True, slots=True)
class Chain:
    """What :func:`append_chain` wrote: the entries, and the calls open after
    them (``None``: not known; see ``pairing_checks.check``)."""

    entries: list[Entry]
    opening: Opening | None


def append_drafts(
    tx: Tx,
    session_id: str,
    drafts: Sequence[Draft],
    *,
    expected_leaf: Any,
    lease: Lease | None,
    parent_override: str | None = None,
    fenced_epoch: int | None = None,
    checked: bool = False,
    head: tuple[Any, ...] | None = None,
    known: Opening | None = None,
) -> list[Entry]:
    """:func:`append_chain`'s entries."""
    return append_chain(
        tx,
        session_id,
        drafts,
        expected_leaf=expected_leaf,
        lease=lease,
        parent_override=parent_override,
        fenced_epoch=fenced_epoch,
        checked=checked,
        head=head,
        known=known,
    ).entries


HEAD_READ = "SELECT leaf_id, next_seq, key_version FROM sessions WHERE id = ?"
"""A session's head: its leaf, next seq and data key version (``NULL``: clear)."""


def append_chain(
    tx: Tx,
    session_id: str,
    drafts: Sequence[Draft],
    *,
    expected_leaf: Any,
    lease: Lease | None,
    parent_override: str | None = None,
    fenced_epoch: int | None = None,
    checked: bool = False,
    head: tuple[Any, ...] | None = None,
    known: Opening | None = None,
    new_events: run_events.NewEvents | None = None,
    write: bool = True,
    absent: frozenset[str] = frozenset(),
    hold: bool = False,
) -> Chain:
    """Append ``drafts`` as a chain under the leaf (or ``parent_override``), the
    first one's parent the leaf, each next one's the one before; see the
    module docstring. One fence, one compare-and-set of the session row (leaf,
    sequence, count, title) and one insert, however many drafts.

    The session's lease is fenced, or without ``lease`` the session must be
    unheld, unless ``checked``: the caller already did one or the other in
    this transaction (admission, termination, recovery, tool pairing).
    ``fenced_epoch`` is the epoch of a lease the caller already fenced in this
    transaction: stored on the entries like ``lease``'s. Every write keeps
    the replayed context valid for a model provider: the drafts are judged
    by the tool-call pairing rule (``storage/pairing.py``) before anything is
    written (``pairing_checks.check``; ``known``: the calls open at the
    session's head, if the caller knows them). ``head``: the session's leaf
    and next seq as the caller read them in this transaction, with nothing
    written to the session since (one read less). ``new_events``: run events
    written with the entries, whose seqs the same update takes from the
    session's event cursor (one update of the session row, not two; held
    with it under ``hold``, ``run_events.hold_events``). Without
    ``write``: every check and read, nothing written (the chain as it would be
    stored, for a caller that writes it with more entries after it).
    ``absent``: ids of ``chosen`` drafts the caller read, in this
    transaction, to be no entry's (not looked up again). ``hold``: the
    session row's compare-and-set and the insert are held (``Tx.later``) to
    go with the caller's other held writes, none of which may write the
    session row, these entries or run events (a server sends them as one
    statement).

    Raises:
        LeaseLostError, BusyError, SessionNotFoundError, SessionModifiedError,
        EntryExistsError, EntryNotFoundError (label target or branch target),
        EntryIdReservedError (a caller's id an entry names as its missing
        parent: writing it would move that entry's branch, unjudged),
        ToolCallPairingError (``ToolCallsUnansweredError`` among them).
    """
    if head is None and not checked and lease is not None:  # the read and the fence as one
        row, fence = leases.fenced_read(tx, lease, HEAD_READ, [session_id])
        if row is None:
            raise errors.SessionNotFoundError(session_id)
        leases.fenced(tx, lease, fence)
    else:
        row = head or tx.one(HEAD_READ, [session_id])
        if row is None:
            raise errors.SessionNotFoundError(session_id)
        if not checked:
            leases.fence_or_unheld(tx, session_target(session_id), lease)
    leaf, seq = row[0], row[1]
    version = row[2] if len(row) > 2 else UNREAD  # (a head read without it: sealing reads it)
    now = tx.now
    assert now is not None  # always set inside a transaction
    if expected_leaf is not ANY_LEAF and expected_leaf != leaf:
        raise errors.SessionModifiedError(session_id, expected_leaf, leaf)
    ids = [d.entry_id for d in drafts]
    targets = [
        d.payload["targetId"]
        for i, d in enumerate(drafts)
        if d.kind == EntryKind.LABEL and d.payload["targetId"] not in ids[:i]
    ]
    chosen = [d.entry_id for d in drafts if d.chosen and d.entry_id not in absent]
    looked_up = [*([parent_override] if parent_override is not None else []), *targets, *chosen]
    found = existing(tx, session_id, sorted(set(looked_up)))
    if parent_override is not None and parent_override not in found:
        raise errors.EntryNotFoundError(session_id, parent_override)
    missing = next((t for t in targets if t not in found), None)
    if missing is not None:
        raise errors.EntryNotFoundError(session_id, missing)
    taken = next((i for i in chosen if i in found), None)
    if taken is not None:
        raise errors.EntryExistsError(session_id, taken)
    named = named_as_parent(tx, session_id, [d.entry_id for d in drafts if d.caller])
    if named:
        first = next(d.entry_id for d in drafts if d.entry_id in named)
        raise errors.EntryIdReservedError(session_id, first, "parent", named[first])
    epoch = fenced_epoch if lease is None else lease.epoch
    parent = leaf if parent_override is None else parent_override
    out: list[Entry] = []
    for i, d in enumerate(drafts):
        ts = now if d.timestamp is None else d.timestamp
        out.append(
            Entry(session_id, d.entry_id, parent, d.kind, seq + i, utc(ts), d.payload, epoch)
        )
        parent = d.entry_id
    below = leaf if parent_override is None else parent_override
    opening = pairing_checks.check(tx, session_id, below, seq, out, known)
    if not write:
        return Chain(out, opening)
    names = [d.payload["name"] for d in drafts if d.kind == EntryKind.SESSION_INFO]
    title = "title = ?, " if names else ""  # a column not set is not written
    events = 0 if new_events is None else len(new_events[1])
    cursor, bump = run_events.cursor_bump(tx, session_id, events) if events else ("", [])
    update = (
        f"UPDATE sessions SET {title}{cursor}leaf_id = ?, next_seq = next_seq + ?, "
        "entry_count = entry_count + ?, updated_at = ? "
        f"WHERE {keyed('id', HEAD_IS)}"
    )
    sealed, version = seal_payloads(
        tx,
        session_id,
        [(e.id, d.payload_json) for e, d in zip(out, drafts, strict=True)],
        version,
    )
    values = [
        *names[-1:],
        *bump,
        out[-1].id,
        len(out),
        len(out),
        now,
        session_id,
        seq,
        leaf,
        version,
    ]
    stored = [
        (session_id, e.id, e.parent_id, e.kind, e.seq, e.timestamp, text, epoch, now, *d.clear)
        for e, d, text in zip(out, drafts, sealed, strict=True)
    ]
    if hold:
        if new_events is not None:  # numbered from the cursor the update below moves
            run_events.hold_events(tx, new_events, version)
        tx.later(update, values, changes=1)  # a moved session is a Conflict, retried
    elif tx.count(update, values) != 1:
        raise Conflict(f"session {session_id!r} moved during append")
    elif new_events is not None:  # numbered from the cursor the update above moved
        run_events.append_events(tx, new_events[0], new_events[1], taken=True, version=version)
    if len(stored) == 1:
        insert = tx.later if hold else tx.exec
        insert(f"INSERT INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES ({_MARKS})", stored[0])
    elif hold and len(stored) <= HELD_ROWS:
        tx.later(_insert_arrays(tx.dialect), [list(column) for column in zip(*stored, strict=True)])
    else:
        tx.insert_rows("entries", ENTRY_COLUMNS, stored)
    return Chain(out, opening)


def own_draft(
    kind: str, payload: Mapping[str, Any], entry_id: str, *, chosen: bool = False
) -> Draft:
    """An entry the store writes itself under an id it derived: from an id it made
    in this transaction (the id cannot be taken: no existence check), or with
    ``chosen`` from one that may be older (an import could hold it: checked)."""
    return Draft(kind, to_json(dict(payload), "payload"), payload, entry_id, chosen)


def move_leaf(
    tx: Tx, session_id: str, entry_id: str | None, expected_leaf: Any, lease: Lease | None
) -> None:
    """Point the session's leaf at ``entry_id`` (``None``: the next append is a new root).

    Raises:
        SessionNotFoundError, SessionModifiedError, EntryNotFoundError, LeaseLostError,
        BusyError (no lease given and someone holds the session).
    """
    row = tx.one("SELECT leaf_id FROM sessions WHERE id = ?", [session_id])
    if row is None:
        raise errors.SessionNotFoundError(session_id)
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    if expected_leaf is not ANY_LEAF and expected_leaf != row[0]:
        raise errors.SessionModifiedError(session_id, expected_leaf, row[0])
    if entry_id is not None and not _exists(tx, session_id, entry_id):
        raise errors.EntryNotFoundError(session_id, entry_id)
    tx.exec(
        f"UPDATE sessions SET leaf_id = ?, updated_at = {NOW} WHERE id = ?",
        [entry_id, tx.now, session_id],
    )


def entries(tx: Tx, session_id: str) -> list[Entry]:
    """Every entry of the session in sequence order."""
    rows = tx.rows(
        f"SELECT {entry_columns(tx)} FROM entries WHERE session_id = ? ORDER BY seq", [session_id]
    )
    return [entry_row(tx, r) for r in rows]


def branch_path(tx: Tx, session_id: str) -> list[Entry]:
    """Root → leaf path of the session's current branch (see :func:`_path`).

    Raises:
        SessionNotFoundError: no such session.
    """
    head = tx.one("SELECT leaf_id FROM sessions WHERE id = ?", [session_id])
    if head is None:
        raise errors.SessionNotFoundError(session_id)
    return path_to_leaf(tx, session_id, head[0])


def labels(tx: Tx, session_id: str) -> dict[str, str]:
    """Current label per target entry id (the latest label entry wins; absent clears)."""
    rows = tx.rows(
        "SELECT id, payload FROM entries WHERE session_id = ? AND kind = 'label' ORDER BY seq",
        [session_id],
    )
    out: dict[str, str] = {}
    for entry_id, payload in rows:
        fields = payload_of(tx, session_id, entry_id, payload)
        target, label = fields.get("targetId"), fields.get("label")
        if not isinstance(target, str):
            continue  # an imported label without a usable target names nothing
        if label is None:
            out.pop(target, None)
        else:
            out[target] = label if isinstance(label, str) else to_json(label, "label")
    return out


# -- the store's methods ------------------------------------------------------------


def _aware(value: datetime | None, field: str) -> datetime | None:
    if value is None:
        return None
    check_instant(value, field)
    return value


def draft_of(
    kind: str,
    payload: Mapping[str, Any],
    entry_id: str | None,
    timestamp: datetime | None,
    where: str,
) -> Draft:
    """An API append's entry, validated (``where`` prefixes the error's field).

    Raises:
        InvalidInputError: bad kind, payload, id (or one of the store's own) or a
            naive timestamp.
    """
    if not isinstance(payload, Mapping):
        raise errors.InvalidInputError(f"{where}payload", "expected a mapping")
    try:
        validate_payload(kind, payload)
        payload_json, stored = to_json_exact(dict(payload), "payload")
        chose = entry_id is not None
        eid = entry_id if entry_id is not None else new_entry_id()
        check_id(eid, "entry_id")
        if chose and eid.endswith(RESERVED_ENTRY_SUFFIXES):
            raise errors.InvalidInputError(
                "entry_id", f"ids ending {', '.join(RESERVED_ENTRY_SUFFIXES)} are the store's own"
            )
        ts = _aware(timestamp, "timestamp")
    except errors.InvalidInputError as exc:
        if not where:
            raise
        raise errors.InvalidInputError(f"{where}{exc.field}", exc.reason) from None
    return Draft(kind, payload_json, stored, eid, chose, ts, caller=chose)


def drafts_of(entries: object) -> list[Draft]:
    """``sessions.append_many``'s ``entries`` (``NewEntry`` items or ``(kind, payload)``
    pairs), validated.

    Raises:
        InvalidInputError: not a non-empty list, a malformed item (``field``
            names it: ``entries[3].payload``) or an ``entry_id`` given twice.
    """
    if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, Sequence):
        raise errors.InvalidInputError("entries", "expected a list of entries")
    if not entries:
        raise errors.InvalidInputError("entries", "expected at least one entry")
    drafts: list[Draft] = []
    for i, item in enumerate(entries):
        where = f"entries[{i}]."
        if isinstance(item, NewEntry):
            drafts.append(draft_of(item.kind, item.payload, item.entry_id, item.timestamp, where))
        elif isinstance(item, tuple) and len(item) == 2:
            drafts.append(draft_of(item[0], item[1], None, None, where))
        else:
            raise errors.InvalidInputError(
                f"entries[{i}]", "expected a NewEntry or a (kind, payload) pair"
            )
    ids = [d.entry_id for d in drafts]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise errors.InvalidInputError("entries", f"entry_id {twice!r} is given twice")
    return drafts


def new_entry_id() -> str:
    """A random 16-hex entry id (64 bits, as the session seed's GenerateID)."""
    return secrets.token_hex(8)


class SessionRecordsPart(Area):
    """Session operations (session seed Store/Manager)."""

    def create(
        self,
        session_id: str | None = None,
        *,
        cwd: str = "",
        header: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> Session:
        """Create an empty session (a UUIDv7 id when ``session_id`` is None).

        ``header`` holds extra header fields kept verbatim.

        Raises:
            SessionIDExistsError: the id is taken; the existing session is untouched.
            InvalidInputError: bad id, cwd, header or naive ``created_at``.
        """
        sid = str(uuid6.uuid7()) if session_id is None else session_id
        check_id(sid, "session_id")
        check_text(cwd, "cwd")
        header_json = to_json(check_header(header), "header")
        _aware(created_at, "created_at")
        self.db.keyring.prepare(sid)  # its data key wrapped before the transaction
        session = self.db.write(
            "create_session", lambda tx: create(tx, sid, cwd, header_json, created_at)
        )
        self._openings.put(sid, Opening(None, session.next_seq))  # empty: no call is open
        return session

    def get(self, session_id: str) -> Session | None:
        """The session, or ``None`` when there is none with this id."""
        check_id(session_id, "session_id")
        return self.db.read("get_session", lambda tx: get(tx, session_id))

    def branch(
        self,
        session_id: str,
        entry_id: str | None,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
    ) -> None:
        """Move the leaf to ``entry_id`` (pi ``branch``); ``None`` resets it (``resetLeaf``).

        With ``lease`` (on ``session:<session_id>``) the move is fenced like an append.

        Raises:
            SessionNotFoundError, EntryNotFoundError, SessionModifiedError,
            LeaseLostError, InvalidInputError.
        """
        check_id(session_id, "session_id")
        if entry_id is not None:
            check_id(entry_id, "entry_id")
        check_expected_leaf(expected_leaf)
        check_session_lease(session_id, lease)
        self._fenced(
            "branch",
            lease,
            lambda tx: move_leaf(tx, session_id, entry_id, expected_leaf, lease),
        )

    def branch_with_summary(
        self,
        session_id: str,
        entry_id: str,
        summary: str,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        details: Any = None,
    ) -> Entry:
        """Branch to ``entry_id`` and append a ``branch_summary`` of the abandoned path
        (pi ``branchWithSummary``): its parent is ``entry_id`` and its ``fromId``
        the leaf it leaves. One transaction.

        Raises:
            as :meth:`sessions.append`, plus EntryNotFoundError when ``entry_id`` is missing.
        """
        check_id(session_id, "session_id")
        check_text(summary, "summary")
        check_id(entry_id, "entry_id")
        check_expected_leaf(expected_leaf)
        check_session_lease(session_id, lease)
        to_json(details, "details")

        def body(tx: Tx) -> Entry:
            head = get(tx, session_id)
            if head is None:
                raise errors.SessionNotFoundError(session_id)
            payload: dict[str, Any] = {"summary": summary, "fromId": head.leaf_id or "root"}
            if details is not None:
                payload["details"] = details
            payload_json = to_json(payload, "details")
            return append(
                tx,
                session_id,
                EntryKind.BRANCH_SUMMARY,
                payload_json,
                payload,
                entry_id=new_entry_id(),
                caller_chose_id=False,
                timestamp=None,
                expected_leaf=expected_leaf,
                lease=lease,
                parent_override=entry_id,
            )

        return self._fenced("branch_with_summary", lease, body)

    def entries(self, session_id: str) -> list[Entry]:
        """Every entry of the session, in sequence (append) order.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(session_id, self.db.read("entries", lambda tx: entries(tx, session_id)))

    def entry(self, session_id: str, entry_id: str) -> Entry | None:
        """One entry, or ``None``."""
        check_id(session_id, "session_id")
        check_id(entry_id, "entry_id")
        return self.db.read("entry", lambda tx: entry(tx, session_id, entry_id))

    def labels(self, session_id: str) -> dict[str, str]:
        """Current labels: target entry id → label.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(session_id, self.db.read("labels", lambda tx: labels(tx, session_id)))

    # -- imports -----------------------------------------------------------------
