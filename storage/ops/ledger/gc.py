"""Ledger blob GC (sessionstore ObjectGC, OpenObjectGC, GCResult).

A pass over one session's blob prefix, run only as the session's single
writer:

1. the lease fence (:func:`writer_fence`, in a transaction: the lease
   machinery's ``leases.fence``, then the ledger's newest fence is the
   lease's epoch, with the tip locked); refused: ``GCLeaseNotHeldError``;
2. the scan: every record of the ledger, verified as replay verifies it
   (payload sha256, record digest, sequence, fences), and each pointer
   record's checked fields give the referenced keys; a failed read, a
   record that does not verify or an undecodable pointer is ``GCScanError``;
3. the listing of the prefix; a failure is ``GCListError``;
4. the lease fence again, then each listed blob of the offload shape that no
   pointer references is deleted; a failure is ``GCDeleteError``.

Each failure deletes nothing past it (steps 1 to 3 fail before any delete).
GC must not run concurrently with appends of the same session (a blob whose
pointer append is in flight looks unreferenced): the caller serializes it
with its writer, as the seed says.
"""

from __future__ import annotations

from collections.abc import Callable

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import BLOB_POINTER_KIND, GCResult
from turnkeeper.spec.records import Lease

from ...backend import Backend, Tx
from .. import leases
from . import journal
from .blobs import BlobStore, blob_prefix, is_blob_name, parse_pointer
from .replay import PAGE_ROWS, ledger_name, verified_rows


def writer_fence(tx: Tx, tenant: str, session_id: str, lease: Lease) -> None:
    """GC's lease check: ``lease`` is held (``leases.fence``) and is the
    epoch of the ledger's newest fence (``journal.check_epoch``).

    Raises:
        LeaseLostError: either fence refused it.
    """
    leases.fence(tx, lease)
    _, ledger_epoch = journal.read_tip(tx, tenant, session_id, lock=True)
    journal.check_epoch(session_id, lease, ledger_epoch)


def referenced_keys(db: Backend, tenant: str, session_id: str) -> set[str]:
    """The blob keys named by the ledger's pointer records: a scan of the
    whole ledger, each record verified as replay verifies it
    (``replay.verified_rows``: its payload sha256, its record digest, the
    sequence and the fences; a pointer relabelled as another kind no longer
    matches its digest), each pointer decoded and checked
    (``blobs.parse_pointer``). Memory: one replay page.

    Raises:
        GCScanError: a read failed, a record does not verify, or a pointer
            does not decode (the replay error is ``__cause__``).
    """
    name = ledger_name(session_id)
    keys: set[str] = set()
    try:
        for row in verified_rows(db, tenant, session_id, 1, PAGE_ROWS, lambda: None):
            if str(row[1]) == BLOB_POINTER_KIND:
                keys.add(parse_pointer(tenant, session_id, int(row[0]), bytes(row[3]))[0])
    except (errors.ReplayReadError, errors.ReplayDecodeError, errors.EmptySessionError) as failure:
        seq = getattr(failure, "seq", None)
        raise errors.GCScanError(name, detail=f"record {seq}" if seq else None) from failure
    return keys


def collect(
    db: Backend,
    blobs: BlobStore,
    tenant: str,
    session_id: str,
    lease: Lease,
    fenced: Callable[[Callable[[Tx], None]], None],
) -> GCResult:
    """One GC pass (see the module docstring). ``fenced(body)`` runs ``body``
    as a fenced write (a refusal recorded in ``fence_events``)."""

    def fence() -> None:
        try:
            fenced(lambda tx: writer_fence(tx, tenant, session_id, lease))
        except errors.LeaseLostError as lost:
            raise errors.GCLeaseNotHeldError(session_id, lease.epoch) from lost

    fence()
    live = referenced_keys(db, tenant, session_id)
    prefix = blob_prefix(tenant, session_id)
    try:
        listed = blobs.list(prefix)
    except Exception as failure:  # any store failure: fail closed, typed
        raise errors.GCListError(prefix) from failure
    shaped = [k for k in listed if k.startswith(prefix) and is_blob_name(k[len(prefix) :])]
    # keys of blob_prefix's shape: no other pair's blob is under this prefix
    orphans = sorted(k for k in shaped if k not in live)
    fence()
    for key in orphans:
        try:
            blobs.delete(key)
        except Exception as failure:  # any store failure: surfaced, typed
            raise errors.GCDeleteError(key) from failure
    return GCResult(
        scanned=len(shaped),
        referenced=len(shaped) - len(orphans),
        deleted=len(orphans),
        deleted_keys=tuple(orphans),
        unreclaimable=len(listed) - len(shaped),
    )
