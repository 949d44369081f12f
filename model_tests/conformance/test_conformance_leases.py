"""Conformance: leases (threadstore AcquireLease / RenewLease / ReleaseLease)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import turnkeeper
from turnkeeper import BusyError, InvalidInputError, LeaseLostError, LeasePurposeError
from turnkeeper.storage.ops import leases as lease_ops
from turnkeeper.storage.validate import MAX_TTL_S


@pytest.fixture
def store(any_store: Any) -> Any:
    """Each backend, called directly and through ``turnkeeper.aio`` (conftest's ``any_store``)."""
    return any_store


def test_acquire_grants_epoch_one_then_busy_for_others(store, clock):
    lease = store.leases.acquire("t", "a", 10)
    assert (lease.target, lease.owner, lease.epoch, lease.purpose) == ("t", "a", 1, "mutation")
    assert lease.expires_at == clock.now + __import__("datetime").timedelta(seconds=10)
    with pytest.raises(BusyError) as err:
        store.leases.acquire("t", "b", 10)
    assert (err.value.target, err.value.holder) == ("t", "a")


def test_reacquire_same_owner_same_purpose_returns_same_token_and_extends(store, clock):
    first = store.leases.acquire("t", "a", 10)
    clock.advance(5)
    again = store.leases.acquire("t", "a", 10)
    assert (again.token, again.epoch) == (first.token, first.epoch)
    assert again.expires_at > first.expires_at


def test_reacquire_with_other_purpose_is_a_purpose_error(store):
    store.leases.acquire("t", "a", 10, purpose="execution")
    with pytest.raises(LeasePurposeError) as err:
        store.leases.acquire("t", "a", 10, purpose="recovery")
    assert (err.value.held_purpose, err.value.requested_purpose) == ("execution", "recovery")


def test_expired_lease_is_taken_over_with_a_higher_epoch(store, clock):
    old = store.leases.acquire("t", "a", 10)
    clock.advance(10)  # live iff now < expires_at: at expiry it is free
    new = store.leases.acquire("t", "b", 10)
    assert new.epoch == old.epoch + 1 and new.token != old.token
    with pytest.raises(LeaseLostError):
        store.leases.renew(old, 10)
    with pytest.raises(LeaseLostError):
        store.leases.validate(old)


def test_same_owner_after_expiry_gets_a_new_epoch(store, clock):
    old = store.leases.acquire("t", "a", 1)
    clock.advance(2)
    new = store.leases.acquire("t", "a", 1)
    assert new.epoch == 2 and new.token != old.token


def test_renew_extends_from_now(store, clock):
    lease = store.leases.acquire("t", "a", 10)
    clock.advance(9)
    renewed = store.leases.renew(lease, 10)
    assert renewed.expires_at == clock.now + __import__("datetime").timedelta(seconds=10)
    clock.advance(9)
    store.leases.validate(renewed)
    with pytest.raises(BusyError):
        store.leases.acquire("t", "b", 1)


@pytest.mark.parametrize("ttl_s", [0.000001, 1.5, 3600, 86400 * 30, MAX_TTL_S])
def test_acquire_and_renew_take_every_allowed_ttl_to_the_microsecond(store, clock, ttl_s):
    """Any ttl_s in (0, ten years] works for acquire and renew alike (an hour's
    worth of microseconds once overflowed a 32-bit multiplication on renew)."""
    from datetime import timedelta

    lease = store.leases.acquire("t", "a", ttl_s)
    assert lease.expires_at == clock.now + timedelta(microseconds=round(ttl_s * 1_000_000))
    clock.advance(ttl_s / 2 if ttl_s < 1 else 0.5)
    renewed = store.leases.renew(lease, ttl_s)
    assert renewed.expires_at == clock.now + timedelta(microseconds=round(ttl_s * 1_000_000))
    assert store.query("SELECT expires_at FROM leases").to_pylist() == [
        {"expires_at": renewed.expires_at}
    ]


def test_renew_after_expiry_is_lease_lost_even_if_nobody_took_it(store, clock):
    lease = store.leases.acquire("t", "a", 1)
    clock.advance(1)
    with pytest.raises(LeaseLostError) as err:
        store.leases.renew(lease, 10)
    assert err.value.target == "t"


def check_expired_at_its_instant(store, clock) -> None:
    """At exactly ``expires_at`` a lease is expired (live iff now < expires_at):
    renew and validate refuse it, and nothing was written."""
    lease = store.leases.acquire("t", "a", 10)
    clock.advance(10)
    assert clock() == lease.expires_at
    with pytest.raises(LeaseLostError, match="expired"):
        store.leases.renew(lease, 10)
    with pytest.raises(LeaseLostError, match="expired"):
        store.leases.validate(lease)
    rows = store.query("SELECT epoch, expires_at FROM leases").to_pylist()
    assert rows == [{"epoch": 1, "expires_at": lease.expires_at}]


def test_a_lease_at_its_expiry_instant_fences_nothing(store, clock):
    check_expired_at_its_instant(store, clock)


def test_the_expiry_instant_check_fails_with_the_boundary_counted_live(store, clock, monkeypatch):
    """Control: the fence judging ``expires_at < now`` (the instant counted live)."""
    real = lease_ops.unexpired

    def at_instant_live(tx: Any, target: str, expires_at: Any, server_now: Any = None) -> Any:
        now = tx.clock_after_locks(server_now)
        return real(tx, target, expires_at, server_now) if expires_at < now else now

    monkeypatch.setattr(lease_ops, "unexpired", at_instant_live)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        check_expired_at_its_instant(store, clock)


def test_a_lease_at_its_expiry_instant_is_taken_over(store, clock):
    lease = store.leases.acquire("t", "a", 10)
    clock.advance(10)
    assert clock() == lease.expires_at
    taken = store.leases.acquire("t", "b", 10)
    assert (taken.owner, taken.epoch) == ("b", 2)
    with pytest.raises(LeaseLostError):
        store.leases.validate(lease)


def test_release_is_idempotent_and_frees_the_target(store):
    lease = store.leases.acquire("t", "a", 10)
    assert store.leases.release(lease) is True
    assert store.leases.release(lease) is False
    nxt = store.leases.acquire("t", "b", 10)
    assert nxt.epoch == 2  # epochs are never reused: rows are kept after release


def test_release_by_a_non_holder_changes_nothing(store):
    lease = store.leases.acquire("t", "a", 10)
    forged = turnkeeper.Lease(
        "t", "b", "not-the-token", lease.epoch, lease.purpose, lease.expires_at
    )
    assert store.leases.release(forged) is False
    stale = turnkeeper.Lease("t", "a", "wrong-token", lease.epoch, lease.purpose, lease.expires_at)
    assert store.leases.release(stale) is False
    store.leases.validate(lease)
    with pytest.raises(BusyError):
        store.leases.acquire("t", "b", 10)


def test_stale_lease_release_ignored_after_takeover(store, clock):
    old = store.leases.acquire("t", "a", 1)
    clock.advance(2)
    new = store.leases.acquire("t", "b", 10)
    assert store.leases.release(old) is False
    store.leases.validate(new)


def test_token_is_never_stored_only_its_digest(store):
    lease = store.leases.acquire("t", "a", 10)
    table = store.query("SELECT * FROM leases").to_pylist()
    assert lease.token not in repr(table)
    assert "token" not in repr(lease)


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), "5"])
def test_bad_ttl_is_refused_with_nothing_written(store, ttl):
    with pytest.raises(InvalidInputError) as err:
        store.leases.acquire("t", "a", ttl)
    assert err.value.field == "ttl_s"
    assert store.query("SELECT count(*) AS n FROM leases").to_pylist() == [{"n": 0}]


@pytest.mark.parametrize("target,owner", [("", "a"), ("t", ""), ("t\ud800", "a"), (None, "a")])
def test_bad_target_or_owner_is_refused(store, target, owner):
    with pytest.raises(InvalidInputError):
        store.leases.acquire(target, owner, 1)


def test_every_transition_writes_an_event_row(store, clock):
    a = store.leases.acquire("t", "a", 1)
    store.leases.acquire("t", "a", 1)
    store.leases.renew(a, 1)
    clock.advance(5)
    b = store.leases.acquire("t", "b", 1)
    store.leases.release(b)
    store.leases.acquire("t", "c", 1)
    rows = store.query(
        "SELECT edge, epoch FROM lease_events ORDER BY occurred_at, epoch"
    ).to_pylist()
    assert [(r["edge"], r["epoch"]) for r in rows] == [
        ("grant", 1),
        ("reacquire", 1),
        ("renew", 1),
        ("takeover", 2),
        ("release", 2),
        ("regrant", 3),
    ]


def test_errors_are_picklable_with_their_fields():
    for err in [BusyError("t", "a"), LeaseLostError("t"), LeasePurposeError("t", "x", "y")]:
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
        assert back.target == "t"
