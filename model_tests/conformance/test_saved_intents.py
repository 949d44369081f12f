"""Conformance: execution intents saved before their run (session seed
SaveExecutionIntent) and admitted later (``runs.admit(intent_id=…)``), on
both backends. Each guard has a test that patches it out and sees the defect
it prevents."""

from __future__ import annotations

import pytest

from turnkeeper import (
    BusyError,
    ExecutionIntentConflictError,
    ExecutionIntentNotFoundError,
    InvalidInputError,
    LeaseLostError,
    RetryNotAllowedError,
    SessionNotFoundError,
)
from turnkeeper.storage.ops import leases, run_intents, submissions

USER = {"role": "user", "content": "later"}
FIELDS = {"source": "cli", "model": "m1", "mode": "code", "work_dir": "/w"}


@pytest.fixture
def sid(store) -> str:
    store.sessions.create("s")
    return "s"


def test_a_saved_intent_is_admitted_later_as_its_first_run(store, sid):
    saved = store.runs.save_intent(sid, {"q": 1}, intent_id="i1", policy={"p": 1}, **FIELDS)
    assert (saved.id, saved.session_id, saved.request, saved.policy) == (
        "i1",
        sid,
        {"q": 1},
        {"p": 1},
    )
    assert (saved.source, saved.model, saved.mode, saved.work_dir) == ("cli", "m1", "code", "/w")
    assert saved.request_fingerprint == submissions.request_digest({"q": 1})
    assert store.runs.intent("i1") == saved
    assert store.runs.list(sid) == []
    run = store.runs.admit(
        sid, {"q": 1}, user_message=USER, intent_id="i1", policy={"p": 1}, **FIELDS
    )
    assert (run.intent_id, run.attempt) == ("i1", 1)
    assert store.runs.intent("i1") == saved  # no intent written anew
    assert store.runs.latest_for_intent(sid, "i1") == store.runs.get(run.id)
    (turn,) = store.runs.turns(sid)
    assert turn.intent_id == "i1"


def test_an_intent_is_immutable(store, sid):
    saved = store.runs.save_intent(sid, {"q": 1}, intent_id="i1")
    assert store.runs.save_intent(sid, {"q": 1}, intent_id="i1") == saved  # a retry
    with pytest.raises(ExecutionIntentConflictError) as err:
        store.runs.save_intent(sid, {"q": 2}, intent_id="i1")
    assert (err.value.intent_id, err.value.session_id) == ("i1", sid)
    store.sessions.create("t")
    with pytest.raises(ExecutionIntentConflictError):
        store.runs.save_intent("t", {"q": 1}, intent_id="i1")
    assert store.runs.intent("i1") == saved
    generated = store.runs.save_intent(sid, {"q": 3})
    assert generated.id != "i1" and store.runs.intent(generated.id) == generated


def test_an_admission_of_an_unknown_intent_is_refused(store, sid):
    store.sessions.create("t")
    store.runs.save_intent("t", {"q": 1}, intent_id="i-t")
    for intent_id in ("nope", "i-t"):
        with pytest.raises(ExecutionIntentNotFoundError) as err:
            store.runs.admit(sid, {"q": 1}, intent_id=intent_id)
        assert (err.value.intent_id, err.value.session_id) == (intent_id, sid)
    assert store.runs.list(sid) == []
    assert store.sessions.entries(sid) == []


@pytest.mark.parametrize(
    "changed", [{"request": {"q": 2}}, {"model": "m2"}, {"policy": {"p": 2}}, {"work_dir": ""}]
)
def test_the_admission_must_be_the_saved_intents(store, sid, changed):
    store.runs.save_intent(sid, {"q": 1}, intent_id="i1", policy={"p": 1}, **FIELDS)
    args = {"request": {"q": 1}, "policy": {"p": 1}, **FIELDS, **changed}
    with pytest.raises(InvalidInputError):
        store.runs.admit(sid, args.pop("request"), intent_id="i1", **args)
    assert store.runs.list(sid) == []


def test_the_saved_intent_check_fails_with_it_patched_out(store, sid, monkeypatch):
    store.runs.save_intent(sid, {"q": 1}, intent_id="i1")
    monkeypatch.setattr(run_intents, "check_saved", lambda tx, intent_id, session_id, f: None)
    run = store.runs.admit(sid, {"q": 2}, intent_id="i1")  # a defect: not the intent's request
    assert run.intent_id == "i1" and store.runs.intent("i1").request == {"q": 1}


def test_an_intent_with_a_run_is_retried_not_admitted_again(store, sid):
    store.runs.save_intent(sid, {"q": 1}, intent_id="i1")
    first = store.runs.admit(sid, {"q": 1}, intent_id="i1")
    store.runs.finish(first.id, "failed", error="x")
    with pytest.raises(RetryNotAllowedError) as err:
        store.runs.admit(sid, {"q": 1}, intent_id="i1")
    assert err.value.run_id == first.id
    retry = store.runs.admit(sid, {"q": 1}, retry_of=first.id)
    assert (retry.intent_id, retry.attempt) == ("i1", 2)
    with pytest.raises(InvalidInputError):
        store.runs.admit(sid, {"q": 1}, intent_id="i1", retry_of=retry.id)


def test_saving_an_intent_is_a_session_write(store, sid, clock):
    lease = store.leases.acquire("session:s", "w1", 1)
    with pytest.raises(BusyError):
        store.runs.save_intent(sid, {"q": 1}, intent_id="i1")
    store.runs.save_intent(sid, {"q": 1}, intent_id="i1", lease=lease)
    clock.advance(5)
    store.leases.acquire("session:s", "w2", 30)
    with pytest.raises(LeaseLostError):
        store.runs.save_intent(sid, {"q": 2}, intent_id="i2", lease=lease)
    assert store.runs.intent("i2") is None
    with pytest.raises(SessionNotFoundError):
        store.runs.save_intent("nope", {"q": 1})


def test_the_unheld_check_fails_with_it_patched_out(store, sid, monkeypatch):
    store.leases.acquire("session:s", "w1", 30)
    monkeypatch.setattr(leases, "fence_or_unheld", lambda tx, target, lease: None)
    store.runs.save_intent(sid, {"q": 1}, intent_id="i1")  # a defect: past the holder


@pytest.mark.parametrize(
    "bad", [{"request": [1]}, {"policy": "x"}, {"model": 3}, {"intent_id": ""}]
)
def test_bad_input_is_refused(store, sid, bad):
    args = {"request": {"q": 1}, **bad}
    with pytest.raises(InvalidInputError):
        store.runs.save_intent(sid, args.pop("request"), **args)
