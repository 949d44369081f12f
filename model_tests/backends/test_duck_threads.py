"""A DuckDB store runs each statement on its caller's thread alone
(``threads = 1``, ``storage/duck/dialect.py``): DuckDB's default hands every
statement's tasks to a pool of one worker per core and waits for them, a fixed
cost per statement that a turn pays for each of its statements
(``docs/duckdb-turn-profile.md``). The store's own writers and readers are its
callers' threads, which still run side by side."""

from __future__ import annotations

import re
import threading

import duckdb
import pytest

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.storage.duck import dialect

MSG = {"message": {"role": "user", "content": "x"}}


def _threads(store: turnkeeper.BaseStore) -> int:
    return int(store.query("SELECT current_setting('threads') AS n").to_pylist()[0]["n"])


def test_a_store_runs_each_statement_on_its_callers_thread(tmp_path):
    """A new file, a second store object on it and a read-only open all run at
    ``threads = 1``; a ``SET`` through ``store.query`` is refused and changes nothing."""
    path = tmp_path / "s.duckdb"
    with turnkeeper.open_store(path) as a, turnkeeper.open_store(path) as b:
        assert _threads(a) == _threads(b) == 1
        with pytest.raises(turnkeeper.TurnkeeperError):
            a.query("SET GLOBAL threads = 4")
        assert _threads(a) == 1
    with turnkeeper.open_store(path, read_only=True) as ro:
        assert _threads(ro) == 1


def _configured(settings: tuple[tuple[str, str, str], ...], monkeypatch) -> int:
    """``threads`` on a DuckDB connection opened with 4 worker threads, once the
    store's configuration (``settings`` in its place) is applied to it."""
    monkeypatch.setattr(dialect, "CONNECTION_SETTINGS", settings)
    con = duckdb.connect(config={"threads": 4})
    try:
        dialect.configure(con)
        row = con.execute("SELECT current_setting('threads')").fetchone()
        assert row is not None
        return int(row[0])
    finally:
        con.close()


def test_the_configuration_sets_one_thread_whatever_the_default(monkeypatch):
    """Whatever DuckDB's default on this machine (one per core; on one core
    the default is already 1), the configuration sets one thread; the control,
    with the setting left out, keeps the connection's 4 (so the check above can
    fail)."""
    settings = dialect.CONNECTION_SETTINGS
    assert _configured(settings, monkeypatch) == 1
    without = tuple(s for s in settings if s[0] != dialect.THREADS[0])
    assert len(without) == len(settings) - 1
    assert _configured(without, monkeypatch) == 4


def test_readers_and_writers_on_many_threads_all_finish(tmp_path):
    """Eight threads, each appending to its own session and replaying it, all
    finish with every entry stored: one DuckDB thread does not serialize the
    callers' threads into one (each statement runs on its caller's)."""
    done: list[int] = []
    errors: list[BaseException] = []
    with turnkeeper.open_store(tmp_path / "s.duckdb") as store:

        def work(n: int) -> None:
            try:
                sid = f"s{n}"
                store.sessions.create(sid)
                for _ in range(5):
                    store.sessions.append(sid, EntryKind.MESSAGE, MSG)
                done.append(len(store.sessions.replay(sid).entry_ids))
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        pool = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in pool:
            t.start()
        for t in pool:
            t.join(timeout=60)
        assert not errors and done == [5] * 8


def _tiny(script: list[str], extra: dict[str, str]) -> str:
    """Run a report script at CI's tiny size on DuckDB alone; its stdout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TURNKEEPER_TEST_PG"}
    env.update({"TURNKEEPER_BENCH_REPS": "1", "TURNKEEPER_BENCH_SECONDS": "0.01", **extra})
    reports = Path(__file__).resolve().parents[2] / "reports"
    done = subprocess.run(
        [sys.executable, str(reports / script[0]), *script[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_turn_profile_runs_at_a_tiny_size():
    """reports/duck_turn_profile.py (the figures of docs/duckdb-turn-profile.md)
    runs at a tiny size: a row per statement of the turn (as many as it counts), each
    with DuckDB's own profile read (numbers, not NaN: the profiler was on), the
    by-hand rows and the before/after pairs. Sizes are CI's, figures not asserted."""
    out = _tiny(
        ["duck_turn_profile.py"],
        {"TURNKEEPER_PROFILE_TURNS": "2", "TURNKEEPER_PROFILE_WARM": "2"},
    )
    rows = [line for line in out.splitlines() if line.startswith("| ") and "`" in line]
    total = re.search(r"^\| sum \|.* (\d+) statements \|$", out, re.MULTILINE)
    assert total is not None and len(rows) == int(total[1]) >= 15, out
    assert all("nan" not in row for row in rows), out
    assert "| the same rows by hand, threads = 1 |" in out
    assert "threads = 1 / default threads, turn by turn (4 pairs" in out
    assert "| delivery_operations | 23 |" in out


def test_the_turn_rows_run_at_a_tiny_size():
    """``reports/bench.py turn`` prints the DuckDB turn and, beside it, the same
    turn at DuckDB's default threads with the ratio of the two."""
    out = _tiny(["bench.py", "turn"], {})
    assert "duckdb: turn, 3 transactions" in out, out
    assert re.search(r"statements \d+ \(admit_run \d+ / append_many \d+ / finish_run \d+\)", out)
    assert "the same turn at DuckDB's default threads (before threads = 1)" in out, out
