"""Conformance: turns, intents, submissions and a run's event cursor read on
their own (session seed ListConversationTurns, GetExecutionIntent,
GetRuntimeSubmission, LatestSessionRunEventSeq)."""

from __future__ import annotations

import pytest

from turnkeeper import (
    ConversationTurn,
    ExecutionIntent,
    RunNotFoundError,
    RuntimeSubmission,
    SessionNotFoundError,
)
from turnkeeper.storage.ops import submissions

USER = {"role": "user", "content": "go"}


@pytest.fixture
def sid(store) -> str:
    store.sessions.create("s")
    return "s"


def test_turns_open_at_admission_and_close_at_termination_in_transcript_order(store, sid):
    assert store.runs.turns(sid) == []
    first = store.runs.admit(sid, {"q": 1}, user_message=USER, start=True)
    (opened,) = store.runs.turns(sid)
    assert isinstance(opened, ConversationTurn)
    start = store.sessions.entry(sid, f"{first.id}:turn-start")
    assert (opened.id, opened.run_id, opened.intent_id, opened.attempt) == (
        first.turn_id,
        first.id,
        first.intent_id,
        1,
    )
    assert (opened.status, opened.start_seq, opened.end_seq, opened.ended_at) == (
        "open",
        start.seq,
        None,
        None,
    )
    store.runs.finish(first.id, "failed", error="x")
    retry = store.runs.admit(sid, {"q": 1}, user_message=USER, retry_of=first.id)
    closed, second = store.runs.turns(sid)
    end = store.sessions.entry(sid, f"{first.id}:turn-end")
    assert (closed.status, closed.end_seq) == ("failed", end.seq)
    assert closed.ended_at is not None and closed.ended_at >= closed.started_at
    assert (second.run_id, second.attempt, second.status) == (retry.id, 2, "open")
    assert second.start_seq > closed.end_seq


def test_turns_of_a_missing_session_is_an_error(store):
    with pytest.raises(SessionNotFoundError):
        store.runs.turns("nope")


def test_an_intent_is_what_the_admission_accepted(store, sid):
    run = store.runs.admit(
        sid,
        {"text": "ls", "n": [1, 2]},
        user_message=USER,
        source="chat",
        model="m1",
        mode="plan",
        work_dir="/w",
        policy={"tools": ["bash"]},
    )
    got = store.runs.intent(run.intent_id)
    assert isinstance(got, ExecutionIntent)
    assert (got.id, got.session_id, got.source, got.model, got.mode, got.work_dir) == (
        run.intent_id,
        sid,
        "chat",
        "m1",
        "plan",
        "/w",
    )
    assert got.request == {"text": "ls", "n": [1, 2]} and got.policy == {"tools": ["bash"]}
    assert got.request_fingerprint == submissions.request_digest({"text": "ls", "n": [1, 2]})
    assert got.created_at.tzinfo is not None
    assert store.runs.intent("nope") is None


def test_a_submission_is_found_by_its_key_which_is_not_stored(store, sid):
    run = store.runs.admit(sid, {"q": 1}, user_message=USER, submission_key="req-42")
    got = store.runs.submission(sid, "req-42")
    assert isinstance(got, RuntimeSubmission)
    assert (got.session_id, got.run_id, got.intent_id) == (sid, run.id, run.intent_id)
    assert got.key_digest == submissions.key_digest(sid, "req-42") != "req-42"
    assert store.runs.submission(sid, "other") is None
    store.sessions.create("t")
    assert store.runs.submission("t", "req-42") is None  # a key is per session
    stored = store.query("SELECT * FROM submissions").to_pylist()
    assert "req-42" not in repr(stored)


def test_a_runs_event_cursor_is_its_last_events_seq(store, sid):
    run = store.runs.admit(sid, {"q": 1}, user_message=USER)
    assert store.runs.latest_event_seq(run.id) == store.runs.events(sid)[-1].seq
    store.runs.start(run.id)
    store.runs.finish(run.id, "succeeded")
    other = store.runs.admit(sid, {"q": 2}, user_message=USER)
    events = store.runs.events(sid)
    mine = [e.seq for e in events if e.run_id == run.id]
    assert store.runs.latest_event_seq(run.id) == mine[-1] < events[-1].seq
    assert store.runs.latest_event_seq(other.id) == events[-1].seq
    assert [e.seq for e in store.runs.events(sid, after=mine[-1])] == [events[-1].seq]
    with pytest.raises(RunNotFoundError):
        store.runs.latest_event_seq("nope")
