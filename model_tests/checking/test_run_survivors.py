"""Fixed tests for holes the second mutation net found in the storage-runs
area (``storage/ops/run_lifecycle.py``, ``run_admission.py``,
``recovery.py``); each test's docstring names its module and hole
(``mutation_net/survivors.py`` names the mutants it kills).

- a finish: the ``turn_end``'s ``stopReason``, the error it returns and
  records, a final reply without a ``toolCall``, its own entry ids held by a
  forged entry, a first turn with no row, entries written once, entries that
  leave a call open or are no message, a repeated finish that brings a plan
  (a fence), the error and stop reason as text, ``finished_at``;
- an admission: a retry of the intent's latest attempt only, the run's
  model, the intent fields as text;
- a recovery: a dead-lettered one is neither begun nor converged, and its
  arguments are checked.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import forge
from test_conformance_runs import ASSISTANT, USER, count
from test_recovery import admitted, recovery_lease

from turnkeeper import (
    BusyError,
    DeliveryPlan,
    DeliveryStep,
    EntryExistsError,
    InvalidInputError,
    InvalidTransitionError,
    LeaseLostError,
    RecoveryNotNeededError,
    RetryNotAllowedError,
)


def _turn_end(store, sid: str) -> dict:
    (end,) = [e for e in store.sessions.entries(sid) if e.kind == "turn_end"]
    payload = end.payload
    return json.loads(payload) if isinstance(payload, str | bytes) else dict(payload)


@pytest.mark.parametrize("stop_reason", ["stop", None])
def test_the_turn_end_carries_the_stop_reason_exactly_when_given(store, stop_reason):
    store.sessions.create("s")
    run = store.runs.admit("s", {"n": 1}, user_message=USER, start=True)
    store.runs.finish(run.id, "succeeded", assistant_message=ASSISTANT, stop_reason=stop_reason)
    end = _turn_end(store, "s")
    assert end.get("stopReason") == stop_reason
    assert ("stopReason" in end) == (stop_reason is not None)


def test_finish_returns_the_run_with_the_error_it_recorded(store):
    store.sessions.create("s")
    run = store.runs.admit("s", {"n": 1}, start=True)
    failed = store.runs.finish(run.id, "failed", error="boom")
    assert (failed.status, failed.error) == ("failed", "boom")
    assert failed == store.runs.get(run.id)
    other = store.runs.admit("s", {"n": 2}, start=True)
    done = store.runs.finish(other.id, "succeeded")
    assert (done.status, done.error) == ("succeeded", None)


def test_a_final_reply_with_a_tool_call_is_refused_and_text_is_taken(store):
    store.sessions.create("s")
    run = store.runs.admit("s", {"n": 1}, user_message=USER, start=True)
    call = {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {}}
    before = (store.sessions.entries("s"), count(store, "run_events"))
    with pytest.raises(InvalidInputError, match="toolCall") as err:
        store.runs.finish(
            run.id,
            "succeeded",
            assistant_message={
                "role": "assistant",
                "content": [{"type": "text", "text": "x"}, call],
            },
        )
    assert err.value.field == "assistant_message"
    assert (store.sessions.entries("s"), count(store, "run_events")) == before
    for i, content in enumerate(([{"type": "text", "text": "done"}], "done as a string")):
        reply = {"role": "assistant", "content": content}
        if i:
            run = store.runs.admit("s", {"n": 2}, user_message=USER, start=True)
        assert store.runs.finish(run.id, "succeeded", assistant_message=reply).status == "succeeded"
        assert store.sessions.replay("s").messages[-1] == reply


def test_a_retry_of_an_attempt_not_the_latest_names_the_latest(store):
    """Holes in ``storage/ops/run_admission.py``: a retry must be of the intent's
    latest attempt, and the refusal names that attempt."""
    store.sessions.create("s")
    first = store.runs.admit("s", {"n": 1}, start=True)
    store.runs.finish(first.id, "failed", error="boom")
    second = store.runs.admit("s", {"n": 1}, retry_of=first.id, start=True)
    store.runs.finish(second.id, "failed", error="boom")
    with pytest.raises(RetryNotAllowedError, match="attempt 2 is the intent's latest"):
        store.runs.admit("s", {"n": 1}, retry_of=first.id)


def test_a_begin_on_a_dead_lettered_recovery_is_not_needed(store):
    """A hole in ``storage/ops/recovery.py``: a parked (dead-lettered) recovery
    has no begin edge; beginning it again is ``RecoveryNotNeededError`` naming
    the state, and writes nothing."""
    run = admitted(store)
    lease = recovery_lease(store, ttl=1000)
    store.recovery.begin(run.id, lease)
    dead = store.recovery.fail(run.id, lease, "down", max_attempts=1)
    assert dead.state == "dead_lettered"
    with pytest.raises(RecoveryNotNeededError, match="its recovery is dead_lettered"):
        store.recovery.begin(run.id, lease)  # the lease that parked it: not "already began"
    store.leases.release(lease)
    again = recovery_lease(store, owner="rec2")
    with pytest.raises(RecoveryNotNeededError, match="its recovery is dead_lettered"):
        store.recovery.begin(run.id, again)
    with pytest.raises(InvalidTransitionError) as err:  # converging needs a running recovery
        store.recovery.converge(run.id, again)
    assert (err.value.trigger, err.value.source) == ("converge", "dead_lettered")
    assert store.recovery.get(run.id) == dead
    other = admitted(store, "t")
    with pytest.raises(InvalidTransitionError) as err:  # none begun
        store.recovery.converge(other.id, recovery_lease(store, "t"))
    assert (err.value.trigger, err.value.source) == ("converge", "absent")


def test_a_converge_to_no_run_status_and_a_fail_without_a_delay_are_refused(store):
    """Holes in ``storage/ops/recovery.py``'s argument checks: a convergence's
    status must be a run status (else ``InvalidInputError`` on ``status``), and
    a failed recovery's backoff base and cap must be above zero (each named
    when it is not), and the base may equal the cap; its error and stop
    reason must be text. None of the refused calls writes."""
    run = admitted(store)
    lease = recovery_lease(store, ttl=1000)
    begun = store.recovery.begin(run.id, lease)
    with pytest.raises(InvalidInputError) as err:
        store.recovery.converge(run.id, lease, status="done")
    assert err.value.field == "status"
    for field, bad in (("error", 5), ("stop_reason", "\ud800")):
        with pytest.raises(InvalidInputError) as err:
            store.recovery.converge(run.id, lease, status="failed", **{field: bad})
        assert err.value.field == field
    for field in ("base_delay_s", "max_delay_s"):
        with pytest.raises(InvalidInputError) as err:
            store.recovery.fail(run.id, lease, "down", **{field: 0})
        assert err.value.field == field
    assert store.recovery.get(run.id) == begun
    assert store.runs.get(run.id).status == "running"
    failed = store.recovery.fail(run.id, lease, "down", base_delay_s=10, max_delay_s=10)
    assert failed.state == "failed"


def _entry_ids(store, sid: str) -> list[str]:
    """The session's entry ids in seq order, read without their payloads."""
    sql = "SELECT id FROM entries WHERE session_id = ? ORDER BY seq"
    return [r["id"] for r in store.query(sql, [sid]).to_pylist()]


def _execution(store, sid: str, leased: bool):
    """An execution lease on ``sid`` (``leased``), else ``None``."""
    return store.leases.acquire(f"session:{sid}", "w", 60, purpose="execution") if leased else None


@pytest.mark.parametrize("leased", [False, True], ids=["unleased", "leased"])
@pytest.mark.parametrize("suffix", [":assistant", ":turn-end"], ids=["reply", "turn_end"])
def test_an_own_id_a_forged_entry_holds_refuses_the_finish(store, leased, suffix):
    """A hole in ``storage/ops/run_lifecycle.py``: the ids of the run's reply
    (``<run id>:assistant``) and of its turn's end (``<run id>:turn-end``) may
    be taken by an entry the store did not write (an import, damage; forged
    here), so each is looked up (``chosen``) and a taken one refuses the
    finish with EntryExistsError naming it; nothing is written, and the run
    stays running. (The forged row is read by id only: on an encrypted store
    its payload, sealed under its old id, fails authentication, as it should.)"""
    store.sessions.create("s")
    lease = _execution(store, "s", leased)
    run = store.runs.admit("s", {"n": 1}, user_message=USER, start=True, lease=lease)
    store.sessions.append("s", "message", {"message": USER}, entry_id="x", lease=lease)
    taken = run.id + suffix
    forge(store, "UPDATE entries SET id = ? WHERE session_id = 's' AND id = 'x'", [taken], rows=1)
    before = (_entry_ids(store, "s"), count(store, "run_events"))
    reply = ASSISTANT if suffix == ":assistant" else None
    with pytest.raises(EntryExistsError) as err:
        store.runs.finish(run.id, "succeeded", assistant_message=reply, lease=lease)
    assert (err.value.session_id, err.value.entry_id) == ("s", taken)
    assert (_entry_ids(store, "s"), count(store, "run_events")) == before
    assert store.runs.get(run.id).status == "running"


@pytest.mark.parametrize("leased", [False, True], ids=["unleased", "leased"])
def test_a_run_whose_turn_row_is_gone_ends_without_a_turn_end(store, leased):
    """A hole in ``storage/ops/run_lifecycle.py``: a run's first turn with no
    row (forged away: an open turn is a row ``open``) is no open turn, so the
    finish writes no ``turn_end`` for it (there is none to end), on the path
    that reads the turn with the fence (leased) and on the one that reads it
    alone; the run still ends with its reply."""
    store.sessions.create("s")
    lease = _execution(store, "s", leased)
    run = store.runs.admit("s", {"n": 1}, user_message=USER, start=True, lease=lease)
    forge(store, "DELETE FROM conversation_turns WHERE id = ?", [run.turn_id], rows=1)
    done = store.runs.finish(run.id, "succeeded", assistant_message=ASSISTANT, lease=lease)
    assert done.status == "succeeded"
    kinds = [e.kind for e in store.sessions.entries("s")]
    assert kinds == ["turn_start", "message", "message"]
    assert store.sessions.replay("s").messages[-1] == ASSISTANT


def test_each_run_stores_the_model_its_intent_names(store):
    """A hole in ``storage/ops/run_admission.py``: the run row keeps its
    intent's model (what ``turnkeeper report`` groups runs by): a first
    attempt takes the new intent's, a retry and a saved intent's run the
    stored intent's (a retry's own intent fields name nothing: its intent is
    its run's)."""
    store.sessions.create("s")
    first = store.runs.admit("s", {"n": 1}, model="m1", start=True)
    store.runs.finish(first.id, "failed", error="boom")
    retry = store.runs.admit("s", {"n": 1}, retry_of=first.id, start=True)  # (model "")
    store.runs.finish(retry.id, "failed", error="boom")
    store.runs.save_intent("s", {"n": 2}, model="m2", intent_id="i2")
    saved = store.runs.admit("s", {"n": 2}, model="m2", intent_id="i2")
    rows = store.query("SELECT id, model FROM runs ORDER BY attempt, model").to_pylist()
    assert [(r["id"], r["model"]) for r in rows] == [
        (first.id, "m1"),
        (saved.id, "m2"),
        (retry.id, "m1"),
    ]


def test_an_unleased_finish_writes_its_entries_once(store):
    """A hole in ``storage/ops/run_lifecycle.py``: a finish with ``entries``
    and no lease writes them at once (no head was read with a fence to judge
    them at), so they are never written a second time with the reply, even
    when they leave no call open; the same with a lease."""
    for sid, leased in (("s", False), ("t", True)):
        store.sessions.create(sid)
        lease = _execution(store, sid, leased)
        run = store.runs.admit(sid, {"n": 1}, user_message=USER, start=True, lease=lease)
        call = {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {}}
        result = {
            "role": "toolResult",
            "toolCallId": "c1",
            "toolName": "bash",
            "content": [{"type": "text", "text": "ok"}],
            "isError": False,
        }
        entries = [
            ("message", {"message": {"role": "assistant", "content": [call]}}),
            ("message", {"message": result}),
        ]
        done = store.runs.finish(
            run.id, "succeeded", assistant_message=ASSISTANT, entries=entries, lease=lease
        )
        assert done.status == "succeeded"
        kinds = [e.kind for e in store.sessions.entries(sid)]
        assert kinds == ["turn_start", "message", "message", "message", "message", "turn_end"]
        messages = list(store.sessions.replay(sid).messages)
        assert messages == [USER, entries[0][1]["message"], result, ASSISTANT]


def test_a_finish_with_entries_that_are_no_messages_at_an_unknown_head(store):
    """A hole in ``storage/ops/run_lifecycle.py``: a store object that does not
    know the calls open at the session's head (a fleet's common case: another
    worker's store object wrote it; here the object's memory of it is
    dropped) finishes the run with entries that are no context message
    (custom entries): what is open after them is then unknown too (no
    opening), so they are written at once, before the reply."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 60, purpose="execution")
    run = store.runs.admit("s", {"n": 1}, user_message=USER, start=True, lease=lease)
    store.runs._openings.put("s", None)  # as if another store object wrote the head
    notes = [("custom", {"customType": "note", "data": {"i": i}}) for i in range(2)]
    done = store.runs.finish(
        run.id, "succeeded", assistant_message=ASSISTANT, entries=notes, lease=lease
    )
    assert done.status == "succeeded"
    kinds = [e.kind for e in store.sessions.entries("s")]
    assert kinds == ["turn_start", "message", "custom", "custom", "message", "turn_end"]


def test_a_finish_with_an_error_or_stop_reason_that_is_no_text_is_refused(store):
    """A hole in ``storage/ops/run_lifecycle.py``'s argument checks: a finish's
    error and stop reason must be text (else InvalidInputError naming the
    field), and nothing is written."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"n": 1}, user_message=USER, start=True)
    before = (store.sessions.entries("s"), count(store, "run_events"))
    for field, bad in (("error", 5), ("stop_reason", "\ud800"), ("stop_reason", ["stop"])):
        with pytest.raises(InvalidInputError) as err:
            store.runs.finish(run.id, "failed", **{field: bad})
        assert err.value.field == field
    assert (store.sessions.entries("s"), count(store, "run_events")) == before
    assert store.runs.get(run.id).status == "running"


def test_a_repeated_finish_that_adds_a_plan_passes_the_fence_and_one_that_has_it_returns(store):
    """A hole in ``storage/ops/run_lifecycle.py``: a finish repeated after an
    unknown commit returns the stored run; when it brings a delivery plan the
    run has none of, writing it is a session write and passes the fence first
    (a forged lease: LeaseLostError; no lease while one is held: BusyError;
    nothing written), and the holder's own repeat writes it. A repeat whose
    plan is already stored writes nothing and so passes no fence: it returns
    the stored run whoever asks."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 60, purpose="execution")
    run = store.runs.admit("s", {"n": 1}, user_message=USER, start=True, lease=lease)
    done = store.runs.finish(run.id, "succeeded", lease=lease)
    plan = DeliveryPlan("chat", "room", (DeliveryStep("send", "message"),))
    forged = dataclasses.replace(lease, token="not-the-token")
    intent = f"{run.id}:delivery"
    for who, error in ((forged, LeaseLostError), (None, BusyError)):
        with pytest.raises(error):
            store.runs.finish(run.id, "succeeded", lease=who, delivery_plan=plan)
        assert store.outbox.get_plan(intent) is None
    assert store.runs.finish(run.id, "succeeded", lease=lease, delivery_plan=plan) == done
    stored = store.outbox.get_plan(intent)
    assert stored is not None
    for who in (forged, None, lease):
        again = store.runs.finish(run.id, "succeeded", lease=who, delivery_plan=plan)
        assert again == done
    assert store.outbox.get_plan(intent) == stored


@pytest.mark.parametrize("field", ["source", "model", "mode", "work_dir"])
def test_an_intent_field_that_is_no_text_is_refused(store, field):
    """A hole in ``storage/ops/run_admission.py``'s argument checks: an
    admission's source, model, mode and work dir must be text (else
    InvalidInputError naming the field), and nothing is written."""
    store.sessions.create("s")
    for bad in (5, "\ud800"):
        with pytest.raises(InvalidInputError) as err:
            store.runs.admit("s", {"n": 1}, user_message=USER, **{field: bad})
        assert err.value.field == field
    assert store.runs.list("s") == []
    assert store.sessions.entries("s") == []


@pytest.mark.parametrize("leased", [False, True], ids=["unleased", "leased"])
def test_a_finish_whose_entries_leave_a_call_open_answers_it_before_the_reply(store, leased):
    """A hole in ``storage/ops/run_lifecycle.py``: a finish whose ``entries``
    end with a tool call and no result is written with them first (never
    deferred to go with the reply: that is only for entries after which no
    call is open), so the call gets its interrupted result between them and
    the reply, and the context stays paired."""
    store.sessions.create("s")
    lease = _execution(store, "s", leased)
    run = store.runs.admit("s", {"n": 1}, user_message=USER, start=True, lease=lease)
    call = {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {}}
    entries = [("message", {"message": {"role": "assistant", "content": [call]}})]
    done = store.runs.finish(
        run.id, "succeeded", assistant_message=ASSISTANT, entries=entries, lease=lease
    )
    assert done.status == "succeeded"
    messages = list(store.sessions.replay("s").messages)
    assert [m["role"] for m in messages] == ["user", "assistant", "toolResult", "assistant"]
    assert messages[2]["toolCallId"] == "c1"
    assert messages[-1] == ASSISTANT


def test_a_run_has_a_finish_time_exactly_once_it_is_terminal(store):
    """A hole in ``storage/ops/run_lifecycle.py``: ``finished_at`` is set by
    the move into a terminal status (to its ``updated_at``) and by no other:
    admitted, running, waiting and running again keep it empty, in the run a
    call returns and in the stored one."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"n": 1}, user_message=USER)
    assert run.finished_at is None
    for step in (store.runs.start, store.runs.wait, store.runs.resume):
        moved = step(run.id)
        assert moved.finished_at is None
        assert store.runs.get(run.id).finished_at is None
    done = store.runs.finish(run.id, "succeeded", assistant_message=ASSISTANT)
    assert done.finished_at is not None
    assert done.finished_at == done.updated_at
    assert store.runs.get(run.id) == done
