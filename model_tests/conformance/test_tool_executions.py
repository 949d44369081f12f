"""Tool-execution records (DESIGN machine 5): claim, complete, interrupt, explicit
recovery requests, automatic reclaim, abandonment and run-error annotation.

The rules under test: a second claimer gets the existing record, never a
second execution; no tool is re-run silently (a side-effecting call runs
again only after an explicit request); no output is invented (an
interrupted call gets one explicit interrupted result in the transcript).
"""

from __future__ import annotations

import hashlib
import math
import threading
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import pytest

import turnkeeper
from turnkeeper import (
    BusyError,
    InvalidInputError,
    InvalidTransitionError,
    LeaseLostError,
    RunNotFoundError,
    SessionNotFoundError,
    ToolExecution,
    ToolExecutionNotFoundError,
    ToolExecutionNotReclaimableError,
    ToolExecutionState,
)
from turnkeeper.spec.tool_execution import INTERRUPTED_TEXT

USER = {"role": "user", "content": "go"}


def claim(
    store, key: str = "k", *, sid: str = "s", turn: str = "t", side: bool = True, **kw: Any
) -> tuple[ToolExecution, bool]:
    if store.sessions.get(sid) is None:
        store.sessions.create(sid)
    kw.setdefault("provider_call_id", f"call-{key}")
    kw.setdefault("tool_name", "bash")
    return store.tools.claim(key, sid, local_turn_id=turn, side_effecting=side, **kw)


def tool_call_message(*call_ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "toolCall", "id": c, "name": "bash", "arguments": {"cmd": c}} for c in call_ids
        ],
        "stopReason": "toolUse",
    }


def tool_results(store, sid: str = "s") -> dict[str, list[dict[str, Any]]]:
    """Every toolResult message in the session, by toolCallId."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in store.sessions.entries(sid):
        msg = e.payload.get("message") if e.kind == "message" else None
        if msg and msg.get("role") == "toolResult":
            out.setdefault(msg["toolCallId"], []).append(msg)
    return out


def states(store, sid: str = "s") -> dict[str, str]:
    return {r.execution_key: r.state for r in store.tools.list(sid)}


def events(store, key: str | None = None) -> list[str]:
    """The edges applied (to ``key``), in insertion order."""
    where = "" if key is None else f" WHERE execution_key = '{key}'"
    # an append-only table's physical order is its insertion order (test-only)
    order = "ctid" if store.db.dialect.name == "postgres" else "rowid"
    rows = store.query(f"SELECT edge FROM tool_execution_events{where} ORDER BY {order}")
    rows = rows.to_pylist()
    return [r["edge"] for r in rows]


def count(store, table: str) -> int:
    return int(store.query(f"SELECT count(*) AS n FROM {table}").to_pylist()[0]["n"])


# -- claim ---------------------------------------------------------------------------


def test_a_claim_creates_a_running_record_with_a_digest_of_the_arguments(store, clock):
    rec, created = claim(store, arguments={"b": 1, "a": [1, 2]}, provider="openai", api="resp")
    assert created
    assert (rec.state, rec.attempt, rec.side_effecting) == ("running", 1, True)
    assert (rec.result, rec.is_error, rec.reason, rec.completed_at) == (None, False, None, None)
    assert rec.created_at == rec.updated_at == clock.now
    canonical = orjson.dumps({"a": [1, 2], "b": 1}, option=orjson.OPT_SORT_KEYS)
    assert rec.args_digest == hashlib.sha256(canonical).hexdigest()
    assert (rec.provider, rec.api, rec.provider_metadata) == ("openai", "resp", {})
    assert store.tools.get("k") == rec
    assert events(store) == ["claim"]


def test_a_second_claimer_gets_the_existing_record_and_nothing_is_written(store, clock):
    first, _ = claim(store, arguments={"x": 1})
    clock.advance(1)
    again, created = claim(store, arguments={"x": 1})
    assert not created and again == first  # consult it; never a second execution
    with pytest.raises(turnkeeper.ToolExecutionConflictError):  # another call's claim
        claim(store, arguments={"x": 2}, side=False, tool_name="other")
    store.tools.complete("k", {"out": 1})
    done, created = claim(store, arguments={"x": 1})
    assert not created and (done.state, done.result) == ("completed", {"out": 1})
    assert events(store) == ["claim", "complete"]


@pytest.mark.parametrize("same_call", [True, False])
def test_concurrent_claimers_of_one_key_create_exactly_one_record(real_store, same_call):
    real_store.sessions.create("s")
    barrier = threading.Barrier(6)
    results: list[tuple[ToolExecution, bool]] = []
    failures: list[BaseException] = []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results.append(
                real_store.tools.claim(
                    "shared",
                    "s",
                    local_turn_id="t",
                    provider_call_id="c",
                    tool_name="bash",
                    side_effecting=True,
                    arguments={"worker": 0 if same_call else i},
                )
            )
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not same_call:  # five other calls' claims of a key the winner took
        assert len(failures) == 5
        assert all(isinstance(f, turnkeeper.ToolExecutionConflictError) for f in failures)
        assert [created for _, created in results] == [True]
        assert count(real_store, "tool_executions") == 1 and events(real_store) == ["claim"]
        return
    assert failures == []
    assert sorted(created for _, created in results) == [False] * 5 + [True]
    winner = next(r for r, created in results if created)
    assert all(r == winner for r, _ in results)
    assert count(real_store, "tool_executions") == 1 and events(real_store) == ["claim"]


def test_claim_needs_the_session_and_a_run_of_that_session(store):
    with pytest.raises(SessionNotFoundError):
        store.tools.claim(
            "k", "nope", local_turn_id="t", provider_call_id="c", tool_name="x", side_effecting=True
        )
    store.sessions.create("s")
    with pytest.raises(RunNotFoundError):
        claim(store, run_id="missing")
    store.sessions.create("other")
    run = store.runs.admit("other", {"q": 1})
    with pytest.raises(InvalidInputError) as err:  # its own turn: the session decides
        claim(store, run_id=run.id, turn=run.turn_id)
    assert err.value.field == "run_id"
    mine = store.runs.admit("s", {"q": 1})
    rec, _ = claim(store, run_id=mine.id, turn=mine.turn_id)
    assert (rec.run_id, rec.local_turn_id) == (mine.id, mine.turn_id)
    assert count(store, "tool_executions") == 1


def test_a_fenced_claim_with_a_lost_lease_writes_nothing(store, clock):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 1, purpose="execution")
    rec, _ = claim(store, "a", lease=lease)
    assert rec.lease_epoch == lease.epoch
    clock.advance(2)
    with pytest.raises(LeaseLostError):
        claim(store, "b", lease=lease)
    assert store.tools.get("b") is None
    fenced = store.query("SELECT operation FROM fence_events").to_pylist()
    assert fenced == [{"operation": "claim_tool_execution"}]


# -- complete ----------------------------------------------------------------------


def test_complete_records_the_tools_own_result_once(store, clock):
    claim(store)
    clock.advance(1)
    done = store.tools.complete("k", {"exit": 1}, is_error=True)
    assert (done.state, done.result, done.is_error) == ("completed", {"exit": 1}, True)
    assert done.completed_at == clock.now
    assert store.tools.complete("k", {"exit": 1}, is_error=True) == done  # retried commit
    with pytest.raises(InvalidTransitionError):
        store.tools.complete("k", {"exit": 0})
    assert store.tools.get("k") == done
    assert events(store) == ["claim", "complete"]
    with pytest.raises(ToolExecutionNotFoundError):
        store.tools.complete("missing", {})


def test_a_late_completion_after_an_interruption_is_refused(store):
    claim(store)
    store.tools.interrupt("s")
    with pytest.raises(InvalidTransitionError) as err:
        store.tools.complete("k", {"out": "late"})
    assert (err.value.trigger, err.value.source) == ("complete", "interrupted")
    rec = store.tools.get("k")
    assert rec.state == "interrupted" and rec.result is None


def test_complete_fences_its_lease_and_refuses_another_sessions_lease(store, clock):
    store.sessions.create("s")
    store.sessions.create("t")
    lease = store.leases.acquire("session:s", "w", 1)
    claim(store, lease=lease)
    other = store.leases.acquire("session:t", "w", 5)
    with pytest.raises(InvalidInputError):
        store.tools.complete("k", {}, lease=other)
    clock.advance(2)
    with pytest.raises(LeaseLostError):
        store.tools.complete("k", {}, lease=lease)
    assert store.tools.get("k").state == "running"


# -- interrupt: an explicit interrupted result, never an invented output ------------------


def test_interrupting_pairs_every_tool_call_with_an_explicit_interrupted_result(store):
    store.sessions.create("s")
    store.sessions.append("s", "message", {"message": tool_call_message("c1", "c2", "c3")})
    claim(store, "k1", provider_call_id="c1")
    claim(store, "k2", provider_call_id="c2", side=False)
    claim(store, "k3", provider_call_id="c3")
    store.tools.complete("k3", {"out": "real"})
    store.sessions.append(
        "s",
        "message",
        {
            "message": {
                "role": "toolResult",
                "toolCallId": "c3",
                "toolName": "bash",
                "content": [{"type": "text", "text": "real"}],
                "isError": False,
            }
        },
    )
    done = store.tools.interrupt("s")
    assert [r.execution_key for r in done] == ["k1", "k2"]
    assert all(r.state == "interrupted" and r.reason == "process lost" for r in done)
    assert states(store) == {"k1": "interrupted", "k2": "interrupted", "k3": "completed"}
    results = tool_results(store)
    assert {c: len(m) for c, m in results.items()} == {"c1": 1, "c2": 1, "c3": 1}
    for call in ("c1", "c2"):
        (msg,) = results[call]
        assert msg["isError"] is True and msg["toolName"] == "bash"
        assert msg["content"] == [{"type": "text", "text": INTERRUPTED_TEXT}]  # no output
    assert results["c3"][0]["content"][0]["text"] == "real"
    entry = store.sessions.entry("s", "k1:interrupted")
    assert entry is not None and entry.kind == "message"
    replayed = [m["role"] for m in store.sessions.replay("s").messages]
    assert replayed == ["assistant", "toolResult", "toolResult", "toolResult"]
    assert store.tools.interrupt("s") == []  # nothing running: a no-op
    assert len(store.sessions.entries("s")) == 4


@pytest.mark.parametrize("how", ["interrupt", "abandon"])
def test_interrupted_results_follow_the_calls_order_not_the_records(store, how):
    """Issue 17 item 3, on the paths that write interrupted results from records:
    records claimed (and keyed) in the reverse of the calls' order still give
    the transcript its results in call order."""
    store.sessions.create("s")
    store.sessions.append("s", "message", {"message": tool_call_message("c1", "c2", "c3")})
    for key, call_id in (("x", "c3"), ("y", "c2"), ("z", "c1")):
        claim(store, key, provider_call_id=call_id)
    if how == "interrupt":
        store.tools.interrupt("s")
    else:
        store.tools.abandon_interrupted("s", "t")
    replayed = store.sessions.replay("s").messages
    assert [m.get("toolCallId") for m in replayed[1:]] == ["c1", "c2", "c3"]
    assert [m["details"]["executionKey"] for m in replayed[1:]] == ["z", "y", "x"]


def test_a_call_whose_result_reached_the_transcript_gets_no_second_result(store):
    store.sessions.create("s")
    store.sessions.append("s", "message", {"message": tool_call_message("c1")})
    claim(store, provider_call_id="c1")
    result = {"role": "toolResult", "toolCallId": "c1", "toolName": "bash", "content": []}
    store.sessions.append("s", "message", {"message": result | {"isError": False}})
    (rec,) = store.tools.interrupt("s")  # crashed before complete_tool_execution
    assert rec.state == "interrupted"
    assert [len(v) for v in tool_results(store).values()] == [1]


def test_interrupt_can_be_limited_to_one_turn(store):
    claim(store, "a", turn="t1")
    claim(store, "b", turn="t2")
    assert [r.execution_key for r in store.tools.interrupt("s", local_turn_id="t2")] == ["b"]
    assert states(store) == {"a": "running", "b": "interrupted"}


def test_interrupt_refuses_while_another_owner_holds_a_live_session_lease(store, clock):
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "worker", 10, purpose="execution")
    store.sessions.append("s", "message", {"message": tool_call_message("call-k")}, lease=worker)
    claim(store, lease=worker)
    with pytest.raises(BusyError) as err:
        store.tools.interrupt("s")
    assert err.value.holder == "worker"
    assert states(store) == {"k": "running"} and len(store.sessions.entries("s")) == 1
    (rec,) = store.tools.interrupt("s", lease=worker)  # the owner itself may
    assert rec.state == "interrupted"
    assert store.sessions.entry("s", "k:interrupted").lease_epoch == worker.epoch


def test_interrupt_after_the_owner_is_gone(store, clock):
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "worker", 1, purpose="execution")
    claim(store, lease=worker)
    clock.advance(2)
    with pytest.raises(LeaseLostError):
        store.tools.interrupt("s", lease=worker)
    assert states(store) == {"k": "running"}
    assert [r.state for r in store.tools.interrupt("s")] == ["interrupted"]
    with pytest.raises(SessionNotFoundError):
        store.tools.interrupt("nope")


# -- explicit recovery requests ----------------------------------------------------------


def test_recovery_requests_only_mark_selected_interrupted_side_effecting_calls(store):
    claim(store, "side", provider_call_id="c-side")
    claim(store, "read", provider_call_id="c-read", side=False)
    claim(store, "left", provider_call_id="c-left")
    claim(store, "done", provider_call_id="c-done")
    claim(store, "other-turn", provider_call_id="c-side", turn="t2")
    store.tools.complete("done", {"ok": True})
    store.tools.interrupt("s")
    claim(store, "busy", provider_call_id="c-busy")
    before = store.tools.get("done")
    picked = store.tools.request_recovery(
        "s", "t", ["c-side", "c-read", "c-done", "c-busy", "c-unknown"]
    )
    assert [(r.execution_key, r.state) for r in picked] == [("side", "retry_requested")]
    assert store.tools.get("done") == before  # completed records never change
    assert states(store) == {
        "side": "retry_requested",
        "read": "interrupted",  # read-only: reclaimed automatically, no confirmation
        "left": "interrupted",  # not selected
        "done": "completed",
        "other-turn": "interrupted",
        "busy": "running",
    }
    again = store.tools.request_recovery("s", "t", ["c-side"])
    assert [r.execution_key for r in again] == ["side"]
    assert events(store, "side") == ["claim", "interrupt", "request_retry"]
    assert store.tools.request_recovery("s", "t", []) == []
    assert store.tools.get("side").state == "retry_requested"  # nothing executed
    with pytest.raises(SessionNotFoundError):
        store.tools.request_recovery("nope", "t", ["c"])


# -- reclaim: automatic for read-only calls, confirmed for side effects -----------------------


def test_read_only_calls_are_reclaimed_automatically(store):
    claim(store, "running", side=False)
    claim(store, "interrupted", side=False)
    store.tools.interrupt("s")
    claim(store, "running", side=False)
    reopened = store.tools.reclaim("interrupted")
    rec = store.tools.get("interrupted")
    assert reopened == rec
    assert (rec.state, rec.attempt, rec.reason) == ("running", 2, None)
    assert events(store, "interrupted") == ["claim", "interrupt", "reclaim_interrupted"]
    claim(store, "live", side=False)
    assert store.tools.reclaim("live").attempt == 2
    assert store.tools.get("live").attempt == 2


def not_reclaimable(store, key: str, source: str, reason: str) -> ToolExecutionNotReclaimableError:
    """Reclaiming ``key`` is refused from ``source`` for ``reason``, writing nothing."""
    before = store.tools.get(key)
    with pytest.raises(ToolExecutionNotReclaimableError) as err:
        store.tools.reclaim(key)
    assert (err.value.execution_key, err.value.source, err.value.reason) == (key, source, reason)
    assert (err.value.machine, err.value.trigger) == ("tool_execution", "reclaim")
    assert isinstance(err.value, InvalidTransitionError)
    assert store.tools.get(key) == before
    return err.value


def test_a_side_effecting_call_is_never_rerun_without_an_explicit_request(store):
    """Issue 17 item 9: a refused reclaim says why (it was a bare ``False``)."""
    claim(store, "pay")
    err = not_reclaimable(store, "pay", "running", "needs_confirmation")
    assert "side effects" in str(err) and "once the record is interrupted" in str(err)
    store.tools.interrupt("s")
    err = not_reclaimable(store, "pay", "interrupted", "needs_confirmation")
    assert "tools.request_recovery" in str(err)
    rec = store.tools.get("pay")
    assert (rec.state, rec.attempt) == ("interrupted", 1)
    assert claim(store, "pay") == (rec, False)  # claiming again is no way around it
    store.tools.request_recovery("s", "t", ["call-pay"])
    assert store.tools.reclaim("pay").state == "running"
    not_reclaimable(store, "pay", "running", "needs_confirmation")  # one confirmation, one re-run
    rec = store.tools.get("pay")
    assert (rec.state, rec.attempt) == ("running", 2)
    assert events(store, "pay") == ["claim", "interrupt", "request_retry", "reclaim_confirmed"]


def test_completed_and_abandoned_records_are_never_reopened(store):
    claim(store, "done", side=False)
    store.tools.complete("done", {"v": 1})
    claim(store, "gone", side=False)
    store.tools.abandon_interrupted("s", "t")
    err = not_reclaimable(store, "done", "completed", "terminal")
    assert "use its stored result" in str(err)
    err = not_reclaimable(store, "gone", "abandoned", "terminal")
    assert "a new run makes a new call" in str(err)
    with pytest.raises(ToolExecutionNotFoundError):
        store.tools.reclaim("missing")


def test_a_refused_reclaim_pickles_with_its_fields():
    import pickle

    err = ToolExecutionNotReclaimableError("k", "interrupted", "needs_confirmation")
    again = pickle.loads(pickle.dumps(err))
    assert (again.execution_key, again.source, again.reason, again.machine, again.trigger) == (
        "k",
        "interrupted",
        "needs_confirmation",
        "tool_execution",
        "reclaim",
    )
    assert str(again) == str(err)


def test_reclaim_refuses_while_another_owner_holds_the_session(store, clock):
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "worker", 10)
    claim(store, side=False, lease=worker)
    with pytest.raises(BusyError):
        store.tools.reclaim("k")
    assert store.tools.get("k").attempt == 1
    store.leases.release(worker)
    successor = store.leases.acquire("session:s", "successor", 10)
    assert store.tools.reclaim("k", lease=successor).lease_epoch == successor.epoch
    rec = store.tools.get("k")
    assert (rec.attempt, rec.lease_epoch) == (2, successor.epoch)


# -- abandon -------------------------------------------------------------------------------


def test_abandon_ends_every_uncertain_call_of_the_turn_without_running_anything(store):
    store.sessions.create("s")
    store.sessions.append("s", "message", {"message": tool_call_message("c1", "c2")})
    claim(store, "interrupted", provider_call_id="c1")
    claim(store, "requested", provider_call_id="c2")
    store.tools.interrupt("s")  # closes c1 and c2
    store.tools.request_recovery("s", "t", ["c2"])
    store.sessions.append("s", "message", {"message": tool_call_message("c3", "c4")})
    claim(store, "running", provider_call_id="c3", side=False)
    claim(store, "done", provider_call_id="c4")
    store.tools.complete("done", {"ok": 1})
    claim(store, "elsewhere", turn="t2")
    n = store.tools.abandon_interrupted("s", "t", reason="user moved on")
    assert n == 3
    assert states(store) == {
        "interrupted": "abandoned",
        "requested": "abandoned",
        "running": "abandoned",
        "done": "completed",
        "elsewhere": "running",
    }
    rec = store.tools.get("running")
    assert rec.reason == "user moved on" and rec.completed_at is not None
    results = tool_results(store)
    assert {c: len(m) for c, m in results.items()} == {"c1": 1, "c2": 1, "c3": 1}
    assert results["c3"][0]["content"] == [{"type": "text", "text": INTERRUPTED_TEXT}]
    assert store.tools.abandon_interrupted("s", "t") == 0
    again, created = claim(store, "requested", provider_call_id="c2")
    assert not created and again.state == "abandoned"  # a new run needs a new key
    not_reclaimable(store, "requested", "abandoned", "terminal")


def test_abandon_refuses_while_a_runtime_owns_the_session(store):
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "worker", 10)
    claim(store, lease=worker)
    with pytest.raises(BusyError):
        store.tools.abandon_interrupted("s", "t")
    assert states(store) == {"k": "running"}
    assert store.tools.abandon_interrupted("s", "t", lease=worker) == 1


# -- annotate_run_error ----------------------------------------------------------------------


def test_annotate_run_error_fills_a_missing_terminal_reason_only(store):
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER)
    with pytest.raises(InvalidTransitionError):  # not ended: finish_run ends a run
        store.runs.annotate_error(run.id, "too early")
    assert store.runs.get(run.id).error is None
    store.runs.finish(run.id, "abandoned")
    assert store.runs.annotate_error(run.id, "abandoned after interrupted tool execution")
    assert not store.runs.annotate_error(run.id, "a later finalizer")
    got = store.runs.get(run.id)
    assert (got.status, got.error) == ("abandoned", "abandoned after interrupted tool execution")
    second = store.runs.admit("s", {"q": 2})
    store.runs.finish(second.id, "failed", error="the first word")
    assert not store.runs.annotate_error(second.id, "overwrite")
    assert store.runs.get(second.id).error == "the first word"
    with pytest.raises(RunNotFoundError):
        store.runs.annotate_error("missing", "x")


def test_a_succeeded_run_is_never_annotated_with_an_error(store):
    """A finished run's outcome is final: a cleanup pass cannot make a success
    look like a failure."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1})
    store.runs.start(run.id)
    store.runs.finish(run.id, "succeeded")
    with pytest.raises(InvalidTransitionError) as err:
        store.runs.annotate_error(run.id, "abandoned by cleanup")
    assert (err.value.machine, err.value.source) == ("run", "succeeded")
    got = store.runs.get(run.id)
    assert (got.status, got.error) == ("succeeded", None)


def test_a_background_run_abandoned_after_an_interrupted_tool_execution(store, clock):
    """The seed's scenario end to end: the worker dies mid-tool; recovery interrupts
    the call (an explicit result), ends the run, and the user abandons the call."""
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "worker", 1, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=worker)
    store.runs.start(run.id, lease=worker)
    store.sessions.append("s", "message", {"message": tool_call_message("c1")}, lease=worker)
    claim(store, "k1", provider_call_id="c1", run_id=run.id, turn=run.turn_id, lease=worker)
    clock.advance(2)  # the worker is gone
    rec_lease = store.leases.acquire("session:s", "rec", 10, purpose="recovery")
    store.recovery.begin(run.id, rec_lease)
    store.tools.interrupt("s", local_turn_id=run.turn_id, lease=rec_lease)
    store.recovery.converge(run.id, rec_lease, status="abandoned")
    assert store.tools.abandon_interrupted("s", run.turn_id, lease=rec_lease) == 1
    with pytest.raises(BusyError):  # the recovery worker still holds the session
        store.runs.annotate_error(run.id, "abandoned after interrupted tool execution")
    assert store.runs.annotate_error(
        run.id, "abandoned after interrupted tool execution", lease=rec_lease
    )
    with pytest.raises(LeaseLostError):
        store.tools.complete("k1", {"out": "late"}, lease=worker)
    assert store.runs.get(run.id).status == "abandoned"
    assert store.tools.get("k1").state == "abandoned"
    assert [len(v) for v in tool_results(store).values()] == [1]
    kinds = [e.kind for e in store.sessions.entries("s")]
    assert kinds == ["turn_start", "message", "message", "message", "turn_end"]


# -- input validation: refused before anything is written ------------------------------------


NAN = math.nan


@pytest.mark.parametrize(
    "kwargs",
    [
        {"execution_key": ""},
        {"execution_key": 5},
        {"session_id": ""},
        {"local_turn_id": ""},
        {"provider_call_id": ""},
        {"tool_name": "\ud800"},
        {"side_effecting": 1},
        {"side_effecting": "no"},
        {"arguments": {"x": NAN}},
        {"arguments": {"x": object()}},
        {"run_id": ""},
        {"provider": None},
        {"provider_metadata": ["not", "a", "mapping"]},
        {"lease": "lease"},
    ],
    ids=lambda kw: next(iter(kw)),
)
def test_bad_claims_are_refused_and_write_nothing(store, kwargs):
    store.sessions.create("s")
    args: dict[str, Any] = {
        "execution_key": "k",
        "session_id": "s",
        "local_turn_id": "t",
        "provider_call_id": "c",
        "tool_name": "bash",
        "side_effecting": True,
    } | kwargs
    key, sid = args.pop("execution_key"), args.pop("session_id")
    with pytest.raises(InvalidInputError):
        store.tools.claim(key, sid, **args)
    assert count(store, "tool_executions") == 0 and count(store, "tool_execution_events") == 0


def test_a_lease_on_another_session_never_fences_a_claim(store):
    store.sessions.create("s")
    store.sessions.create("t")
    other = store.leases.acquire("session:t", "w", 5)
    with pytest.raises(InvalidInputError):
        claim(store, lease=other)
    assert count(store, "tool_executions") == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.tools.complete("k", {"x": NAN}),
        lambda s: s.tools.complete("k", {1, 2}),
        lambda s: s.tools.complete("k", {}, is_error="yes"),
        lambda s: s.tools.complete("", {}),
        lambda s: s.tools.interrupt(""),
        lambda s: s.tools.interrupt("s", local_turn_id=""),
        lambda s: s.tools.interrupt("s", reason=""),
        lambda s: s.tools.request_recovery("s", "t", "call-k"),
        lambda s: s.tools.request_recovery("s", "t", [""]),
        lambda s: s.tools.request_recovery("s", "t", [1]),
        lambda s: s.tools.request_recovery("s", "", ["call-k"]),
        lambda s: s.tools.reclaim(""),
        lambda s: s.tools.reclaim("k", lease="lease"),
        lambda s: s.tools.abandon_interrupted("s", ""),
        lambda s: s.tools.abandon_interrupted("s", "t", reason=""),
        lambda s: s.runs.annotate_error("", "x"),
        lambda s: s.runs.annotate_error("r", ""),
        lambda s: s.tools.get(""),
        lambda s: s.tools.list(""),
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(store, call):
    rec, _ = claim(store)
    with pytest.raises(InvalidInputError):
        call(store)
    assert store.tools.get("k") == rec
    assert events(store) == ["claim"] and store.sessions.entries("s") == []


def test_the_record_and_state_are_exported():
    assert turnkeeper.ToolExecution is ToolExecution
    assert {s.value for s in ToolExecutionState} == {
        "running",
        "completed",
        "interrupted",
        "retry_requested",
        "abandoned",
    }


def test_a_call_with_no_record_gets_an_interrupted_result_when_the_turn_closes(store):
    """The process died after writing the assistant toolCall but before claiming
    its record: convergence still pairs the call, with no invented output."""
    store.sessions.create("np")
    run = store.runs.admit("np", {"t": 1}, user_message={"role": "user", "content": "x"})
    store.runs.start(run.id)
    call = {"type": "toolCall", "id": "c1", "name": "rm", "arguments": {}}
    store.sessions.append("np", "message", {"message": {"role": "assistant", "content": [call]}})
    rescue = store.leases.acquire("session:np", "rec", 30, purpose="recovery")
    store.recovery.begin(run.id, rescue)
    store.recovery.converge(run.id, rescue)
    result = store.sessions.entry("np", f"{run.id}:c1:interrupted")
    assert result is not None and result.lease_epoch == rescue.epoch
    message = result.payload["message"]
    assert (message["role"], message["toolCallId"], message["toolName"]) == (
        "toolResult",
        "c1",
        "rm",
    )
    assert message["isError"] is True and "no output" in message["content"][0]["text"]
    roles = [m["role"] for m in store.sessions.replay("np").messages]
    assert roles == ["user", "assistant", "toolResult"]


def test_a_run_that_ends_while_its_tool_runs_interrupts_the_record(store):
    store.sessions.create("rt")
    lease = store.leases.acquire("session:rt", "w", 30, purpose="execution")
    run = store.runs.admit("rt", {"t": 1}, lease=lease)
    store.runs.start(run.id, lease=lease)
    store.tools.claim(
        "k-rt",
        "rt",
        local_turn_id=run.turn_id,
        provider_call_id="c9",
        tool_name="bash",
        side_effecting=True,
        run_id=run.id,
        lease=lease,
    )
    call = {"type": "toolCall", "id": "c9", "name": "bash", "arguments": {}}
    store.sessions.append(
        "rt", "message", {"message": {"role": "assistant", "content": [call]}}, lease=lease
    )
    store.runs.finish(run.id, "failed", error="model error", lease=lease)
    rec = store.tools.get("k-rt")
    assert rec.state == "interrupted" and rec.reason == "the run ended failed"
    assert store.sessions.entry("rt", "k-rt:interrupted").payload["message"]["toolCallId"] == "c9"
    assert store.sessions.entry("rt", f"{run.id}:c9:interrupted") is None  # paired once


def test_a_reclaimed_call_moves_to_the_fresh_run_that_re_executes_it(store):
    """The seed's flow: recovery interrupts a read-only call and ends the run; a
    fresh run reclaims the call (a terminal run is never reactivated)."""
    store.sessions.create("rc")
    run = store.runs.admit("rc", {"t": 1})
    store.runs.start(run.id)
    store.tools.claim(
        "k-rc",
        "rc",
        local_turn_id=run.turn_id,
        provider_call_id="c1",
        tool_name="read",
        side_effecting=False,
        run_id=run.id,
    )
    rescue = store.leases.acquire("session:rc", "rec", 30, purpose="recovery")
    store.recovery.begin(run.id, rescue)
    store.recovery.converge(run.id, rescue)
    store.leases.release(rescue)
    assert store.tools.get("k-rc").state == "interrupted"
    with pytest.raises(InvalidInputError) as err:  # its run ended: name the fresh one
        store.tools.reclaim("k-rc")
    assert err.value.field == "run_id"
    with pytest.raises(InvalidInputError):
        store.tools.reclaim("k-rc", run_id=run.id)  # terminal
    fresh = store.runs.admit("rc", {"t": 1}, retry_of=run.id)
    assert store.tools.reclaim("k-rc", run_id=fresh.id).run_id == fresh.id
    rec = store.tools.get("k-rc")
    assert (rec.state, rec.run_id, rec.local_turn_id, rec.attempt) == (
        "running",
        fresh.id,
        fresh.turn_id,
        2,
    )


def test_a_completed_call_whose_result_never_reached_the_transcript_gets_its_own_result(store):
    """The tool ran and its record completed, then the process died before it
    appended the toolResult: the turn closes with the recorded output, not an
    'interrupted' text that would invite running a side effect again."""
    store.sessions.create("cr")
    run = store.runs.admit("cr", {"t": 1})
    store.runs.start(run.id)
    claim(store, "k-cr", sid="cr", turn=run.turn_id, run_id=run.id, provider_call_id="c1")
    store.sessions.append("cr", "message", {"message": tool_call_message("c1")})
    store.tools.complete("k-cr", {"stdout": "REAL OUTPUT"})
    rescue = store.leases.acquire("session:cr", "rec", 30, purpose="recovery")
    store.recovery.begin(run.id, rescue)
    store.recovery.converge(run.id, rescue)
    (result,) = tool_results(store, "cr")["c1"]
    assert '"REAL OUTPUT"' in result["content"][0]["text"]
    assert result["isError"] is False and result["details"]["fromRecord"] is True


def test_tool_writes_without_a_lease_wait_for_the_session_holder(store):
    store.sessions.create("tw")
    worker = store.leases.acquire("session:tw", "w", 30, purpose="execution")
    run = store.runs.admit("tw", {"t": 1}, lease=worker)
    with pytest.raises(BusyError):
        claim(store, "k-tw", sid="tw", turn=run.turn_id, run_id=run.id)
    claim(store, "k-tw", sid="tw", turn=run.turn_id, run_id=run.id, lease=worker)
    with pytest.raises(BusyError):
        store.tools.complete("k-tw", "ok")
    with pytest.raises(InvalidInputError) as err:  # the record's turn must be the run's
        claim(store, "k-tw2", sid="tw", turn="other", run_id=run.id, lease=worker)
    assert err.value.field == "local_turn_id"
    store.runs.finish(run.id, "failed", lease=worker)
    with pytest.raises(InvalidInputError) as err:  # an ended run takes no new calls
        claim(store, "k-tw3", sid="tw", turn=run.turn_id, run_id=run.id, lease=worker)
    assert err.value.field == "run_id"


def test_a_final_reply_with_a_tool_call_is_refused(store):
    store.sessions.create("fr")
    run = store.runs.admit("fr", {"t": 1})
    store.runs.start(run.id)
    with pytest.raises(InvalidInputError) as err:
        store.runs.finish(run.id, "succeeded", assistant_message=tool_call_message("f1"))
    assert err.value.field == "assistant_message"
    assert store.runs.get(run.id).status == "running"


def test_the_store_derived_entry_ids_are_reserved(store):
    store.sessions.create("rs")
    run = store.runs.admit("rs", {"t": 1})
    for suffix in (":turn-end", ":assistant", ":interrupted"):
        with pytest.raises(InvalidInputError) as err:
            store.sessions.append(
                "rs",
                "message",
                {"message": {"role": "user", "content": "x"}},
                entry_id=f"{run.id}{suffix}",
            )
        assert err.value.field == "entry_id"
    store.runs.finish(run.id, "failed")  # never wedged by a forged id


# -- a record belongs to the call that claimed it -------------------------------------------


def _ended_run_with_a_call(store, sid: str, to: str):
    run = store.runs.admit(sid, {"to": to}, user_message=USER)
    store.runs.start(run.id)
    store.sessions.append(sid, "message", {"message": tool_call_message("call_0")})
    rec, created = store.tools.claim(
        "call_0",
        sid,
        local_turn_id=run.turn_id,
        provider_call_id="call_0",
        tool_name="send",
        side_effecting=True,
        arguments={"to": to},
        run_id=run.id,
    )
    assert created
    return run, rec


def test_issue_example_another_runs_claim_never_gets_this_runs_result(store):
    store.sessions.create("s")
    r1, _ = _ended_run_with_a_call(store, "s", "alice")
    store.tools.complete("call_0", {"sent": "alice"})
    store.runs.finish(r1.id, "succeeded")
    r2 = store.runs.admit("s", {"to": "bob"}, user_message=USER)
    store.runs.start(r2.id)
    with pytest.raises(turnkeeper.ToolExecutionConflictError) as err:
        store.tools.claim(
            "call_0",
            "s",
            local_turn_id=r2.turn_id,
            provider_call_id="call_0",
            tool_name="send",
            side_effecting=True,
            arguments={"to": "bob"},
            run_id=r2.id,
        )
    assert (err.value.execution_key, err.value.field, err.value.run_id) == (
        "call_0",
        "run_id",
        r1.id,
    )
    assert store.tools.get("call_0").result == {"sent": "alice"}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"arguments": {"to": "bob"}}, "args_digest"),
        ({"tool_name": "other"}, "tool_name"),
        ({"provider_call_id": "call_1"}, "provider_call_id"),
        ({"side_effecting": False}, "side_effecting"),
        ({"local_turn_id": "another-turn"}, "local_turn_id"),
    ],
)
def test_a_claim_that_differs_in_scope_or_arguments_is_refused(store, change, field):
    store.sessions.create("s")
    run, rec = _ended_run_with_a_call(store, "s", "alice")
    claim_args = {
        "local_turn_id": run.turn_id,
        "provider_call_id": "call_0",
        "tool_name": "send",
        "side_effecting": True,
        "arguments": {"to": "alice"},
        "run_id": run.id,
    }
    again, created = store.tools.claim("call_0", "s", **claim_args)
    assert (again, created) == (rec, False)  # a retried claim of the same call
    with pytest.raises(turnkeeper.ToolExecutionConflictError) as err:
        store.tools.claim("call_0", "s", **(claim_args | change))
    assert err.value.field == field
    assert store.tools.get("call_0") == rec


def test_a_claim_from_another_session_is_refused(store):
    store.sessions.create("s")
    store.sessions.create("t")
    _ended_run_with_a_call(store, "s", "alice")
    with pytest.raises(turnkeeper.ToolExecutionConflictError) as err:
        store.tools.claim(
            "call_0", "t", local_turn_id="x", provider_call_id="call_0", tool_name="send",
            side_effecting=True, arguments={"to": "alice"},
        )  # fmt: skip
    assert err.value.field == "session_id"


def test_a_reclaimed_record_belongs_to_the_fresh_run(store):
    store.sessions.create("s")
    r1, _ = _ended_run_with_a_call(store, "s", "alice")
    store.runs.finish(r1.id, "interrupted")
    assert store.tools.request_recovery("s", r1.turn_id, ["call_0"])
    r2 = store.runs.admit("s", {"to": "alice"}, retry_of=r1.id)
    store.runs.start(r2.id)
    assert store.tools.reclaim("call_0", run_id=r2.id)
    common = {
        "provider_call_id": "call_0",
        "tool_name": "send",
        "side_effecting": True,
        "arguments": {"to": "alice"},
    }
    rec, created = store.tools.claim(
        "call_0", "s", local_turn_id=r2.turn_id, run_id=r2.id, **common
    )
    assert (created, rec.run_id, rec.attempt) == (False, r2.id, 2)
    with pytest.raises(turnkeeper.ToolExecutionConflictError):
        store.tools.claim("call_0", "s", local_turn_id=r1.turn_id, run_id=r1.id, **common)


@pytest.mark.postgres
def test_a_turn_closes_its_calls_in_call_order_whatever_order_the_database_lists_them() -> None:
    """Found by an attack helper: on a PostgreSQL database whose collation is
    not C (ICU en-US here; most servers' default is a language's), a run
    that ended with running tool calls wrote their interrupted results in
    code-point order of the execution keys, while the session's records
    (session_tool_executions) list them in the database's order. Issue 17
    item 3: neither decides; the results follow the calls' order in their
    assistant message, as a provider reads them."""
    import psycopg
    from conftest import pg_url

    from turnkeeper.fuzz import FakeClock

    url = pg_url()
    name = f"tk_icu_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' "
            "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'"
        )
    parts = urlsplit(url)
    try:
        where = urlunsplit(parts._replace(path=f"/{name}"))
        with turnkeeper.open_store(where, clock=FakeClock()) as store:
            store.sessions.create("s")
            lease = store.leases.acquire("session:s", "w", 600, purpose="execution")
            run = store.runs.admit("s", {"q": 1}, lease=lease, start=True)
            keys = {"B-key": "c1", "a-key": "c2", "Z-key": "c3", "m-key": "c4"}
            turn = {"message": tool_call_message(*keys.values())}
            store.sessions.append("s", "message", turn, lease=lease)
            for key, call_id in keys.items():
                claim(
                    store,
                    key,
                    turn=run.turn_id,
                    provider_call_id=call_id,
                    tool_name="t",
                    run_id=run.id,
                    lease=lease,
                )
            listed = [keys[r.execution_key] for r in store.tools.list("s")]
            assert listed == ["c2", "c1", "c4", "c3"]  # a, B, m, Z: not code-point order
            store.runs.finish(run.id, "failed", error="boom", lease=lease)
            results = [
                e.payload["message"]["toolCallId"]
                for e in store.sessions.entries("s")
                if e.payload.get("message", {}).get("role") == "toolResult"
            ]
            assert results == ["c1", "c2", "c3", "c4"]  # the calls' order, not the records'
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.mark.parametrize("how", ["interrupt", "run end"])
def test_a_reclaimed_call_interrupted_again_gets_its_second_interrupted_result(store, how):
    """Found while checking the paths that write results from records (issue 17
    item 3): a read-only call interrupted, reclaimed by a fresh run and
    interrupted again had its second interrupted result refused, because both
    took the id ``<execution key>:interrupted`` (EntryExistsError): the
    interrupt, or the run's end and so its recovery, could never succeed. A
    later attempt's result is ``<execution key>:<attempt>:interrupted``."""
    store.sessions.create("s")
    r1 = store.runs.admit("s", {"q": 1}, user_message=USER, start=True)
    store.sessions.append("s", "message", {"message": tool_call_message("c1")})
    claim(store, "k", turn=r1.turn_id, run_id=r1.id, provider_call_id="c1", side=False)
    store.runs.finish(r1.id, "interrupted")  # the first process died: interrupted, paired
    assert store.sessions.entry("s", "k:interrupted") is not None
    r2 = store.runs.admit("s", {"q": 1}, retry_of=r1.id, user_message=USER, start=True)
    store.tools.reclaim("k", run_id=r2.id)
    store.sessions.append("s", "message", {"message": tool_call_message("c1")})  # the call again
    if how == "interrupt":
        (rec,) = store.tools.interrupt("s")
    else:
        store.runs.finish(r2.id, "interrupted")
        rec = store.tools.get("k")
    assert (rec.state, rec.attempt) == ("interrupted", 2)
    again = store.sessions.entry("s", "k:2:interrupted")
    assert again is not None and again.payload["message"]["details"]["attempt"] == 2
    assert [m["role"] for m in store.sessions.replay("s").messages][-2:] == [
        "assistant",
        "toolResult",
    ]
