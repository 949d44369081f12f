"""``reports/BENCH.md``'s goals table judges each figure against its bound:
met on the bound's side, NOT met past it (with its reason), "—" unmeasured."""

from __future__ import annotations

import sys
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def _rows(duckdb: dict, postgres: dict) -> list[str]:
    sys.path.insert(0, str(REPORTS))
    try:
        import bench_goals
    finally:
        sys.path.remove(str(REPORTS))
    return bench_goals.rows({"backends": {"duckdb": duckdb, "postgres": postgres}})


def _row(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(f"| {start}"))


def test_a_figure_is_met_at_its_bound_and_not_past_it() -> None:
    lines = _rows(
        {"statements_per_turn": {"total": 15}, "threads": {"16": {"x_one_writer": 7.9}}},
        {"statements_per_turn": {"total": 16}},
    )
    turn = _row(lines, "turn (admit")
    assert "| 15 (≤ 15: met) | 16 (≤ 15: NOT met) |" in turn, turn
    threads = _row(lines, "fenced appends, 16 threads")
    assert "7.9× (≥ 8×: NOT met) | — |" in threads, threads  # at least: a figure below misses
    why = [line for line in lines if line.startswith("- ")]
    assert len(why) == 2 and why[0].startswith("- turn (admit") and "postgres" in why[0], why


def test_an_unmeasured_figure_judges_nothing() -> None:
    lines = _rows({}, {})
    assert all(
        line.count("—") == 2
        for line in lines
        if line.startswith("| ") and "---" not in line and not line.startswith("| goal |")
    ) and not any(line.startswith("- ") for line in lines)


def test_the_import_memory_goal_judges_the_memory_beyond_duckdbs_floor() -> None:
    """The goal reads the import's own peak RSS beyond DuckDB's floor for the
    same uncommitted rows (``own_mib``), not the whole peak, which grows with
    the file through DuckDB's transaction (``reports/bench_cli.py``)."""

    def size(peak: float, own: float) -> dict:
        return {"peak_rss_mib": {"median": peak}, "own_mib": {"median": own}}

    cli = {"rss_by_size": {"small": size(210.7, 8.9), "big": size(392.7, 4.5)}}
    row = _row(_rows({"cli": cli}, {}), "pi import memory bounded")
    assert "| 0.51× (≤ 1.5×: met) | — |" in row, row
    cli["rss_by_size"]["big"] = size(392.7, 18.0)
    row = _row(_rows({"cli": cli}, {}), "pi import memory bounded")
    assert "2.02× (≤ 1.5×: NOT met)" in row, row
