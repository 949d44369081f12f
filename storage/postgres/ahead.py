"""PostgreSQL: statements a transaction sends ahead of its next one, in the
same round trip.

A transaction's ``BEGIN`` (and, behind a transaction pooler, the ``SET
LOCAL`` that pins its search_path: :func:`.connect.pin_sql`) returns nothing
an operation needs, so :class:`.db.Tx` holds them (``Tx.begin``) and sends
them with its first statement, in one libpq pipeline (psycopg's
``Connection.pipeline()``): the statements go out together, followed by one
Sync, and the server runs them in order, so the transaction starts exactly
as if each had been sent alone (its snapshot is still taken by the first
statement after ``BEGIN``). An error in one of them (a ``BEGIN`` refused, the
statement failing) makes the server skip the rest up to the Sync; psycopg
raises the error as the pipeline ends, the statement's own class and
SQLSTATE, and the transaction is left failed, rolled back as after any
failed statement. Each statement is counted as one, as it was when sent
alone (``Tx.statements``). Where libpq has no pipeline mode (before 14)
each statement is sent in a round trip of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg


def send(
    conn: psycopg.Connection[Any],
    ahead: Sequence[str],
    query: str | None = None,
    params: Sequence[Any] | None = None,
    binary: bool = False,
) -> psycopg.Cursor[Any] | None:
    """Send the parameterless statements ``ahead`` and then ``query`` (with
    ``params``; none: only ``ahead``) in one round trip; ``query``'s cursor,
    its result read (``None`` without ``query``).

    Raises:
        psycopg.Error: the server failed one of them (the ones after it were
            not run).
    """
    if not psycopg.Pipeline.is_supported():
        for sql in ahead:
            conn.execute(sql)
        return None if query is None else conn.execute(query, params, binary=binary)
    with conn.pipeline():
        for sql in ahead:
            conn.execute(sql)
        cur = None if query is None else conn.execute(query, params, binary=binary)
    return cur
