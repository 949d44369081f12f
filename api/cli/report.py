"""``turnkeeper report``: analytics over what a database holds, in DuckDB SQL.

Every figure is one query through :meth:`BaseStore.query` (a
``pyarrow.Table``) on the database opened read-only: sessions and entries,
entries by kind, user turns per session (min/avg/max), models used (assistant
messages' ``provider``/``model`` and ``model_change`` entries), lease events
by edge, fenced writes by operation, takeovers and fenced writes over time
(per second when the events span under two minutes, else per minute) and
thread records by status. No figure reads a payload: turns and models read
the clear columns ``entries.role``, ``provider`` and ``model``
(:mod:`turnkeeper.spec.clear_facts`), so the report works unchanged on a
store whose payloads are encrypted at rest.

Usage (:mod:`.report_usage`, JSON key ``usage``): tokens (input not read
from a cache, output, cache read, cache write, total) and cost in US dollars,
in total and per provider and model, per UTC day and per session, from the
usage records (``store.usage``, imported pi files' assistant messages
included).

Run history (:mod:`.report_runs`, JSON key ``run_history``): runs by status
and attempt; retries (runs with attempt > 1, intents that needed them); time
to recovery in seconds (min / median / p95 / max, from the end of the run's
lease to its recovery's completion) and recoveries by state; delivery
operations and intents by status, claims per operation, requeues, outcomes
per kind; failure reasons (run ``error``, recovery ``last_error``, delivery
``failure_code``, tool ``reason``) with counts; tool executions by state.
Those figures are computed from SQL views (``run_history``,
``intent_attempts``, ``recovery_times``, ``delivery_outcomes``,
``delivery_intent_outcomes``, ``failure_reasons``, ``tool_outcomes``) inlined
as CTEs, since a read-only open cannot create views; ``--sql`` prints the same
views as ``CREATE OR REPLACE TEMP VIEW`` statements plus every figure query,
for a user to run in ``duckdb -readonly`` on the file. All durations are
seconds.

Ledger (:mod:`.report_ledger`, JSON key ``ledger``): ledgers, records,
ledger bytes, blob pointers, the database's blobs and their bytes, and orphan
blobs (no pointer names them: GC results are not recorded, so the report
counts what GC would reclaim), in total and per session.

``--parquet DIR`` also writes the underlying tables as Parquet files
(:data:`PARQUET_TABLES`); ``delivery_intents`` leaves out
``transport_context``, opaque runtime state that reports never project.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import click
from rich.console import Console

from turnkeeper.storage import BaseStore

from .common import cell, db_option, dumps, fmt_num, open_db, stdout_console
from .report_ledger import collect_ledger, render_ledger
from .report_runs import collect_runs, render_runs, sql_script, table
from .report_usage import collect_usage, render_usage

PARQUET_TABLES = (
    "sessions",
    "entries",
    "lease_events",
    "fence_events",
    "thread_records",
    "runs",
    "run_events",
    "run_recoveries",
    "recovery_events",
    "delivery_intents",
    "delivery_operations",
    "delivery_events",
    "tool_executions",
    "usage_records",
)
"""Tables ``--parquet`` exports, one ``<table>.parquet`` file each."""

PARQUET_EXCLUDED: dict[str, tuple[str, ...]] = {"delivery_intents": ("transport_context",)}
"""Columns never exported: a delivery intent's transport context is opaque runtime state."""

SECOND_BUCKETS_BELOW_S = 120
"""Bucket the timeline per second when its events span fewer seconds than this."""

TIMELINE_ROWS_SHOWN = 40
"""Most timeline buckets the table prints (the latest ones); JSON has all."""

SQL: dict[str, str] = {
    "sessions": (
        "SELECT count(*) AS sessions, coalesce(sum(entry_count), 0)::BIGINT AS entries, "
        "min(created_at) AS first_created, max(updated_at) AS last_updated FROM sessions"
    ),
    "entries_by_kind": (
        "SELECT kind, count(*) AS entries FROM entries GROUP BY kind ORDER BY entries DESC, kind"
    ),
    "lease_events_by_edge": (
        "SELECT edge, count(*) AS events FROM lease_events GROUP BY edge ORDER BY events DESC"
    ),
    "fenced_by_operation": (
        "SELECT operation, count(*) AS refused FROM fence_events GROUP BY operation "
        "ORDER BY refused DESC"
    ),
    "thread_records": (
        "SELECT status, count(*) AS records FROM thread_records GROUP BY status ORDER BY status"
    ),
    "turns": (
        "WITH t AS (SELECT s.id, count(e.id) AS turns FROM sessions s LEFT JOIN ("
        "SELECT session_id, id FROM entries WHERE kind = 'message' AND role = 'user'"
        ") e ON e.session_id = s.id GROUP BY s.id) "
        "SELECT min(turns) AS min, round((avg(turns))::NUMERIC, 2)::DOUBLE PRECISION AS avg, "
        "max(turns) AS max, "
        "coalesce(sum(turns), 0)::BIGINT AS total FROM t"
    ),
    "models": (
        "SELECT source, provider, model, count(*) AS entries FROM ("
        "SELECT 'assistant' AS source, provider, model FROM entries "
        "WHERE kind = 'message' AND role = 'assistant' "
        "UNION ALL SELECT 'model_change', provider, model FROM entries "
        "WHERE kind = 'model_change') m "
        "GROUP BY source, provider, model ORDER BY entries DESC, source, provider, model"
    ),
}
"""Every figure's query, in the SQL both backends speak, over columns only: user
turns per session and models used read the clear facts of the entries' payloads
(``entries.role``, ``provider``, ``model``; :mod:`turnkeeper.spec.clear_facts`),
never the payload, so they work unchanged on a store whose payloads are sealed."""

FIGURE_ORDER = (
    "sessions",
    "entries_by_kind",
    "turns",
    "models",
    "lease_events_by_edge",
    "fenced_by_operation",
    "thread_records",
)
"""Every figure of :data:`SQL`, in report order."""


EVENTS = (
    "SELECT occurred_at AS t, 1 AS takeover, 0 AS fenced FROM lease_events "
    "WHERE edge = 'takeover' UNION ALL "
    "SELECT occurred_at, 0, 1 FROM fence_events"
)


def _rows(store: BaseStore, sql: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = store.query(sql).to_pylist()
    return rows


def timeline(store: BaseStore) -> dict[str, Any]:
    """Takeovers and fenced writes per bucket: ``{"bucket": unit, "rows": [...]}``.

    The unit is ``second`` when the events span under
    :data:`SECOND_BUCKETS_BELOW_S` seconds, else ``minute``.
    """
    span = _rows(
        store,
        "SELECT coalesce(date_part('epoch', max(t)) - date_part('epoch', min(t)), 0) AS span_s "
        f"FROM ({EVENTS}) e",
    )[0]["span_s"]
    unit = "second" if float(span) < SECOND_BUCKETS_BELOW_S else "minute"
    rows = _rows(
        store,
        f"SELECT date_trunc('{unit}', t) AS bucket, sum(takeover)::BIGINT AS takeovers, "
        f"sum(fenced)::BIGINT AS fenced_writes FROM ({EVENTS}) e GROUP BY bucket ORDER BY bucket",
    )
    return {"bucket": unit, "rows": rows}


def collect(store: BaseStore) -> dict[str, Any]:
    """Every report figure as one JSON-ready dict."""
    out: dict[str, Any] = {name: _rows(store, SQL[name]) for name in FIGURE_ORDER}
    out["sessions"] = out["sessions"][0]
    out["turns_per_session"] = out.pop("turns")[0]
    out["timeline"] = timeline(store)
    out["usage"] = collect_usage(store)
    out["run_history"] = collect_runs(store)
    out["ledger"] = collect_ledger(store)
    return out


def write_parquet(store: BaseStore, directory: str) -> dict[str, dict[str, Any]]:
    """Write :data:`PARQUET_TABLES` to ``directory`` (created if missing), each
    streamed batch by batch (memory holds one batch, whatever the history).

    Returns ``{table: {"path", "rows"}}``. Leaves out :data:`PARQUET_EXCLUDED`.
    """
    pq = importlib.import_module("pyarrow.parquet")
    os.makedirs(directory, exist_ok=True)
    written: dict[str, dict[str, Any]] = {}
    for name in PARQUET_TABLES:
        excluded = set(PARQUET_EXCLUDED.get(name, ()))
        found = store.query(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position",
            [name],
        ).to_pylist()
        columns = ", ".join(r["column_name"] for r in found if r["column_name"] not in excluded)
        path = os.path.join(directory, f"{name}.parquet")

        def write(schema: Any, batches: Any, path: str = path) -> int:
            rows = 0
            with pq.ParquetWriter(path, schema) as out:
                for batch in batches:
                    out.write_batch(batch)
                    rows += batch.num_rows
            return rows

        rows = store.query_batches(f"SELECT {columns} FROM {name}", write)
        written[name] = {"path": os.path.abspath(path), "rows": rows}
    return written


def render(console: Console, data: dict[str, Any]) -> None:
    """Print the report as rich tables."""
    s = data["sessions"]
    t = data["turns_per_session"]
    status = {r["status"]: r["records"] for r in data["thread_records"]}
    console.print(
        table(
            "Overview",
            ["figure", "value"],
            [
                ["sessions", fmt_num(s["sessions"])],
                ["entries", fmt_num(s["entries"])],
                ["user turns (total)", fmt_num(t["total"])],
                [
                    "user turns per session min / avg / max",
                    f"{fmt_num(t['min'])} / {fmt_num(t['avg'], 2)} / {fmt_num(t['max'])}",
                ],
                ["thread records active", fmt_num(status.get("active", 0))],
                ["thread records archived", fmt_num(status.get("archived", 0))],
            ],
        )
    )
    console.print(
        table(
            "Entries by kind",
            ["kind", "entries"],
            [[r["kind"], fmt_num(r["entries"])] for r in data["entries_by_kind"]],
        )
    )
    console.print(
        table(
            "Models used",
            ["source", "provider", "model", "entries"],
            [
                [
                    r["source"],
                    str(r["provider"] or "-"),
                    str(r["model"] or "-"),
                    fmt_num(r["entries"]),
                ]
                for r in data["models"]
            ],
            text_columns=3,
        )
    )
    console.print(
        table(
            "Lease events and fenced writes",
            ["what", "count"],
            [[f"lease {r['edge']}", fmt_num(r["events"])] for r in data["lease_events_by_edge"]]
            + [
                [f"fenced {r['operation']}", fmt_num(r["refused"])]
                for r in data["fenced_by_operation"]
            ],
        )
    )
    tl = data["timeline"]
    rows = tl["rows"]
    shown = rows[-TIMELINE_ROWS_SHOWN:]
    title = f"Takeovers and fenced writes per {tl['bucket']} (UTC)"
    if len(rows) > len(shown):
        title += f", last {len(shown)} of {len(rows)} buckets"
    fmt = "%Y-%m-%d %H:%M:%S" if tl["bucket"] == "second" else "%Y-%m-%d %H:%M"
    console.print(
        table(
            title,
            [tl["bucket"], "takeovers", "fenced writes"],
            [
                [r["bucket"].strftime(fmt), fmt_num(r["takeovers"]), fmt_num(r["fenced_writes"])]
                for r in shown
            ],
        )
    )


@click.command("report")
@db_option()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option(
    "--parquet",
    "parquet_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Also write " + ", ".join(PARQUET_TABLES) + " as Parquet files into this directory "
    "(delivery_intents without its transport_context).",
)
@click.option(
    "--sql",
    "as_sql",
    is_flag=True,
    help="Print the run-history SQL (CREATE OR REPLACE TEMP VIEW statements, then each "
    "figure's query) instead of a report; reads no database.",
)
def report_command(db: str, as_json: bool, parquet_dir: str | None, as_sql: bool) -> None:
    """Print analytics over the stored sessions, leases, thread records and run history.

    Tables (or one JSON object with --json): sessions and entries, entries by
    kind, user turns per session, models used, lease events by edge, fenced
    writes by operation, takeovers and fenced writes over time (per second
    under two minutes of data, else per minute), thread records by status.

    Usage: tokens (input, output, cache read, cache write, total) and cost in
    US dollars per provider and model, per UTC day and per session, from the
    usage records (runtimes' and imported pi files' assistant messages').

    Run history: runs by status and attempt, retries, recoveries by state,
    time to recovery in seconds (from the end of the run's lease to its
    recovery's completion: min, median, p95, max), deliveries by status,
    claims per operation, requeues, outcomes per kind, failure reasons, tool
    executions by state.

    Ledger: ledgers, records and ledger bytes, blob pointers, blobs in the
    database and their bytes, orphan blobs (no pointer names them: what
    ledger gc would delete; GC results are not recorded), in total and per
    session (the 20 largest).

    The run-history figures are SQL views (run_history, intent_attempts,
    recovery_times, delivery_outcomes, delivery_intent_outcomes,
    failure_reasons, tool_outcomes). The report opens the database read-only,
    so it never creates them in the file: it inlines them in each query.
    --sql prints them as TEMP views with every figure's query, to run in
    DuckDB on a read-only open that leaves the file unchanged:

        turnkeeper report --sql | duckdb -readonly turnkeeper.duckdb
    """
    if as_sql:
        if as_json or parquet_dir is not None:
            raise click.UsageError("--sql prints SQL only; drop --json and --parquet")
        click.echo(sql_script(), nl=False)
        return
    with open_db(db, read_only=True) as store:
        data = collect(store)
        if parquet_dir is not None:
            data["parquet"] = write_parquet(store, parquet_dir)
    if as_json:
        click.echo(dumps(data))
        return
    console = stdout_console()
    render(console, data)
    render_usage(console, data["usage"])
    render_runs(console, data["run_history"])
    render_ledger(console, data["ledger"])
    for name, info in data.get("parquet", {}).items():
        console.print(cell(f"wrote {info['path']} ({info['rows']:,} rows, table {name})"))
