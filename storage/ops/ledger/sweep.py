"""Reclaiming the blobs of deleted sessions (``Ledger.sweep_deleted``).

A session delete removes the session's ledger and its blobs in the store's
own table (``ledger_blobs``) in its transaction, but an object store
(:class:`~.blob_files.FsspecBlobs`) cannot join that transaction: its blobs
outlive the delete. Once the session is deleted every blob under its prefix
is an orphan (no ledger is left to point at it), so the sweep deletes them.

Safety without a lease (a deleted session has none): a session counts as
deleted only when the database holds its ``deleted_sessions`` row (a
tombstone, permanent: a deleted id is never reused) and no ledger record or
tip of it for the tenant (:func:`deleted_sessions`, the sweep's guard). A
live session's blobs are never touched, and neither is a key of another
shape under a deleted prefix (counted ``unreclaimable``). A writer that
offloaded a blob just before the delete and then failed its append leaves
one more orphan, which the next sweep reclaims.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import GCResult

from ...backend import Backend, Tx
from .blobs import BlobStore, blob_call, blob_prefix, is_blob_name, split_key
from .gc import reclaim_temps

_CHUNK = 500


def sessions_root(tenant: str) -> str:
    """The key prefix holding every session prefix of ``tenant``
    (``blobs/t=<tenant>/``, see :func:`~.blobs.blob_prefix`)."""
    return blob_prefix(tenant, "")[: -len("s=/")]


def _rows(sql: str, params: list[str], tx: Tx) -> list[Any]:
    return list(tx.rows(sql, params))


def deleted_sessions(db: Backend, tenant: str, session_ids: Iterable[str]) -> set[str]:
    """Those of ``session_ids`` that are deleted: a ``deleted_sessions`` row,
    and no ledger record or tip for ``tenant`` (the sweep's guard).

    Raises:
        DatabaseError: the read failed.
    """
    ids = sorted(set(session_ids))
    found: set[str] = set()
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        sql = (
            f"SELECT d.session_id FROM deleted_sessions d WHERE d.session_id IN ({marks}) "
            "AND NOT EXISTS (SELECT 1 FROM ledger_records r "
            "WHERE r.tenant = ? AND r.session_id = d.session_id) "
            "AND NOT EXISTS (SELECT 1 FROM ledger_tips t "
            "WHERE t.tenant = ? AND t.session_id = d.session_id)"
        )
        params = [*chunk, tenant, tenant]
        rows = db.read("ledger_sweep_deleted", partial(_rows, sql, params))
        found.update(str(r[0]) for r in rows)
    return found


def sweep(
    db: Backend,
    blobs: BlobStore,
    tenant: str,
    session_ids: Iterable[str] | None,
    temp_grace_s: float,
) -> GCResult:
    """Delete the blobs of ``tenant``'s deleted sessions among ``session_ids``
    (``None``: every session with a blob prefix under :func:`sessions_root`).
    A key counts for the session whose :func:`~.blobs.blob_prefix` it is
    under, decoded exactly (:func:`~.blobs.split_key`): never for another
    session or tenant, nor for a key written before schema 24 (those are
    left, see docs/ledger-status.md).
    ``scanned`` counts the blobs of the offload shape under deleted sessions'
    prefixes, all of them ``deleted`` (``referenced`` is 0);
    ``temps_deleted`` the puts' temporary files there older than
    ``temp_grace_s`` seconds, deleted (``gc.reclaim_temps``);
    ``unreclaimable`` the other keys there, left alone.

    Raises:
        GCListError: a listing failed (nothing is deleted), or the ages of
            the temporary files could not be read.
        GCDeleteError: a delete failed (the blobs before it in key order are deleted).
        DatabaseError: the deleted sessions could not be read; nothing is deleted.
    """
    root = sessions_root(tenant)
    prefixes = (
        [root]
        if session_ids is None
        else [blob_prefix(tenant, s) for s in sorted(set(session_ids))]
    )
    by_session: dict[str, dict[str, str]] = {}  # session id: {key: its rest}
    for prefix in prefixes:
        try:
            listed = blob_call(blobs, "list", prefix)
        except Exception as failure:  # any store failure: fail closed, typed
            raise errors.GCListError(prefix) from failure
        for key in listed:
            found = split_key(key)  # the pair blob_prefix made the key of, exactly
            if found is not None and found[0] == tenant:
                by_session.setdefault(found[1], {})[key] = found[2]
    gone = deleted_sessions(db, tenant, by_session)
    keys = sorted(k for s in gone for k in by_session[s])
    shaped = [k for s in sorted(gone) for k, rest in by_session[s].items() if is_blob_name(rest)]
    shaped.sort()
    for key in shaped:
        try:
            blob_call(blobs, "delete", key)
        except Exception as failure:  # any store failure: surfaced, typed
            raise errors.GCDeleteError(key) from failure
    temps: list[str] = []
    for s in sorted(gone):
        temps += reclaim_temps(blobs, blob_prefix(tenant, s), sorted(by_session[s]), temp_grace_s)
    temps.sort()
    return GCResult(
        scanned=len(shaped),
        referenced=0,
        deleted=len(shaped),
        deleted_keys=tuple(shaped),
        unreclaimable=len(keys) - len(shaped) - len(temps),
        temps_deleted=len(temps),
        temps_deleted_keys=tuple(temps),
    )
