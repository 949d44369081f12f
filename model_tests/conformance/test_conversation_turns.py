"""Conformance: conversation turns on their own (session seed
StartConversationTurn, EndConversationTurn, their ``Manager`` forms and
ErrConversationTurnNotOpen), on both backends.

A run's admission opens its first turn and its end closes the turn still
open; in between a runtime ends a turn (``runs.end_turn``) and opens the
run's next one (``runs.start_turn``). Each guard has a test that patches it
out and sees the defect it prevents."""

from __future__ import annotations

from typing import Any

import pytest

from turnkeeper import (
    BusyError,
    ConversationTurnExistsError,
    ConversationTurnNotOpenError,
    ConversationTurnOpenError,
    EntryKind,
    InvalidInputError,
    InvalidTransitionError,
    LeaseLostError,
    RunNotFoundError,
    ToolCallsUnansweredError,
)
from turnkeeper.spec.run import TURN_END_STATUSES
from turnkeeper.storage.ops import leases, run_lifecycle, run_turns

USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}


def call(call_id: str) -> dict[str, Any]:
    block = {"type": "toolCall", "id": call_id, "name": "bash", "arguments": {}}
    return {"message": {"role": "assistant", "content": [block], "stopReason": "toolUse"}}


def result(call_id: str) -> dict[str, Any]:
    return {"message": {"role": "toolResult", "toolCallId": call_id, "content": []}}


@pytest.fixture
def run(store):
    store.sessions.create("s")
    return store.runs.start(store.runs.admit("s", {"q": 1}, user_message=USER).id)


def turn_ends(store, sid: str = "s") -> list[dict[str, Any]]:
    return [e.payload for e in store.sessions.entries(sid) if e.kind == EntryKind.TURN_END]


def test_a_runtime_ends_a_turn_and_opens_the_next_which_the_runs_end_closes(store, run):
    first = store.runs.end_turn(run.turn_id, "succeeded", stop_reason="waiting for input")
    end = store.sessions.entry("s", f"{run.id}:turn-end")
    assert end.payload == {
        "turnId": run.turn_id,
        "intentId": run.intent_id,
        "runId": run.id,
        "status": "succeeded",
        "stopReason": "waiting for input",
    }
    assert (first.id, first.status, first.end_seq) == (run.turn_id, "succeeded", end.seq)
    assert first.ended_at is not None

    second = store.runs.start_turn(run.id, "turn-2")
    start = store.sessions.entry("s", "turn-2-start")
    assert start.kind == EntryKind.TURN_START
    assert start.payload == {
        "turnId": "turn-2",
        "intentId": run.intent_id,
        "runId": run.id,
        "attempt": 1,
    }
    assert (second.run_id, second.intent_id, second.attempt) == (run.id, run.intent_id, 1)
    assert (second.status, second.start_seq, second.end_seq) == ("open", start.seq, None)

    store.runs.finish(run.id, "failed", error="provider down", assistant_message=REPLY)
    closed_first, closed_second = store.runs.turns("s")
    assert closed_first == first  # the turn its runtime ended is left as it ended
    last = store.sessions.entry("s", "turn-2-end")
    assert (closed_second.id, closed_second.status, closed_second.end_seq) == (
        "turn-2",
        "failed",
        last.seq,
    )
    assert [p["turnId"] for p in turn_ends(store)] == [run.turn_id, "turn-2"]


def test_a_run_whose_last_turn_its_runtime_ended_ends_without_a_second_turn_end(store, run):
    store.runs.end_turn(run.turn_id, "succeeded")
    before = store.runs.turns("s")
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
    assert store.runs.turns("s") == before
    assert len(turn_ends(store)) == 1
    assert store.sessions.replay("s").messages[-1] == REPLY
    store.forks.fork("s", request_id="f")  # the turn the runtime ended is a boundary


def test_the_finish_turn_check_fails_with_it_patched_out(store, run, monkeypatch):
    """``runs.finish`` closes the run's first turn only while it is open: with
    the check defeated (every status counts as open) it writes that turn's end
    a second time."""
    store.runs.end_turn(run.turn_id, "succeeded")
    monkeypatch.setattr(run_lifecycle, "TURN_OPEN", "succeeded")
    with pytest.raises(Exception, match="turn-end"):
        store.runs.finish(run.id, "succeeded")


def test_ending_a_turn_that_is_not_open_is_conversation_turn_not_open(store, run):
    with pytest.raises(ConversationTurnNotOpenError) as missing:
        store.runs.end_turn("nope", "succeeded")
    assert (missing.value.turn_id, missing.value.session_id, missing.value.status) == (
        "nope",
        None,
        None,
    )
    store.runs.end_turn(run.turn_id, "cancelled")
    with pytest.raises(ConversationTurnNotOpenError) as ended:
        store.runs.end_turn(run.turn_id, "succeeded")
    assert (ended.value.session_id, ended.value.status) == ("s", "cancelled")
    store.runs.finish(run.id, "failed")
    with pytest.raises(ConversationTurnNotOpenError):
        store.runs.end_turn(run.turn_id, "failed")


def test_ending_a_turn_again_in_the_same_status_returns_it_and_writes_nothing(store, run):
    first = store.runs.end_turn(run.turn_id, "incomplete")
    entries = store.sessions.entries("s")
    assert store.runs.end_turn(run.turn_id, "incomplete") == first
    assert store.sessions.entries("s") == entries


@pytest.mark.parametrize("status", sorted(TURN_END_STATUSES))
def test_a_turn_ends_in_any_terminal_turn_status(store, run, status):
    assert store.runs.end_turn(run.turn_id, status).status == status


@pytest.mark.parametrize("status", ["open", "running", "", "SUCCEEDED"])
def test_a_turn_never_ends_in_another_status(store, run, status):
    with pytest.raises(InvalidInputError):
        store.runs.end_turn(run.turn_id, status)
    assert store.runs.turns("s")[0].status == "open"


def test_a_turn_starts_once_the_one_before_it_ended(store, run):
    with pytest.raises(ConversationTurnOpenError) as err:
        store.runs.start_turn(run.id, "turn-2")
    assert (err.value.session_id, err.value.turn_id) == ("s", run.turn_id)
    assert len(store.runs.turns("s")) == 1


def test_the_open_turn_check_fails_with_it_patched_out(store, run, monkeypatch):
    monkeypatch.setattr(run_turns, "open_turn", lambda tx, session_id: None)
    store.runs.start_turn(run.id, "turn-2")  # a defect: two open turns
    assert [t.status for t in store.runs.turns("s")] == ["open", "open"]


def test_starting_a_turn_again_returns_it_and_another_turns_id_is_refused(store, run):
    store.runs.end_turn(run.turn_id, "succeeded")
    second = store.runs.start_turn(run.id, "turn-2")
    entries = store.sessions.entries("s")
    assert store.runs.start_turn(run.id, "turn-2") == second  # a retry
    assert store.sessions.entries("s") == entries
    with pytest.raises(ConversationTurnExistsError) as err:
        store.runs.start_turn(run.id, run.turn_id)  # ended
    assert (err.value.turn_id, err.value.session_id) == (run.turn_id, "s")
    store.sessions.create("t")
    other = store.runs.admit("t", {"q": 2}, user_message=USER)
    with pytest.raises(ConversationTurnExistsError):
        store.runs.start_turn(other.id, "turn-2")  # another run's


def test_a_turn_belongs_to_a_run_that_has_not_ended(store, run):
    store.runs.finish(run.id, "succeeded")
    with pytest.raises(InvalidTransitionError):
        store.runs.start_turn(run.id, "turn-2")
    with pytest.raises(RunNotFoundError):
        store.runs.start_turn("nope", "turn-2")
    assert len(store.runs.turns("s")) == 1


def test_the_ended_run_check_fails_with_it_patched_out(store, run, monkeypatch):
    store.runs.finish(run.id, "succeeded")
    monkeypatch.setattr(run_turns, "TERMINAL", frozenset())
    store.runs.start_turn(run.id, "turn-2")  # a defect: a turn nothing will close
    assert store.runs.turns("s")[-1].status == "open"


def test_a_turn_ends_with_every_tool_call_answered(store, run):
    store.sessions.append("s", "message", call("c1"))
    with pytest.raises(ToolCallsUnansweredError) as err:
        store.runs.end_turn(run.turn_id, "cancelled")
    assert err.value.tool_call_ids == ("c1",)
    assert store.runs.turns("s")[0].status == "open"
    store.sessions.append("s", "message", result("c1"))
    assert store.runs.end_turn(run.turn_id, "cancelled").status == "cancelled"


def test_the_unanswered_call_check_fails_with_it_patched_out(store, run, monkeypatch):
    real = run_turns.tool_pairing.open_at_head

    def nothing_open(tx: Any, session_id: str, head: Any, known: Any) -> Any:
        found = real(tx, session_id, head, known)
        return type(found)(found.leaf_id, found.next_seq)

    monkeypatch.setattr(run_turns.tool_pairing, "open_at_head", nothing_open)
    store.sessions.append("s", "message", call("c1"))
    store.runs.end_turn(run.turn_id, "cancelled")  # a defect: a call the turn left open


def leased_run(store, ttl: float = 30) -> tuple[Any, Any]:
    """A session ``s`` held by ``w1`` and its running run."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w1", ttl, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease, start=True)
    return lease, run


def test_turn_writes_are_session_writes(store):
    lease, run = leased_run(store)
    with pytest.raises(BusyError):
        store.runs.end_turn(run.turn_id, "succeeded")
    store.runs.end_turn(run.turn_id, "succeeded", lease=lease)
    with pytest.raises(BusyError):
        store.runs.start_turn(run.id, "turn-2")
    assert len(store.runs.turns("s")) == 1
    store.runs.start_turn(run.id, "turn-2", lease=lease)
    store.sessions.create("t")
    other = store.leases.acquire("session:t", "w1", 30)
    with pytest.raises(InvalidInputError):
        store.runs.end_turn("turn-2", "succeeded", lease=other)


def test_a_stale_holder_cannot_write_a_turn(store, clock):
    stale, run = leased_run(store, ttl=1)
    clock.advance(5)
    store.leases.acquire("session:s", "r1", 30, purpose="recovery")
    with pytest.raises(LeaseLostError):
        store.runs.end_turn(run.turn_id, "succeeded", lease=stale)
    with pytest.raises(LeaseLostError):
        store.runs.start_turn(run.id, "turn-2", lease=stale)
    assert [t.status for t in store.runs.turns("s")] == ["open"]


@pytest.mark.parametrize("write", ["start_turn", "end_turn"])
def test_the_unheld_check_fails_with_it_patched_out(store, monkeypatch, write):
    _, run = leased_run(store)
    monkeypatch.setattr(leases, "fence_or_unheld", lambda tx, target, lease: None)
    if write == "start_turn":
        monkeypatch.setattr(run_turns, "open_turn", lambda tx, session_id: None)
        store.runs.start_turn(run.id, "turn-2")  # a defect: past the holder
    else:
        store.runs.end_turn(run.turn_id, "succeeded")  # a defect: past the holder


def test_the_audit_stays_clean_over_turns_events_and_runs(store):
    """A run over three turns, with a tool call answered inside one, its own
    events and a retry: every check of ``turnkeeper audit`` passes."""
    from turnkeeper.storage.audit import run_audit

    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, start=True)
    store.runs.record_event(run.id, "tool_started", {"tool": "bash"})
    store.sessions.append("s", "message", call("c1"))
    store.sessions.append("s", "message", result("c1"))
    store.runs.end_turn(run.turn_id, "succeeded")
    store.runs.wait(run.id)
    store.runs.resume(run.id)
    store.runs.start_turn(run.id, "turn-2")
    store.runs.end_turn("turn-2", "incomplete")
    store.runs.start_turn(run.id, "turn-3")
    store.runs.finish(run.id, "failed", error="x", assistant_message=REPLY)
    retry = store.runs.admit("s", {"q": 1}, user_message=USER, retry_of=run.id, start=True)
    store.runs.finish(retry.id, "succeeded", assistant_message=REPLY)
    failed = [(c.name, c.detail) for c in run_audit(store, ["s"]) if not c.passed]
    assert failed == []
    assert [t.status for t in store.runs.turns("s")] == [
        "succeeded",
        "incomplete",
        "failed",
        "succeeded",
    ]
