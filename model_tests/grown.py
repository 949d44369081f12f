"""Grow a store's tables with copies of its own rows, as other sessions'.

Each table's rows are copied ``copies`` times; in copy ``k`` every value of a
column that names something (an id, a key, a target, an owner, a digest) is
prefixed with a character from ``!`` to ``z`` and 11 hex digits, derived from
``k`` and the value, so the copies' keys are unique, spread over the whole
range of ordinary ids and names (DuckDB's per-block min/max cannot skip a
block when a statement looks for another key or owner), and consistent
within one copy (a run's ``session_id`` is its copy's session).
Every other column keeps the originals' values, so a statement's conditions
on them match copies too and no block can be skipped for them either.
:func:`populate` writes the rows to copy, through the API. Used by
``test_index_paths.py`` and ``reports/bench.py`` (a big store's costs).
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind, FinalizeRequest, ThreadRecord
from turnkeeper.spec.records import ImportBatch, ImportedSource, ImportEntry, OpaqueRecord

MSG = {"message": {"role": "user", "content": "hi"}}
USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": "done"}

NAMES = re.compile(r"(^id$|_id$|^target$|_digest$|^key$|_key$|^owner$|^lease_owner$|^depends_on$)")
"""The columns whose values name something: rewritten in each copy."""


def grow(store: Any, copies: int) -> dict[str, int]:
    """Copy every table's rows ``copies`` times (see the module docstring), in one
    write, on either backend (PostgreSQL's statistics are then refreshed, so its
    planner knows the tables' sizes); returns each grown table's row count."""

    def body(tx: Any) -> dict[str, int]:
        on_duck = tx.dialect.name == "duckdb"
        series = f"range(1, {copies + 1})" if on_duck else f"generate_series(1, {copies})"
        sizes: dict[str, int] = {}
        for table, columns in _columns(tx).items():
            named = {c for c, kind in columns if kind in _VARCHAR and NAMES.search(c)}
            (count,) = tx.one(f"SELECT count(*) FROM {table}")
            if not count:
                continue
            spread = "hash(copy.k, {c}) % 90" if on_duck else "abs(hashtext(copy.k || {c})) % 90"
            rewrites = {
                c: f"CASE WHEN {c} IS NULL THEN NULL ELSE "
                f"chr((33 + {spread.format(c=c)})::INTEGER) "
                f"|| substr(md5(copy.k::VARCHAR || {c}), 1, 11) || {c} END"
                for c in named
            }
            values = ", ".join(rewrites.get(c, f"{table}.{c}") for c, _ in columns)
            tx.exec(f"INSERT INTO {table} SELECT {values} FROM {table}, {series} AS copy (k)")
            sizes[table] = count * (copies + 1)
        if not on_duck:
            _analyze(tx)
        return sizes

    sizes: dict[str, int] = store.db.write("grow", body)
    return sizes


_VARCHAR = ("VARCHAR", "character varying", "text")


def analyze(store: Any) -> None:
    """Refresh PostgreSQL's statistics of the store's own tables (DuckDB keeps none
    to refresh)."""
    if store.db.dialect.name != "duckdb":
        store.db.write("analyze", _analyze)


def _analyze(tx: Any) -> None:
    # One ANALYZE per table of the store's schema: a bare ANALYZE analyzes every
    # table of the database, each test's schema too, and locks each till COMMIT:
    # past max_locks_per_transaction x max_connections, "out of shared memory".
    for table in _columns(tx):
        tx.exec(f"ANALYZE {table}")


def _columns(tx: Any) -> dict[str, list[tuple[str, str]]]:
    """Each table's columns in order, ``(name, type)``, but the migrations' own."""
    if tx.dialect.name == "duckdb":
        rows = tx.rows(
            "SELECT c.table_name, c.column_name, c.data_type FROM duckdb_columns() c "
            "JOIN duckdb_tables() t ON t.table_oid = c.table_oid "
            "WHERE t.schema_name = current_schema() AND NOT t.temporary "
            "AND c.table_name <> 'schema_migrations' ORDER BY c.table_name, c.column_index"
        )
    else:
        rows = tx.rows(
            "SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c "
            "JOIN information_schema.tables t ON t.table_schema = c.table_schema "
            "AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE' "
            "WHERE c.table_schema = current_schema() AND c.table_name <> 'schema_migrations' "
            "ORDER BY c.table_name, c.ordinal_position"
        )
    tables: dict[str, list[tuple[str, str]]] = {}
    for table, column, kind in rows:
        tables.setdefault(table, []).append((column, kind))
    return tables


def populate(store: Any, n: int) -> None:
    """``n`` other sessions, each a little different: rows in every table the
    hot operations touch, several values in every column."""
    for i in range(n):
        sid = str(uuid.uuid4())
        store.sessions.create(sid)
        lease = store.leases.acquire(f"session:{sid}", f"w{i}", 60 + i, purpose="execution")
        store.sessions.append_many(sid, [(EntryKind.MESSAGE, MSG)] * (2 + i), lease=lease)
        run = store.runs.admit(
            sid, {"q": i}, submission_key=f"s{i}", user_message=USER, lease=lease, start=i % 2 == 1
        )
        store.tools.claim(
            f"bg{i}",
            sid,
            local_turn_id=run.turn_id,
            provider_call_id=f"c{i}",
            tool_name="t",
            side_effecting=i % 2 == 1,
            run_id=run.id,
            lease=lease,
        )
        if i % 3 != 2:
            if i % 2 == 0:
                store.runs.start(run.id, lease=lease)
            plan = DeliveryPlan("chat", f"t{i}", (DeliveryStep("send", "msg"),))
            status = ("succeeded", "failed")[i % 2]
            store.runs.finish(
                run.id, status, assistant_message=REPLY, delivery_plan=plan, lease=lease
            )
            if i % 3 == 0:
                op = store.outbox.claim(f"{run.id}:delivery:send", f"o{i}", 30)
                store.outbox.finish(op.id, f"o{i}", op.lease_epoch, "delivered")
        store.usage.record(  # a runtime's usage record per request
            sid, provider=f"p{i}", model=f"m{i}", input_tokens=i, run_id=run.id, lease=lease
        )
        store.runs.update_usage(run.id, {"input": i}, lease=lease)
        if i % 2:
            store.leases.release(lease)
        store.threads.finalize(
            FinalizeRequest(ThreadRecord(f"bgr{i}", f"bgk{i}"), rebind_active=True)
        )
        now = datetime.now(UTC)
        store.sessions.import_batch(  # a session file with lines that did not parse
            ImportBatch(
                str(uuid.uuid4()),
                "",
                now,
                {},
                [ImportEntry(f"imp{i}", None, EntryKind.MESSAGE, now, MSG)],
                f"imp{i}",
                tuple(OpaqueRecord(f"f{i}.jsonl", n, "{", "truncated") for n in (2, 3 + i)),
                f"f{i}.jsonl",
                read=ImportedSource(f"/w/f{i}.jsonl", 100 + i, f"{i:064x}", 1),
            )
        )


def finish_history(store: Any, keep: set[str]) -> None:
    """End every run but those of sessions ``keep`` and deliver their outbox:
    the history of a store in use, whose other sessions' turns are over (few
    runs active, few deliveries open, among all those of the past)."""
    from conftest import forged_rows

    ended = forged_rows(
        store,
        "UPDATE runs SET status = 'succeeded', finished_at = updated_at "
        "WHERE finished_at IS NULL AND NOT (session_id = ANY(?::VARCHAR[]))",
        [sorted(keep)],
    )
    unlisted = forged_rows(
        store,
        "DELETE FROM active_runs WHERE NOT (session_id = ANY(?::VARCHAR[]))",
        [sorted(keep)],
    )
    delivered = forged_rows(
        store,
        "UPDATE delivery_operations SET status = 'delivered', provider_message_id = 'm' "
        "WHERE status NOT IN ('delivered', 'unsupported', 'failed', 'uncertain') AND NOT "
        "(intent_id IN (SELECT id FROM delivery_intents WHERE session_id = ANY(?::VARCHAR[])))",
        [sorted(keep)],
    )
    # every run ended was active, once; a grown store has both to finish
    assert ended == unlisted > 0 and delivered > 0, (ended, unlisted, delivered)
