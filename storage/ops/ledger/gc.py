"""Ledger blob GC (sessionstore ObjectGC, OpenObjectGC, GCResult).

A pass over one session's blob prefix, run only as the session's single
writer:

1. the lease fence (:func:`writer_fence`, in a transaction: the lease
   machinery's ``leases.fence``, then the ledger's newest fence is the
   lease's epoch, with the tip locked); refused: ``GCLeaseNotHeldError``;
2. the scan: every record of the ledger up to its tip, verified as replay
   verifies it (payload sha256, record digest, sequence, fences), and each
   pointer record's checked fields give the referenced keys; a failed read,
   a record that does not verify or an undecodable pointer is ``GCScanError``;
3. the listing of the prefix; a failure is ``GCListError``;
4. the condemn transaction, fenced as step 1 (refused:
   ``GCLeaseNotHeldError``, nothing deleted): the listed blobs of the offload
   shape that no pointer references, less those named by a pointer appended
   since the scan, are marked condemned, for good (``condemn.py``);
5. each condemned blob is deleted (a failure is ``GCDeleteError``);
6. the temporary files of puts that can no longer finish (older than the
   temp grace, :data:`~.blobs.DEFAULT_TEMP_GRACE_S` by default: a put
   killed mid-write, attack finding F7) are deleted (:func:`reclaim_temps`).

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
from . import condemn, journal, records, sealing
from .blobs import (
    BlobStore,
    TempFiles,
    blob_call,
    blob_prefix,
    is_blob_name,
    is_temp_name,
    parse_pointer,
)
from .replay import PAGE_ROWS, RECORD_COLUMNS, ledger_name, verified_rows


def writer_fence(tx: Tx, tenant: str, session_id: str, lease: Lease) -> None:
    """GC's lease check: ``lease`` is held (``leases.fence``) and is the
    epoch of the ledger's newest fence (``journal.check_epoch``).

    Raises:
        LeaseLostError: either fence refused it.
    """
    leases.fence(tx, lease)
    _, ledger_epoch = journal.read_tip(tx, tenant, session_id, lock=True)
    journal.check_epoch(session_id, lease, ledger_epoch)


def _pointers(tx: Tx, tenant: str, session_id: str, after: int) -> list[tuple[Any, ...]]:
    """The rows (as ``replay.verified_rows`` reads them, payloads opened) of
    the ledger's pointer records past ``after``."""
    rows = tx.rows(
        f"SELECT {RECORD_COLUMNS} FROM ledger_records "
        "WHERE tenant = ? AND session_id = ? AND kind = ? AND seq > ? ORDER BY seq",
        [tenant, session_id, BLOB_POINTER_KIND, after],
    )
    return sealing.open_rows(tx, session_id, rows)


def referenced_keys(db: Backend, tenant: str, session_id: str) -> tuple[int, set[str]]:
    """The ledger's tip when the scan began, and the blob keys named by its
    pointer records up to it: a scan of the whole ledger, each record
    verified as replay verifies it (``replay.verified_rows``: its payload
    sha256, its record digest, the sequence and the fences; a pointer
    relabelled as another kind no longer matches its digest), each pointer
    decoded and checked (``blobs.parse_pointer``). Memory: one replay page.

    Raises:
        GCScanError: a read failed, a record does not verify, or a pointer
            does not decode (the replay error is ``__cause__``).
    """
    name = ledger_name(session_id)
    keys: set[str] = set()
    tip = 0
    try:
        for row in verified_rows(db, tenant, session_id, 1, PAGE_ROWS, lambda: None):
            tip = int(row[0])  # the last row is the tip read when the scan began
            if str(row[1]) == BLOB_POINTER_KIND:
                keys.add(parse_pointer(tenant, session_id, tip, bytes(row[3]))[0])
    except (
        errors.ReplayReadError,
        errors.ReplayDecodeError,
        errors.EmptySessionError,
        errors.PayloadAuthenticationError,
    ) as failure:
        seq = getattr(failure, "seq", None)
        raise errors.GCScanError(name, detail=f"record {seq}" if seq else None) from failure
    return tip, keys


def referenced_since(tx: Tx, tenant: str, session_id: str, after: int) -> set[str]:
    """The blob keys named by the pointers appended after sequence ``after``
    (in the condemn transaction: those orphans are not condemned), each
    record verified (``records.check_record``) and decoded.

    Raises:
        GCScanError: one does not verify or does not decode.
    """
    keys: set[str] = set()
    try:
        for row in _pointers(tx, tenant, session_id, after):
            records.check_record(tenant, session_id, row)
            keys.add(parse_pointer(tenant, session_id, int(row[0]), bytes(row[3]))[0])
    except errors.ReplayDecodeError as failure:
        raise errors.GCScanError(
            ledger_name(session_id), detail=f"record {failure.seq}"
        ) from failure
    except errors.PayloadAuthenticationError as failure:
        raise errors.GCScanError(
            ledger_name(session_id), detail=f"record {failure.record_id}"
        ) from failure
    return keys


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


def stale_temps(blobs: BlobStore, keys: list[str], grace_s: float) -> list[str]:
    """Those of ``keys`` (temporary files of puts) older than ``grace_s``
    seconds by the store's own clock (:class:`~.blobs.TempFiles`), sorted:
    puts that can no longer finish. A store without temporary files has none.

    Raises:
        Exception: the store's failure to tell their ages.
    """
    if not keys or not isinstance(blobs, TempFiles):
        return []
    ages = blob_call(blobs, "temp_ages", keys)
    return sorted(k for k, age in ages.items() if temp_stale(age, grace_s))


def temp_stale(age_s: float, grace_s: float) -> bool:
    """A temporary file ``age_s`` seconds old is a put that can no longer
    finish: older than the grace (a put in progress keeps its file)."""
    return age_s > grace_s


def reclaim_temps(blobs: BlobStore, prefix: str, listed: list[str], grace_s: float) -> list[str]:
    """Delete the temporary files among ``listed`` (keys under ``prefix``:
    ``<sha256 hex>.tmp-<32 hex>``, :func:`~.blobs.is_temp_name`) older than
    ``grace_s`` seconds (:func:`stale_temps`); returns their keys, sorted.
    A temporary file is never a blob a pointer names: no condemn is needed
    (a put that did finish renamed it away; one still writing past the grace
    fails its rename and its append is never made).

    Raises:
        GCListError: their ages could not be read (the store's error is
            ``__cause__``); nothing is deleted.
        GCDeleteError: a delete failed (those before it are deleted).
    """
    temps = [k for k in listed if k.startswith(prefix) and is_temp_name(k[len(prefix) :])]
    try:
        stale = stale_temps(blobs, temps, grace_s)
    except Exception as failure:  # any store failure: fail closed, typed
        raise errors.GCListError(prefix) from failure
    for key in stale:
        try:
            blob_call(blobs, "delete", key)
        except Exception as failure:  # any store failure: surfaced, typed
            raise errors.GCDeleteError(key) from failure
    return stale


def collect(
    db: Backend,
    blobs: BlobStore,
    tenant: str,
    session_id: str,
    lease: Lease,
    fenced: Callable[[Callable[[Tx], Any]], Any],
    temp_grace_s: float,
) -> GCResult:
    """One GC pass (see the module docstring). ``fenced(body)`` runs ``body``
    as a fenced write (a refusal recorded in ``fence_events``) and returns
    its result. The orphans deleted, the puts' temporary files older than
    ``temp_grace_s`` seconds are reclaimed (:func:`reclaim_temps`)."""

    def fence(body: Callable[[Tx], Any]) -> Any:
        try:
            return fenced(body)
        except errors.LeaseLostError as lost:
            raise errors.GCLeaseNotHeldError(session_id, lease.epoch) from lost

    fence(lambda tx: writer_fence(tx, tenant, session_id, lease))
    scanned_tip, live = referenced_keys(db, tenant, session_id)
    prefix = blob_prefix(tenant, session_id)
    try:
        listed = blob_call(blobs, "list", prefix)
    except Exception as failure:  # any store failure: fail closed, typed
        raise errors.GCListError(prefix) from failure
    shaped = [k for k in listed if k.startswith(prefix) and is_blob_name(k[len(prefix) :])]
    # keys of blob_prefix's shape: no other pair's blob is under this prefix
    orphans = sorted(k for k in shaped if k not in live)
    gc_id = uuid.uuid4().hex
    doomed: list[str] = fence(
        lambda tx: condemn_orphans(tx, tenant, session_id, lease, scanned_tip, orphans, gc_id)
    )
    for key in doomed:
        try:
            blob_call(blobs, "delete", key)
        except Exception as failure:  # any store failure: surfaced, typed
            raise errors.GCDeleteError(key) from failure
    temps = reclaim_temps(blobs, prefix, listed, temp_grace_s)
    return GCResult(
        scanned=len(shaped),
        referenced=len(shaped) - len(doomed),
        deleted=len(doomed),
        deleted_keys=tuple(doomed),
        unreclaimable=len(listed) - len(shaped) - len(temps),
        temps_deleted=len(temps),
        temps_deleted_keys=tuple(temps),
    )
