"""Conformance: a runtime's own run events (session seed SaveSessionRunEvent)
and an intent's latest run (LatestSessionRunForIntent), on both backends.
Each guard has a test that patches it out and sees the defect it prevents."""

from __future__ import annotations

from typing import Any

import pytest

from turnkeeper import (
    BusyError,
    InvalidInputError,
    InvalidTransitionError,
    LeaseLostError,
    RunEventConflictError,
    RunNotFoundError,
    SessionNotFoundError,
)
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.ops import leases, run_events

USER = {"role": "user", "content": "go"}


@pytest.fixture
def run(store):
    store.sessions.create("s")
    return store.runs.start(store.runs.admit("s", {"q": 1}, user_message=USER).id)


def test_a_recorded_event_takes_the_sessions_next_seq(store, run):
    before = store.runs.latest_event_seq(run.id)
    event = store.runs.record_event(run.id, "tool_started", {"tool": "bash"})
    assert event.seq == before + 1 == store.runs.latest_event_seq(run.id)
    assert (event.run_id, event.session_id, event.edge) == (run.id, "s", "tool_started")
    assert (event.source, event.dest, event.data) == ("running", "running", {"tool": "bash"})
    assert event.id.startswith(f"{run.id}:tool_started:")
    assert store.runs.events("s", after=before) == [event]
    store.runs.finish(run.id, "succeeded")
    assert [e.edge for e in store.runs.events("s")] == [
        "admit",
        "start",
        "tool_started",
        "succeed",
    ]
    assert store.runs.get(run.id).status == "succeeded"


def test_the_same_event_id_returns_the_stored_event_and_another_is_a_conflict(store, run):
    event = store.runs.record_event(run.id, "progress", {"step": 1}, event_id="e1")
    assert store.runs.record_event(run.id, "progress", {"step": 1}, event_id="e1") == event
    with pytest.raises(RunEventConflictError) as err:
        store.runs.record_event(run.id, "progress", {"step": 2}, event_id="e1")
    assert (err.value.event_id, err.value.run_id) == ("e1", run.id)
    store.runs.finish(run.id, "succeeded")
    # a retry after the run ended still gets the event it recorded
    assert store.runs.record_event(run.id, "progress", {"step": 1}, event_id="e1") == event
    assert [e.id for e in store.runs.events("s")].count("e1") == 1


def test_an_ended_runs_history_is_closed(store, run):
    store.runs.finish(run.id, "failed", error="x")
    events = store.runs.events("s")
    with pytest.raises(InvalidTransitionError):
        store.runs.record_event(run.id, "late", {})
    assert store.runs.events("s") == events


def test_the_ended_run_check_fails_with_it_patched_out(store, run, monkeypatch):
    store.runs.finish(run.id, "failed", error="x")
    monkeypatch.setattr(run_events, "TERMINAL", frozenset())
    store.runs.record_event(run.id, "late", {})  # a defect: an event after the end
    assert store.runs.events("s")[-1].edge == "late"
    failed = {c.name for c in run_audit(store, ["s"]) if not c.passed}
    assert "no_run_revived" in failed  # the audit reads it as a revival


@pytest.mark.parametrize("event_type", sorted(run_events.RESERVED))
def test_the_lifecycles_own_event_types_are_refused(store, run, event_type):
    with pytest.raises(InvalidInputError):
        store.runs.record_event(run.id, event_type)


def test_the_reserved_type_check_fails_with_it_patched_out(store, run, monkeypatch):
    monkeypatch.setattr(run_events, "RESERVED", frozenset())
    store.runs.record_event(run.id, "admit")  # a defect: a second admission, to a reader
    assert [e.edge for e in store.runs.events("s")].count("admit") == 2
    failed = {c.name for c in run_audit(store, ["s"]) if not c.passed}
    assert "one_active_run_per_session" in failed  # the audit counts two live runs


@pytest.mark.parametrize("data", [[1], "x", 3])
def test_data_is_a_json_object(store, run, data: Any):
    with pytest.raises(InvalidInputError):
        store.runs.record_event(run.id, "x", data)


def test_an_event_of_a_missing_run_is_an_error(store):
    with pytest.raises(RunNotFoundError):
        store.runs.record_event("nope", "x")


def leased_run(store, ttl: float = 30) -> tuple[Any, Any]:
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w1", ttl, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease, start=True)
    return lease, run


def test_recording_an_event_is_a_session_write(store, clock):
    lease, run = leased_run(store, ttl=1)
    with pytest.raises(BusyError):
        store.runs.record_event(run.id, "x")
    store.runs.record_event(run.id, "x", lease=lease)
    clock.advance(5)
    store.leases.acquire("session:s", "r1", 30, purpose="recovery")
    with pytest.raises(LeaseLostError):
        store.runs.record_event(run.id, "y", lease=lease)
    assert [e.edge for e in store.runs.events("s")][-1] == "x"


def test_the_unheld_check_fails_with_it_patched_out(store, monkeypatch):
    _, run = leased_run(store)
    monkeypatch.setattr(leases, "fence_or_unheld", lambda tx, target, lease: None)
    store.runs.record_event(run.id, "x")  # a defect: past the holder


# -- LatestSessionRunForIntent ---------------------------------------------------------------


def test_an_intents_latest_run_is_its_highest_attempt(store, run):
    assert store.runs.latest_for_intent("s", run.intent_id) == store.runs.get(run.id)
    store.runs.finish(run.id, "failed", error="x")
    retry = store.runs.admit("s", {"q": 1}, user_message=USER, retry_of=run.id)
    assert store.runs.latest_for_intent("s", run.intent_id) == retry
    store.runs.finish(retry.id, "failed", error="x")
    third = store.runs.admit("s", {"q": 1}, user_message=USER, retry_of=retry.id)
    assert store.runs.latest_for_intent("s", run.intent_id).id == third.id


def test_an_intent_without_runs_in_the_session_has_no_latest_run(store, run):
    assert store.runs.latest_for_intent("s", "nope") is None
    store.sessions.create("t")
    assert store.runs.latest_for_intent("t", run.intent_id) is None
    with pytest.raises(SessionNotFoundError):
        store.runs.latest_for_intent("missing", run.intent_id)
