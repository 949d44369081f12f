"""What ``store.query()`` accepts on PostgreSQL: one read over the store's tables.

PostgreSQL has no parser a client can ask, so the defences are the server's:

- the SQL is one statement (no ``;`` outside literals and comments) that
  starts as a read: ``SELECT``, ``WITH``, ``VALUES``, ``TABLE`` or ``EXPLAIN``
  (``EXPLAIN ANALYZE`` of a write is then refused by the next defence);
- it runs in a ``REPEATABLE READ, READ ONLY`` transaction that is always
  rolled back: every write, in a CTE or under ``EXPLAIN ANALYZE`` too, is
  refused by the server (``ReadOnlySqlTransaction``), and sequences, large
  objects and ``COPY … TO`` with it;
- it calls none of the functions that change settings (``set_config``, which
  could undo the role below), run SQL text (``query_to_xml``), take session
  locks that would outlive it (``pg_advisory_lock``), reach server files,
  other sessions or the server, or sleep: refused by name, quoted or
  schema-qualified names too;
- under ``SET LOCAL ROLE`` of the schema's own reader role when it exists
  (migration 9 creates ``turnkeeper_reader_<digest of database and schema>``
  where the store's user may create roles): granted ``SELECT`` on this
  schema's tables and nothing else, so that other stores' schemas, server
  files and ``COPY … TO PROGRAM`` are out of reach even for a superuser's
  store.

Results stream from a server-side cursor into Arrow record batches, so a
large result is never held twice. Text is decoded with the store's text code
(:func:`.text.register_query`); ``json`` and ``jsonb`` values come back as
JSON text, as DuckDB's ``JSON`` does.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
import pyarrow as pa

from turnkeeper.spec import errors

from ..backend import Tx as AnyTx
from . import faults, text

T = TypeVar("T")

READER_ROLE_SQL = (
    "'turnkeeper_reader_' || left(md5(current_database() || '.' || current_schema()), 16)"
)
"""The name of this schema's reader role, as migration 9 creates it."""

BATCH_ROWS = 10_000
"""Rows fetched per round trip and per Arrow record batch."""

_STRIP = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\$\$.*?\$\$", re.S)
_FIRST_WORDS = ("select", "with", "values", "table", "explain")
_UNSAFE = re.compile(
    r"\b(set_config|pg_read_file|pg_read_binary_file|pg_ls_\w+|pg_stat_file|lo_\w+"
    r"|dblink\w*|pg_file_\w+|pg_execute_server_program"
    r"|query_to_xml\w*|cursor_to_xml\w*|table_to_xml\w*|schema_to_xml\w*|database_to_xml\w*"
    r"|pg_advisory\w*|pg_try_advisory\w*|pg_terminate_backend|pg_cancel_backend"
    r"|pg_reload_conf|pg_rotate_logfile|pg_promote|pg_sleep\w*|pg_notify"
    r"|pg_logical_emit_message|pg_switch_wal|pg_create_restore_point|pg_backup_\w+"
    r"|pg_log_backend_memory_contexts|pg_import_system_collations)\s*\(",
    re.I,
)
"""Functions a read query may not call, whatever role it runs as: ones that change
settings (``set_config('role', …)`` would undo the reader role), run SQL text
(``query_to_xml``), take session locks that outlive the query, reach server
files, other sessions or the server itself, or sleep."""

_LITERALS = re.compile(
    r"--[^\n]*|/\*.*?\*/|\b[eE]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'|\$\$.*?\$\$", re.S
)
"""Comments and string literals (``E'…'`` with its backslash escapes too): what
:func:`check_functions` does not read for names."""
_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


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


def check_read(sql: str) -> str:
    """Refuse ``sql`` unless it is one statement that starts as a read; its
    first word (lower case: one of ``select``, ``with``, ``values``,
    ``table``, ``explain``).

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
    return first


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
        with faults.driver():
            rows = cur.fetchmany(batch_rows)
        if not rows:
            return
        columns = [
            pa.array([_cell(r[i], kind) for r in rows], kind) for i, kind in enumerate(kinds)
        ]
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def _reader_role(tx: Any) -> str | None:
    """This schema's reader role when it exists and the store's login may use it."""
    row = tx.one(
        f"SELECT rolname FROM pg_roles WHERE rolname = {READER_ROLE_SQL} "
        "AND pg_has_role(session_user, oid, 'MEMBER')"
    )
    return None if row is None else str(row[0])


def check_functions(sql: str) -> None:
    """Refuse ``sql`` when it calls one of the functions a read may not (see
    ``_UNSAFE``), spelled plainly, schema-qualified or as a quoted identifier.

    Raises:
        InvalidInputError: ``field="sql"``; nothing has been run.
    """
    bare = _LITERALS.sub(" ", sql)
    if re.search(r"\bu&\s*\"", bare, re.I):
        raise errors.InvalidInputError("sql", "a read query uses no Unicode-escaped identifiers")
    names = _QUOTED.sub(lambda m: m.group(1).replace('""', '"'), bare)
    found = _UNSAFE.search(names)
    if found is not None:
        raise errors.InvalidInputError(
            "sql",
            f"a read query cannot call {found.group(1)}() (settings, locks, server files, "
            "other sessions or SQL text are out of reach)",
        )


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
    first = check_read(sql)
    check_functions(sql)
    reader = _reader_role(tx)
    if reader is not None:
        tx.exec(f'SET LOCAL ROLE "{reader}"')
    conn = tx.conn  # type: ignore[attr-defined]
    tx.statements += 1  # type: ignore[attr-defined]
    with _cursor(conn, server=first != "explain") as cur:
        text.register_query(cur)
        try:
            with faults.driver():
                cur.execute(placeholders(sql), list(params) or None)
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            raise errors.InvalidInputError("sql", f"a read query cannot write: {exc}") from None
        schema = pa.schema(_types(cur))
        return consume(schema, batches(cur, schema, batch_rows))


@contextlib.contextmanager
def _cursor(conn: psycopg.Connection[Any], *, server: bool) -> Iterator[psycopg.Cursor[Any]]:
    """The query's cursor, closed at the end (psycopg's calls in
    :func:`.faults.driver`; what consumes the batches is not psycopg):
    server-side, so that a large result streams, unless ``server`` is false,
    for ``EXPLAIN``, which PostgreSQL does not take in a cursor it declares
    (``DECLARE … CURSOR FOR`` takes a ``SELECT`` or ``VALUES``); a plan is a
    few rows, and the transaction and role are the same."""
    cur: psycopg.Cursor[Any] = conn.cursor(name="turnkeeper_query") if server else conn.cursor()
    try:
        yield cur
    finally:
        with faults.driver():
            cur.close()


def run_query(tx: AnyTx, sql: str, params: Sequence[Any]) -> Any:
    """:func:`stream_query` gathered into one ``pyarrow.Table``."""
    return stream_query(
        tx,
        sql,
        params,
        lambda schema, found: pa.Table.from_batches(list(found), schema=schema),
        BATCH_ROWS,
    )
