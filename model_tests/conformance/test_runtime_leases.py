"""Runtime leases (``turnkeeper.runtime``): heartbeat, loss signal, final check, ordered groups.

The heartbeat's timing is tested on one injected clock: the store's clock and
the guard's monotonic clock (``turnkeeper.runtime.monotonic``) are the same
:class:`FakeClock`, which only moves when a test advances it, and each step
waits for the heartbeat to have acted (a renewal seen, an error recorded), so
nothing depends on how fast a loaded machine runs the heartbeat thread. Real
time appears only in hang guards.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import timedelta
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
    runtime,
)


def _lease_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("turnkeeper-lease[")]


HANG_GUARD_S = 60.0
"""Seconds any wait gets before the test fails (a hang guard, not a timing figure)."""


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    leaked = [t for t in _lease_threads() if t not in before]
    for t in leaked:
        t.join(timeout=HANG_GUARD_S)
    assert [t for t in leaked if t.is_alive()] == []


@pytest.fixture
def one_clock(clock: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``clock`` (the store's) is the guard's monotonic clock too, in seconds."""
    monkeypatch.setattr(runtime, "monotonic", lambda: clock().timestamp())
    return clock


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition()`` holds (the heartbeat acted); fail after the guard."""
    give_up = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < give_up, f"hang guard: never {what}"
        time.sleep(0.001)


SLACK_S = 0.001
"""Added to every step of the clock, so that a beat or deadline ``seconds`` away
is reached whatever the rounding of float seconds to the clock's microseconds."""


def _step(guard: RuntimeLeaseGuard, clock: Any, seconds: float, *, failing: bool) -> None:
    """Advance the one clock by ``seconds`` (the guard's next beat is due then)
    and wait until the heartbeat has renewed (``failing``: has recorded a new
    error) and settled its next beat."""
    before_lease, before_error = guard.lease, guard.last_error
    clock.advance(seconds + SLACK_S)
    if failing:
        _until(lambda: guard.last_error not in (None, before_error), "a failed renewal")
    else:
        _until(lambda: guard.lease.expires_at > before_lease.expires_at, "a renewal")


class Wrapped:
    """A store whose ``leases`` pass lease calls through, with injectable faults
    and delays."""

    @property
    def leases(self) -> Wrapped:
        return self

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.renew_fault: Callable[[], BaseException] | None = None
        self.release_fault: Callable[[], BaseException] | None = None
        self.acquire_fault: dict[str, Callable[[], BaseException]] = {}
        self.on_return: Callable[[], None] = lambda: None  # a slow reply: moves a clock
        self.renews = 0

    def acquire(self, target: str, owner: str, ttl_s: float, **kw: Any) -> Any:
        if target in self.acquire_fault:
            raise self.acquire_fault[target]()
        lease = self.inner.leases.acquire(target, owner, ttl_s, **kw)
        self.on_return()
        return lease

    def renew(self, lease: Any, ttl_s: float) -> Any:
        self.renews += 1
        if self.renew_fault is not None:
            raise self.renew_fault()
        renewed = self.inner.leases.renew(lease, ttl_s)
        self.on_return()
        return renewed

    def release(self, lease: Any) -> bool:
        if self.release_fault is not None:
            raise self.release_fault()
        return bool(self.inner.leases.release(lease))

    def validate(self, lease: Any) -> None:
        self.inner.leases.validate(lease)


# -- one guard ---------------------------------------------------------------------


def test_heartbeat_keeps_the_lease_alive_past_its_ttl(store, one_clock):
    store.sessions.create("hb")
    with RuntimeLeaseGuard.acquire(
        store, "session:hb", "w1", 0.3, purpose="execution", interval_s=0.05
    ) as guard:
        first = guard.lease
        for _ in range(14):  # over 0.7 s: over 2 ttls, renewed every interval
            _step(guard, one_clock, 0.05, failing=False)
        assert not guard.lost.is_set() and guard.lost_error is None
        guard.check()
        assert guard.lease.expires_at > first.expires_at + timedelta(seconds=0.3)
        assert (guard.lease.token, guard.lease.epoch) == (first.token, first.epoch)
        with pytest.raises(BusyError) as busy:
            store.leases.acquire("session:hb", "w2", 10)
        assert busy.value.holder == "w1"
    assert guard.closed
    assert store.leases.acquire("session:hb", "w2", 10).epoch == first.epoch + 1


def test_loss_signal_fires_when_another_owner_takes_over(store, clock):
    store.sessions.create("x")
    guard = RuntimeLeaseGuard.acquire(store, "session:x", "w1", 30, interval_s=0.02)
    try:
        assert not guard.wait_lost(0.05)
        clock.advance(31)  # the store's clock passes the expiry
        other = store.leases.acquire("session:x", "w2", 30)
        assert guard.wait_lost(HANG_GUARD_S)
        assert guard.lost.is_set()
        assert isinstance(guard.lost_error, LeaseLostError)
        with pytest.raises(LeaseLostError) as err:
            guard.check()
        assert err.value.target == "session:x"
        assert err.value.__cause__ is guard.lost_error
    finally:
        assert guard.release() is False  # stale: the takeover is untouched
    store.leases.validate(other)


def test_check_passes_while_held_and_asks_the_database(store, clock):
    store.sessions.create("c")
    with RuntimeLeaseGuard.acquire(store, "session:c", "w1", 30, interval_s=20) as guard:
        guard.check()
        clock.advance(31)
        store.leases.acquire("session:c", "w2", 30)
        # No heartbeat has run (interval 20 s): the database check finds the loss.
        with pytest.raises(LeaseLostError):
            guard.check()
        assert guard.lost.is_set() and isinstance(guard.lost_error, LeaseLostError)
        with pytest.raises(LeaseLostError):
            guard.check()
    with pytest.raises(LeaseLostError):  # released guards never pass
        guard.check()


def test_backend_errors_are_retried_then_lost_at_the_deadline_not_before(store, one_clock):
    store.sessions.create("db")
    wrapped = Wrapped(store)
    with RuntimeLeaseGuard.acquire(wrapped, "session:db", "w1", 0.4, interval_s=0.05) as guard:
        wrapped.renew_fault = lambda: OperationalError(detail="disk on fire")
        for _ in range(6):  # every beat fails: each one is retried (0.3 s of 0.4)
            _step(guard, one_clock, 0.05, failing=True)
        assert isinstance(guard.last_error, OperationalError)
        assert not guard.lost.is_set()  # still maybe held: not reported as lost
        guard.check()  # and the database agrees it is held
        assert wrapped.renews >= 3  # retried, not given up on the first failure
        one_clock.advance(guard.remaining_s - 2 * SLACK_S)
        assert not guard.lost.is_set()  # not before the deadline
        one_clock.advance(3 * SLACK_S)
        assert guard.wait_lost(HANG_GUARD_S)  # by it (reading it applies the deadline)
        assert isinstance(guard.lost_error, OperationalError)
        with pytest.raises(LeaseLostError) as err:
            guard.check()
        assert isinstance(err.value.__cause__, OperationalError)


def test_a_recovered_backend_keeps_the_lease(store, one_clock):
    store.sessions.create("blip")
    wrapped = Wrapped(store)
    start = one_clock()
    with RuntimeLeaseGuard.acquire(wrapped, "session:blip", "w1", 0.4, interval_s=0.04) as guard:
        wrapped.renew_fault = lambda: turnkeeper.TransactionConflictError("renew_lease", 40)
        for _ in range(3):  # 0.12 s of failed renewals
            _step(guard, one_clock, 0.04, failing=True)
        wrapped.renew_fault = None
        while (one_clock() - start).total_seconds() < 0.5:  # past the ttl
            _step(guard, one_clock, 0.04, failing=False)
        assert not guard.lost.is_set() and guard.last_error is None
        guard.check()


def test_closed_store_stops_renewals_and_loses_at_the_deadline(store, one_clock):
    store.sessions.create("i")
    wrapped = Wrapped(store)
    with RuntimeLeaseGuard.acquire(wrapped, "session:i", "w1", 0.3, interval_s=0.03) as guard:
        wrapped.renew_fault = lambda: InterfaceError(detail="the store is closed")
        _step(guard, one_clock, 0.03, failing=True)
        calls = wrapped.renews
        assert calls == 1 and not guard.lost.is_set()
        one_clock.advance(guard.remaining_s + SLACK_S)
        assert guard.wait_lost(HANG_GUARD_S)
        guard._thread.join(HANG_GUARD_S)  # the heartbeat had every chance to retry
        assert wrapped.renews == calls  # halted: no retries against a closed store
        assert isinstance(guard.lost_error, InterfaceError)


def test_loss_deadline_is_no_later_than_the_store_expiry(store, one_clock):
    # Slow replies (the clock moves while they come back): the deadline must
    # count from when the call was sent.
    store.sessions.create("slow")
    wrapped = Wrapped(store)
    wrapped.on_return = lambda: one_clock.advance(0.1)
    with RuntimeLeaseGuard.acquire(wrapped, "session:slow", "w1", 1.0, interval_s=0.2) as guard:
        # (1 µs: the float seconds' rounding, not a timing allowance)
        assert guard.remaining_s <= _store_remaining_s(guard, one_clock) + 1e-6  # after acquire
        _step(guard, one_clock, 0.3, failing=False)
        assert guard.remaining_s <= _store_remaining_s(guard, one_clock) + 1e-6  # a renewal
        assert wrapped.renews >= 1


def test_loss_fires_at_the_deadline_while_a_renewal_is_stuck(store, one_clock):
    store.sessions.create("late")
    wrapped = Wrapped(store)
    entered, go, returned = threading.Event(), threading.Event(), threading.Event()

    def stuck() -> None:
        entered.set()
        go.wait(HANG_GUARD_S)
        returned.set()

    with RuntimeLeaseGuard.acquire(wrapped, "session:late", "w1", 0.3, interval_s=0.1) as guard:
        wrapped.on_return = stuck  # the renewal at 0.1 s answers only when told
        one_clock.advance(0.1 + SLACK_S)
        assert entered.wait(HANG_GUARD_S)
        one_clock.advance(guard.remaining_s + SLACK_S)
        try:
            assert guard.wait_lost(HANG_GUARD_S)
            assert not returned.is_set()  # the loss did not wait for the stuck call
            assert isinstance(guard.lost_error, LeaseLostError)
            with pytest.raises(LeaseLostError):
                guard.check()
        finally:
            go.set()
    # The late renewal succeeded in the store but did not revive the guard;
    # exit waited for it and released what it renewed.
    assert guard.lost.is_set() and wrapped.renews == 1
    store.leases.acquire("session:late", "w2", 1)


def _store_remaining_s(guard: RuntimeLeaseGuard, clock: Any) -> float:
    return (guard.lease.expires_at - clock()).total_seconds()


def test_cancellation_in_the_heartbeat_is_signalled_and_not_swallowed(store, monkeypatch):
    store.sessions.create("k")
    seen: list[type[BaseException] | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    wrapped = Wrapped(store)
    wrapped.renew_fault = KeyboardInterrupt
    with RuntimeLeaseGuard.acquire(wrapped, "session:k", "w1", 30, interval_s=0.02) as guard:
        assert guard.wait_lost(HANG_GUARD_S)
        assert isinstance(guard.lost_error, KeyboardInterrupt)
        guard._thread.join(HANG_GUARD_S)
    assert seen == [KeyboardInterrupt]


def test_adopting_a_lease_guards_it_if_held_and_raises_if_lost(store, clock):
    store.sessions.create("a")
    store.sessions.create("z")
    stale = store.leases.acquire("session:z", "w1", 5)
    clock.advance(6)
    before = _lease_threads()
    with pytest.raises(LeaseLostError):
        RuntimeLeaseGuard(store, stale, 5)
    assert _lease_threads() == before

    store.runs.admit("a", {"q": 1})  # an orphan: what a recovery lease is taken for
    lease = store.leases.acquire("session:a", "w1", 5, purpose="recovery")
    with RuntimeLeaseGuard(store, lease, 5) as guard:
        assert (guard.lease.epoch, guard.lease.purpose) == (lease.epoch, "recovery")
        guard.check()
    with pytest.raises(LeaseLostError):
        store.leases.validate(lease)  # released on exit


def test_thread_stops_on_exit_and_release_is_idempotent(store):
    store.sessions.create("t")
    before = set(threading.enumerate())
    with RuntimeLeaseGuard.acquire(store, "session:t", "w1", 30, interval_s=0.01) as guard:
        assert len(set(threading.enumerate()) - before) == 1
        time.sleep(0.05)
    assert set(threading.enumerate()) == before
    assert guard.release() is False
    assert not guard.wait_lost(None)  # released, not lost: returns at once


def test_exit_with_an_error_releases_and_notes_a_failed_release(store):
    store.sessions.create("e")
    store.sessions.create("n")
    with pytest.raises(RuntimeError), RuntimeLeaseGuard.acquire(store, "session:e", "w1", 30):
        raise RuntimeError("tool failed")
    store.leases.acquire("session:e", "w2", 30)

    wrapped = Wrapped(store)
    with pytest.raises(RuntimeError) as err:  # noqa: SIM117
        with RuntimeLeaseGuard.acquire(wrapped, "session:n", "w1", 30):
            wrapped.release_fault = lambda: OperationalError(detail="gone")
            raise RuntimeError("tool failed")
    assert any("also failed" in note for note in err.value.__notes__)


def test_a_dropped_guard_stops_its_thread_and_a_released_one_frees_the_store():
    store = turnkeeper.open_store(":memory:")
    store.sessions.create("g")
    guard = RuntimeLeaseGuard.acquire(store, "session:g", "w1", 30, interval_s=0.01)
    (thread,) = [t for t in _lease_threads() if t.name == "turnkeeper-lease[session:g]"]
    del guard
    gc.collect()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive()

    store.sessions.create("h")
    kept = RuntimeLeaseGuard.acquire(store, "session:h", "w1", 30, interval_s=0.01)
    kept.release()
    store.close()
    alive = weakref.ref(store)
    del store
    gc.collect()
    assert alive() is None and kept.closed  # the closed guard does not pin the store


def test_bad_input_is_refused_before_anything_is_taken(store):
    store.sessions.create("v")
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
    store.leases.acquire("session:v", "w2", 1)  # nothing was taken


# -- several targets ---------------------------------------------------------------


def test_acquire_many_dedupes_and_sorts(store):
    store.sessions.create("a")
    store.sessions.create("b")
    leases = acquire_many(store, ["session:b", "session:a", "session:b"], "w1", 10)
    assert [lease.target for lease in leases] == ["session:a", "session:b"]
    assert {lease.purpose for lease in leases} == {"mutation"}
    assert acquire_many(store, [], "w1", 10) == []


def test_acquire_many_releases_partial_acquisitions_on_busy(store):
    store.sessions.create("a")
    store.sessions.create("b")
    store.sessions.create("c")
    store.leases.acquire("session:b", "other", 10)
    with pytest.raises(BusyError) as err:
        acquire_many(store, ["session:c", "session:a", "session:b"], "w1", 10)
    assert (err.value.target, err.value.holder) == ("session:b", "other")
    # session:a was taken first and must have been released; c never taken.
    taken = store.leases.acquire("session:a", "w2", 10)
    assert taken.epoch == 2
    assert store.leases.acquire("session:c", "w2", 10).epoch == 1


def test_acquire_many_releases_partial_acquisitions_on_any_error(store):
    store.sessions.create("a")
    store.sessions.create("b")
    store.sessions.create("d")
    store.sessions.create("e")
    store.leases.acquire("session:b", "w1", 10, purpose="execution")
    with pytest.raises(LeasePurposeError):
        acquire_many(store, ["session:a", "session:b"], "w1", 10, purpose="mutation")
    store.leases.acquire("session:a", "w2", 10)

    wrapped = Wrapped(store)
    wrapped.acquire_fault["session:e"] = KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        acquire_many(wrapped, ["session:e", "session:d"], "w1", 10)
    store.leases.acquire("session:d", "w2", 10)


def test_acquire_many_notes_a_failed_cleanup_on_the_original_error(store):
    store.sessions.create("a")
    store.sessions.create("b")
    store.leases.acquire("session:b", "other", 10)
    wrapped = Wrapped(store)
    wrapped.release_fault = lambda: OperationalError(detail="gone")
    with pytest.raises(BusyError) as err:
        acquire_many(wrapped, ["session:a", "session:b"], "w1", 10)
    assert any("session:a" in note for note in err.value.__notes__)


def test_acquire_many_waits_for_a_busy_target(real_store):
    real_store.sessions.create("a")
    real_store.sessions.create("b")
    held = real_store.leases.acquire("session:b", "other", 60)
    timer = threading.Timer(0.1, real_store.leases.release, [held])
    timer.start()
    try:  # (the wait is a hang guard: the release comes when the timer runs)
        leases = acquire_many(
            real_store, ["session:b", "session:a"], "w1", 2 * HANG_GUARD_S, wait_s=HANG_GUARD_S
        )
    finally:
        timer.join()
    assert [lease.target for lease in leases] == ["session:a", "session:b"]


def test_opposite_orders_never_deadlock_nor_double_hold(real_store):
    real_store.sessions.create("a")
    real_store.sessions.create("b")
    real_store.sessions.create("c")
    targets = ["session:a", "session:b", "session:c"]
    holders: dict[str, str] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    rounds = 8

    def worker(owner: str, wanted: list[str]) -> None:
        try:
            for _ in range(rounds):
                # leases that outlive any pause of a loaded machine, and a wait that
                # only a deadlock exhausts: a lapsed lease would look like a double hold
                leases = acquire_many(real_store, wanted, owner, 300, wait_s=HANG_GUARD_S)
                with lock:
                    for lease in leases:
                        assert lease.target not in holders, (lease.target, holders)
                        holders[lease.target] = owner
                time.sleep(0)
                with lock:
                    for lease in leases:
                        del holders[lease.target]
                for lease in reversed(leases):
                    assert real_store.leases.release(lease)
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
        t.join(timeout=5 * HANG_GUARD_S)
    assert not any(t.is_alive() for t in threads), "deadlocked"
    assert errors == []


def test_group_guards_every_target_and_releases_all_on_exit_or_failure(store):
    store.sessions.create("a")
    store.sessions.create("b")
    store.sessions.create("x")
    store.sessions.create("y")
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

    store.leases.acquire("session:y", "other", 30)
    with pytest.raises(BusyError):
        RuntimeLeaseGroup.acquire(store, ["session:x", "session:y"], "w1", 30)
    assert set(threading.enumerate()) == before  # the guard made for x is gone
    store.leases.acquire("session:x", "w2", 30)
