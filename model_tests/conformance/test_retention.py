"""Retention by age or count (``store.sessions.retain``), on both backends: it
runs under a lease, removes only whole sessions (every session left replays
as before), skips and reports busy, active and changed sessions, stops when
its lease is lost, and leaves the audit clean.

Each guard has a kill test: the guard patched out (in the test only), the
same check fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from turnkeeper import InvalidInputError, LeaseLostError, RetentionReport
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.ops import deletes

USER = {"role": "user", "content": "hello"}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}


def audit_clean(store: Any) -> None:
    bad = [(c.name, c.detail) for c in run_audit(store) if not c.passed]
    assert bad == [], bad


def aged(store: Any, clock: Any, n: int = 6) -> list[str]:
    """Sessions s0 … s(n-1), each written 10 s after the one before (a turn each);
    the clock ends 10 s after the last."""
    sids = []
    for i in range(n):
        sid = f"s{i}"
        store.sessions.create(sid)
        run = store.runs.admit(sid, {"q": i}, user_message=USER)
        store.runs.start(run.id)
        store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
        sids.append(sid)
        clock.advance(10)
    return sids


def replays(store: Any, sids: list[str]) -> dict[str, Any]:
    return {s: (store.sessions.replay(s), store.sessions.entries(s)) for s in sids}


def remaining(store: Any, sids: list[str]) -> list[str]:
    return [s for s in sids if store.sessions.get(s) is not None]


def test_by_age_removes_only_old_sessions_whole(store, clock):
    sids = aged(store, clock)  # written 60, 50 … 10 s ago
    before = replays(store, sids)
    lease = store.leases.acquire("retention:main", "janitor", 60)
    report = store.sessions.retain(lease, max_age_s=35)
    assert isinstance(report, RetentionReport) and report.skipped == {} and not report.lease_lost
    assert [g.session_id for g in report.removed] == ["s0", "s1", "s2"]
    assert {g.reason for g in report.removed} == {"retention"}
    assert all(g.runs == 1 and g.entries >= 2 for g in report.removed)
    assert remaining(store, sids) == ["s3", "s4", "s5"]
    assert replays(store, remaining(store, sids)) == {s: before[s] for s in ("s3", "s4", "s5")}
    assert store.sessions.retain(lease, max_age_s=35).removed == []
    audit_clean(store)


def test_by_count_and_both(store, clock):
    sids = aged(store, clock)
    lease = store.leases.acquire("retention:main", "janitor", 60)
    # both: older than 15 s AND not among the 4 newest -> s0, s1
    report = store.sessions.retain(lease, max_age_s=15, keep_last=4)
    assert [g.session_id for g in report.removed] == ["s0", "s1"]
    report = store.sessions.retain(lease, keep_last=1, limit=2)  # oldest first, at most 2
    assert [g.session_id for g in report.removed] == ["s2", "s3"]
    report = store.sessions.retain(lease, keep_last=1)
    assert [g.session_id for g in report.removed] == ["s4"]
    assert remaining(store, sids) == ["s5"]
    assert store.sessions.retain(lease, keep_last=0).removed[0].session_id == "s5"
    audit_clean(store)


def test_busy_and_active_sessions_are_skipped_and_reported(store, clock):
    sids = aged(store, clock, 4)
    held = store.leases.acquire("session:s1", "worker", 600)
    run = store.runs.admit("s2", {"q": "again"})
    lease = store.leases.acquire("retention:main", "janitor", 600)
    report = store.sessions.retain(lease, keep_last=0)
    assert report.skipped == {"s1": "busy", "s2": "active"}
    assert [g.session_id for g in report.removed] == ["s0", "s3"]
    assert remaining(store, sids) == ["s1", "s2"]
    store.leases.release(held)
    store.runs.request_cancel(run.id)
    store.runs.finish(run.id, "cancelled")
    assert [g.session_id for g in store.sessions.retain(lease, keep_last=0).removed] == ["s1", "s2"]
    audit_clean(store)


def meanwhile(store: Any, monkeypatch: Any, act: Any) -> None:
    """Run ``act()`` once after the pass chose its sessions, before it deletes
    the first (another writer between the choice and the deletes)."""
    fenced = store.sessions._fenced
    done: list[bool] = []

    def first_then(operation: str, *args: Any, **kwargs: Any) -> Any:
        if operation == "retain_session" and not done:
            done.append(True)
            act()
        return fenced(operation, *args, **kwargs)

    monkeypatch.setattr(store.sessions, "_fenced", first_then)


def check_changed_kept(store: Any, clock: Any, monkeypatch: Any) -> None:
    sids = aged(store, clock, 3)
    before = store.sessions.replay("s1")
    lease = store.leases.acquire("retention:main", "janitor", 600)
    meanwhile(store, monkeypatch, lambda: store.sessions.append("s1", "message", {"message": USER}))
    report = store.sessions.retain(lease, keep_last=0)
    assert report.skipped == {"s1": "changed"}, report
    assert remaining(store, sids) == ["s1"]
    after = store.sessions.replay("s1")
    assert list(after.messages) == [*before.messages, USER]


def test_a_session_written_after_the_choice_is_kept(store, clock, monkeypatch):
    check_changed_kept(store, clock, monkeypatch)
    audit_clean(store)


def test_a_session_deleted_after_the_choice_is_reported_gone(store, clock, monkeypatch):
    aged(store, clock, 2)
    lease = store.leases.acquire("retention:main", "janitor", 600)
    meanwhile(store, monkeypatch, lambda: store.sessions.delete("s1"))
    report = store.sessions.retain(lease, keep_last=0)
    assert [g.session_id for g in report.removed] == ["s0"]
    assert report.skipped == {"s1": "gone"}
    audit_clean(store)


def check_stops_when_its_lease_is_lost(store: Any, clock: Any, monkeypatch: Any) -> None:
    sids = aged(store, clock, 3)
    lease = store.leases.acquire("retention:main", "janitor", 5)
    meanwhile(store, monkeypatch, lambda: clock.advance(6))
    report = store.sessions.retain(lease, keep_last=0)
    assert report.lease_lost and report.removed == [], report
    assert remaining(store, sids) == sids


def test_a_pass_stops_when_its_lease_is_lost(store, clock, monkeypatch):
    check_stops_when_its_lease_is_lost(store, clock, monkeypatch)
    audit_clean(store)


def test_bad_arguments_and_a_lost_lease_at_the_start(store, clock):
    aged(store, clock, 2)
    lease = store.leases.acquire("retention:main", "janitor", 5)
    for kwargs in (
        {},
        {"max_age_s": -1},
        {"max_age_s": float("nan")},
        {"max_age_s": float("inf")},
        {"max_age_s": 1e11},
        {"max_age_s": True},
        {"max_age_s": "1"},
        {"keep_last": -1},
        {"keep_last": 1.5},
        {"keep_last": 1, "limit": 0},
    ):
        with pytest.raises(InvalidInputError):
            store.sessions.retain(lease, **kwargs)
    with pytest.raises(InvalidInputError):
        store.sessions.retain("retention:main", keep_last=0)
    clock.advance(6)
    with pytest.raises(LeaseLostError):
        store.sessions.retain(lease, keep_last=0)
    assert remaining(store, ["s0", "s1"]) == ["s0", "s1"]


# -- guards, each broken in a kill test ------------------------------------------


def check_busy_skipped(store: Any, clock: Any) -> None:
    aged(store, clock, 1)
    store.leases.acquire("session:s0", "worker", 600)
    lease = store.leases.acquire("retention:main", "janitor", 600)
    report = store.sessions.retain(lease, keep_last=0)
    assert report.skipped == {"s0": "busy"} and report.removed == [], report


def test_guards_hold(store, clock):
    check_busy_skipped(store, clock)


def test_kill_the_session_lease_guard(store, clock, monkeypatch):
    monkeypatch.setattr(deletes.leases, "fence_or_unheld", lambda tx, target, lease: None)
    with pytest.raises(AssertionError):
        check_busy_skipped(store, clock)


def test_kill_the_changed_guard(store, clock, monkeypatch):
    def unchecked(tx: Any, *, session_id: str, expect: Any, lease: Any) -> Any:
        deletes.leases.fence(tx, lease)  # _retain_one without its comparison of heads
        return deletes.delete(tx, session_id, None, "retention")

    monkeypatch.setattr(deletes, "_retain_one", unchecked)
    with pytest.raises(AssertionError):
        check_changed_kept(store, clock, monkeypatch)


def test_kill_the_retention_lease_fence(store, clock, monkeypatch):
    original = deletes.leases.fence
    calls: list[int] = []

    def first_only(tx: Any, lease: Any) -> Any:  # the check at the start stays
        calls.append(1)
        return original(tx, lease) if len(calls) == 1 else None

    monkeypatch.setattr(deletes.leases, "fence", first_only)
    with pytest.raises(AssertionError):
        check_stops_when_its_lease_is_lost(store, clock, monkeypatch)
