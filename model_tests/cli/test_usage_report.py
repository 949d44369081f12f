"""``turnkeeper report``'s usage figures (tokens and cost per model, per UTC day
and per session), on both backends, checked against sums computed here from
the corpus files' JSON (:mod:`usage_expected`) and from what the test recorded,
with NUL in names and odd figures in a file that must not break the report.
"""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from rich.console import Console
from usage_expected import Expected, cost_sums, expected_file, expected_usage, sums

import turnkeeper
from turnkeeper.cli.main import cli
from turnkeeper.cli.report import collect
from turnkeeper.cli.report_usage import render_usage
from turnkeeper.formats import pi

ODD_FILE = "\n".join(
    json.dumps(r)
    for r in [
        {"type": "session", "version": 3, "id": "odd", "timestamp": "2026-03-01T00:00:00Z"},
        {
            "type": "message",
            "id": "x1",
            "parentId": None,
            "timestamp": "2026-03-01T23:59:59.999Z",
            "message": {
                "role": "assistant",
                "content": [],
                "provider": "p\x00q",
                "api": "a",
                "model": "m\x00[red]odd[/]",
                "usage": {"input": -1, "output": 1e300, "cacheRead": 5, "totalTokens": "9"},
            },
        },
        {
            "type": "message",
            "id": "x2",
            "parentId": "x1",
            "timestamp": "2026-03-02T00:00:00+01:00",
            "message": {
                "role": "assistant",
                "content": [],
                "provider": "p\x00q",
                "api": "a",
                "model": "m\x00[red]odd[/]",
                "usage": {"input": 7, "output": 3, "totalTokens": 10, "cost": {"total": 1e308}},
            },
        },
    ]
)
"""A file with NUL and markup in names, odd figures, and a timestamp whose UTC
day differs from its local one."""

RECORDED = [
    # (session, provider, model, tokens (input, output, read, write), cost, at)
    ("rec", "openai", "gpt\x00x", (100, 20, 30, 0), 0.5, datetime(2026, 3, 2, 1, tzinfo=UTC)),
    ("rec", "openai", "gpt\x00x", (1, 2, 3, 4), None, datetime(2026, 3, 3, tzinfo=UTC)),
    ("rec", "anthropic", "claude-opus-4-5", (9, 9, 9, 9), 1.25, datetime(2025, 12, 17, tzinfo=UTC)),
]


def _fill(store, pi_dir: Path, tmp_path: Path) -> list[tuple[str, Expected]]:
    """Import the corpus and the odd file, record :data:`RECORDED`; returns
    (session, expected) for every record, computed independently."""
    out: list[tuple[str, Expected]] = []
    for path in sorted(pi_dir.glob("*.jsonl")):
        sid = pi.import_file(store, path).session_id
        out += [(sid, e) for e in expected_file(path)]
    odd = tmp_path / "odd.jsonl"
    odd.write_text(ODD_FILE + "\n", encoding="utf-8")
    pi.import_file(store, odd)
    out += [("odd", e) for e in expected_usage(ODD_FILE)]
    store.sessions.create("rec")
    for sid, provider, model, tokens, cost, at in RECORDED:
        store.usage.record(
            sid,
            provider=provider,
            model=model,
            input_tokens=tokens[0],
            output_tokens=tokens[1],
            cache_read_tokens=tokens[2],
            cache_write_tokens=tokens[3],
            cost_usd=cost,
            recorded_at=at,
        )
        out.append((sid, Expected(None, provider, "", model, (*tokens, sum(tokens)), cost, at)))
    return out


_KEYS = [
    "requests",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "total_tokens",
]


def _check(rows: list[dict[str, Any]], labels: list[str], want, want_cost) -> None:
    got = {tuple(r[k] for k in labels): tuple(r[k] for k in _KEYS) for r in rows}
    assert got == want
    for r in rows:
        key = tuple(r[k] for k in labels)
        assert math.isclose(r["cost_usd"], want_cost[key], rel_tol=1e-9, abs_tol=1e-12), key


def test_report_usage_figures_equal_independent_sums(store, pi_dir: Path, tmp_path: Path):
    found = _fill(store, pi_dir, tmp_path)
    usage = collect(store)["usage"]
    every = [e for _, e in found]

    by_model = lambda e: (e.provider, e.model)  # noqa: E731
    _check(
        usage["by_model"], ["provider", "model"], sums(every, by_model), cost_sums(every, by_model)
    )

    by_day = lambda e: (e.at.astimezone(UTC).date(),)  # noqa: E731
    _check(usage["by_day"], ["day"], sums(every, by_day), cost_sums(every, by_day))
    assert [r["day"] for r in usage["by_day"]] == sorted(r["day"] for r in usage["by_day"])

    got_sessions = {(r["session_id"],): tuple(r[k] for k in _KEYS) for r in usage["by_session"]}
    per_session: dict[tuple[str], list[Expected]] = {}
    for sid, e in found:
        per_session.setdefault((sid,), []).append(e)
    want = {k: sums(v, lambda e: 0)[0] for k, v in per_session.items()}
    assert got_sessions == want
    for r in usage["by_session"]:
        cost = sum(e.cost or 0.0 for e in per_session[(r["session_id"],)])
        assert math.isclose(r["cost_usd"], cost, rel_tol=1e-9, abs_tol=1e-12)

    total = usage["total"]
    assert tuple(total[k] for k in _KEYS) == sums(every, lambda e: 0)[0]
    assert total["priced"] == sum(e.cost is not None for e in every)
    assert math.isclose(total["cost_usd"], sum(e.cost or 0.0 for e in every), rel_tol=1e-9)

    # the odd file: NUL survives into the figures, unknown figures add nothing
    odd = [r for r in usage["by_model"] if r["provider"] == "p\x00q"]
    assert [(r["model"], r["requests"], r["input_tokens"], r["total_tokens"]) for r in odd] == [
        ("m\x00[red]odd[/]", 2, 7, 10)
    ]

    text = io.StringIO()
    render_usage(Console(file=text, width=200), usage)
    shown = text.getvalue()
    assert "m\\x00[red]odd[/]" in shown and "\x00" not in shown  # shown as an escape, not markup
    assert "claude-opus-4-5" in shown and "2026-03-02" in shown


def test_report_cli_text_and_json_carry_the_usage(pi_dir: Path, tmp_path: Path):
    db = tmp_path / "r.duckdb"
    with turnkeeper.open_store(str(db)) as store:
        found = _fill(store, pi_dir, tmp_path)
    runner = CliRunner()
    as_json = runner.invoke(cli, ["report", "--db", str(db), "--json"], catch_exceptions=False)
    assert as_json.exit_code == 0, as_json.output
    usage = json.loads(as_json.stdout)["usage"]
    assert usage["total"]["requests"] == len(found)
    assert {r["day"] for r in usage["by_day"]} == {e.at.date().isoformat() for _, e in found}
    text = runner.invoke(cli, ["report", "--db", str(db)], catch_exceptions=False)
    assert text.exit_code == 0, text.output
    assert "Usage per model" in text.stdout and "Usage per session" in text.stdout
    top = usage["by_model"][0]
    assert f"{top['total_tokens']:,}" in text.stdout
