"""Conformance: execution intents, runs, run events (session seed runs)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import forge

import turnkeeper
from turnkeeper import (
    InvalidInputError,
    InvalidTransitionError,
    LeaseLostError,
    RetryNotAllowedError,
    RunNotFoundError,
    SessionNotFoundError,
    SessionRecoveryRequiredError,
    SessionRunActiveError,
    SubmissionConflictError,
)


@pytest.fixture
def store(any_store: Any) -> Any:
    """Each backend, called directly and through ``turnkeeper.aio`` (conftest's ``any_store``)."""
    return any_store


USER = {"role": "user", "content": "do it"}
ASSISTANT = {"role": "assistant", "content": "done"}


@pytest.fixture
def sid(store) -> str:
    store.sessions.create("s")
    return "s"


def count(store, table: str) -> int:
    return store.query(f"SELECT count(*) AS n FROM {table}").to_pylist()[0]["n"]


def test_admission_writes_everything_in_one_go(store, sid):
    run = store.runs.admit(sid, {"text": "do it"}, user_message=USER, model="m1")
    assert (run.status, run.attempt, run.retry_of, run.cancel_requested) == (
        "admitted",
        1,
        None,
        False,
    )
    kinds = [(e.id, e.kind) for e in store.sessions.entries(sid)]
    assert kinds == [(f"{run.id}:turn-start", "turn_start"), (run.user_entry_id, "message")]
    assert store.sessions.replay(sid).entry_ids == (
        run.user_entry_id,
    )  # turn markers are not replayed
    assert store.runs.active(sid) == run
    assert [(e.seq, e.edge) for e in store.runs.events(sid)] == [(1, "admit")]
    intent = store.query("SELECT model, request FROM execution_intents").to_pylist()
    assert [i["model"] for i in intent] == ["m1"]
    stored = intent[0]["request"]
    if store.db.keyring.encrypted:  # sealed (test_encryption_tools_runs)
        assert stored.startswith("enc1:") and "do it" not in stored
    else:
        assert stored == '{"text":"do it"}'
    assert store.runs.intent(run.intent_id).request == {"text": "do it"}
    turn = store.query("SELECT status, end_seq FROM conversation_turns").to_pylist()
    assert turn == [{"status": "open", "end_seq": None}]


def test_same_key_same_request_returns_the_original_run(store, sid):
    first = store.runs.admit(sid, {"a": 1, "b": 2}, submission_key="k")
    again = store.runs.admit(sid, {"b": 2, "a": 1}, submission_key="k")  # key order is irrelevant
    assert again == first and count(store, "runs") == 1
    keys = store.query("SELECT * FROM submissions").to_pylist()
    assert len(keys) == 1 and "k" not in keys[0].values()  # only the digest is stored


def test_same_key_different_request_conflicts_naming_the_run(store, sid):
    first = store.runs.admit(sid, {"a": 1}, submission_key="k")
    with pytest.raises(SubmissionConflictError) as err:
        store.runs.admit(sid, {"a": 2}, submission_key="k")
    assert (err.value.session_id, err.value.run_id) == (sid, first.id)


@pytest.mark.parametrize(
    "change",
    [
        {"user_message": {"role": "user", "content": "something else"}},
        {"user_message": None},
        {"model": "another-model"},
        {"source": "cli"},
        {"policy": {"tools": "none"}},
    ],
)
def test_same_key_and_request_with_another_admission_argument_conflicts(store, sid, change):
    """The whole admission is the submission: the same key with another user
    message (or model, source, policy …) is another request, never silently the first."""
    args = {"user_message": USER, "model": "m", "source": "api", "policy": {"tools": "all"}}
    first = store.runs.admit(sid, {"a": 1}, submission_key="k", **args)
    before = store.sessions.entries(sid)
    with pytest.raises(SubmissionConflictError) as err:
        store.runs.admit(sid, {"a": 1}, submission_key="k", **(args | change))
    assert err.value.run_id == first.id
    assert store.sessions.entries(sid) == before
    assert store.runs.admit(sid, {"a": 1}, submission_key="k", **args) == first


def test_at_most_one_non_terminal_run_per_session(store, sid):
    first = store.runs.admit(sid, {"n": 1})
    with pytest.raises(SessionRunActiveError) as err:
        store.runs.admit(sid, {"n": 2}, user_message=USER)
    assert err.value.run_id == first.id
    assert count(store, "runs") == 1 and len(store.sessions.entries(sid)) == 1


def test_the_one_active_run_rule_is_held_by_the_schema(store, sid):
    store.runs.admit(sid, {"n": 1})
    with pytest.raises(turnkeeper.IntegrityError):
        forge(store, "INSERT INTO active_runs VALUES ('s', 'another-run')", rows=1)


def test_finish_writes_terminal_event_assistant_entry_and_turn_end(store, sid):
    run = store.runs.admit(sid, {"n": 1}, user_message=USER)
    store.runs.start(run.id)
    done = store.runs.finish(run.id, "succeeded", assistant_message=ASSISTANT, stop_reason="stop")
    assert done.status == "succeeded" and done.finished_at is not None
    assert store.runs.active(sid) is None
    ids = [e.id for e in store.sessions.entries(sid)]
    assert ids[-2:] == [run.assistant_entry_id, f"{run.id}:turn-end"]
    assert store.sessions.replay(sid).entry_ids == (run.user_entry_id, run.assistant_entry_id)
    assert [e.edge for e in store.runs.events(sid)] == ["admit", "start", "succeed"]
    turn = store.query("SELECT status FROM conversation_turns").to_pylist()
    assert turn == [{"status": "succeeded"}]


def test_repeating_the_same_terminalization_is_idempotent(store, sid):
    run = store.runs.admit(sid, {"n": 1})
    store.runs.start(run.id)
    store.runs.finish(run.id, "failed", error="boom")
    before = (len(store.sessions.entries(sid)), count(store, "run_events"))
    again = store.runs.finish(run.id, "failed", error="boom")
    assert again.status == "failed" and again.error == "boom"
    assert (len(store.sessions.entries(sid)), count(store, "run_events")) == before


def test_a_repeated_finish_keeps_the_first_reply_and_writes_nothing_of_its_own(store, sid):
    """The first finish stands (README, "A turn in three transactions"): a
    repeat in the same status with another reply, more entries or another
    stop reason returns the stored run and stores none of them."""
    run = store.runs.admit(sid, {"n": 1}, user_message=USER, start=True)
    first = store.runs.finish(run.id, "succeeded", assistant_message=ASSISTANT)
    before = (store.sessions.entries(sid), count(store, "run_events"))
    again = store.runs.finish(
        run.id,
        "succeeded",
        assistant_message={"role": "assistant", "content": "another reply"},
        entries=[("message", {"message": {"role": "user", "content": "more"}})],
        stop_reason="length",
    )
    assert again == first == store.runs.get(run.id)
    assert (store.sessions.entries(sid), count(store, "run_events")) == before
    assert store.sessions.replay(sid).messages[-1] == ASSISTANT


def test_a_terminal_run_is_never_revived_or_re_ended(store, sid):
    run = store.runs.admit(sid, {"n": 1})
    store.runs.finish(run.id, "abandoned")
    for call in (
        lambda: store.runs.start(run.id),
        lambda: store.runs.finish(run.id, "succeeded"),
        lambda: store.runs.request_cancel(run.id),
    ):
        with pytest.raises(InvalidTransitionError):
            call()
    assert store.runs.get(run.id).status == "abandoned"


def test_cancel_needs_a_cancel_request(store, sid):
    run = store.runs.admit(sid, {"n": 1})
    store.runs.start(run.id)
    with pytest.raises(InvalidTransitionError):
        store.runs.finish(run.id, "cancelled")
    assert store.runs.request_cancel(run.id).cancel_requested is True
    assert store.runs.finish(run.id, "cancelled").status == "cancelled"


def test_succeed_only_from_running(store, sid):
    run = store.runs.admit(sid, {"n": 1})
    with pytest.raises(InvalidTransitionError):
        store.runs.finish(run.id, "succeeded")
    store.runs.start(run.id)
    store.runs.wait(run.id)
    with pytest.raises(InvalidTransitionError):
        store.runs.finish(run.id, "succeeded")


def test_retry_only_from_the_latest_terminal_attempt(store, sid):
    first = store.runs.admit(sid, {"n": 1})
    with pytest.raises((RetryNotAllowedError, SessionRunActiveError)):
        store.runs.admit(sid, {"n": 1}, retry_of=first.id)
    store.runs.finish(first.id, "failed")
    second = store.runs.admit(sid, {"n": 1}, retry_of=first.id)
    assert (second.attempt, second.intent_id, second.retry_of) == (2, first.intent_id, first.id)
    store.runs.finish(second.id, "failed")
    with pytest.raises(RetryNotAllowedError) as err:
        store.runs.admit(sid, {"n": 1}, retry_of=first.id)
    assert err.value.run_id == first.id
    with pytest.raises(RunNotFoundError):
        store.runs.admit(sid, {"n": 1}, retry_of="nope")
    third = store.runs.admit(sid, {"n": 1}, retry_of=second.id)
    assert third.attempt == 3


def test_run_events_after_before_latest_with_limits(store, sid):
    for _ in range(4):
        run = store.runs.admit(sid, {"n": 1})
        store.runs.start(run.id)
        store.runs.finish(run.id, "succeeded")
    seqs = [e.seq for e in store.runs.events(sid)]
    assert seqs == list(range(1, 13))
    assert [e.seq for e in store.runs.events(sid, after=9)] == [10, 11, 12]
    assert [e.seq for e in store.runs.events(sid, after=2, limit=2)] == [3, 4]
    assert [e.seq for e in store.runs.events(sid, before=4)] == [1, 2, 3]
    assert [e.seq for e in store.runs.events(sid, before=10, limit=2)] == [8, 9]
    assert [e.seq for e in store.runs.events(sid, latest=True, limit=3)] == [10, 11, 12]
    with pytest.raises(InvalidInputError):
        store.runs.events(sid, after="3")


def test_admission_and_termination_are_fenced_by_the_session_lease(store, clock, sid):
    store.sessions.create("other")
    lease = store.leases.acquire("session:s", "w", 1, purpose="execution")
    with pytest.raises(InvalidInputError):
        store.runs.admit("other", {"n": 1}, lease=lease)
    run = store.runs.admit(sid, {"n": 1}, lease=lease, user_message=USER)
    clock.advance(2)
    with pytest.raises(LeaseLostError):
        store.runs.finish(run.id, "failed", lease=lease)
    assert store.runs.get(run.id).status == "admitted"
    with pytest.raises(SessionRecoveryRequiredError):  # the run is an orphan now
        store.leases.acquire("session:s", "w2", 5, purpose="execution")
    fresh = store.leases.acquire("session:s", "w2", 5, purpose="recovery", run_id=run.id)
    assert store.runs.finish(run.id, "failed", lease=fresh).status == "failed"


def test_bad_run_input_is_refused(store, sid):
    with pytest.raises(SessionNotFoundError):
        store.runs.admit("nope", {"n": 1})
    with pytest.raises(InvalidInputError):
        store.runs.admit(sid, ["not", "a", "mapping"])
    with pytest.raises(InvalidInputError):
        store.runs.admit(sid, {"n": 1}, user_message={"content": "no role"})
    run = store.runs.admit(sid, {"n": 1})
    for status in ("running", "bogus"):
        with pytest.raises(InvalidInputError):
            store.runs.finish(run.id, status)
    with pytest.raises(RunNotFoundError):
        store.runs.start("nope")
