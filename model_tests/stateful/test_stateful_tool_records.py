"""Run the differential tool-records machine (``turnkeeper.fuzz.tools``) over
every store configuration, and show each guard of the area can fail: each
guard's stored counterexample is replayed (``by_hand``) on the store with the
guard patched out (test-only), where it fails, and on the real one, where it
passes. The searches that find a counterexample from scratch run on demand
(``search``: ``HYPOTHESIS_PROFILE=nightly``).

Every step compares every record and the events table with the model, so
the examples are kept few under CI's profile: at most :data:`MAX_EXAMPLES`
per configuration (then divided by its share, ``conftest.machine_settings``),
of at most :data:`STEPS` steps; ``HYPOTHESIS_PROFILE=nightly`` runs the
profile's full budget (5,000 examples of 60 steps).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from by_hand import Kill, Steps, kill_tests, replay, search_test
from conftest import BACKENDS, SEARCHING, STORES, machine_settings, opener
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from turnkeeper.fuzz.tools import ToolRecordsMachine, machine
from turnkeeper.spec.lifecycle import Edge
from turnkeeper.spec.tool_execution import ToolExecutionState
from turnkeeper.storage.ops import run_reads, tool_records, tools


def make_machine(backend: str) -> type[ToolRecordsMachine]:
    """The machine on the test store configuration ``backend`` (``conftest.opener``)."""
    return machine(opener(backend))


MAX_EXAMPLES = 40
STEPS = 25
"""CI's caps (examples before the engine's share, steps per example); the
``nightly`` profile runs its own budget, uncapped."""


@pytest.mark.parametrize("backend", STORES)
def test_tool_records_agree_with_the_model(backend: str) -> None:
    if SEARCHING:
        run_state_machine_as_test(make_machine(backend), settings=machine_settings(backend))
        return
    budget = machine_settings(backend, max_examples=MAX_EXAMPLES)
    run_state_machine_as_test(
        make_machine(backend),
        settings=settings(budget, stateful_step_count=min(budget.stateful_step_count, STEPS)),
    )


# -- the guards, patched out (test-only) ----------------------------------------------


def drop_the_binding_check(mp: pytest.MonkeyPatch) -> None:
    """A claim of a claimed key is taken as the same call, whatever it binds."""
    mp.setattr(tools, "BINDING", ())


def drop_the_claimed_key_lookup(mp: pytest.MonkeyPatch) -> None:
    """A claim never finds the key's record: a retried claim inserts again."""
    mp.setattr(tool_records, "get", lambda tx, execution_key: None)


def drop_the_session_fence(mp: pytest.MonkeyPatch) -> None:
    """Tool writes neither fence their lease nor, without one, refuse while the
    session is held."""
    mp.setattr(tool_records, "no_other_owner", lambda tx, session_id, lease: None)


def drop_the_lease_session_check(mp: pytest.MonkeyPatch) -> None:
    """A record's write takes a lease on any session as its fence."""
    mp.setattr(tool_records, "own_session", lambda session_id, lease: None)


def drop_the_ended_run_check(mp: pytest.MonkeyPatch) -> None:
    """A claim or a reclaim accepts a run that has ended."""
    mp.setattr(tools, "TERMINAL", frozenset())


class _Matches(str):
    """A run's field as a patched-out check sees it: equal to whatever it is
    compared with (``!=`` is False: the subclass's reflected method decides)."""

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False


def _runs_matching(mp: pytest.MonkeyPatch, field: str) -> None:
    """The tool records' run reads give runs whose ``field`` matches anything."""

    def get(tx: Any, run_id: str) -> Any:
        run = run_reads.get(tx, run_id)
        if run is None:
            return None
        changed: dict[str, Any] = {field: _Matches(getattr(run, field))}
        return dataclasses.replace(run, **changed)

    mp.setattr(tools, "run_reads", SimpleNamespace(get=get))


def drop_the_run_session_check(mp: pytest.MonkeyPatch) -> None:
    """A claim accepts a run of another session."""
    _runs_matching(mp, "session_id")


def drop_the_run_turn_check(mp: pytest.MonkeyPatch) -> None:
    """A claim accepts a run whatever turn it names."""
    _runs_matching(mp, "turn_id")


def drop_the_complete_state_guard(mp: pytest.MonkeyPatch) -> None:
    """A completion is taken from whatever state the record is in."""
    real = tool_records.MACHINE.require

    def require(trigger: str, source: str, facts: Any) -> Edge:
        if trigger == "complete":
            return Edge("complete", "complete", source, "completed")
        return real(trigger, source, facts)

    mp.setattr(tool_records.MACHINE, "require", require)


def drop_the_repeated_result_check(mp: pytest.MonkeyPatch) -> None:
    """A completion never recognises the stored result as its own (its retry
    after a lost reply is another result)."""
    mp.setattr(tools, "from_json", lambda text: object())


def drop_the_confirmation_guard(mp: pytest.MonkeyPatch) -> None:
    """Every record is taken as read-only: a side-effecting call is reclaimed
    without the user's confirmation."""
    mp.setattr(tool_records, "facts", lambda rec: {"side_effecting": False})


def drop_the_read_only_retry_guard(mp: pytest.MonkeyPatch) -> None:
    """Every record is taken as side-effecting: a read-only call's retry is
    requested (it needs none: it is reclaimed)."""
    mp.setattr(tool_records, "facts", lambda rec: {"side_effecting": True})


def drop_the_terminal_reclaim_guard(mp: pytest.MonkeyPatch) -> None:
    """A completed or abandoned record is reopened by a reclaim."""
    real = tool_records.MACHINE.decide

    def decide(trigger: str, source: str, facts: Any) -> Edge | None:
        if trigger == "reclaim" and source in ("completed", "abandoned"):
            return Edge("reclaim_running", "reclaim", source, "running")
        return real(trigger, source, facts)

    mp.setattr(tool_records.MACHINE, "decide", decide)


def drop_the_uncertain_filter(mp: pytest.MonkeyPatch) -> None:
    """An abandon takes every record of the turn, completed ones too."""
    mp.setattr(tools, "UNCERTAIN", frozenset(ToolExecutionState))


# -- the stored counterexamples (each a short replayable script) ---------------------

CALL = {"run_pick": "none", "side_effecting": False, "vary": "none"}
"""A new read-only call without a run (turn ``t-free``)."""


def claim_another_call_under_a_key(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=5.0)
    m.claim(key="k1", session="s1", **CALL, lease=lease, lost_reply=False)
    m.claim(key="k1", session="s1", **{**CALL, "vary": "args"}, lease=lease, lost_reply=False)


def claim_again_after_a_lost_reply(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s2", ttl=5.0)
    m.claim(key="k2", session="s2", **CALL, lease=lease, lost_reply=True)


def claim_under_a_lapsed_lease(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=2.0)
    m.time_passes(seconds=2.0)  # exactly its TTL: a lease is live only before its expiry
    m.claim(key="k1", session="s1", **CALL, lease=lease, lost_reply=False)


def complete_after_a_takeover(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=2.0)
    m.claim(key="k1", session="s1", **CALL, lease=lease, lost_reply=False)
    m.time_passes(seconds=3.0)
    m.acquire(owner="W2", session="s1", ttl=5.0)
    m.complete(key="k1", result=0, is_error=False, lease=lease, lost_reply=False)


def reclaim_under_a_released_lease(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s2", ttl=5.0)
    m.claim(key="k3", session="s2", **CALL, lease=lease, lost_reply=False)
    m.interrupt(session="s2", turn="all", lease=lease, lost_reply=False)
    m.release(lease=lease)
    m.reclaim(key="k3", run_pick="own", lease=lease, lost_reply=False)


def interrupt_without_a_lease_while_held(m: Steps) -> None:
    lease = m.acquire(owner="W2", session="s1", ttl=5.0)
    m.claim(key="k1", session="s1", **CALL, lease=lease, lost_reply=False)
    m.interrupt(session="s1", turn="all", lease=None, lost_reply=False)


def abandon_by_a_stale_worker(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=2.0)
    m.claim(key="k1", session="s1", **CALL, lease=lease, lost_reply=False)
    m.time_passes(seconds=2.0)
    m.abandon(session="s1", turn="free", lease=lease, lost_reply=False)


def complete_under_another_sessions_lease(m: Steps) -> None:
    mine = m.acquire(owner="W1", session="s1", ttl=5.0)
    m.claim(key="k1", session="s1", **CALL, lease=mine, lost_reply=False)
    other = m.acquire(owner="W2", session="s2", ttl=5.0)
    m.complete(key="k1", result=1, is_error=False, lease=other, lost_reply=False)


def claim_under_a_finished_run(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=5.0)
    m.admit_run(lease=lease)
    m.finish_run(lease=lease, status="succeeded")
    m.claim(key="k2", session="s1", **{**CALL, "run_pick": "latest"}, lease=lease, lost_reply=False)


def reclaim_into_a_finished_run(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s2", ttl=5.0)
    m.admit_run(lease=lease)
    m.claim(key="k1", session="s2", **{**CALL, "run_pick": "latest"}, lease=lease, lost_reply=False)
    m.finish_run(lease=lease, status="failed")  # its running record is interrupted
    m.reclaim(key="k1", run_pick="own", lease=lease, lost_reply=False)


def claim_under_another_sessions_run(m: Steps) -> None:
    theirs = m.acquire(owner="W2", session="s2", ttl=5.0)
    m.admit_run(lease=theirs)
    mine = m.acquire(owner="W1", session="s1", ttl=5.0)
    m.claim(key="k1", session="s1", **{**CALL, "run_pick": "other"}, lease=mine, lost_reply=False)


def claim_naming_another_turn(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=5.0)
    m.admit_run(lease=lease)
    wrong = {**CALL, "run_pick": "wrong_turn"}
    m.claim(key="k2", session="s1", **wrong, lease=lease, lost_reply=False)


def complete_an_interrupted_call(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=5.0)
    m.claim(key="k1", session="s1", **CALL, lease=lease, lost_reply=False)
    m.interrupt(session="s1", turn="free", lease=lease, lost_reply=False)
    m.complete(key="k1", result=0, is_error=False, lease=lease, lost_reply=False)


def complete_again_after_a_lost_reply(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=5.0)
    m.claim(key="k1", session="s1", **CALL, lease=lease, lost_reply=False)
    m.complete(key="k1", result=2, is_error=True, lease=lease, lost_reply=True)


def reclaim_a_side_effecting_call_unconfirmed(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=5.0)
    se = {**CALL, "side_effecting": True}
    m.claim(key="k1", session="s1", **se, lease=lease, lost_reply=False)
    m.interrupt(session="s1", turn="all", lease=lease, lost_reply=False)
    m.reclaim(key="k1", run_pick="own", lease=lease, lost_reply=False)


def request_a_retry_of_a_read_only_call(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s2", ttl=5.0)
    m.claim(key="k2", session="s2", **CALL, lease=lease, lost_reply=False)
    m.interrupt(session="s2", turn="all", lease=lease, lost_reply=False)
    m.request_recovery(session="s2", turn="free", calls=["k2"], lost_reply=False)


def reclaim_a_completed_call(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=5.0)
    m.claim(key="k1", session="s1", **CALL, lease=lease, lost_reply=False)
    m.complete(key="k1", result=0, is_error=False, lease=lease, lost_reply=False)
    m.reclaim(key="k1", run_pick="own", lease=lease, lost_reply=False)


def abandon_a_turn_with_a_completed_call(m: Steps) -> None:
    lease = m.acquire(owner="W1", session="s1", ttl=5.0)
    m.claim(key="k1", session="s1", **CALL, lease=lease, lost_reply=False)
    m.complete(key="k1", result=0, is_error=False, lease=lease, lost_reply=False)
    m.abandon(session="s1", turn="free", lease=lease, lost_reply=False)


KILLS: dict[str, Kill] = {
    "tool-claim-binding": (drop_the_binding_check, claim_another_call_under_a_key),
    "tool-claim-key-present": (drop_the_claimed_key_lookup, claim_again_after_a_lost_reply),
    "tool-fence-claim-expiry": (drop_the_session_fence, claim_under_a_lapsed_lease),
    "tool-fence-complete-takeover": (drop_the_session_fence, complete_after_a_takeover),
    "tool-fence-reclaim-released": (drop_the_session_fence, reclaim_under_a_released_lease),
    "tool-fence-abandon-stale": (drop_the_session_fence, abandon_by_a_stale_worker),
    "tool-unleased-while-held": (drop_the_session_fence, interrupt_without_a_lease_while_held),
    "tool-lease-session": (drop_the_lease_session_check, complete_under_another_sessions_lease),
    "tool-claim-run-ended": (drop_the_ended_run_check, claim_under_a_finished_run),
    "tool-reclaim-run-ended": (drop_the_ended_run_check, reclaim_into_a_finished_run),
    "tool-claim-run-session": (drop_the_run_session_check, claim_under_another_sessions_run),
    "tool-claim-run-turn": (drop_the_run_turn_check, claim_naming_another_turn),
    "tool-complete-state": (drop_the_complete_state_guard, complete_an_interrupted_call),
    "tool-complete-repeat": (drop_the_repeated_result_check, complete_again_after_a_lost_reply),
    "tool-reclaim-confirmation": (
        drop_the_confirmation_guard,
        reclaim_a_side_effecting_call_unconfirmed,
    ),
    "tool-retry-read-only": (drop_the_read_only_retry_guard, request_a_retry_of_a_read_only_call),
    "tool-reclaim-terminal": (drop_the_terminal_reclaim_guard, reclaim_a_completed_call),
    "tool-abandon-uncertain": (drop_the_uncertain_filter, abandon_a_turn_with_a_completed_call),
}


(
    test_stored_counterexample_passes_on_the_real_store,
    test_stored_counterexample_fails_with_the_guard_patched_out,
) = kill_tests(KILLS, make_machine)


# -- ambiguous commits on every write, retried ----------------------------------------


def every_write_with_a_lost_reply(m: Steps) -> None:
    """Each of the area's writes commits while its caller sees a lost
    connection, and its retry gives what the model says: the same record for
    the claim, the stored record for the completion, nothing more to interrupt,
    the retry already requested; a reclaim is not idempotent: a side-effecting
    call's is refused (``needs_confirmation``: it is running again), a
    read-only call's reclaims it again (attempt 3); nothing left to abandon."""
    lease = m.acquire(owner="W1", session="s1", ttl=5.0)
    m.admit_run(lease=lease)
    se = {**CALL, "run_pick": "latest", "side_effecting": True}
    read_only = {**se, "side_effecting": False}
    m.claim(key="k1", session="s1", **se, lease=lease, lost_reply=True)
    m.claim(key="k2", session="s1", **read_only, lease=lease, lost_reply=True)
    m.complete(key="k2", result=1, is_error=False, lease=lease, lost_reply=True)
    m.interrupt(session="s1", turn="latest", lease=lease, lost_reply=True)
    m.request_recovery(session="s1", turn="latest", calls=["k1", "k2"], lost_reply=True)
    m.reclaim(key="k1", run_pick="own", lease=lease, lost_reply=True)
    m.claim(key="k3", session="s1", **read_only, lease=lease, lost_reply=False)
    m.interrupt(session="s1", turn="all", lease=lease, lost_reply=False)
    m.reclaim(key="k3", run_pick="latest", lease=lease, lost_reply=True)
    m.abandon(session="s1", turn="latest", lease=lease, lost_reply=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_tool_write_with_a_lost_reply_retries_as_the_model_says(backend: str) -> None:
    replay(make_machine(backend), every_write_with_a_lost_reply)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lost_completion_reply_fails_with_the_repeated_result_check_patched_out(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_the_repeated_result_check(monkeypatch)
    with pytest.raises(AssertionError, match="the retry of complete"):
        replay(make_machine(backend), every_write_with_a_lost_reply)


test_machine_finds_a_counterexample_with_the_guard_patched_out = search_test(
    KILLS, make_machine, examples=2000, backends=STORES
)
