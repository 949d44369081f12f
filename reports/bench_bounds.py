"""The engine's bounds: what the least conceivable append and turn cost on a
backend, timed like every other row (a ratio to the same floor, interleaved).

A bound is raw SQL on a connection of its own, with no store code at all: a
lease read where the operation is fenced, then the least rows the operation
must write, one single-row statement per table, each table keyed like the
store's (a primary key and a ``(session_id, seq)`` key), inside the
transactions the operation needs. No implementation of the operation on
this engine can cost less, so a goal below its bound cannot be met by
changing turnkeeper, only by changing the engine or what is stored:

- an append stores its entry (one keyed row) and commits;
- the 3-transaction turn writes, after one lease read in each transaction,
  7 rows (admit and start: the intent, the run, its active-run mapping, the
  conversation turn, the user's entry, the session's leaf and cursors, the run
  events), then 2 (the turn's entries, the leaf), then 9 (the run's end, the
  mapping's removal, the turn's end, the last entries, the leaf, the run
  event, the delivery intent, its operation, its event): :data:`TURN_WRITES`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

TURN_WRITES = (7, 2, 9)
"""Single-row writes in each transaction of the least 3-transaction turn."""

TABLES = max(TURN_WRITES)
PAYLOAD = "x" * 200
"""An entry's payload size in the store's rows (``bench.MSG``'s text)."""

APPEND = "least append: one keyed row in a transaction"
FENCED = "least fenced append: a lease read, one keyed row, in a transaction"
TURN = "least turn: 3 transactions, a lease read and 7, 2, 9 rows (one per table)"

Execute = Callable[[str, list[Any]], Any]
"""Runs one statement with ``?`` placeholders on the bound's connection."""


def schema(execute: Execute) -> None:
    """The bound's tables, on a database (or schema) of their own."""
    execute(
        "CREATE TABLE bound_leases (target VARCHAR PRIMARY KEY, owner VARCHAR NOT NULL, "
        "token_digest VARCHAR NOT NULL, epoch BIGINT NOT NULL, state VARCHAR NOT NULL, "
        "expires_at TIMESTAMPTZ NOT NULL)",
        [],
    )
    expires = datetime.now(UTC) + timedelta(days=1)
    execute(
        "INSERT INTO bound_leases VALUES ('session:b', 'bench', 'digest', 1, 'held', ?)",
        [expires],
    )
    for i in range(TABLES):
        execute(
            f"CREATE TABLE bound_{i} (id VARCHAR PRIMARY KEY, session_id VARCHAR NOT NULL, "
            "seq BIGINT NOT NULL, payload VARCHAR NOT NULL, written_at TIMESTAMPTZ NOT NULL, "
            "UNIQUE (session_id, seq))",
            [],
        )


def bounds(execute: Execute, begin: str) -> dict[str, Callable[[], float]]:
    """The bound rows (name → one timed call, as ``bench.timed`` makes them) on a
    connection whose :func:`schema` exists; ``begin`` opens a transaction."""
    seq = [0]

    def row(table: int) -> None:
        seq[0] += 1
        execute(
            f"INSERT INTO bound_{table} VALUES (?, 'b', ?, ?, ?)",
            [uuid.uuid4().hex, seq[0], PAYLOAD, datetime.now(UTC)],
        )

    def lease() -> None:
        found = execute(
            "SELECT epoch FROM bound_leases WHERE target = 'session:b' AND owner = 'bench' "
            "AND token_digest = 'digest' AND epoch = 1 AND state = 'held' AND expires_at > ?",
            [datetime.now(UTC)],
        )
        if found != [(1,)]:
            raise AssertionError(f"the bound's lease read found {found!r}")

    def transaction(fenced: bool, rows: int) -> None:
        execute(begin, [])
        if fenced:
            lease()
        for table in range(rows):
            row(table)
        execute("COMMIT", [])

    def timed(fn: Callable[[], None]) -> Callable[[], float]:
        def op() -> float:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start

        return op

    def turn() -> None:
        for rows in TURN_WRITES:
            transaction(True, rows)

    return {
        APPEND: timed(lambda: transaction(False, 1)),
        FENCED: timed(lambda: transaction(True, 1)),
        TURN: timed(turn),
    }


def duckdb_bounds(folder: str) -> dict[str, Callable[[], float]]:
    """:func:`bounds` on a durable DuckDB file of their own in ``folder``."""
    import duckdb

    con = duckdb.connect(f"{folder}/bounds.duckdb")
    con.execute("SET TimeZone = 'UTC'")

    def execute(sql: str, params: list[Any]) -> Any:
        cur = con.execute(sql, params)
        return cur.fetchall() if sql.startswith("SELECT") else None

    schema(execute)
    return bounds(execute, "BEGIN TRANSACTION")


def postgres_bounds(url: str) -> dict[str, Callable[[], float]]:
    """:func:`bounds` on the PostgreSQL schema ``url`` names (one connection)."""
    import psycopg

    con = psycopg.connect(url, autocommit=True)

    def execute(sql: str, params: list[Any]) -> Any:
        cur = con.execute(sql.replace("?", "%s"), params)
        return cur.fetchall() if sql.startswith("SELECT") else None

    schema(execute)
    return bounds(execute, "BEGIN ISOLATION LEVEL REPEATABLE READ")
