"""Runtime leases (``turnkeeper.runtime``): heartbeat, loss signal, final check, ordered groups."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

import turnkeeper
from turnkeeper import (
    BusyError,
    InterfaceError,
    InvalidInputError,
    LeaseLostError,
    LeasePurposeError,
    OperationalError,
    RuntimeLeaseGroup,
    RuntimeLeaseGuard,
    acquire_many,
)


def _lease_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("turnkeeper-lease[")]


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    leaked = [t for t in _lease_threads() if t not in before]
    for t in leaked:
        t.join(timeout=2)
    assert [t for t in leaked if t.is_alive()] == []


class Wrapped:
    """A store passing lease calls through, with injectable faults and delays."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.renew_fault: Callable[[], BaseException] | None = None
        self.release_fault: Callable[[], BaseException] | None = None
        self.acquire_fault: dict[str, Callable[[], BaseException]] = {}
        self.return_delay_s = 0.0
        self.renews = 0

    def acquire_lease(self, target: str, owner: str, ttl_s: float, **kw: Any) -> Any:
        if target in self.acquire_fault:
            raise self.acquire_fault[target]()
        lease = self.inner.acquire_lease(target, owner, ttl_s, **kw)
        time.sleep(self.return_delay_s)
        return lease

    def renew_lease(self, lease: Any, ttl_s: float) -> Any:
        self.renews += 1
        if self.renew_fault is not None:
            raise self.renew_fault()
        renewed = self.inner.renew_lease(lease, ttl_s)
        time.sleep(self.return_delay_s)
        return renewed

    def release_lease(self, lease: Any) -> bool:
        if self.release_fault is not None:
            raise self.release_fault()
        return bool(self.inner.release_lease(lease))

    def validate_lease(self, lease: Any) -> None:
        self.inner.validate_lease(lease)


# -- one guard ---------------------------------------------------------------------


def test_heartbeat_keeps_the_lease_alive_past_its_ttl(real_store):
    with RuntimeLeaseGuard.acquire(
        real_store, "session:hb", "w1", 0.3, purpose="execution", interval_s=0.05
    ) as guard:
        first = guard.lease
        time.sleep(0.7)  # over 2 ttls
        assert not guard.lost.is_set() and guard.lost_error is None
        guard.check()
        assert guard.lease.expires_at > first.expires_at
        assert (guard.lease.token, guard.lease.epoch) == (first.token, first.epoch)
        with pytest.raises(BusyError) as busy:
            real_store.acquire_lease("session:hb", "w2", 10)
        assert busy.value.holder == "w1"
    assert guard.closed
    assert real_store.acquire_lease("session:hb", "w2", 10).epoch == first.epoch + 1


def test_loss_signal_fires_when_another_owner_takes_over(store, clock):
    guard = RuntimeLeaseGuard.acquire(store, "session:x", "w1", 30, interval_s=0.02)
    try:
        assert not guard.wait_lost(0.05)
        clock.advance(31)  # the store's clock passes the expiry
        other = store.acquire_lease("session:x", "w2", 30)
        assert guard.wait_lost(5)
        assert guard.lost.is_set()
        assert isinstance(guard.lost_error, LeaseLostError)
        with pytest.raises(LeaseLostError) as err:
            guard.check()
        assert err.value.target == "session:x"
        assert err.value.__cause__ is guard.lost_error
    finally:
        assert guard.release() is False  # stale: the takeover is untouched
    store.validate_lease(other)


def test_check_passes_while_held_and_asks_the_database(store, clock):
    with RuntimeLeaseGuard.acquire(store, "session:c", "w1", 30, interval_s=20) as guard:
        guard.check()
        clock.advance(31)
        store.acquire_lease("session:c", "w2", 30)
        # No heartbeat has run (interval 20 s): the database check finds the loss.
        with pytest.raises(LeaseLostError):
            guard.check()
        assert guard.lost.is_set() and isinstance(guard.lost_error, LeaseLostError)
        with pytest.raises(LeaseLostError):
            guard.check()
    with pytest.raises(LeaseLostError):  # released guards never pass
        guard.check()


def test_backend_errors_are_retried_then_lost_at_the_deadline_not_before(real_store):
    wrapped = Wrapped(real_store)
    with RuntimeLeaseGuard.acquire(wrapped, "session:db", "w1", 0.4, interval_s=0.05) as guard:
        wrapped.renew_fault = lambda: OperationalError(detail="disk on fire")
        time.sleep(0.12)
        deadline = time.monotonic() + guard.remaining_s  # fixed: no renewal succeeds now
        assert isinstance(guard.last_error, OperationalError)
        assert not guard.lost.is_set()  # still maybe held: not reported as lost
        guard.check()  # and the database agrees it is held
        assert guard.wait_lost(5)
        seen = time.monotonic()
        assert deadline <= seen < deadline + 0.3
        assert isinstance(guard.lost_error, OperationalError)
        assert wrapped.renews >= 3  # retried, not given up on the first failure
        with pytest.raises(LeaseLostError) as err:
            guard.check()
        assert isinstance(err.value.__cause__, OperationalError)


def test_a_recovered_backend_keeps_the_lease(real_store):
    wrapped = Wrapped(real_store)
    with RuntimeLeaseGuard.acquire(wrapped, "session:blip", "w1", 0.4, interval_s=0.04) as guard:
        wrapped.renew_fault = lambda: turnkeeper.TransactionConflictError("renew_lease", 40)
        time.sleep(0.15)
        wrapped.renew_fault = None
        time.sleep(0.35)  # 0.5 s in all: past the ttl
        assert not guard.lost.is_set() and guard.last_error is None
        guard.check()


def test_closed_store_stops_renewals_and_loses_at_the_deadline(store):
    wrapped = Wrapped(store)
    with RuntimeLeaseGuard.acquire(wrapped, "session:i", "w1", 0.3, interval_s=0.03) as guard:
        wrapped.renew_fault = lambda: InterfaceError(detail="the store is closed")
        time.sleep(0.1)
        calls = wrapped.renews
        assert calls >= 1 and not guard.lost.is_set()
        assert guard.wait_lost(5)
        assert wrapped.renews == calls  # halted: no retries against a closed store
        assert isinstance(guard.lost_error, InterfaceError)


def test_loss_deadline_is_no_later_than_the_store_expiry(real_store):
    # Slow replies: the deadline must count from when the call was sent.
    wrapped = Wrapped(real_store)
    wrapped.return_delay_s = 0.1
    with RuntimeLeaseGuard.acquire(wrapped, "session:slow", "w1", 1.0, interval_s=0.2) as guard:
        for pause in (0.3, 0):  # after acquire, then after a renewal
            assert guard.remaining_s <= _store_remaining_s(guard) + 0.02
            time.sleep(pause)
        assert wrapped.renews >= 1


def test_loss_fires_at_the_deadline_while_a_renewal_is_stuck(real_store):
    wrapped = Wrapped(real_store)
    with RuntimeLeaseGuard.acquire(wrapped, "session:late", "w1", 0.3, interval_s=0.1) as guard:
        deadline = time.monotonic() + guard.remaining_s
        wrapped.return_delay_s = 0.6  # the renewal at ~0.1 s answers at ~0.7 s
        assert guard.wait_lost(5)
        assert time.monotonic() < deadline + 0.2  # did not wait for the stuck call
        assert isinstance(guard.lost_error, LeaseLostError)
        with pytest.raises(LeaseLostError):
            guard.check()
    # The late renewal succeeded in the store but did not revive the guard;
    # exit waited for it and released what it renewed.
    assert guard.lost.is_set() and wrapped.renews == 1
    real_store.acquire_lease("session:late", "w2", 1)


def _store_remaining_s(guard: RuntimeLeaseGuard) -> float:
    return (guard.lease.expires_at - datetime.now(UTC)).total_seconds()


def test_cancellation_in_the_heartbeat_is_signalled_and_not_swallowed(store, monkeypatch):
    seen: list[type[BaseException] | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    wrapped = Wrapped(store)
    wrapped.renew_fault = KeyboardInterrupt
    with RuntimeLeaseGuard.acquire(wrapped, "session:k", "w1", 30, interval_s=0.02) as guard:
        assert guard.wait_lost(5)
        assert isinstance(guard.lost_error, KeyboardInterrupt)
        guard._thread.join(5)
    assert seen == [KeyboardInterrupt]


def test_adopting_a_lease_guards_it_if_held_and_raises_if_lost(store, clock):
    stale = store.acquire_lease("session:z", "w1", 5)
    clock.advance(6)
    before = _lease_threads()
    with pytest.raises(LeaseLostError):
        RuntimeLeaseGuard(store, stale, 5)
    assert _lease_threads() == before

    lease = store.acquire_lease("session:a", "w1", 5, purpose="recovery")
    with RuntimeLeaseGuard(store, lease, 5) as guard:
        assert (guard.lease.epoch, guard.lease.purpose) == (lease.epoch, "recovery")
        guard.check()
    with pytest.raises(LeaseLostError):
        store.validate_lease(lease)  # released on exit


def test_thread_stops_on_exit_and_release_is_idempotent(store):
    before = set(threading.enumerate())
    with RuntimeLeaseGuard.acquire(store, "session:t", "w1", 30, interval_s=0.01) as guard:
        assert len(set(threading.enumerate()) - before) == 1
        time.sleep(0.05)
    assert set(threading.enumerate()) == before
    assert guard.release() is False
    assert not guard.wait_lost(None)  # released, not lost: returns at once


def test_exit_with_an_error_releases_and_notes_a_failed_release(store):
    with pytest.raises(RuntimeError), RuntimeLeaseGuard.acquire(store, "session:e", "w1", 30):
        raise RuntimeError("tool failed")
    store.acquire_lease("session:e", "w2", 30)

    wrapped = Wrapped(store)
    with pytest.raises(RuntimeError) as err:  # noqa: SIM117
        with RuntimeLeaseGuard.acquire(wrapped, "session:n", "w1", 30):
            wrapped.release_fault = lambda: OperationalError(detail="gone")
            raise RuntimeError("tool failed")
    assert any("also failed" in note for note in err.value.__notes__)


def test_a_dropped_guard_stops_its_thread_and_a_released_one_frees_the_store():
    store = turnkeeper.open_store(":memory:")
    guard = RuntimeLeaseGuard.acquire(store, "session:g", "w1", 30, interval_s=0.01)
    (thread,) = [t for t in _lease_threads() if t.name == "turnkeeper-lease[session:g]"]
    del guard
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()

    kept = RuntimeLeaseGuard.acquire(store, "session:h", "w1", 30, interval_s=0.01)
    kept.release()
    store.close()
    alive = weakref.ref(store)
    del store
    gc.collect()
    assert alive() is None and kept.closed  # the closed guard does not pin the store


def test_bad_input_is_refused_before_anything_is_taken(store):
    for ttl, interval in [(0, None), (-1, None), (float("nan"), None), (1, 1), (1, 0), (1, 2)]:
        with pytest.raises(InvalidInputError):
            RuntimeLeaseGuard.acquire(store, "session:v", "w1", ttl, interval_s=interval)
    with pytest.raises(InvalidInputError):
        acquire_many(store, "session:v", "w1", 10)
    with pytest.raises(InvalidInputError):
        acquire_many(store, ["session:v", 3], "w1", 10)  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        acquire_many(store, ["session:v"], "w1", 1, wait_s=1)
    with pytest.raises(InvalidInputError):
        RuntimeLeaseGroup.acquire(store, ["session:v"], "w1", 1, interval_s=1)
    store.acquire_lease("session:v", "w2", 1)  # nothing was taken


# -- several targets ---------------------------------------------------------------


def test_acquire_many_dedupes_and_sorts(store):
    leases = acquire_many(store, ["session:b", "session:a", "session:b"], "w1", 10)
    assert [lease.target for lease in leases] == ["session:a", "session:b"]
    assert {lease.purpose for lease in leases} == {"mutation"}
    assert acquire_many(store, [], "w1", 10) == []


def test_acquire_many_releases_partial_acquisitions_on_busy(store):
    store.acquire_lease("session:b", "other", 10)
    with pytest.raises(BusyError) as err:
        acquire_many(store, ["session:c", "session:a", "session:b"], "w1", 10)
    assert (err.value.target, err.value.holder) == ("session:b", "other")
    # session:a was taken first and must have been released; c never taken.
    taken = store.acquire_lease("session:a", "w2", 10)
    assert taken.epoch == 2
    assert store.acquire_lease("session:c", "w2", 10).epoch == 1


def test_acquire_many_releases_partial_acquisitions_on_any_error(store):
    store.acquire_lease("session:b", "w1", 10, purpose="execution")
    with pytest.raises(LeasePurposeError):
        acquire_many(store, ["session:a", "session:b"], "w1", 10, purpose="mutation")
    store.acquire_lease("session:a", "w2", 10)

    wrapped = Wrapped(store)
    wrapped.acquire_fault["session:e"] = KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        acquire_many(wrapped, ["session:e", "session:d"], "w1", 10)
    store.acquire_lease("session:d", "w2", 10)


def test_acquire_many_notes_a_failed_cleanup_on_the_original_error(store):
    store.acquire_lease("session:b", "other", 10)
    wrapped = Wrapped(store)
    wrapped.release_fault = lambda: OperationalError(detail="gone")
    with pytest.raises(BusyError) as err:
        acquire_many(wrapped, ["session:a", "session:b"], "w1", 10)
    assert any("session:a" in note for note in err.value.__notes__)


def test_acquire_many_waits_for_a_busy_target(real_store):
    held = real_store.acquire_lease("session:b", "other", 10)
    timer = threading.Timer(0.1, real_store.release_lease, [held])
    timer.start()
    try:
        leases = acquire_many(real_store, ["session:b", "session:a"], "w1", 10, wait_s=3)
    finally:
        timer.join()
    assert [lease.target for lease in leases] == ["session:a", "session:b"]


def test_opposite_orders_never_deadlock_nor_double_hold(real_store):
    targets = ["session:a", "session:b", "session:c"]
    holders: dict[str, str] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    rounds = 8

    def worker(owner: str, wanted: list[str]) -> None:
        try:
            for _ in range(rounds):
                leases = acquire_many(real_store, wanted, owner, 5, wait_s=4)
                with lock:
                    for lease in leases:
                        assert lease.target not in holders, (lease.target, holders)
                        holders[lease.target] = owner
                time.sleep(0)
                with lock:
                    for lease in leases:
                        del holders[lease.target]
                for lease in reversed(leases):
                    assert real_store.release_lease(lease)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=("A", targets)),
        threading.Thread(target=worker, args=("B", list(reversed(targets)))),
        threading.Thread(target=worker, args=("C", ["session:c", "session:a"])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "deadlocked"
    assert errors == []


def test_group_guards_every_target_and_releases_all_on_exit_or_failure(store):
    before = set(threading.enumerate())
    with RuntimeLeaseGroup.acquire(
        store, ["session:b", "session:a"], "w1", 30, purpose="fork", interval_s=0.02
    ) as group:
        assert [lease.target for lease in group.leases] == ["session:a", "session:b"]
        assert {lease.purpose for lease in group.leases} == {"fork"}
        assert len(set(threading.enumerate()) - before) == 2
        group.check()
        assert group.lost() == []
    assert set(threading.enumerate()) == before
    assert all(g.closed for g in group.guards)
    assert acquire_many(store, ["session:a", "session:b"], "w2", 10)

    store.acquire_lease("session:y", "other", 30)
    with pytest.raises(BusyError):
        RuntimeLeaseGroup.acquire(store, ["session:x", "session:y"], "w1", 30)
    assert set(threading.enumerate()) == before  # the guard made for x is gone
    store.acquire_lease("session:x", "w2", 30)
