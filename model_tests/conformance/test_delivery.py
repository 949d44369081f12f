"""The delivery outbox: plans, claims, fenced updates, dependencies, intent status."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from turnkeeper import (
    BusyError,
    DeliveryLeaseLostError,
    DeliveryOperationBusyError,
    DeliveryOperationNotFoundError,
    DeliveryPlan,
    DeliveryStep,
    InvalidInputError,
    InvalidTransitionError,
    LeaseLostError,
    RunNotFoundError,
)
from turnkeeper.spec.errors import DeliveryPlanConflictError
from turnkeeper.storage.ops import outbox as outbox_ops
from turnkeeper.storage.ops import outbox_plans

USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}


def plan(*steps: DeliveryStep, context=None) -> DeliveryPlan:
    return DeliveryPlan(
        "chat",
        "room-1",
        steps or (DeliveryStep("send", "message"),),
        reply_message_id="m-1",
        transport_context=context or {"token": "secret"},
    )


TWO_STEPS = plan(
    DeliveryStep("upload", "attachment", artifact_id="a1", payload_digest="d1"),
    DeliveryStep("send", "message", depends_on="upload"),
)


def finished(store, p: DeliveryPlan | None = TWO_STEPS, sid: str = "s"):
    if store.sessions.get(sid) is None:
        store.sessions.create(sid)
    run = store.runs.admit(sid, {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, delivery_plan=p)
    return run


def test_the_plan_is_written_by_the_terminal_transaction(store):
    run = finished(store)
    intent, ops = store.outbox.get_plan(f"{run.id}:delivery")
    assert (intent.run_id, intent.session_id, intent.status) == (run.id, "s", "pending")
    assert intent.transport_context == {"token": "secret"}
    assert "secret" not in repr(intent)
    assert [(o.key, o.sequence, o.status, o.lease_epoch) for o in ops] == [
        ("upload", 1, "pending", 0),
        ("send", 2, "pending", 0),
    ]
    assert ops[1].depends_on == ops[0].id
    assert ops[1].idempotency_key == ops[1].id


def test_a_conflicting_plan_fails_the_termination_and_nothing_is_written(store):
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1})
    with pytest.raises(InvalidTransitionError):
        store.outbox.create_plan(run.id, TWO_STEPS)
    bad = plan(DeliveryStep("a", "x"), DeliveryStep("a", "y"))
    with pytest.raises(InvalidInputError):
        store.runs.finish(run.id, "succeeded", delivery_plan=bad)
    assert store.runs.get(run.id).status == "admitted"
    assert store.query("SELECT count(*) AS n FROM delivery_operations").to_pylist() == [{"n": 0}]


def test_repeating_termination_with_the_same_plan_is_idempotent_and_a_different_one_conflicts(
    store,
):
    run = finished(store)
    store.runs.finish(run.id, "succeeded", delivery_plan=TWO_STEPS)
    with pytest.raises(DeliveryPlanConflictError) as err:
        store.runs.finish(run.id, "succeeded", delivery_plan=plan())
    assert (err.value.run_id, err.value.intent_id) == (run.id, f"{run.id}:delivery")
    assert store.outbox.create_plan(run.id, TWO_STEPS).id == f"{run.id}:delivery"
    assert len(store.outbox.get_plan(f"{run.id}:delivery")[1]) == 2


def test_a_repeated_termination_writes_a_plan_only_past_the_fence(store):
    """A repeated finish_run (after an unknown commit) that would write the plan
    the first one did not is a session write like create_delivery_plan: a stale
    lease is refused, so is no lease while someone holds the session, and
    nothing is written (attack helper: the repeat path skipped the check). The
    same plan again, once stored, still returns quietly."""
    store.sessions.create("s")
    first = store.leases.acquire("session:s", "worker-1", 30, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, lease=first, start=True)
    store.runs.finish(run.id, "succeeded", lease=first)  # ended without a plan
    store.leases.release(first)
    other = store.leases.acquire("session:s", "worker-2", 30)
    with pytest.raises(LeaseLostError):
        store.runs.finish(run.id, "succeeded", delivery_plan=TWO_STEPS, lease=first)
    with pytest.raises(BusyError):
        store.runs.finish(run.id, "succeeded", delivery_plan=TWO_STEPS)
    assert store.outbox.get_plan(f"{run.id}:delivery") is None
    store.runs.finish(run.id, "succeeded", delivery_plan=TWO_STEPS, lease=other)
    store.leases.release(other)
    again = store.runs.finish(run.id, "succeeded", delivery_plan=TWO_STEPS, lease=other)
    assert again == store.runs.get(run.id)
    assert len(store.outbox.get_plan(f"{run.id}:delivery")[1]) == 2


def test_a_plan_alone_for_recovery_reconciliation(store):
    run = finished(store, None)
    assert store.outbox.get_plan(f"{run.id}:delivery") is None
    intent = store.outbox.create_plan(run.id, plan())
    assert intent.status == "pending"
    with pytest.raises(RunNotFoundError):
        store.outbox.create_plan("nope", plan())


def test_dependency_order_and_intent_status(store):
    run = finished(store)
    up, send = (o.id for o in store.outbox.get_plan(f"{run.id}:delivery")[1])
    assert [o.id for o in store.outbox.list_due()] == [up]
    with pytest.raises(DeliveryOperationBusyError) as err:
        store.outbox.claim(send, "w", 5)
    assert "waiting on" in err.value.reason
    c = store.outbox.claim(up, "w", 5)
    assert (c.status, c.lease_owner, c.lease_epoch, c.attempt_count) == ("claimed", "w", 1, 1)
    p = store.outbox.update_progress(up, "w", 1, provider_asset_id="asset-9")
    assert (p.status, p.provider_asset_id) == ("in_progress", "asset-9")
    store.outbox.finish(up, "w", 1, "delivered", provider_state={"url": "u"})
    assert store.outbox.get_plan(f"{run.id}:delivery")[0].status == "pending"
    assert [o.id for o in store.outbox.list_due()] == [send]
    c = store.outbox.claim(send, "w", 5)
    done = store.outbox.finish(send, "w", c.lease_epoch, "delivered", provider_message_id="pm")
    assert done.provider_message_id == "pm"
    assert store.outbox.get_plan(f"{run.id}:delivery")[0].status == "delivered"
    assert store.outbox.list_due() == []


@pytest.mark.parametrize(
    ("results", "status"),
    [
        (["delivered", "unsupported"], "delivered"),
        (["failed", "delivered"], "failed"),
        (["uncertain", "delivered"], "uncertain"),
        (["uncertain", "failed"], "failed"),
    ],
)
def test_intent_is_delivered_only_when_every_operation_is(store, results, status):
    run = finished(store, plan(DeliveryStep("a", "x"), DeliveryStep("b", "y")))
    for op, result in zip(store.outbox.get_plan(f"{run.id}:delivery")[1], results, strict=True):
        c = store.outbox.claim(op.id, "w", 5)
        store.outbox.finish(op.id, "w", c.lease_epoch, result, failure_code="E1")
    intent, ops = store.outbox.get_plan(f"{run.id}:delivery")
    assert intent.status == status
    assert [o.status for o in ops] == results  # failed and uncertain stay visible


def test_a_dependent_of_a_failed_operation_stays_pending_and_visible(store):
    run = finished(store)
    up, send = (o.id for o in store.outbox.get_plan(f"{run.id}:delivery")[1])
    store.outbox.finish(up, "w", store.outbox.claim(up, "w", 5).lease_epoch, "failed")
    with pytest.raises(DeliveryOperationBusyError, match="failed"):
        store.outbox.claim(send, "w", 5)
    assert store.outbox.get_plan(f"{run.id}:delivery")[0].status == "pending"


def test_terminal_results_are_fenced_and_idempotent(store, clock):
    run = finished(store, plan())
    (op,) = store.outbox.get_plan(f"{run.id}:delivery")[1]
    first = store.outbox.claim(op.id, "a", 1)
    clock.advance(2)
    with pytest.raises(DeliveryLeaseLostError, match="expired"):
        store.outbox.update_progress(op.id, "a", first.lease_epoch)
    second = store.outbox.claim(op.id, "b", 5)  # reclaim of the expired claim
    assert second.lease_epoch == first.lease_epoch + 1
    with pytest.raises(DeliveryLeaseLostError) as err:
        store.outbox.finish(op.id, "a", first.lease_epoch, "delivered")
    assert (err.value.operation_id, err.value.owner, err.value.epoch) == (op.id, "a", 1)
    done = store.outbox.finish(op.id, "b", 2, "delivered", provider_message_id="x")
    again = store.outbox.finish(op.id, "b", 2, "delivered", provider_message_id="x")
    assert again == done
    with pytest.raises(InvalidTransitionError):
        store.outbox.finish(op.id, "b", 2, "failed")
    with pytest.raises(DeliveryLeaseLostError):
        store.outbox.finish(op.id, "a", 1, "delivered")
    with pytest.raises(DeliveryOperationBusyError, match="delivered"):
        store.outbox.claim(op.id, "c", 5)
    events = store.query(
        "SELECT edge FROM delivery_events WHERE operation_id = ? ORDER BY occurred_at",
        [op.id],
    ).to_pylist()
    assert sorted(e["edge"] for e in events) == [
        "claim",
        "deliver_claimed",
        "plan",
        "reclaim_claimed",
    ]


def test_requeue_releases_the_claim_until_the_next_attempt_time(store, clock):
    run = finished(store, plan())
    (op,) = store.outbox.get_plan(f"{run.id}:delivery")[1]
    c = store.outbox.claim(op.id, "a", 5)
    store.outbox.update_progress(op.id, "a", 1, provider_state={"phase": "upload"})
    back = store.outbox.requeue(op.id, "a", 1, delay_s=30, failure_code="timeout")
    assert (back.status, back.failure_code, back.lease_expires_at) == ("pending", "timeout", None)
    assert back.next_attempt_at == clock() + timedelta(seconds=30)
    with pytest.raises(DeliveryLeaseLostError, match="ended"):
        store.outbox.finish(op.id, "a", c.lease_epoch, "delivered")
    with pytest.raises(DeliveryOperationBusyError, match="not due"):
        store.outbox.claim(op.id, "b", 5)
    assert store.outbox.list_due() == []
    clock.advance(31)
    assert [o.id for o in store.outbox.list_due()] == [op.id]
    again = store.outbox.claim(op.id, "b", 5)
    assert (again.lease_epoch, again.attempt_count, again.next_attempt_at) == (2, 2, None)


def test_an_update_by_another_owner_under_the_current_epoch_is_refused(store):
    """The claim's owner and epoch both decide: a worker that names the current
    epoch but is not its owner updates nothing. (The owner left out of the
    fence: mutant ``delivery-claim-owner``, ``make mutants``.)"""
    run = finished(store, plan())
    (op,) = store.outbox.get_plan(f"{run.id}:delivery")[1]
    claimed = store.outbox.claim(op.id, "a", 30)
    for update in (
        lambda: store.outbox.update_progress(op.id, "b", claimed.lease_epoch),
        lambda: store.outbox.finish(op.id, "b", claimed.lease_epoch, "delivered"),
        lambda: store.outbox.requeue(op.id, "b", claimed.lease_epoch, delay_s=1),
    ):
        with pytest.raises(DeliveryLeaseLostError) as err:
            update()
        assert (err.value.owner, err.value.epoch) == ("b", claimed.lease_epoch)
    assert store.outbox.get_operation(op.id) == claimed
    done = store.outbox.finish(op.id, "a", claimed.lease_epoch, "delivered")
    assert done.status == "delivered"


def check_claim_expired_at_its_instant(store, clock) -> None:
    """At exactly ``lease_expires_at`` a claim is expired (live iff now <
    expires_at): its holder's update is refused, writing nothing, and another
    worker claims the operation under the next epoch."""
    run = finished(store, plan())
    (op,) = store.outbox.get_plan(f"{run.id}:delivery")[1]
    first = store.outbox.claim(op.id, "a", 10)
    clock.advance(10)
    assert clock() == first.lease_expires_at
    with pytest.raises(DeliveryLeaseLostError, match="expired"):
        store.outbox.update_progress(op.id, "a", first.lease_epoch, provider_state={"p": 1})
    assert store.outbox.get_plan(f"{run.id}:delivery")[1] == [first]
    second = store.outbox.claim(op.id, "b", 10)
    assert (second.lease_owner, second.lease_epoch) == ("b", first.lease_epoch + 1)


def test_a_claim_at_its_expiry_instant_is_expired(store, clock):
    check_claim_expired_at_its_instant(store, clock)


def test_the_claim_instant_check_fails_with_the_instant_counted_live(store, clock, monkeypatch):
    """Control: the claim's fence and its re-check at COMMIT judging the instant live."""
    real = outbox_ops._fence

    def at_instant_live(tx, operation_id, owner, epoch):
        op = outbox_plans.load(tx, operation_id)
        if op.lease_expires_at is not None and op.lease_expires_at == tx.clock_after_locks():
            return op
        return real(tx, operation_id, owner, epoch)

    monkeypatch.setattr(outbox_ops, "_fence", at_instant_live)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        check_claim_expired_at_its_instant(store, clock)


def test_an_expired_claim_is_listed_as_due(store, clock):
    run = finished(store, plan())
    (op,) = store.outbox.get_plan(f"{run.id}:delivery")[1]
    store.outbox.claim(op.id, "a", 1)
    assert store.outbox.list_due() == []
    with pytest.raises(DeliveryOperationBusyError, match="claimed by 'a'"):
        store.outbox.claim(op.id, "b", 5)
    clock.advance(1.5)
    assert [o.id for o in store.outbox.list_due()] == [op.id]


def test_eight_workers_claiming_one_ready_operation_one_wins_and_a_stale_ack_fails(real_store):
    """The issue's scenario: exactly one of eight claimers gets the operation,
    and an acknowledgement carrying a stale epoch fails."""
    run = finished(real_store, plan())
    (op,) = real_store.outbox.get_plan(f"{run.id}:delivery")[1]
    barrier = threading.Barrier(8)
    won, busy, other = [], [], []

    def claim(i: int) -> None:
        barrier.wait()
        try:
            won.append(real_store.outbox.claim(op.id, f"w{i}", 30))
        except DeliveryOperationBusyError:
            busy.append(i)
        except Exception as exc:  # any other outcome fails the test below
            other.append(exc)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert other == [] and len(won) == 1 and len(busy) == 7
    winner = won[0]
    assert winner.lease_epoch == 1
    real_store.outbox.requeue(op.id, winner.lease_owner, 1, failure_code="no answer")
    later = real_store.outbox.claim(op.id, "late", 30)
    assert later.lease_epoch == 2
    with pytest.raises(DeliveryLeaseLostError):
        real_store.outbox.finish(op.id, winner.lease_owner, winner.lease_epoch, "delivered")
    with pytest.raises(DeliveryLeaseLostError):
        real_store.outbox.finish(op.id, winner.lease_owner, later.lease_epoch, "delivered")
    real_store.outbox.finish(op.id, "late", later.lease_epoch, "delivered")
    assert real_store.outbox.get_operation(op.id).status == "delivered"


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s, op: s.outbox.claim(op, "", 5), "owner"),
        (lambda s, op: s.outbox.claim(op, "w", 0), "ttl_s"),
        (lambda s, op: s.outbox.claim(op, "w", float("nan")), "ttl_s"),
        (lambda s, op: s.outbox.finish(op, "w", 1, "sent"), "status"),
        (lambda s, op: s.outbox.finish(op, "w", 1, "pending"), "status"),
        (lambda s, op: s.outbox.finish(op, "w", True, "delivered"), "epoch"),
        (lambda s, op: s.outbox.finish(op, "w", 0, "delivered"), "epoch"),
        (
            lambda s, op: s.outbox.update_progress(op, "w", 1, provider_state=[1]),
            "provider_state",
        ),
        (
            lambda s, op: s.outbox.update_progress(op, "w", 1, provider_state={"x": float("inf")}),
            "provider_state",
        ),
        (lambda s, op: s.outbox.requeue(op, "w", 1, delay_s=-1), "delay_s"),
        (lambda s, op: s.outbox.requeue(op, "w", 1, delay_s=float("nan")), "delay_s"),
        (lambda s, op: s.outbox.get_operation(""), "operation_id"),
        (lambda s, op: s.outbox.list_due(limit=0), "limit"),
        (lambda s, op: s.outbox.create_plan("r", "plan"), "plan"),
        (lambda s, op: s.outbox.create_plan("r", DeliveryPlan("chat", "room", ())), "plan.steps"),
    ],
)
def test_bad_input_is_refused_and_nothing_changes(store, call, field):
    run = finished(store, plan())
    (op,) = store.outbox.get_plan(f"{run.id}:delivery")[1]
    before = store.query("SELECT count(*) AS n FROM delivery_events").to_pylist()
    with pytest.raises(InvalidInputError) as err:
        call(store, op.id)
    assert err.value.field == field
    assert store.query("SELECT count(*) AS n FROM delivery_events").to_pylist() == before
    assert store.outbox.get_operation(op.id) == op


@pytest.mark.parametrize(
    "steps",
    [
        (DeliveryStep("b", "x", depends_on="a"), DeliveryStep("a", "x")),
        (DeliveryStep("a", "x", depends_on="a"),),
        (DeliveryStep("", "x"),),
        (DeliveryStep("a", ""),),
        ("a",),
    ],
)
def test_bad_plans_are_refused(store, steps):
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1})
    with pytest.raises(InvalidInputError):
        store.runs.finish(run.id, "succeeded", delivery_plan=plan(*steps))
    assert store.runs.get(run.id).status == "admitted"


def test_unknown_operations_are_typed_errors(store):
    for call in (
        lambda: store.outbox.claim("nope", "w", 5),
        lambda: store.outbox.update_progress("nope", "w", 1),
        lambda: store.outbox.finish("nope", "w", 1, "delivered"),
        lambda: store.outbox.requeue("nope", "w", 1),
    ):
        with pytest.raises(DeliveryOperationNotFoundError):
            call()
    assert store.outbox.get_operation("nope") is None
    assert store.outbox.get_plan("nope") is None
