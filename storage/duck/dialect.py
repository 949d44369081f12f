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

DURABLE = "commit succeeded and is durable"
"""What DuckDB says (lower-cased) when the checkpoint it runs right after a
commit failed: the commit took effect and is in the write-ahead log, and the
database is invalidated."""

_INVALIDATED = ("database has been invalidated", "failed to create checkpoint", DURABLE)
"""Signs (lower-cased) that DuckDB invalidated the database: it refuses every
call until the file is opened again."""

_CLOSED = "connection already closed"
"""What a cursor says once its connection was closed to reopen the file."""

_DISK_FULL = ("no space left on device", "disk quota exceeded", "file too large")
"""The C library's words for ENOSPC, EDQUOT and EFBIG, which DuckDB quotes."""

INVALIDATED_ADVICE = (
    "DuckDB refuses every call on the database after a fatal error until it is opened "
    "again; nothing committed is lost (the write-ahead log keeps it and reopening replays "
    "it), and the store reopens the file by itself at the next call once it can"
)
"""What :class:`~turnkeeper.spec.errors.StoreInvalidatedError` says."""


def committed_durably(exc: BaseException | None) -> bool:
    """Whether ``exc`` is DuckDB's report that this call's commit took effect and
    is durable although the checkpoint it ran after it failed (a full disk …),
    not a later call's report of that invalidation (which quotes it)."""
    lowered = str(exc).lower()
    return (
        isinstance(exc, duckdb.Error)
        and DURABLE in lowered
        and "has been invalidated" not in lowered
    )


def commit(cursor: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """``COMMIT`` on ``cursor``. When DuckDB reports the commit durable but the
    checkpoint after it failed, the transaction committed: that is returned as
    a commit, never raised (raised, its caller would run a committed write
    again); the database is invalidated, and the next call reopens it."""
    try:
        return cursor.execute("COMMIT")
    except duckdb.Error as exc:
        if committed_durably(exc):
            return cursor
        raise


def checkpoint_failed(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the failure of a checkpoint this very call ran (a
    commit's automatic checkpoint, which then kept nothing of the commit
    unless DuckDB says it is durable), not the report of an earlier one."""
    lowered = str(exc).lower()
    return (
        isinstance(exc, duckdb.Error)
        and "failed to create checkpoint" in lowered
        and "has been invalidated" not in lowered
    )


def disk_full(exc: BaseException | None) -> bool:
    """Whether DuckDB's ``exc`` quotes a full disk (or quota, or file size limit)."""
    return isinstance(exc, duckdb.Error) and any(s in str(exc).lower() for s in _DISK_FULL)


def invalidated(exc: BaseException | None) -> bool:
    """Whether ``exc`` says DuckDB invalidated the database (a fatal error, a
    failed checkpoint), or that the cursor's connection was closed to reopen it
    (``None``, or not a DuckDB error: no)."""
    if not isinstance(exc, duckdb.Error):
        return False
    lowered = str(exc).lower()
    if isinstance(exc, duckdb.ConnectionException) and _CLOSED in lowered:
        return True
    return isinstance(exc, duckdb.FatalException) or any(s in lowered for s in _INVALIDATED)


def translate(exc: duckdb.Error, path: str) -> errors.DatabaseError:
    """Map a DuckDB exception to the project's PEP 249-style class."""
    text = str(exc)
    lowered = text.lower()
    own_full = checkpoint_failed(exc) and disk_full(exc) and not committed_durably(exc)
    if invalidated(exc) and not own_full:
        done = (
            "this write committed and is durable, but the checkpoint after it failed; "
            if committed_durably(exc)
            else ""
        )
        detail = f"{done}{INVALIDATED_ADVICE}; DuckDB said: {text}"
        return errors.StoreInvalidatedError(path, detail=detail)
    if disk_full(exc):
        kept = (
            "the checkpoint this write's commit ran found the disk full, so this write was not "
            "committed (the store reopens the file at the next call)"
            if checkpoint_failed(exc)
            else "nothing of the failed operation was kept (a write was not committed)"
        )
        return errors.DiskFullError(
            path, detail=f"{kept}; free space and call again; DuckDB said: {text}"
        )
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


THREADS = ("threads", "1")
"""DuckDB's worker threads for the store's database: ``(setting, value)``."""

CONNECTION_SETTINGS = (
    ("TimeZone", "Etc/UTC", "SET TimeZone = 'UTC'"),
    ("python_enable_replacements", "false", "SET GLOBAL python_enable_replacements = false"),
    # A join of a table with up to this many keys gives the table's scan the
    # list of them, which its index takes (see storage.backend.keyed): a merged
    # group of up to GROUP_MAX appends reads its sessions and leases by index.
    ("dynamic_or_filter_threshold", "64", "SET GLOBAL dynamic_or_filter_threshold = 64"),
    # Each statement runs on its caller's thread alone. With DuckDB's default
    # (one worker per core) every statement's tasks are handed to the pool and
    # waited for, a fixed cost per statement that a turn of 27 statements pays
    # 27 times (docs/duckdb-turn-profile.md: about a tenth of a turn, more under
    # load); the store's writers are its callers' threads, which run their
    # statements side by side all the same.
    (THREADS[0], THREADS[1], f"SET GLOBAL threads = {THREADS[1]}"),
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
