"""The catalog's update in the append's own transaction: the entries of the
sessions an append (or a group commit's round, or a writer's open) wrote
are read in one statement and written in at most two (the new entries'
insert, the others' update, each under its revision compare-and-set:
:func:`store_metas`), before the COMMIT that holds the records. One commit
per append instead of two (the update used to be a read and a write
transaction of its own after the append's).

An update this cannot make (the entry is malformed, records before the new
ones are missing from it, a record does not fold, the entry's
compare-and-set lost, the session's updates are stuck) is left to the
caller, which runs :meth:`~.catalog.Catalog.after_append` after the COMMIT,
with its catch-up, repair and logging: as before, never failing the append.
The statements here touch only valid text (the entry is JSON encoded and
checked as UTF-8 in Python first), so they fail only as the append's own
statements would, with the database.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnkeeper.spec import errors

from ...backend import STORE_NOW, Tx
from . import catalog_codec
from .catalog import Catalog, NewRecord, fold_new


@dataclass(frozen=True, slots=True)
class CatalogUpdate:
    """One append's records for its session's catalog entry: ``(seq, kind,
    payload)`` of each record it wrote, its logical payload (an offloaded
    one's, not its pointer)."""

    catalog: Catalog
    session_id: str
    records: list[NewRecord]


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


def fold_in(tx: Tx, updates: list[CatalogUpdate]) -> list[bool]:
    """Fold each update into its entry in ``tx`` (sessions distinct); for
    each, whether its entry now holds its records (``True`` also for an
    update with no record). ``False``: the caller updates it after the
    COMMIT (:meth:`~.catalog.Catalog.after_append`)."""
    done = [not u.records for u in updates]
    live = [i for i, u in enumerate(updates) if u.records and not u.catalog.is_stuck(u.session_id)]
    if not live:
        return done
    rows = tx.rows(
        "SELECT tenant, session_id, revision, meta FROM ledger_catalog "
        "WHERE tenant = ANY(?::VARCHAR[]) AND session_id = ANY(?::VARCHAR[])",
        [
            sorted({updates[i].catalog.tenant for i in live}),
            sorted({updates[i].session_id for i in live}),
        ],
    )
    stored = {(str(t), str(s)): (int(rev), str(meta)) for t, s, rev, meta in rows}
    planned: list[tuple[CatalogUpdate, int, str] | None] = [None] * len(updates)
    for i in live:
        u = updates[i]
        revision, text = stored.get((u.catalog.tenant, u.session_id), (0, ""))
        try:
            current = catalog_codec.decode(u.session_id, text) if revision else None
            meta = fold_new(u.session_id, current, u.records, u.catalog.options.clock())
            planned[i] = (u, revision, catalog_codec.encode(meta))
        except errors.TurnkeeperError:
            continue  # malformed, out of order, not folding: after the COMMIT
    if any(p is not None for p in planned):
        written = store_metas(tx, planned)
        for i, p in enumerate(planned):
            if p is not None:
                done[i] = (p[0].catalog.tenant, p[0].session_id) in written
    return done
