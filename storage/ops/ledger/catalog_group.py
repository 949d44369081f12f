"""The catalog's best-effort updates after appends, folded per group: the
updates that queue up together (one per session of a group commit, as each
writer's caller hands its records over) are read in one statement and
written in one transaction, one compare-and-set per session
(:func:`~.catalog.store_meta`), instead of a read and a write transaction
per append. An update the group cannot make (its entry moved, is malformed
or missing records, a record does not fold, the group's transaction
failed) runs alone as :meth:`~.catalog.Catalog.after_append`, with its
retries, its repair and its logging: as before, never raised to the append.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turnkeeper.spec import errors

from ...backend import Backend, Tx
from . import catalog_codec
from .catalog import Catalog, NewRecord, fold_new, store_meta
from .group import batcher


@dataclass(frozen=True, slots=True)
class CatalogUpdate:
    """One append's records for its session's catalog entry."""

    catalog: Catalog
    session_id: str
    records: list[NewRecord]


def after_append(catalog: Catalog, session_id: str, records: list[NewRecord]) -> None:
    """Fold ``records`` (just appended to ``session_id``'s ledger) into its
    entry, grouped with the updates queued beside it; never raises (a failure
    goes to the catalog's ``on_update_failed``)."""
    if not records:
        return
    update = CatalogUpdate(catalog, session_id, records)
    try:
        batcher(catalog.db, "catalog").submit(
            update, lambda group: write_group(catalog.db, group), _alone
        )
    except Exception as failure:  # after_append logs its own; this is the group's
        catalog.options.on_update_failed(failure)


def _alone(update: CatalogUpdate) -> None:
    update.catalog.after_append(update.session_id, update.records)


def write_group(db: Backend, group: list[CatalogUpdate]) -> list[Any]:
    """Fold every update of ``group`` in one read and one write transaction;
    each one the group could not make runs alone (:func:`_alone`). One
    outcome (``None``) per update."""
    keys = sorted({(u.catalog.tenant, u.session_id) for u in group})
    try:
        rows = db.read(
            "ledger_catalog_read_group",
            lambda tx: tx.rows(
                "SELECT tenant, session_id, revision, meta FROM ledger_catalog "
                "WHERE tenant = ANY(?::VARCHAR[]) AND session_id = ANY(?::VARCHAR[])",
                [sorted({k[0] for k in keys}), sorted({k[1] for k in keys})],
            ),
        )
    except errors.DatabaseError:
        rows = None
    planned: list[tuple[CatalogUpdate, int, str] | None] = [None] * len(group)
    if rows is not None:
        stored = {(str(t), str(s)): (int(rev), str(meta)) for t, s, rev, meta in rows}
        seen: set[tuple[str, str]] = set()
        for i, u in enumerate(group):
            key = (u.catalog.tenant, u.session_id)
            if key in seen:
                continue  # a second update of one entry: alone, after the group's
            seen.add(key)
            revision, text = stored.get(key, (0, ""))
            try:
                current = catalog_codec.decode(u.session_id, text) if revision else None
                meta = fold_new(u.session_id, current, u.records, u.catalog.options.clock())
                planned[i] = (u, revision, catalog_codec.encode(meta))
            except Exception:
                continue  # malformed, out of order, not folding: alone (repair, logging)
    won = [False] * len(group)
    if any(p is not None for p in planned):

        def body(tx: Tx) -> list[bool]:
            return [
                p is not None
                and store_meta(tx, p[0].catalog.tenant, p[0].session_id, p[1], p[2], tx.now)
                for p in planned
            ]

        try:
            won = db.write("ledger_catalog_write_group", body)
        except errors.DatabaseError:
            won = [False] * len(group)
    for u, done in zip(group, won, strict=True):
        if not done:
            _alone(u)
    return [None] * len(group)
