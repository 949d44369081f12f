"""A demo that did no work fails, its clock starts when its units are ready, and
its figures count every process.

Tried as a new user would, ``turnkeeper demo --db postgresql://… --duration 20``
on a loaded machine admitted 0 runs in 0 iterations, passed every audit check
and exited 0: its deadline was set before the worker processes were spawned,
and they were still starting when it passed. Its figures counted only the
parent process (``store_operations: 1``). The fleet now starts its clock once
every unit has opened its store, runs past ``--duration`` until it committed
``--min-turns`` turns (1 by default; the check ``fleet_did_work`` fails when
it cannot), adds every process's statement counts to the figures, and drains
for as long as the services make progress.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from conftest import new_pg_schema

import turnkeeper
from turnkeeper.cli import demo
from turnkeeper.cli.fleet import FleetConfig, Plan, Worker
from turnkeeper.cli.main import cli


def _idle_iteration(self: Worker, it: int, sid: str, plan: Plan) -> None:
    """A worker that gets nowhere: every iteration is refused as busy."""
    self.stats.busy_refusals += 1
    self.stop.wait(0.001)


def _failed(figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in figures["audit"] if not c["passed"]}


def test_a_fleet_that_commits_no_turn_fails_its_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every worker iterates and none commits a turn: the fleet is stopped once
    it made no progress for STALLED_FLEET_S past its duration (patched short),
    and the demo fails ``fleet_did_work`` (it passed every check and exited 0)."""
    monkeypatch.setattr(Worker, "_iteration", _idle_iteration)
    monkeypatch.setattr(demo, "STALLED_FLEET_S", 0.2, raising=False)
    cfg = FleetConfig(workers=2, sessions=2, duration_s=0.1, seed=3)
    with turnkeeper.open_store(str(tmp_path / "idle.duckdb")) as store:
        figures = demo.run_fleet(store, cfg, None)
    assert figures["iterations"] > 0 and figures["turns_committed"] == 0
    assert figures["audit_passed"] is False
    failed = _failed(figures)
    assert set(failed) == {"fleet_did_work"}
    assert (failed["fleet_did_work"]["violations"], failed["fleet_did_work"]["checked"]) == (1, 0)
    args = ["demo", "--db", str(tmp_path / "idle-cli.duckdb"), "--duration", "0.1"]
    result = CliRunner().invoke(cli, [*args, "--workers", "1", "--sessions", "1"])
    assert result.exit_code == 1, result.output
    assert "audit: fleet_did_work" in result.stdout and "FAIL" in result.stdout


def test_the_fleet_runs_past_its_duration_until_it_committed_min_turns(tmp_path: Path) -> None:
    """A duration too short for any turn: the workers go on until the fleet
    committed ``min_turns`` (work, not time, ends it)."""
    cfg = FleetConfig(workers=2, sessions=2, duration_s=0.001, seed=4, min_turns=8)
    with turnkeeper.open_store(str(tmp_path / "short.duckdb")) as store:
        figures = demo.run_fleet(store, cfg, None)
    assert figures["turns_committed"] >= 8
    assert figures["audit_passed"] is True, _failed(figures)
    assert figures["statements"]["finish_run"]["calls"] >= figures["turns_committed"]


class _Scripted:
    """A store whose drain query answers the counts of ``left``, one per look."""

    def __init__(self, left: list[int]) -> None:
        self.left = left
        self.looks = 0

    def query(self, sql: str, params: Any = None) -> Any:
        n = self.left[min(self.looks, len(self.left) - 1)]
        self.looks += 1
        return pa.table({"n": [n]})


def test_the_drain_goes_on_while_the_services_make_progress() -> None:
    """Each look finds less left: the drain goes on however long that takes (with
    no quiet time allowed at all), and ends when nothing is left. It used to stop
    at a fixed limit, leaving a loaded machine's orphans unconverged."""
    store = _Scripted([5, 4, 3, 2, 1, 0])
    assert demo._drain(store, threading.Event(), 0.0) == 0  # type: ignore[arg-type]
    assert store.looks == 6


def test_the_drain_gives_up_once_the_services_stop_making_progress() -> None:
    store = _Scripted([3, 2, 2, 2])
    assert demo._drain(store, threading.Event(), 0.0) == 2  # type: ignore[arg-type]
    assert store.looks == 3


@pytest.mark.postgres
def test_a_process_fleet_slower_to_start_than_its_duration_runs_and_counts_every_process() -> None:
    """On PostgreSQL the workers are spawned processes, which take far longer to
    start than this duration (a fresh interpreter imports turnkeeper and
    connects): the fleet still runs (its clock starts once they are ready), and
    the statement figures are the workers' and services', not the parent's
    alone. Before: 0 iterations, and an audit that passed."""
    url = new_pg_schema()
    args = ["--duration", "0.05", "--workers", "2", "--sessions", "2", "--seed", "6", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "turnkeeper.cli.main", "demo", "--db", url, *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stderr, done.stdout[-3000:])
    f = json.loads(done.stdout)
    assert f["iterations"] >= 1 and f["turns_committed"] >= 1, f
    assert f["startup_s"] > 0
    statements = f["statements"]
    assert statements["admit_run"]["calls"] >= f["runs_admitted"] >= 1
    assert statements["finish_run"]["calls"] >= f["turns_committed"]
    assert statements["acquire_lease"]["calls"] >= f["runs_admitted"]
    assert statements["list_orphaned_runs"]["calls"] >= 1  # the recovery coordinators'
    assert statements["list_due_deliveries"]["calls"] >= 1  # the outbox workers'
    assert f["store_operations"] == sum(int(s["calls"]) for s in statements.values())
