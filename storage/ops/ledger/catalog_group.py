"""The catalog's update in the append's own transaction: the entries of the
sessions an append (or a group commit's round, or a writer's open) wrote
are read in one statement and written in at most two (the new entries'
insert, the others' update, each under its revision compare-and-set:
:func:`store_metas`), before the COMMIT that holds the records. One commit
per append instead of two (the update used to be a read and a write
transaction of its own after the append's). An append of records the
catalog does not fold (a note, a fence) moves only the entry's cursor
column, one statement that neither reads nor writes the entry itself
(:func:`move_cursors`): before, it decoded, folded and re-encoded the whole
entry, whose size grows with the session's loops and hustle buckets (attack
round 2 on issue 19, F4: 7 ms -> 305 ms a note at a 4.3 MB entry).

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
from itertools import pairwise

from turnkeeper.spec import errors
from turnkeeper.spec.catalog import CATALOG_KINDS

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


Planned = tuple[CatalogUpdate, int, str, int]
"""A whole-entry write: the update, the revision read (0: no entry), the
entry's text and its cursor (``last_journal_seq``)."""


def store_metas(tx: Tx, planned: list[Planned | None]) -> set[tuple[str, str]]:
    """:func:`~.catalog.store_meta` for every planned ``(update, revision,
    text, cursor)`` in two statements (the new entries' insert, the others' update,
    each under its revision compare-and-set); the (tenant, session) keys
    written. A key not returned lost its compare-and-set."""
    fresh = [p for p in planned if p is not None and p[1] == 0]
    moved = [p for p in planned if p is not None and p[1] != 0]
    won: set[tuple[str, str]] = set()
    if fresh:
        won |= {
            (str(r[0]), str(r[1]))
            for r in tx.rows(
                "INSERT INTO ledger_catalog (tenant, session_id, revision, meta, updated_at, "
                "folded_seq) SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
                f"1, unnest(?::VARCHAR[]), {STORE_NOW}, unnest(?::BIGINT[]) "
                "ON CONFLICT (tenant, session_id) DO NOTHING RETURNING tenant, session_id",
                [
                    [p[0].catalog.tenant for p in fresh],
                    [p[0].session_id for p in fresh],
                    [p[2] for p in fresh],
                    tx.now,
                    [p[3] for p in fresh],
                ],
            )
        }
    if moved:
        won |= {
            (str(r[0]), str(r[1]))
            for r in tx.rows(
                "UPDATE ledger_catalog SET revision = revision + 1, meta = v.meta, "
                f"folded_seq = v.folded, updated_at = {STORE_NOW} FROM (SELECT "
                "unnest(?::VARCHAR[]) AS t, unnest(?::VARCHAR[]) AS s, "
                "unnest(?::BIGINT[]) AS rev, unnest(?::VARCHAR[]) AS meta, "
                "unnest(?::BIGINT[]) AS folded) AS v WHERE ledger_catalog.tenant = v.t "
                "AND ledger_catalog.session_id = v.s AND ledger_catalog.revision = v.rev "
                "RETURNING ledger_catalog.tenant, ledger_catalog.session_id",
                [
                    tx.now,
                    [p[0].catalog.tenant for p in moved],
                    [p[0].session_id for p in moved],
                    [p[1] for p in moved],
                    [p[2] for p in moved],
                    [p[3] for p in moved],
                ],
            )
        }
    return won


def cursor_only(update: CatalogUpdate) -> bool:
    """Whether ``update`` only moves its entry's cursor: records all of kinds
    the catalog does not fold (a note, a fence, a caller's own kind), in
    increasing sequence, the first after seq 1 (an entry stored before its
    ``folded_seq`` column existed holds 0 there: a move from 0 is left to
    the whole-entry update, which reads the JSON's cursor)."""
    seqs = [seq for seq, _, _ in update.records]
    return (
        bool(seqs)
        and seqs[0] > 1
        and all(a < b for a, b in pairwise(seqs))
        and not any(kind in CATALOG_KINDS for _, kind, _ in update.records)
    )


def move_cursors(tx: Tx, moves: list[CatalogUpdate]) -> set[tuple[str, str]]:
    """Move each entry's cursor (its ``folded_seq`` column) to its update's
    last seq, in one statement that neither reads nor writes the entry's
    ``meta``, if the cursor is still just before the update's first record
    (the cursor compare-and-set: what :func:`~.catalog.fold_new` requires of
    records it only skips, else ``CatalogOrderingError``), and move the
    revision on (a whole-entry writer that read the entry before loses its
    revision compare-and-set and reads again); the (tenant, session) keys
    moved. A key not returned has no entry, or its cursor is elsewhere:
    the whole-entry update decides (an insert, or the ordering error and
    the catch-up after the COMMIT)."""
    return {
        (str(r[0]), str(r[1]))
        for r in tx.rows(
            "UPDATE ledger_catalog SET revision = revision + 1, folded_seq = v.hi, "
            f"updated_at = {STORE_NOW} FROM (SELECT unnest(?::VARCHAR[]) AS t, "
            "unnest(?::VARCHAR[]) AS s, unnest(?::BIGINT[]) AS lo, "
            "unnest(?::BIGINT[]) AS hi) AS v WHERE ledger_catalog.tenant = v.t "
            "AND ledger_catalog.session_id = v.s AND ledger_catalog.folded_seq = v.lo - 1 "
            "RETURNING ledger_catalog.tenant, ledger_catalog.session_id",
            [
                tx.now,
                [u.catalog.tenant for u in moves],
                [u.session_id for u in moves],
                [u.records[0][0] for u in moves],
                [u.records[-1][0] for u in moves],
            ],
        )
    }


def fold_in(tx: Tx, updates: list[CatalogUpdate]) -> list[bool]:
    """Fold each update into its entry in ``tx`` (sessions distinct); for
    each, whether its entry now holds its records (``True`` also for an
    update with no record). ``False``: the caller updates it after the
    COMMIT (:meth:`~.catalog.Catalog.after_append`).

    An update that only moves the cursor (:func:`cursor_only`) moves the
    cursor column alone (:func:`move_cursors`): its cost does not grow with
    the entry. One that cannot (no entry yet, the cursor elsewhere) and every
    other update read, fold and write the whole entry."""
    done = [not u.records for u in updates]
    live = [i for i, u in enumerate(updates) if u.records and not u.catalog.is_stuck(u.session_id)]
    moving = [i for i in live if cursor_only(updates[i])]
    if moving:
        moved = move_cursors(tx, [updates[i] for i in moving])
        for i in moving:
            done[i] = (updates[i].catalog.tenant, updates[i].session_id) in moved
        live = [i for i in live if not done[i]]
    if not live:
        return done
    rows = tx.rows(
        "SELECT tenant, session_id, revision, meta, folded_seq FROM ledger_catalog "
        "WHERE tenant = ANY(?::VARCHAR[]) AND session_id = ANY(?::VARCHAR[])",
        [
            sorted({updates[i].catalog.tenant for i in live}),
            sorted({updates[i].session_id for i in live}),
        ],
    )
    stored = {
        (str(t), str(s)): (int(rev), str(meta), int(folded)) for t, s, rev, meta, folded in rows
    }
    planned: list[Planned | None] = [None] * len(updates)
    for i in live:
        u = updates[i]
        revision, text, folded = stored.get((u.catalog.tenant, u.session_id), (0, "", 0))
        try:
            current = catalog_codec.decode(u.session_id, text, folded) if revision else None
            meta = fold_new(u.session_id, current, u.records, u.catalog.options.clock())
            planned[i] = (u, revision, catalog_codec.encode(meta), meta.last_journal_seq)
        except errors.TurnkeeperError:
            continue  # malformed, out of order, not folding: after the COMMIT
    if any(p is not None for p in planned):
        written = store_metas(tx, planned)
        for i, p in enumerate(planned):
            if p is not None:
                done[i] = (p[0].catalog.tenant, p[0].session_id) in written
    return done
