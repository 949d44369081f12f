"""Conformance: runtime-lease authority (session seed AcquireExecutionAdmission …,
ValidateRuntimeLease, BindRuntimeLeaseToExistingRun, RetainRuntimeLease).

A runtime lease names a session that exists; ``runs.admit`` admits only under
an ``admission`` or ``execution`` lease; ``leases.validate`` checks the run a
lease is bound to and its purpose; ``leases.bind_run`` promotes a recovery
lease to ``execution`` on the session's active run; a guard's ``retain``
keeps the lease held past the guard's own release.
"""

from __future__ import annotations

import pytest

from turnkeeper import (
    InvalidInputError,
    LeaseLostError,
    LeasePurposeError,
    RecoveryNotNeededError,
    RuntimeLeaseGuard,
    RuntimeLeaseRunMismatchError,
    RuntimeSessionNotFoundError,
    SessionRecoveryRequiredError,
)
from turnkeeper.storage.ops import leases as lease_ops
from turnkeeper.storage.ops import run_admission as run_ops

USER = {"role": "user", "content": "go"}


def count(store, table: str) -> int:
    return store.query(f"SELECT count(*) AS n FROM {table}").to_pylist()[0]["n"]


def orphaned(store, sid: str = "s"):
    """A started run of ``sid`` whose worker's lease was released (an orphan)."""
    store.sessions.create(sid)
    worker = store.leases.acquire(f"session:{sid}", "w", 600, purpose="execution")
    run = store.runs.admit(sid, {"q": 1}, user_message=USER, lease=worker, start=True)
    store.leases.release(worker)
    return worker, run


# -- acquire ----------------------------------------------------------------------------


@pytest.mark.parametrize("purpose", ["admission", "execution", "recovery", "mutation", "fork"])
def test_a_lease_on_a_missing_session_is_refused_for_every_purpose(store, purpose):
    with pytest.raises(RuntimeSessionNotFoundError) as caught:
        store.leases.acquire("session:ghost", "w", 30, purpose=purpose)
    assert caught.value.session_id == "ghost"
    assert count(store, "leases") == 0 and count(store, "lease_events") == 0
    # other targets have no session to find
    assert store.leases.acquire("job:ghost", "w", 30, purpose=purpose).epoch == 1


def test_the_missing_session_check_fails_with_it_patched_out(store, monkeypatch):
    monkeypatch.setattr(lease_ops, "admission_check", lambda *args: None)
    assert store.leases.acquire("session:ghost", "w", 30).epoch == 1  # granted: a defect


@pytest.mark.parametrize("purpose", ["admission", "execution", "mutation", "fork"])
def test_an_idle_session_purpose_is_refused_on_a_session_with_an_orphan(store, purpose):
    worker, run = orphaned(store)
    events = count(store, "lease_events")
    with pytest.raises(SessionRecoveryRequiredError) as caught:
        store.leases.acquire("session:s", "other", 30, purpose=purpose)
    assert (caught.value.session_id, caught.value.run_id) == ("s", run.id)
    assert count(store, "lease_events") == events  # nothing granted
    store.runs.finish(run.id, "failed", error="x")  # nobody holds it: ended without a lease
    assert store.leases.acquire("session:s", "other", 30, purpose=purpose).epoch == worker.epoch + 1


def test_the_holder_re_acquiring_beside_its_own_run_is_not_refused(store):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 30, purpose="execution")
    store.runs.admit("s", {"q": 1}, lease=lease, start=True)
    again = store.leases.acquire("session:s", "w", 30, purpose="execution")
    assert (again.epoch, again.token) == (lease.epoch, lease.token)


def test_a_recovery_lease_needs_the_orphan_it_names(store):
    store.sessions.create("idle")
    with pytest.raises(RecoveryNotNeededError):
        store.leases.acquire("session:idle", "r", 30, purpose="recovery")
    _, run = orphaned(store)
    with pytest.raises(RuntimeLeaseRunMismatchError) as caught:
        store.leases.acquire("session:s", "r", 30, purpose="recovery", run_id="another")
    assert (caught.value.run_id, caught.value.active_run_id) == ("another", run.id)
    lease = store.leases.acquire("session:s", "r", 30, purpose="recovery", run_id=run.id)
    assert store.recovery.begin(run.id, lease).state == "recovering"
    with pytest.raises(InvalidInputError):
        store.leases.acquire("session:s", "r", 30, purpose="mutation", run_id=run.id)


def test_the_idle_check_fails_with_it_patched_out(store, monkeypatch):
    orphaned(store)
    real = lease_ops.admission_check

    def session_only(tx, target, purpose, granting, run_id):
        real(tx, target, purpose, False, run_id)  # as if every acquire were a re-acquire

    monkeypatch.setattr(lease_ops, "admission_check", session_only)
    lease = store.leases.acquire("session:s", "other", 30, purpose="mutation")
    assert lease.epoch == 2  # granted beside an orphan: the defect


# -- admit --------------------------------------------------------------------------------


@pytest.mark.parametrize("purpose", ["mutation", "fork", "recovery"])
def test_admit_refuses_a_lease_of_a_non_admitting_purpose(store, purpose):
    store.sessions.create("s")
    if purpose == "recovery":
        _, run = orphaned(store, "o")
        lease = store.leases.acquire("session:o", "r", 30, purpose="recovery")
        store.runs.finish(run.id, "failed", error="gone", lease=lease)
        sid = "o"
    else:
        lease = store.leases.acquire("session:s", "w", 30, purpose=purpose)
        sid = "s"
    runs_before = count(store, "runs")
    with pytest.raises(LeasePurposeError) as caught:
        store.runs.admit(sid, {"q": 1}, user_message=USER, lease=lease)
    assert (caught.value.held_purpose, caught.value.requested_purpose) == (purpose, "admission")
    assert count(store, "runs") == runs_before


@pytest.mark.parametrize("purpose", ["admission", "execution"])
def test_admit_under_an_admitting_lease_binds_the_run_to_it(store, purpose):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 30, purpose=purpose)
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease)
    store.leases.validate(lease, run_id=run.id, purpose=purpose)


def test_the_admit_purpose_check_fails_with_it_patched_out(store, monkeypatch):
    monkeypatch.setattr(run_ops, "ADMITTING", frozenset(run_ops.LeasePurpose))
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 30, purpose="mutation")
    assert store.runs.admit("s", {"q": 1}, lease=lease).status == "admitted"  # a defect


# -- validate ------------------------------------------------------------------------------


def test_validate_checks_the_purpose(store):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 30, purpose="mutation")
    store.leases.validate(lease, purpose="mutation")
    with pytest.raises(LeasePurposeError) as caught:
        store.leases.validate(lease, purpose="execution")
    assert (caught.value.held_purpose, caught.value.requested_purpose) == ("mutation", "execution")


def test_validate_checks_the_run_the_lease_is_bound_to(store):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 30, purpose="execution")
    with pytest.raises(RuntimeLeaseRunMismatchError) as idle:
        store.leases.validate(lease, run_id="nope")
    assert (idle.value.run_id, idle.value.active_run_id) == ("nope", None)
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease, start=True)
    store.leases.validate(lease, run_id=run.id, purpose="execution")
    with pytest.raises(RuntimeLeaseRunMismatchError) as other:
        store.leases.validate(lease, run_id="nope")
    assert (other.value.run_id, other.value.active_run_id) == ("nope", run.id)
    store.runs.finish(run.id, "succeeded", lease=lease)
    with pytest.raises(RuntimeLeaseRunMismatchError) as ended:
        store.leases.validate(lease, run_id=run.id)
    assert ended.value.active_run_id is None


def test_a_run_admitted_under_an_earlier_epoch_is_not_bound_to_a_new_lease(store):
    worker, run = orphaned(store)
    recovery = store.leases.acquire("session:s", "r", 30, purpose="recovery")
    assert recovery.epoch == worker.epoch + 1
    with pytest.raises(RuntimeLeaseRunMismatchError) as caught:
        store.leases.validate(recovery, run_id=run.id)
    assert caught.value.active_run_id == run.id and "epoch" in str(caught.value)


def test_the_run_check_fails_with_it_patched_out(store, monkeypatch):
    monkeypatch.setattr(lease_ops, "check_bound", lambda tx, lease, run_id, purpose: None)
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 30, purpose="mutation")
    store.leases.validate(lease, run_id="nope", purpose="execution")  # passes: a defect


def test_validate_still_fences_first(store):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 30, purpose="execution")
    store.leases.release(lease)
    with pytest.raises(LeaseLostError):
        store.leases.validate(lease, run_id="x", purpose="execution")


# -- bind_run ------------------------------------------------------------------------------


def test_bind_run_promotes_a_recovery_lease_to_execution_on_the_active_run(store):
    _, run = orphaned(store)
    recovery = store.leases.acquire("session:s", "r", 30, purpose="recovery")
    bound = store.leases.bind_run(recovery, run.id)
    assert (bound.target, bound.owner, bound.epoch, bound.purpose) == (
        recovery.target,
        recovery.owner,
        recovery.epoch,
        "execution",
    )
    assert bound.token != recovery.token
    store.leases.validate(bound, run_id=run.id, purpose="execution")
    assert store.runs.get(run.id).status == "running"  # the run itself is untouched
    with pytest.raises(LeaseLostError):  # the recovery lease no longer fences
        store.leases.validate(recovery)
    assert store.runs.finish(run.id, "succeeded", lease=bound).status == "succeeded"


def test_bind_run_refuses_a_run_that_is_not_the_sessions_active_one(store):
    _, run = orphaned(store)
    recovery = store.leases.acquire("session:s", "r", 30, purpose="recovery")
    with pytest.raises(RuntimeLeaseRunMismatchError) as caught:
        store.leases.bind_run(recovery, "another-run")
    assert (caught.value.run_id, caught.value.active_run_id) == ("another-run", run.id)
    store.runs.finish(run.id, "failed", error="x", lease=recovery)
    with pytest.raises(RuntimeLeaseRunMismatchError) as ended:
        store.leases.bind_run(recovery, run.id)
    assert ended.value.active_run_id is None
    store.leases.validate(recovery, purpose="recovery")  # nothing was changed


@pytest.mark.parametrize("purpose", ["mutation", "fork"])
def test_bind_run_refuses_a_mutation_or_fork_lease(store, purpose):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 30, purpose=purpose)
    with pytest.raises(LeasePurposeError):
        store.leases.bind_run(lease, "r")
    store.leases.validate(lease, purpose=purpose)


def test_bind_run_of_a_lost_lease_is_refused(store):
    _, run = orphaned(store)
    recovery = store.leases.acquire("session:s", "r", 30, purpose="recovery")
    store.leases.release(recovery)
    with pytest.raises(LeaseLostError):
        store.leases.bind_run(recovery, run.id)


# -- the guard: bind_run and retain ------------------------------------------------------


def test_a_guard_adopts_the_lease_bind_run_promotes(store):
    _, run = orphaned(store)
    with RuntimeLeaseGuard.acquire(store, "session:s", "r", 30, purpose="recovery") as guard:
        bound = guard.bind_run(run.id)
        assert guard.lease == bound
        guard.check(run_id=run.id, purpose="execution")
        store.runs.finish(run.id, "succeeded", lease=guard.lease)


def test_a_retained_lease_outlives_the_guards_release(store):
    store.sessions.create("s")
    guard = RuntimeLeaseGuard.acquire(store, "session:s", "w", 30, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=guard.lease, start=True)
    kept = guard.retain(run.id)
    assert guard.retained == 1
    assert guard.release() is False  # the retained reference keeps it
    store.leases.validate(kept.lease, run_id=run.id, purpose="execution")
    store.runs.finish(run.id, "succeeded", lease=kept.lease)
    assert kept.release() is True  # the last reference releases the lease
    assert guard.closed and kept.release() is False
    with pytest.raises(LeaseLostError):
        store.leases.validate(kept.lease)


def test_retain_checks_the_run_and_the_purpose(store):
    store.sessions.create("s")
    with RuntimeLeaseGuard.acquire(store, "session:s", "w", 30, purpose="admission") as guard:
        run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=guard.lease)
        with pytest.raises(LeasePurposeError):
            guard.retain(run.id)
        guard.bind_run(run.id)
        with pytest.raises(RuntimeLeaseRunMismatchError):
            guard.retain("another-run")
        with guard.retain(run.id):
            assert guard.retained == 1
        assert guard.retained == 0
    assert guard.closed
