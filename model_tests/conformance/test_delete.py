"""Deleting a session (session seed DeleteSession), on both backends: what goes,
what stays, the refusals (``BusyError``, ``SessionRunActiveError``), forks
surviving their source, ids never reused, and the audit clean afterwards.

Each guard has a kill test: the guard patched out (in the test only), the
same check fails.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from turnkeeper import (
    Binding,
    BusyError,
    CapabilityEvent,
    ChannelToolConfig,
    DeletedSession,
    DeliveryPlan,
    DeliveryStep,
    EntryKind,
    GCDeleteError,
    Guidance,
    InputResourceEvent,
    InvalidInputError,
    LeaseLostError,
    OperationalError,
    ResponseItem,
    ResponseRun,
    ResponseState,
    ResponseTurn,
    SessionCapabilities,
    SessionIDExistsError,
    SessionNotFoundError,
    SessionRunActiveError,
)
from turnkeeper.spec.records import ImportBatch, ImportedSource, OpaqueRecord, SessionMetadata
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.audit.orphans import OWNED
from turnkeeper.storage.ops import deletes
from turnkeeper.storage.ops.ledger.blobs import blob_prefix
from turnkeeper.storage.ops.ledger.sealing import seal_blob
from turnkeeper.storage.ops.replay_snapshots import PERSIST_ROWS

USER = {"role": "user", "content": "my secret question"}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "my secret answer"}]}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rows(store: Any, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = store.query(sql, params).to_pylist()
    return out


def populate(store: Any, sid: str) -> dict[str, Any]:
    """A session with a row in every table a session has rows in: an import's
    opaque line and what it read, a finished run (submission, turn, events, tool record, delivery
    plan), an orphan run recovered, response lineage and archives, metadata, a label,
    capability state and an event, guidance, a resource event, a usage record, a
    channel binding and tool selection, a stored replay snapshot, a fork."""
    store.sessions.import_batch(
        ImportBatch(
            session_id=sid,
            cwd=f"/home/alice/{sid}",
            created_at=T0,
            header={"note": "private header"},
            entries=[],
            leaf_id=None,
            opaque=[OpaqueRecord(f"{sid}.jsonl", 1, "{not json: secret}", "unparseable")],
            source=f"{sid}.jsonl",
            read=ImportedSource(f"/home/alice/{sid}.jsonl", 40, "0" * 64, 0),
        )
    )
    run = store.runs.admit(sid, {"q": "secret"}, user_message=USER, submission_key=f"k-{sid}")
    store.runs.start(run.id)
    store.tools.claim(
        f"{sid}-exec",
        sid,
        local_turn_id=run.turn_id,
        provider_call_id="call-1",
        tool_name="bash",
        side_effecting=True,
        arguments={"cmd": "cat secret"},
        run_id=run.id,
    )
    store.tools.complete(f"{sid}-exec", {"out": "secret output"})
    plan = DeliveryPlan("chat", "alice", (DeliveryStep("send", "message"),))
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, delivery_plan=plan)
    orphan = store.runs.admit(sid, {"q": "again"}, user_message=USER)
    store.runs.start(orphan.id)
    rec = store.leases.acquire(f"session:{sid}", "rec", 30, purpose="recovery")
    store.recovery.begin(orphan.id, rec)
    store.recovery.converge(orphan.id, rec, error="worker lost")
    store.leases.release(rec)
    store.lineage.compare_and_swap(ResponseState(sid, previous_response_id="resp-1"), 0)
    store.archives.save_run(
        ResponseRun(sid, "bg-1", "openai", "openai-responses", "completed", run.turn_id)
    )
    store.archives.save_turn(
        ResponseTurn(sid, run.turn_id, "openai", "responses", "m", "replay", "completed")
    )
    store.archives.save_item(
        ResponseItem(sid, run.turn_id, "message", {"type": "message", "text": "secret"})
    )
    project = store.projects.get("p") or store.projects.create("secret project", project_id="p")
    store.sessions.set_metadata(sid, SessionMetadata(project_id=project.id, pinned=True))
    store.sessions.append(sid, "label", {"targetId": run.user_entry_id, "label": "keep"})
    store.capabilities.save(SessionCapabilities(sid, mode="secret mode", browser=True))
    store.capabilities.record_event(CapabilityEvent(sid, "browser", "on", new_value="secret"))
    store.guidance.save(Guidance(f"{sid}-g", sid, "secret guidance"))
    store.resources.record_event(InputResourceEvent(sid, "secret.pdf", "materialized"))
    store.usage.record(sid, provider="secret-co", model="m", input_tokens=3, run_id=run.id)
    store.bindings.bind(sid, "chat", f"secret-chat-{sid}")
    store.bindings.set_tools(sid, [ChannelToolConfig("secret_tool", True)])
    owner = store.leases.acquire(f"session:{sid}", "ledger-writer", 30)
    ledger = store.ledger.with_blobs(offload_threshold=16)
    ledger_writer = ledger.open(sid, owner)
    ledger_writer.append("turn", b"secret turn", f"turn-of-{sid}")
    ledger_writer.append("turn", b"a secret turn offloaded as a blob", f"blob-of-{sid}")
    # an orphan blob whose GC delete failed: its condemned mark stays (ledger_blob_condemned)
    # (as a writer puts it: sealed in a sealed session)
    orphan_key = blob_prefix("", sid) + "0" * 64
    ledger.blobs.put(orphan_key, seal_blob(store.db, sid, orphan_key, b"a secret orphan"))
    with pytest.raises(GCDeleteError):
        store.ledger.with_blobs(_Undeletable(ledger.blobs), offload_threshold=16).gc(sid, owner)
    store.leases.release(owner)
    # a replay long enough to store the branch's snapshot (replay_snapshots)
    secret = {"message": {"role": "user", "content": "a secret turn"}}
    store.sessions.append_many(sid, [(EntryKind.MESSAGE, secret)] * PERSIST_ROWS)
    store.sessions.replay(sid)
    fork = store.forks.fork(sid, request_id=f"fork-of-{sid}")
    return {"run": run, "orphan": orphan, "fork": fork}


class _Undeletable:
    """A blob store whose deletes fail."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        return bytes(self.inner.get(key))

    def delete(self, key: str) -> None:
        raise OSError("delete refused")

    def list(self, prefix: str) -> list[str]:
        return list(self.inner.list(prefix))


def session_rows(store: Any, sid: str) -> dict[str, int]:
    """How many rows of ``sid`` each table of :data:`deletes.REMOVED` holds."""
    return {
        table: rows(store, f"SELECT count(*) AS n FROM {table} WHERE {condition}", [sid])[0]["n"]
        for table, condition in deletes.REMOVED
    }


def everything_of(store: Any, sid: str) -> dict[str, Any]:
    """Every row of ``sid`` in every table a delete removes from (for "untouched")."""
    return {
        table: rows(store, f"SELECT * FROM {table} WHERE {condition}", [sid])
        for table, condition in deletes.REMOVED
    }


def audit_clean(store: Any) -> None:
    bad = [(c.name, c.detail) for c in run_audit(store) if not c.passed]
    assert bad == [], bad


def test_every_table_of_the_schema_is_removed_from_or_kept_on_purpose(store):
    tables = {
        r["table_name"]
        for r in rows(
            store,
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema()",
        )
    }
    decided = {t for t, _ in deletes.REMOVED} | set(deletes.KEPT)
    assert tables == decided, (tables - decided, decided - tables)


def test_a_delete_removes_every_row_of_the_session_and_nothing_else(store):
    made = populate(store, "a")
    populate(store, "b")
    before = session_rows(store, "a")
    # every table but these two: no run is active, and "a" is no fork (see below);
    # a clear store holds no data keys (an encrypted one stores its snapshots sealed)
    unfilled = {t for t, n in before.items() if n == 0}
    clear_only = set() if store.db.keyring.encrypted else {"session_keys"}
    assert unfilled == {"active_runs", "session_forks", *clear_only}, before
    fork_id = made["fork"].fork_session_id
    fork_replay = store.sessions.replay(fork_id)
    other = everything_of(store, "b")
    other_fork = everything_of(store, store.forks.get("fork-of-b").fork_session_id)

    gone = store.sessions.delete("a")

    assert isinstance(gone, DeletedSession)
    assert (gone.session_id, gone.reason, gone.lease_epoch) == ("a", "delete", None)
    assert (gone.entries, gone.runs, gone.tool_executions, gone.delivery_operations) == (
        before["entries"],
        2,
        1,
        1,
    )
    assert gone.run_events == before["run_events"] and gone.created_at == T0
    assert set(session_rows(store, "a").values()) == {0}
    assert store.sessions.get("a") is None and store.sessions.deleted("a") == gone
    for read in (store.sessions.entries, store.sessions.replay, store.runs.list):
        with pytest.raises(SessionNotFoundError):
            read("a")
    assert store.runs.get(made["run"].id) is None
    assert store.recovery.get(made["orphan"].id) is None
    assert store.lineage.get("a") is None
    assert store.bindings.find("chat", "secret-chat-a") is None  # the channel is free again
    assert store.bindings.find("chat", "secret-chat-b") == Binding("b", "chat", "secret-chat-b")
    # nothing of the content anywhere in the database
    dump = str([rows(store, f"SELECT * FROM {t}") for t in deletes.KEPT if t != "projects"])
    assert "secret" not in dump and "alice/a" not in dump
    # the other session, and its fork, untouched
    assert everything_of(store, "b") == other
    assert everything_of(store, store.forks.get("fork-of-b").fork_session_id) == other_fork
    # the fork survives its source, and its record stays readable
    assert store.sessions.replay(fork_id) == fork_replay
    kept = store.forks.get("fork-of-a")
    assert kept is not None and kept.source_session_id == "a"
    assert kept.fork_session_id == fork_id
    audit_clean(store)


def test_deleting_a_fork_removes_its_fork_record_and_keeps_its_source(store):
    made = populate(store, "a")
    fork_id = made["fork"].fork_session_id
    source = store.sessions.replay("a")
    assert session_rows(store, fork_id)["session_forks"] == 1
    store.sessions.delete(fork_id)
    assert session_rows(store, fork_id)["session_forks"] == 0
    assert store.forks.get("fork-of-a") is None
    assert store.sessions.replay("a") == source
    audit_clean(store)


def test_a_deleted_session_is_gone_for_every_write_and_its_id_is_never_reused(store):
    populate(store, "a")
    store.sessions.delete("a")
    with pytest.raises(SessionNotFoundError):
        store.sessions.delete("a")
    with pytest.raises(SessionNotFoundError):
        store.sessions.append("a", "message", {"message": USER})
    with pytest.raises(SessionNotFoundError):
        store.runs.admit("a", {"q": 1})
    with pytest.raises(SessionIDExistsError):
        store.sessions.create("a")
    with pytest.raises(SessionIDExistsError):
        store.sessions.import_batch(
            ImportBatch(session_id="a", cwd="", created_at=T0, header={}, entries=[], leaf_id=None)
        )
    store.sessions.create("src")
    run = store.runs.admit("src", {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
    with pytest.raises(SessionIDExistsError):
        store.forks.fork("src", request_id="r", fork_session_id="a")
    assert store.sessions.get("a") is None
    audit_clean(store)


def test_a_held_session_is_busy_without_its_lease_and_deleted_with_it(store):
    populate(store, "a")
    lease = store.leases.acquire("session:a", "w", 30)
    err = raised(BusyError, lambda: store.sessions.delete("a"))
    assert err.target == "session:a"
    assert store.sessions.get("a") is not None
    gone = store.sessions.delete("a", lease=lease)
    assert gone.lease_epoch == lease.epoch and store.sessions.get("a") is None
    audit_clean(store)


def test_a_stale_or_foreign_lease_deletes_nothing(store, clock):
    store.sessions.create("a")
    store.sessions.create("b")
    stale = store.leases.acquire("session:a", "w", 1)
    clock.advance(2)
    store.leases.acquire("session:a", "v", 30)
    with pytest.raises(LeaseLostError):
        store.sessions.delete("a", lease=stale)
    other = store.leases.acquire("session:b", "w", 30)
    with pytest.raises(InvalidInputError):
        store.sessions.delete("a", lease=other)
    assert store.sessions.get("a") is not None


def test_a_session_with_a_run_not_terminal_is_refused(store):
    store.sessions.create("a")
    run = store.runs.admit("a", {"q": 1}, user_message=USER)
    err = raised(SessionRunActiveError, lambda: store.sessions.delete("a"))
    assert (err.session_id, err.run_id) == ("a", run.id)
    store.runs.start(run.id)
    store.runs.wait(run.id)
    assert raised(SessionRunActiveError, lambda: store.sessions.delete("a")).run_id == run.id
    store.runs.resume(run.id)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
    store.sessions.delete("a")
    audit_clean(store)


def test_the_replay_cache_forgets_a_deleted_session(store):
    populate(store, "a")
    store.sessions.replay("a")
    assert store.sessions._branches.get("a") is not None
    store.sessions.delete("a")
    assert store.sessions._branches.get("a") is None


# -- guards, each broken in a kill test ------------------------------------------


def raised(kind: type[BaseException], call: Any) -> Any:
    try:
        got = call()
    except kind as exc:
        return exc
    raise AssertionError(f"expected {kind.__name__}, the call was accepted: {got!r}")


def check_busy_refused(store: Any) -> None:
    store.sessions.create("g")
    store.leases.acquire("session:g", "w", 30)
    raised(BusyError, lambda: store.sessions.delete("g"))


def check_active_refused(store: Any) -> None:
    store.sessions.create("h")
    store.runs.admit("h", {"q": 1})
    raised(SessionRunActiveError, lambda: store.sessions.delete("h"))


def check_id_not_reused(store: Any) -> None:
    store.sessions.create("i")
    store.sessions.delete("i")
    raised(SessionIDExistsError, lambda: store.sessions.create("i"))


def test_guards_hold(store):
    check_busy_refused(store)
    check_active_refused(store)
    check_id_not_reused(store)


def test_kill_the_lease_guard(store, monkeypatch):
    monkeypatch.setattr(deletes.leases, "fence_or_unheld", lambda tx, target, lease: None)
    with pytest.raises(AssertionError):
        check_busy_refused(store)


def test_kill_the_active_run_guard(store, monkeypatch):
    monkeypatch.setattr(deletes, "NON_TERMINAL", ("none", "none", "none"))
    with pytest.raises(AssertionError):
        check_active_refused(store)


def test_kill_the_reuse_guard(store, monkeypatch):
    from turnkeeper.storage.ops import session_rows

    monkeypatch.setattr(session_rows, "TAKEN", "SELECT 1 FROM sessions WHERE id = ? AND ? = ''")
    with pytest.raises(AssertionError):
        check_id_not_reused(store)


def test_kill_a_table_from_the_delete_and_the_audit_sees_it(store, monkeypatch):
    """The audit's no_orphan_rows check is what "the audit stays clean after a
    delete" rests on: a delete that forgets a table leaves rows it flags."""
    populate(store, "a")
    for table in ("tool_executions", "recovery_events", "session_forks"):
        left = tuple(r for r in deletes.REMOVED if r[0] != table)
        monkeypatch.setattr(deletes, "REMOVED", left)
        sid = f"k-{table}"
        populate(store, sid)
        if table == "session_forks":
            sid = store.forks.get(f"fork-of-{sid}").fork_session_id
        store.sessions.delete(sid)
        failed = {c.name for c in run_audit(store) if not c.passed}
        assert failed == {"no_orphan_rows"}, (table, failed)
        if table != "recovery_events":  # rows naming the session: an audit of it sees them
            failed = {c.name for c in run_audit(store, [sid]) if not c.passed}
            assert failed == {"no_orphan_rows"}, (table, failed)
        monkeypatch.undo()
        store.query("SELECT 1")  # the store is still usable
        for t, column, owner, key in OWNED:  # tidy what the broken delete left
            if t == table:
                sql = f"DELETE FROM {t} WHERE {column} NOT IN (SELECT {key} FROM {owner})"
                store.db.write("tidy", lambda tx, sql=sql: tx.exec(sql))
        audit_clean(store)


def test_the_audit_judges_every_table_a_delete_removes_from():
    assert {t for t, *_ in OWNED} == {t for t, _ in deletes.REMOVED}


def racing_writers(store: Any, sid: str, operation_id: str) -> list[Any]:
    """One writer of each kind for session ``sid`` (each called a few times)."""
    counter = iter(range(10_000))

    def claim_tool() -> Any:
        k = next(counter)
        return store.tools.claim(
            f"{sid}-k{k}",
            sid,
            local_turn_id="t",
            provider_call_id=f"c{k}",
            tool_name="bash",
            side_effecting=False,
        )

    def swap() -> Any:
        state = store.lineage.get(sid)
        version = 0 if state is None else state.version
        return store.lineage.compare_and_swap(
            ResponseState(sid, previous_response_id=f"r{next(counter)}"), version
        )

    return [
        lambda: store.sessions.new_sub_agent(sid),
        lambda: store.sessions.append(sid, "message", {"message": USER}),
        lambda: store.sessions.set_metadata(sid, SessionMetadata(pinned=True)),
        claim_tool,
        swap,
        lambda: store.outbox.claim(operation_id, f"courier-{next(counter)}", 30),
    ]


def test_a_delete_racing_writers_leaves_no_row_behind(real_store):
    """Writers of every kind race a delete of their session: each write either
    lands before the delete (and goes with the session) or is refused because
    the session is gone; no row outlives it (the audit's no_orphan_rows)."""
    import threading

    from turnkeeper import (
        DeliveryOperationBusyError,
        DeliveryOperationNotFoundError,
        RunNotFoundError,
    )

    store = real_store
    refused = (
        SessionNotFoundError,
        RunNotFoundError,
        DeliveryOperationNotFoundError,
        DeliveryOperationBusyError,  # a second courier's claim
    )
    for round_ in range(4):
        sid = f"race{round_}"
        populate(store, sid)
        operation_id = store.query(
            "SELECT o.id FROM delivery_operations o JOIN delivery_intents i "
            "ON i.id = o.intent_id WHERE i.session_id = ?",
            [sid],
        ).to_pylist()[0]["id"]
        acts = [*racing_writers(store, sid, operation_id), lambda s=sid: store.sessions.delete(s)]
        barrier = threading.Barrier(len(acts))
        errors: list[BaseException] = []

        def write(act: Any, barrier: Any = barrier, errors: Any = errors) -> None:
            barrier.wait()
            for _ in range(3):
                try:
                    act()
                except refused:
                    pass
                except BaseException as exc:  # anything else fails the test
                    errors.append(exc)

        threads = [threading.Thread(target=write, args=(a,)) for a in acts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert store.sessions.get(sid) is None
        assert set(session_rows(store, sid).values()) == {0}
        audit_clean(store)


# -- sub-agent sessions go with their parent -----------------------------------------


def family(store: Any, sid: str) -> tuple[str, str]:
    """Session ``sid`` with a sub-agent, which has one of its own; their ids."""
    store.sessions.create(sid)
    child = store.sessions.new_sub_agent(sid, f"{sid}-child").id
    grandchild = store.sessions.new_sub_agent(child, f"{sid}-grandchild").id
    for each in (child, grandchild):
        store.sessions.append(each, "message", {"message": USER})
        store.runs.admit(each, {"q": each}, user_message=USER, start=True)
        store.runs.finish(store.runs.active(each).id, "succeeded")
    return child, grandchild


def test_deleting_a_session_deletes_its_sub_agents_and_theirs(store):
    child, grandchild = family(store, "p")
    populate(store, "other")
    kept = everything_of(store, "other")
    gone = store.sessions.delete("p")
    assert gone.session_id == "p" and gone.reason == "delete"
    for each in (child, grandchild):
        assert store.sessions.get(each) is None
        assert set(session_rows(store, each).values()) == {0}
        left = store.sessions.deleted(each)
        assert left is not None and (left.reason, left.runs) == ("delete", 1) and left.entries > 0
    assert everything_of(store, "other") == kept
    audit_clean(store)


def test_a_held_or_active_sub_agent_refuses_its_parents_delete(store):
    child, grandchild = family(store, "q")
    lease = store.leases.acquire(f"session:{grandchild}", "w", 30)
    busy = raised(BusyError, lambda: store.sessions.delete("q"))
    assert grandchild in str(busy)
    assert store.sessions.get("q") is not None and store.sessions.get(child) is not None
    store.leases.release(lease)
    run = store.runs.admit(child, {"q": 2}, user_message=USER, start=True)
    active = raised(SessionRunActiveError, lambda: store.sessions.delete("q"))
    assert (active.session_id, active.run_id) == (child, run.id)
    assert store.sessions.get("q") is not None and store.sessions.get(grandchild) is not None
    store.runs.finish(run.id, "succeeded")
    store.sessions.delete("q")
    assert store.sessions.get(grandchild) is None


def test_kill_the_sub_agent_cascade_and_the_audit_sees_it(store, monkeypatch):
    child, _ = family(store, "r")
    monkeypatch.setattr(
        deletes,
        "delete",
        lambda tx, sid, lease, reason, *rest: [deletes._delete_one(tx, sid, lease, reason)],
    )
    store.sessions.delete("r")
    assert store.sessions.get(child) is not None  # left naming a deleted parent
    failed = {c.name: c for c in run_audit(store) if not c.passed}
    assert set(failed) == {"no_orphan_rows"}
    assert f"sessions.sub_agent_of:{child}" not in str(failed["no_orphan_rows"].detail)
    assert "sessions.sub_agent_of:r" in str(failed["no_orphan_rows"].detail)


def test_retention_and_project_deletes_take_sub_agents_once(store):
    child, grandchild = family(store, "s")
    project = store.projects.create("work")
    for each in ("s", child, grandchild):
        store.sessions.set_metadata(each, SessionMetadata(project_id=project.id))
    done = store.projects.delete(project.id)
    assert sorted(d.session_id for d in done) == sorted(["s", child, grandchild])
    audit_clean(store)
    child, grandchild = family(store, "t")
    lease = store.leases.acquire("retention:main", "janitor", 60)
    report = store.sessions.retain(lease, keep_last=0)
    assert sorted(d.session_id for d in report.removed) == sorted(["t", child, grandchild])
    assert report.skipped == {}
    audit_clean(store)


def test_a_sub_agent_created_while_its_parent_is_deleted_goes_with_it(real_store, monkeypatch):
    """The delete's snapshot is taken, then a sub-agent of the session commits,
    then the delete goes on: it must not leave the sub-agent naming a deleted
    parent. new_sub_agent writes the parent's row, so the delete conflicts, is
    retried and deletes the sub-agent too; without that write (patched out in
    the control) the sub-agent is left behind."""
    if real_store.db.dialect.serialized_writes:
        pytest.skip("DuckDB: the write lock orders a delete and a sub-agent's create")
    check_sub_agent_race(real_store, monkeypatch, "u")


def test_the_sub_agent_race_test_fails_without_the_parent_write(real_store, monkeypatch):
    if real_store.db.dialect.serialized_writes:
        pytest.skip("DuckDB: the write lock orders a delete and a sub-agent's create")

    class NoParentWrite:
        """A transaction whose new_sub_agent write of the parent's row is skipped."""

        def __init__(self, tx: Any) -> None:
            self._tx = tx

        def __getattr__(self, name: str) -> Any:
            return getattr(self._tx, name)

        def count(self, sql: str, params: Any = ()) -> int:
            if sql.startswith("UPDATE sessions SET updated_at = updated_at"):
                return 1
            return int(self._tx.count(sql, params))

    real_write = real_store.db.write

    def write(operation: str, body: Any, **kw: Any) -> Any:
        if operation == "new_sub_agent":
            return real_write(operation, lambda tx: body(NoParentWrite(tx)), **kw)
        return real_write(operation, body, **kw)

    monkeypatch.setattr(real_store.db, "write", write)
    with pytest.raises(AssertionError, match="left behind"):
        check_sub_agent_race(real_store, monkeypatch, "v")


def import_sub_agent(store: Any, parent: str) -> Any:
    """A sub-agent of ``parent`` made by an import (as a Claude Code or Codex
    sub-agent file is): ``ImportBatch.sub_agent_of``."""
    from turnkeeper.spec.records import ImportBatch

    batch = ImportBatch(f"{parent}/agent", "/w", datetime(2026, 1, 1, tzinfo=UTC), {}, [], None)
    store.sessions.import_batch(dataclasses.replace(batch, sub_agent_of=parent))
    return store.sessions.get(f"{parent}/agent")


def test_a_sub_agent_imported_while_its_parent_is_deleted_goes_with_it(real_store, monkeypatch):
    """As for new_sub_agent: an import that creates a sub-agent session writes
    the parent's row, so a concurrent delete of the parent takes it too."""
    if real_store.db.dialect.serialized_writes:
        pytest.skip("DuckDB: the write lock orders a delete and a sub-agent's import")
    check_sub_agent_race(real_store, monkeypatch, "w", import_sub_agent)


def test_the_imported_sub_agent_race_test_fails_without_the_parent_write(real_store, monkeypatch):
    if real_store.db.dialect.serialized_writes:
        pytest.skip("DuckDB: the write lock orders a delete and a sub-agent's import")

    class NoParentWrite:
        """A transaction whose import write of the parent's row is skipped."""

        def __init__(self, tx: Any) -> None:
            self._tx = tx

        def __getattr__(self, name: str) -> Any:
            return getattr(self._tx, name)

        def count(self, sql: str, params: Any = ()) -> int:
            if sql.startswith("UPDATE sessions SET updated_at = updated_at"):
                return 1
            return int(self._tx.count(sql, params))

    real_write = real_store.db.write

    def write(operation: str, body: Any, **kw: Any) -> Any:
        if operation == "import":
            return real_write(operation, lambda tx: body(NoParentWrite(tx)), **kw)
        return real_write(operation, body, **kw)

    monkeypatch.setattr(real_store.db, "write", write)
    with pytest.raises(AssertionError, match="left behind"):
        check_sub_agent_race(real_store, monkeypatch, "x", import_sub_agent)


def check_sub_agent_race(
    store: Any, monkeypatch: Any, sid: str, make: Any = lambda s, p: s.sessions.new_sub_agent(p)
) -> None:
    import threading

    store.sessions.create(sid)
    made: list[Any] = []
    real = deletes._delete_one
    first = [True]

    def paused(tx: Any, session_id: str, *rest: Any) -> Any:
        if first[0] and session_id == sid:
            first[0] = False
            tx.one("SELECT 1 FROM sessions WHERE id = ?", [sid])  # the snapshot is taken
            t = threading.Thread(target=lambda: made.append(make(store, sid)))
            t.start()
            t.join(60)
            assert made, "the sub-agent's create did not commit"
        return real(tx, session_id, *rest)

    monkeypatch.setattr(deletes, "_delete_one", paused)
    store.sessions.delete(sid)
    child = made[0].id
    assert store.sessions.get(child) is None, f"sub-agent {child} left behind"
    assert store.sessions.deleted(child) is not None
    audit_clean(store)


def test_guidance_queued_while_its_session_is_deleted_goes_with_it(real_store, monkeypatch):
    """guidance.save is the one session-owned write that takes no lease (guidance
    is queued while a run holds the session): it must still meet a concurrent
    delete on the session's row. The delete's snapshot is taken, then guidance
    commits, then the delete goes on: the guidance must go too (an attack
    helper left 'private steering text' behind a deleted session, PostgreSQL)."""
    if real_store.db.dialect.serialized_writes:
        pytest.skip("DuckDB: the write lock orders a delete and a guidance save")
    store = real_store
    store.sessions.create("gd")
    real = deletes._delete_one
    first = [True]
    saved: list[Any] = []

    def paused(tx: Any, session_id: str, *rest: Any) -> Any:
        if first[0]:
            first[0] = False
            tx.one("SELECT 1 FROM sessions WHERE id = ?", ["gd"])  # the snapshot is taken
            t = threading.Thread(
                target=lambda: saved.append(store.guidance.save(Guidance("g1", "gd", "steer")))
            )
            t.start()
            t.join(60)
            assert saved, "the guidance save did not commit"
        return real(tx, session_id, *rest)

    monkeypatch.setattr(deletes, "_delete_one", paused)
    store.sessions.delete("gd")
    left = rows(store, "SELECT count(*) AS n FROM esm_guidance WHERE session_id = 'gd'")
    assert left == [{"n": 0}], "guidance left behind its deleted session"
    audit_clean(store)


def test_retention_judges_a_session_with_its_sub_agents(store, clock):
    """A sub-agent written just now keeps its old parent (and itself) from a
    retention pass, by age and by count; an old family goes whole (an attack
    helper saw retain remove a sub-agent that was the newest session)."""
    store.sessions.create("old")
    store.sessions.create("other")
    clock.advance(100)
    child = store.sessions.new_sub_agent("old", "old-child").id
    store.sessions.append(child, "message", {"message": USER})
    janitor = store.leases.acquire("retention:main", "janitor", 600)
    by_count = store.sessions.retain(janitor, keep_last=1)
    assert [d.session_id for d in by_count.removed] == ["other"]
    by_age = store.sessions.retain(janitor, max_age_s=50)
    assert by_age.removed == [] and store.sessions.get(child) is not None
    clock.advance(100)
    aged = store.sessions.retain(janitor, max_age_s=50)
    assert [d.session_id for d in aged.removed] == ["old", child]
    audit_clean(store)


def test_retention_keeps_a_family_whose_sub_agent_was_written_since_it_chose(
    store, clock, monkeypatch
):
    store.sessions.create("fam")
    child = store.sessions.new_sub_agent("fam", "fam-child").id
    clock.advance(100)
    janitor = store.leases.acquire("retention:main", "janitor", 600)
    real_read = store.db.read

    def read(operation: str, body: Any, **kw: Any) -> Any:
        got = real_read(operation, body, **kw)
        if operation == "retention_candidates":  # the pass chose: now a write
            store.sessions.append(child, "message", {"message": USER})
        return got

    monkeypatch.setattr(store.db, "read", read)
    report = store.sessions.retain(janitor, max_age_s=50)
    assert report.removed == [] and report.skipped == {"fam": "changed"}
    assert store.sessions.get(child) is not None


@pytest.mark.parametrize("enc", ["duckdb", "postgres"], indirect=True)
def test_an_ambiguous_delete_leaves_no_data_key_cached(enc: Any) -> None:
    """A delete that commits while its caller sees an error (a lost connection
    at COMMIT): this store object drops its caches of the session all the same,
    the session's data key among them (crypto-shredding: the key rows went with
    the delete, no copy stays in memory), and the retry says the session is
    gone. Control: with the forget on failure patched out the key stays cached."""
    from turnkeeper.fuzz.ambiguous import ambiguous_commits

    enc.sessions.create("doomed")
    enc.sessions.append("doomed", EntryKind.MESSAGE, {"message": {"role": "user", "content": "x"}})
    assert enc.db.keyring._cached("doomed")
    with pytest.raises(OperationalError), ambiguous_commits(enc):
        enc.sessions.delete("doomed")
    assert not enc.db.keyring._cached("doomed")
    assert enc.sessions.deleted("doomed") is not None
    with pytest.raises(SessionNotFoundError):
        enc.sessions.delete("doomed")


@pytest.mark.parametrize("enc", ["duckdb"], indirect=True)
def test_control_without_the_forget_on_failure_the_key_stays_cached(
    enc: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with the failed delete's forget patched out (here only), the
    ambiguous delete leaves the deleted session's data key cached."""
    from turnkeeper.fuzz.ambiguous import ambiguous_commits

    monkeypatch.setattr(deletes.DeletesPart, "_forget_unsure", lambda self, session_id: None)
    enc.sessions.create("doomed")
    enc.sessions.append("doomed", EntryKind.MESSAGE, {"message": {"role": "user", "content": "x"}})
    with pytest.raises(OperationalError), ambiguous_commits(enc):
        enc.sessions.delete("doomed")
    assert enc.db.keyring._cached("doomed")


@pytest.mark.parametrize("enc", ["duckdb", "postgres"], indirect=True)
def test_an_ambiguous_retention_delete_leaves_no_data_key_cached(
    enc: Any, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a retention pass: its delete of a session commits while the
    pass sees an error at COMMIT (raised to the caller), and the session's data
    key is not left cached; the next pass has nothing of it to remove."""
    db: Any = enc.db
    real = db.write

    def commit_then_fail(operation: str, body: Any, **kwargs: Any) -> Any:
        result = real(operation, body, **kwargs)
        if operation == "retain_session":
            raise OperationalError("injected: the connection was lost at COMMIT")
        return result

    enc.sessions.create("old")
    enc.sessions.append("old", EntryKind.MESSAGE, {"message": {"role": "user", "content": "x"}})
    clock.advance(100)
    assert enc.db.keyring._cached("old")
    lease = enc.leases.acquire("retention:main", "janitor", 60)
    monkeypatch.setattr(db, "write", commit_then_fail)
    with pytest.raises(OperationalError):
        enc.sessions.retain(lease, max_age_s=10)
    monkeypatch.setattr(db, "write", real)
    assert not enc.db.keyring._cached("old")
    assert enc.sessions.deleted("old") is not None
    assert enc.sessions.retain(lease, max_age_s=10).removed == []
