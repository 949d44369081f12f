"""Run history for ``turnkeeper report``: SQL views over runs, recoveries and deliveries.

One source for the SQL: :data:`VIEWS` holds DuckDB ``SELECT`` definitions
(one row per run, intent, recovery, delivery operation, delivery intent,
failure, tool execution) and :data:`FIGURES` the report's figures, each a
``SELECT`` over those views only. The report computes a figure as ``WITH
<every view> AS (<definition>) <figure>`` through ``store.query``, so it runs
on a database opened read-only and creates nothing in the file.
``turnkeeper report --sql`` prints the same definitions as ``CREATE OR REPLACE
TEMP VIEW`` statements, then every figure query, for a user to run in DuckDB
on the file. Temporary views live in that DuckDB session only: they work on a
read-only open and leave the file as it was, e.g.::

    turnkeeper report --db F --sql | duckdb -readonly F

Durations are DOUBLE seconds (``*_s``); figures round them to milliseconds.

Time to recovery runs from the moment the run became an orphan to the moment
its recovery completed (converged; ``state = 'completed'`` only: detached,
failed, dead-lettered and still-recovering records have none). The orphaning
moment is the end of the session lease the run was admitted under: its
release time if it was released, else the last expiry it was granted or
renewed to (``lease_events``); a run admitted without a lease is an orphan
from its admission. ``pickup_s`` is the part of that time before the first
recovery attempt began. ``since_update_s`` runs from the run's last update
(its last run event into a non-terminal status; ``runs.updated_at`` is
rewritten by the convergence) to the completion; for a run that had a lease
it is an upper bound, since it includes the time the lost worker's lease still
ran (the demo's summary measures this way).
"""

from __future__ import annotations

from datetime import date
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table

from turnkeeper.spec import DeliveryStatus, RecoveryState, RunStatus, ToolExecutionState
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.run import NON_TERMINAL, TERMINAL
from turnkeeper.storage import BaseStore
from turnkeeper.storage.ops.run_events import DECISION

from .common import cell, fmt_num

INTENT_STATUSES = ("pending", "delivered", "failed", "uncertain")
"""Delivery intent statuses (:func:`turnkeeper.spec.delivery.intent_status`)."""

DONE_SQL = f"('{DeliveryStatus.DELIVERED}', '{DeliveryStatus.UNSUPPORTED}')"


def _in(values: Any) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


class View(NamedTuple):
    """One SQL view: what a row is, and its ``SELECT``."""

    doc: str
    sql: str


VIEWS: dict[str, View] = {
    "run_history": View(
        "one row per run: model, attempt, status, error, duration_s, its recovery's state",
        f"""SELECT r.id AS run_id, r.session_id, r.intent_id, r.model, r.attempt, r.retry_of,
       r.status,
       r.status IN {_in(sorted(TERMINAL))} AS terminal,
       r.cancel_requested, r.error, r.started_at, r.finished_at,
       date_part('epoch', r.finished_at) - date_part('epoch', r.started_at) AS duration_s,
       v.state AS recovery_state
FROM runs r LEFT JOIN run_recoveries v ON v.run_id = r.id""",
    ),
    "intent_attempts": View(
        "one row per execution intent: runs, highest attempt, the latest attempt's status",
        """SELECT i.id AS intent_id, i.session_id, count(r.id) AS runs, max(r.attempt) AS attempts,
       (array_agg(r.status ORDER BY r.attempt DESC))[1] AS latest_status, i.created_at,
       max(r.finished_at) AS last_finished_at
FROM execution_intents i LEFT JOIN runs r ON r.intent_id = i.id
GROUP BY i.id, i.session_id, i.created_at""",
    ),
    "recovery_times": View(
        "one row per recovery record: state, attempts, last_update_at, orphaned_at, "
        "pickup_s, time_to_recovery_s and since_update_s (both completed only)",
        f"""SELECT v.run_id, v.session_id, v.state, v.attempt AS attempts, v.trigger_source,
       v.reason, v.last_error, o.last_update_at, o.orphaned_at, v.started_at, v.completed_at,
       date_part('epoch', v.started_at) - date_part('epoch', o.orphaned_at) AS pickup_s,
       CASE WHEN v.state = 'completed'
            THEN date_part('epoch', v.completed_at) - date_part('epoch', o.orphaned_at)
       END AS time_to_recovery_s,
       CASE WHEN v.state = 'completed'
            THEN date_part('epoch', v.completed_at) - date_part('epoch', o.last_update_at)
       END AS since_update_s
FROM run_recoveries v JOIN (
    SELECT r.id, coalesce(l.ended_at, r.started_at) AS orphaned_at,
           coalesce(u.last_update_at, r.started_at) AS last_update_at
    FROM runs r LEFT JOIN (
        SELECT target, epoch, coalesce(min(expires_at) FILTER (WHERE edge = 'release'),
                                       max(expires_at)) AS ended_at
        FROM lease_events GROUP BY target, epoch
    ) l ON l.target = '{session_target("")}' || r.session_id AND l.epoch = r.lease_epoch
    LEFT JOIN (
        SELECT run_id, max(occurred_at) AS last_update_at FROM run_events
        WHERE dest IN {_in(sorted(NON_TERMINAL))} AND edge <> '{DECISION}' GROUP BY run_id
    ) u ON u.run_id = r.id
) o ON o.id = v.run_id""",
    ),
    "delivery_outcomes": View(
        "one row per delivery operation: kind, status, attempts, requeues, failure_code",
        """SELECT o.id AS operation_id, o.intent_id, i.run_id, i.session_id, i.platform, o.kind,
       o.sequence, o.status, i.status AS intent_status, o.attempt_count AS attempts,
       coalesce(q.requeues, 0) AS requeues, nullif(o.failure_code, '') AS failure_code,
       o.created_at, o.updated_at
FROM delivery_operations o JOIN delivery_intents i ON i.id = o.intent_id
LEFT JOIN (
    SELECT operation_id, count(*) AS requeues FROM delivery_events
    WHERE trigger = 'requeue' GROUP BY operation_id
) q ON q.operation_id = o.id""",
    ),
    "delivery_intent_outcomes": View(
        "one row per delivery intent (never its transport context): status, operations",
        f"""SELECT i.id AS intent_id, i.run_id, i.session_id, i.platform, i.status,
       count(o.id) AS operations,
       count(o.id) FILTER (WHERE o.status IN {DONE_SQL}) AS operations_done,
       coalesce(sum(o.attempt_count), 0)::BIGINT AS attempts, i.created_at, i.updated_at
FROM delivery_intents i LEFT JOIN delivery_operations o ON o.intent_id = i.id
GROUP BY i.id, i.run_id, i.session_id, i.platform, i.status, i.created_at, i.updated_at""",
    ),
    "failure_reasons": View(
        "one row per failed or erroring run, recovery, delivery operation, tool execution",
        """SELECT 'run' AS source, id AS object_id, session_id, status,
       coalesce(nullif(error, ''), '(none recorded)') AS reason, updated_at AS at
FROM runs WHERE error IS NOT NULL OR status IN ('failed', 'interrupted', 'abandoned')
UNION ALL
SELECT 'recovery', run_id, session_id, state,
       coalesce(nullif(last_error, ''), '(none recorded)'), updated_at
FROM run_recoveries WHERE last_error IS NOT NULL OR state IN ('failed', 'dead_lettered')
UNION ALL
SELECT 'delivery', o.id, i.session_id, o.status,
       coalesce(nullif(o.failure_code, ''), '(none recorded)'), o.updated_at
FROM delivery_operations o JOIN delivery_intents i ON i.id = o.intent_id
WHERE o.failure_code <> '' OR o.status IN ('failed', 'uncertain')
UNION ALL
SELECT 'tool', execution_key, session_id, state,
       coalesce(nullif(reason, ''), '(none recorded)'), updated_at
FROM tool_executions WHERE reason IS NOT NULL OR state IN ('interrupted', 'abandoned')""",
    ),
    "tool_outcomes": View(
        "one row per tool execution (no arguments or results): state, side_effecting",
        """SELECT execution_key, session_id, run_id, tool_kind, tool_name, side_effecting, state,
       is_error, reason, attempt, created_at, completed_at,
       date_part('epoch', completed_at) - date_part('epoch', created_at) AS duration_s
FROM tool_executions""",
    ),
}
"""Every view, in the order ``--sql`` prints them (none reads another)."""


class Figure(NamedTuple):
    """One report figure: a ``SELECT`` over :data:`VIEWS`; ``single`` returns one row."""

    doc: str
    sql: str
    single: bool = False


def _by_state(view: str, column: str, states: Any, counted: str, extra: str = "") -> str:
    """Rows for every state in ``states`` (zero when absent), in that order."""
    values = ", ".join(f"('{s}', {i})" for i, s in enumerate(states))
    return (
        f"SELECT s.{column}, count(v.{column}) AS {counted}{extra}\n"
        f"FROM (VALUES {values}) s({column}, pos)\n"
        f"LEFT JOIN {view} v ON v.{column} = s.{column}\n"
        f"GROUP BY s.{column}, s.pos ORDER BY s.pos"
    )


def _ms(expr: str, digits: int = 3) -> str:
    """SQL rounding ``expr`` to ``digits`` decimals as a double (PostgreSQL rounds
    only numerics, and DuckDB's bare NUMERIC keeps 3 decimals; both engines read
    the result as a float)."""
    return f"round(({expr})::NUMERIC(38, 9), {digits})::DOUBLE PRECISION"


def _seconds(column: str, view: str, counted: str) -> str:
    """count / min / median / p95 / max of ``column`` (seconds, rounded to ms)."""
    return (
        f"SELECT count({column}) AS {counted},\n"
        f"       {_ms(f'min({column})')} AS min_s,\n"
        f"       {_ms(f'percentile_cont(0.5) WITHIN GROUP (ORDER BY {column})')} AS median_s,\n"
        f"       {_ms(f'percentile_cont(0.95) WITHIN GROUP (ORDER BY {column})')} AS p95_s,\n"
        f"       {_ms(f'max({column})')} AS max_s\n"
        f"FROM {view}"
    )


_RUN_ORDER = (
    "CASE status " + " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(RunStatus)) + " END"
)
"""SQL ordering runs by their lifecycle order of statuses."""

FAILED_SQL = "('failed', 'interrupted', 'abandoned')"
"""The terminal statuses a failure rate counts (cancelled and succeeded are not failures)."""

MODEL_DAYS = f"""SELECT model, CAST(started_at AT TIME ZONE 'UTC' AS DATE) AS day,
       count(*) AS runs,
       {_ms(f"avg(CASE WHEN status IN {FAILED_SQL} THEN 1.0 ELSE 0.0 END)", 4)} AS failure_rate,
       {_ms("percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_s)")} AS p95_s
FROM run_history WHERE terminal
GROUP BY model, CAST(started_at AT TIME ZONE 'UTC' AS DATE) ORDER BY model, day"""
"""Per model and UTC day of the run's start, over ended runs: runs, failure rate
(failed, interrupted, abandoned), p95 duration in seconds (reports/bench.py times it)."""

FIGURES: dict[str, Figure] = {
    "runs_by_model_day": Figure(
        "ended runs per model and UTC day: failure rate (failed, interrupted, abandoned) "
        "and p95 duration (s)",
        MODEL_DAYS,
    ),
    "runs_by_status_attempt": Figure(
        "runs per status and attempt number",
        "SELECT status, attempt, count(*) AS runs FROM run_history GROUP BY status, attempt\n"
        f"ORDER BY {_RUN_ORDER}, attempt",
    ),
    "retries": Figure(
        "retry runs (attempt > 1) and the intents that needed them",
        """SELECT (SELECT count(*) FROM run_history) AS runs,
       (SELECT count(*) FROM run_history WHERE attempt > 1) AS retry_runs,
       count(*) AS intents, count(*) FILTER (WHERE attempts > 1) AS intents_retried,
       count(*) FILTER (WHERE attempts > 1 AND latest_status = 'succeeded')
           AS intents_retried_succeeded,
       max(attempts) AS max_attempt
FROM intent_attempts""",
        single=True,
    ),
    "recovery_states": Figure(
        "recovery records per state",
        _by_state("recovery_times", "state", [s.value for s in RecoveryState], "recoveries"),
    ),
    "time_to_recovery": Figure(
        "seconds from the end of the run's lease (orphaned) to recovery completed",
        _seconds("time_to_recovery_s", "recovery_times", "recoveries"),
        single=True,
    ),
    "recovery_pickup": Figure(
        "seconds from the end of the run's lease to the first recovery attempt",
        _seconds("pickup_s", "recovery_times", "recoveries"),
        single=True,
    ),
    "recovery_since_update": Figure(
        "seconds from the run's last update to recovery completed (completed recoveries)",
        _seconds("since_update_s", "recovery_times", "recoveries"),
        single=True,
    ),
    "delivery_operations_by_status": Figure(
        "delivery operations per status",
        _by_state("delivery_outcomes", "status", [s.value for s in DeliveryStatus], "operations"),
    ),
    "delivery_intents_by_status": Figure(
        "delivery intents per status",
        _by_state("delivery_intent_outcomes", "status", INTENT_STATUSES, "intents"),
    ),
    "delivery_attempts": Figure(
        "claims per delivery operation and requeues",
        f"""SELECT count(*) AS operations, coalesce(sum(attempts), 0)::BIGINT AS attempts,
       {_ms("avg(attempts)", 2)} AS avg_attempts, max(attempts) AS max_attempts,
       coalesce(sum(requeues), 0)::BIGINT AS requeues,
       count(*) FILTER (WHERE requeues > 0) AS operations_requeued
FROM delivery_outcomes""",
        single=True,
    ),
    "delivery_attempts_distribution": Figure(
        "delivery operations per number of claims",
        "SELECT attempts, count(*) AS operations FROM delivery_outcomes\n"
        "GROUP BY attempts ORDER BY attempts",
    ),
    "delivery_outcomes_by_kind": Figure(
        "delivery operations per kind and status",
        "SELECT kind, status, count(*) AS operations FROM delivery_outcomes\n"
        "GROUP BY kind, status ORDER BY kind, operations DESC, status",
    ),
    "failure_reasons": Figure(
        "failures per source, status and reason",
        "SELECT source, status, reason, count(*) AS records FROM failure_reasons\n"
        "GROUP BY source, status, reason ORDER BY records DESC, source, status, reason",
    ),
    "tool_executions_by_state": Figure(
        "tool executions per state, side-effecting and read-only",
        _by_state(
            "tool_outcomes",
            "state",
            [s.value for s in ToolExecutionState],
            "executions",
            ",\n       count(v.state) FILTER (WHERE v.side_effecting) AS side_effecting,\n"
            "       count(v.state) FILTER (WHERE NOT v.side_effecting) AS read_only",
        ),
    ),
}
"""Every run-history figure, in report order; each reads :data:`VIEWS` only."""


def figure_sql(name: str) -> str:
    """Figure ``name`` as one statement: every view as a CTE, then the figure."""
    ctes = ",\n".join(f"{view} AS (\n{v.sql}\n)" for view, v in VIEWS.items())
    return f"WITH {ctes}\n{FIGURES[name].sql}"


def sql_script() -> str:
    """What ``report --sql`` prints: the views as temporary views, then each figure."""
    out = [
        "-- turnkeeper run history: SQL views (durations in seconds), in the SQL both",
        "-- DuckDB and PostgreSQL speak. TEMP views: they work on a read-only open and",
        "-- leave the store unchanged:",
        "--   turnkeeper report --sql | duckdb -readonly turnkeeper.duckdb",
        "--   turnkeeper report --sql | psql postgresql://…   (its search_path: the store's)",
        "",
    ]
    for name, view in VIEWS.items():
        out += [
            f"-- {name}: {view.doc}",
            f"CREATE OR REPLACE TEMP VIEW {name} AS",
            f"{view.sql};",
            "",
        ]
    for name, fig in FIGURES.items():
        out += [f"-- figure {name}: {fig.doc}", f"{fig.sql};", ""]
    return "\n".join(out)


def collect_runs(store: BaseStore) -> dict[str, Any]:
    """Every run-history figure: ``{name: rows}``, one dict for single-row figures."""
    out: dict[str, Any] = {}
    for name, fig in FIGURES.items():
        rows: list[dict[str, Any]] = store.query(figure_sql(name)).to_pylist()
        out[name] = rows[0] if fig.single else rows
    return out


def table(title: str, columns: list[str], rows: list[list[str]], text_columns: int = 1) -> Table:
    """A table whose first ``text_columns`` columns are text and the rest numbers;
    a table without rows says ``(none)``. Every cell is shown as it is
    (:func:`~.common.cell`): stored text is never read as markup."""
    out = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        out.add_column(col, justify="left" if i < text_columns else "right")
    for row in rows or [["(none)"] + ["-"] * (len(columns) - 1)]:
        out.add_row(*(cell(c) for c in row))
    return out


def _cells(row: dict[str, Any], keys: list[str], digits: int = 1) -> list[str]:
    """``row``'s values under ``keys`` as table cells (text as is, numbers formatted)."""
    values = [row.get(k) for k in keys]
    return [
        v if isinstance(v, str) else v.isoformat() if isinstance(v, date) else fmt_num(v, digits)
        for v in values
    ]


def _grid(title: str, rows: list[dict[str, Any]], keys: list[str], text_columns: int = 1) -> Table:
    """A table of ``rows`` with one column per key (headers: the keys, ``_`` as spaces)."""
    headers = [k.replace("_", " ") for k in keys]
    return table(title, headers, [_cells(r, keys) for r in rows], text_columns)


def _values(title: str, row: dict[str, Any], labels: list[tuple[str, str]]) -> Table:
    """A figure / value table of one row: ``(label, key)`` per line."""
    return table(title, ["figure", "value"], [[label, fmt_num(row[k])] for label, k in labels])


def render_runs(console: Console, data: dict[str, Any]) -> None:
    """Print the run-history figures as rich tables."""
    p = console.print
    p(
        _grid(
            "Runs by status and attempt",
            data["runs_by_status_attempt"],
            ["status", "attempt", "runs"],
        )
    )
    p(
        _grid(
            "Ended runs by model and day (UTC): failure rate, p95 duration (s)",
            data["runs_by_model_day"],
            ["model", "day", "runs", "failure_rate", "p95_s"],
            text_columns=2,
        )
    )
    p(
        _values(
            "Retries",
            data["retries"],
            [
                ("runs", "runs"),
                ("retry runs (attempt > 1)", "retry_runs"),
                ("intents", "intents"),
                ("intents retried", "intents_retried"),
                ("retried intents whose latest attempt succeeded", "intents_retried_succeeded"),
                ("highest attempt", "max_attempt"),
            ],
        )
    )
    p(_grid("Recoveries by state", data["recovery_states"], ["state", "recoveries"]))
    stats = ["recoveries", "min_s", "median_s", "p95_s", "max_s"]
    p(
        table(
            "Recovery latency (seconds; recovered = recovery completed)",
            ["interval", "recoveries", "min s", "median s", "p95 s", "max s"],
            [
                [label, *_cells(data[name], stats, 3)]
                for label, name in (
                    ("lease ended → recovered (time to recovery)", "time_to_recovery"),
                    ("lease ended → first recovery attempt", "recovery_pickup"),
                    ("last run update → recovered", "recovery_since_update"),
                )
            ],
        )
    )
    intents = {r["status"]: r["intents"] for r in data["delivery_intents_by_status"]}
    ops = [r | {"intents": intents.get(r["status"])} for r in data["delivery_operations_by_status"]]
    p(_grid("Deliveries by status", ops, ["status", "operations", "intents"]))
    da = data["delivery_attempts"]
    p(
        table(
            "Delivery attempts (claims per operation)",
            ["figure", "value"],
            [
                ["operations", fmt_num(da["operations"])],
                ["attempts", fmt_num(da["attempts"])],
                [
                    "attempts per operation avg / max",
                    f"{fmt_num(da['avg_attempts'], 2)} / {fmt_num(da['max_attempts'])}",
                ],
                ["requeues", fmt_num(da["requeues"])],
                ["operations requeued", fmt_num(da["operations_requeued"])],
            ]
            + [
                [f"operations with {r['attempts']} attempts", fmt_num(r["operations"])]
                for r in data["delivery_attempts_distribution"]
            ],
        )
    )
    kinds = data["delivery_outcomes_by_kind"]
    p(_grid("Delivery outcomes by kind", kinds, ["kind", "status", "operations"], 2))
    reasons = data["failure_reasons"]
    p(_grid("Failure reasons", reasons, ["source", "status", "reason", "records"], 3))
    tools = data["tool_executions_by_state"]
    keys = ["state", "executions", "side_effecting", "read_only"]
    p(_grid("Tool executions by state", tools, keys))
