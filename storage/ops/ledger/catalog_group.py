"""The catalog's best-effort updates after appends, folded per group: the
updates that queue up together (one per session of a group commit, as each
writer's caller hands its records over) are read in one statement and
written in one transaction of two statements, each entry under its revision
compare-and-set (:func:`store_metas`, :func:`~.catalog.store_meta` for a
set), instead of a read and a write transaction
per append. An update the group cannot make (its entry moved, is malformed
or missing records, a record does not fold, the group's transaction
failed) runs alone as :meth:`~.catalog.Catalog.after_append`, with its
retries, its repair and its logging: as before, never raised to the append.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turnkeeper.spec import errors

from ...backend import STORE_NOW, Backend, Tx
from . import catalog_codec
from .catalog import Catalog, NewRecord, fold_new
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
    if not records or catalog.is_stuck(session_id):
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


def store_metas(
    tx: Tx, planned: list[tuple[CatalogUpdate, int, str] | None]
) -> set[tuple[str, str]]:
    """:func:`~.catalog.store_meta` for every planned ``(update, revision,
    text)`` in two statements (the new entries' insert, the others' update,
    each under its revision compare-and-set); the (tenant, session) keys
    written. A key not returned lost its compare-and-set."""
    fresh = [p for p in planned if p is not None and p[1] == 0]
    moved = [p for p in planned if p is not None and p[1] != 0]
    won: set[tuple[str, str]] = set()
    if fresh:
        won |= {
            (str(r[0]), str(r[1]))
            for r in tx.rows(
                "INSERT INTO ledger_catalog SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
                f"1, unnest(?::VARCHAR[]), {STORE_NOW} "
                "ON CONFLICT (tenant, session_id) DO NOTHING RETURNING tenant, session_id",
                [
                    [p[0].catalog.tenant for p in fresh],
                    [p[0].session_id for p in fresh],
                    [p[2] for p in fresh],
                    tx.now,
                ],
            )
        }
    if moved:
        won |= {
            (str(r[0]), str(r[1]))
            for r in tx.rows(
                "UPDATE ledger_catalog SET revision = revision + 1, meta = v.meta, "
                f"updated_at = {STORE_NOW} FROM (SELECT unnest(?::VARCHAR[]) AS t, "
                "unnest(?::VARCHAR[]) AS s, unnest(?::BIGINT[]) AS rev, "
                "unnest(?::VARCHAR[]) AS meta) AS v WHERE ledger_catalog.tenant = v.t "
                "AND ledger_catalog.session_id = v.s AND ledger_catalog.revision = v.rev "
                "RETURNING ledger_catalog.tenant, ledger_catalog.session_id",
                [
                    tx.now,
                    [p[0].catalog.tenant for p in moved],
                    [p[0].session_id for p in moved],
                    [p[1] for p in moved],
                    [p[2] for p in moved],
                ],
            )
        }
    return won


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
        try:
            written = db.write("ledger_catalog_write_group", lambda tx: store_metas(tx, planned))
        except errors.DatabaseError:
            written = set()
        won = [p is not None and (p[0].catalog.tenant, p[0].session_id) in written for p in planned]
    for u, done in zip(group, won, strict=True):
        if not done:
            _alone(u)
    return [None] * len(group)
