"""``BusyError`` says what happened (issue 17, item 9).

A holder that forgets ``lease=`` on its own session was told the session is
``held by another owner … (holder='me')``. The store cannot know whether the
caller is the holder, so the message says what the call did instead: it wrote
without ``lease=`` while a live lease (of the named owner) is held. An
acquire names another owner only when it is one, and says when the holder
is the caller's own owner name on another store object or process.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import new_pg_schema
from test_group_commit import queued_together, user

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind, NewEntry
from turnkeeper.spec import errors

M = EntryKind.MESSAGE


def unleased_writes(store: turnkeeper.BaseStore) -> dict[str, tuple[str, Callable[[], Any]]]:
    """Every kind of session write, each made without ``lease=``: its session and call."""
    plan = DeliveryPlan("chat", "room", steps=(DeliveryStep("send", "message"),))
    ended = store.runs.admit("s", {"q": 1})
    store.runs.finish(ended.id, "failed", error="x")
    run = store.runs.admit("s", {"q": 2})
    return {
        "append": ("s", lambda: store.sessions.append("s", M, user("x"))),
        "append with id": (
            "s",
            lambda: store.sessions.append(
                "s", M, user("x"), entry_id="e1", expected_leaf=store.sessions.get("s").leaf_id
            ),
        ),
        "append_many": ("s", lambda: store.sessions.append_many("s", [NewEntry(M, user("x"))])),
        "set_title": ("s", lambda: store.sessions.set_title("s", "t")),
        "start_run": ("s", lambda: store.runs.start(run.id)),
        "finish_run": ("s", lambda: store.runs.finish(run.id, "failed", error="x")),
        "create_delivery_plan": ("s", lambda: store.outbox.create_plan(ended.id, plan)),
        "fork_session": ("f", lambda: store.forks.fork("f", request_id="f1")),
    }


def check_unleased(busy: errors.BusyError, session_id: str, holder: str) -> None:
    text = str(busy)
    assert busy.target == f"session:{session_id}" and busy.holder == holder
    assert "without lease=" in text and repr(holder) in text, text
    assert "another owner" not in text, text
    again = pickle.loads(pickle.dumps(busy))
    assert str(again) == text and type(again) is type(busy)


def test_a_holder_writing_without_its_lease_is_told_what_it_did(
    store: turnkeeper.BaseStore,
) -> None:
    for sid in ("s", "f"):
        store.sessions.create(sid)
    writes = unleased_writes(store)
    for sid in ("s", "f"):  # "s" has a run nobody holds: only recovery may take it
        purpose = "recovery" if store.runs.active(sid) is not None else "mutation"
        store.leases.acquire(f"session:{sid}", "me", ttl_s=600, purpose=purpose)
    for name, (sid, write) in writes.items():
        with pytest.raises(errors.BusyError) as caught:
            write()
        check_unleased(caught.value, sid, "me")
        if name == "fork_session":
            assert isinstance(caught.value, errors.ForkSessionBusyError)


def test_a_merged_append_without_its_lease_is_told_what_it_did(
    duck_store: turnkeeper.BaseStore,
) -> None:
    """The merged group's own check (DuckDB's group commit), not the single path's."""
    store = duck_store
    for sid in ("s", "u"):
        store.sessions.create(sid)
    store.leases.acquire("session:s", "me", ttl_s=600)
    got = queued_together(
        store,
        [
            lambda: store.sessions.append("u", M, user("plain")),
            lambda: store.sessions.append("s", M, user("no lease")),
            lambda: store.sessions.append("u", M, user("plain again")),
        ],
    )
    assert isinstance(got[0], turnkeeper.Entry) and isinstance(got[2], turnkeeper.Entry)
    assert int(store.statement_stats()["append"]["grouped"]) == 3
    assert isinstance(got[1], errors.BusyError)
    check_unleased(got[1], "s", "me")


def test_an_acquire_names_another_owner_only_when_it_is_one(
    store: turnkeeper.BaseStore, tmp_path: Path
) -> None:
    store.sessions.create("s")
    store.leases.acquire("session:s", "w1", ttl_s=600)
    with pytest.raises(errors.BusyError) as other:
        store.leases.acquire("session:s", "w2", ttl_s=600)
    assert other.value.holder == "w1"
    assert "another owner ('w1')" in str(other.value), str(other.value)


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_an_acquire_under_the_same_name_elsewhere_says_so(backend: str, tmp_path: Path) -> None:
    """A second store object (or process) acquiring under the holder's own owner
    name is refused (a lease belongs to the store object that took it), and
    is told so instead of "another owner"."""
    where = new_pg_schema() if backend == "postgres" else str(tmp_path / "s.duckdb")
    with turnkeeper.open_store(where) as first, turnkeeper.open_store(where) as second:
        first.sessions.create("s")
        first.leases.acquire("session:s", "me", ttl_s=600)
        with pytest.raises(errors.BusyError) as caught:
            second.leases.acquire("session:s", "me", ttl_s=600)
    text = str(caught.value)
    assert caught.value.holder == "me"
    assert "another store object or process" in text and "another owner" not in text, text
