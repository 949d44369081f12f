"""Wake-ups after durable transitions: published at commit, advisory only.

A subscriber is woken by a run ending, a delivery coming due, a lease
released or a possible orphan, on both backends; a rolled-back write wakes
nobody; and with every notification dropped, a worker that polls on its
timeout still does all the work (the store is the authority).
"""

from __future__ import annotations

import threading
import time

import pytest

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep
from turnkeeper.storage import wakeups
from turnkeeper.storage.wakeups import Topic

PLAN = DeliveryPlan("chat", "room", steps=(DeliveryStep("send", "message"),))
LONG = 60.0  # a wait that only times out if the wake-up never comes


def test_ending_a_run_wakes_a_subscriber_with_its_plan_due(real_store):
    store = real_store
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1})
    store.runs.start(run.id)
    sub = store.subscribe("run_ended", "delivery_due")
    store.runs.finish(run.id, "succeeded", delivery_plan=PLAN)
    fired = sub.wait(LONG)
    assert set(fired) <= {Topic.RUN_ENDED, Topic.DELIVERY_DUE} and fired
    seen = set(fired)
    while seen != {Topic.RUN_ENDED, Topic.DELIVERY_DUE}:  # both may come in one wait or two
        more = sub.wait(LONG)
        assert more
        seen |= set(more)


def test_a_released_session_lease_wakes_lease_and_orphan_subscribers(real_store):
    real_store.sessions.create("s")
    store = real_store
    lease = store.leases.acquire("session:s", "w", 30)
    sub = store.subscribe(Topic.LEASE_RELEASED, Topic.ORPHAN)
    assert store.leases.release(lease)
    seen: set[Topic] = set()
    while seen != {Topic.LEASE_RELEASED, Topic.ORPHAN}:
        more = sub.wait(LONG)
        assert more
        seen |= set(more)


def test_a_refused_write_wakes_nobody(real_store):
    store = real_store
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1})
    holder = store.leases.acquire("session:s", "holder", 30, purpose="recovery")
    sub = store.subscribe("run_ended")
    with pytest.raises(turnkeeper.BusyError):  # rolled back: no wake-up
        store.runs.finish(run.id, "failed")
    assert sub.wait(0.2) == []
    store.runs.finish(run.id, "failed", lease=holder)
    assert sub.wait(LONG) == [Topic.RUN_ENDED]


def test_a_wake_up_between_looking_and_waiting_is_not_missed(real_store):
    store = real_store
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1})
    sub = store.subscribe("run_ended")
    store.runs.finish(run.id, "failed")  # after subscribing, before the wait
    assert sub.wait(LONG) == [Topic.RUN_ENDED]


def test_unknown_topics_are_refused(store):
    with pytest.raises(turnkeeper.InvalidInputError):
        store.subscribe("nonsense")
    with pytest.raises(turnkeeper.InvalidInputError):
        store.subscribe()
    with pytest.raises(turnkeeper.InvalidInputError):
        store.wait_for("run_ended", timeout_s=-1)


def _outbox_worker(store, stop: threading.Event, delivered: list[str]) -> None:
    """Deliver every due operation; when none is due, wait for a wake-up (or the
    timeout) before looking again."""
    sub = store.subscribe("delivery_due")
    while not stop.is_set():
        due = store.outbox.list_due()
        for op in due:
            claim = store.outbox.claim(op.id, "worker", 30)
            store.outbox.finish(op.id, "worker", claim.lease_epoch, "delivered")
            delivered.append(op.id)
        if not due:
            sub.wait(0.2)


@pytest.mark.parametrize("dropped", [False, True], ids=["notified", "notifications-dropped"])
def test_an_outbox_worker_delivers_everything_with_or_without_wake_ups(
    real_store, monkeypatch, dropped
):
    """The store is the authority: with every wake-up dropped, the worker finds
    the work on its timeouts all the same."""
    store = real_store
    if dropped:
        monkeypatch.setattr(wakeups.Signals, "fire", lambda self, topic: None)
    stop = threading.Event()
    delivered: list[str] = []
    worker = threading.Thread(target=_outbox_worker, args=(store, stop, delivered))
    worker.start()
    try:
        expected = []
        for i in range(5):
            sid = f"s{i}"
            store.sessions.create(sid)
            run = store.runs.admit(sid, {"q": i})
            store.runs.start(run.id)
            store.runs.finish(run.id, "succeeded", delivery_plan=PLAN)
            expected.append(f"{run.id}:delivery:send")
        sub = store.subscribe("delivery_due")
        give_up = time.monotonic() + 300  # a hang guard, not a timing assertion
        while sorted(delivered) != sorted(expected) and time.monotonic() < give_up:
            sub.wait(1.0)  # progress is the worker's; this only paces the check
    finally:
        stop.set()
        worker.join(60)
    assert sorted(delivered) == sorted(expected)
