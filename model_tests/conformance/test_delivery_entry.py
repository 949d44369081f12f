"""The outbox carries what it delivers (issue 20): a step names the session entry
it delivers, checked when the plan is created, and the worker reads the entry
beside its claim (``outbox.delivered_entry``)."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from turnkeeper import (
    DeliveryOperationNotFoundError,
    DeliveryPlan,
    DeliveryStep,
    EntryKind,
    InvalidInputError,
)
from turnkeeper.spec.errors import EntryNotFoundError
from turnkeeper.storage.ops import entry_rows, outbox_plans

USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "the answer"}]}


@pytest.fixture
def store(any_store: Any) -> Any:
    """Each backend, called directly and through ``turnkeeper.aio``."""
    return any_store


def _plan(*steps: DeliveryStep) -> DeliveryPlan:
    return DeliveryPlan("chat", "room-1", steps, reply_message_id="m-1")


def _started(store, sid: str = "s"):
    if store.sessions.get(sid) is None:
        store.sessions.create(sid)
    run = store.runs.admit(sid, {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    return run


def _nothing_planned(store, run) -> None:
    assert store.outbox.get_plan(f"{run.id}:delivery") is None
    assert store.query("SELECT count(*) FROM delivery_operations").column(0).to_pylist() == [0]


def test_the_claimed_operation_names_its_entry_and_the_worker_reads_it(store):
    run = _started(store)
    steps = (
        DeliveryStep("upload", "attachment", artifact_id="a1"),
        DeliveryStep("send", "message", depends_on="upload", entry_id=run.assistant_entry_id),
    )
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, delivery_plan=_plan(*steps))
    _, ops = store.outbox.get_plan(f"{run.id}:delivery")
    assert [o.entry_id for o in ops] == [None, run.assistant_entry_id]
    upload = store.outbox.claim(ops[0].id, "w", 30)
    assert upload.entry_id is None and store.outbox.delivered_entry(upload.id) is None
    store.outbox.finish(upload.id, "w", upload.lease_epoch, "delivered")
    send = store.outbox.claim(ops[1].id, "w", 30)
    assert send.entry_id == run.assistant_entry_id
    body = store.outbox.delivered_entry(send.id)
    assert body.id == run.assistant_entry_id and body.session_id == "s"
    assert body.payload["message"] == REPLY
    # the same plan again (a retry) is the stored one, its entry included
    assert store.outbox.create_plan(run.id, _plan(*steps)).id == f"{run.id}:delivery"


def test_a_plan_naming_a_missing_entry_is_refused_and_writes_nothing(store):
    run = _started(store)
    store.sessions.create("other")
    elsewhere = store.sessions.append("other", EntryKind.MESSAGE, {"message": USER})
    with pytest.raises(EntryNotFoundError) as refused:
        store.runs.finish(
            run.id,
            "succeeded",
            assistant_message=REPLY,
            delivery_plan=_plan(DeliveryStep("send", "message", entry_id="nope")),
        )
    assert (refused.value.session_id, refused.value.entry_id) == ("s", "nope")
    assert store.runs.get(run.id).status == "running"  # the termination rolled back
    _nothing_planned(store, run)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
    for missing in ("nope", elsewhere.id):  # another session's entry is not this one's
        with pytest.raises(EntryNotFoundError):
            store.outbox.create_plan(
                run.id, _plan(DeliveryStep("send", "message", entry_id=missing))
            )
        _nothing_planned(store, run)
    with pytest.raises(InvalidInputError) as bad:
        store.outbox.create_plan(run.id, _plan(DeliveryStep("send", "message", entry_id="")))
    assert bad.value.field == "plan.steps[0].entry_id"
    _nothing_planned(store, run)


def test_control_without_the_existence_check_the_plan_names_a_missing_entry(store, monkeypatch):
    """Control: with the check answering "found", the plan is written naming an
    entry the session lacks, and only the worker's read finds out."""
    run = _started(store)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
    real = entry_rows.entry
    monkeypatch.setattr(outbox_plans.entry_rows, "entry", lambda tx, s, e: object())
    store.outbox.create_plan(run.id, _plan(DeliveryStep("send", "message", entry_id="nope")))
    monkeypatch.setattr(outbox_plans.entry_rows, "entry", real)
    with pytest.raises(EntryNotFoundError):
        store.outbox.delivered_entry(f"{run.id}:delivery:send")


def test_delivered_entry_refuses_typed(store):
    with pytest.raises(DeliveryOperationNotFoundError):
        store.outbox.delivered_entry("r:delivery:send")
    with pytest.raises(InvalidInputError):
        store.outbox.delivered_entry("")


def test_a_plan_without_entries_keeps_its_schema_27_digest():
    """A plan stored before schema 28 and sent again after the upgrade must
    match its stored digest (else DeliveryPlanConflictError on a retry)."""
    p = _plan(DeliveryStep("upload", "attachment", "a1", None, "k", "d"))
    body = {
        "platform": p.platform,
        "target": p.target_id,
        "reply": p.reply_message_id,
        "context": {},
        "steps": [["upload", "attachment", "a1", None, "k", "d"]],
    }
    old = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert outbox_plans.plan_digest(p) == old
    named = _plan(DeliveryStep("upload", "attachment", "a1", None, "k", "d", entry_id="e"))
    assert outbox_plans.plan_digest(named) != old
