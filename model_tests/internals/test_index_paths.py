"""Every statement of the hot operations finds its rows through an index, on both backends.

DuckDB reads a table through an index only when the table scan has exactly
one filter, on a column with an index of its own: ``id = ? AND status = ?``,
or a key of two columns, reads every row of the table (see
``storage.backend.keyed``). Such a statement costs more with every other
session's rows, and a store a month old made each turn pay for all of them:
a fenced append's lease check read every lease row (25 ms at a million
lease rows), a session's compare-and-set every session row (17 ms at a
million sessions). A timing would not show it on a small store; DuckDB's
profiler does: it names each table read "Index Scan" or "Sequential Scan".

The reads of a session's many rows are the exception (:data:`SESSION_READS`):
a replay reads the session's entries, a listing its runs. DuckDB fetches a
row through an index at about 25 µs, so for a session of a thousand entries
a scan of a million rows costs less than its index would (measured: 6 ms
against 27 ms), and there these stay scans, each named here with why.

Each hot operation runs here on a store that holds other sessions' rows in
every table, a few written through the API (several values in every column:
with one value only, DuckDB's statistics would drop a filter on it) and
copied to thousands (``grown.py``), the copies' runs ended and their
deliveries made (a store in use: few runs active, few deliveries open, among
all those of the past), and every statement it runs is profiled:
one that reads more than one vector of rows of a table (``VECTOR`` rows: a
join whose other side found nothing stops after one) fails the test.

On PostgreSQL each statement is planned with ``EXPLAIN`` in its
transaction just before it runs, with the store's statistics fresh: a plan that
reads a grown table sequentially fails the test, the reads of a session's
rows included (PostgreSQL's indexes on a session's rows cost less than a
scan). ``storage.backend.keyed`` leaves the key alone in its conjunction,
so a key must have an index of its own there too: the primary key of
``(session_id, id)`` does not serve ``id = ?``.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import BACKENDS, forge, new_pg_schema
from grown import analyze, finish_history, grow, populate
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from test_group_commit import grouped, queued_together

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind, FinalizeRequest, ThreadRecord
from turnkeeper.spec.records import (
    ImportBatch,
    ImportEntry,
    OpaqueRecord,
    ResponseRun,
    ResponseState,
)
from turnkeeper.storage.backend import Dialect
from turnkeeper.storage.duck import db as duck_db
from turnkeeper.storage.duck.group import GROUP_MAX
from turnkeeper.storage.ops import leases, run_lifecycle
from turnkeeper.storage.postgres import db as pg_db
from turnkeeper.storage.postgres.store import PostgresStore

MSG = {"message": {"role": "user", "content": "hi"}}
USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": "done"}
BOUNDARY = ("BEGIN TRANSACTION", "COMMIT", "ROLLBACK")
VECTOR = 2048
"""DuckDB's vector size: a scan reads at least this many rows before it can stop."""
COPIES = 700
"""Copies of the other sessions' rows: every table then holds thousands."""
MERGED = GROUP_MAX
"""Appends queued together for one group commit, as many as one takes (DuckDB
gives a join's scan the list of its keys, which the index takes, only up to
its ``dynamic_or_filter_threshold``, set in ``storage/duck/dialect.py``)."""


_ENTRY = "SELECT session_id, id, parent_id, kind, seq, epoch_us(ts), payload, lease_epoch"
_RUN = (
    "SELECT id, session_id, intent_id, retry_of, attempt, status, cancel_requested, error, "
    "started_at, updated_at, finished_at, usage, context_usage, progress, error_info"
)
_USAGE = (
    "SELECT session_id, id, run_id, entry_id, provider, protocol, model, input_tokens, "
    "output_tokens, cache_read_tokens, cache_write_tokens, total_tokens, cost_usd, duration_ms, "
    "source, recorded_at"
)
_RECORD = (
    "SELECT execution_key, session_id, run_id, local_turn_id, provider, api, response_id, "
    "provider_call_id, tool_kind, tool_name, args_digest, side_effecting, state, result, "
    "is_error, provider_metadata, reason, attempt, lease_epoch, created_at, updated_at, "
    "completed_at"
)


def _lit(text: str) -> str:
    return re.escape(text)


SESSION_READS = {
    _lit(f"{_ENTRY} FROM entries WHERE session_id = ?"): "a replay or a branch read: its entries",
    _lit(f"{_ENTRY} FROM entries WHERE session_id = ? ORDER BY seq"): "entries(): all of them",
    _lit("SELECT id FROM entries WHERE session_id = ?"): "an import: the ids the session has",
    _lit(
        "SELECT parent_id, id FROM entries WHERE session_id = ? "
        "AND parent_id = ANY(?::VARCHAR[]) ORDER BY seq"
    ): (
        "an append with the caller's own id: whether an entry names it as its missing "
        "parent (no index by parent; the store's own result ids check it too)"
    ),
    _lit("SELECT id, seq, written_at, payload FROM entries WHERE session_id = ? AND kind = ?")
    + r"( AND \(strpos\(payload, \?\) > 0( OR strpos\(payload, \?\) > 0)*\))?"
    + _lit(" ORDER BY seq"): "closing open calls: the messages that make their calls",
    _lit(
        "SELECT id, parent_id, kind, seq, ts, payload, role, provider, model FROM entries "
        "WHERE session_id = ? ORDER BY seq"
    ): "a fork: the source session's entries (and their clear facts)",
    _lit("SELECT 1 FROM entries WHERE session_id = ? AND seq = ?"): "a fork at an entry (by seq)",
    _lit(
        "SELECT session_id, seq, id, run_id, edge, source, dest, data, occurred_at "
        "FROM run_events WHERE session_id = ?"
    )
    + r"( AND seq [<>] \?)* ORDER BY seq (ASC|DESC) LIMIT \?": "run_events(): a range of them",
    _lit(f"{_RUN} FROM runs WHERE session_id = ? ORDER BY started_at, attempt, id"): (
        "session_runs()"
    ),
    _lit(f"{_USAGE} FROM usage_records WHERE session_id = ? ORDER BY recorded_at, id"): (
        "usage.list(): a session's usage records"
    ),
    _lit(f"{_RECORD} FROM tool_executions WHERE session_id = ? AND ")
    + r"(TRUE|state = 'running'|provider_call_id = ANY\(\?::VARCHAR\[\]\))"
    + _lit(" ORDER BY created_at, execution_key"): (
        "a session's tool records (all, running, or those of the calls being closed)"
    ),
    _lit(
        "SELECT id, status, end_seq FROM conversation_turns WHERE session_id = ? "
        "AND start_seq <= ? AND (end_seq IS NULL OR end_seq >= ?) ORDER BY start_seq DESC LIMIT 1"
    ): "a fork's turn at an entry",
    _lit("SELECT id, end_seq FROM conversation_turns WHERE session_id = ? AND status IN (")
    + r"\?(, \?)*"
    + _lit(") AND end_seq IS NOT NULL ORDER BY end_seq DESC LIMIT 1"): "a fork's last turn",
    _lit("SELECT line FROM opaque_records WHERE session_id = ?"): "an import: the lines it kept",
    _lit(
        "DELETE FROM opaque_records WHERE session_id = ? AND source = ? "
        "AND line >= ? AND line <> ALL(?::BIGINT[])"
    ): "a re-import: the file's kept lines that now parse",
    _lit(
        "SELECT source, line, raw, reason FROM opaque_records WHERE session_id = ? ORDER BY line"
    ): "opaque_records()",
    _lit("SELECT seq, id, payload FROM entries WHERE session_id = ? AND kind = 'message'")
    + r"( AND seq [<>] \?)? ORDER BY seq (ASC|DESC) LIMIT \?": (
        "message paging (messages_after, _before, _latest): a range of the session's messages"
    ),
    _lit(f"{_ENTRY} FROM entries WHERE session_id = ? AND seq > ? AND seq <= ?"): (
        "path_after, path_latest: the session's entries in a seq range below the leaf"
    ),
    _lit(
        f"{_ENTRY} FROM entries WHERE session_id = ? AND kind = 'custom' AND seq < ? "
        "AND strpos(payload, ?) > 0 ORDER BY seq DESC LIMIT ?"
    ): "custom_entries: a page of the session's custom entries, newest first",
    _lit("SELECT count(*) FROM entries WHERE session_id = ? AND kind = 'message'"): (
        "list_detailed: a listed session's message count"
    ),
    _lit(
        "SELECT id, payload FROM entries WHERE session_id = ? AND CASE WHEN kind = 'message' "
        "AND role = 'user' THEN session_id END IS NOT NULL ORDER BY seq LIMIT 1"
    ): "list_detailed: a listed session's first user message (its preview)",
    _lit(
        f"{_RUN} FROM runs WHERE session_id = ? AND status IN (?, ?, ?) ORDER BY started_at, id"
    ): (
        "execution_facts: the session's non-terminal runs (more than one is an inconsistency "
        "it shows, so not the active_runs row)"
    ),
    _lit("SELECT o.id, o.intent_id, ")
    + ".*"
    + _lit(" FROM delivery_operations o LEFT JOIN delivery_operations d ON d.id = o.depends_on ")
    + ".*": (
        "list_due_deliveries, a poll (no session's read): the status of every delivery "
        "operation, 2 ms beside a million delivered ones (README)"
    ),
}
"""The statements that read a session's rows (its entries, events, runs, tool
records, turns, kept lines) by the session id alone, as scans, and the one
poll that reads a column of a whole table, each as a pattern of the whole
statement → what it reads (DuckDB only: PostgreSQL has an index for each)."""

_SESSION_READS = [re.compile(read) for read in SESSION_READS]


def _session_read(sql: str) -> bool:
    return any(read.fullmatch(sql) for read in _SESSION_READS)


class _Rows:
    """A statement's rows, fetched before the profile is read (DuckDB runs a
    query as its rows are fetched, and profiles it then)."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None


def _table_reads(node: dict[str, Any]) -> Iterator[tuple[str, str, int]]:
    info = node.get("extra_info", {})
    if "Table" in info and "Type" in info:
        yield info["Table"].rsplit(".", 1)[-1], info["Type"], int(node.get("rows_scanned", 0))
    for child in node.get("children", []):
        yield from _table_reads(child)


class Profiler:
    """Records, per operation name, each statement that read more than :data:`VECTOR`
    rows of a table: ``(table, how, rows read, statement)``; on PostgreSQL each
    planned sequential read of a table holding more (rows: its size)."""

    def __init__(self) -> None:
        self.operation = ""
        self.scans: dict[str, list[tuple[str, str, int, str]]] = {}
        self.sizes: dict[str, int] = {}
        """The grown tables' row counts (PostgreSQL: which tables a scan may not read)."""
        self._profiled: dict[int, Any] = {}
        """Each cursor profiled, by id (kept, so that no new cursor takes its id)."""
        self.generic = False
        """PostgreSQL: judge each statement's generic plan (:func:`_generic_plan`)
        instead, every sequential read a finding; a statement run with
        ``replan`` (never prepared: it has no generic plan) only when
        :attr:`replanned_too`."""
        self.replanned_too = False

    def _found(self, table: str, kind: str, read: int, sql: str) -> None:
        self.scans.setdefault(self.operation, []).append((table, kind, read, sql))

    def duck(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def traced(tx: duck_db.Tx, sql: str, params: Any) -> Any:
            cursor = tx.cursor
            if self._profiled.get(id(cursor)) is not cursor:
                with contextlib.redirect_stdout(io.StringIO()):
                    cursor.enable_profiling()
                self._profiled[id(cursor)] = cursor
            rows = _Rows(real(tx, sql, params).fetchall())
            if self.operation and sql not in BOUNDARY:
                text = " ".join(sql.split())
                profile = json.loads(cursor.get_profiling_information())
                for op in profile.get("operator", []):
                    for table, kind, read in _table_reads(op):
                        if read > VECTOR and not _session_read(text):
                            self._found(table, kind, read, text)
            return rows

        return traced

    def postgres(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def traced(tx: pg_db.Tx, sql: str, params: Any, *rest: Any) -> Any:
            planned = self.operation and sql.split(None, 1)[0].upper() in PLANNED
            if planned and self.generic:
                replan = len(rest) > 1 and rest[1]  # (Tx._execute's binary, replan)
                if self.replanned_too or not replan:
                    plan = _generic_plan(tx.conn, sql, list(params))
                    for table in _seq_scans(plan, lookups=True):
                        self._found(table, "Seq Scan (generic plan)", 0, " ".join(sql.split()))
            elif planned:
                explain = f"EXPLAIN (FORMAT JSON) {sql}"
                args = list(params) if params else None
                (plan,) = tx.conn.execute(pg_db._pg(explain) if args else explain, args).fetchone()
                for table in _seq_scans(plan[0]["Plan"]):
                    if self.sizes.get(table, 0) > VECTOR:
                        self._found(table, "Seq Scan", self.sizes[table], " ".join(sql.split()))
            return real(tx, sql, params, *rest)

        return traced

    @contextlib.contextmanager
    def during(self, operation: str) -> Iterator[None]:
        self.operation = operation
        try:
            yield
        finally:
            self.operation = ""


PLANNED = {"SELECT", "INSERT", "UPDATE", "DELETE", "WITH"}
"""The statements PostgreSQL's EXPLAIN plans (the rest read no table)."""


def _generic_plan(conn: Any, sql: str, params: list[Any]) -> dict[str, Any]:
    """The plan PostgreSQL caches for ``sql`` once psycopg has prepared it (its
    fifth run on a connection) and chosen the generic plan: the statement
    prepared with the parameter types psycopg sends (a string's unknown: the
    server infers it, as it does for the store's own run), planned with
    ``plan_cache_mode = force_generic_plan`` (no parameter's value seen), in
    the store's transaction, the setting restored after."""
    transformer = Transformer(conn)
    transformer.dump_sequence(params, [PyFormat.AUTO] * len(params))
    types = list(transformer.types or ())
    idle = conn.info.transaction_status == pq.TransactionStatus.IDLE  # an autocommit statement
    if idle:  # (SET LOCAL outside a transaction sets nothing: EXPLAIN showed a custom plan)
        conn.execute("BEGIN")
    prepared = conn.pgconn.prepare(b"tk_generic_probe", pg_db._numbered(sql).encode(), types)
    if prepared.status != pq.ExecStatus.COMMAND_OK:
        raise AssertionError(f"{prepared.error_message!r}: {sql[:160]}")
    try:
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        (mode,) = conn.execute("SHOW plan_cache_mode").fetchone()
        assert mode == "force_generic_plan", mode
        nulls = ", ".join(["NULL"] * len(params))
        execute = f"EXECUTE tk_generic_probe({nulls})" if params else "EXECUTE tk_generic_probe"
        (plan,) = conn.execute(f"EXPLAIN (FORMAT JSON) {execute}").fetchone()
        conn.execute("SET LOCAL plan_cache_mode = auto")
    finally:
        conn.execute("DEALLOCATE tk_generic_probe")
        if idle:
            conn.execute("ROLLBACK")
    found: dict[str, Any] = plan[0]["Plan"]
    return found


def _seq_scans(node: dict[str, Any], lookups: bool = False) -> Iterator[str]:
    """The tables ``node``'s plan reads sequentially (``lookups``: only where
    it filters what it reads, not a read of the whole table by design)."""
    if node.get("Node Type") == "Seq Scan" and (not lookups or "Filter" in node):
        yield node["Relation Name"]
    for child in node.get("Plans", []):
        yield from _seq_scans(child, lookups)


@pytest.fixture(params=BACKENDS)
def profiled(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[turnkeeper.BaseStore, Profiler]]:
    profiler = Profiler()
    if request.param == "duckdb":
        monkeypatch.setattr(duck_db.Tx, "_execute", profiler.duck(duck_db.Tx._execute))
        where = ":memory:"
    else:
        monkeypatch.setattr(pg_db.Tx, "_execute", profiler.postgres(pg_db.Tx._execute))
        where = new_pg_schema()
    with turnkeeper.open_store(where, replay_cache_bytes=0) as store:
        populate(store, 6)
        own = set(store.query("SELECT id FROM sessions").column(0).to_pylist())
        profiler.sizes = grow(store, COPIES)
        finish_history(store, own)
        analyze(store)
        yield store, profiler


@pytest.fixture
def fresh_postgres(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[turnkeeper.BaseStore, Profiler]]:
    """A new PostgreSQL store as a fleet starts on it: a few sessions written,
    its tables a page or two, never analyzed (autovacuum had no time), each
    hot statement judged by its generic plan (``Profiler.generic``)."""
    profiler = Profiler()
    profiler.generic = True
    monkeypatch.setattr(pg_db.Tx, "_execute", profiler.postgres(pg_db.Tx._execute))
    with turnkeeper.open_store(new_pg_schema(), replay_cache_bytes=0) as store:
        populate(store, 2)
        yield store, profiler


def hot_operations(store: turnkeeper.BaseStore, profiler: Profiler) -> None:
    """What a runtime, its heartbeats, its outbox and recovery workers and its
    readers do on every turn, each under its own name."""
    sid = str(uuid.uuid4())
    on = profiler.during
    with on("create_session"):
        store.sessions.create(sid)
    with on("acquire_lease (grant)"):
        lease = store.leases.acquire(f"session:{sid}", "w", 60, purpose="execution")
    with on("acquire_lease (re-acquire)"):
        store.leases.acquire(f"session:{sid}", "w", 60, purpose="execution")
    with on("renew_lease"):
        store.leases.renew(lease, 60)
    with on("validate_lease"):
        store.leases.validate(lease)
    with on("append (fenced)"):
        store.sessions.append(sid, EntryKind.MESSAGE, MSG, lease=lease)
    with on("append_many (fenced)"):
        store.sessions.append_many(sid, [(EntryKind.MESSAGE, MSG)] * 3, lease=lease)
    if isinstance(store, turnkeeper.DuckDBStore):  # group commit merges appends
        more = (
            store.query(  # long-lived sessions, whose rows lie among all the others
                "SELECT s.id FROM sessions AS s WHERE NOT EXISTS (SELECT 1 FROM leases "
                "WHERE target = 'session:' || s.id) ORDER BY md5(s.id) LIMIT ?",
                [MERGED - 1],
            )
            .column(0)
            .to_pylist()
        )
        with on(f"append (merged: {MERGED} queued together, a group commit)"):
            got = queued_together(
                store,
                [
                    lambda: store.sessions.append(sid, EntryKind.MESSAGE, MSG, lease=lease),
                    *(lambda o=o: store.sessions.append(o, EntryKind.MESSAGE, MSG) for o in more),
                ],
            )
        assert grouped(store, "append") == MERGED, got
    with on("append (its own id)"):
        store.sessions.append(sid, EntryKind.MESSAGE, MSG, lease=lease, entry_id="mine")
    with on("set_label"):
        store.sessions.set_label(sid, "mine", "L", lease=lease)
    with on("branch"):
        store.sessions.branch(sid, "mine", lease=lease)
    with on("admit_run (started, submission key)"):
        run = store.runs.admit(
            sid, {"q": 1}, submission_key="k1", user_message=USER, lease=lease, start=True
        )
    with on("admit_run (the same submission again)"):
        store.runs.admit(
            sid, {"q": 1}, submission_key="k1", user_message=USER, lease=lease, start=True
        )
    with on("claim_tool_execution"):
        store.tools.claim(
            "ek1",
            sid,
            local_turn_id=run.turn_id,
            provider_call_id="c1",
            tool_name="t",
            side_effecting=True,
            run_id=run.id,
            lease=lease,
        )
    with on("complete_tool_execution"):
        store.tools.complete("ek1", {"ok": 1}, lease=lease)
    plan = DeliveryPlan(
        "chat", "t", (DeliveryStep("upload", "f"), DeliveryStep("send", "m", depends_on="upload"))
    )
    with on("finish_run (entries, reply, plan)"):
        store.runs.finish(
            run.id,
            "succeeded",
            entries=[(EntryKind.MESSAGE, MSG)],
            assistant_message=REPLY,
            delivery_plan=plan,
            lease=lease,
        )
    for name, read in {
        "replay": lambda: store.sessions.replay(sid),
        "entry": lambda: store.sessions.entry(sid, "mine"),
        "labels": lambda: store.sessions.labels(sid),
        "get_session": lambda: store.sessions.get(sid),
        "get_run": lambda: store.runs.get(run.id),
        "active_run": lambda: store.runs.active(sid),
        "run_events (after a seq)": lambda: store.runs.events(sid, after=1),
        "get_delivery_plan": lambda: store.outbox.get_plan(f"{run.id}:delivery"),
        "get_response_state": lambda: store.lineage.get(sid),
        "get_tool_execution": lambda: store.tools.get("ek1"),
        "list_orphaned_runs": store.recovery.list_orphans,
        "list_due_deliveries": store.outbox.list_due,
    }.items():
        with on(name):
            read()
    op_id = f"{run.id}:delivery:upload"
    with on("claim_delivery"):
        op = store.outbox.claim(op_id, "ow", 60)
    with on("update_delivery_progress"):
        store.outbox.update_progress(op_id, "ow", op.lease_epoch)
    with on("requeue_delivery"):
        store.outbox.requeue(op_id, "ow", op.lease_epoch)
    with on("claim_delivery (a requeued one)"):
        op = store.outbox.claim(op_id, "ow", 60)
    with on("finish_delivery"):
        store.outbox.finish(op_id, "ow", op.lease_epoch, "delivered")
    with on("admit_run"):
        second = store.runs.admit(sid, {"q": 2}, lease=lease)
    with on("start_run"):
        store.runs.start(second.id, lease=lease)
    with on("request_cancel"):
        store.runs.request_cancel(second.id)
    with on("release_lease"):
        store.leases.release(lease)
    with on("acquire_lease (regrant)"):
        recovery = store.leases.acquire(f"session:{sid}", "r", 60, purpose="recovery")
    with on("begin_recovery"):
        store.recovery.begin(second.id, recovery)
    with on("converge_recovery"):
        store.recovery.converge(second.id, recovery)
    with on("release_lease (recovery)"):
        store.leases.release(recovery)
    with on("finalize"):
        store.threads.finalize(FinalizeRequest(ThreadRecord("r1", "k1"), rebind_active=True))
    with on("finalize (archive and rebind)"):
        store.threads.finalize(
            FinalizeRequest(
                ThreadRecord("r2", "k1"), previous_id="r1", archive_old=True, rebind_active=True
            )
        )
    with on("resolve"):
        store.threads.resolve(key="k1")
    rarer_operations(store, profiler, sid)
    listing_operations(store, profiler, sid)


def listing_operations(store: turnkeeper.BaseStore, profiler: Profiler, sid: str) -> None:
    """Resume and listing (issue 18): opening by id or prefix, a directory's
    sessions, sub-agents, message paging, the getters and the execution facts.
    The sessions here have a working directory of their own (every other
    session's is ``""``) and ids whose first 8 characters no other's has."""
    on = profiler.during
    cwd = f"/work/{uuid.uuid4()}"
    mine = f"{uuid.uuid4().hex[:8]}-listing"
    with on("continue_recent (creates)"):
        store.sessions.continue_recent(cwd)
    store.sessions.create(mine, cwd=cwd)
    store.sessions.append(mine, EntryKind.MESSAGE, MSG)
    store.sessions.append(mine, EntryKind.CUSTOM, {"customType": "cp"}, entry_id="ck")
    with on("continue_recent"):
        store.sessions.continue_recent(cwd)
    with on("open (whole id)"):
        store.sessions.open(sid)
    with on("open (a prefix)"):
        store.sessions.open(mine[:10])
    with on("open (a prefix, in a directory)"):
        store.sessions.open(mine[:10], cwd=cwd)
    with on("new_sub_agent"):
        store.sessions.new_sub_agent(mine)
    with on("sub_agents"):
        store.sessions.sub_agents(mine)
    with on("list (a directory)"):
        store.sessions.list(cwd=cwd)
    with on("list (a directory, idle, with sub-agents)"):
        store.sessions.list(cwd=cwd, status="idle", include_sub_agents=True)
    with on("count (a directory)"):
        store.sessions.count(cwd=cwd)
    with on("list_detailed (a directory)"):
        store.sessions.list_detailed(cwd=cwd)
    for name, read in {
        "messages_after": lambda: store.sessions.messages_after(sid, 1, limit=2),
        "messages_before": lambda: store.sessions.messages_before(sid, 5, limit=2),
        "messages_latest": lambda: store.sessions.messages_latest(sid, limit=2),
        "messages_with_seq": lambda: store.sessions.messages_with_seq(sid),
        "latest": lambda: store.sessions.latest(sid, EntryKind.COMPACTION),
        "header": lambda: store.sessions.header(sid),
        "execution_facts": lambda: store.sessions.execution_facts(sid),
        "path_after": lambda: store.sessions.path_after(sid, 2, limit=3),
        "path_latest": lambda: store.sessions.path_latest(sid, 3),
        "custom_entry": lambda: store.sessions.custom_entry(mine, "cp", "ck"),
        "custom_entries": lambda: store.sessions.custom_entries(mine, "cp", limit=2),
    }.items():
        with on(name):
            read()


def rarer_operations(store: turnkeeper.BaseStore, profiler: Profiler, sid: str) -> None:
    """Every other operation on one session or target (the same rule holds for
    each: it must not read other sessions' rows)."""
    on = profiler.during
    with on("acquire_lease (another owner)"):
        lease = store.leases.acquire(f"session:{sid}", "w2", 60, purpose="execution")
    with on("branch_with_summary"):
        store.sessions.branch_with_summary(sid, "mine", "went back", lease=lease)
    with on("entries"):
        store.sessions.entries(sid)
    with on("session_runs"):
        runs = store.runs.list(sid)
    with on("admit_run (a retry)"):
        retry = store.runs.admit(sid, {"q": 2}, retry_of=runs[-1].id, lease=lease, start=True)
    with on("wait_run"):
        store.runs.wait(retry.id, lease=lease)
    with on("resume_run"):
        store.runs.resume(retry.id, lease=lease)
    blocks = [{"type": "toolCall", "id": c, "name": "t", "arguments": {}} for c in ("c2", "c3")]
    with on("append (tool calls)"):
        store.sessions.append(
            sid,
            EntryKind.MESSAGE,
            {"message": {"role": "assistant", "content": blocks}},
            lease=lease,
        )
    with on("claim_tool_execution (a second)"):
        store.tools.claim(
            "ek2",
            sid,
            local_turn_id=retry.turn_id,
            provider_call_id="c2",
            tool_name="t",
            side_effecting=True,
            run_id=retry.id,
            lease=lease,
        )
    with on("interrupt_tool_executions (closes the open calls c2 and c3)"):
        store.tools.interrupt(sid, local_turn_id=retry.turn_id, lease=lease)
    with on("request_tool_execution_recovery"):
        store.tools.request_recovery(sid, retry.turn_id, ["c2"])
    with on("reclaim_tool_execution"):
        store.tools.reclaim("ek2", run_id=retry.id, lease=lease)
    with on("session_tool_executions"):
        store.tools.list(sid)
    with on("abandon_interrupted_tool_executions"):
        store.tools.abandon_interrupted(sid, retry.turn_id, lease=lease)
    with on("finish_run (failed)"):
        store.runs.finish(retry.id, "failed", error="boom", lease=lease)
    with on("annotate_run_error"):
        store.runs.annotate_error(runs[1].id, "late reason", lease=lease)
    with on("update_run_usage"):
        store.runs.update_usage(retry.id, {"input": 3}, {"tokens": 3}, lease=lease)
    with on("update_run_progress"):
        store.runs.update_progress(retry.id, {}, lease=lease)
    with on("update_run_error_info"):
        store.runs.update_error_info(retry.id, {"code": "boom"}, lease=lease)
    with on("record_usage"):
        store.usage.record(sid, provider="p", model="m", usage_id="u1", lease=lease)
    with on("record_usage (a retry)"):
        store.usage.record(sid, provider="p", model="m", usage_id="u1", lease=lease)
    with on("record_usage_from_provider (of an entry)"):
        store.usage.record_from_provider(
            sid,
            {"input_tokens": 1, "output_tokens": 2},
            provider="p",
            model="m",
            entry_id="mine",
            lease=lease,
        )
    with on("get_usage"):
        store.usage.get(sid, "u1")
    with on("list_usage"):
        store.usage.list(sid)
    with on("compare_and_swap_response_state (first)"):
        store.lineage.compare_and_swap(ResponseState(sid, provider="p"), 0, lease=lease)
    with on("compare_and_swap_response_state"):
        store.lineage.compare_and_swap(ResponseState(sid, provider="q"), 1, lease=lease)
    with on("import_batch (into the session)"):
        store.sessions.import_batch(
            ImportBatch(
                sid,
                "",
                datetime.now(UTC),
                {},
                [ImportEntry("imported", None, EntryKind.MESSAGE, datetime.now(UTC), MSG)],
                "imported",
                (OpaqueRecord("f.jsonl", 3, "{", "truncated"),),
                "f.jsonl",
            ),
            lease=lease,
        )
    with on("opaque_records"):
        store.sessions.opaque_records(sid)
    with on("release_lease (before a fork)"):
        store.leases.release(lease)
    for name, boundary in {
        "fork_session (the last turn)": {},
        "fork_session (a turn)": {"boundary_turn_id": runs[0].turn_id},
        "fork_session (an entry)": {"at_seq": store.sessions.entry(sid, runs[0].user_entry_id).seq},
    }.items():
        with on(name):
            store.forks.fork(sid, request_id=name, **boundary)
    with on("get_fork"):
        store.forks.get("fork_session (a turn)")
    orphan = store.runs.admit(sid, {"q": 3})
    recovery = store.leases.acquire(f"session:{sid}", "r2", 60, purpose="recovery")
    with on("begin_recovery (again)"):
        store.recovery.begin(orphan.id, recovery)
    with on("fail_recovery"):
        store.recovery.fail(orphan.id, recovery, "no luck", base_delay_s=0.001)
    with on("get_recovery"):
        store.recovery.get(orphan.id)
    time.sleep(0.01)  # the retry is due after 1 ms
    with on("begin_recovery (a retry)"):
        store.recovery.begin(orphan.id, recovery)
    with on("save_response_run"):
        store.archives.save_run(
            ResponseRun(sid, "bg", "openai", "responses", "queued", orphan.id, response_id="r"),
            lease=recovery,
        )
    with on("detach_recovery"):
        store.recovery.detach(orphan.id, recovery)
    reply = store.sessions.path_latest(sid, 1)[0].id
    steps = (DeliveryStep("upload", "f"), DeliveryStep("send", "m", entry_id=reply))
    with on("create_delivery_plan"):
        store.outbox.create_plan(runs[1].id, DeliveryPlan("chat", "t", steps), lease=recovery)
    with on("get_delivery_operation"):
        store.outbox.get_operation(f"{runs[1].id}:delivery:upload")
    with on("delivered_entry"):
        assert store.outbox.delivered_entry(f"{runs[1].id}:delivery:send") is not None


def _report(scans: dict[str, list[tuple[str, str, int, str]]]) -> str:
    lines = []
    for operation, found in scans.items():
        for table, kind, read, sql in dict.fromkeys(found):
            lines.append(f"{operation}: {kind} read {read} rows of {table}: {sql[:160]}")
    return "\n".join(lines)


def test_every_hot_statement_reads_through_an_index(profiled):
    store, profiler = profiled
    hot_operations(store, profiler)
    assert not profiler.scans, "\n" + _report(profiler.scans)


@pytest.mark.postgres
def test_no_hot_statement_caches_a_generic_plan_that_scans(fresh_postgres):
    """PostgreSQL: psycopg prepares a statement on its fifth run on a
    connection, and the server soon caches a *generic* plan for it, made for
    the tables as they are then and kept until their statistics change
    (autovacuum's ANALYZE). Made on a new store's tables of a page or two, a
    plan that reads one sequentially kept doing so as it grew: the finish's
    read (is an entry's id the reply's or the turn end's, ``e.id IN (?, ?)``)
    went from 0.9 to 7.4 ms over 2,200 turns of one session on a new store,
    until an ANALYZE. Every hot statement's generic plan here, on a new store,
    reads each table through an index, but for the lookups whose best plan
    depends on their values, which are never prepared (``Tx.rows(...,
    replan=True)``: :data:`REPLANNED`)."""
    store, profiler = fresh_postgres
    hot_operations(store, profiler)
    assert not profiler.scans, "\n" + _report(profiler.scans)


REPLANNED = {
    ("list_due_deliveries", "delivery_operations"): "its OR of two states, each with "
    "a time bound, ordered and limited",
    ("interrupt_tool_executions (closes the open calls c2 and c3)", "conversation_turns"): (
        "a session's rows by a list of ids (``id = ANY(?)``, keyed by ``storage.backend.keyed``)"
    ),
    ("interrupt_tool_executions (closes the open calls c2 and c3)", "entries"): (
        "a session's rows by a list of ids (as above)"
    ),
    ("import_batch (into the session)", "entries"): "a session's rows by a list of ids (as above)",
}
"""The hot statements run with ``replan`` (planned for their values on every
run), each with why its generic plan on a new store reads the table: without
statistics PostgreSQL guesses that a list of ids, or each of two states,
matches many rows. A list of ids keyed as DuckDB needs (one filter on the
key, ``storage.backend.keyed``) hides the session's part of the primary key
from PostgreSQL; a lookup per id, as the finish's read makes, has no list to
guess at."""


@pytest.mark.postgres
def test_control_a_scanning_generic_plan_is_reported(fresh_postgres, monkeypatch):
    """Control: the finish's read as it was (``e.id IN (?, ?)``) is reported,
    and so is each statement run with ``replan``, judged as if prepared: each
    needs it."""
    store, profiler = fresh_postgres
    real = Dialect.any_row

    def one_list(self: Dialect, table: str, column: str, n: int) -> str:
        return real(Dialect("duckdb"), table, column, n)  # IN (?, ?) on PostgreSQL too

    monkeypatch.setattr(Dialect, "any_row", one_list)
    profiler.replanned_too = True
    run_lifecycle._run_head_turn_sql.cache_clear()  # (made once per dialect)
    try:
        hot_operations(store, profiler)
    finally:
        run_lifecycle._run_head_turn_sql.cache_clear()
    found = {(op, table) for op, scans in profiler.scans.items() for table, *_ in scans}
    assert found == set(REPLANNED) | {
        ("finish_run (entries, reply, plan)", "entries"),
        ("finish_run (failed)", "entries"),
    }


@pytest.mark.postgres
@pytest.mark.parametrize("replan", [False, True])
def test_a_replanned_statement_is_never_prepared(replan):
    """``Tx.rows(..., replan=True)`` on PostgreSQL: run eight times on one
    connection, as the first statement of its transaction (sent in one round
    trip with its BEGIN) and as a later one, the statement is never prepared
    (psycopg prepares one on its fifth run: the control, without
    ``replan``, is, either way)."""
    first = "SELECT id FROM entries WHERE id = ANY(?::VARCHAR[]) AND session_id = ?"
    later = "SELECT seq FROM entries WHERE id = ANY(?::VARCHAR[]) AND session_id = ?"

    def body(tx: Any) -> None:
        tx.rows(first, [["a", "b"], "s"], replan=replan)
        tx.rows(later, [["a", "b"], "s"], replan=replan)

    def prepared(tx: Any) -> list[str]:
        return [
            r[0]
            for r in tx.rows("SELECT statement FROM pg_prepared_statements")
            if "FROM entries WHERE id = ANY" in r[0]
        ]

    with PostgresStore(new_pg_schema(), pool_size=1) as store:  # one connection
        if store.pooler == "transaction":
            pytest.skip("behind a transaction pooler the store prepares no statement")
        for _ in range(8):
            store.db.read("probe", body, snapshot=True)  # BEGIN sent with the first
        found = store.db.read("prepared", prepared)
    assert len(found) == (0 if replan else 2), found


def test_control_a_compare_and_set_without_its_guard_is_seen_scanning(profiled, monkeypatch):
    """Control: on DuckDB, the lease fence written as a plain conjunction (the
    condition DuckDB splits into one filter per column) is reported, for every
    fenced operation; on PostgreSQL, where the planner takes either form, a
    lookup whose index is dropped (an entry by id, a submission by key) is."""
    store, profiler = profiled
    if isinstance(store, turnkeeper.DuckDBStore):

        def unguarded(key: str, conditions: str, value: str = "?") -> str:
            return f"{key} = {value} AND {conditions}"

        monkeypatch.setattr(leases, "keyed", unguarded)
        hot_operations(store, profiler)
        fenced = {
            op
            for op, found in profiler.scans.items()
            if any(table == "leases" and "token_digest" in sql for table, _, _, sql in found)
        }
        assert {"append (fenced)", "validate_lease", "renew_lease", "release_lease"} <= fenced
        return
    forge(store, "DROP INDEX entries_by_id", rows=None)
    forge(store, "DROP INDEX submissions_by_key", rows=None)
    hot_operations(store, profiler)
    found = {(op, table) for op, scans in profiler.scans.items() for table, *_ in scans}
    assert {
        ("entry", "entries"),
        ("append (its own id)", "entries"),
        ("admit_run (started, submission key)", "submissions"),
    } <= found
    assert {table for _, table in found} == {"entries", "submissions"}
