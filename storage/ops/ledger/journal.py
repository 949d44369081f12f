"""The ledger's journal transactions: the opening fence and the fenced appends
(sessionstore OpenJournal, SessionJournal.Append), run inside the caller's
transaction.

Statement budget (BEGIN and COMMIT aside): an open is the session's check,
the lease fence, the tip's locked read, the look for a record past the tip,
the look for its fence id (an index lookup), the fence record and the tip's
compare-and-set; an append of n records is
the lease fence, the tip's locked read, one read of the ids already in the
ledger and of a record past the tip, one multi-row insert and the tip's
compare-and-set, whatever n is, plus one read of GC's condemned blobs when
it writes blob pointers (``condemn.check_append``) and, then, a read of
the session's key version and, in a sealed session, of their stored blobs'
heads (``sealing.current_blobs``), plus one read of the session's data key
version (``sealing.sealer``, in a clear store object too: a ledger write
compares no session row, and the session may have been sealed since this
object took the store for clear; the key itself is cached); the transaction then
updates the session's catalog entry (a read and a compare-and-set:
``catalog_group``; records all of kinds the catalog does not fold, one
compare-and-set of the entry's cursor).

A record past the tip is damage (the tip row lowered or lost from outside):
the tip's row lock orders every writer, so no concurrent writer can have
put it there. The write is refused typed (``LedgerTipDamagedError``) instead
of colliding with it on the primary key, which the write path would take
for a write-write conflict and retry.

Fencing is the lease machinery's (:func:`.leases.fence`, the expiry judged
at a clock read after the lease row's lock), plus the ledger's own check
that its newest fence is the writer's epoch (:func:`check_epoch`): a lease
fence passed by a writer whose ledger another epoch has fenced since is
refused all the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from turnkeeper.machines import machine_for
from turnkeeper.spec import errors
from turnkeeper.spec.ledger import (
    BLOB_POINTER_KIND,
    FENCE_KIND,
    LEDGER_WRITER,
    AppendResult,
    LedgerEntry,
    fence_id,
)
from turnkeeper.spec.records import Lease

from ...backend import Conflict, Tx
from .. import leases
from ..capabilities import session_exists
from . import condemn, sealing
from .records import record_digest, sha256

MACHINE = machine_for(LEDGER_WRITER)

_WHERE = "tenant = ? AND session_id = ?"

COLUMNS = (
    "tenant",
    "session_id",
    "seq",
    "kind",
    "idempotency_id",
    "payload",
    "payload_sha256",
    "epoch",
    "written_at",
    "record_sha256",
    "blob_key",
)
"""``ledger_records``'s columns, in table order (the inserts')."""

Known = tuple[int, str, str, str | None]
"""A record already stored under an idempotency id, as the append's check
reads it: ``(seq, kind, payload sha256, blob key when it is a blob pointer)``
(the digest is the clear payload's; the key is the clear ``blob_key``
column: a sealed payload is never read for it)."""


def known_pointer(table: str = "") -> str:
    """The select expression of :data:`Known`'s last field, over the
    ``ledger_records`` columns of alias ``table``: the clear ``blob_key``
    (``NULL`` but for a blob pointer)."""
    at = f"{table}." if table else ""
    return f"{at}blob_key"


def read_tip(tx: Tx, tenant: str, session_id: str, *, lock: bool = False) -> tuple[int, int]:
    """The ledger's ``(tip, epoch of its newest fence)``; ``(0, 0)`` when it has
    no record. With ``lock``, the tip's row is locked (PostgreSQL) until the
    transaction ends."""
    row = tx.one(
        f"SELECT seq, epoch FROM ledger_tips WHERE {_WHERE}"
        + (tx.dialect.update_lock() if lock else ""),
        [tenant, session_id],
    )
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def refuse_past_tip(session_id: str, tip: int, seqs: Sequence[int]) -> None:
    """The write path's tip fence: none of ``seqs`` (records found) lies past
    ``tip``.

    Raises:
        LedgerTipDamagedError: one does (the first is named).
    """
    past = [seq for seq in seqs if seq > tip]
    if past:
        raise errors.LedgerTipDamagedError(session_id, tip, min(past))


def tip_unmoved(expected: int, found: int) -> bool:
    """The opening compare-and-set's test: the tip is the one the open read."""
    return expected == found


def plant_fence(tx: Tx, tenant: str, session_id: str, lease: Lease, expected: int) -> int:
    """Open a writer under ``lease`` (edge ``plant_fence``): after the lease
    fence, compare the tip with ``expected`` (read by the open before this
    transaction, never again: a retry of this transaction compares the same
    ``expected``) and write the fence record at ``expected + 1``. Returns its
    sequence.

    Raises:
        LeaseLostError: the lease fence refused ``lease`` (edge ``opening_lost``).
        OpeningFenceConflictError: the tip moved (edge ``opening_conflict``).
        SessionNotFoundError: the session does not exist (deleted under the lease).
        LedgerIdempotencyConflictError: a record holds the fence's id
            (:func:`refuse_taken_fence_id`).
    """
    session_exists(tx, session_id)
    now = leases.fence(tx, lease)
    found, _ = read_tip(tx, tenant, session_id, lock=True)
    edge = MACHINE.require(
        "open", "opening", {"lease_held": True, "tip_unmoved": tip_unmoved(expected, found)}
    )
    if edge.name == "opening_conflict":
        raise errors.OpeningFenceConflictError(session_id, lease.epoch, expected, found)
    past = tx.one(
        f"SELECT seq FROM ledger_records WHERE {_WHERE} AND seq > ? ORDER BY seq LIMIT 1",
        [tenant, session_id, found],
    )
    refuse_past_tip(session_id, found, [] if past is None else [int(past[0])])
    seq = expected + 1
    fid = fence_id(lease.epoch, seq)
    taken = tx.one(
        f"SELECT seq FROM ledger_records WHERE {_WHERE} AND idempotency_id = ?",
        [tenant, session_id, fid],
    )
    refuse_taken_fence_id(session_id, fid, None if taken is None else int(taken[0]))
    _insert(
        tx,
        tenant,
        session_id,
        lease.epoch,
        now,
        [(seq, LedgerEntry(FENCE_KIND, b"", fid))],
    )
    _move_tip(tx, tenant, session_id, found, seq, lease.epoch)
    return seq


def refuse_taken_fence_id(session_id: str, fid: str, seq: int | None) -> None:
    """The open's own id fence: no record holds the fence id ``fid`` it is
    about to write (``seq``: the record that does, ``None``: none). Appends
    refuse ids starting ``fence:`` (``writer.check_entry``); a record stored
    before they did could hold one, and its open would otherwise collide with
    it on the unique key, taken for a write-write conflict and retried.

    Raises:
        LedgerIdempotencyConflictError: one does; open under a fresh lease (a
            higher epoch: another fence id).
    """
    if seq is not None:
        raise errors.LedgerIdempotencyConflictError(
            session_id,
            fid,
            seq,
            detail="a record stored before fence ids were reserved holds this open's "
            "fence id: open under a fresh lease (a higher epoch)",
        )


def check_epoch(session_id: str, lease: Lease, ledger_epoch: int) -> None:
    """The ledger's own fence of an append: the newest fence record in the
    ledger is the writer's epoch.

    Raises:
        LeaseLostError: another epoch fenced the ledger since this writer opened.
    """
    if ledger_epoch != lease.epoch:
        raise errors.LeaseLostError(
            lease.target,
            detail=f"ledger of {session_id!r} is fenced by epoch {ledger_epoch}, "
            f"this writer's is {lease.epoch}",
        )


def append(
    tx: Tx,
    tenant: str,
    session_id: str,
    lease: Lease,
    entries: Sequence[LedgerEntry],
    logical: Sequence[LedgerEntry] = (),
    blob_versions: Mapping[str, int | None] | None = None,
) -> list[AppendResult]:
    """Append ``entries`` (as stored: an offloaded payload already its
    pointer; ``logical`` the same entries as given, default ``entries``;
    ``blob_versions`` the key version each pointer's blob was sealed
    under, ``sealing.current_blobs``) in
    order under ``lease`` (edge ``append``): the lease fence, then the
    ledger's (:func:`check_epoch`), judged with the tip's row locked; an
    entry whose idempotency id is already in the ledger (or earlier in
    ``entries``) with the same kind and payload, inline or offloaded
    (``condemn.same_record``), takes that record's sequence and writes nothing.

    Raises:
        LeaseLostError: a fence refused the writer (edge ``overtaken``).
        LedgerIdempotencyConflictError: an id already names other content.
        BlobCondemnedError: a new pointer names a blob GC condemned
            (``condemn.check_append``).
        condemn.StaleBlob: a new pointer's blob outside the database was sealed
            under a stale key version (``sealing.current_blobs``).
        SessionNotFoundError: the ledger is gone with its session (deleted).
    """
    now = leases.fence(tx, lease)
    tip, ledger_epoch = read_tip(tx, tenant, session_id, lock=True)
    if tip == 0:  # no fence of this writer's: its session is gone, or it never opened
        session_exists(tx, session_id)
    check_epoch(session_id, lease, ledger_epoch)
    MACHINE.require("append", "open", {"lease_held": True})
    ids = list(dict.fromkeys(e.idempotency_id for e in entries))
    marks = ", ".join("?" for _ in ids)
    known: dict[str, Known] = {
        str(r[0]): (int(r[1]), str(r[2]), str(r[3]), None if r[4] is None else str(r[4]))
        for r in tx.rows(
            f"SELECT idempotency_id, seq, kind, payload_sha256, {known_pointer()} "
            f"FROM ledger_records WHERE {_WHERE} AND idempotency_id IN ({marks}) UNION ALL "
            f"SELECT idempotency_id, seq, kind, payload_sha256, {known_pointer()} "
            f"FROM ledger_records WHERE {_WHERE} AND seq = ?",
            [tenant, session_id, *ids, tenant, session_id, tip + 1],
        )
    }
    results, new = sequence(session_id, tip, entries, known, logical)
    condemn.check_append(tx, session_id, new)
    sealing.current_blobs(tx, session_id, new, logical or entries, blob_versions or {})
    if new:
        _insert(tx, tenant, session_id, lease.epoch, now, new)
        _move_tip(tx, tenant, session_id, tip, new[-1][0], ledger_epoch)
    return results


def sequence(
    session_id: str,
    tip: int,
    entries: Sequence[LedgerEntry],
    known: dict[str, Known],
    logical: Sequence[LedgerEntry] = (),
) -> tuple[list[AppendResult], list[tuple[int, LedgerEntry]]]:
    """Number ``entries`` (as stored; ``logical``: as given, default
    ``entries``) from ``tip + 1``: an entry whose idempotency id is in
    ``known`` (:data:`Known` of the records already stored under it, and of
    the record at ``tip + 1`` if one is there; entries numbered here are
    added) with the same logical content (``condemn.same_record``: kind and
    payload, inline or offloaded) takes that record's sequence. Returns each
    entry's result and the records to write, ``(seq, entry)``.

    Raises:
        LedgerTipDamagedError: a known record lies past the tip.
        LedgerIdempotencyConflictError: an id already names other content.
    """
    refuse_past_tip(session_id, tip, [k[0] for k in known.values()])
    results: list[AppendResult] = []
    new: list[tuple[int, LedgerEntry]] = []
    seq = tip
    for entry, given in zip(entries, logical or entries, strict=True):
        digest = sha256(entry.payload)
        first = known.get(entry.idempotency_id)
        if first is not None:
            if not condemn.same_record(first, entry, digest, given):
                raise errors.LedgerIdempotencyConflictError(
                    session_id, entry.idempotency_id, first[0]
                )
            results.append(AppendResult(first[0], duplicate=True))
            continue
        seq += 1
        pointer = condemn.pointer_key(entry.payload) if entry.kind == BLOB_POINTER_KIND else None
        known[entry.idempotency_id] = (seq, entry.kind, digest, pointer)
        new.append((seq, entry))
        results.append(AppendResult(seq))
    return results, new


def _insert(
    tx: Tx,
    tenant: str,
    session_id: str,
    epoch: int,
    now: object,
    rows: Sequence[tuple[int, LedgerEntry]],
) -> None:
    """One insert of ``rows`` (sequence, entry) stamped ``epoch`` and ``now``,
    each payload sealed under the session's data key when it has one
    (``sealing.sealer``): on DuckDB through ``Tx.insert_rows`` (a list per
    column: a parameter per value cost it 7 ms for 100 records), on
    PostgreSQL one multi-row ``INSERT`` (one round trip, where ``COPY`` takes two).

    Raises:
        KeyUnavailableError: a sealed session and no key for it (nothing written).
    """
    seal = sealing.sealer(tx, session_id)
    values = [record_row(tenant, session_id, epoch, now, seq, e, seal) for seq, e in rows]
    if tx.dialect.serialized_writes:
        tx.insert_rows("ledger_records", COLUMNS, values)
        return
    marks = ", ".join("(" + ", ".join("?" for _ in COLUMNS) + ")" for _ in values)
    tx.exec(
        f"INSERT INTO ledger_records ({', '.join(COLUMNS)}) VALUES {marks}",
        [v for row in values for v in row],
    )


def record_row(
    tenant: str,
    session_id: str,
    epoch: int,
    now: object,
    seq: int,
    e: LedgerEntry,
    seal: sealing.Sealer,
) -> tuple[object, ...]:
    """The ``ledger_records`` row of entry ``e`` at ``seq``, in the column order
    of :data:`COLUMNS`: its clear payload's sha256 and its record digest
    computed, the payload as ``seal(seq, payload)`` stores it, and a blob
    pointer's key in the clear ``blob_key`` column."""
    digest = sha256(e.payload)
    sealed = record_digest(tenant, session_id, seq, e.kind, e.idempotency_id, epoch, digest)
    key = condemn.pointer_key(e.payload) if e.kind == BLOB_POINTER_KIND else None
    return (
        tenant, session_id, seq, e.kind, e.idempotency_id, seal(seq, e.payload), digest, epoch,
        now, sealed, key,
    )  # fmt: skip


def _move_tip(tx: Tx, tenant: str, session_id: str, old: int, new: int, epoch: int) -> None:
    """Compare-and-set the tip from ``old`` (0: no row yet) to ``new`` under ``epoch``."""
    if old == 0:
        tx.exec(
            "INSERT INTO ledger_tips (tenant, session_id, seq, epoch) VALUES (?, ?, ?, ?)",
            [tenant, session_id, new, epoch],
        )
        return
    moved = tx.count(
        f"UPDATE ledger_tips SET seq = ?, epoch = ? WHERE {_WHERE} AND seq = ?",
        [new, epoch, tenant, session_id, old],
    )
    if moved != 1:
        raise Conflict(f"the ledger tip of {session_id!r} moved")
