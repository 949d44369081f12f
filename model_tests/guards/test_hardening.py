"""Regressions from the newcomer attack: typed refusals, fencing by target, races, close."""

from __future__ import annotations

import dataclasses
import enum
import math
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pytest

import turnkeeper
from turnkeeper import (
    EntryKind,
    FinalizeRequest,
    InvalidInputError,
    Lease,
    LeaseLostError,
    NewEntry,
    ThreadRecord,
)
from turnkeeper.spec.records import ImportBatch, ImportEntry, OpaqueRecord

MSG = {"message": {"role": "user", "content": "x"}}


def test_a_lease_on_one_session_never_fences_a_write_to_another(store):
    store.sessions.create("s1")
    store.sessions.create("s2")
    lease_b = store.leases.acquire("session:s2", "B", 30)
    for call in (
        lambda: store.sessions.append("s1", EntryKind.MESSAGE, MSG, lease=lease_b),
        lambda: store.sessions.branch("s1", None, lease=lease_b),
        lambda: store.sessions.set_title("s1", "t", lease=lease_b),
    ):
        with pytest.raises(InvalidInputError) as err:
            call()
        assert err.value.field == "lease"
    assert store.sessions.entries("s1") == []


def test_branch_with_a_lost_lease_is_refused(store, clock):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "A", 1)
    a = store.sessions.append("s", EntryKind.MESSAGE, MSG, lease=lease)
    clock.advance(2)
    with pytest.raises(LeaseLostError):
        store.sessions.branch("s", None, lease=lease)
    assert store.sessions.get("s").leaf_id == a.id


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused_not_stored_as_null(store, bad):
    store.sessions.create("s")
    with pytest.raises(InvalidInputError):
        store.sessions.append("s", EntryKind.MESSAGE, {"message": {"role": "user", "cost": [bad]}})
    with pytest.raises(InvalidInputError):
        store.sessions.create("h", header={"x": {"y": bad}})
    with pytest.raises(InvalidInputError):
        store.threads.finalize(FinalizeRequest(ThreadRecord("r", "k", state={"v": bad})))
    assert store.sessions.entries("s") == [] and store.sessions.get("h") is None


GOOD = Lease("t", "o", "tok", 1, "mutation", datetime(2026, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.leases.validate(Lease(None, "o", "t", 1, "mutation", GOOD.expires_at)),
        lambda s: s.leases.renew(Lease("t", "o", "tok\ud800", 1, "mutation", GOOD.expires_at), 1),
        lambda s: s.leases.release(Lease("t", "o", "tok", True, "mutation", GOOD.expires_at)),
        lambda s: s.threads.finalize(None),
        lambda s: s.threads.finalize(FinalizeRequest(ThreadRecord("r", "k"), held_leases=GOOD)),
        lambda s: s.threads.finalize(FinalizeRequest(ThreadRecord("r", "k"), held_leases=None)),
        lambda s: s.threads.finalize(FinalizeRequest(ThreadRecord("r", "k"), archive_old="no")),
        lambda s: s.sessions.create("x", header=[1, 2]),
        lambda s: s.sessions.create("x", header="abc"),
        lambda s: s.sessions.list(cursor=5),
        lambda s: s.sessions.list(limit=True),
        lambda s: s.sessions.list(cursor="MjAyMC0wMS0wMQ=="),  # base64("2020-01-01"): no id
        lambda s: s.leases.acquire("t", "o", True),
        lambda s: s.leases.acquire("t", "o", 1, purpose="whatever"),
        lambda s: s.sessions.get(5),
        lambda s: s.sessions.replay("a\ud800"),
        lambda s: s.sessions.entries(None),
        lambda s: s.sessions.labels(3.5),
        lambda s: s.sessions.branch("s", "e", expected_leaf=5),
        lambda s: s.threads.resolve(id=5),
        lambda s: s.sessions.count(search=5),
        lambda s: s.sessions.append("s", EntryKind.MESSAGE, MSG, expected_leaf=7),
    ],
)
def test_bad_input_is_a_typed_refusal(store, call):
    store.sessions.create("s")
    with pytest.raises(InvalidInputError):
        call(store)
    assert store.sessions.entries("s") == []


@pytest.mark.parametrize("path", [5, "", "db\x00suffix.duckdb", b"bytes.duckdb"])
def test_bad_paths_are_refused(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInputError):
        turnkeeper.open_store(path)
    assert list(tmp_path.iterdir()) == []


def _batch(sid: str, n: int, source: str = "f.jsonl", opaque=()) -> ImportBatch:
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    entries = [
        ImportEntry(f"e{i}", f"e{i - 1}" if i else None, "message", ts, MSG) for i in range(n)
    ]
    return ImportBatch(sid, "/w", ts, {"version": 3}, entries, f"e{n - 1}", opaque, source)


def test_concurrent_imports_of_one_new_session_all_succeed(tmp_path):
    store = turnkeeper.open_store(str(tmp_path / "i.duckdb"))
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker() -> None:
        try:
            barrier.wait()
            store.sessions.import_batch(_batch("same", 50))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert len(store.sessions.entries("same")) == 50
    finally:
        store.close()


def test_opaque_line_that_now_parses_is_dropped_on_reimport(store):
    bad = OpaqueRecord("f.jsonl", 4, '{"type":"mess', "truncated")
    store.sessions.import_batch(_batch("s", 2, opaque=[bad]))
    assert [o.line for o in store.sessions.opaque_records("s")] == [4]
    store.sessions.import_batch(_batch("s", 3))  # the file grew: line 4 is a whole record now
    assert store.sessions.opaque_records("s") == []
    assert len(store.sessions.entries("s")) == 3


def test_close_waits_for_running_operations_and_releases_the_file(tmp_path):
    path = tmp_path / "c.duckdb"
    store = turnkeeper.open_store(str(path))
    store.sessions.create("s")
    started, results = threading.Event(), []

    def long_read() -> None:
        started.set()
        results.append(store.query("SELECT count(*) AS n FROM range(30000000) a, range(3) b"))

    t = threading.Thread(target=long_read)
    t.start()
    started.wait()
    gate = store.db._gate
    for _ in range(60_000):  # until the read is admitted (running), not a time
        with gate.lock:
            if t in gate._inflight:
                break
        time.sleep(0.001)
    else:
        pytest.fail("the read never started")
    store.close()  # must wait for the query, not fail with ResourceInUse
    t.join()
    assert results and results[0].to_pylist()[0]["n"] == 90000000
    with pytest.raises(turnkeeper.InterfaceError):
        store.sessions.get("s")
    store.close()  # idempotent
    again = turnkeeper.open_store(str(path))  # the lock is gone
    again.close()


def test_search_matches_percent_and_underscore_literally(store):
    store.sessions.create("plain")
    store.sessions.create("with_underscore")
    store.sessions.create("fifty%off")
    assert [s.id for s in store.sessions.list(search="_").sessions] == ["with_underscore"]
    assert store.sessions.count(search="%") == 1


def test_written_at_is_the_store_clock_not_the_callers_timestamp(store, clock):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "A", 5)
    old = datetime(2001, 1, 1, tzinfo=UTC)
    store.sessions.append("s", EntryKind.MESSAGE, MSG, lease=lease, timestamp=old)
    rows = store.query("SELECT ts, written_at FROM entries").to_pylist()
    assert rows[0]["ts"] == old and rows[0]["written_at"] == clock.now
    from turnkeeper.storage.audit import run_audit

    assert all(c.passed for c in run_audit(store, ["s"])), run_audit(store, ["s"])


def test_read_only_store_reads_and_refuses_writes(tmp_path):
    path = str(tmp_path / "r.duckdb")
    with turnkeeper.open_store(path) as s:
        s.sessions.create("s")
    with turnkeeper.open_store(path, read_only=True) as ro:
        assert ro.sessions.get("s") is not None
        with pytest.raises(turnkeeper.ReadOnlyError) as err:
            ro.sessions.create("t")
        assert err.value.path == path
    with turnkeeper.open_store(path) as s:
        assert s.sessions.get("t") is None


def test_read_only_open_of_a_missing_or_old_file_changes_nothing(tmp_path):
    with pytest.raises(turnkeeper.DatabaseError):
        turnkeeper.open_store(str(tmp_path / "missing.duckdb"), read_only=True)
    assert not (tmp_path / "missing.duckdb").exists()


def test_a_foreign_duckdb_file_is_not_a_turnkeeper_database(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE sessions (x INTEGER)")
    con.close()
    with pytest.raises(turnkeeper.ForeignDatabaseError) as err:
        turnkeeper.open_store(str(path))
    assert "not a turnkeeper database" in str(err.value)
    con = duckdb.connect(str(path))
    assert [r[0] for r in con.execute("SHOW TABLES").fetchall()] == ["sessions"]
    con.close()


def test_paths_are_reported_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with turnkeeper.open_store(Path("rel.duckdb")) as s:
        assert s.path == str(tmp_path / "rel.duckdb")


def test_short_lived_threads_do_not_gather_cursors(duck_real_store):
    real_store = duck_real_store
    """Each thread's cursor is closed when the thread ends (a runtime starting a
    heartbeat thread per lease would otherwise leak one cursor per thread)."""
    real_store.sessions.create("cur")

    def read() -> None:
        assert real_store.sessions.get("cur") is not None

    for _ in range(5):
        threads = [threading.Thread(target=read) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(real_store.db._cursors._open) <= 2  # this thread's, and at most one finishing
    assert real_store.sessions.get("cur") is not None


def _finished_plan(store):
    store.sessions.create("bi")
    run = store.runs.admit("bi", {"q": 1})
    plan = turnkeeper.DeliveryPlan("chat", "t", (turnkeeper.DeliveryStep("send", "m"),))
    store.runs.finish(run.id, "failed", delivery_plan=plan)
    op = store.outbox.get_plan(f"{run.id}:delivery")[1][0]
    return run, store.outbox.claim(op.id, "w", 30)


BAD_RUN_CALLS = {
    "admit policy str": (lambda s, r, op: s.runs.admit("bi", {"q": 2}, policy="abc"), "policy"),
    "admit policy falsy": (lambda s, r, op: s.runs.admit("bi", {"q": 2}, policy=0), "policy"),
    "requeue huge delay": (
        lambda s, r, op: s.outbox.requeue(op.id, "w", op.lease_epoch, delay_s=1e13),
        "delay_s",
    ),
    "requeue int overflow": (
        lambda s, r, op: s.outbox.requeue(op.id, "w", op.lease_epoch, delay_s=10**30),
        "delay_s",
    ),
    "requeue null code": (
        lambda s, r, op: s.outbox.requeue(op.id, "w", op.lease_epoch, failure_code=None),
        "failure_code",
    ),
    "epoch overflow": (
        lambda s, r, op: s.outbox.finish(op.id, "w", 10**30, "delivered"),
        "epoch",
    ),
    "events limit": (lambda s, r, op: s.runs.events("bi", limit=10**30), "limit"),
    "events cursor": (lambda s, r, op: s.runs.events("bi", after=10**30), "after"),
    "fork at_seq": (lambda s, r, op: s.forks.fork("bi", request_id="f", at_seq=10**30), "at_seq"),
    "fail base None": (
        lambda s, r, op: s.recovery.fail(r.id, _rec(s), "x", base_delay_s=None),
        "base_delay_s",
    ),
    "fail base bool": (
        lambda s, r, op: s.recovery.fail(r.id, _rec(s), "x", base_delay_s=True),
        "base_delay_s",
    ),
    "fail max huge": (
        lambda s, r, op: s.recovery.fail(r.id, _rec(s), "x", max_delay_s=1e300),
        "max_delay_s",
    ),
    "fail max inf": (
        lambda s, r, op: s.recovery.fail(r.id, _rec(s), "x", max_delay_s=float("inf")),
        "max_delay_s",
    ),
}


def _rec(store):
    """A recovery lease (on a session of its own with an orphan: a recovery
    lease needs an active run; these calls are refused before any write)."""
    store.sessions.create("orphan")
    store.runs.admit("orphan", {"q": 1})
    return store.leases.acquire("session:orphan", "rec", 30, purpose="recovery")


@pytest.mark.parametrize("case", sorted(BAD_RUN_CALLS))
def test_out_of_range_numbers_and_wrong_types_are_typed_errors(store, case):
    """Values a backend cannot hold (past int64, past datetime) and wrong types get
    InvalidInputError naming the field, not OverflowError, TypeError or DataError."""
    run, op = _finished_plan(store)
    call, field = BAD_RUN_CALLS[case]
    before = store.outbox.get_operation(op.id)
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        call(store, run, op)
    assert err.value.field == field
    assert store.outbox.get_operation(op.id) == before
    assert [r.id for r in store.runs.list("bi")] == [run.id]


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM sessions",
        "UPDATE leases SET epoch = 1",
        "COPY (SELECT 1) TO '/tmp/turnkeeper-query-copy.csv'",
        "ATTACH ':memory:' AS other",
        "SET threads = 1",
        "SELECT 1; DELETE FROM sessions",
        "not sql at all",
    ],
)
def test_query_only_reads(store, sql):
    store.sessions.create("q")
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        store.query(sql)
    assert err.value.field == "sql"
    assert store.sessions.get("q") is not None
    assert store.query("SELECT count(*) AS n FROM sessions").to_pylist() == [{"n": 1}]


class _Color(enum.Enum):
    RED = "red"


class _Kind(enum.StrEnum):
    A = "a"


@dataclasses.dataclass
class _Point:
    x: int


INEXACT = {
    "datetime": datetime(2026, 1, 1, tzinfo=UTC),
    "uuid": uuid.UUID(int=7),
    "enum": _Color.RED,
    "dataclass": _Point(1),
    "tuple": (1, 2),
    "set": {1},
    "bytes": b"x",
}


@pytest.mark.parametrize("kind", sorted(INEXACT))
@pytest.mark.parametrize(
    "write",
    [
        lambda s, v: s.sessions.append(
            "s", EntryKind.MESSAGE, {"message": {"role": "user", "x": [v]}}
        ),
        lambda s, v: s.sessions.create("h", header={"x": v}),
        lambda s, v: s.threads.finalize(FinalizeRequest(ThreadRecord("r", "k", state={"v": v}))),
        lambda s, v: s.runs.admit("s", {"q": v}),
        lambda s, v: s.tools.claim(
            "k",
            "s",
            local_turn_id="t",
            provider_call_id="c",
            tool_name="x",
            side_effecting=False,
            arguments={"a": v},
        ),
    ],
    ids=["append", "header", "thread-state", "run-request", "tool-arguments"],
)
def test_what_json_cannot_hold_exactly_is_refused_not_converted(store, kind, write):
    store.sessions.create("s")
    with pytest.raises(InvalidInputError) as err:
        write(store, INEXACT[kind])
    assert "exactly" in str(err.value) or "not storable" in str(err.value)
    assert store.sessions.entries("s") == [] and store.sessions.get("h") is None
    assert store.runs.list("s") == [] and store.threads.resolve(id="r") is None


def test_str_and_int_subclasses_are_stored_as_their_plain_value(store):
    store.sessions.create("s")
    entry = store.sessions.append(
        "s", EntryKind.MESSAGE, {"message": {"role": "user", "k": _Kind.A}}
    )
    assert type(entry.payload["message"]["k"]) is str
    assert store.sessions.entries("s")[0].payload == {"message": {"role": "user", "k": "a"}}


def test_the_refusal_names_where_the_inexact_value_sits(store):
    store.sessions.create("s")
    with pytest.raises(InvalidInputError) as err:
        message = {"role": "user", "at": [uuid.UUID(int=1)]}
        store.sessions.append("s", EntryKind.MESSAGE, {"message": message})
    assert err.value.field == "payload"
    assert "payload.message.at[0] is a UUID" in str(err.value)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda s: s.leases.acquire("session:\x00", "o", 30), "target"),
        (lambda s: s.leases.acquire("session:", "o", 30), "target (its session id)"),
        (lambda s: s.leases.acquire("thread-key:\x00", "o", 30), "target"),
        (lambda s: s.leases.acquire("session:ok", "own\ner", 30), "owner"),
        (lambda s: s.sessions.create("s\x00"), "session_id"),
        (lambda s: s.sessions.create("s\x1b[31m"), "session_id"),
        (lambda s: s.sessions.append("ok", EntryKind.MESSAGE, MSG, entry_id="e\x00"), "entry_id"),
        (lambda s: s.threads.finalize(FinalizeRequest(ThreadRecord("r\x00", "k"))), "record.id"),
        (lambda s: s.threads.finalize(FinalizeRequest(ThreadRecord("r", "k\x7f"))), "record.key"),
        (
            lambda s: s.tools.claim(
                "k\x00",
                "ok",
                local_turn_id="t",
                provider_call_id="c",
                tool_name="x",
                side_effecting=False,
            ),
            "execution_key",
        ),
        (lambda s: s.forks.fork("ok", request_id="f\x00"), "request_id"),
        (lambda s: s.sessions.create("a\u200bb"), "session_id"),
        (lambda s: s.sessions.create("\ufeffs"), "session_id"),
        (lambda s: s.sessions.create("s\u2028"), "session_id"),
        (lambda s: s.sessions.create("   "), "session_id"),
        (lambda s: s.runs.admit("ok", {"q": 1}, submission_key="k\x1b"), "submission_key"),
    ],
)
def test_ids_hold_no_control_characters(store, call, field):
    """A NUL (or any control character) is legal in payload text, never in an id."""
    store.sessions.create("ok")
    with pytest.raises(InvalidInputError) as err:
        call(store)
    assert err.value.field == field
    assert store.sessions.count() == 1 and store.sessions.entries("ok") == []
    assert store.query("SELECT count(*) AS n FROM leases").to_pylist() == [{"n": 0}]


@pytest.mark.parametrize(
    "when",
    [
        datetime(1, 1, 1, 1, tzinfo=timezone(timedelta(hours=5))),  # year 0 in UTC
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),  # year 10000
    ],
)
def test_a_timestamp_outside_the_years_1_to_9999_in_utc_is_refused(store, when):
    """Attack helper: on PostgreSQL such an entry was stored (it holds year 0),
    then every read of the session failed with OverflowError; on DuckDB the
    append raised OverflowError. Both refuse it now, before writing."""
    store.sessions.create("s")
    for call in (
        lambda: store.sessions.append("s", EntryKind.MESSAGE, MSG, timestamp=when),
        lambda: store.sessions.append_many(
            "s", [NewEntry(EntryKind.MESSAGE, MSG, timestamp=when)] * 2
        ),
    ):
        with pytest.raises(InvalidInputError) as err:
            call()
        assert "1 to 9999" in str(err.value)
    assert store.sessions.entries("s") == [] and not store.sessions.replay("s").messages
    store.sessions.append("s", EntryKind.MESSAGE, MSG)


def test_an_import_or_a_clock_outside_the_stored_years_is_refused(store, clock):
    """Attack helper: ``sessions.import_batch`` stored a ``created_at`` of year 0 (or a
    naive one, or a string), and every later listing of the store failed; a
    clock at the end of the year 9999 made a lease's expiry overflow."""
    entry = ImportEntry("e1", None, EntryKind.MESSAGE, datetime(2026, 1, 1, tzinfo=UTC), MSG)
    for created in (
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
        datetime(2026, 1, 1),
        "2026-01-01",
    ):
        with pytest.raises(InvalidInputError) as err:
            store.sessions.import_batch(ImportBatch("imp", "/", created, {}, [entry], "e1"))  # type: ignore[arg-type]
        assert err.value.field == "created_at"
    assert not store.sessions.list().sessions
    clock.now = datetime(9999, 12, 31, 23, 0, tzinfo=UTC)
    with pytest.raises(InvalidInputError) as err:
        store.leases.acquire("t", "o", 3600)
    assert err.value.field == "clock"


def test_nul_in_payload_text_is_stored_exactly(store):
    store.sessions.create("s", cwd="/a\x00b")
    entry = store.sessions.append(
        "s", EntryKind.MESSAGE, {"message": {"role": "user", "content": "\x00"}}
    )
    assert store.sessions.entry("s", entry.id).payload["message"]["content"] == "\x00"
    assert store.sessions.get("s").cwd == "/a\x00b"


INSIDE_A_SESSION = {
    "entries": lambda s, sid="nope": s.sessions.entries(sid),
    "replay": lambda s, sid="nope": s.sessions.replay(sid),
    "labels": lambda s, sid="nope": s.sessions.labels(sid),
    "opaque_records": lambda s, sid="nope": s.sessions.opaque_records(sid),
    "session_runs": lambda s, sid="nope": s.runs.list(sid),
    "active_run": lambda s, sid="nope": s.runs.active(sid),
    "run_events": lambda s, sid="nope": s.runs.events(sid),
    "session_tool_executions": lambda s, sid="nope": s.tools.list(sid),
}
LOOKUPS = {
    "get_session": lambda s: s.sessions.get("nope"),
    "entry": lambda s: s.sessions.entry("ok", "nope"),
    "get_run": lambda s: s.runs.get("nope"),
    "get_recovery": lambda s: s.recovery.get("nope"),
    "get_fork": lambda s: s.forks.get("nope"),
    "get_tool_execution": lambda s: s.tools.get("nope"),
    "get_delivery_plan": lambda s: s.outbox.get_plan("nope"),
    "get_delivery_operation": lambda s: s.outbox.get_operation("nope"),
    "get_response_state": lambda s: s.lineage.get("nope"),
    "resolve": lambda s: s.threads.resolve(id="nope"),
}


@pytest.mark.parametrize("read", sorted(INSIDE_A_SESSION))
def test_a_read_inside_a_missing_session_is_session_not_found(store, read):
    store.sessions.create("ok")
    with pytest.raises(turnkeeper.SessionNotFoundError) as err:
        INSIDE_A_SESSION[read](store)
    assert err.value.session_id == "nope"
    empty = {"active_run": None, "labels": {}, "replay": store.sessions.replay("ok")}
    assert INSIDE_A_SESSION[read](store, "ok") == empty.get(read, [])  # existing, empty


@pytest.mark.parametrize("lookup", sorted(LOOKUPS))
def test_a_lookup_of_a_missing_thing_is_none(store, lookup):
    store.sessions.create("ok")
    assert LOOKUPS[lookup](store) is None


def _recovered_behind_a_stale_worker(store, clock):
    """A worker's run whose lease expired and which recovery then ended: the
    worker still holds its old lease object."""
    store.sessions.create("sw")
    stale = store.leases.acquire("session:sw", "worker", 1, purpose="execution")
    run = store.runs.admit("sw", {"q": 1}, lease=stale)
    clock.advance(2)
    rescue = store.leases.acquire("session:sw", "rec", 30, purpose="recovery")
    store.recovery.begin(run.id, rescue)
    store.recovery.converge(run.id, rescue, error="worker lost")
    store.leases.release(rescue)
    return run, stale


STALE_AFTER_RECOVERY = {
    "start_run": lambda s, run, lease: s.runs.start(run.id, lease=lease),
    "wait_run": lambda s, run, lease: s.runs.wait(run.id, lease=lease),
    "resume_run": lambda s, run, lease: s.runs.resume(run.id, lease=lease),
    "finish_run": lambda s, run, lease: s.runs.finish(run.id, "succeeded", lease=lease),
    "claim_tool_execution": lambda s, run, lease: s.tools.claim(
        f"{run.id}:call-1",
        "sw",
        local_turn_id=run.turn_id,
        provider_call_id="call-1",
        tool_name="read",
        side_effecting=False,
        run_id=run.id,
        lease=lease,
    ),
    "append": lambda s, run, lease: s.sessions.append("sw", EntryKind.MESSAGE, MSG, lease=lease),
}


@pytest.mark.parametrize("call", sorted(STALE_AFTER_RECOVERY))
def test_a_stale_holder_learns_it_lost_whatever_the_run_did_since(store, clock, call):
    """Recovery ended the run behind the worker's back: every fenced write the worker
    then tries reports its lost lease, not the run's new state."""
    run, stale = _recovered_behind_a_stale_worker(store, clock)
    before = [(e.id, e.kind) for e in store.sessions.entries("sw")]
    with pytest.raises(LeaseLostError):
        STALE_AFTER_RECOVERY[call](store, run, stale)
    assert [(e.id, e.kind) for e in store.sessions.entries("sw")] == before
    assert store.runs.get(run.id).status == "interrupted"
