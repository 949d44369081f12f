"""What is DuckDB's own: its dialect, the connection's settings, and what its
errors mean (translated once, at the transaction boundary, into the PEP
249-style classes of :mod:`turnkeeper.spec.errors`)."""

from __future__ import annotations

import duckdb

from turnkeeper.spec import errors

from ..backend import Dialect

DIALECT = Dialect("duckdb", serialized_writes=True)
"""DuckDB's dialect: no row locks (the store serializes its own writes), so
claims and scans skip nothing."""

CORRUPT_ADVICE = "the database file is corrupt: restore it (and its .wal) from a backup"
"""What the store says about a database file DuckDB finds corrupt."""

_CORRUPT = ("computed checksum", "corrupt database file", "could not read enough bytes")


def translate(exc: duckdb.Error, path: str) -> errors.DatabaseError:
    """Map a DuckDB exception to the project's PEP 249-style class."""
    text = str(exc)
    lowered = text.lower()
    if isinstance(exc, duckdb.IOException) and (
        "could not set lock" in lowered or "conflicting lock" in lowered
    ):
        return errors.StoreLockedError(path, detail=text)
    if "read-only mode" in text:
        return errors.ReadOnlyError(path, detail=text)
    if any(sign in lowered for sign in _CORRUPT):
        detail = f"{CORRUPT_ADVICE}; DuckDB said: {text}"
        return errors.CorruptDatabaseError(path, path, detail=detail)
    table: list[tuple[type[duckdb.Error], type[errors.DatabaseError]]] = [
        (duckdb.ConstraintException, errors.IntegrityError),
        (duckdb.ConversionException, errors.DataError),
        (duckdb.OutOfRangeException, errors.DataError),
        (duckdb.InvalidInputException, errors.DataError),
        (duckdb.CatalogException, errors.ProgrammingError),
        (duckdb.ParserException, errors.ProgrammingError),
        (duckdb.BinderException, errors.ProgrammingError),
        (duckdb.PermissionException, errors.ProgrammingError),
        (duckdb.InternalException, errors.InternalError),
        (duckdb.NotImplementedException, errors.NotSupportedError),
        (duckdb.OperationalError, errors.OperationalError),
    ]
    for source, target in table:
        if isinstance(exc, source):
            return target(detail=text)
    return errors.DatabaseError(detail=text)


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is DuckDB's report of a query interrupted by SIGINT (an
    ``InterruptException``, or a ``RuntimeError`` from some calls): a
    cancellation, raised as ``KeyboardInterrupt``, never translated."""
    return isinstance(exc, duckdb.InterruptException) or (
        isinstance(exc, RuntimeError) and "interrupted" in str(exc)
    )


def is_conflict(exc: duckdb.Error) -> bool:
    """Whether ``exc`` is a lost race rather than a fault.

    Under DuckDB's snapshot isolation a lost race shows up three ways: a
    write-write conflict on update, a duplicate key found at commit, or a
    duplicate key found at once when the winner committed after our snapshot
    was taken (our check-then-insert could not see its row). Operations check
    for existing keys inside the transaction first, so a retry turns a real
    duplicate into its domain error (``SessionIDExistsError`` …).
    """
    text = str(exc).lower()
    if isinstance(exc, duckdb.TransactionException):
        return "conflict" in text or "constraint violation" in text
    return isinstance(exc, duckdb.ConstraintException) and "duplicate key" in text


CONNECTION_SETTINGS = (
    ("TimeZone", "Etc/UTC", "SET TimeZone = 'UTC'"),
    ("python_enable_replacements", "false", "SET GLOBAL python_enable_replacements = false"),
    # A join of a table with up to this many keys gives the table's scan the
    # list of them, which its index takes (see storage.backend.keyed): a merged
    # group of up to GROUP_MAX appends reads its sessions and leases by index.
    ("dynamic_or_filter_threshold", "64", "SET GLOBAL dynamic_or_filter_threshold = 64"),
    ("enable_external_access", "false", "SET enable_external_access = false"),
    ("lock_configuration", "true", "SET lock_configuration = true"),
)
"""``(name, value, statement)``: applied in this order to the database when a
connection opens it (the time zone before the lock; external access cannot be
turned back on). They hold for every connection and cursor on the file in
this process (one connection per file, ``files.py``)."""


def configure(con: duckdb.DuckDBPyConnection) -> None:
    """Apply :data:`CONNECTION_SETTINGS` to a new connection."""
    for name, value, statement in CONNECTION_SETTINGS:
        row = con.execute("SELECT current_setting(?)::VARCHAR", [name]).fetchone()
        if row is None or str(row[0]).lower() != value.lower():
            con.execute(statement)
