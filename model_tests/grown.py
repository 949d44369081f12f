"""Grow a DuckDB store's tables with copies of its own rows, as other sessions'.

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
from typing import Any

from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind, FinalizeRequest, ThreadRecord

MSG = {"message": {"role": "user", "content": "hi"}}
USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": "done"}

NAMES = re.compile(r"(^id$|_id$|^target$|_digest$|^key$|_key$|^owner$|^lease_owner$|^depends_on$)")
"""The columns whose values name something: rewritten in each copy."""


def grow(store: Any, copies: int) -> dict[str, int]:
    """Copy every table's rows ``copies`` times (see the module docstring), in one
    write; returns each grown table's row count."""

    def body(tx: Any) -> dict[str, int]:
        sizes: dict[str, int] = {}
        tables = tx.rows(
            "SELECT table_name FROM duckdb_tables() WHERE table_name <> 'schema_migrations'"
        )
        for (table,) in tables:
            columns = tx.rows(
                "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? "
                "ORDER BY column_index",
                [table],
            )
            named = [c for c, kind in columns if kind == "VARCHAR" and NAMES.search(c)]
            rewrites = ", ".join(
                f"CASE WHEN {c} IS NULL THEN NULL ELSE "
                f"chr((33 + hash(copy.k, {c}) % 90)::INTEGER) "
                f"|| substr(md5(copy.k::VARCHAR || {c}), 1, 11) || {c} END AS {c}"
                for c in named
            )
            (count,) = tx.one(f"SELECT count(*) FROM {table}")
            if not count:
                continue
            replace = f" REPLACE ({rewrites})" if rewrites else ""
            tx.exec(
                f"INSERT INTO {table} SELECT {table}.*{replace} "
                f"FROM {table}, range(1, {copies + 1}) AS copy (k)"
            )
            sizes[table] = count * (copies + 1)
        return sizes

    sizes: dict[str, int] = store.db.write("grow", body)
    return sizes


def populate(store: Any, n: int) -> None:
    """``n`` other sessions, each a little different: rows in every table the
    hot operations touch, several values in every column."""
    for i in range(n):
        sid = str(uuid.uuid4())
        store.create_session(sid)
        lease = store.acquire_lease(f"session:{sid}", f"w{i}", 60 + i)
        store.append_many(sid, [(EntryKind.MESSAGE, MSG)] * (2 + i), lease=lease)
        run = store.admit_run(
            sid, {"q": i}, submission_key=f"s{i}", user_message=USER, lease=lease, start=i % 2 == 1
        )
        store.claim_tool_execution(
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
                store.start_run(run.id, lease=lease)
            plan = DeliveryPlan("chat", f"t{i}", (DeliveryStep("send", "msg"),))
            status = ("succeeded", "failed")[i % 2]
            store.finish_run(
                run.id, status, assistant_message=REPLY, delivery_plan=plan, lease=lease
            )
            if i % 3 == 0:
                op = store.claim_delivery(f"{run.id}:delivery:send", f"o{i}", 30)
                store.finish_delivery(op.id, f"o{i}", op.lease_epoch, "delivered")
        if i % 2:
            store.release_lease(lease)
        store.finalize(FinalizeRequest(ThreadRecord(f"bgr{i}", f"bgk{i}"), rebind_active=True))
