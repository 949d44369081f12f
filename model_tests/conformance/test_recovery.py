"""Crash recovery: orphans, recovery leases, convergence, failure backoff, the issue's scenarios."""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta

import pytest

import turnkeeper
from turnkeeper import (
    BusyError,
    InvalidTransitionError,
    LeaseLostError,
    LeasePurposeError,
    RecoveryNotNeededError,
    SessionRecoveryRequiredError,
)
from turnkeeper.storage.audit import run_audit

USER = {"role": "user", "content": "go"}


def admitted(store, sid: str = "s", lease=None):
    if store.sessions.get(sid) is None:
        store.sessions.create(sid)
    run = store.runs.admit(sid, {"q": sid}, user_message=USER, lease=lease)
    store.runs.start(run.id, lease=lease)
    return run


def recovery_lease(store, sid: str = "s", owner: str = "rec", ttl: float = 5):
    return store.leases.acquire(f"session:{sid}", owner, ttl, purpose="recovery")


def test_a_run_admitted_without_any_lease_is_an_orphan(store):
    run = admitted(store)
    assert [o.id for o in store.recovery.list_orphans()] == [run.id]


def test_recovery_never_touches_a_run_whose_worker_holds_a_live_lease(store, clock):
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "worker", 10, purpose="execution")
    run = admitted(store, lease=worker)
    assert store.recovery.list_orphans() == []
    with pytest.raises(BusyError):
        recovery_lease(store)
    clock.advance(5)
    assert store.recovery.list_orphans() == []
    done = store.runs.finish(run.id, "succeeded", lease=worker)
    assert done.status == "succeeded"


def test_expired_worker_waking_after_takeover_is_refused_and_the_newer_state_survives(store, clock):
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "worker", 1, purpose="execution")
    run = admitted(store, lease=worker)
    clock.advance(2)
    rec_lease = recovery_lease(store)
    store.recovery.begin(run.id, rec_lease)
    store.recovery.converge(run.id, rec_lease, error="worker lost")
    with pytest.raises(LeaseLostError):
        store.runs.finish(
            run.id, "succeeded", lease=worker, assistant_message=USER | {"role": "assistant"}
        )
    final = store.runs.get(run.id)
    assert final.status == "interrupted" and final.error == "worker lost"
    assert run.assistant_entry_id not in [e.id for e in store.sessions.entries("s")]


def test_convergence_is_atomic_and_closes_the_turn(store, clock):
    run = admitted(store)
    lease = recovery_lease(store)
    store.recovery.begin(run.id, lease)
    done = store.recovery.converge(run.id, lease, stop_reason="process lost")
    assert done.state == "completed" and done.completed_at is not None
    assert store.runs.get(run.id).status == "interrupted"
    assert store.sessions.entries("s")[-1].id == f"{run.id}:turn-end"
    assert store.runs.active("s") is None and store.recovery.list_orphans() == []
    turns = store.query("SELECT status FROM conversation_turns").to_pylist()
    assert turns == [{"status": "interrupted"}]


def test_a_cancel_requested_run_converges_to_cancelled(store):
    run = admitted(store)
    store.runs.request_cancel(run.id)
    lease = recovery_lease(store)
    store.recovery.begin(run.id, lease)
    store.recovery.converge(run.id, lease)
    assert store.runs.get(run.id).status == "cancelled"


def test_a_pass_over_a_run_that_already_succeeded_leaves_it_succeeded(store):
    run = admitted(store)
    lease = recovery_lease(store)  # taken while the run was an orphan
    store.runs.finish(run.id, "succeeded", lease=lease)  # then its result arrived
    assert store.recovery.list_orphans() == []
    with pytest.raises(RecoveryNotNeededError):
        store.recovery.begin(run.id, lease)
    assert store.runs.get(run.id).status == "succeeded"
    store.leases.release(lease)
    with pytest.raises(RecoveryNotNeededError):  # nor is a recovery lease granted now
        recovery_lease(store)


def test_a_run_finished_during_recovery_keeps_its_status(store):
    run = admitted(store)
    lease = recovery_lease(store)
    store.recovery.begin(run.id, lease)
    with pytest.raises(BusyError):  # without a lease, nobody ends a run under recovery
        store.runs.finish(run.id, "failed")
    store.runs.finish(run.id, "succeeded", lease=lease)  # the remote result arrived
    store.recovery.converge(run.id, lease)
    assert store.runs.get(run.id).status == "succeeded"


def test_two_recovery_workers_racing_for_one_orphan_produce_one_winner(real_store):
    run = admitted(real_store)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def worker(name: str) -> None:
        barrier.wait()
        try:
            lease = recovery_lease(real_store, owner=name)
            real_store.recovery.begin(run.id, lease)
            real_store.recovery.converge(run.id, lease)
            outcomes.append("won")
        except BusyError:
            outcomes.append("busy")

    threads = [threading.Thread(target=worker, args=(f"r{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["busy", "won"]
    events = real_store.query("SELECT edge FROM recovery_events ORDER BY occurred_at").to_pylist()
    assert [e["edge"] for e in events] == ["begin", "converge"]


def test_a_recovery_worker_that_dies_is_superseded_by_the_next_sweep(store, clock):
    run = admitted(store)
    first = recovery_lease(store, owner="r1", ttl=1)
    store.recovery.begin(run.id, first)
    clock.advance(2)  # r1 died holding nothing but an expired lease
    assert [o.id for o in store.recovery.list_orphans()] == [run.id]
    second = recovery_lease(store, owner="r2")
    taken = store.recovery.begin(run.id, second)
    assert (taken.attempt, taken.lease_epoch, taken.previous_lease_epoch) == (2, 2, 1)
    with pytest.raises(LeaseLostError):
        store.recovery.converge(run.id, first)
    store.recovery.converge(run.id, second)
    assert store.runs.get(run.id).status == "interrupted"


def test_failure_backs_off_then_dead_letters_at_the_cap(store, clock):
    run = admitted(store)
    for attempt in (1, 2):
        lease = recovery_lease(store, ttl=1000)
        assert store.recovery.begin(run.id, lease).attempt == attempt
        failed = store.recovery.fail(run.id, lease, "remote down", max_attempts=3, base_delay_s=10)
        delay = (failed.next_retry_at - clock.now).total_seconds()
        assert 10 * 2 ** (attempt - 1) <= delay <= 11 * 2 ** (attempt - 1)
        store.leases.release(lease)
        assert store.recovery.list_orphans() == []  # not due yet
        lease = recovery_lease(store)
        with pytest.raises(RecoveryNotNeededError):
            store.recovery.begin(run.id, lease)
        store.leases.release(lease)
        clock.advance(delay)
        assert [o.id for o in store.recovery.list_orphans()] == [run.id]
    lease = recovery_lease(store)
    store.recovery.begin(run.id, lease)
    dead = store.recovery.fail(run.id, lease, "still down", max_attempts=3)
    assert dead.state == "dead_lettered" and dead.last_error == "still down"
    store.leases.release(lease)
    clock.advance(timedelta(days=1).total_seconds())
    assert store.recovery.list_orphans() == []
    assert store.runs.get(run.id).status == "running"  # never revived nor ended silently


def test_detach_leaves_the_run_to_its_remote_owner(store):
    run = admitted(store)
    lease = recovery_lease(store)
    store.recovery.begin(run.id, lease)
    remote = turnkeeper.ResponseRun(
        "s", "bg", "openai", "responses", "queued", run.turn_id, response_id="r"
    )
    store.archives.save_run(remote, lease=lease)  # the run's remote owner, retained
    assert store.recovery.detach(run.id, lease).state == "detached"
    store.leases.release(lease)
    assert store.recovery.list_orphans() == [] and store.runs.get(run.id).status == "running"
    with pytest.raises(InvalidTransitionError):
        store.recovery.converge(run.id, recovery_lease(store, owner="other"))


def test_only_a_recovery_purpose_lease_on_the_runs_session_recovers(store):
    store.sessions.create("s")
    wrong_purpose = store.leases.acquire("session:s", "x", 5, purpose="execution")
    run = admitted(store, lease=wrong_purpose)
    with pytest.raises(LeasePurposeError):
        store.recovery.begin(run.id, wrong_purpose)
    store.leases.release(wrong_purpose)
    with pytest.raises(SessionRecoveryRequiredError):  # an orphan: only recovery takes it
        store.leases.acquire("session:s", "x", 5, purpose="execution")
    store.sessions.create("t")
    store.runs.admit("t", {"q": 1})  # a recovery lease needs an active run
    other = recovery_lease(store, "t")
    with pytest.raises(turnkeeper.InvalidInputError):
        store.recovery.begin(run.id, other)
    assert store.recovery.get(run.id) is None


def test_convergence_records_pending_decisions_before_the_terminal_event(store):
    run = admitted(store)
    lease = recovery_lease(store)
    store.recovery.begin(run.id, lease)
    decisions = [
        {"id": "approval-1", "resolution": "expired"},
        {"id": "approval-2", "resolution": "denied", "by": "recovery"},
    ]
    store.recovery.converge(run.id, lease, decisions=decisions)
    events = store.runs.events("s")
    assert [(e.edge, e.source, e.dest) for e in events] == [
        ("admit", "absent", "admitted"),
        ("start", "admitted", "running"),
        ("decision", "running", "running"),
        ("decision", "running", "running"),
        ("interrupt_running", "running", "interrupted"),
    ]
    assert [e.data for e in events[2:4]] == decisions
    assert events[2].id == f"{run.id}:decision:approval-1"


@pytest.mark.parametrize(
    ("decisions", "field"),
    [
        ("approval-1", "decisions"),
        ([["id", "x"]], "decisions[0]"),
        ([{"resolution": "expired"}], "decisions[0].id"),
        ([{"id": ""}], "decisions[0].id"),
        ([{"id": "a", "x": float("nan")}], "decisions[0]"),
        ([{"id": "a"}, {"id": "a"}], "decisions"),
    ],
)
def test_bad_decisions_are_refused_and_nothing_converges(store, decisions, field):
    run = admitted(store)
    lease = recovery_lease(store)
    store.recovery.begin(run.id, lease)
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        store.recovery.converge(run.id, lease, decisions=decisions)
    assert err.value.field == field
    assert store.runs.get(run.id).status == "running"
    assert store.recovery.get(run.id).state == "recovering"


def _race_finish_against_recovery(store, sid: str) -> dict[str, str]:
    store.sessions.create(sid)
    run = store.runs.admit(sid, {"sid": sid})
    store.runs.start(run.id)
    barrier = threading.Barrier(2)
    outcome: dict[str, str] = {}

    def finish() -> None:
        barrier.wait()
        try:
            store.runs.finish(run.id, "succeeded")
            outcome["finish"] = "ok"
        except (BusyError, InvalidTransitionError) as exc:
            outcome["finish"] = type(exc).__name__

    def recover() -> None:
        barrier.wait()
        try:  # a run already ended needs no recovery: the lease itself is refused
            store.recovery.begin(run.id, recovery_lease(store, sid))
            outcome["begin"] = "ok"
        except RecoveryNotNeededError:
            outcome["begin"] = "not needed"

    threads = [threading.Thread(target=finish), threading.Thread(target=recover)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcome


def _unserialized(store, monkeypatch) -> None:
    """Take DuckDB's in-process write serialization out of ``store`` (test-only:
    the write lock and the group commit's one leader at a time), so that its
    writes overlap and only the database's conflicts order them. PostgreSQL has
    no such lock: its writes always overlap."""
    if store.db.dialect.name == "duckdb":
        database = store.db

        def alone(item):  # no queue, no leader: each write runs at once on its thread
            database._alone(item)
            if item.error is not None:
                raise item.error
            return item.result

        monkeypatch.setattr(database, "_write_lock", contextlib.nullcontext())
        monkeypatch.setattr(database, "_grouped", alone)


@pytest.mark.parametrize("serialized", [True, False], ids=["write-lock", "conflicts-alone"])
def test_an_unleased_termination_racing_a_recovery_never_both_commit(
    real_store, monkeypatch, serialized
):
    """Write skew, closed twice: the store's writes are serialized in process, and
    without that lock the termination still checks (by writing) that nobody holds
    the session, and begin_recovery writes the run; so of a finish_run without a
    lease and a recovery that just took the session, exactly one proceeds.
    (DuckDB orders them by its write lock alone since its lease checks became
    reads: the control below shows both commit without that lock.)"""
    if not serialized:
        if real_store.db.dialect.serialized_writes:
            pytest.skip("DuckDB: the write lock is what orders these writes (see the control)")
        _unserialized(real_store, monkeypatch)
    outcomes = [_race_finish_against_recovery(real_store, f"race-{i}") for i in range(40)]
    assert all(o.keys() == {"finish", "begin"} for o in outcomes)
    assert not [o for o in outcomes if o == {"finish": "ok", "begin": "ok"}]


def test_the_race_test_fails_with_both_writes_turned_back_into_reads(real_store, monkeypatch):
    """Control for the write-skew test above: without the write lock, with the
    termination's lease check and begin_recovery's touch of the run both reads
    again, and without the grant's write of the session row, both commit."""
    from turnkeeper.storage.ops import leases, run_lifecycle

    def read_unheld(tx, target, lease):
        if lease is not None:
            leases.fence(tx, lease)
            return
        row = tx.one("SELECT owner, state, expires_at FROM leases WHERE target = ?", [target])
        if row is not None and row[1] == "held" and row[2] > tx.now:
            raise BusyError(target, row[0])

    def read_touch(tx, run):
        return tx.one("SELECT lease_epoch FROM runs WHERE id = ?", [run.id])[0]

    monkeypatch.setattr(leases, "fence_or_unheld", read_unheld)
    monkeypatch.setattr(run_lifecycle, "touch", read_touch)
    # and the grant's write of the session row (PostgreSQL), which meets the
    # termination's own write of it
    monkeypatch.setattr(leases, "touch_session", lambda tx, target: None)
    _unserialized(real_store, monkeypatch)
    outcomes = [_race_finish_against_recovery(real_store, f"skew-{i}") for i in range(40)]
    assert {"finish": "ok", "begin": "ok"} in outcomes


def test_convergence_writes_the_delivery_plan_with_the_run_end(store, clock):
    """A recovery notice is planned in the transaction that ends the run: a lease
    lost before convergence loses neither, one lost after loses nothing."""
    from turnkeeper import DeliveryPlan, DeliveryStep

    plan = DeliveryPlan("chat", "room", steps=(DeliveryStep("notice", "message"),))
    run = admitted(store)
    lease = recovery_lease(store)
    store.recovery.begin(run.id, lease)
    clock.advance(3600)
    with pytest.raises(turnkeeper.LeaseLostError):
        store.recovery.converge(run.id, lease, delivery_plan=plan)
    assert store.outbox.get_plan(f"{run.id}:delivery") is None
    assert store.runs.get(run.id).status == "running"
    lease = recovery_lease(store)
    store.recovery.begin(run.id, lease)
    store.recovery.converge(run.id, lease, delivery_plan=plan)
    _, operations = store.outbox.get_plan(f"{run.id}:delivery")
    assert store.runs.get(run.id).status == "interrupted"
    assert [o.key for o in operations] == ["notice"]


def test_a_run_that_succeeded_carries_no_error_on_any_path(store):
    """A finished run's outcome is final and says so: neither finish_run nor a
    recovery can end a run ``succeeded`` with an error (reports would list it
    under failure reasons)."""
    run = admitted(store)
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        store.runs.finish(run.id, "succeeded", error="abandoned by cleanup")
    assert err.value.field == "error"
    lease = recovery_lease(store)
    store.recovery.begin(run.id, lease)
    with pytest.raises(turnkeeper.InvalidInputError):
        store.recovery.converge(run.id, lease, status="succeeded", error="x")
    assert (store.runs.get(run.id).status, store.runs.get(run.id).error) == ("running", None)


@pytest.mark.postgres
def test_an_orphan_another_worker_holds_is_left_out_of_the_list_not_waited_for() -> None:
    """list_orphaned_runs on PostgreSQL: a run whose row another transaction
    holds (a worker recovering or ending it) is skipped, not waited for, and
    listed again once that transaction ends; the rest are listed meanwhile."""
    import psycopg
    from conftest import new_pg_schema

    where = new_pg_schema()
    with turnkeeper.open_store(where) as store:
        for sid in ("a", "b"):
            store.sessions.create(sid)
        held = store.runs.admit("a", {"q": 1})  # admitted without a lease: an orphan at once
        free = store.runs.admit("b", {"q": 1})
        assert {r.id for r in store.recovery.list_orphans()} == {held.id, free.id}
        with psycopg.connect(where) as other:
            other.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", [held.id])
            assert [r.id for r in store.recovery.list_orphans()] == [free.id]
        assert {r.id for r in store.recovery.list_orphans()} == {held.id, free.id}


# -- a completed tool's own result, unchanged and in call order (issue 17 item 3) -----------

BLOCKS = [{"type": "text", "text": "a.txt"}]


def _two_calls_first_completed(store, clock, result):
    """A worker's run makes calls c1 and c2, claims both, completes c1 with
    ``result`` and dies (its lease expires) before it writes any toolResult."""
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "worker", 5, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=worker, start=True)
    calls = [{"type": "toolCall", "id": c, "name": "ls", "arguments": {}} for c in ("c1", "c2")]
    store.sessions.append(
        "s", "message", {"message": {"role": "assistant", "content": calls}}, lease=worker
    )
    for call_id in ("c2", "c1"):  # claimed out of call order: the transcript's order decides
        store.tools.claim(
            f"{run.id}:{call_id}",
            "s",
            local_turn_id=run.turn_id,
            provider_call_id=call_id,
            tool_name="ls",
            side_effecting=False,
            run_id=run.id,
            lease=worker,
        )
    store.tools.complete(f"{run.id}:c1", result, lease=worker)
    clock.advance(6)  # the worker is gone
    return run


def _recover(store, run) -> list[dict]:
    (orphan,) = store.recovery.list_orphans()
    assert orphan.id == run.id
    rescue = recovery_lease(store)
    store.recovery.begin(run.id, rescue)
    store.recovery.converge(run.id, rescue, error="worker lost")
    return [m for m in store.sessions.replay("s").messages if m["role"] == "toolResult"]


def test_recovery_replays_a_completed_tools_own_content_blocks_in_call_order(store, clock):
    run = _two_calls_first_completed(store, clock, BLOCKS)
    first, second = _recover(store, run)
    assert (first["toolCallId"], second["toolCallId"]) == ("c1", "c2")
    assert first["content"] == BLOCKS  # what complete_tool_execution stored, unchanged
    assert first["isError"] is False and first["details"]["fromRecord"] is True
    assert second["isError"] is True and second["details"]["executionState"] == "interrupted"
    assert store.tools.get(f"{run.id}:c2").state == "interrupted"
    assert all(c.passed for c in run_audit(store))


@pytest.mark.parametrize(
    "result, content",
    [
        ("a.txt", [{"type": "text", "text": "a.txt"}]),
        (
            [{"type": "text", "text": "x"}, {"type": "image", "data": "AA==", "mimeType": "p"}],
            [{"type": "text", "text": "x"}, {"type": "image", "data": "AA==", "mimeType": "p"}],
        ),
        ({"stdout": "a.txt", "code": 0}, [{"type": "text", "text": '{"code":0,"stdout":"a.txt"}'}]),
        ([1, 2], [{"type": "text", "text": "[1,2]"}]),
        (None, [{"type": "text", "text": "null"}]),
    ],
    ids=["text", "blocks", "object", "list-of-values", "null"],
)
def test_a_recorded_result_keeps_every_value_it_was_given(store, clock, result, content):
    """Text and content blocks are the result's content as given; any other JSON
    value has no content form: its JSON is the text, and ``details.result``
    holds the value itself."""
    run = _two_calls_first_completed(store, clock, result)
    first, _ = _recover(store, run)
    assert first["content"] == content
    stored = store.tools.get(f"{run.id}:c1").result
    assert stored == result
    if isinstance(result, str) or result == content:
        assert "result" not in first["details"]
    else:
        assert first["details"]["result"] == result
