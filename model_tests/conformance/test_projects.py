"""Projects (session seed CreateProject, ListProjects, RenameProject,
DeleteProject) and session metadata (Get/SetSessionMetadata), on both backends.

Each guard has a kill test: the guard patched out (in the test only), the
same check fails.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from turnkeeper import (
    BusyError,
    InvalidInputError,
    LeaseLostError,
    Project,
    ProjectExistsError,
    ProjectNotFoundError,
    SessionMetadata,
    SessionNotFoundError,
    SessionRunActiveError,
)
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.ops import deletes, metadata

USER = {"role": "user", "content": "go"}


def raised(kind: type[BaseException], call: Any) -> Any:
    try:
        got = call()
    except kind as exc:
        return exc
    raise AssertionError(f"expected {kind.__name__}, the call was accepted: {got!r}")


def audit_clean(store: Any) -> None:
    bad = [(c.name, c.detail) for c in run_audit(store) if not c.passed]
    assert bad == [], bad


def in_project(store: Any, pid: str, *sids: str) -> None:
    for sid in sids:
        store.sessions.create(sid)
        store.sessions.append(sid, "message", {"message": USER})
        store.sessions.set_metadata(sid, SessionMetadata(project_id=pid))


# -- projects ----------------------------------------------------------------------


def test_create_list_rename_get(store, clock):
    assert store.projects.list() == []
    a = store.projects.create("Alpha")
    assert isinstance(a, Project) and a.name == "Alpha" and a.created_at == a.updated_at
    clock.advance(1)
    b = store.projects.create("Beta", project_id="b")
    assert b.id == "b"
    assert [p.id for p in store.projects.list()] == [a.id, "b"]
    clock.advance(1)
    renamed = store.projects.rename("b", "Beta 2")
    assert (renamed.name, renamed.created_at) == ("Beta 2", b.created_at)
    assert renamed.updated_at > b.updated_at
    assert store.projects.get("b") == renamed
    assert store.projects.get("nope") is None
    same_name = store.projects.create("Alpha")  # names need not be unique
    assert same_name.id != a.id


def test_project_refusals(store):
    store.projects.create("A", project_id="a")
    assert (
        raised(ProjectExistsError, lambda: store.projects.create("B", project_id="a")).project_id
        == "a"
    )
    assert store.projects.get("a").name == "A"
    for bad in ("", "   ", 3, None):
        with pytest.raises(InvalidInputError):
            store.projects.create(bad)
        with pytest.raises(InvalidInputError):
            store.projects.rename("a", bad)
    assert raised(ProjectNotFoundError, lambda: store.projects.rename("x", "n")).project_id == "x"
    assert raised(ProjectNotFoundError, lambda: store.projects.delete("x")).project_id == "x"
    assert [p.name for p in store.projects.list()] == ["A"]


# -- session metadata --------------------------------------------------------------


def test_metadata_defaults_set_and_move_out(store):
    store.sessions.create("s")
    assert store.sessions.get_metadata("s") == SessionMetadata(project_id=None, pinned=False)
    store.projects.create("P", project_id="p")
    got = store.sessions.set_metadata("s", SessionMetadata(project_id="p", pinned=True))
    assert got == SessionMetadata("p", True) == store.sessions.get_metadata("s")
    store.sessions.set_metadata("s", SessionMetadata(pinned=True))
    assert store.sessions.get_metadata("s") == SessionMetadata(None, True)
    audit_clean(store)


def test_metadata_refusals_write_nothing(store):
    with pytest.raises(SessionNotFoundError):
        store.sessions.get_metadata("nope")
    with pytest.raises(SessionNotFoundError):
        store.sessions.set_metadata("nope", SessionMetadata())
    store.sessions.create("s")
    err = raised(
        ProjectNotFoundError, lambda: store.sessions.set_metadata("s", SessionMetadata("x"))
    )
    assert err.project_id == "x"
    for bad in ("p", SessionMetadata(pinned=1), SessionMetadata(project_id="")):
        with pytest.raises(InvalidInputError):
            store.sessions.set_metadata("s", bad)
    assert store.sessions.get_metadata("s") == SessionMetadata()


def test_metadata_is_a_session_write(store, clock):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 5)
    err = raised(BusyError, lambda: store.sessions.set_metadata("s", SessionMetadata(pinned=True)))
    assert err.target == "session:s"
    assert store.sessions.get_metadata("s").pinned is False
    store.sessions.set_metadata("s", SessionMetadata(pinned=True), lease=lease)
    assert store.sessions.get_metadata("s").pinned is True
    clock.advance(6)
    store.leases.acquire("session:s", "v", 5)
    with pytest.raises(LeaseLostError):
        store.sessions.set_metadata("s", SessionMetadata(), lease=lease)
    assert store.sessions.get_metadata("s").pinned is True
    store.sessions.create("t")
    with pytest.raises(InvalidInputError):
        store.sessions.set_metadata("t", SessionMetadata(), lease=lease)


# -- deleting a project --------------------------------------------------------------


def test_deleting_a_project_deletes_its_sessions_and_nothing_else(store):
    store.projects.create("P", project_id="p")
    store.projects.create("Q", project_id="q")
    in_project(store, "p", "p1", "p2")
    in_project(store, "q", "q1")
    store.sessions.create("loose")
    gone = store.projects.delete("p")
    assert sorted(g.session_id for g in gone) == ["p1", "p2"]
    assert {g.reason for g in gone} == {"project"} and all(g.entries == 1 for g in gone)
    assert store.projects.get("p") is None and [p.id for p in store.projects.list()] == ["q"]
    assert store.sessions.get("p1") is None and store.sessions.deleted("p2") is not None
    assert store.sessions.get("q1") is not None and store.sessions.get("loose") is not None
    assert store.sessions.get_metadata("q1") == SessionMetadata("q")
    assert store.projects.delete("q")[0].session_id == "q1"
    assert store.projects.delete(store.projects.create("empty").id) == []
    audit_clean(store)


def test_a_project_delete_is_refused_whole(store):
    store.projects.create("P", project_id="p")
    in_project(store, "p", "a", "b", "c")
    lease = store.leases.acquire("session:b", "w", 30)
    assert raised(BusyError, lambda: store.projects.delete("p")).target == "session:b"
    run = store.runs.admit("c", {"q": 1})
    err = raised(SessionRunActiveError, lambda: store.projects.delete("p", leases=[lease]))
    assert (err.session_id, err.run_id) == ("c", run.id)
    assert store.projects.get("p") is not None
    assert all(store.sessions.get(s) is not None for s in "abc")
    store.runs.request_cancel(run.id)
    store.runs.finish(run.id, "cancelled")
    gone = store.projects.delete("p", leases=[lease])
    assert {g.session_id: g.lease_epoch for g in gone} == {"a": None, "b": lease.epoch, "c": None}
    audit_clean(store)


def test_a_project_delete_refused_by_a_lost_lease_is_recorded(store, clock):
    """A session's lease given to the delete, lost (expired and taken over),
    refuses the delete whole, and the refusal is a fence event of that lease,
    as every fenced write's is."""
    store.projects.create("P", project_id="p")
    in_project(store, "p", "a", "b")
    lease = store.leases.acquire("session:b", "w", 30)
    clock.advance(31)
    store.leases.acquire("session:b", "v", 30)
    with pytest.raises(LeaseLostError):
        store.projects.delete("p", leases=[lease])
    assert store.projects.get("p") is not None and store.sessions.get("a") is not None
    events = store.query("SELECT target, owner, epoch, operation FROM fence_events").to_pylist()
    assert events == [
        {"target": "session:b", "owner": "w", "epoch": lease.epoch, "operation": "delete_project"}
    ]


def test_project_delete_refuses_a_lease_on_no_session(store):
    store.projects.create("P", project_id="p")
    other = store.leases.acquire("retention:x", "w", 30)
    with pytest.raises(InvalidInputError):
        store.projects.delete("p", leases=[other])
    assert store.projects.get("p") is not None


def test_assigning_a_session_races_the_project_delete(real_store):
    """A session moved into a project while the project is deleted: either the
    move lands first and the session goes with the project, or the delete lands
    first and the move is refused (ProjectNotFoundError); never a session left
    naming a deleted project."""
    store = real_store
    for round_ in range(6):
        pid, sid = f"p{round_}", f"s{round_}"
        store.projects.create("P", project_id=pid)
        store.sessions.create(sid)
        barrier, out = threading.Barrier(2), {}

        def move(pid: str = pid, sid: str = sid, barrier: Any = barrier, out: Any = out) -> None:
            barrier.wait()
            try:
                store.sessions.set_metadata(sid, SessionMetadata(pid))
                out["move"] = "ok"
            except ProjectNotFoundError:
                out["move"] = "refused"

        def drop(pid: str = pid, barrier: Any = barrier, out: Any = out) -> None:
            barrier.wait()
            out["drop"] = [g.session_id for g in store.projects.delete(pid)]

        threads = [threading.Thread(target=move), threading.Thread(target=drop)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert out["move"] in ("ok", "refused"), out
        if out["drop"] == [sid]:
            assert store.sessions.get(sid) is None
        else:
            assert out == {"move": "refused", "drop": []}
            assert store.sessions.get_metadata(sid) == SessionMetadata()
    audit_clean(store)


# -- guards, each broken in a kill test ------------------------------------------


def check_metadata_busy(store: Any) -> None:
    store.sessions.create("g")
    store.leases.acquire("session:g", "w", 30)
    raised(BusyError, lambda: store.sessions.set_metadata("g", SessionMetadata(pinned=True)))


def check_unknown_project_refused(store: Any) -> None:
    store.sessions.create("h")
    raised(ProjectNotFoundError, lambda: store.sessions.set_metadata("h", SessionMetadata("x")))


def check_project_delete_busy(store: Any) -> None:
    store.projects.create("P", project_id="pg")
    in_project(store, "pg", "i")
    store.leases.acquire("session:i", "w", 30)
    raised(BusyError, lambda: store.projects.delete("pg"))


def test_guards_hold(store):
    check_metadata_busy(store)
    check_unknown_project_refused(store)
    check_project_delete_busy(store)


def test_kill_the_metadata_lease_guard(store, monkeypatch):
    monkeypatch.setattr(metadata.leases, "fence_or_unheld", lambda tx, target, lease: None)
    with pytest.raises(AssertionError):
        check_metadata_busy(store)


def test_kill_the_project_check(store, monkeypatch):
    monkeypatch.setattr(metadata, "lock_project", lambda tx, project_id: None)
    with pytest.raises(AssertionError):
        check_unknown_project_refused(store)
    # and the audit sees the session naming a project that does not exist
    assert {c.name for c in run_audit(store) if not c.passed} == {"no_orphan_rows"}


def test_kill_the_project_delete_lease_guard(store, monkeypatch):
    monkeypatch.setattr(deletes.leases, "fence_or_unheld", lambda tx, target, lease: None)
    with pytest.raises(AssertionError):
        check_project_delete_busy(store)
