"""PostgreSQL: statements sent together, in one round trip (a libpq pipeline).

A transaction's ``BEGIN`` (and, behind a transaction pooler, the ``SET
LOCAL`` that pins its search_path: :func:`.connect.pin_sql`) returns nothing
an operation needs, so :class:`.db.Tx` holds them (``Tx.begin``) and sends
them with its first statement (:func:`send`); and the writes a transaction
held until its end go with the check before its ``COMMIT`` and the
``COMMIT`` (``Tx.commit_held``, :mod:`.chain`). The statements go out in
one pipeline (psycopg's ``Connection.pipeline()``) followed by one Sync,
and the server runs them in order, exactly as if each had been sent alone
(a transaction's snapshot is still taken by its first statement after
``BEGIN``). An error in one of them (a ``BEGIN`` refused, a statement
failing, the check before ``COMMIT`` raising) makes the server skip the
rest up to the Sync (a ``COMMIT`` after it never runs); psycopg raises the
error as the pipeline ends, with the statement's own class and SQLSTATE,
and the transaction is left failed, rolled back as after any failed
statement. Each statement is counted as one, as when sent alone
(``Tx.statements``).

A pipeline pays only where a round trip costs more than psycopg's pipeline
machinery (entering and leaving pipeline mode, a flush per statement, the
Sync; measured on a 2-core machine: about 50 µs of client CPU per pipeline,
against a round trip of 20 to 70 µs on a local Unix socket, where a
transaction's two pipelines were 50 to 110 µs slower than its four plain
round trips). So a store sends pipelines only to a server whose round trip
at open (:func:`round_trip_s`) is at least :data:`PIPELINE_RTT_S` (another
host); else, and where libpq has no pipeline mode (before 14), each
statement goes in a round trip of its own, in the same order
(``Database.pipelines`` says which).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import psycopg

PIPELINE_RTT_S = 0.0002
"""The shortest round trip (seconds) to a server for which the store sends
pipelines (see the module docstring)."""

Statement = tuple[str, Sequence[Any] | None]
"""One statement: its SQL (PostgreSQL's numbered placeholders, ``$1`` …:
:func:`cursor`) and its parameters (``None``: none)."""


def cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """A cursor of ``conn`` that sends its SQL as written, with PostgreSQL's
    numbered placeholders (psycopg's ``RawCursor``: psycopg parses no
    placeholders, which it would do for every run of a statement of more
    than 50 parameters, such as the held writes'); a native async store's
    connection proxy gives its own (``raw_cursor``)."""
    raw = getattr(conn, "raw_cursor", None)
    return raw() if raw is not None else psycopg.RawCursor(conn)


def supported() -> bool:
    """Whether this libpq has pipeline mode (14 and later)."""
    return bool(psycopg.Pipeline.is_supported())


def round_trip_s(conn: psycopg.Connection[Any], tries: int = 3) -> float:
    """The shortest of ``tries`` round trips (seconds) of an empty query on
    ``conn`` (an autocommit connection): the network's and the server's
    fixed cost of one wait, a busy moment's delay left out.

    Raises:
        psycopg.Error: the server failed the query.
    """
    spent = []
    for _ in range(tries):
        start = time.perf_counter()
        conn.execute("SELECT 1", prepare=False)
        spent.append(time.perf_counter() - start)
    return min(spent)


def pays(conn: psycopg.Connection[Any]) -> bool:
    """Whether pipelines pay on ``conn``'s server: libpq has pipeline mode
    and the round trip is at least :data:`PIPELINE_RTT_S`."""
    return supported() and round_trip_s(conn) >= PIPELINE_RTT_S


def run(
    conn: psycopg.Connection[Any],
    statements: Sequence[Statement],
    cursors: list[psycopg.Cursor[Any]],
    binary: bool = False,
    *,
    advisory: Statement | None = None,
    pipeline: bool = True,
    prepare: bool = True,
) -> None:
    """Send ``statements`` in one round trip; each one's cursor is appended to
    ``cursors`` as it is sent (so a caller keeps the results of the ones
    before a failure), its result read once this returns (the last one's in
    binary form with ``binary``). ``advisory`` (psycopg's ``%s``
    placeholders: ``Connection.execute``) goes last in the same round
    trip when given (a commit's wake-ups): a failure to send it is ignored,
    its cursor is not kept, and a failure of it on the server is raised
    after the results of the ones before it were read. Without ``pipeline``
    (or pipeline mode) each goes in a round trip of its own, in order.
    Without ``prepare`` the last statement is never prepared (psycopg's
    ``prepare=False``; the others as psycopg decides).

    Raises:
        psycopg.Error: the server failed one of them (the ones after it were
            not run).
    """
    if not (pipeline and supported()):
        for n, (sql, params) in enumerate(statements, 1):
            last = n == len(statements)
            cursors.append(_execute(conn, sql, params, binary and last, prepare or not last))
        if advisory is not None:
            with contextlib.suppress(Exception):
                conn.execute(*advisory)
        return
    with conn.pipeline():
        for n, (sql, params) in enumerate(statements, 1):
            last = n == len(statements)
            cursors.append(_execute(conn, sql, params, binary and last, prepare or not last))
        if advisory is not None:
            with contextlib.suppress(Exception):  # (a driver fault: the rest still goes)
                conn.execute(*advisory)


def _execute(
    conn: psycopg.Connection[Any],
    sql: str,
    params: Sequence[Any] | None,
    binary: bool,
    prepare: bool,
) -> psycopg.Cursor[Any]:
    """One statement on a cursor of its own (:func:`cursor`); never prepared
    without ``prepare``."""
    return cursor(conn).execute(sql, params, binary=binary, prepare=None if prepare else False)


def send(
    conn: psycopg.Connection[Any],
    ahead: Sequence[str],
    query: str | None = None,
    params: Sequence[Any] | None = None,
    binary: bool = False,
    pipeline: bool = True,
    *,
    prepare: bool = True,
) -> psycopg.Cursor[Any] | None:
    """Send the parameterless statements ``ahead`` and then ``query`` (with
    ``params``; no ``query``: only ``ahead``) in one round trip (:func:`run`;
    without ``pipeline``, one each);
    ``query``'s cursor, its result read (``None`` without ``query``);
    ``query`` never prepared without ``prepare``.

    Raises:
        psycopg.Error: the server failed one of them (the ones after it were
            not run).
    """
    statements: list[Statement] = [(sql, None) for sql in ahead]
    if query is not None:
        statements.append((query, params))
    cursors: list[psycopg.Cursor[Any]] = []
    run(conn, statements, cursors, binary, pipeline=pipeline, prepare=prepare)
    return cursors[-1] if query is not None else None
