"""What ``store.query()`` accepts on DuckDB: one read over the store's tables.

The first of three defences (the others are in :mod:`.db`: the query runs in
a transaction that is always rolled back, on a connection that cannot reach
files, extensions, secrets, the environment or Python objects). Here the SQL
is parsed, not pattern-matched:

- exactly one statement, of type ``SELECT``, or ``EXPLAIN [ANALYZE]`` of one
  (``EXPLAIN ANALYZE`` runs its statement, so what it explains must be a read);
- DuckDB's own parse tree (``json_serialize_sql``) of that ``SELECT`` holds
  only query nodes that read: a ``DELETE``, ``UPDATE``, ``INSERT`` or any
  other node inside a CTE or subquery is refused, and so is ``query(…)``,
  which runs SQL from a string the tree cannot see into, and every function
  whose effect outlives the query (:data:`EFFECT_FUNCTIONS`: a checkpoint
  writes the file, a seed persists; the rollback undoes neither).
"""

from __future__ import annotations

from typing import Any

import duckdb
import orjson

from turnkeeper.spec import errors

READ_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
"""Query-node types of DuckDB's parse tree that only read."""


SQL_RUNNING_FUNCTIONS = frozenset({"query"})
"""Functions that run SQL given as a string, which the parse tree cannot see into."""

EFFECT_FUNCTIONS = frozenset(
    {
        "checkpoint",
        "force_checkpoint",
        "truncate_duckdb_logs",
        "setseed",
        "nextval",
        "enable_logging",
        "disable_logging",
        "enable_profiling",
        "disable_profiling",
    }
)
"""Functions whose effect outlives the query (a checkpoint writes the file, a
seed or a sequence persists): a rolled-back transaction does not undo them."""


def _nodes(tree: Any) -> set[str]:
    """Every query-node type (a ``type`` ending ``_NODE``) in a serialized parse
    tree, and ``FUNCTION <name>`` for each call of a SQL-running function."""
    found: set[str] = set()
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            kind = item.get("type")
            if isinstance(kind, str) and kind.endswith("_NODE"):
                found.add(kind)
            name = item.get("function_name")
            if isinstance(name, str) and name.lower() in SQL_RUNNING_FUNCTIONS | EFFECT_FUNCTIONS:
                found.add(f"FUNCTION {name.lower()}()")
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _explained(cursor: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The statement an ``EXPLAIN [ANALYZE] [(options)]`` statement explains."""
    tokens = [t for t in duckdb.tokenize(sql) if t[1] != duckdb.token_type.comment]
    offsets = [t[0] for t in tokens]
    words = [
        sql[a:b].strip().upper() for a, b in zip(offsets, [*offsets[1:], len(sql)], strict=True)
    ]
    i = 1  # tokens[0] is EXPLAIN
    if i < len(words) and words[i] == "(":
        depth = 0
        while i < len(words):
            depth += words[i].count("(") - words[i].count(")")
            i += 1
            if depth <= 0:
                break
    if i < len(words) and words[i] == "ANALYZE":
        i += 1
    if i >= len(tokens):
        raise errors.InvalidInputError("sql", "EXPLAIN of nothing")
    return sql[tokens[i][0] :]


def check_read(cursor: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse ``sql`` unless it is one read (see the module docstring).

    Raises:
        InvalidInputError: ``field="sql"``, for anything else or SQL DuckDB
            cannot parse; nothing has been run.
    """
    try:
        parsed = cursor.extract_statements(sql)
        kinds = [s.type for s in parsed]
    except (duckdb.Error, ValueError) as exc:  # ValueError: a kind Python's enum lacks
        raise errors.InvalidInputError("sql", f"cannot parse: {exc}") from None
    if kinds == [duckdb.StatementType.EXPLAIN]:
        inner = _explained(cursor, parsed[0].query)
        check_read(cursor, inner)
        return
    if kinds != [duckdb.StatementType.SELECT]:
        names = ", ".join(k.name for k in kinds) or "nothing"
        raise errors.InvalidInputError("sql", f"one read query expected, got {names}")
    rows = cursor.execute("SELECT json_serialize_sql(?::VARCHAR)", [parsed[0].query]).fetchall()
    tree = orjson.loads(rows[0][0]) if rows else {"error": True}
    if tree.get("error"):
        detail = tree.get("error_message", "not a SELECT")
        raise errors.InvalidInputError("sql", f"one read query expected: {detail}")
    writes = _nodes(tree) - READ_NODES
    if writes:
        names = ", ".join(sorted(n.removesuffix("_NODE").removesuffix("_QUERY") for n in writes))
        raise errors.InvalidInputError("sql", f"a read query cannot contain {names}")
