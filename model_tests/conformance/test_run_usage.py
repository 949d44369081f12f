"""A run's usage, progress and structured error (session seed UpdateSessionRunUsage,
UpdateSessionRunProgress, UpdateSessionRunErrorInfo), on both backends: each is
stored apart from the run's status and read back on every run read; each is a
session write under the one session-write rule (fenced under the session's
lease, refused with ``BusyError`` without one while someone holds it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import turnkeeper
from turnkeeper.spec import errors
from turnkeeper.storage.ops import run_usage

USAGE = {"input": 5878, "output": 242, "cacheRead": 384, "cacheWrite": 0, "totalTokens": 6504}
CONTEXT = {"tokens": 6504, "window": 200000, "text": "nul \x00 kept"}


def _run(store: turnkeeper.BaseStore, sid: str = "s") -> turnkeeper.Run:
    store.sessions.create(sid)
    return store.runs.admit(sid, {"text": "go"}, start=True)


def _reads(store: turnkeeper.BaseStore, run: turnkeeper.Run) -> list[turnkeeper.Run]:
    """The run as every run read returns it."""
    got = store.runs.get(run.id)
    listed = [r for r in store.runs.list(run.session_id) if r.id == run.id]
    active = store.runs.active(run.session_id)
    return [got, *listed, *([active] if active is not None and active.id == run.id else [])]


def test_usage_is_stored_apart_from_the_status_and_read_back_everywhere(store):
    run = _run(store)
    assert (run.usage, run.context_usage, run.progress, run.error_info) == (None,) * 4
    stored = store.runs.update_usage(run.id, USAGE, CONTEXT)
    assert (stored.usage, stored.context_usage, stored.status) == (USAGE, CONTEXT, "running")
    assert all(r == stored for r in _reads(store, run))
    # None leaves a value as stored
    later = store.runs.update_usage(run.id, {**USAGE, "output": 300})
    assert later.usage["output"] == 300 and later.context_usage == CONTEXT
    again = store.runs.update_usage(run.id, None, {"tokens": 1})
    assert again.usage == later.usage and again.context_usage == {"tokens": 1}
    # a run that ended still takes usage (a recovered run's figures)
    store.runs.finish(run.id, "failed", error="boom")
    ended = store.runs.update_usage(run.id, USAGE)
    assert ended.status == "failed" and ended.usage == USAGE and ended.error == "boom"
    assert store.runs.get(run.id) == ended


def test_progress_replaces_the_last_and_a_run_that_ended_takes_only_an_empty_one(store):
    run = _run(store)
    store.runs.update_progress(run.id, {"phase": "retry", "attempt": 1})
    assert store.runs.update_progress(run.id, {"phase": "wait"}).progress == {"phase": "wait"}
    store.runs.finish(run.id, "interrupted")
    before = store.runs.get(run.id)
    with pytest.raises(errors.InvalidTransitionError) as err:
        store.runs.update_progress(run.id, {"phase": "late"})
    assert (err.value.machine, err.value.source) == ("run", "interrupted")
    assert store.runs.get(run.id) == before
    cleared = store.runs.update_progress(run.id, {})
    assert cleared.progress == {} and store.runs.get(run.id).progress == {}


def test_error_info_is_kept_beside_the_summary_and_never_on_a_success(store):
    run = _run(store)
    info = {"code": "provider_overloaded", "retryable": True, "detail": "x\x00y"}
    assert store.runs.update_error_info(run.id, info).error_info == info  # a recovery error
    store.runs.finish(run.id, "failed", error="overloaded")
    final = {"code": "provider_overloaded", "attempts": 3}
    stored = store.runs.update_error_info(run.id, final)
    assert (stored.error, stored.error_info) == ("overloaded", final)

    ok = _run(store, "t")
    store.runs.finish(ok.id, "succeeded")
    with pytest.raises(errors.InvalidTransitionError):
        store.runs.update_error_info(ok.id, {"code": "x"})
    assert store.runs.get(ok.id).error_info is None
    assert store.runs.update_error_info(ok.id, {}).error_info == {}


BAD: dict[str, Callable[[turnkeeper.BaseStore, str], Any]] = {
    "usage-none": lambda s, r: s.runs.update_usage(r, None),
    "usage-list": lambda s, r: s.runs.update_usage(r, [1, 2]),  # type: ignore[arg-type]
    "usage-nan": lambda s, r: s.runs.update_usage(r, {"x": float("nan")}),
    "context-str": lambda s, r: s.runs.update_usage(r, USAGE, "x"),  # type: ignore[arg-type]
    "progress-str": lambda s, r: s.runs.update_progress(r, "x"),  # type: ignore[arg-type]
    "info-tuple": lambda s, r: s.runs.update_error_info(r, {"t": (1,)}),
    "run-id-nul": lambda s, r: s.runs.update_usage("a\x00b", USAGE),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_refused_and_writes_nothing(store, name):
    run = _run(store)
    before = store.runs.get(run.id)
    with pytest.raises(errors.InvalidInputError):
        BAD[name](store, run.id)
    assert store.runs.get(run.id) == before


@pytest.mark.parametrize(
    "write",
    [
        lambda s: s.runs.update_usage("nope", USAGE),
        lambda s: s.runs.update_progress("nope", {}),
        lambda s: s.runs.update_error_info("nope", {}),
    ],
)
def test_a_missing_run_is_run_not_found(store, write):
    with pytest.raises(errors.RunNotFoundError) as err:
        write(store)
    assert err.value.run_id == "nope"


# -- the one session-write rule ------------------------------------------------------

WRITES: dict[str, Callable[..., turnkeeper.Run]] = {
    "usage": lambda s, run, **kw: s.runs.update_usage(run.id, USAGE, CONTEXT, **kw),
    "progress": lambda s, run, **kw: s.runs.update_progress(run.id, {"phase": "x"}, **kw),
    "error-info": lambda s, run, **kw: s.runs.update_error_info(run.id, {"code": "c"}, **kw),
}


@pytest.fixture
def held(store):
    """Session ``s`` with a running run, held by ``p1`` (which admitted it: a
    runtime lease on a session with an ownerless run is recovery's)."""
    store.sessions.create("s")
    p1 = store.leases.acquire("session:s", "p1", 600, purpose="execution")
    run = store.runs.admit("s", {"text": "go"}, start=True, lease=p1)
    return store, p1, run


@pytest.mark.parametrize("name", sorted(WRITES))
def test_without_a_lease_a_held_session_is_busy_and_nothing_is_written(held, name):
    store, p1, run = held
    before = store.runs.get(run.id)
    with pytest.raises(errors.BusyError) as err:
        WRITES[name](store, run)
    assert (err.value.target, err.value.holder) == ("session:s", "p1")
    assert store.runs.get(run.id) == before
    WRITES[name](store, run, lease=p1)  # the holder writes under its lease
    assert store.runs.get(run.id) != before


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_lost_lease_is_refused_recorded_and_writes_nothing(held, clock, name):
    store, p1, run = held
    WRITES[name](store, run, lease=p1)
    clock.advance(601)
    store.leases.acquire("session:s", "p2", 600, purpose="recovery")  # its run is orphaned
    before = store.runs.get(run.id)
    fenced = store.query("SELECT count(*) AS n FROM fence_events").to_pylist()[0]["n"]
    with pytest.raises(errors.LeaseLostError):
        WRITES[name](store, run, lease=p1)
    assert store.runs.get(run.id) == before
    after = store.query("SELECT operation FROM fence_events").to_pylist()
    assert len(after) == fenced + 1
    assert after[-1]["operation"].startswith("update_run_")


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_lease_on_another_session_is_refused(held, name):
    store, _p1, run = held
    store.sessions.create("t")  # a runtime lease needs its session
    other = store.leases.acquire("session:t", "p1", 600)
    before = store.runs.get(run.id)
    with pytest.raises(errors.InvalidInputError):
        WRITES[name](store, run, lease=other)
    assert store.runs.get(run.id) == before


@pytest.mark.parametrize("name", sorted(WRITES))
def test_control_without_the_fence_the_lease_less_write_goes_through(held, monkeypatch, name):
    """The guard the tests above rely on: with ``no_other_owner`` patched out of
    the module, a write without a lease lands on a held session."""
    store, _p1, run = held
    monkeypatch.setattr(run_usage.records, "no_other_owner", lambda tx, sid, lease: None)
    before = store.runs.get(run.id)
    WRITES[name](store, run)
    assert store.runs.get(run.id) != before


@pytest.mark.parametrize("name", sorted(WRITES))
def test_control_without_the_fence_a_lost_lease_writes(held, clock, monkeypatch, name):
    store, p1, run = held
    clock.advance(601)
    store.leases.acquire("session:s", "p2", 600, purpose="recovery")  # its run is orphaned
    monkeypatch.setattr(run_usage.records, "no_other_owner", lambda tx, sid, lease: None)
    before = store.runs.get(run.id)
    WRITES[name](store, run, lease=p1)
    assert store.runs.get(run.id) != before


def test_control_without_the_terminal_check_progress_lands_on_an_ended_run(store, monkeypatch):
    run = _run(store)
    store.runs.finish(run.id, "failed")
    monkeypatch.setattr(run_usage, "TERMINAL", frozenset())
    assert store.runs.update_progress(run.id, {"phase": "late"}).progress == {"phase": "late"}
