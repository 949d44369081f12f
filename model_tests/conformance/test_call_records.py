"""Which tool-execution record answers which tool call, wherever the store writes
results from records (``storage/ops/call_records.py``, ``tool_pairing.py``).

A run's end, its recovery, ``tools.interrupt`` and an abandon close
the calls open at the leaf. Each open call gets the tool's own result only
from the record that belongs to that very call, never from a record of an
earlier call that reused its provider call id (issue 17 item 3, attack round
2 F1); ``tools.interrupt`` closes every open call in call order,
as a run's end does (F4, N1); and the store's own result ids never make an
interrupt or a run's end fail (F5).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import forge

from turnkeeper import EntryKind, ToolCallPairingError, ToolCallsUnansweredError
from turnkeeper.fuzz import FakeClock
from turnkeeper.spec.records import ImportBatch, ImportEntry
from turnkeeper.spec.tool_execution import INTERRUPTED_TEXT
from turnkeeper.storage.audit import run_audit

USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": "done"}


def reads(path: str, call_id: str = "call_0") -> dict[str, Any]:
    block = {"type": "toolCall", "id": call_id, "name": "read", "arguments": {"path": path}}
    return {"message": {"role": "assistant", "content": [block], "stopReason": "toolUse"}}


def calls(*ids: str) -> dict[str, Any]:
    blocks = [{"type": "toolCall", "id": i, "name": "bash", "arguments": {}} for i in ids]
    return {"message": {"role": "assistant", "content": blocks, "stopReason": "toolUse"}}


def own_result(call_id: str, text: str) -> dict[str, Any]:
    content = [{"type": "text", "text": text}]
    message = {"role": "toolResult", "toolCallId": call_id, "content": content, "isError": False}
    return {"message": message}


def claim(store, key: str, run, call_id: str, *, side: bool = False, **kw: Any):
    rec, created = store.tools.claim(
        key,
        run.session_id,
        local_turn_id=run.turn_id,
        provider_call_id=call_id,
        tool_name="read",
        side_effecting=side,
        run_id=run.id,
        **kw,
    )
    assert created
    return rec


def results(store, sid: str = "s") -> list[dict[str, Any]]:
    return [m for m in store.sessions.replay(sid).messages if m["role"] in ("toolResult", "tool")]


def audit_clean(store, sid: str = "s") -> None:
    failed = [(c.name, c.detail) for c in run_audit(store, [sid]) if not c.passed]
    assert failed == []


def is_interrupted(message: dict[str, Any]) -> bool:
    return message["isError"] is True and message["content"] == [
        {"type": "text", "text": INTERRUPTED_TEXT}
    ]


def two_steps(store, clock: FakeClock, *, second_completes: bool):
    """A run's step 1 calls ``call_0`` (read a.txt): its record completes and its
    result goes in. Step 2 reuses the id ``call_0`` (read b.txt); its own record
    is claimed and completed only with ``second_completes``. The clock moves
    between writes, as a real one does."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"t": 1}, user_message=USER, start=True)
    for step, path in ((1, "a.txt"), (2, "b.txt")):
        clock.advance(1)
        store.sessions.append("s", EntryKind.MESSAGE, reads(path))
        if step == 2 and not second_completes:
            break
        clock.advance(1)
        claim(store, f"{run.id}:{step}:call_0", run, "call_0", arguments={"path": path})
        clock.advance(1)
        store.tools.complete(f"{run.id}:{step}:call_0", f"contents of {path}")
        if step == 1:
            clock.advance(1)
            store.sessions.append("s", EntryKind.MESSAGE, own_result("call_0", "contents of a.txt"))
    clock.advance(1)
    return run


def end_by(store, run, how: str) -> None:
    if how == "finish_run":
        store.runs.finish(run.id, "failed", error="worker lost")
        return
    rescue = store.leases.acquire("session:s", "recovery-1", 60, purpose="recovery")
    store.recovery.begin(run.id, rescue)
    store.recovery.converge(run.id, rescue, error="worker lost")
    store.leases.release(rescue)


# -- F1: a reused call id never gets another call's output -----------------------------------


@pytest.mark.parametrize("how", ["finish_run", "recovery"])
def test_a_run_end_never_answers_a_reused_call_id_with_an_earlier_calls_output(store, clock, how):
    """Attack round 2 F1: step 2 reuses ``call_0`` and the worker dies before
    claiming it; the run's end (or recovery) answered it with step 1's
    completed output ("contents of a.txt", isError false, fromRecord). That
    call never ran: it gets the explicit interrupted result."""
    run = two_steps(store, clock, second_completes=False)
    end_by(store, run, how)
    first, second = results(store)
    assert first["content"] == [{"type": "text", "text": "contents of a.txt"}]
    assert is_interrupted(second) and second["details"] == {
        "executionState": "interrupted",
        "recorded": False,
    }
    assert store.sessions.entry("s", f"{run.id}:call_0:interrupted") is not None
    audit_clean(store)


@pytest.mark.parametrize("how", ["finish_run", "recovery"])
def test_a_reused_call_id_gets_the_output_of_its_own_record(store, clock, how):
    """Each call has a record of its own: step 2's completed record (claimed
    after step 2's message) answers step 2, not step 1's."""
    run = two_steps(store, clock, second_completes=True)
    end_by(store, run, how)
    first, second = results(store)
    assert first["content"] == [{"type": "text", "text": "contents of a.txt"}]
    assert second["content"] == [{"type": "text", "text": "contents of b.txt"}]
    assert second["details"]["executionKey"] == f"{run.id}:2:call_0"
    assert second["details"]["fromRecord"] is True and second["isError"] is False


def test_when_the_clock_cannot_tell_which_call_a_record_ran_no_output_is_given(store):
    """Every write at the same instant (a stopped clock): from what is stored,
    the record may belong to step 1's call (claimed before step 2's message
    in that instant) or to step 2's. The store cannot tell, so the open call
    gets the interrupted result: an output it cannot tie to the call is
    never given to it (lost rather than misattributed)."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"t": 1}, user_message=USER, start=True)
    store.sessions.append("s", EntryKind.MESSAGE, reads("a.txt"))
    store.sessions.append("s", EntryKind.MESSAGE, own_result("call_0", "by the runtime"))
    store.sessions.append("s", EntryKind.MESSAGE, reads("b.txt"))
    claim(store, "k", run, "call_0")
    store.tools.complete("k", "contents of ?")
    store.runs.finish(run.id, "failed", error="lost")
    assert is_interrupted(results(store)[-1])


def test_interrupt_never_answers_a_reused_call_id_with_an_earlier_calls_output(store, clock):
    """The same fault through ``tools.interrupt`` (which now closes
    every open call): step 2's unclaimed ``call_0`` is interrupted."""
    two_steps(store, clock, second_completes=False)
    assert store.tools.interrupt("s") == []
    assert is_interrupted(results(store)[-1])


def test_abandon_closes_only_the_calls_its_records_belong_to(store, clock):
    """The same fault through ``tools.abandon_interrupted``: step 1's
    record was left running (the runtime wrote that call's result itself);
    abandoning it must not answer step 2's ``call_0``, another call, with
    its interrupted result."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"t": 1}, user_message=USER, start=True)
    clock.advance(1)
    store.sessions.append("s", EntryKind.MESSAGE, reads("a.txt"))
    clock.advance(1)
    claim(store, "k1", run, "call_0", side=True)
    clock.advance(1)
    store.sessions.append("s", EntryKind.MESSAGE, own_result("call_0", "by the runtime"))
    clock.advance(1)
    store.sessions.append("s", EntryKind.MESSAGE, reads("b.txt"))
    clock.advance(1)
    assert store.tools.abandon_interrupted("s", run.turn_id) == 1
    assert store.tools.get("k1").state == "abandoned"
    assert store.sessions.entry("s", "k1:interrupted") is None
    assert [m["role"] for m in store.sessions.replay("s").messages][-1] == "assistant"  # still open


def test_branching_back_to_a_completed_call_answers_it_with_its_own_result(store, clock):
    """Attack round 2 F4 part B: a run's call completed (its record too) and
    the run ended; the user branches back to the assistant message and a new
    run ends there. The call, open again on the new branch, was answered
    "interrupted … not run again" beside its completed record; it gets the
    tool's own result from that record."""
    store.sessions.create("s")
    r1 = store.runs.admit("s", {"t": 1}, user_message=USER, start=True)
    clock.advance(1)
    asked = store.sessions.append("s", EntryKind.MESSAGE, calls("k1"))
    clock.advance(1)
    claim(store, f"{r1.id}:k1", r1, "k1")
    store.tools.complete(f"{r1.id}:k1", "OUTPUT")
    store.sessions.append("s", EntryKind.MESSAGE, own_result("k1", "OUTPUT"))
    store.runs.finish(r1.id, "succeeded", assistant_message=REPLY)
    clock.advance(1)
    store.sessions.branch("s", asked.id)
    r2 = store.runs.admit("s", {"t": 2}, start=True)
    store.runs.finish(r2.id, "failed", error="x")
    last = results(store)[-1]
    assert last["content"] == [{"type": "text", "text": "OUTPUT"}]
    assert last["details"]["fromRecord"] is True and last["isError"] is False
    assert store.tools.get(f"{r1.id}:k1").state == "completed"
    audit_clean(store)


def test_a_call_left_open_before_its_run_gets_the_output_that_run_recorded(store, clock):
    """A record belongs to a call of its own turn or, when the turn makes none
    with its id, to one left open before the run began (here: calls written
    outside any run, then a run that runs them)."""
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, {"message": USER})
    clock.advance(1)
    store.sessions.append("s", EntryKind.MESSAGE, calls("c1"))
    clock.advance(1)
    run = store.runs.admit("s", {"t": 1}, start=True)
    claim(store, "k", run, "c1")
    store.tools.complete("k", "OUTPUT")
    store.runs.finish(run.id, "failed", error="lost")
    assert results(store)[-1]["content"] == [{"type": "text", "text": "OUTPUT"}]


# -- F4 / N1: interrupt_tool_executions closes every open call, in call order ------------------


def test_interrupt_closes_every_open_call_in_call_order(store, clock):
    """Attack round 2 F4 part A (the README's example): c1 completed (its result
    not written yet), c2 still running. ``tools.interrupt`` wrote
    c2's interrupted result only, so c1's own result, appended after, came
    out of call order ([c2, c1]). It now writes both, in call order: c1's
    own result from its record, c2's interrupted one."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "worker-1", 30, purpose="execution")
    run = store.runs.admit("s", {"t": 1}, user_message=USER, lease=lease, start=True)
    clock.advance(1)
    store.sessions.append("s", EntryKind.MESSAGE, calls("c1", "c2"), lease=lease)
    clock.advance(1)
    claim(store, f"{run.id}:c1", run, "c1", lease=lease)
    claim(store, f"{run.id}:c2", run, "c2", side=True, lease=lease)
    listing = [{"type": "text", "text": "a.txt"}]
    store.tools.complete(f"{run.id}:c1", listing, lease=lease)
    (rec,) = store.tools.interrupt("s", lease=lease)
    assert (rec.execution_key, rec.state) == (f"{run.id}:c2", "interrupted")
    first, second = results(store)
    assert (first["toolCallId"], first["content"], first["isError"]) == ("c1", listing, False)
    assert second["toolCallId"] == "c2" and is_interrupted(second)
    assert store.sessions.entry("s", f"{run.id}:c2:interrupted") is not None
    with pytest.raises(ToolCallPairingError) as err:  # c1 has its result already
        store.sessions.append("s", EntryKind.MESSAGE, own_result("c1", "a.txt"), lease=lease)
    assert err.value.reason == "duplicate"
    store.sessions.append(
        "s", EntryKind.MESSAGE, {"message": {"role": "user", "content": "stop"}}, lease=lease
    )
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, lease=lease)
    audit_clean(store)


def test_interrupt_unblocks_a_session_an_older_turnkeeper_left_with_an_openai_call(store):
    """Attack round 2 N1: a run ended by an older turnkeeper left an OpenAI
    ``tool_calls`` item without a result (and without a record). Every
    ``runs.admit`` with a user message raised ``ToolCallsUnansweredError`` and
    ``tools.interrupt`` returned ``[]`` having written nothing:
    the session could never go on. It now closes the call, in its shape."""
    store.sessions.create("s")
    item = {"id": "o1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    asked = store.sessions.append(
        "s",
        EntryKind.MESSAGE,
        {"message": {"role": "assistant", "content": None, "tool_calls": [item]}},
    )
    with pytest.raises(ToolCallsUnansweredError):
        store.runs.admit("s", {"t": 2}, user_message=USER, start=True)
    assert store.tools.interrupt("s") == []
    answer = store.sessions.entry("s", f"{asked.id}:o1:interrupted")
    assert answer is not None
    message = answer.payload["message"]
    assert (message["role"], message["tool_call_id"]) == ("tool", "o1")
    assert message["content"] == INTERRUPTED_TEXT
    run = store.runs.admit("s", {"t": 2}, user_message=USER, start=True)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
    audit_clean(store)


def test_the_way_out_leaves_a_turn_an_older_turnkeeper_ended_open_passing_the_audit(store):
    """A turn an older turnkeeper ended without closing its OpenAI call (forged:
    the store's result made a ``custom`` entry, no message): the audit fails
    ``tool_calls_paired`` and no message can follow. ``tools.interrupt``
    closes the call right after the turn's end, and the audit then passes."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"t": 1}, user_message=USER, start=True)
    item = {"id": "o1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    store.sessions.append(
        "s", EntryKind.MESSAGE, {"message": {"role": "assistant", "tool_calls": [item]}}
    )
    store.runs.finish(run.id, "failed", error="x")
    forge(
        store,
        "UPDATE entries SET kind = 'custom' WHERE session_id = 's' AND id = ?",
        [f"{run.id}:o1:interrupted"],
        rows=1,
    )
    store.sessions._openings.put("s", None)  # it remembers the head its finish_run left: forget it
    failed = {c.name for c in run_audit(store, ["s"]) if not c.passed}
    assert failed == {"tool_calls_paired"}
    with pytest.raises(ToolCallsUnansweredError):
        store.runs.admit("s", {"t": 2}, user_message=USER)
    assert store.tools.interrupt("s") == []
    audit_clean(store)
    store.runs.admit("s", {"t": 2}, user_message=USER)


def test_interrupt_of_one_turn_still_closes_every_open_call(store, clock):
    """With ``local_turn_id`` only that turn's running records are interrupted
    wholesale, but every call open at the leaf is closed: a running record of
    another turn whose call is open there is interrupted too (its call is
    answered so); one whose call is not open runs on."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"t": 1}, user_message=USER, start=True)
    clock.advance(1)
    store.sessions.append("s", EntryKind.MESSAGE, calls("c1", "c2", "c3"))
    clock.advance(1)
    claim(store, "k1", run, "c1")
    for key, call_id in (("k2", "c2"), ("k-elsewhere", "zz")):
        store.tools.claim(
            key,
            "s",
            local_turn_id="t-other",
            provider_call_id=call_id,
            tool_name="read",
            side_effecting=False,
        )
    done = store.tools.interrupt("s", local_turn_id=run.turn_id)
    assert [r.execution_key for r in done] == ["k1", "k2"]
    assert store.tools.get("k-elsewhere").state == "running"
    found = results(store)
    assert [m["toolCallId"] for m in found] == ["c1", "c2", "c3"]
    assert [m["details"].get("executionKey") for m in found] == ["k1", "k2", None]
    assert all(is_interrupted(m) for m in found)


# -- F5: the store's own result ids never make its write fail ---------------------------------


def _import_taking(store, entry_id: str) -> None:
    """Session ``s``, imported from a file whose one entry has ``entry_id``."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    entry = ImportEntry(entry_id, None, "message", at, {"message": USER})
    store.sessions.import_batch(ImportBatch("s", "/", at, {}, (entry,), entry_id))


@pytest.mark.parametrize("how", ["interrupt", "finish_run", "recovery"])
def test_an_imported_entry_holding_a_result_id_never_blocks_a_run_end(store, how):
    """Attack round 2 F5: an imported entry ``key1:interrupted`` (an id the store
    derives for an interrupted result) made ``tools.interrupt``,
    every ``runs.finish`` and ``recovery.converge`` raise EntryExistsError for
    good: the run stayed running. The result now takes a fresh id."""
    _import_taking(store, "key1:interrupted")
    run = store.runs.admit("s", {"x": 1}, start=True)
    store.sessions.append("s", EntryKind.MESSAGE, calls("c1"))
    claim(store, "key1", run, "c1")
    if how == "interrupt":
        store.tools.interrupt("s")
        store.runs.finish(run.id, "failed", error="x")
    else:
        end_by(store, run, how)
    assert store.runs.get(run.id).status in ("failed", "interrupted")
    assert store.tools.get("key1").state == "interrupted"
    last = results(store)[-1]
    assert last["toolCallId"] == "c1" and is_interrupted(last)
    assert store.sessions.entry("s", "key1:interrupted").payload["message"]["role"] == "user"
    audit_clean(store)


def test_a_call_answered_again_on_another_branch_gets_a_result_of_its_own(store, clock):
    """A call interrupted (``<run>:<call>`` as the execution key, as the README
    suggests) and answered; the leaf moved back to its assistant message in
    the same run and the run ended: the run's end derived the same id
    ``<run>:c1:interrupted`` and failed for good. The second answer takes a
    fresh id."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"t": 1}, user_message=USER, start=True)
    clock.advance(1)
    asked = store.sessions.append("s", EntryKind.MESSAGE, calls("c1"))
    clock.advance(1)
    claim(store, f"{run.id}:c1", run, "c1")
    store.tools.interrupt("s")
    assert store.sessions.entry("s", f"{run.id}:c1:interrupted") is not None
    store.sessions.branch("s", asked.id)
    store.runs.finish(run.id, "failed", error="x")
    assert store.runs.get(run.id).status == "failed"
    assert is_interrupted(results(store)[-1])
    assert len([m for m in store.sessions.replay("s").messages if m["role"] == "toolResult"]) == 1
