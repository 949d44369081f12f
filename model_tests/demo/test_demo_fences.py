"""The demo's workers, recovery coordinators and outbox workers count a fence that
refused them as fenced, on every path, never as an unexpected error.

On a loaded machine any lease or claim can expire between two calls of its
holder. Each test here makes that happen deterministically: the store runs on
an injected clock, and one store method is wrapped so that, just before its
first call, the clock jumps past the holder's TTL (and, in the ``taken over``
variants, another service acts on what was left: recovery converges the run,
another outbox worker claims and delivers the operation). The call must be
refused by its fence, and the service must record that as a fence that worked.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import turnkeeper
from turnkeeper.cli.demo import _drain
from turnkeeper.cli.fleet import FleetConfig, Worker, reply_plan
from turnkeeper.cli.fleet_services import (
    Faults,
    OutboxWorker,
    RecoveryCoordinator,
    ServiceStats,
)
from turnkeeper.cli.main import cli
from turnkeeper.fuzz import FakeClock
from turnkeeper.storage.audit import run_audit

TTL_S = 2.0
SID = "demo-0-0"
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "[m] Done."}]}
"""A run's reply carrying the marker ``m`` its delivery plan names (as the demo's do)."""
NO_FAULTS = Faults(transient=0.0, permanent=0.0, uncertain=0.0, stall=0.0, repeat_ack=0.0)


def _jump_before_first_call(
    store: turnkeeper.DuckDBStore,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    clock: FakeClock,
    stop: threading.Event,
    meanwhile: Callable[[], None] = lambda: None,
) -> list[BaseException | None]:
    """Wrap ``store.<area>.<method>`` (``method`` names both): its first call
    first moves the clock past the TTL and runs ``meanwhile``; every call sets
    ``stop`` once it returns or raises (so a service loop ends after the
    iteration). Returns a list that receives what the first call raised
    (``None`` when it returned)."""
    area_name, name = method.split(".")
    area = getattr(store, area_name)
    real = getattr(area, name)
    outcome: list[BaseException | None] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        first = not outcome
        if first:
            outcome.append(None)
            clock.advance(TTL_S + 1)
            meanwhile()
        try:
            return real(*args, **kwargs)
        except BaseException as exc:
            if first:
                outcome[0] = exc
            raise
        finally:
            stop.set()

    monkeypatch.setattr(area, name, wrapped)
    return outcome


# -- workers -----------------------------------------------------------------------------

WORKER_FENCED = [
    "runs.admit",
    "runs.start",
    "tools.claim",
    "sessions.append",
    "tools.complete",
    "leases.renew",
    "runs.finish",
    "threads.finalize",
]
"""Every store call a worker makes under its session lease."""


@pytest.mark.parametrize("recovered", [False, True], ids=["expired", "taken over"])
@pytest.mark.parametrize("method", WORKER_FENCED)
def test_a_worker_counts_its_lost_lease_as_fenced(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, method: str, recovered: bool
) -> None:
    cfg = FleetConfig(
        workers=1,
        sessions=1,
        seed=0,
        ttl_s=TTL_S,
        stall_p=0.0,
        abandon_p=0.0,
        crash_p=0.0,
        tool_p=1.0,  # every iteration is a full turn with a tool call
        model_change_p=0.0,
    )
    with turnkeeper.open_store(":memory:", clock=clock) as store:
        store.sessions.create(SID)
        stop = threading.Event()
        recovery = RecoveryCoordinator(store, threading.Event(), ServiceStats(), TTL_S)
        worker = Worker(store, 0, cfg, [SID], "r0", float("inf"), stop)
        meanwhile = recovery.step if recovered else (lambda: None)
        outcome = _jump_before_first_call(store, monkeypatch, method, clock, stop, meanwhile)
        worker.run()
        assert outcome and isinstance(outcome[0], turnkeeper.LeaseLostError), outcome
        assert worker.stats.errors == []
        assert worker.stats.lost_mid_turn == 1
        assert worker.stats.iterations == 1
        s = worker.stats
        checks = run_audit(
            store, [SID], refused_markers=s.refused_markers, refused_records=s.refused_records
        )
        assert all(c.passed for c in checks), [c for c in checks if not c.passed]


# -- recovery coordinators -----------------------------------------------------------------

RECOVERY_FENCED = [
    "recovery.begin",
    "tools.interrupt",
    "recovery.converge",
]
"""Every store call a recovery coordinator makes under its recovery lease."""


@pytest.mark.parametrize("method", RECOVERY_FENCED)
def test_a_recovery_coordinator_counts_its_lost_lease_as_fenced(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, method: str
) -> None:
    with turnkeeper.open_store(":memory:", clock=clock) as store:
        store.sessions.create(SID)
        lease = store.leases.acquire(f"session:{SID}", "w", TTL_S, purpose="execution")
        run = store.runs.admit(SID, {"prompt": "x"}, lease=lease)
        store.runs.start(run.id, lease=lease)
        clock.advance(TTL_S + 1)  # the worker crashed: its run is an orphan
        stop = threading.Event()
        coordinator = RecoveryCoordinator(store, stop, ServiceStats(), TTL_S)
        outcome = _jump_before_first_call(store, monkeypatch, method, clock, stop)
        coordinator.run()
        assert outcome and isinstance(outcome[0], turnkeeper.LeaseLostError), outcome
        assert coordinator.stats.errors == []
        assert coordinator.stats.recovery_lost == 1
        assert coordinator.stats.recoveries_converged == 0


# -- outbox workers ----------------------------------------------------------------------

OUTBOX_FENCED = [
    ("outbox.requeue", Faults(transient=1.0), False),
    ("outbox.update_progress", NO_FAULTS, True),
    ("outbox.finish", NO_FAULTS, False),
    ("outbox.finish", Faults(transient=0.0, permanent=1.0), False),
    ("outbox.finish", Faults(transient=0.0, permanent=0.0, uncertain=1.0), False),
]
"""Every store call an outbox worker makes under its claim: (method, faults, upload first)."""


@pytest.mark.parametrize("taken_over", [False, True], ids=["expired", "taken over"])
@pytest.mark.parametrize(("method", "faults", "attachment"), OUTBOX_FENCED)
def test_an_outbox_worker_counts_its_lost_claim_as_fenced(
    monkeypatch: pytest.MonkeyPatch,
    clock: FakeClock,
    method: str,
    faults: Faults,
    attachment: bool,
    taken_over: bool,
) -> None:
    with turnkeeper.open_store(":memory:", clock=clock) as store:
        store.sessions.create(SID)
        run = store.runs.admit(SID, {"prompt": "x"})
        store.runs.start(run.id)
        store.runs.finish(  # as the demo does: the reply the plan names, carrying its marker
            run.id,
            "succeeded",
            assistant_message=REPLY,
            delivery_plan=reply_plan(SID, run, "m", with_attachment=attachment),
        )
        stop = threading.Event()
        worker = OutboxWorker(store, stop, ServiceStats(), 0, 0, TTL_S, faults)
        other = OutboxWorker(store, threading.Event(), ServiceStats(), 1, 0, TTL_S, NO_FAULTS)
        meanwhile = (lambda: other.step() and None) if taken_over else (lambda: None)
        outcome = _jump_before_first_call(store, monkeypatch, method, clock, stop, meanwhile)
        worker.run()
        assert outcome and isinstance(outcome[0], turnkeeper.DeliveryLeaseLostError), outcome
        assert worker.stats.errors == []
        assert worker.stats.claims == 1
        assert worker.stats.claims_lost == 1
        s = worker.stats
        assert (s.delivered, s.requeued, s.failed, s.uncertain) == (0, 0, 0, 0)
        if taken_over:
            assert other.stats.claims == 1 and other.stats.errors == []


# -- the drain and the times the demo reports --------------------------------------------------


def test_the_drain_ends_when_only_operations_blocked_for_good_are_left(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """A ``send`` whose ``upload`` failed is never claimable: the drain must not wait
    for it (it used to run to its limit, adding seconds to every demo)."""
    with turnkeeper.open_store(":memory:", clock=clock) as store:
        store.sessions.create(SID)
        run = store.runs.admit(SID, {"prompt": "x"})
        store.runs.start(run.id)
        plan = reply_plan(SID, run, "m", with_attachment=True)
        store.runs.finish(run.id, "succeeded", assistant_message=REPLY, delivery_plan=plan)
        (upload,) = store.outbox.list_due()
        claim = store.outbox.claim(upload.id, "w", TTL_S)
        store.outbox.finish(upload.id, "w", claim.lease_epoch, "failed", failure_code="gone")
        queries: list[str] = []
        real_query = store.query

        def counting(sql: str, params: list[Any] | None = None) -> Any:
            queries.append(sql)
            return real_query(sql, params)

        monkeypatch.setattr(store, "query", counting)
        _drain(store, threading.Event(), 5.0)
        assert len(queries) == 1  # settled at the first look, not after polling to the limit


def test_the_demo_reports_fleet_and_drain_time_apart(tmp_path: Path) -> None:
    args = ["demo", "--db", str(tmp_path / "t.duckdb"), "--duration", "1", "--workers", "2"]
    args += ["--sessions", "2", "--seed", "4"]
    as_json = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert as_json.exit_code == 0, as_json.output
    f = json.loads(as_json.stdout)
    assert f["duration_s"] == 1.0
    assert f["fleet_s"] > 0 and f["drain_s"] >= 0
    assert abs(f["fleet_s"] + f["drain_s"] - f["elapsed_s"]) < 0.002
    table = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert table.exit_code == 0, table.output
    title = table.stdout.splitlines()[0]
    assert " s fleet + " in title and " s drain" in title, title
