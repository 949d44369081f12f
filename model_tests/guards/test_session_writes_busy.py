"""One rule for every write to a session: under its lease, or while nobody holds it.

A lease-less write while someone else holds the session's live lease is
``BusyError(target, holder)`` and writes nothing, whatever kind of session
write it is; the holder's next fenced write then goes through unaffected.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind, ResponseState
from turnkeeper.spec.records import ImportBatch, ImportEntry

MSG = {"message": {"role": "user", "content": "x"}}
PLAN = DeliveryPlan(platform="chat", target_id="room", steps=(DeliveryStep("send", "message"),))


def _snapshot(store) -> tuple:
    session = store.sessions.get("s")
    return (
        session.leaf_id,
        session.entry_count,
        session.title,
        tuple(store.sessions.entries("s")),
        tuple(store.runs.list("s")),
        store.lineage.get("s"),
        tuple(store.tools.list("s")),
        store.sessions.labels("s"),
        tuple(store.usage.list("s")),
    )


@pytest.fixture
def held(store):
    """Session ``s`` with history (a succeeded run, then a failed one with no
    error), held by ``p1``."""
    store.sessions.create("s")
    first = store.sessions.append("s", EntryKind.MESSAGE, MSG)
    done = store.runs.admit("s", {"text": "done"})
    store.runs.start(done.id)
    store.runs.finish(done.id, "succeeded")
    run = store.runs.admit("s", {"text": "go"})
    store.runs.start(run.id)
    store.runs.finish(run.id, "failed")
    p1 = store.leases.acquire("session:s", "p1", 600, purpose="execution")
    return store, p1, first, run


def _import(sid: str) -> ImportBatch:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    entry = ImportEntry("imp-1", None, EntryKind.MESSAGE, when, MSG)
    return ImportBatch(sid, "", when, {}, [entry], "imp-1")


WRITES = {
    "append": lambda s, first, run: s.sessions.append("s", EntryKind.MESSAGE, MSG),
    "append-expected-leaf": lambda s, first, run: s.sessions.append(
        "s", EntryKind.MESSAGE, MSG, expected_leaf=s.sessions.get("s").leaf_id
    ),
    "branch": lambda s, first, run: s.sessions.branch("s", first.id),
    "branch-reset": lambda s, first, run: s.sessions.branch("s", None),
    "branch-with-summary": lambda s, first, run: s.sessions.branch_with_summary(
        "s", first.id, "left"
    ),
    "label": lambda s, first, run: s.sessions.set_label("s", first.id, "important"),
    "title": lambda s, first, run: s.sessions.set_title("s", "a title"),
    "compaction": lambda s, first, run: s.sessions.append(
        "s", EntryKind.COMPACTION, {"summary": "sum", "firstKeptEntryId": first.id}
    ),
    "model-change": lambda s, first, run: s.sessions.append(
        "s", EntryKind.MODEL_CHANGE, {"provider": "p", "modelId": "m"}
    ),
    "import": lambda s, first, run: s.sessions.import_batch(_import("s")),
    "response-lineage": lambda s, first, run: s.lineage.compare_and_swap(
        ResponseState("s", "responses", "resp-1"), 0
    ),
    "fork": lambda s, first, run: s.forks.fork("s", request_id="f1"),
    "delivery-plan": lambda s, first, run: s.outbox.create_plan(run.id, PLAN),
    "annotate-run-error": lambda s, first, run: s.runs.annotate_error(run.id, "cleanup"),
    "admit-run": lambda s, first, run: s.runs.admit("s", {"text": "again"}),
    "retry-run": lambda s, first, run: s.runs.admit("s", {"text": "go"}, retry_of=run.id),
    "interrupt-tools": lambda s, first, run: s.tools.interrupt("s"),
    "abandon-tools": lambda s, first, run: s.tools.abandon_interrupted("s", run.turn_id),
    "claim-tool": lambda s, first, run: s.tools.claim(
        "k", "s", local_turn_id="t", provider_call_id="c", tool_name="x", side_effecting=False
    ),
    "run-usage": lambda s, first, run: s.runs.update_usage(run.id, {"input": 1}),
    "run-progress": lambda s, first, run: s.runs.update_progress(run.id, {}),
    "run-error-info": lambda s, first, run: s.runs.update_error_info(run.id, {"code": "c"}),
    "record-usage": lambda s, first, run: s.usage.record("s", provider="p", model="m"),
    "record-usage-from-provider": lambda s, first, run: s.usage.record_from_provider(
        "s", {"input_tokens": 1, "output_tokens": 1}, provider="p", model="m", run_id=run.id
    ),
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_lease_less_session_write_while_another_holds_the_session_is_busy(held, name):
    store, p1, first, run = held
    before = _snapshot(store)
    with pytest.raises(turnkeeper.BusyError) as err:
        WRITES[name](store, first, run)
    assert (err.value.target, err.value.holder) == ("session:s", "p1")
    assert _snapshot(store) == before
    assert store.forks.get("f1") is None
    # the holder's next fenced append sees the leaf it knew: nothing moved under it
    store.sessions.append("s", EntryKind.MESSAGE, MSG, expected_leaf=before[0], lease=p1)


@pytest.mark.parametrize("name", sorted(WRITES))
def test_the_same_write_goes_through_once_nobody_holds_the_session(held, name):
    store, p1, first, run = held
    store.leases.release(p1)
    WRITES[name](store, first, run)


LEASED = {
    "append": lambda s, p1, first, run: s.sessions.append("s", EntryKind.MESSAGE, MSG, lease=p1),
    "branch": lambda s, p1, first, run: s.sessions.branch("s", first.id, lease=p1),
    "label": lambda s, p1, first, run: s.sessions.set_label("s", first.id, "x", lease=p1),
    "title": lambda s, p1, first, run: s.sessions.set_title("s", "t", lease=p1),
    "import": lambda s, p1, first, run: s.sessions.import_batch(_import("s"), lease=p1),
    "response-lineage": lambda s, p1, first, run: s.lineage.compare_and_swap(
        ResponseState("s", "responses", "resp-1"), 0, lease=p1
    ),
    "delivery-plan": lambda s, p1, first, run: s.outbox.create_plan(run.id, PLAN, lease=p1),
    "annotate-run-error": lambda s, p1, first, run: s.runs.annotate_error(
        run.id, "cleanup", lease=p1
    ),
    "run-usage": lambda s, p1, first, run: s.runs.update_usage(run.id, {"input": 1}, lease=p1),
    "run-progress": lambda s, p1, first, run: s.runs.update_progress(run.id, {}, lease=p1),
    "run-error-info": lambda s, p1, first, run: s.runs.update_error_info(
        run.id, {"code": "c"}, lease=p1
    ),
    "record-usage": lambda s, p1, first, run: s.usage.record(
        "s", provider="p", model="m", lease=p1
    ),
}


@pytest.mark.parametrize("name", sorted(LEASED))
def test_the_holder_writes_under_its_lease_and_a_lost_lease_is_refused(held, clock, name):
    store, p1, first, run = held
    LEASED[name](store, p1, first, run)
    clock.advance(601)
    p2 = store.leases.acquire("session:s", "p2", 600)
    before = _snapshot(store)
    with pytest.raises(turnkeeper.LeaseLostError):
        LEASED[name](store, p1, first, run)
    assert _snapshot(store) == before
    assert p2.epoch == p1.epoch + 1


def test_the_issue_example_the_holder_is_never_modified_under(store):
    store.sessions.create("s")
    p1 = store.leases.acquire("session:s", "p1", 30, purpose="execution")
    h = store.sessions.append("s", EntryKind.MESSAGE, MSG, lease=p1).id
    with pytest.raises(turnkeeper.BusyError):
        store.sessions.append(
            "s", EntryKind.MESSAGE, {"message": {"role": "user"}}, expected_leaf=h
        )
    store.sessions.append("s", EntryKind.MESSAGE, MSG, expected_leaf=h, lease=p1)


def test_a_fork_of_a_held_session_is_busy_and_active(held):
    store = held[0]
    with pytest.raises(turnkeeper.ForkSessionActiveError) as err:
        store.forks.fork("s", request_id="f")
    assert isinstance(err.value, turnkeeper.BusyError)
    assert err.value.session_id == "s" and err.value.holder == "p1"


def test_a_runtime_lease_on_a_session_not_yet_created_is_refused(store):
    """A runtime creates the session, then takes its lease (seed
    ErrRuntimeSessionNotFound): a lease on a session that does not exist is
    refused, grants nothing, and the session can then be created and leased."""
    with pytest.raises(turnkeeper.RuntimeSessionNotFoundError) as caught:
        store.leases.acquire("session:new", "p1", 30)
    assert caught.value.session_id == "new"
    assert store.query("SELECT count(*) AS n FROM leases").to_pylist() == [{"n": 0}]
    store.sessions.create("new")
    lease = store.leases.acquire("session:new", "p1", 30)
    store.sessions.append("new", EntryKind.MESSAGE, MSG, lease=lease)
