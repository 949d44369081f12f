"""Conformance: what a second submission to a busy session gets (``runs.admit``'s
``on_active``, beyond the seed): refuse, use the existing run, or cancel it and
admit the new one; each fenced like every session write."""

from __future__ import annotations

import pytest

from turnkeeper import (
    ActiveRunPolicy,
    BusyError,
    InvalidInputError,
    InvalidTransitionError,
    LeaseLostError,
    SessionRunActiveError,
)
from turnkeeper.storage.ops import leases as lease_ops

USER = {"role": "user", "content": "first"}
AGAIN = {"role": "user", "content": "second"}


def count(store, table: str) -> int:
    return store.query(f"SELECT count(*) AS n FROM {table}").to_pylist()[0]["n"]


def rows(store) -> dict[str, int]:
    tables = ("runs", "execution_intents", "entries", "run_events", "submissions")
    return {t: count(store, t) for t in tables}


@pytest.fixture
def busy(store):
    """Session ``s`` with a running run admitted without a lease (nobody holds it)."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, start=True)
    return run


def test_refuse_is_the_default_and_writes_nothing(store, busy):
    before = rows(store)
    for kwargs in ({}, {"on_active": "refuse"}, {"on_active": ActiveRunPolicy.REFUSE}):
        with pytest.raises(SessionRunActiveError) as caught:
            store.runs.admit("s", {"q": 2}, user_message=AGAIN, **kwargs)
        assert caught.value.run_id == busy.id
    assert rows(store) == before


def test_use_existing_returns_the_active_run_and_writes_nothing(store, busy):
    before = rows(store)
    got = store.runs.admit("s", {"q": 2}, user_message=AGAIN, on_active="use_existing")
    assert got == store.runs.get(busy.id)
    assert rows(store) == before
    assert store.runs.active("s").id == busy.id


def test_use_existing_with_a_key_makes_the_key_name_that_run(store, busy):
    got = store.runs.admit(
        "s", {"q": 2}, user_message=AGAIN, submission_key="k", on_active="use_existing"
    )
    assert got.id == busy.id and count(store, "submissions") == 1
    store.runs.finish(busy.id, "succeeded")
    again = store.runs.admit(
        "s", {"q": 2}, user_message=AGAIN, submission_key="k", on_active="use_existing"
    )
    assert again.id == busy.id and again.status == "succeeded"  # the key's run, as stored


def test_use_existing_on_an_idle_session_admits(store):
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, on_active="use_existing")
    assert run.status == "admitted" and store.runs.active("s").id == run.id


def test_cancel_existing_ends_the_active_run_and_admits_the_new_one(store, busy):
    new = store.runs.admit("s", {"q": 2}, user_message=AGAIN, on_active="cancel_existing")
    old = store.runs.get(busy.id)
    assert (old.status, old.cancel_requested) == ("cancelled", True)
    assert new.id != busy.id and store.runs.active("s").id == new.id
    ended = [e for e in store.runs.events("s") if e.run_id == busy.id][-1]
    assert (ended.edge, ended.dest, ended.data["stopReason"]) == (
        "cancel_running",
        "cancelled",
        "replaced",
    )
    kinds = [(e.kind, e.id) for e in store.sessions.entries("s")]
    assert kinds.index(("turn_end", f"{busy.id}:turn-end")) < kinds.index(
        ("turn_start", f"{new.id}:turn-start")
    )
    replay = [m["content"] for m in store.sessions.replay("s").messages]
    assert replay == ["first", "second"]


def test_cancel_existing_by_the_holder_replaces_its_own_run(store):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 60, purpose="execution")
    first = store.runs.admit("s", {"q": 1}, lease=lease, start=True)
    second = store.runs.admit("s", {"q": 2}, lease=lease, on_active="cancel_existing")
    assert store.runs.get(first.id).status == "cancelled"
    store.leases.validate(lease, run_id=second.id)
    with pytest.raises(InvalidTransitionError):  # the replaced run's executor learns it
        store.runs.finish(first.id, "succeeded", lease=lease)


@pytest.mark.parametrize("choice", ["use_existing", "cancel_existing"])
def test_every_choice_is_fenced_while_another_worker_holds_the_session(store, choice):
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "w", 60, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=worker, start=True)
    before = rows(store)
    with pytest.raises(BusyError):
        store.runs.admit("s", {"q": 2}, user_message=AGAIN, on_active=choice)
    store.leases.release(worker)
    taker = store.leases.acquire("session:s", "t", 60, purpose="recovery")
    with pytest.raises(LeaseLostError):  # the worker's lease is stale now
        store.runs.admit("s", {"q": 2}, user_message=AGAIN, lease=worker, on_active=choice)
    assert rows(store) == before
    assert (
        store.runs.get(run.id).status == "running" and not store.runs.get(run.id).cancel_requested
    )
    store.leases.release(taker)


def test_the_fence_check_fails_with_it_patched_out(store, monkeypatch):
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "w", 60, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, lease=worker, start=True)
    monkeypatch.setattr(lease_ops, "fence_or_unheld", lambda tx, target, lease: None)
    store.runs.admit("s", {"q": 2}, on_active="cancel_existing")  # accepted: a defect
    assert store.runs.get(run.id).status == "cancelled"


def test_the_fence_of_a_leased_admission_fails_with_it_patched_out(store, clock, monkeypatch):
    """Control for the stale worker's refused admission above: the one
    statement that reads the session and fences the lease (``fenced_read``)
    refuses it through ``leases.fenced``; patched out, the stale admission
    is stored."""
    store.sessions.create("s")
    worker = store.leases.acquire("session:s", "w", 5, purpose="execution")
    clock.advance(6)
    store.leases.acquire("session:s", "t", 60, purpose="execution")
    with pytest.raises(LeaseLostError):
        store.runs.admit("s", {"q": 1}, lease=worker)
    monkeypatch.setattr(lease_ops, "fenced", lambda tx, lease, part: None)
    run = store.runs.admit("s", {"q": 1}, lease=worker)  # accepted: a defect
    assert store.runs.get(run.id).status == "admitted"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"on_active": "replace"}, "on_active"),
        ({"on_active": 3}, "on_active"),
        ({"on_active": "cancel_existing", "retry_of": "r"}, "on_active"),
    ],
)
def test_a_bad_choice_is_refused_before_writing(store, busy, kwargs, field):
    before = rows(store)
    with pytest.raises(InvalidInputError) as caught:
        store.runs.admit("s", {"q": 2}, **kwargs)
    assert caught.value.field == field
    assert rows(store) == before
