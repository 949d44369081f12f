"""Recovery consults the run's remote run record (session seed
MarkSessionRunRecoveryDetached: "records that a canonical remote record was
retained. The response record, not this marker, remains the evidence used to
decide whether the provider execution is still recoverable"), on every backend:

- ``recovery.detach`` needs the run's newest remote run record to name its
  response and provider and not to have ended (``RemoteRunNotRetainedError``
  otherwise, nothing written);
- a detached run stays out of ``list_orphans`` only while that record shows a
  live provider execution; once it ends (or is gone), the run is an orphan
  again and ``recovery.begin`` takes it (edge ``reclaim``) to converge it;
- ``ExecutionFacts.remote_run`` is that record (SessionExecutionFacts.RemoteRun).

Each guard has a control: the guard patched out (in the test only), the same
check fails.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from turnkeeper import (
    RecoveryNotNeededError,
    RemoteRunNotRetainedError,
    ResponseRun,
)
from turnkeeper.storage.ops import recovery as recovery_ops

USER = {"role": "user", "content": "go"}
T0 = datetime(2026, 4, 1, tzinfo=UTC)


def orphan(store: Any, sid: str = "s") -> Any:
    if store.sessions.get(sid) is None:
        store.sessions.create(sid)
    run = store.runs.admit(sid, {"q": sid}, user_message=USER)
    store.runs.start(run.id)
    return run


def remote(run: Any, state: str = "in_progress", **kw: Any) -> ResponseRun:
    """A remote run record linked to ``run`` (its ``local_turn_id`` is the run's turn id)."""
    kw.setdefault("local_turn_id", run.turn_id)
    kw.setdefault("response_id", "resp_1")
    return ResponseRun(run.session_id, kw.pop("local", "bg-1"), "openai", "openai-responses",
                       state, **kw)  # fmt: skip


def begun(store: Any, run: Any) -> Any:
    lease = store.leases.acquire(f"session:{run.session_id}", "rec", 30, purpose="recovery")
    store.recovery.begin(run.id, lease)
    return lease


def test_detach_needs_a_live_remote_run_record_and_then_parks_the_run(store):
    run = orphan(store)
    lease = begun(store, run)
    store.archives.save_run(remote(run, "queued"), lease=lease)
    detached = store.recovery.detach(run.id, lease)
    assert detached.state == "detached" and detached.completed_at is not None
    store.leases.release(lease)
    assert store.recovery.list_orphans() == []
    assert store.runs.get(run.id).status == "running"
    with pytest.raises(RecoveryNotNeededError):
        begun(store, run)  # the remote execution still owns it


REFUSED = {
    "no record": lambda run: None,
    "a record of another run": lambda run: remote(run, local_turn_id="other-run"),
    "a record whose turn id only starts with the run's id": lambda run: remote(
        run, local_turn_id=f"{run.id}x"
    ),
    "no response id": lambda run: remote(run, response_id=""),
    "no provider": lambda run: ResponseRun(
        run.session_id, "bg-1", " ", "openai-responses", "queued", run.id, response_id="r"
    ),
    "completed": lambda run: remote(run, "completed"),
    "cancelled": lambda run: remote(run, " Cancelled "),
    "expired": lambda run: remote(run, "expired"),
    "a newer ended record": lambda run: remote(
        run, "failed", local="bg-2", updated_at=T0 + timedelta(minutes=1)
    ),
}


def refusal(store: Any, case: str) -> None:
    """The detach of ``case`` is refused with RemoteRunNotRetainedError and writes
    nothing; AssertionError when it went through."""
    run = orphan(store)
    lease = begun(store, run)
    if case == "a newer ended record":
        store.archives.save_run(remote(run, updated_at=T0), lease=lease)
    record = REFUSED[case](run)
    if record is not None:
        store.archives.save_run(record, lease=lease)
    before = store.recovery.get(run.id)
    try:
        store.recovery.detach(run.id, lease)
    except RemoteRunNotRetainedError as err:
        assert err.run_id == run.id and err.reason
    else:
        raise AssertionError(f"detach with {case} went through")
    assert store.recovery.get(run.id) == before


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_detach_without_a_retained_remote_run_is_refused(store, case):
    refusal(store, case)


@pytest.mark.parametrize("case", ["no record", "completed", "no response id"])
def test_the_refusal_check_fails_with_the_remote_check_patched_out(store, case, monkeypatch):
    """Control: with the remote record check patched out, the detach goes through."""
    monkeypatch.setattr(recovery_ops, "not_retained", lambda remote: None)
    with pytest.raises(AssertionError, match="went through"):
        refusal(store, case)


def ended_remote_reopens(store: Any) -> None:
    """A detached run whose remote run ends is listed and recovered again, then
    converged; AssertionError when it stays parked."""
    run = orphan(store)
    lease = begun(store, run)
    store.archives.save_run(remote(run, "in_progress", created_at=T0), lease=lease)
    store.recovery.detach(run.id, lease)
    store.leases.release(lease)
    assert store.recovery.list_orphans() == []
    # the provider finished; a poller records it (nobody holds the session)
    store.archives.save_run(remote(run, "completed", updated_at=T0 + timedelta(minutes=1)))
    if [o.id for o in store.recovery.list_orphans()] != [run.id]:
        raise AssertionError("a detached run whose remote run ended stayed parked")
    again = begun(store, run)
    reopened = store.recovery.get(run.id)
    assert (reopened.state, reopened.attempt, reopened.completed_at) == ("recovering", 2, None)
    done = store.recovery.converge(run.id, again, status="succeeded")
    assert done.state == "completed" and store.runs.get(run.id).status == "succeeded"


def test_a_detached_run_whose_remote_run_ended_is_an_orphan_again(store):
    ended_remote_reopens(store)


def test_the_reopen_check_fails_with_the_evidence_patched_out(store, monkeypatch):
    """Control: with the remote record no longer consulted (a detached run counts
    as still owned), the run stays parked."""
    monkeypatch.setattr(recovery_ops, "remote_ended", lambda tx, run: False)
    with pytest.raises(AssertionError, match="stayed parked"):
        ended_remote_reopens(store)


def test_a_detached_run_whose_remote_record_is_gone_is_an_orphan_again(store):
    run = orphan(store)
    lease = begun(store, run)
    store.archives.save_run(remote(run), lease=lease)
    store.recovery.detach(run.id, lease)
    store.leases.release(lease)
    # the record is relinked elsewhere (another turn): the run has none any more
    store.archives.save_run(remote(run, local_turn_id="elsewhere"))
    assert [o.id for o in store.recovery.list_orphans()] == [run.id]


def test_execution_facts_carry_the_active_runs_newest_remote_run(store):
    store.sessions.create("s")
    assert store.sessions.execution_facts("s").remote_run is None
    run = orphan(store)
    assert store.sessions.execution_facts("s").remote_run is None
    store.archives.save_run(remote(run, local="bg-1", local_turn_id=run.id, updated_at=T0))
    newer = store.archives.save_run(remote(run, local="bg-2", updated_at=T0 + timedelta(seconds=1)))
    store.archives.save_run(remote(run, local="bg-3", local_turn_id="not-this-run"))
    facts = store.sessions.execution_facts("s")
    assert facts.remote_run == newer
    store.runs.finish(run.id, "succeeded", assistant_message={"role": "assistant", "content": "x"})
    assert store.sessions.execution_facts("s").remote_run is None  # no active run
