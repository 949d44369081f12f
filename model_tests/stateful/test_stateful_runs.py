"""Run the differential runs-and-recovery machine, and show its fences can fail:
each kill's stored counterexample is replayed (``by_hand``) on the patched
store, where it fails, and on the real one, where it passes; the search that
finds one from scratch runs on demand (``search``: ``HYPOTHESIS_PROFILE=nightly``)."""

from __future__ import annotations

import pytest
from by_hand import Steps, kill_tests, replay, search_test
from conftest import BACKENDS, STORES, machine_settings, opener
from hypothesis.stateful import run_state_machine_as_test

from turnkeeper.fuzz.runs import RunsAndRecoveryMachine, machine
from turnkeeper.spec import errors
from turnkeeper.spec.lease import LeasePurpose, session_target
from turnkeeper.storage.ops import recovery, run_admission, run_lifecycle


def on(backend: str) -> type[RunsAndRecoveryMachine]:
    """The machine on the test store configuration ``backend`` (``conftest.opener``)."""
    return machine(opener(backend))


@pytest.mark.parametrize("backend", STORES)
def test_runs_and_recovery_agree_with_the_oracle(backend: str) -> None:
    run_state_machine_as_test(on(backend), settings=machine_settings(backend))


def drop_finish_fence(mp: pytest.MonkeyPatch) -> None:
    real = run_lifecycle.finish

    def unfenced(tx, run_id, status, **kw):
        return real(tx, run_id, status, **{**kw, "lease": None})

    mp.setattr(run_lifecycle, "finish", unfenced)


def drop_recovery_fence(mp: pytest.MonkeyPatch) -> None:
    def guarded_without_fence(tx, run_id, lease):
        run = run_lifecycle.get(tx, run_id)
        if run is None:
            raise errors.RunNotFoundError(run_id)
        if lease.target != session_target(run.session_id):
            raise errors.InvalidInputError("lease", "wrong session")
        if lease.purpose != LeasePurpose.RECOVERY:
            raise errors.LeasePurposeError(lease.target, lease.purpose, "recovery")
        return run

    mp.setattr(recovery, "_guarded", guarded_without_fence)


def finish_under_an_expired_lease(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=1.0)
    run = m.admit(session="s1", lease=lease, start=True)
    m.advance(seconds=2.0)
    m.finish(run=run, status="succeeded", lease=lease, with_entries=True)


def converge_under_an_expired_recovery_lease(m: Steps) -> None:
    run = m.admit(session="s1", lease=None, start=True)  # nobody holds it: an orphan
    lease = m.acquire(owner="R1", session="s1", ttl=1.0)
    m.recover(run=run, lease=lease)
    m.advance(seconds=2.0)
    m.converge(run=run, lease=lease)


KILLS = {
    "finish-lease-fence": (drop_finish_fence, finish_under_an_expired_lease),
    "recovery-lease-fence": (drop_recovery_fence, converge_under_an_expired_recovery_lease),
}


(
    test_stored_counterexample_passes_on_the_real_store,
    test_stored_counterexample_fails_with_the_fence_patched_out,
) = kill_tests(KILLS, on)


test_machine_finds_a_counterexample_with_the_fence_patched_out = search_test(
    KILLS, on, examples=3000, backends=STORES
)


def admit_start_finish_each_ambiguously(m: Steps) -> None:
    """Each run write commits and its caller sees a lost connection; each
    retry is the oracle's: a keyed admission's returns the run admitted (under
    its lease and without one), a start's is refused (the run is running), a
    finish's succeeds once more and writes the turn's last entry once."""
    lease = m.acquire(owner="W1", session="s1", ttl=3.0)
    run = m.admit_ambiguously(session="s1", lease=lease, start=False, keyed=True)
    m.finish_ambiguously(run=run, status="failed", lease=lease)
    unkeyed = m.admit_ambiguously(session="s1", lease=lease, start=False, keyed=False)
    m.start_ambiguously(run=unkeyed)
    m.finish_ambiguously(run=unkeyed, status="succeeded", lease=lease)
    m.advance(seconds=4.0)  # the lease expires: nobody holds s2 or s1
    m.admit_ambiguously(session="s2", lease=None, start=True, keyed=True)


def drop_the_submission_lookup(mp: pytest.MonkeyPatch) -> None:
    """The admission's idempotency: its submission key's earlier run is not
    looked up (the retry is judged as a new admission)."""
    real = run_admission._head

    def head(tx, session_id, key_digest, admission, lease):
        return real(tx, session_id, None, admission, lease)

    mp.setattr(run_admission, "_head", head)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ambiguous_run_writes_retry_as_the_oracle_says(backend: str) -> None:
    replay(on(backend), admit_start_finish_each_ambiguously)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ambiguous_admission_fails_with_the_submission_lookup_patched_out(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_the_submission_lookup(monkeypatch)
    with pytest.raises(AssertionError, match="the retry of a keyed admission"):
        replay(on(backend), admit_start_finish_each_ambiguously)
