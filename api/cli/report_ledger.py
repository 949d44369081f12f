"""The ledger for ``turnkeeper report`` (JSON key ``ledger``): record counts,
ledger bytes, blobs and orphan blobs, in total and per session.

Each figure is one query through ``store.query``. Ledger bytes are the
stored payloads' bytes (``octet_length``: a pointer record counts its own
few bytes, its blob is counted under blobs); blobs are the database's blob
table (``ledger_blobs``, the default store; blobs kept in an fsspec
directory or object store are not in the database and not counted), with
their bytes (the envelope's size). All tenants are counted together.

GC results are not recorded anywhere (``store.ledger.gc`` returns its
:class:`~turnkeeper.spec.ledger.GCResult` to the caller only), so the report
shows what GC would reclaim instead: the **orphan** blobs, blobs of the
table that no pointer record of their session names (a blob written whose
pointer append then failed), counted and summed by a query.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from turnkeeper.storage import BaseStore

from .common import fmt_num
from .report_runs import table

SESSIONS_SHOWN = 20
"""Most sessions the table prints (the largest: ledger bytes plus blob bytes); JSON has all."""

_NAMED = "r.blob_key = b.key"
"""Whether pointer record ``r`` names blob ``b``: its clear ``blob_key``
column (schema 35; a sealed session's pointer payload is ciphertext, never
searched), the whole key (a key written before schema 24,
``sessions/a/<digest>``, is the tail of another, ``x/sessions/a/<digest>``)."""

_ORPHANS = (
    "SELECT b.session_id, b.size FROM ledger_blobs b WHERE NOT EXISTS ("
    "SELECT 1 FROM ledger_records r WHERE r.tenant = b.tenant AND r.session_id = b.session_id "
    "AND r.kind = 'blobptr' AND {named})"
)

_BY_SESSION = (
    "WITH r AS (SELECT session_id, count(*) AS records, "
    "coalesce(sum(octet_length(payload)), 0)::BIGINT AS ledger_bytes, "
    "sum(CASE WHEN kind = 'blobptr' THEN 1 ELSE 0 END)::BIGINT AS pointers "
    "FROM ledger_records GROUP BY session_id), "
    "b AS (SELECT session_id, count(*) AS blobs, coalesce(sum(size), 0)::BIGINT AS blob_bytes "
    "FROM ledger_blobs GROUP BY session_id), "
    "o AS (SELECT session_id, count(*) AS orphan_blobs, "
    "coalesce(sum(size), 0)::BIGINT AS orphan_bytes FROM ({orphans}) x GROUP BY session_id), "
    "ids AS (SELECT session_id FROM r UNION SELECT session_id FROM b) "
    "SELECT ids.session_id, coalesce(r.records, 0)::BIGINT AS records, "
    "coalesce(r.ledger_bytes, 0)::BIGINT AS ledger_bytes, "
    "coalesce(r.pointers, 0)::BIGINT AS pointers, coalesce(b.blobs, 0)::BIGINT AS blobs, "
    "coalesce(b.blob_bytes, 0)::BIGINT AS blob_bytes, "
    "coalesce(o.orphan_blobs, 0)::BIGINT AS orphan_blobs, "
    "coalesce(o.orphan_bytes, 0)::BIGINT AS orphan_bytes "
    "FROM ids LEFT JOIN r ON r.session_id = ids.session_id "
    "LEFT JOIN b ON b.session_id = ids.session_id "
    "LEFT JOIN o ON o.session_id = ids.session_id "
    "ORDER BY ledger_bytes + blob_bytes DESC, ids.session_id"
)

_TOTAL = (
    "SELECT (SELECT count(*) FROM ledger_tips) AS ledgers, "
    "(SELECT count(*) FROM ledger_records) AS records, "
    "(SELECT coalesce(sum(octet_length(payload)), 0)::BIGINT FROM ledger_records) "
    "AS ledger_bytes, "
    "(SELECT count(*) FROM ledger_records WHERE kind = 'blobptr') AS pointers, "
    "(SELECT count(*) FROM ledger_blobs) AS blobs, "
    "(SELECT coalesce(sum(size), 0)::BIGINT FROM ledger_blobs) AS blob_bytes, "
    "(SELECT count(*) FROM ({orphans}) x) AS orphan_blobs, "
    "(SELECT coalesce(sum(size), 0)::BIGINT FROM ({orphans}) x) AS orphan_bytes, "
    "(SELECT count(*) FROM ledger_catalog) AS catalog_entries"
)

GC_NOTE = (
    "GC results are not recorded; orphan blobs are the database's blobs that no pointer "
    "record names (what ledger gc would delete)"
)


def ledger_sql(store: BaseStore) -> dict[str, str]:
    """The ledger figures' queries in ``store``'s dialect: ``total``, ``by_session``."""
    orphans = _ORPHANS.format(named=_NAMED)
    return {
        "total": _TOTAL.format(orphans=orphans),
        "by_session": _BY_SESSION.format(orphans=orphans),
    }


def collect_ledger(store: BaseStore) -> dict[str, Any]:
    """The ledger figures as one JSON-ready dict (``report --json``'s ``ledger``):
    ``total`` (one row), ``by_session`` (rows, largest first) and ``gc``
    (``{"recorded": false, "note": …}``: what the orphan figures stand for)."""
    sql = ledger_sql(store)
    return {
        "total": store.query(sql["total"]).to_pylist()[0],
        "by_session": store.query(sql["by_session"]).to_pylist(),
        "gc": {"recorded": False, "note": GC_NOTE},
    }


_COLUMNS = [
    "records",
    "ledger_bytes",
    "pointers",
    "blobs",
    "blob_bytes",
    "orphan_blobs",
    "orphan_bytes",
]
_HEAD = ["records", "ledger bytes", "pointers", "blobs", "blob bytes", "orphans", "orphan bytes"]


def render_ledger(console: Console, data: dict[str, Any]) -> None:
    """Print the ledger figures as rich tables."""
    t = data["total"]
    console.print(
        table(
            "Ledger (bytes; blobs in the database; orphans: blobs no pointer names)",
            ["figure", "value"],
            [
                ["ledgers", fmt_num(t["ledgers"])],
                ["catalog entries", fmt_num(t["catalog_entries"])],
                *([label, fmt_num(t[k])] for label, k in zip(_HEAD, _COLUMNS, strict=True)),
            ],
        )
    )
    rows = data["by_session"]
    shown = rows[:SESSIONS_SHOWN]
    title = "Ledger per session"
    if len(rows) > len(shown):
        title += f", the {len(shown)} largest of {len(rows)}"
    console.print(
        table(
            title,
            ["session", *_HEAD],
            [[r["session_id"], *(fmt_num(r[k]) for k in _COLUMNS)] for r in shown],
        )
    )
    console.print(data["gc"]["note"] + ".", highlight=False, markup=False)
