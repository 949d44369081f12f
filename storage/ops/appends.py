"""Appends (session seed AppendEntry): the store's ``sessions.append`` and
``sessions.append_many``, and their merged form under a group commit.

An append alone runs :func:`~.sessions.append_chain` (see that module). A
backend that groups writes (DuckDB, ``storage/duck/group.py``) runs the appends
queued beside each other through :func:`append_group`, the ``many`` of their
:class:`~turnkeeper.storage.backend.Merge`: one read of their session rows
and lease rows (the full fence, ``leases.fence_condition``, evaluated by
it), one compare-and-set of their session rows and one insert of every
entry, instead of three statements per append. When the store object
remembers every session's head (``pairing_checks.OpeningCache``: each
session last written by it, the steady state of a runtime), the read is of
the lease rows alone (the fence judged on them by ``leases.fence_holds``)
and the compare-and-set checks the remembered heads; an append refused at
one, or whose compare-and-set finds another head, wrote nothing and is
judged again at its read head (:func:`_round`). The fence is a read there
because a merged group runs under the backend's in-process write
serialization and holds its targets (``Tx.hold``): no grant, takeover,
renewal or release can commit between the read and the group's commit. Each append is judged on
its own, with the rules and the error order of
:func:`~.sessions.append_chain` (session missing, then the lease, then the
expected leaf, then the tool-call pairing rule, ``pairing_checks.check``,
the very check of the single path), and one that fails writes nothing (its
checks all come before the writes, which only touch the ones that passed).
Two appends to one session in a group run in queue order: the second in a
later round, which sees the first's writes. Only plain appends are merged
(:func:`mergeable`): no caller-chosen ids, labels, branch targets, tool
results or compactions, whose extra lookups stay on the single path.

PostgreSQL's one-statement append (:func:`one_statement`) cannot read
before it writes, so a plain append of messages takes it only when the
store object remembers the calls open at the session's head
(``pairing_checks.OpeningCache``) and the pairing rule accepts the entries
there; the statement then writes only while the head is still that one.
Otherwise, and when it writes nothing, the append runs in a transaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import ANY_LEAF, Entry, Lease, NewEntry

from ..backend import Conflict, Merge, Tx, utc
from ..codec import check_id
from ..pairing import Opening, judge
from ..replay import context_message
from ..validate import check_expected_leaf, check_session_lease
from . import leases, pairing_checks
from .base import Area
from .entry_rows import CLEAR_COLUMNS, ENTRY_COLUMNS
from .session_rows import Draft, append_chain, draft_of, drafts_of

NOW = leases.NOW


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """One queued append: its session, validated drafts, expected leaf and lease;
    ``one``: an :meth:`~AppendsPart.append` (its outcome the entry, not a
    list); ``known``: the calls open at a head of the session, as the store
    object remembers them (``pairing_checks``). An outcome is ``(entry or
    entries, the calls open after them or None)``."""

    session_id: str
    drafts: Sequence[Draft]
    expected_leaf: Any
    lease: Lease | None
    one: bool = False
    known: Opening | None = None


def mergeable(drafts: Sequence[Draft]) -> bool:
    """Whether an append of ``drafts`` takes the merged path: no ids of the
    caller's, labels, compactions or tool results among them."""
    for d in drafts:
        if d.chosen or d.kind in (EntryKind.LABEL, EntryKind.COMPACTION):
            return False
        if d.kind == EntryKind.MESSAGE:
            message = d.payload.get("message")
            if not isinstance(message, dict) or message.get("role") == "toolResult":
                return False
    return True


def _rounds(requests: Sequence[AppendRequest]) -> list[list[int]]:
    """Request indexes in rounds of distinct sessions, each session's in queue order."""
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, r in enumerate(requests):
        k = seen.get(r.session_id, 0)
        seen[r.session_id] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(i)
    return rounds


def append_group(tx: Tx, requests: list[AppendRequest]) -> list[Any]:
    """The outcome of each request, in order: its stored entries, or the
    exception its append alone would raise (nothing written for it).

    Raises:
        Conflict: a session row moved under the group (the group splits and
            each append runs alone, with retries).
    """
    outcomes: list[Any] = [None] * len(requests)
    # Per session written in an earlier round: what its append left open there
    # (its head now), which a later append's ``known``, taken before the group,
    # is behind; with it, the later append's head is assumed, not read again.
    left: dict[str, Opening | None] = {}
    for members in _rounds(requests):
        batch = [
            requests[i]
            if requests[i].session_id not in left
            else dataclasses.replace(requests[i], known=left[requests[i].session_id])
            for i in members
        ]
        for i, r, out in zip(members, batch, _round(tx, batch), strict=True):
            outcomes[i] = out
            if not isinstance(out, Exception):
                left[r.session_id] = out[1]
    return outcomes


def _assumed(requests: Sequence[AppendRequest]) -> bool:
    """Whether a round's heads are taken from what the store object remembers
    (every request's ``known``: the steady state of a runtime writing its
    own sessions) instead of read: then :func:`_heads` reads only the lease
    rows, and the session rows' compare-and-set checks each head."""
    return all(r.known is not None for r in requests)


def _heads(tx: Tx, requests: list[AppendRequest]) -> list[tuple[Any, ...] | None]:
    """Per request (distinct sessions): ``None`` when its session is missing,
    else its session's leaf and next seq, whether its lease matches the lease
    row (``leases.fence_condition``; ``None`` without a lease or lease row),
    and the lease row's owner, state and expiry (``None``: no row). One read;
    expiry is judged by the caller, at a clock read after it
    (``leases.unexpired``).

    When :func:`_assumed`, the read is of the lease rows alone, found by their
    targets through the index (the fence judged on them by
    ``leases.fence_holds``), and each head is the one its request's ``known``
    names, unread: the caller's compare-and-set of the session rows checks
    it, and judges again on a read head any request refused, or not written,
    at an assumed one (:func:`_round`). Otherwise one read of the sessions and
    their lease rows, the fence evaluated by it."""
    if _assumed(requests):
        targets = [session_target(r.session_id) for r in requests]
        found = {
            row[0]: row
            for row in tx.rows(
                f"SELECT {', '.join(leases.FENCED)}, state, owner, expires_at FROM leases "
                "WHERE target = ANY(?::VARCHAR[])",
                [targets],
            )
        }
        heads: list[tuple[Any, ...] | None] = []
        for r, target in zip(requests, targets, strict=True):
            known = r.known
            assert known is not None  # _assumed
            row = found.get(target)
            fenced = None if row is None or r.lease is None else leases.fence_holds(row, r.lease)
            lease_row = (None, None, None) if row is None else row[len(leases.FENCED) :]
            state, owner, expires_at = lease_row
            heads.append((known.leaf_id, known.next_seq, fenced, owner, state, expires_at))
        return heads
    cols = ", ".join(
        f"unnest(?::{'BIGINT' if c == 'epoch' else 'VARCHAR'}[]) AS {c}" for c in leases.FENCED
    )
    rows = tx.rows(
        "SELECT v.sid, sessions.leaf_id, sessions.next_seq, "
        f"({leases.fence_condition(lambda c: 'v.' + c)}) AS fenced, "
        "leases.owner, leases.state, leases.expires_at "
        f"FROM (SELECT unnest(?::VARCHAR[]) AS sid, unnest(?::VARCHAR[]) AS st, {cols}) AS v "
        "JOIN sessions ON sessions.id = v.sid LEFT JOIN leases ON leases.target = v.st",
        [
            [r.session_id for r in requests],
            [session_target(r.session_id) for r in requests],
            *(
                [None if r.lease is None else leases.fence_values(r.lease)[k] for r in requests]
                for k in range(len(leases.FENCED))
            ),
        ],
    )
    by_session = {row[0]: row[1:] for row in rows}
    return [by_session.get(r.session_id) for r in requests]


def _judged(tx: Tx, r: AppendRequest, head: tuple[Any, ...]) -> Exception | None:
    """The error a merged append alone would raise for its lease, or ``None``:
    the fence (its lease matches the row, and is unexpired at a clock read now,
    after the group took its targets), or, without a lease, a live holder."""
    _, _, fenced, owner, state, expires_at = head
    target = session_target(r.session_id)
    if r.lease is not None:
        if not fenced:
            return errors.LeaseLostError(target)
        try:
            leases.unexpired(tx, target, expires_at)
        except errors.LeaseLostError as exc:
            return exc
        return None
    if state == "held" and utc(expires_at) > tx.clock_after_locks():
        return errors.BusyError.unleased_write(target, owner)
    return None


def _round(tx: Tx, requests: list[AppendRequest]) -> list[Any]:
    """:func:`append_group` for requests to distinct sessions. The fence is a
    read: a merged group runs under the backend's in-process write
    serialization (see :class:`~turnkeeper.storage.backend.Merge`), so no
    takeover or grant can commit between it and the group's commit, and it
    holds its targets (``Tx.hold``), so no renewal or release can either.

    At heads assumed from what the store object remembers (:func:`_heads`), a
    request refused there, or whose session row's compare-and-set did not
    take (another store object wrote the session, or deleted it), has
    written nothing: it is judged again, and written if it passes, in a
    round of its own that reads every head (the remembered ones set aside),
    so its outcome is the one a read head gives."""
    # Every target is held until the group commits (Tx.hold), before any
    # read: a renewal or a release, which skip the write lock, cannot commit
    # between the reads below and the commit (a release would leave a fenced
    # append committed after it; a renewal, a lease-less one beside a live
    # lease), and one committed after the group's snapshot is a conflict.
    for r in requests:
        tx.hold(session_target(r.session_id))
    assumed = _assumed(requests)
    heads = _heads(tx, requests)
    out: list[Any] = [None] * len(requests)
    for i, (r, head) in enumerate(zip(requests, heads, strict=True)):
        # the single path's order: the session, the lease, then the expected leaf
        if head is None:
            out[i] = errors.SessionNotFoundError(r.session_id)
        elif (refused := _judged(tx, r, head)) is not None:
            out[i] = refused
        elif r.expected_leaf is not ANY_LEAF and r.expected_leaf != head[0]:
            out[i] = errors.SessionModifiedError(r.session_id, r.expected_leaf, head[0])
    openings = _judge_round(tx, requests, heads, out)
    again = _refused_at_assumed(assumed, out)
    writing = [i for i in range(len(requests)) if out[i] is None]
    written = _write_round(tx, requests, heads, openings, writing, out, assumed)
    again += [i for i in writing if i not in written]
    if again:
        redo = [dataclasses.replace(requests[i], known=None) for i in sorted(again)]
        for i, outcome in zip(sorted(again), _round(tx, redo), strict=True):
            out[i] = outcome
    return out


def _refused_at_assumed(assumed: bool, out: list[Any]) -> list[int]:
    """The requests of a round refused at assumed heads (:func:`_heads`): each
    is judged again at its read head, its error here set aside (a head the
    store object remembers can be behind the session's)."""
    return [i for i, refused in enumerate(out) if assumed and refused is not None]


def _write_round(
    tx: Tx,
    requests: list[AppendRequest],
    heads: list[tuple[Any, ...] | None],
    openings: list[Opening | None],
    writing: list[int],
    out: list[Any],
    assumed: bool,
) -> set[int]:
    """Write the requests ``writing`` of a round at their heads: one
    compare-and-set of their session rows, one insert of every entry of
    those it moved; each one written gets its outcome in ``out``. Returns
    the ones written (at assumed heads, those whose row the compare-and-set
    moved; else all of them).

    Raises:
        Conflict: a session row read in this transaction moved under the group.
    """
    if not writing:
        return set()
    now = tx.now
    assert now is not None  # always set inside a transaction
    stored: dict[int, list[tuple[Any, ...]]] = {}
    moves: list[tuple[Any, ...]] = []
    for i in writing:
        r = requests[i]
        head = heads[i]
        assert head is not None
        leaf, seq = head[0], head[1]
        epoch = None if r.lease is None else r.lease.epoch
        parent, entries, rows = leaf, [], []
        for n, d in enumerate(r.drafts):
            ts = now if d.timestamp is None else d.timestamp
            e = Entry(r.session_id, d.entry_id, parent, d.kind, seq + n, utc(ts), d.payload, epoch)
            entries.append(e)
            row = (r.session_id, e.id, e.parent_id, e.kind, e.seq, e.timestamp, d.payload_json)
            rows.append((*row, epoch, now, *d.clear))
            parent = d.entry_id
        stored[i] = rows
        names = [d.payload["name"] for d in r.drafts if d.kind == EntryKind.SESSION_INFO]
        moves.append((r.session_id, parent, len(entries), names[-1] if names else None, seq, leaf))
        out[i] = (entries[0] if r.one else entries, openings[i])
    ids, leaves, counts, titles, seqs, old_leaves = ([m[k] for m in moves] for k in range(6))
    moved = tx.count(_MOVE_HEADS, [now, ids, leaves, counts, titles, seqs, old_leaves])
    written = set(writing)
    if moved != len(moves):
        if not assumed:
            raise Conflict("a session moved during a merged append")
        written = _moved(tx, requests, writing, leaves)
        for i in set(writing) - written:
            out[i] = None
    tx.insert_rows(
        "entries", ENTRY_COLUMNS, [row for i in writing if i in written for row in stored[i]]
    )
    return written


def _moved(
    tx: Tx, requests: list[AppendRequest], writing: list[int], leaves: list[Any]
) -> set[int]:
    """The requests ``writing`` whose session row the group's compare-and-set
    moved: its leaf is now their last entry (a fresh id no other row names)."""
    ids = [requests[i].session_id for i in writing]
    now_at = dict(tx.rows("SELECT id, leaf_id FROM sessions WHERE id = ANY(?::VARCHAR[])", [ids]))
    return {
        i
        for i, leaf in zip(writing, leaves, strict=True)
        if now_at.get(requests[i].session_id) == leaf
    }


def _judge_round(
    tx: Tx, requests: list[AppendRequest], heads: list[tuple[Any, ...] | None], out: list[Any]
) -> list[Opening | None]:
    """Judge each request still writing (``out[i]`` is ``None``) by the pairing
    rule at its session's head (``pairing_checks.check``, the single path's
    check, in the single path's error order: after the session, the lease and
    the expected leaf); a refused one gets its error in ``out``. Returns the
    calls open after each request's entries (``None``: not known)."""
    openings: list[Opening | None] = [None] * len(requests)
    for i, (r, head) in enumerate(zip(requests, heads, strict=True)):
        if out[i] is not None or head is None:
            continue
        leaf, seq = head[0], head[1]
        preview = _preview(r, leaf, seq)
        try:
            openings[i] = pairing_checks.check(tx, r.session_id, leaf, seq, preview, r.known)
        except errors.ToolCallPairingError as exc:
            out[i] = exc
    return openings


def _preview(r: AppendRequest, leaf: str | None, seq: int) -> list[Entry]:
    """The entries ``r`` would write under ``leaf`` from ``seq`` (as the pairing
    rule reads them: ids, parents, kinds and payloads; times are not read)."""
    out: list[Entry] = []
    parent = leaf
    for n, d in enumerate(r.drafts):
        out.append(Entry(r.session_id, d.entry_id, parent, d.kind, seq + n, _EPOCH, d.payload))
        parent = d.entry_id
    return out


CLEAR_SESSION = "sessions.key_version IS NULL"
"""The condition on a session row a clear write (the one-statement and the
merged appends: a store object that took the store for clear) names: the
session's payloads are clear. A sealed session's append takes the
transaction, which seals or refuses (``Keyring.sealing``)."""

_MOVE_HEADS = (
    "UPDATE sessions SET leaf_id = v.leaf, next_seq = sessions.next_seq + v.n, "
    "entry_count = sessions.entry_count + v.n, updated_at = ?, "
    "title = coalesce(v.title, sessions.title) "
    "FROM (SELECT unnest(?::VARCHAR[]) AS id, unnest(?::VARCHAR[]) AS leaf, "
    "unnest(?::BIGINT[]) AS n, unnest(?::VARCHAR[]) AS title, unnest(?::BIGINT[]) AS seq, "
    "unnest(?::VARCHAR[]) AS old) AS v "
    "WHERE sessions.id = v.id AND CASE WHEN sessions.next_seq = v.seq "
    f"AND sessions.leaf_id IS NOT DISTINCT FROM v.old AND {CLEAR_SESSION} "
    "THEN sessions.id END IS NOT NULL"
)
"""The merged session rows' compare-and-set: each row whose head is still the
one its append was judged at (``next_seq`` and ``leaf_id``), and whose
payloads are clear (``key_version`` NULL: a merged append writes clear
payloads, in a store object that took the store for clear), moves to its new
leaf, in one statement for the group. A join with the group's values, each
a list parameter unnested once: DuckDB gives the scan of ``sessions`` the
list of the join's keys, which its index takes (up to the
``dynamic_or_filter_threshold`` of ``storage/duck/dialect.py``, at least a
group's ``GROUP_MAX``), and the head conditions are one ``CASE`` that
cannot become a filter of that scan (see ``keyed``: written as plain
conditions, they made it read every session row of a grown store, which
``model_tests/internals/test_index_paths.py`` caught at 64 appends). It costs
DuckDB about 0.5 ms less to plan than a lookup of each value's position in
the lists (measured: 1.6 ms against 2.1 ms for 16 rows)."""


AFTER_LOCK = "coalesce(?::TIMESTAMPTZ, clock_timestamp())"
"""The store's now in the one-statement append's lease condition: the injected
clock's value, else the server's clock read as the condition is evaluated,
which is once ``o`` returned its rows, locked (see :func:`_guard`)."""

FENCE_UNEXPIRED = f"o.expires_at > {AFTER_LOCK}"
"""The one-statement append's condition that its fenced lease row (``g``, as
``o`` carries it) is unexpired: ``leases.unexpired`` in SQL."""


def _guard(tx: Tx, leased: bool) -> tuple[str, str]:
    """The one-statement append's lease CTE ``g`` and the condition on its row,
    which ``o`` carries. The lease row is read under a shared row lock
    (``Dialect.share_lock``): a takeover or grant committed meanwhile is
    re-read (and then fails the fence), one not yet committed waits for this
    statement, and a refused append writes nothing, not even the lease row.
    ``o`` then locks the session row, after ``g`` (the order every fenced
    transaction takes them in), so the append waits for nothing more once
    both are its own. The lease's expiry is judged by the condition on ``o``,
    in the session row's update, not in ``g``'s ``WHERE``: the scan below a
    row lock evaluates its conditions before it waits for the lock, the
    update's condition once ``o`` holds both, so an append that waited for
    either row past its lease's expiry is refused (``leases.unexpired`` and
    ``Tx.valid_until`` do the same in a transaction). ``MATERIALIZED`` keeps
    each a plan of its own, whatever the planner would fold."""
    lock = tx.dialect.share_lock()
    if leased:  # the full fence (leases.fence_condition, then unexpired)
        return (
            "g AS MATERIALIZED (SELECT 'held'::VARCHAR AS state, expires_at FROM leases "
            f"WHERE {leases.fence_condition(lambda c: '?')}{lock})",
            FENCE_UNEXPIRED,
        )
    # lease-less: refused while anyone holds a live lease on the session
    return (
        f"g AS MATERIALIZED (SELECT state, expires_at FROM leases WHERE target = ?{lock})",
        f"NOT coalesce(o.state = 'held' AND o.expires_at > {AFTER_LOCK}, FALSE)",
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _at(epoch_us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=epoch_us)


_CLEAR = ", ".join(f"d.{c}" for c in CLEAR_COLUMNS)
"""The clear facts of ``d``'s rows, as ``entries`` takes them last."""
_ONE_DRAFT = (
    "(SELECT ?::VARCHAR AS id, ?::VARCHAR AS parent, ?::VARCHAR AS kind, "
    "?::TIMESTAMPTZ AS ts, ?::VARCHAR AS payload, 0::BIGINT AS ord, "
    + ", ".join(f"?::VARCHAR AS {c}" for c in CLEAR_COLUMNS)
    + ") AS d"
)
_DRAFTS = (
    "(SELECT unnest(?::VARCHAR[]) AS id, unnest(?::VARCHAR[]) AS parent, "
    "unnest(?::VARCHAR[]) AS kind, unnest(?::TIMESTAMPTZ[]) AS ts, "
    "unnest(?::VARCHAR[]) AS payload, unnest(?::BIGINT[]) AS ord, "
    + ", ".join(f"unnest(?::VARCHAR[]) AS {c}" for c in CLEAR_COLUMNS)
    + ") AS d"
)


def _draft_rows(drafts: Sequence[Draft]) -> tuple[str, list[Any]]:
    """The drafts as the relation ``d`` of :func:`one_statement` (id, parent
    within the batch, kind, timestamp, payload, position, clear facts) and its parameters:
    one draft as plain values (array parameters cost the client more to send
    than the statement costs the server), several as one array per column."""
    if len(drafts) == 1:
        d = drafts[0]
        return _ONE_DRAFT, [d.entry_id, None, d.kind, d.timestamp, d.payload_json, *d.clear]
    ids = [d.entry_id for d in drafts]
    facts = [d.clear for d in drafts]
    return _DRAFTS, [
        ids,
        [None, *ids[:-1]],
        [d.kind for d in drafts],
        [d.timestamp for d in drafts],
        [d.payload_json for d in drafts],
        list(range(len(ids))),
        *([f[i] for f in facts] for i in range(len(CLEAR_COLUMNS))),
    ]


def one_statement(tx: Tx, r: AppendRequest) -> Any:
    """A plain append as one autocommit statement of data-modifying CTEs (for a
    server, where each statement is a round trip; PostgreSQL SQL, as only its
    dialect asks for it): the lease row locked under the fence (or found not
    held), then the session row locked and its leaf and sequence read, both
    judged after the locks (see :func:`_guard`), the session row's
    compare-and-set and the insert, all or nothing. The
    compare-and-set also requires the session row's version (``xmin``) it
    read: a grant writes that row (``leases.touch_session``), so a grant
    committed meanwhile, even the first one of a session without a lease row
    to lock, fails it.
    With ``r.known`` (the head its entries were judged at by the pairing
    rule, ``pairing_checks``) it writes only while the session's head is
    still that one. Returns the outcome (as :func:`append_group`'s, without the calls
    open after it), or ``None`` when it wrote nothing (a missing session, a
    lost lease, a holder, another leaf than expected or judged, or a
    concurrent append): the caller then runs the append in a transaction,
    which raises the error that applies (or succeeds, after a lost race)."""
    leased = r.lease is not None
    guard, holds = _guard(tx, leased)
    now = tx.now
    # the guard's parameters, and those of the condition on it (see _guard)
    guard_params: list[Any] = (
        [session_target(r.session_id)] if r.lease is None else leases.fence_values(r.lease)
    )
    holds_params: list[Any] = [now]
    expected = "" if r.expected_leaf is ANY_LEAF else " AND o.leaf_id IS NOT DISTINCT FROM ?"
    judged = r.known
    at_judged = "" if judged is None else " AND o.leaf_id IS NOT DISTINCT FROM ? AND o.next_seq = ?"
    ids = [d.entry_id for d in r.drafts]
    names = [d.payload["name"] for d in r.drafts if d.kind == EntryKind.SESSION_INFO]
    epoch = None if r.lease is None else r.lease.epoch
    drafts, draft_params = _draft_rows(r.drafts)
    sql = (
        f"WITH {guard}, o AS MATERIALIZED (SELECT sessions.leaf_id, sessions.next_seq, "
        "sessions.xmin, g.state, g.expires_at FROM sessions LEFT JOIN g ON TRUE "
        "WHERE sessions.id = ? FOR UPDATE OF sessions), "
        "s AS (UPDATE sessions SET leaf_id = ?, next_seq = sessions.next_seq + ?, "
        f"entry_count = sessions.entry_count + ?, updated_at = {NOW}, "
        "title = coalesce(?, sessions.title) FROM o WHERE sessions.id = ? "
        "AND sessions.next_seq = o.next_seq AND sessions.leaf_id IS NOT DISTINCT FROM o.leaf_id "
        f"AND sessions.xmin = o.xmin AND {CLEAR_SESSION} "
        f"AND {holds}{expected}{at_judged} "
        "RETURNING o.leaf_id AS parent, o.next_seq AS seq) "
        f"INSERT INTO entries ({', '.join(ENTRY_COLUMNS)}) SELECT ?, d.id, "
        "CASE WHEN d.ord = 0 THEN s.parent ELSE d.parent END, d.kind, s.seq + d.ord, "
        f"coalesce(d.ts, {NOW}), d.payload, ?::BIGINT, {NOW}, {_CLEAR} FROM s, {drafts} "
        f"RETURNING seq, parent_id, {tx.dialect.epoch_us('ts')}"
    )
    params: list[Any] = [
        *guard_params,
        r.session_id,
        ids[-1],
        len(ids),
        len(ids),
        now,
        names[-1] if names else None,
        r.session_id,
        *holds_params,
        *([r.expected_leaf] if expected else []),
        *([] if judged is None else [judged.leaf_id, judged.next_seq]),
        r.session_id,
        now,
        epoch,
        now,
    ]
    rows = sorted(tx.rows(sql, params + draft_params))
    if len(rows) != len(ids):
        return None
    out = [
        Entry(r.session_id, d.entry_id, row[1], d.kind, row[0], _at(row[2]), d.payload, epoch)
        for d, row in zip(r.drafts, rows, strict=True)
    ]
    return out[0] if r.one else out


def _draft_entry(r: AppendRequest, d: Draft) -> Entry:
    return Entry(r.session_id, d.entry_id, None, d.kind, 0, _EPOCH, d.payload)


class AppendsPart(Area):
    """Appends (session seed AppendEntry)."""

    def _append(self, operation: str, request: AppendRequest) -> Any:
        """Run an append: a plain one as one statement where the dialect says so
        (falling back to a transaction when it wrote nothing), else in a
        transaction (:func:`~.sessions.append_chain`), which a group commit may
        merge with its neighbours. What a committed append leaves open is
        remembered for the session (``pairing_checks``)."""
        sid = request.session_id
        r = dataclasses.replace(request, known=self._openings.get(sid))
        # Sealed payloads take the transaction (append_chain seals them there).
        plain = mergeable(r.drafts) and not self.db.keyring.encrypted
        if plain and self.db.dialect.one_statement_appends:
            done = self._one_statement(operation, r)
            if done is not None:
                return done

        def body(tx: Tx) -> tuple[Any, Opening | None]:
            chain = append_chain(
                tx, sid, r.drafts, expected_leaf=r.expected_leaf, lease=r.lease, known=r.known
            )
            return (chain.entries[0] if r.one else chain.entries), chain.opening

        merge = Merge(append_group, r) if plain else None
        result, opening = self._fenced(operation, r.lease, body, merge)
        self._openings.put(sid, opening)
        return result

    def _one_statement(self, operation: str, request: AppendRequest) -> Any:
        """The one-statement append (PostgreSQL), when the pairing rule can judge
        its entries at the head the store object remembers (``None``: it wrote
        nothing, or it was not tried: run the append in a transaction)."""
        known = request.known
        messages = any(
            context_message(_draft_entry(request, d)) is not None for d in request.drafts
        )
        judged: Opening | None = None
        after: Opening | None = None
        if messages:
            if known is None:
                return None  # nothing known to judge by: the transaction reads it
            ok, after = judge(known, _preview(request, known.leaf_id, known.next_seq))
            if not ok:
                return None  # the transaction finds the fault's reason and raises it
            judged = known
        judging = dataclasses.replace(request, known=judged)
        done = self.db.write(operation, lambda tx: one_statement(tx, judging), transaction=False)
        if done is not None:
            self._openings.put(request.session_id, after)
        return done

    def append(
        self,
        session_id: str,
        kind: str,
        payload: Mapping[str, Any],
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        entry_id: str | None = None,
        timestamp: datetime | None = None,
    ) -> Entry:
        """Append an entry under the current leaf; it becomes the leaf (as in pi).

        ``kind`` is one of the seed's entry kinds and ``payload`` its fields
        (``{"message": {...}}`` for a message …). With ``expected_leaf`` the
        append is a compare-and-set on the leaf; without it the leaf is read
        and written in one transaction. With ``lease`` the lease is validated
        in that transaction and its epoch stored on the entry.

        The replayed context stays valid for a model provider, by the rule
        ``storage/pairing.py`` states (pi ``toolCall``/``toolResult`` and
        OpenAI ``tool_calls``/``tool`` shapes): a result must answer a call
        open in the context replay builds at the leaf (not answered yet, and
        no other message since its assistant message); any other message is
        refused while calls of the last assistant message have no result yet
        (a provider takes no message between calls and their results; calls
        of an ``aborted`` or ``error`` pi reply need none); and a compaction
        may not keep a fault, such as a result whose call it cuts off
        (``firstKeptEntryId`` between them). These are refused rather than
        stored in another form, because only the runtime knows what a result
        belongs to and whether a tool is still running: a silently moved,
        dropped or invented result would be a second invention.
        ``turnkeeper audit`` judges stored sessions by the same rule.

        An ``entry_id`` of your own must be free: not an entry of the session,
        and not the missing parent an entry imported without its parent names
        (the new entry would become that parent and move the imported
        entry's branch under itself, unjudged). That check reads the
        session's entries (no index serves a lookup by parent).

        Raises:
            SessionModifiedError: the leaf is not ``expected_leaf``.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
            ToolCallsUnansweredError: a message would follow tool calls that
                have no result yet (``tool_call_ids`` names them).
            ToolCallPairingError: a result or compaction would break the
                tool-call pairing of the replayed context (``reason``).
            SessionNotFoundError, EntryExistsError (``entry_id`` taken),
            EntryIdReservedError (``entry_id`` is the missing parent of an
            entry of the session: ``by`` names it, ``reason`` ``"parent"``),
            EntryNotFoundError (a label's target is missing),
            InvalidInputError (kind, payload, id or naive timestamp).
        On any error nothing is written.
        """
        check_id(session_id, "session_id")
        draft = draft_of(kind, payload, entry_id, timestamp, "")
        check_expected_leaf(expected_leaf)
        check_session_lease(session_id, lease)
        return self._append(  # type: ignore[no-any-return]
            "append", AppendRequest(session_id, (draft,), expected_leaf, lease, one=True)
        )

    def append_many(
        self,
        session_id: str,
        entries: Sequence[NewEntry | tuple[str, Mapping[str, Any]]],
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
    ) -> list[Entry]:
        """Append ``entries`` as a chain under the current leaf, in one transaction:
        the first one's parent is the leaf, each next one's the one before, and
        the last becomes the leaf. Each item is a :class:`NewEntry` or a
        ``(kind, payload)`` pair. One lease fence, one leaf compare-and-set and
        one multi-row insert for the whole batch, so a batch costs about what
        one :meth:`sessions.append` does (a turn's messages, a transcript's tail).

        Every rule of :meth:`sessions.append` holds for each entry, judged in order (a
        ``toolResult`` may answer a ``toolCall`` earlier in the batch, a label
        may target an entry earlier in the batch). All or nothing: on any
        error nothing of the batch is written.

        Returns the stored entries in order (seq consecutive).

        Raises:
            as :meth:`sessions.append`; InvalidInputError also for an empty batch, a
            malformed item (its ``field`` names the item: ``entries[3].payload``)
            or an ``entry_id`` given twice in the batch.
        """
        check_id(session_id, "session_id")
        drafts = drafts_of(entries)
        check_expected_leaf(expected_leaf)
        check_session_lease(session_id, lease)
        return self._append(  # type: ignore[no-any-return]
            "append_many", AppendRequest(session_id, tuple(drafts), expected_leaf, lease)
        )

    def set_label(
        self,
        session_id: str,
        target_id: str,
        label: str | None,
        *,
        lease: Lease | None = None,
    ) -> Entry:
        """Label ``target_id`` (``None`` clears), as a ``label`` entry under the leaf."""
        payload: dict[str, Any] = {"targetId": target_id}
        if label is not None:
            payload["label"] = label
        return self.append(session_id, EntryKind.LABEL, payload, lease=lease)

    def set_title(
        self, session_id: str, name: str, *, source: str | None = None, lease: Lease | None = None
    ) -> Entry:
        """Title the session with a ``session_info`` entry (the latest one wins)."""
        payload: dict[str, Any] = {"name": name}
        if source is not None:
            payload["source"] = source
        return self.append(session_id, EntryKind.SESSION_INFO, payload, lease=lease)
