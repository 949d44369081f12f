"""Usage for ``turnkeeper report``: tokens and cost per model, per UTC day and per
session, from the usage records (``store.usage``; the usage imported pi
files' assistant messages carry included).

Each figure is one query through ``store.query`` over ``usage_records``'
columns (never its text parsed as JSON), the same SQL on DuckDB and
PostgreSQL. Tokens are summed per figure (input not read from a cache,
output, cache read, cache write, total); cost is in US dollars, summed over
the records whose cost is known (``priced`` counts them); an unknown figure
(``NULL``: an odd value in an imported file) adds nothing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from turnkeeper.storage import BaseStore

from .report_runs import table

SESSIONS_SHOWN = 20
"""Most sessions the table prints (the costliest); JSON has all."""

_SUMS = (
    "count(*) AS requests, "
    "coalesce(sum(input_tokens), 0)::BIGINT AS input_tokens, "
    "coalesce(sum(output_tokens), 0)::BIGINT AS output_tokens, "
    "coalesce(sum(cache_read_tokens), 0)::BIGINT AS cache_read_tokens, "
    "coalesce(sum(cache_write_tokens), 0)::BIGINT AS cache_write_tokens, "
    "coalesce(sum(total_tokens), 0)::BIGINT AS total_tokens, "
    "coalesce(sum(cost_usd), 0)::DOUBLE PRECISION AS cost_usd, "
    "count(cost_usd) AS priced"
)
"""Every figure's sums, one row per group."""

_DAY = "CAST(recorded_at AT TIME ZONE 'UTC' AS DATE)"

USAGE_SQL: dict[str, str] = {
    "total": f"SELECT {_SUMS} FROM usage_records",
    "by_model": (
        f"SELECT provider, model, {_SUMS} FROM usage_records GROUP BY provider, model "
        "ORDER BY cost_usd DESC, total_tokens DESC, provider, model"
    ),
    "by_day": f"SELECT {_DAY} AS day, {_SUMS} FROM usage_records GROUP BY {_DAY} ORDER BY day",
    "by_session": (
        f"SELECT session_id, {_SUMS} FROM usage_records GROUP BY session_id "
        "ORDER BY cost_usd DESC, total_tokens DESC, session_id"
    ),
}
"""The usage figures: totals, then per (provider, model), per UTC day of the
request and per session."""

_NUMBERS = [
    "requests",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "total_tokens",
]


def collect_usage(store: BaseStore) -> dict[str, Any]:
    """The usage figures as one JSON-ready dict (``report --json``'s ``usage``):
    ``total`` (one row), ``by_model``, ``by_day``, ``by_session`` (lists of rows)."""
    out: dict[str, Any] = {name: store.query(sql).to_pylist() for name, sql in USAGE_SQL.items()}
    out["total"] = out["total"][0]
    return out


def _row(labels: list[str], r: dict[str, Any]) -> list[str]:
    return [
        *labels,
        *(f"{r[k]:,}" for k in _NUMBERS),
        f"{r['cost_usd']:,.4f}",
    ]


_HEAD = ["requests", "input", "output", "cache read", "cache write", "total", "cost (USD)"]


def render_usage(console: Console, data: dict[str, Any]) -> None:
    """Print the usage figures as rich tables."""
    console.print(
        table(
            "Usage per model (tokens; cost in US dollars)",
            ["provider", "model", *_HEAD],
            [_row([r["provider"] or "-", r["model"] or "-"], r) for r in data["by_model"]],
            text_columns=2,
        )
    )
    console.print(
        table(
            "Usage per day (UTC)",
            ["day", *_HEAD],
            [_row([r["day"].isoformat()], r) for r in data["by_day"]],
        )
    )
    rows = data["by_session"]
    shown = rows[:SESSIONS_SHOWN]
    title = "Usage per session"
    if len(rows) > len(shown):
        title += f", the {len(shown)} costliest of {len(rows)}"
    console.print(table(title, ["session", *_HEAD], [_row([r["session_id"]], r) for r in shown]))
