"""What a failed psycopg call means when psycopg cannot say it itself.

psycopg reads the server's answers as the protocol has them: one result per
statement, one at the end of a ``COPY``. A server connection lost in the
middle of a transaction breaks that shape. Directly, libpq reports the
server's last words (``terminating connection due to administrator
command``, an ``OperationalError``). Through PgBouncer the client hears two
errors for one statement, the server's and PgBouncer's own (``server conn
crashed?``), before the socket closes, and psycopg, expecting one result,
fails on its own terms: ``ValueError: too many values to unpack`` at the end
of a ``COPY``, ``ProgrammingError: COPY cannot be mixed with other
operations`` at its start, ``InternalError: received 2 results`` from a
server-side cursor's ``FETCH``. Their classes say nothing about what
happened, so the backend judges a failure by the connection as well:

- :func:`driver` wraps the backend's psycopg calls: an exception psycopg
  raises that is not one of its errors (a ``ValueError``, an
  ``AssertionError``) becomes :class:`DriverError`, the original as its
  ``__cause__`` (:func:`original` gives it back for the translated error);
- :func:`settle`, after any psycopg failure, rolls the transaction back and
  tells whether the connection is *lost* (the rollback, or whatever came
  before it, found it closed); a failure psycopg raised itself (one without
  a SQLSTATE, the server did not report it) on a connection that still
  works leaves its protocol state unknown (inside a ``COPY`` that never
  ended, say), so that connection is closed: the pool replaces it, and the
  server rolls its transaction back;
- :func:`judged`: the error a lost connection or a driver fault is, whatever
  psycopg's class: a lost connection is ``OperationalError`` (nothing was
  written; unless it was lost as the write committed, when whether it took
  effect is unknown), a driver fault on a live connection is
  ``InternalError``. Every other failure is the server's, and its class
  says what it is (:func:`translate`).

Cancellation (``BaseException``) is never wrapped or judged here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from turnkeeper.spec import errors


class DriverError(psycopg.InterfaceError):
    """psycopg failed with an exception that is not one of its errors (the
    original is ``__cause__``): a fault of the database interface, not of the
    database (PEP 249's ``InterfaceError``)."""


@contextlib.contextmanager
def driver() -> Iterator[None]:
    """Around psycopg calls: an ``Exception`` psycopg raises that is not a
    ``psycopg.Error`` becomes :class:`DriverError` (from the original).

    Raises:
        DriverError: see above; ``psycopg.Error``, ``TurnkeeperError`` and
            cancellation pass through.
    """
    try:
        yield
    except (psycopg.Error, errors.TurnkeeperError):  # (ours: from a text loader, say)
        raise
    except Exception as exc:
        raise DriverError(f"psycopg failed with {type(exc).__name__}: {exc}") from exc


def original(exc: BaseException) -> BaseException:
    """The exception psycopg raised: a :class:`DriverError`'s cause, else ``exc``."""
    if isinstance(exc, DriverError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


def _gone(conn: psycopg.Connection[Any]) -> bool:
    return conn.closed or conn.broken


def settle(conn: psycopg.Connection[Any], transaction: bool, exc: psycopg.Error) -> bool:
    """After ``exc`` ended an attempt on ``conn``: roll back (a transaction; or
    any statement psycopg failed itself, the rollback then only asks whether
    the connection still answers), close the connection when psycopg failed
    itself and it still works, and return whether it was lost (see the
    module docstring). Never raises (but cancellation)."""
    own = isinstance(exc, DriverError) or exc.sqlstate is None
    if not _gone(conn) and (transaction or own):
        with contextlib.suppress(Exception):
            conn.execute("ROLLBACK")
    lost = _gone(conn)
    if own and not lost:
        with contextlib.suppress(Exception):
            conn.close()  # its protocol state is unknown: the pool replaces it
    return lost


def judged(exc: psycopg.Error, lost: bool, in_commit: bool) -> errors.DatabaseError | None:
    """The error ``exc`` is when psycopg failed with a :class:`DriverError`, or
    the connection was ``lost`` and ``exc`` is psycopg's own or an
    ``OperationalError`` (``in_commit``: during the write's COMMIT or its one
    autocommit statement); ``None`` for a failure the server reported as
    another class (an integrity or SQL fault: its class says what it is)."""
    own = isinstance(exc, DriverError) or exc.sqlstate is None
    if not (lost and (own or isinstance(exc, psycopg.OperationalError))) and not isinstance(
        exc, DriverError
    ):
        return None  # the server's own word (an integrity or SQL fault) says more
    what = str(original(exc)).strip() or type(original(exc)).__name__
    if in_commit:
        how = "was lost" if lost else f"failed in the driver ({type(original(exc)).__name__})"
        return errors.OperationalError(
            detail=f"the connection {how} as the write committed (its COMMIT, or its one "
            f"autocommit statement), so whether it took effect is unknown: {what}"
        )
    if lost:
        return errors.OperationalError(
            detail="the connection to the server was lost before the operation committed: "
            f"it was rolled back, nothing of it was written ({what})"
        )
    return errors.InternalError(
        detail=f"psycopg failed with {type(original(exc)).__name__} ({what}); its connection "
        "was closed, so the server rolled the operation back: nothing of it was written"
    )


_PREPARED = (pg_errors.InvalidSqlStatementName, pg_errors.DuplicatePreparedStatement)
_POOLER_HINT = (
    " (a connection pooler in transaction mode between this process and the server? "
    "open the store with pooler='transaction')"
)


def translate(
    exc: psycopg.Error, path: str, *, in_commit: bool = False, prepared: bool = True
) -> errors.DatabaseError:
    """Map a psycopg exception to the project's PEP 249-style class. While the
    store prepares statements (``prepared``), a prepared statement missing,
    already there, or bound with another statement's parameters says which
    option stops it (what a transaction-mode pooler the store was not told of
    makes of them)."""
    text_ = str(exc).strip()
    if prepared and (
        isinstance(exc, _PREPARED)
        or (isinstance(exc, pg_errors.ProtocolViolation) and "prepared statement" in text_)
    ):
        text_ += _POOLER_HINT
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return errors.ReadOnlyError(path, detail=text_)
    if isinstance(exc, psycopg.OperationalError) and in_commit:
        return errors.OperationalError(
            detail=f"the connection broke as the write committed (its COMMIT, or its one "
            f"autocommit statement), so whether it took effect is unknown: {text_}"
        )
    table: list[tuple[type[psycopg.Error], type[errors.DatabaseError]]] = [
        (psycopg.IntegrityError, errors.IntegrityError),
        (psycopg.DataError, errors.DataError),
        (psycopg.ProgrammingError, errors.ProgrammingError),
        (psycopg.InternalError, errors.InternalError),
        (psycopg.NotSupportedError, errors.NotSupportedError),
        (psycopg.OperationalError, errors.OperationalError),
    ]
    for source, target in table:
        if isinstance(exc, source):
            return target(detail=text_)
    return errors.DatabaseError(detail=text_)
