"""reports/bench.py's replay rows (issue 21 part 1) measured alone
(``python reports/bench.py replay``): merged into an existing bench.json with
every other figure kept as it was, its table regenerated from the merged
file, which says the rows were measured alone and at what load."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from test_bench_encryption import alone
from test_machines import TINY_BENCH

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    """reports/bench.py as a module."""
    monkeypatch.syspath_prepend(str(REPORTS))
    sys.modules.pop("bench", None)
    import bench as module

    yield module
    sys.modules.pop("bench", None)


def test_the_replay_rows_alone_are_merged_keeping_every_other_figure(bench, tmp_path: Path) -> None:
    """``bench.py replay`` at a tiny size on a copy of the committed bench.json:
    each measured backend's cold replay row, LangGraph peers, replay RSS and
    replay statements are replaced (newly measured: other values than the
    committed ones, at the tiny size), everything else is what it was, and
    BENCH.md is the table of the merged file, saying how the rows were taken."""
    before = json.loads((REPORTS / "bench.json").read_text(encoding="utf-8"))
    for backend in before["backends"].values():
        backend.pop("replay_alone", None)
    (tmp_path / "bench.json").write_text(json.dumps(before), encoding="utf-8")
    done = alone(tmp_path, "replay")
    assert done.returncode == 0, done.stdout + done.stderr
    after = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    measured = {"duckdb", *(["postgres"] if os.environ.get("TURNKEEPER_TEST_PG") else [])}
    assert {n for n, b in after["backends"].items() if "replay_alone" in b} == measured
    tiny = f"replay ({TINY_BENCH['TURNKEEPER_BENCH_REPLAY_ENTRIES']} entries), cache off"
    merged = json.loads(json.dumps(after))
    for name in measured:
        got, had = after["backends"][name], before["backends"][name]
        assert got["replay_rss"]["entries"] == int(TINY_BENCH["TURNKEEPER_BENCH_RSS_ENTRIES"])
        assert set(got["langgraph"]) == set(had["langgraph"])
        assert all(r["median"] > 0 for r in got["langgraph"].values())
        assert got["operations"].pop(tiny)["median"] > 0
        alone_at = got.pop("replay_alone")
        assert alone_at["floor_ms"] > 0 and len(alone_at["load_average"]) == 3
        assert got["statements_per_call"].pop("replay") > 0
        had["statements_per_call"].pop("replay")
        for key in ("langgraph", "replay_rss"):
            got.pop(key)
            had.pop(key)
    assert after == before
    table = (tmp_path / "BENCH.md").read_text(encoding="utf-8")
    assert table == bench.table(merged)
    assert "measured again alone (`python reports/bench.py replay`" in table


def test_the_replay_rows_alone_refuse_without_a_full_run(tmp_path: Path) -> None:
    """No bench.json to merge into: exit non-zero, nothing written."""
    done = alone(tmp_path, "replay")
    assert done.returncode != 0 and "run the whole benchmark first" in done.stderr
    assert not (tmp_path / "bench.json").exists() and not (tmp_path / "BENCH.md").exists()
