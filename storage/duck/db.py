"""The DuckDB connection, transactions, retries and error translation.

One :class:`Database` per store object holds one DuckDB connection to the
file; each thread gets its own cursor (DuckDB connections are not
thread-safe, cursors on one instance are). Every operation runs through one
of two boundaries: :meth:`Database.write` or :meth:`Database.read`.

Writes are serialized in process. Only one process can write a DuckDB file,
so every writer of it is a thread of this process: :meth:`Database.write`
holds the file's write lock (one per file, shared by every store object on
it in this process) for the whole operation, so two of the store's own
operations never race and an operation with a well-defined serial outcome
gets that outcome or its domain error. Reads take no lock: DuckDB's MVCC
gives each a consistent snapshot beside a running write.

- a lost race (a DuckDB write-write conflict, or a duplicate key the
  transaction's snapshot could not see, see :func:`_is_conflict`) rolls back
  and is retried with jittered backoff (tenacity); the retry re-reads, so it
  surfaces as the domain error it means (busy, modified, exists …) or
  succeeds. With the write lock this is a backstop (another connection to
  the file in this process, a query's rolled-back write), not the rule;
- after the last attempt it is ``TransactionConflictError``;
- any other ``duckdb.Error`` is translated into the PEP 249-style classes of
  :mod:`turnkeeper.spec.errors` with the original as ``__cause__``;
- domain errors raised by the operation roll back and pass through as-is;
- ``BaseException`` (cancellation) rolls back and is re-raised unwrapped; a
  query DuckDB reports as interrupted (SIGINT) is raised as
  ``KeyboardInterrupt``, never as a database error.

A read in a transaction always ends with ``ROLLBACK``: whatever it did
(an analytics query's data-modifying CTE, say) is undone. The connection is
opened with external access disabled (no files, extensions, secrets or
environment reachable from SQL), Python replacement scans off and its
configuration locked, so SQL run on it reaches nothing beyond the database.

Statements are counted per operation name (:meth:`Database.statement_stats`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from turnkeeper.spec import errors

from ..backend import Clock, Conflict, Dialect
from ..backend import Tx as AnyTx
from ..migrations import load
from .query import check_read

MIGRATIONS = load("turnkeeper.storage.duck")
"""DuckDB's numbered migrations, loaded once."""

T = TypeVar("T")

DIALECT = Dialect("duckdb")
"""DuckDB's dialect: the store serializes its own writes, so claims skip nothing."""

MAX_ATTEMPTS = 40
"""Attempts per operation before a conflict becomes ``TransactionConflictError``."""


def translate(exc: duckdb.Error, path: str) -> errors.DatabaseError:
    """Map a DuckDB exception to the project's PEP 249-style class (dialect lives here)."""
    text = str(exc)
    lowered = text.lower()
    if isinstance(exc, duckdb.IOException) and (
        "could not set lock" in lowered or "conflicting lock" in lowered
    ):
        return errors.StoreLockedError(path, detail=text)
    if "read-only mode" in text:
        return errors.ReadOnlyError(path, detail=text)
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


WAL_ADVICE = (
    "the write-ahead log {wal} is corrupt, so the writes it holds cannot be replayed: "
    "restore the database and its .wal from a backup, or move {wal} aside to open the "
    "state of the last checkpoint (the writes made after it are lost)"
)
"""What :func:`open_error` says about a write-ahead log DuckDB cannot replay."""


def open_error(exc: duckdb.Error, path: str) -> errors.DatabaseError:
    """Translate a failure to open ``path`` (DuckDB's connect, which also replays the
    write-ahead log): a corrupt WAL or file, or a file that is not a DuckDB
    database, gets its own class and a message saying what the user can do;
    anything else goes through :func:`translate`."""
    text = str(exc)
    wal = f"{path}.wal"
    if "while replaying WAL" in text:
        detail = f"{WAL_ADVICE.format(wal=wal)}; DuckDB said: {text}"
        return errors.CorruptDatabaseError(path, wal, detail=detail)
    if "Corrupt database file" in text:
        detail = f"the database file is corrupt: restore it from a backup; DuckDB said: {text}"
        return errors.CorruptDatabaseError(path, path, detail=detail)
    if "not a valid DuckDB database file" in text:
        return errors.ForeignDatabaseError(path, detail=f"not a DuckDB database file: {text}")
    if "database does not exist" in text:  # read-only, and the file went missing meanwhile
        return errors.StoreNotFoundError(path, detail=text)
    return translate(exc, path)


def check_file(path: str, *, read_only: bool) -> None:
    """Refuse a ``path`` that cannot hold a database before DuckDB tries it.

    Raises:
        InvalidInputError: ``path`` is a directory, or (to create a file) its
            folder does not exist.
        StoreNotFoundError: ``read_only`` and there is no file at ``path``.
    """
    if path == ":memory:":
        return
    if os.path.isdir(path):
        raise errors.InvalidInputError("path", f"{path} is a directory, not a database file")
    if read_only and not os.path.exists(path):
        raise errors.StoreNotFoundError(path)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise errors.InvalidInputError(
            "path", f"the folder {folder} does not exist (a new database file needs one)"
        )


def _is_conflict(exc: duckdb.Error) -> bool:
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


@dataclass
class _OpStats:
    calls: int = 0
    statements: int = 0
    retries: int = 0


class Tx:
    """One open transaction (or one autocommit statement) on a thread's cursor.

    ``now`` is the store's now for this transaction: the injected clock's
    value, or the database clock. SQL spells it ``coalesce($now, now())``.

    The database clock, here: DuckDB fixes ``now()`` when ``BEGIN`` runs but
    takes the transaction's snapshot at its first statement, and under load
    the two can be far apart, so ``now()`` could predate commits the
    transaction reads. Inside an explicit transaction ``now`` is therefore
    the host clock (DuckDB runs in this process: its clock is the host's)
    read once the snapshot exists; if no statement has run yet, a one-row
    read pins the snapshot first. A single autocommit statement passes
    ``None`` and uses DuckDB's ``now()``, fixed as that statement starts.
    """

    PIN = "SELECT 1 FROM schema_migrations LIMIT 1"
    dialect = DIALECT

    def __init__(
        self, cursor: duckdb.DuckDBPyConnection, clock: Clock | None, in_transaction: bool
    ) -> None:
        self._cursor = cursor
        self._clock = clock
        self._in_transaction = in_transaction
        self._now: datetime | None = None
        self._snapshot = False
        self.statements = 0

    @property
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """The thread's cursor this transaction runs on (for parsing SQL)."""
        return self._cursor

    @property
    def now(self) -> datetime | None:
        """The store's now (fixed per transaction), or ``None`` for SQL ``now()``."""
        if self._now is None:
            if self._clock is not None:
                value = self._clock()
                if not isinstance(value, datetime) or value.tzinfo is None:
                    raise errors.InvalidInputError("clock", "the clock must return aware datetimes")
                self._now = value.astimezone(UTC)
            elif self._in_transaction:
                if not self._snapshot:
                    self.exec(self.PIN)
                self._now = datetime.now(UTC)
        return self._now

    def _execute(self, sql: str, params: Sequence[Any]) -> duckdb.DuckDBPyConnection:
        self.statements += 1
        cursor = self._cursor.execute(sql, list(params))
        if sql != "BEGIN TRANSACTION":
            self._snapshot = True
        return cursor

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Execute one statement and return all rows."""
        return self._execute(sql, params).fetchall()

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """Execute one statement and return its first row, or ``None``."""
        found = self.rows(sql, params)
        return found[0] if found else None

    def exec(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Execute one statement, ignoring any rows."""
        self._execute(sql, params)

    def insert_rows(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """Insert ``rows`` (values in ``columns`` order, every column of ``table``
        in table order) in one statement, through an Arrow table."""
        if not rows:
            return
        data = pa.table({name: pa.array([r[i] for r in rows]) for i, name in enumerate(columns)})
        self.statements += 1
        self._snapshot = True
        name = f"_turnkeeper_rows_{id(data)}"
        self._cursor.register(name, data)
        try:
            self._cursor.execute(f"INSERT INTO {table} SELECT * FROM {name}")
        except BaseException:
            # The failed insert aborted the transaction; unregistering can fail
            # too and must not hide the original error (a conflict to retry).
            with contextlib.suppress(duckdb.Error):
                self._cursor.unregister(name)
            raise
        self._cursor.unregister(name)

    def arrow(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Execute one statement and return a ``pyarrow.Table``."""
        self.statements += 1
        self._snapshot = True
        return self._cursor.sql(sql, params=list(params)).to_arrow_table()


CONNECTION_SETTINGS = (
    ("TimeZone", "Etc/UTC", "SET TimeZone = 'UTC'"),
    ("python_enable_replacements", "false", "SET GLOBAL python_enable_replacements = false"),
    ("enable_external_access", "false", "SET enable_external_access = false"),
    ("lock_configuration", "true", "SET lock_configuration = true"),
)
"""``(name, value, statement)``: applied in this order to the database when a
connection opens it (the time zone before the lock; external access cannot be
turned back on). They hold for every connection and cursor on the file in
this process, since DuckDB shares one instance per file; a second store
object on the same file finds them set."""


def _configure(con: duckdb.DuckDBPyConnection) -> None:
    for name, value, statement in CONNECTION_SETTINGS:
        row = con.execute("SELECT current_setting(?)::VARCHAR", [name]).fetchone()
        if row is None or str(row[0]).lower() != value.lower():
            con.execute(statement)


class _WriteLock:
    """The in-process write lock of one database file (see the module docstring)."""

    __slots__ = ("__weakref__", "lock")

    def __init__(self) -> None:
        self.lock = threading.RLock()


_WRITE_LOCKS: weakref.WeakValueDictionary[str, _WriteLock] = weakref.WeakValueDictionary()
_WRITE_LOCKS_GUARD = threading.Lock()


def _write_lock(path: str) -> _WriteLock:
    """The write lock of ``path``: one per file in this process (each
    ``":memory:"`` database is its own)."""
    if path == ":memory:":
        return _WriteLock()
    with _WRITE_LOCKS_GUARD:
        found = _WRITE_LOCKS.get(path)
        if found is None:
            found = _WRITE_LOCKS[path] = _WriteLock()
        return found


class _CursorHolder:
    """A thread's cursor, held through ``threading.local`` so that the thread's
    end collects the holder and closes the cursor."""

    __slots__ = ("__weakref__", "cursor")

    def __init__(self, cursor: duckdb.DuckDBPyConnection) -> None:
        self.cursor = cursor


def _drop_cursor(db: weakref.ref[Database], cur: duckdb.DuckDBPyConnection) -> None:
    owner = db()
    if owner is not None:
        owner._forget(cur)


class Database:
    """A DuckDB file (or ``:memory:``) opened for one store object.

    With ``read_only`` the file is opened read-only (DuckDB then allows
    other read-only processes) and every write raises ``ReadOnlyError``.

    Raises (from the constructor):
        StoreLockedError: another process holds the file.
        StoreNotFoundError, InvalidInputError: see :func:`check_file`.
        CorruptDatabaseError: the file or its write-ahead log is corrupt.
        ForeignDatabaseError: the file is not a DuckDB database.
        DatabaseError: any other failure opening it.
    """

    def __init__(self, path: str, clock: Clock | None = None, *, read_only: bool = False) -> None:
        self.path = path if path == ":memory:" else os.path.abspath(path)
        self.clock = clock
        self.read_only = read_only
        self.dialect = DIALECT
        check_file(self.path, read_only=read_only)
        try:
            self._con = duckdb.connect(self.path, read_only=read_only)
            _configure(self._con)
        except duckdb.Error as exc:
            raise open_error(exc, self.path) from exc
        self._write_lock = _write_lock(self.path)
        self._local = threading.local()
        self._cursors: set[duckdb.DuckDBPyConnection] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0
        self._stats: dict[str, _OpStats] = {}
        self._closed = False

    # -- cursors ---------------------------------------------------------------

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's cursor, opened on first use and closed when the thread
        ends (its thread-local holder is collected) or the store closes, so a
        long-lived store used by many short threads does not gather cursors."""
        holder: _CursorHolder | None = getattr(self._local, "holder", None)
        if holder is None:
            with self._lock:
                cur = self._con.cursor()  # inherits the settings, locked
                self._cursors.add(cur)
            holder = _CursorHolder(cur)
            weakref.finalize(holder, _drop_cursor, weakref.ref(self), cur)
            self._local.holder = holder
        return holder.cursor

    def _forget(self, cur: duckdb.DuckDBPyConnection) -> None:
        with self._lock:
            if self._closed or cur not in self._cursors:
                return
            self._cursors.discard(cur)
            with contextlib.suppress(duckdb.Error):
                cur.close()

    def _enter(self) -> None:
        with self._lock:
            if self._closed:
                raise errors.InterfaceError(detail="the store is closed")
            self._inflight += 1

    def _leave(self) -> None:
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.notify_all()

    def close(self) -> None:
        """Checkpoint and close the store once the operations already running have
        finished.

        New operations raise ``InterfaceError`` from the moment ``close`` is
        called; the file lock is released when it returns or raises.
        Idempotent. A writable file store first runs an explicit
        ``CHECKPOINT``, which folds the write-ahead log into the database
        file: DuckDB's own checkpoint at close ignores a failure silently.

        Raises:
            CheckpointError: the checkpoint failed (a full disk …). The store
                is closed all the same and nothing committed is lost: the
                ``.wal`` keeps every write and the next open replays it.
            OperationalError: DuckDB failed to close the file.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._inflight:
                self._idle.wait()
            failed: duckdb.Error | None = None
            if not self.read_only and self.path != ":memory:":
                try:
                    self._con.execute("CHECKPOINT")
                except duckdb.Error as exc:
                    failed = exc
            try:
                for cur in self._cursors:
                    cur.close()
                self._con.close()
            except duckdb.Error as exc:
                raise translate(exc, self.path) from exc
            if failed is not None:
                raise errors.CheckpointError(
                    self.path,
                    detail=f"every committed write is kept in {self.path}.wal, which the "
                    f"next open replays; DuckDB said: {failed}",
                ) from failed

    # -- transactions ------------------------------------------------------------

    def write(
        self,
        operation: str,
        body: Callable[[AnyTx], T],
        *,
        transaction: bool = True,
        retry: bool = True,
    ) -> T:
        """Run ``body`` as one write: one transaction (or, with
        ``transaction=False``, one autocommit statement, which DuckDB runs
        atomically on its own), under the file's write lock, with retries.

        ``retry=False`` reports a lost race as the translated error at once.

        Raises:
            TransactionConflictError: every attempt lost a write-write conflict.
            DatabaseError: a translated backend failure (original as ``__cause__``).
            TurnkeeperError: whatever domain error ``body`` raised.
        """
        self._enter()
        try:
            with self._write_lock.lock:
                return self._run(operation, body, transaction, retry, commit=True)
        finally:
            self._leave()

    def read(self, operation: str, body: Callable[[AnyTx], T], *, snapshot: bool = False) -> T:
        """Run ``body`` as a read, without the write lock: one autocommit
        statement, or with ``snapshot`` several statements in one transaction
        (one consistent snapshot) that ends with ``ROLLBACK``, so that nothing
        it did is kept.

        Raises:
            DatabaseError: a translated backend failure (original as ``__cause__``).
            TurnkeeperError: whatever domain error ``body`` raised.
        """
        self._enter()
        try:
            return self._run(operation, body, snapshot, False, commit=False)
        finally:
            self._leave()

    def _run(
        self,
        operation: str,
        body: Callable[[AnyTx], T],
        transaction: bool,
        retry: bool,
        *,
        commit: bool,
    ) -> T:
        cursor = self._cursor()
        attempts = 0
        statements = 0

        def attempt() -> T:
            nonlocal attempts, statements
            attempts += 1
            tx = Tx(cursor, self.clock, transaction)
            try:
                if transaction:
                    tx.exec("BEGIN TRANSACTION")
                result = body(tx)
                if transaction:
                    tx.exec("COMMIT" if commit else "ROLLBACK")
                return result
            except (duckdb.InterruptException, RuntimeError) as exc:
                # DuckDB turns SIGINT during a query into an exception of its own;
                # cancellation is never translated: it surfaces as KeyboardInterrupt.
                self._rollback(cursor, transaction)
                if isinstance(exc, duckdb.InterruptException) or "interrupted" in str(exc):
                    raise KeyboardInterrupt(str(exc)) from exc
                raise
            except duckdb.Error as exc:
                self._rollback(cursor, transaction)
                if retry and _is_conflict(exc):
                    raise Conflict(str(exc)) from exc
                raise translate(exc, self.path) from exc
            except Conflict:
                self._rollback(cursor, transaction)
                raise
            except BaseException:
                self._rollback(cursor, transaction)
                raise
            finally:
                statements += tx.statements

        retrying = Retrying(
            retry=retry_if_exception_type(Conflict),
            stop=stop_after_attempt(MAX_ATTEMPTS),
            wait=wait_random_exponential(multiplier=0.001, max=0.05),
            reraise=False,
        )
        try:
            return retrying(attempt)
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            origin = cause.__cause__ if cause is not None and cause.__cause__ else cause
            raise errors.TransactionConflictError(
                operation, attempts, detail=str(origin)
            ) from origin
        finally:
            with self._lock:
                s = self._stats.setdefault(operation, _OpStats())
                s.calls += 1
                s.statements += statements
                s.retries += attempts - 1

    @staticmethod
    def _rollback(cursor: duckdb.DuckDBPyConnection, transaction: bool) -> None:
        if not transaction:
            return
        with contextlib.suppress(duckdb.Error):  # DuckDB may have aborted it already
            cursor.execute("ROLLBACK")

    # -- what else the store needs of a backend -------------------------------------

    def query(self, sql: str, params: Sequence[Any]) -> Any:
        """One analytics read as a ``pyarrow.Table``: parsed and refused unless a
        read (:mod:`.query`), run in a snapshot that is rolled back, on a
        connection that reaches nothing beyond the database (module docstring).

        Raises:
            InvalidInputError: not one read statement.
            ProgrammingError: DuckDB rejected it.
        """

        def body(tx: AnyTx) -> Any:
            assert isinstance(tx, Tx)
            check_read(tx.cursor, sql)
            return tx.arrow(sql, params)

        return self.read("query", body, snapshot=True)

    def migrations(self) -> list[tuple[int, str]]:
        """DuckDB's numbered migrations (``storage/duck/migrations``)."""
        return MIGRATIONS

    def lock_migrations(self, tx: AnyTx) -> None:
        """Nothing to do: one process at a time opens a DuckDB file to write, and
        in it the migration runs under the write lock."""

    def tables(self, tx: AnyTx) -> set[str]:
        """The tables of the database's main schema."""
        return {r[0] for r in tx.rows("SELECT table_name FROM duckdb_tables()")}

    def statement_stats(self) -> dict[str, dict[str, float]]:
        """Per operation: calls, statements per call (incl. BEGIN/COMMIT) and retries."""
        with self._lock:
            return {
                op: {
                    "calls": s.calls,
                    "statements_per_call": s.statements / s.calls if s.calls else 0.0,
                    "retries": s.retries,
                }
                for op, s in sorted(self._stats.items())
            }
