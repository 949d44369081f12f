"""Channel bindings and channel tools (``store.bindings``: session seed BindSession,
UnbindSession, TransferBinding, FindBinding, FindBindingBySessionID, ListBindings,
CreateBound, RotateBoundSession, InitWithBinding / InitWithIDAndBinding,
SetChannelTools, ListChannelTools, GetChannelToolGeneration), on both backends.

The seed's ``IdentityLocks`` is an in-process lock; here the database holds the
invariant (a channel has at most one session, a session at most one channel, and
a move never loses a binding) for writers racing in any number of threads,
connections or processes: ``test_writers_racing_on_one_channel_*``. Each guard
has a kill test: the guard patched out (in the test only), its check fails; the
typed checks' kills also show that the database's keys still hold without them.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

import pytest
from conftest import forge

from turnkeeper import (
    Binding,
    BindingNotFoundError,
    BusyError,
    ChannelBoundError,
    ChannelToolConfig,
    InvalidInputError,
    LeaseLostError,
    SessionBoundError,
    SessionIDExistsError,
    SessionMetadata,
    SessionNotFoundError,
    TransactionConflictError,
)
from turnkeeper.formats.pi import export_lines
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.ops import bindings

MSG = {"message": {"role": "user", "content": "hi"}}


def raised(kind: type[BaseException], call: Any) -> Any:
    try:
        got = call()
    except kind as exc:
        return exc
    raise AssertionError(f"expected {kind.__name__}, the call was accepted: {got!r}")


def rows(store: Any, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = store.query(sql, params).to_pylist()
    return out


def state(store: Any) -> list[tuple[str, str, str]]:
    """Every binding as ``(session, type, id)``, checked against the sessions' rows:
    each session's row repeats exactly its binding (``Session.channel_type`` …)."""
    table = sorted(
        (r["session_id"], r["channel_type"], r["channel_id"])
        for r in rows(store, "SELECT * FROM channel_bindings")
    )
    mirrored = sorted(
        (r["id"], r["channel_type"], r["channel_id"])
        for r in rows(
            store,
            "SELECT id, channel_type, channel_id FROM sessions "
            "WHERE channel_type IS NOT NULL OR channel_id IS NOT NULL",
        )
    )
    assert table == mirrored, (table, mirrored)
    return table


def audit_clean(store: Any) -> None:
    bad = [(c.name, c.detail) for c in run_audit(store) if not c.passed]
    assert bad == [], bad


# -- bind, find, list, unbind ------------------------------------------------------


def test_bind_find_list_unbind(store):
    for sid in ("a", "b", "c"):
        store.sessions.create(sid, cwd="/w")
    store.sessions.append("a", "message", MSG)
    got = store.bindings.bind("a", "telegram", "42")
    assert got == Binding("a", "telegram", "42")
    assert store.bindings.bind("a", "telegram", "42") == got  # again: nothing changes
    store.bindings.bind("b", "slack", "C1")
    store.bindings.bind("c", "telegram", "7")
    assert store.bindings.find("telegram", "42") == got
    assert store.bindings.find("telegram", "C1") is None  # the type is part of the identity
    assert store.bindings.find_by_session("b") == Binding("b", "slack", "C1")
    assert store.bindings.list() == [
        Binding("b", "slack", "C1"),
        Binding("a", "telegram", "42"),
        Binding("c", "telegram", "7"),
    ]
    assert [b.session_id for b in store.bindings.list(channel_type="telegram")] == ["a", "c"]
    a = store.sessions.get("a")
    assert (a.channel_type, a.channel_id) == ("telegram", "42")
    header = store.sessions.header("a")
    assert (header["channelType"], header["channelId"]) == ("telegram", "42")
    listed = {s.id: s for s in store.sessions.list().sessions}
    assert (listed["b"].channel_type, listed["b"].channel_id) == ("slack", "C1")

    assert store.bindings.unbind("a") == got
    assert store.bindings.unbind("a") is None  # local already
    assert store.bindings.find("telegram", "42") is None
    assert store.bindings.find_by_session("a") is None
    a = store.sessions.get("a")
    assert (a.channel_type, a.channel_id) == (None, None)
    assert "channelType" not in store.sessions.header("a")
    assert [m["content"] for m in store.sessions.replay("a").messages] == ["hi"]  # history kept
    store.bindings.bind("c", "telegram", "7")  # idempotent for another session too
    store.bindings.unbind("b")
    store.bindings.bind("b", "telegram", "42")  # the channel is free for another session
    assert state(store) == [("b", "telegram", "42"), ("c", "telegram", "7")]
    audit_clean(store)


def test_refusals_name_what_failed_and_write_nothing(store):
    for missing in (
        lambda: store.bindings.bind("nope", "t", "1"),
        lambda: store.bindings.unbind("nope"),
        lambda: store.bindings.find_by_session("nope"),
        lambda: store.bindings.set_tools("nope", []),
        lambda: store.bindings.tools("nope"),
        lambda: store.bindings.tool_generation("nope"),
    ):
        assert raised(SessionNotFoundError, missing).session_id == "nope"
    store.sessions.create("a")
    store.sessions.create("b")
    store.bindings.bind("a", "t", "1")
    err = raised(ChannelBoundError, lambda: store.bindings.bind("b", "t", "1"))
    assert (err.channel_type, err.channel_id, err.session_id) == ("t", "1", "a")
    err = raised(SessionBoundError, lambda: store.bindings.bind("a", "t", "2"))
    assert (err.session_id, err.channel_type, err.channel_id) == ("a", "t", "1")
    for bad in ("", " ", "a\nb", 3, None):
        with pytest.raises(InvalidInputError):
            store.bindings.bind("b", bad, "9")
        with pytest.raises(InvalidInputError):
            store.bindings.bind("b", "t", bad)
        with pytest.raises(InvalidInputError):
            store.bindings.find("t", bad)
    assert state(store) == [("a", "t", "1")]


def test_listings_filter_by_channel_and_project(store):
    for sid in ("a", "b", "c"):
        store.sessions.create(sid)
    store.bindings.bind("a", "telegram", "42")
    store.bindings.bind("b", "slack", "42")
    store.projects.create("P", project_id="p")
    store.sessions.set_metadata("b", SessionMetadata(project_id="p"))
    store.sessions.set_metadata("c", SessionMetadata(project_id="p"))

    def ids(**kw: Any) -> list[str]:
        found = sorted(s.id for s in store.sessions.list(**kw).sessions)
        assert store.sessions.count(**kw) == len(found)
        detailed = store.sessions.list_detailed(**kw).details
        assert sorted(d.session.id for d in detailed) == found
        return found

    assert ids(channel_type="telegram") == ["a"]
    assert ids(channel_id="42") == ["a", "b"]
    assert ids(channel_type="slack", channel_id="42") == ["b"]
    assert ids(project_id="p") == ["b", "c"]
    assert ids(project_id="p", channel_id="42") == ["b"]
    assert ids(search="teleg") == ["a"]  # WithSearch: "channel metadata"
    assert ids(project_id="nope") == []
    with pytest.raises(InvalidInputError):
        store.sessions.list(channel_type="")


def test_the_header_and_the_export_carry_the_binding(store):
    store.sessions.create("a", header={"channelType": "old", "channelId": "x", "note": 1})
    header = store.sessions.header("a")  # local: the stored header's, as a file had them
    assert (header["channelType"], header["channelId"], header["note"]) == ("old", "x", 1)
    store.bindings.bind("a", "telegram", "42")
    header = store.sessions.header("a")
    assert (header["channelType"], header["channelId"], header["note"]) == ("telegram", "42", 1)
    exported = json.loads(next(iter(export_lines(store, "a"))))
    assert (exported["channelType"], exported["channelId"]) == ("telegram", "42")
    store.sessions.create("b")
    exported = json.loads(next(iter(export_lines(store, "b"))))
    assert "channelType" not in exported


def test_a_fork_of_a_bound_session_is_local(store):
    store.bindings.create_bound("t", "1", session_id="src")
    run = store.runs.admit("src", {"q": 1}, user_message={"role": "user", "content": "q"})
    store.runs.start(run.id)
    store.runs.finish(run.id, "succeeded", assistant_message={"role": "assistant", "content": "a"})
    fork = store.forks.fork("src", request_id="f1")
    copy = store.sessions.get(fork.fork_session_id)
    assert (copy.channel_type, copy.channel_id) == (None, None)
    assert "channelType" not in store.sessions.header(copy.id)
    assert state(store) == [("src", "t", "1")]


# -- transfer ----------------------------------------------------------------------


def test_transfer_moves_the_binding_in_one_step(store):
    for sid in ("a", "b", "c", "d"):
        store.sessions.create(sid)
    store.bindings.bind("a", "t", "1")
    assert store.bindings.transfer("t", "1", "a", "b") == Binding("b", "t", "1")
    assert state(store) == [("b", "t", "1")]
    # a retry after an unknown commit finds it done
    assert store.bindings.transfer("t", "1", "a", "b") == Binding("b", "t", "1")
    # a compare-and-set: the binding is b's now, not a's
    err = raised(BindingNotFoundError, lambda: store.bindings.transfer("t", "1", "a", "c"))
    assert (err.channel_type, err.channel_id, err.session_id, err.bound_session_id) == (
        "t",
        "1",
        "a",
        "b",
    )
    err = raised(BindingNotFoundError, lambda: store.bindings.transfer("t", "2", "a", "c"))
    assert err.bound_session_id is None  # bound to nobody
    store.bindings.bind("d", "t", "4")
    err = raised(SessionBoundError, lambda: store.bindings.transfer("t", "1", "b", "d"))
    assert (err.session_id, err.channel_id) == ("d", "4")
    err = raised(SessionNotFoundError, lambda: store.bindings.transfer("t", "1", "b", "zz"))
    assert err.session_id == "zz"
    assert state(store) == [("b", "t", "1"), ("d", "t", "4")]
    audit_clean(store)


# -- create bound, rotate ----------------------------------------------------------


def test_create_bound_is_one_step(store):
    made = store.bindings.create_bound("t", "1", cwd="/w", header={"note": "x"})
    assert (made.channel_type, made.channel_id, made.cwd) == ("t", "1", "/w")
    assert store.sessions.get(made.id) == made
    assert store.bindings.find("t", "1") == Binding(made.id, "t", "1")
    store.sessions.append(made.id, "message", MSG)  # an ordinary session
    # InitWithIDAndBinding: the caller's id
    mine = store.bindings.create_bound("t", "2", session_id="mine")
    assert mine.id == "mine" and store.bindings.find_by_session("mine") == Binding("mine", "t", "2")
    err = raised(ChannelBoundError, lambda: store.bindings.create_bound("t", "1", session_id="x"))
    assert err.session_id == made.id
    assert store.sessions.get("x") is None
    with pytest.raises(SessionIDExistsError):
        store.bindings.create_bound("t", "3", session_id="mine")
    with pytest.raises(SessionIDExistsError):  # also for its own channel
        store.bindings.create_bound("t", "2", session_id="mine")
    assert store.bindings.find("t", "3") is None
    assert state(store) == sorted([(made.id, "t", "1"), ("mine", "t", "2")])


def test_rotate_replaces_the_bound_session_atomically(store):
    old = store.bindings.create_bound("t", "1", session_id="old", cwd="/w")
    store.sessions.append("old", "message", MSG)
    new = store.bindings.rotate("t", "1", "old")
    assert new.id != "old" and (new.cwd, new.channel_type, new.channel_id) == ("/w", "t", "1")
    assert new.entry_count == 0 and store.sessions.get(new.id) == new
    assert store.sessions.get("old").channel_id is None
    assert [m["content"] for m in store.sessions.replay("old").messages] == ["hi"]
    assert state(store) == [(new.id, "t", "1")]
    # a retry after an unknown commit: the channel is the new session's already
    err = raised(BindingNotFoundError, lambda: store.bindings.rotate("t", "1", "old"))
    assert (err.session_id, err.bound_session_id) == ("old", new.id)
    third = store.bindings.rotate("t", "1", new.id, session_id="third", cwd="/x")
    assert (third.id, third.cwd) == ("third", "/x")
    with pytest.raises(SessionIDExistsError):
        store.bindings.rotate("t", "1", "third", session_id=old.id)
    with pytest.raises(SessionNotFoundError):
        store.bindings.rotate("t", "1", "nope")
    assert state(store) == [("third", "t", "1")]
    audit_clean(store)


# -- channel tools -----------------------------------------------------------------


def test_channel_tools_are_replaced_whole_and_counted(store):
    store.sessions.create("a")
    assert (store.bindings.tools("a"), store.bindings.tool_generation("a")) == ([], 0)
    tools = [ChannelToolConfig("web", True), ChannelToolConfig("bash", False)]
    assert store.bindings.set_tools("a", tools) == 1
    assert store.bindings.tools("a") == tools  # in the order given
    assert store.bindings.set_tools("a", [ChannelToolConfig("web", False)]) == 2
    assert store.bindings.tools("a") == [ChannelToolConfig("web", False)]
    assert store.bindings.set_tools("a", []) == 3
    assert (store.bindings.tools("a"), store.bindings.tool_generation("a")) == ([], 3)
    for bad in (
        [ChannelToolConfig("web", True), ChannelToolConfig("web", False)],
        [ChannelToolConfig("web", 1)],
        [ChannelToolConfig("", True)],
        [("web", True)],
        ChannelToolConfig("web", True),
        "web",
    ):
        with pytest.raises(InvalidInputError):
            store.bindings.set_tools("a", bad)
    assert store.bindings.tool_generation("a") == 3
    store.bindings.bind("a", "t", "1")
    store.bindings.unbind("a")  # the selection is the session's: it stays
    assert store.bindings.tool_generation("a") == 3


# -- the session-write rule --------------------------------------------------------


def check_binding_writes_busy(store: Any) -> None:
    """Every binding write to a session someone holds is refused without its lease
    (either session of a transfer), goes through under it, and a stale lease
    writes nothing."""
    for sid in ("h", "free", "other"):
        store.sessions.create(sid)
    store.bindings.bind("h", "t", "1")
    store.bindings.bind("free", "t", "9")
    lease = store.leases.acquire("session:h", "w", 30)
    before = state(store)
    for write in (
        lambda: store.bindings.unbind("h"),
        lambda: store.bindings.bind("h", "t", "1"),
        lambda: store.bindings.transfer("t", "1", "h", "other"),
        lambda: store.bindings.transfer("t", "9", "free", "h"),
        lambda: store.bindings.rotate("t", "1", "h"),
        lambda: store.bindings.set_tools("h", []),
    ):
        assert raised(BusyError, write).holder == "w"
    assert state(store) == before and store.bindings.tool_generation("h") == 0
    assert store.bindings.transfer("t", "1", "h", "other", leases=[lease]).session_id == "other"
    assert store.bindings.transfer("t", "1", "other", "h", leases=[lease]).session_id == "h"
    assert store.bindings.set_tools("h", [], lease=lease) == 1
    assert store.bindings.unbind("h", lease=lease) == Binding("h", "t", "1")
    rotated = store.bindings.rotate("t", "9", "free", lease=None)  # free: nobody holds it
    store.bindings.bind("h", "t", "1", lease=lease)
    assert store.bindings.rotate("t", "1", "h", lease=lease).channel_id == "1"
    stale = store.leases.acquire("session:other", "w2", 30)
    store.leases.release(stale)
    with pytest.raises(LeaseLostError):
        store.bindings.bind("other", "t", "2", lease=stale)
    with pytest.raises(LeaseLostError):  # either session's lease is fenced
        store.bindings.transfer("t", "9", rotated.id, "other", leases=[stale])
    assert store.bindings.find("t", "2") is None
    assert store.bindings.find("t", "9") == Binding(rotated.id, "t", "9")
    refused = rows(
        store,
        "SELECT operation FROM fence_events WHERE target = 'session:other' ORDER BY operation",
    )
    assert [r["operation"] for r in refused] == ["bind_session", "transfer_binding"]


def test_binding_writes_obey_the_session_write_rule(store):
    check_binding_writes_busy(store)


def test_a_wrong_lease_is_refused(store):
    store.sessions.create("a")
    store.sessions.create("b")
    lease = store.leases.acquire("session:b", "w", 30)
    with pytest.raises(InvalidInputError):
        store.bindings.bind("a", "t", "1", lease=lease)
    with pytest.raises(InvalidInputError):
        store.bindings.transfer("t", "1", "a", "b", leases=[object()])
    assert state(store) == []


def test_kill_the_binding_lease_guard(store, monkeypatch):
    monkeypatch.setattr(bindings.leases, "fence_or_unheld", lambda tx, target, lease: None)
    with pytest.raises(AssertionError):
        check_binding_writes_busy(store)


# -- the typed checks, and the keys beneath them -----------------------------------


def check_channel_taken(store: Any) -> None:
    store.sessions.create("a")
    store.sessions.create("b")
    store.bindings.bind("a", "t", "1")
    raised(ChannelBoundError, lambda: store.bindings.bind("b", "t", "1"))


def check_session_taken(store: Any) -> None:
    store.sessions.create("c")
    store.bindings.bind("c", "t", "3")
    raised(SessionBoundError, lambda: store.bindings.bind("c", "t", "4"))


def prepare_transfer(store: Any) -> None:
    for sid in ("d", "e", "f"):
        store.sessions.create(sid)
    store.bindings.bind("d", "t", "5")


def check_transfer_compares(store: Any) -> None:
    raised(BindingNotFoundError, lambda: store.bindings.transfer("t", "5", "e", "f"))


def prepare_rotate(store: Any) -> None:
    store.sessions.create("g")
    store.sessions.create("h2")
    store.bindings.bind("g", "t", "6")


def check_rotate_compares(store: Any) -> None:
    raised(BindingNotFoundError, lambda: store.bindings.rotate("t", "6", "h2"))


def test_the_typed_checks_hold(store):
    check_channel_taken(store)
    check_session_taken(store)
    prepare_transfer(store)
    check_transfer_compares(store)
    prepare_rotate(store)
    check_rotate_compares(store)


def test_kill_the_channel_check(store, monkeypatch):
    real = bindings.bound_to
    monkeypatch.setattr(bindings, "bound_to", lambda tx, channel: None)
    # the typed error is gone; the channel's key still refuses a second session
    with pytest.raises(TransactionConflictError):
        check_channel_taken(store)
    monkeypatch.setattr(bindings, "bound_to", real)
    assert state(store) == [("a", "t", "1")]


def test_kill_the_session_check(store, monkeypatch):
    monkeypatch.setattr(bindings, "binding_of", lambda tx, session_id: None)
    with pytest.raises(TransactionConflictError):  # the session's unique key still refuses
        check_session_taken(store)
    assert state(store) == [("c", "t", "3")]


def test_kill_the_transfer_compare(store, monkeypatch):
    prepare_transfer(store)
    monkeypatch.setattr(bindings, "bound_to", lambda tx, channel: "e")
    with pytest.raises(TransactionConflictError):  # d's row still holds the channel's key
        check_transfer_compares(store)
    monkeypatch.undo()
    assert state(store) == [("d", "t", "5")]


def test_kill_the_rotate_compare(store, monkeypatch):
    prepare_rotate(store)
    monkeypatch.setattr(bindings, "bound_to", lambda tx, channel: "h2")
    with pytest.raises(TransactionConflictError):  # g's row still holds the channel's key
        check_rotate_compares(store)
    monkeypatch.undo()
    assert state(store) == [("g", "t", "6")]
    assert {s.id for s in store.sessions.list().sessions} == {"g", "h2"}  # no new session


# -- IdentityLocks: writers racing on one channel ----------------------------------

WRITERS = 4
ROUNDS = 12


def race(store: Any, act: Any) -> list[BaseException]:
    """Run ``act(i)`` in :data:`WRITERS` threads started together; their errors."""
    barrier = threading.Barrier(WRITERS)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            act(i)
        except BaseException as exc:  # collected: the test judges them
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "a writer hung"
    return errors


def test_writers_racing_on_one_channel_never_share_or_lose_it(store):
    """Each writer binds, transfers and rotates the one channel to sessions of its
    own, all at once; a watcher reads every binding meanwhile. At every read and at
    the end exactly one session holds the channel, every refusal is the typed error
    of a lost race, and each session's row agrees with the bindings."""
    for i in range(WRITERS):
        store.sessions.create(f"w{i}")
    won: list[Binding] = []

    def bind(i: int) -> None:
        with contextlib.suppress(ChannelBoundError):
            won.append(store.bindings.bind(f"w{i}", "chat", "room"))

    assert race(store, bind) == []
    assert len(won) == 1 and state(store) == [(won[0].session_id, "chat", "room")]

    done = threading.Event()
    seen: list[int] = []

    def watch() -> None:
        while not done.is_set():
            found = [b for b in store.bindings.list() if b.channel_id == "room"]
            seen.append(len(found))

    watcher = threading.Thread(target=watch)
    watcher.start()

    def move(i: int) -> None:
        mine = f"w{i}"
        for n in range(ROUNDS):
            holder = store.bindings.find("chat", "room")
            assert holder is not None, "the channel lost its session"
            if holder.session_id == mine:
                continue
            try:
                if n % 3 == 2:
                    made = store.bindings.rotate(
                        "chat", "room", holder.session_id, session_id=f"w{i}-{n}"
                    )
                    store.bindings.transfer("chat", "room", made.id, mine)
                else:
                    store.bindings.transfer("chat", "room", holder.session_id, mine)
            except BindingNotFoundError:
                pass  # another writer moved it first: a lost race, nothing written

    try:
        errors = race(store, move)
    finally:
        done.set()
        watcher.join(timeout=60)
    assert errors == []
    assert seen and set(seen) == {1}, sorted(set(seen))
    final = state(store)
    assert len(final) == 1 and final[0][1:] == ("chat", "room")
    audit_clean(store)


# -- the audit judges the sessions' rows against the bindings ----------------------


def failing(store: Any) -> dict[str, str]:
    return {c.name: c.detail for c in run_audit(store) if not c.passed}


def test_the_audit_flags_a_session_row_that_disagrees(store):
    store.sessions.create("a")
    store.sessions.create("b")
    store.bindings.bind("a", "t", "1")
    assert failing(store) == {}
    forge(store, "UPDATE sessions SET channel_id = '2' WHERE id = 'a'", rows=1)
    forge(store, "UPDATE sessions SET channel_type = 't', channel_id = '9' WHERE id = 'b'", rows=1)
    assert failing(store) == {"bindings_agree": "a, b"}
    assert [c.checked for c in run_audit(store, ["b"]) if c.name == "bindings_agree"] == [1]


def test_kill_the_session_row_s_copy(store, monkeypatch):
    monkeypatch.setattr(bindings, "_mirror", lambda tx, session_id, channel: None)
    store.sessions.create("a")
    store.bindings.bind("a", "t", "1")
    with pytest.raises(AssertionError):
        state(store)
    assert set(failing(store)) == {"bindings_agree"}
