"""Ledger blob GC (sessionstore ObjectGC, OpenObjectGC, GCResult).

A pass over one session's blob prefix, run only as the session's single
writer:

1. the lease fence (:func:`writer_fence`, in a transaction: the lease
   machinery's ``leases.fence``, then the ledger's newest fence is the
   lease's epoch, with the tip locked); refused: ``GCLeaseNotHeldError``;
2. the scan: the ledger's tip, then every pointer record of the ledger, each
   verified against its sha256 and decoded, gives the referenced keys; a
   failed read or an undecodable pointer is ``GCScanError``;
3. the listing of the prefix; a failure is ``GCListError``;
4. the condemn transaction, fenced as step 1 (refused:
   ``GCLeaseNotHeldError``, nothing deleted): the listed blobs of the offload
   shape that no pointer references, less those named by a pointer appended
   since the scan, are marked condemned, for good (``condemn.py``);
5. each condemned blob is deleted (a failure is ``GCDeleteError``).

Each failure deletes nothing past it (steps 1 to 4 fail before any delete).
The lease is not checked again during the deletes, and need not be: a
writer never acknowledges a pointer to a condemned blob (``condemn.py``
gives the argument), so a pass whose lease lapses mid-delete, or that runs
beside appends, deletes only blobs no acknowledged record names.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import BLOB_POINTER_KIND, GCResult
from turnkeeper.spec.records import Lease

from ...backend import Backend, Tx
from .. import leases
from . import condemn, journal
from .blobs import BlobStore, blob_prefix, is_blob_name, parse_pointer
from .replay import ledger_name


def writer_fence(tx: Tx, tenant: str, session_id: str, lease: Lease) -> None:
    """GC's lease check: ``lease`` is held (``leases.fence``) and is the
    epoch of the ledger's newest fence (``journal.check_epoch``).

    Raises:
        LeaseLostError: either fence refused it.
    """
    leases.fence(tx, lease)
    _, ledger_epoch = journal.read_tip(tx, tenant, session_id, lock=True)
    journal.check_epoch(session_id, lease, ledger_epoch)


def _pointers(tx: Tx, tenant: str, session_id: str, after: int) -> list[tuple[Any, Any, Any]]:
    """``(seq, payload, payload_sha256)`` of the ledger's pointer records past ``after``."""
    return [
        (r[0], r[1], r[2])
        for r in tx.rows(
            "SELECT seq, payload, payload_sha256 FROM ledger_records "
            "WHERE tenant = ? AND session_id = ? AND kind = ? AND seq > ? ORDER BY seq",
            [tenant, session_id, BLOB_POINTER_KIND, after],
        )
    ]


def referenced_keys(db: Backend, tenant: str, session_id: str) -> tuple[int, set[str]]:
    """The ledger's tip, then the blob keys named by its pointer records (every
    one up to that tip: the tip is read first).

    Raises:
        GCScanError: the read failed, or a pointer fails its sha256 or does not
            decode (the cause is ``__cause__``).
    """
    name = ledger_name(session_id)

    def scan(tx: Tx) -> tuple[int, list[tuple[Any, Any, Any]]]:
        tip = journal.read_tip(tx, tenant, session_id)[0]
        return tip, _pointers(tx, tenant, session_id, 0)

    try:
        tip, rows = db.read("ledger_gc_scan", scan)
    except errors.DatabaseError as failure:
        raise errors.GCScanError(name) from failure
    return tip, pointer_keys(session_id, rows)


def pointer_keys(session_id: str, rows: list[tuple[Any, Any, Any]]) -> set[str]:
    """The keys of pointer rows ``(seq, payload, payload_sha256)``, each verified.

    Raises:
        GCScanError: a pointer fails its sha256 or does not decode.
    """
    name = ledger_name(session_id)
    keys: set[str] = set()
    for seq, payload, digest in rows:
        body = bytes(payload)
        try:
            if journal.sha256(body) != str(digest):
                raise errors.ReplayDecodeError(
                    session_id, int(seq), detail="its payload does not hash to its stored sha256"
                )
            keys.add(parse_pointer(session_id, int(seq), body)[0])
        except errors.ReplayDecodeError as failure:
            raise errors.GCScanError(name, detail=f"pointer at seq {seq}") from failure
    return keys


def referenced_since(tx: Tx, tenant: str, session_id: str, after: int) -> set[str]:
    """The blob keys named by the pointers appended after sequence ``after``
    (in the condemn transaction: those orphans are not condemned).

    Raises:
        GCScanError: one fails its sha256 or does not decode.
    """
    return pointer_keys(session_id, _pointers(tx, tenant, session_id, after))


def condemn_orphans(
    tx: Tx,
    tenant: str,
    session_id: str,
    lease: Lease,
    scanned_tip: int,
    orphans: list[str],
    gc_id: str,
) -> list[str]:
    """The condemn transaction (step 4): GC's fence, then ``orphans`` less the
    keys of pointers appended after ``scanned_tip``, marked for pass ``gc_id``.
    Returns the keys marked, sorted.

    Raises:
        LeaseLostError: the fence refused the lease (nothing marked).
        GCScanError: a pointer appended since the scan fails its sha256 or
            does not decode (nothing marked).
    """
    writer_fence(tx, tenant, session_id, lease)
    since = referenced_since(tx, tenant, session_id, scanned_tip)
    doomed = sorted(k for k in orphans if k not in since)
    condemn.mark(tx, tenant, session_id, lease.epoch, gc_id, doomed)
    return doomed


def collect(
    db: Backend,
    blobs: BlobStore,
    tenant: str,
    session_id: str,
    lease: Lease,
    fenced: Callable[[Callable[[Tx], Any]], Any],
) -> GCResult:
    """One GC pass (see the module docstring). ``fenced(body)`` runs ``body``
    as a fenced write (a refusal recorded in ``fence_events``) and returns
    its result."""

    def fence(body: Callable[[Tx], Any]) -> Any:
        try:
            return fenced(body)
        except errors.LeaseLostError as lost:
            raise errors.GCLeaseNotHeldError(session_id, lease.epoch) from lost

    fence(lambda tx: writer_fence(tx, tenant, session_id, lease))
    scanned_tip, live = referenced_keys(db, tenant, session_id)
    prefix = blob_prefix(tenant, session_id)
    try:
        listed = blobs.list(prefix)
    except Exception as failure:  # any store failure: fail closed, typed
        raise errors.GCListError(prefix) from failure
    shaped = [k for k in listed if k.startswith(prefix) and is_blob_name(k[len(prefix) :])]
    orphans = sorted(k for k in shaped if k not in live)
    gc_id = uuid.uuid4().hex
    doomed: list[str] = fence(
        lambda tx: condemn_orphans(tx, tenant, session_id, lease, scanned_tip, orphans, gc_id)
    )
    for key in doomed:
        try:
            blobs.delete(key)
        except Exception as failure:  # any store failure: surfaced, typed
            raise errors.GCDeleteError(key) from failure
    return GCResult(
        scanned=len(shaped),
        referenced=len(shaped) - len(doomed),
        deleted=len(doomed),
        deleted_keys=tuple(doomed),
        unreclaimable=len(listed) - len(shaped),
    )
