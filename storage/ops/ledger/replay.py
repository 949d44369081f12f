"""Streaming, fail-closed replay of a session's ledger (sessionstore
OpenInternalRecordReplayer, ReplayRequest).

A replay reads the ledger's tip once, then pages of at most ``page_rows``
records in sequence order (each page one read of its own), and yields each
record after verifying it; it holds one page at a time, so its memory is
bounded by ``page_rows`` records: ``page_rows`` × (the largest payload's bytes
+ a record's fixed fields, about 512 bytes), plus a working set that does not
grow with the ledger (the driver's result and the verifier, about 256 KiB;
``make bench`` measures both against a replay of 100,000 records). It never yields a record it has
not verified, and never ends short of the tip it read: every failure raises,
typed, with the sequence:

- ``ReplayReadError``: a page read failed (the backend's error is
  ``__cause__``), or a record is missing (a gap, or the ledger ends before
  its tip), or the ledger is shorter than it was (a record past its tip: the
  tip lowered or lost; or its session's catalog entry, updated in each
  append's transaction, folded records past the tip: a lost tail with the
  tip lowered alongside, such as an older copy of the ledger's tables
  restored beside a newer catalog);
- ``ReplayDecodeError``: a record's payload does not hash to its stored
  sha256 (flipped or truncated bytes), the record does not match its record
  digest (``records.record_digest``: its tenant, session, sequence, kind,
  idempotency id, epoch or payload changed, or the row copied from elsewhere),
  a fence's epoch is below an earlier fence's, or a record is stamped with
  another epoch than the fence before it (a stale writer's record); or a blob
  pointer does not decode or names a blob outside
  the record's own ledger;
- the blob errors of an offloaded record (``blobs.resolve``:
  ``DurableBodyTooLargeError``, ``BlobUnavailableError``,
  ``BlobIntegrityError``, ``BlobPointerIDMismatchError``), with its sequence
  and the blob's key; a pointer is yielded as the record it stands for;
- in a sealed session's ledger (``sealing.py``), ``PayloadAuthenticationError``
  (session, record id the sequence, field ``payload``): a payload that is
  clear or fails authentication (a flipped byte, moved from another
  sequence or session); ``KeyUnavailableError``: no key to open it (a store
  object opened without ``encryption=``, a shredded key). A payload is
  opened before its digests are checked: they are over the clear bytes;
- ``EmptySessionError``: the ledger holds no record;
- ``SessionNotFoundError``: nor does the session exist.

Records appended after the replay read the tip are not yielded: a replay is
of the ledger as it stood when it started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import BLOB_POINTER_KIND, FENCE_KIND, LedgerRecord

from ...backend import Backend, Tx, utc
from . import catalog_codec, sealing
from .journal import read_tip
from .records import check_record

PAGE_ROWS = 256
"""Records per page of a replay (its memory bound, with the largest payload)."""

RECORD_COLUMNS = (
    "seq, kind, idempotency_id, payload, payload_sha256, epoch, written_at, record_sha256"
)
"""The columns a verified read of ``ledger_records`` takes, in ``verify``'s order."""


def ledger_name(session_id: str) -> str:
    """The name a ``ReplayReadError`` gives a session's ledger."""
    return f"ledger:{session_id}"


def _read(
    db: Backend, session_id: str, seq: int, body: Callable[[Tx], Any], *, snapshot: bool = False
) -> Any:
    """``db.read(body)`` (with ``snapshot``, its statements in one snapshot); a
    backend failure is ``ReplayReadError`` at ``seq``."""
    try:
        return db.read("ledger_replay", body, snapshot=snapshot)
    except errors.DatabaseError as failure:
        raise errors.ReplayReadError(ledger_name(session_id), seq) from failure


def _page(
    tenant: str, session_id: str, start: int, tip: int, page_rows: int, tx: Tx
) -> list[tuple[Any, ...]]:
    """At most ``page_rows`` records from ``start`` up to ``tip``, in sequence
    order, their payloads opened (``sealing.open_rows``)."""
    rows = tx.rows(
        f"SELECT {RECORD_COLUMNS} FROM ledger_records WHERE tenant = ? AND session_id = ? "
        "AND seq >= ? AND seq <= ? ORDER BY seq LIMIT ?",
        [tenant, session_id, start, tip, page_rows],
    )
    return sealing.open_rows(tx, session_id, rows)


def _fence_before(tenant: str, session_id: str, seq: int, tx: Tx) -> tuple[Any, ...] | None:
    """The newest fence record before ``seq``, its payload opened; ``None``: none."""
    row = tx.one(
        f"SELECT {RECORD_COLUMNS} FROM ledger_records WHERE tenant = ? AND session_id = ? "
        "AND kind = ? AND seq < ? ORDER BY seq DESC LIMIT 1",
        [tenant, session_id, FENCE_KIND, seq],
    )
    return None if row is None else sealing.open_row(tx, session_id, row)


def in_sequence(seq: int, expected: int) -> bool:
    """Replay's gap fence: the record read is the one expected next (a record
    missing before the tip fails the replay closed, never shortens it)."""
    return seq == expected


def verify(
    tenant: str, session_id: str, row: tuple[Any, ...], fence_epoch: int
) -> tuple[int, bool]:
    """Check one record ``(seq, kind, id, payload, sha256, epoch, written_at,
    record digest)`` of ``tenant``'s ``session_id`` read after a fence of
    ``fence_epoch`` (0: none yet); returns the fence epoch after it and whether
    it is a fence.

    Raises:
        ReplayDecodeError: its payload does not hash to its sha256, it does not
            match its record digest (``records.check_record``), a fence below an
            earlier fence's epoch, or another epoch than its fence's.
    """
    check_record(tenant, session_id, row)
    seq, kind, epoch = row[0], row[1], row[5]
    if kind == FENCE_KIND:
        if epoch < fence_epoch:
            raise errors.ReplayDecodeError(
                session_id, seq, detail=f"a fence of epoch {epoch} after one of {fence_epoch}"
            )
        return int(epoch), True
    if epoch != fence_epoch:
        raise errors.ReplayDecodeError(
            session_id,
            seq,
            detail=f"stamped with epoch {epoch}, but the fence before it is epoch {fence_epoch}",
        )
    return fence_epoch, False


def _tip_and_last(tenant: str, session_id: str, tx: Tx) -> tuple[int, int, int]:
    """The ledger's tip, its last record's sequence, and the sequence its
    session's catalog entry folded through (its ``folded_seq``; 0: no entry,
    or a malformed one written before the column); run in one snapshot (an
    append moves all three in one transaction, so the tip is the greatest in
    every committed state: read apart, an append committed between the reads
    would look like a damaged tip)."""
    tip, _ = read_tip(tx, tenant, session_id)
    where = "WHERE tenant = ? AND session_id = ?"
    row = tx.one(f"SELECT max(seq) FROM ledger_records {where}", [tenant, session_id])
    entry = tx.one(
        f"SELECT folded_seq, CASE WHEN folded_seq = 0 THEN meta END FROM ledger_catalog {where}",
        [tenant, session_id],
    )
    folded = 0
    if entry is not None:  # an entry written before schema 27 keeps its cursor in its JSON only
        folded = int(entry[0]) or catalog_codec.folded_through(entry[1])
    return tip, int(row[0]) if row is not None and row[0] is not None else 0, folded


def tip_covers(tip: int, last: int) -> bool:
    """Replay's tip fence: nothing lies past the tip, neither a record nor
    the catalog's fold (a tip lowered or lost would end the replay early, or
    call a ledger empty). Records missing before the tip are found by the
    stream itself (``in_sequence``)."""
    return last <= tip


def verified_rows(
    db: Backend,
    tenant: str,
    session_id: str,
    from_seq: int,
    page_rows: int,
    check_session: Callable[[], object],
) -> Iterator[tuple[Any, ...]]:
    """The rows ``(seq, kind, idempotency id, payload, payload_sha256, epoch,
    written_at, record_sha256)`` of ``session_id``'s ledger from ``from_seq``
    to the tip read at the start, each verified (:func:`verify`, the gap and
    tip fences) before it is yielded; blob pointers as stored (unresolved).
    Replay and GC's reference scan read the ledger through it. Raises as the
    module docstring says (the blob errors aside)."""
    tip, last, folded = _read(
        db, session_id, from_seq, partial(_tip_and_last, tenant, session_id), snapshot=True
    )
    if not tip_covers(tip, last):
        raise errors.ReplayReadError(
            ledger_name(session_id),
            tip + 1,
            detail=f"its tip says {tip} but its records reach {last}: the tip was damaged",
        )
    if not tip_covers(tip, folded):
        raise errors.ReplayReadError(
            ledger_name(session_id),
            tip + 1,
            detail=f"its tip says {tip} but its catalog entry folded records up to {folded}: "
            "the ledger lost its tail",
        )
    if tip == 0:
        check_session()
        raise errors.EmptySessionError(session_id)
    # The epoch of the fence governing from_seq: the newest fence before it.
    fence_epoch = 0
    if from_seq > 1:
        row = _read(
            db,
            session_id,
            from_seq,
            partial(_fence_before, tenant, session_id, from_seq),
        )
        if row is not None:
            fence_epoch, _ = verify(tenant, session_id, row, 0)
    expected = from_seq
    while expected <= tip:
        rows = _read(
            db, session_id, expected, partial(_page, tenant, session_id, expected, tip, page_rows)
        )
        if not rows:
            raise errors.ReplayReadError(
                ledger_name(session_id), expected, detail=f"the ledger ends before its tip {tip}"
            )
        for row in rows:
            if not in_sequence(int(row[0]), expected):
                raise errors.ReplayReadError(
                    ledger_name(session_id), expected, detail=f"record {expected} is missing"
                )
            fence_epoch, _ = verify(tenant, session_id, row, fence_epoch)
            yield row
            expected += 1
        del rows


def replay(
    db: Backend,
    tenant: str,
    session_id: str,
    from_seq: int,
    page_rows: int,
    check_session: Callable[[], object],
    resolve: Callable[[int, str, bytes], tuple[str, bytes]],
) -> Iterator[LedgerRecord]:
    """The records of ``session_id``'s ledger from ``from_seq`` to the tip read
    at the start (see the module docstring). ``check_session`` raises
    ``SessionNotFoundError`` when the session does not exist; ``resolve(seq,
    idempotency id, pointer payload)`` is a blob pointer's verified ``(kind,
    payload)`` (``blobs.resolve``: it raises the blob errors)."""
    for row in verified_rows(db, tenant, session_id, from_seq, page_rows, check_session):
        kind, payload = str(row[1]), bytes(row[3])
        if kind == BLOB_POINTER_KIND:
            kind, payload = resolve(int(row[0]), str(row[2]), payload)
        yield LedgerRecord(
            session_id,
            int(row[0]),
            kind,
            str(row[2]),
            payload,
            int(row[5]),
            utc(row[6]),
            tenant,
        )
