"""What ``store.query()`` accepts on PostgreSQL: one read over the store's tables.

PostgreSQL has no parser a client can ask, so the defences are the server's:

- the SQL is one statement (no ``;`` outside literals and comments) that
  starts as a read: ``SELECT``, ``WITH``, ``VALUES``, ``TABLE`` or ``EXPLAIN``
  (``EXPLAIN ANALYZE`` of a write is then refused by the next defence);
- it runs in a ``REPEATABLE READ, READ ONLY`` transaction that is always
  rolled back: every write, in a CTE or under ``EXPLAIN ANALYZE`` too, is
  refused by the server (``ReadOnlySqlTransaction``), and sequences, large
  objects and ``COPY … TO`` with it;
- under ``SET LOCAL ROLE turnkeeper_reader`` when that role exists (a
  migration creates it where the store's user may create roles): a role
  granted ``SELECT`` on the store's tables and nothing else, so that server
  files (``pg_read_file``), other schemas and ``COPY … TO PROGRAM`` are out of
  reach even for a superuser's store. Without the role, functions that read
  server files are refused by name as a last resort.

Results stream from a server-side cursor into Arrow record batches, so a
large result is never held twice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
import pyarrow as pa

from turnkeeper.spec import errors

from ..backend import Tx as AnyTx

T = TypeVar("T")

READER_ROLE = "turnkeeper_reader"

BATCH_ROWS = 10_000
"""Rows fetched per round trip and per Arrow record batch."""

_STRIP = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\$\$.*?\$\$", re.S)
_FIRST_WORDS = ("select", "with", "values", "table", "explain")
_SERVER_FILES = re.compile(
    r"\b(pg_read_file|pg_read_binary_file|pg_ls_dir|pg_stat_file|lo_import|lo_export"
    r"|pg_ls_\w+|dblink\w*|pg_file_write|pg_execute_server_program)\s*\(",
    re.I,
)


_TOKENS = re.compile(_STRIP.pattern + r"|\?|%", re.S)


def placeholders(sql: str) -> str:
    """``sql`` with its ``?`` placeholders as psycopg's ``%s`` and each ``%``
    doubled, leaving literals and comments as they are (``'why?'`` stays)."""

    def one(m: re.Match[str]) -> str:
        token = m.group()
        if token == "?":
            return "%s"
        return token.replace("%", "%%")

    return _TOKENS.sub(one, sql)


def check_read(sql: str) -> None:
    """Refuse ``sql`` unless it is one statement that starts as a read.

    Raises:
        InvalidInputError: ``field="sql"``; nothing has been run.
    """
    bare = _STRIP.sub(" ", sql)
    body = bare.strip().rstrip(";").strip()
    if ";" in body:
        raise errors.InvalidInputError("sql", "one read query expected, got several statements")
    first = body.split(None, 1)[0].lower() if body else ""
    if first not in _FIRST_WORDS:
        raise errors.InvalidInputError(
            "sql", f"one read query expected (SELECT, WITH, VALUES, TABLE, EXPLAIN), got {first!r}"
        )


_ARROW: dict[str, pa.DataType] = {
    "int2": pa.int64(),
    "int4": pa.int64(),
    "int8": pa.int64(),
    "oid": pa.int64(),
    "float4": pa.float64(),
    "float8": pa.float64(),
    "numeric": pa.float64(),
    "bool": pa.bool_(),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "timestamp": pa.timestamp("us"),
    "date": pa.date32(),
    "bytea": pa.binary(),
    "interval": pa.duration("us"),
}


def _arrow_type(oid: int) -> pa.DataType:
    info = psycopg.postgres.types.get(oid)
    if info is None:
        return pa.string()
    if info.array_oid == oid:  # the registry answers an array's oid with its element
        return pa.list_(_ARROW.get(info.name, pa.string()))
    return _ARROW.get(info.name, pa.string())


def _types(cur: psycopg.Cursor[Any]) -> list[pa.Field]:
    return [pa.field(col.name, _arrow_type(col.type_code)) for col in cur.description or []]


def _cell(value: Any, kind: pa.DataType) -> Any:
    if pa.types.is_list(kind) and value is not None:
        return [_cell(v, kind.value_type) for v in value]
    if kind == pa.string() and value is not None and not isinstance(value, str):
        return str(value)
    if kind == pa.float64() and value is not None:
        return float(value)
    return value


def batches(
    cur: psycopg.Cursor[Any], schema: pa.Schema, batch_rows: int = 10_000
) -> Iterator[pa.RecordBatch]:
    """The cursor's rows as Arrow record batches of ``batch_rows``."""
    kinds = [f.type for f in schema]
    while True:
        rows = cur.fetchmany(batch_rows)
        if not rows:
            return
        columns = [
            pa.array([_cell(r[i], kind) for r in rows], kind) for i, kind in enumerate(kinds)
        ]
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def _reader_role(tx: Any) -> bool:
    row = tx.one(
        "SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles WHERE rolname = ?",
        [READER_ROLE],
    )
    return bool(row and row[0])


def stream_query(
    tx: AnyTx,
    sql: str,
    params: Sequence[Any],
    consume: Callable[[pa.Schema, Iterator[pa.RecordBatch]], T],
    batch_rows: int,
) -> T:
    """Run ``sql`` (checked) in the read-only snapshot ``tx`` from a server-side
    cursor and hand ``consume`` its schema and record batches of ``batch_rows``.

    Raises:
        InvalidInputError: not one read statement (or one that tried to write).
        ProgrammingError: the server rejected it (an unknown table …).
    """
    check_read(sql)
    if _reader_role(tx):
        tx.exec(f"SET LOCAL ROLE {READER_ROLE}")
    elif _SERVER_FILES.search(_STRIP.sub(" ", sql)):
        raise errors.InvalidInputError("sql", "a read query cannot reach server files")
    conn = tx.conn  # type: ignore[attr-defined]
    tx.statements += 1  # type: ignore[attr-defined]
    with conn.cursor(name="turnkeeper_query") as cur:
        try:
            cur.execute(placeholders(sql), list(params) or None)
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            raise errors.InvalidInputError("sql", f"a read query cannot write: {exc}") from None
        schema = pa.schema(_types(cur))
        return consume(schema, batches(cur, schema, batch_rows))


def run_query(tx: AnyTx, sql: str, params: Sequence[Any]) -> Any:
    """:func:`stream_query` gathered into one ``pyarrow.Table``."""
    return stream_query(
        tx,
        sql,
        params,
        lambda schema, found: pa.Table.from_batches(list(found), schema=schema),
        BATCH_ROWS,
    )
