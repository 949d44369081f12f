"""reports/bench.py never records a rate of nothing: every writer appends at
least MIN_APPENDS times however short its time (a tiny or loaded run could
time a window with no append in it and write 0 ops/s as a figure), and the
processes of a multi-process figure are all ready before any is timed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import new_pg_schema

import turnkeeper

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    """reports/bench.py as a module, with no time to append in (its spawned
    processes import it from its folder too, with the same environment)."""
    monkeypatch.setenv("TURNKEEPER_BENCH_WRITERS_S", "0")
    monkeypatch.syspath_prepend(str(ROOT / "reports"))
    sys.modules.pop("bench", None)
    import bench as module

    yield module
    sys.modules.pop("bench", None)


def test_threads_with_no_time_still_measure_appends(bench, tmp_path: Path) -> None:
    with turnkeeper.open_store(str(tmp_path / "b.duckdb")) as store:
        assert bench.threads(store, 2) > 0
        appended = store.query("SELECT count(*) AS n FROM entries").to_pylist()[0]["n"]
    assert appended >= 2 * (1 + bench.MIN_APPENDS)  # each writer: its first, then the timed


@pytest.mark.postgres
def test_processes_with_no_time_still_measure_appends(bench) -> None:
    url = new_pg_schema()
    turnkeeper.open_store(url).close()  # migrated once, before the processes race
    assert bench.processes(url, 2) > 0
    with turnkeeper.open_store(url) as store:
        appended = store.query("SELECT count(*) AS n FROM entries").to_pylist()[0]["n"]
    assert appended >= 2 * (1 + bench.MIN_APPENDS)


def test_the_threads_rows_alone_print_each_count_and_the_appends_statements(
    bench, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``reports/bench.py threads`` (issue 21 part 4's rows alone) runs at no
    time per count: a line per writer count, its multiple of one writer and
    its rate, then the floor and the appends' statements per call."""
    monkeypatch.setattr(bench, "REPS", 2)
    monkeypatch.setattr(bench, "MIN_S", 0.0)
    assert bench.thread_rows() == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[1].strip() for line in lines[:-1]] == [
        f"fenced appends, {n} threads, own sessions" for n in bench.THREAD_COUNTS
    ]
    assert "1.00× one thread" in lines[0]
    assert "statements per call" in lines[-1] and "2 repetitions" in lines[-1]
