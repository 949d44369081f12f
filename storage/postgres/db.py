"""The PostgreSQL connection pool, transactions, retries and error translation.

One :class:`Database` per store object holds a ``psycopg_pool`` pool of
connections to one server (and one schema: the connection's
``search_path``). Every operation runs through one of two boundaries,
:meth:`Database.write` and :meth:`Database.read`, each one transaction on one
pooled connection:

- isolation is ``REPEATABLE READ``, PostgreSQL's snapshot isolation: the
  isolation DuckDB gives, which the shared domain layer is written for (one
  consistent snapshot per transaction; a concurrent update of a row the
  transaction writes is a lost race). ``SERIALIZABLE`` would add
  predicate-lock aborts for no invariant that needs them: every one-active
  rule is held by a key (a primary key, and partial unique indexes here),
  and every read-then-write ends in a compare-and-set on the row it decided
  on. ``READ COMMITTED`` would let one operation's reads see different
  commits (a fork could copy a torn transcript);
- a serialization failure, a deadlock, or a duplicate key the snapshot could
  not see is a lost race: rolled back and retried (``storage/retry.py``), so
  it surfaces as the domain error it means, or ``TransactionConflictError``
  after the last attempt;
- every other ``psycopg`` error is translated into the PEP 249-style classes
  of :mod:`turnkeeper.spec.errors`, the original as ``__cause__``; a lost
  connection is ``OperationalError``, saying when the commit's outcome is
  unknown (the connection broke during ``COMMIT``, or during an autocommit
  write's statement); the pool (:mod:`.pool`) checks a connection before
  lending it and replaces broken ones, so a server restart fails the
  operations caught in flight and the next ones succeed;
- domain errors roll back and pass through; cancellation (``BaseException``)
  rolls back and is re-raised unwrapped.

The store's clock is the server's: inside a transaction ``now`` is
``clock_timestamp()`` read once the snapshot exists (``now()`` is the
transaction's start there, which may predate commits the snapshot holds),
an autocommit statement uses ``now()``, its own start; client hosts' clocks
never decide expiry.

Exact values: PostgreSQL ``text`` cannot hold U+0000, which turnkeeper text
may contain. Every string parameter and every text result passes through a
reversible code (:mod:`.text`) that spells U+0000 and the escape character
with private-use characters, so every string round-trips exactly and equal
strings stay equal. JSON is stored as text (``jsonb`` refuses ``\\u0000``).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from turnkeeper.spec import errors

from ..backend import Clock, Conflict, Dialect, Merge, QueryFn, present
from ..backend import Tx as AnyTx
from ..codec import check_clock
from ..migrations import load
from ..retry import Gate, Stats, run_attempts
from ..wakeups import Signals, Subscription, Topic
from . import notify, text
from .pool import Pool

T = TypeVar("T")

DIALECT = Dialect("postgres", skip_locked=True, one_statement_appends=True)
"""PostgreSQL's dialect: claims and scans skip rows another transaction holds."""

MIGRATIONS = load("turnkeeper.storage.postgres")
"""PostgreSQL's numbered migrations, loaded once."""

MIGRATION_LOCK = 0x7475726E6B656570  # "turnkeep"
"""The advisory lock key that serializes migrations of several processes."""

_PLACEHOLDER = re.compile(r"%|\?")


@lru_cache(maxsize=1024)
def _pg(sql: str) -> str:
    """The domain SQL's ``?`` placeholders as psycopg's ``%s`` (a literal ``%``
    doubled); the domain SQL holds no ``?`` inside literals."""
    return _PLACEHOLDER.sub(lambda m: "%%" if m.group() == "%" else "%s", sql)


def redact(url: str) -> str:
    """``url`` without its password (what the store shows as its ``path``)."""
    if "://" not in url:
        return re.sub(r"password\s*=\s*\S+", "password=***", url)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    user = f"{parts.username}:***@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}{port}"))


_CONFLICT = (
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
    pg_errors.UniqueViolation,
    pg_errors.LockNotAvailable,
)


def translate(exc: psycopg.Error, path: str, *, in_commit: bool = False) -> errors.DatabaseError:
    """Map a psycopg exception to the project's PEP 249-style class."""
    text_ = str(exc).strip()
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


_NO_LOCKS = Dialect("postgres", skip_locked=False, one_statement_appends=True)
"""The dialect of a transaction that may not lock rows (read-only)."""


class Tx:
    """One open transaction (or one autocommit statement) on a pooled connection.

    ``now``: see the module docstring (the injected clock's value, else the
    server's ``clock_timestamp()`` read once per transaction). Only a write or
    a scan locks rows: a read-only transaction's dialect skips nothing.
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        clock: Clock | None,
        in_transaction: bool,
        *,
        locking: bool = True,
    ) -> None:
        self.dialect = DIALECT if locking else _NO_LOCKS
        self._conn = conn
        self._clock = clock
        self._in_transaction = in_transaction
        self._now: datetime | None = None
        self.statements = 0
        self._snapshot = False  # a statement other than BEGIN has run (it took the snapshot)
        self.committing = False
        self.pending: list[str] = []

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The connection this transaction runs on."""
        return self._conn

    @property
    def now(self) -> datetime | None:
        """The store's now (fixed per transaction), or ``None`` for SQL ``now()``."""
        if self._now is None:
            if self._clock is not None:
                if self._in_transaction and not self._snapshot:
                    self.exec("SELECT 1")  # the snapshot first, then the injected clock
                self._now = check_clock(self._clock())
            elif self._in_transaction:
                row = self.one("SELECT clock_timestamp()")  # takes the snapshot, then reads
                row = present(row, "clock_timestamp()'s one row")
                self._now = row[0].astimezone(UTC)
        return self._now

    def _execute(self, sql: str, params: Sequence[Any]) -> psycopg.Cursor[Any]:
        self.statements += 1
        self._snapshot = self._snapshot or not sql.startswith("BEGIN")
        if not params:  # sent as it is: psycopg reads no placeholders without parameters
            return self._conn.execute(sql)
        return self._conn.execute(_pg(sql), list(params))

    def notify(self, topic: str) -> None:
        """Publish wake-up ``topic`` once this transaction commits."""
        self.pending.append(topic)

    def hold(self, target: str) -> None:
        """Nothing: the lease row's lock orders this transaction with a renewal."""

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Execute one statement and return all rows."""
        cur = self._execute(sql, params)
        return cur.fetchall() if cur.description is not None else []

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """Execute one statement and return its first row, or ``None``."""
        found = self.rows(sql, params)
        return found[0] if found else None

    def exec(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Execute one statement, ignoring any rows."""
        self._execute(sql, params)

    def count(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute one data-changing statement; the number of rows it changed."""
        return max(self._execute(sql, params).rowcount, 0)

    def insert_rows(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """Insert ``rows`` with one ``COPY … FROM STDIN`` (bulk loading)."""
        if not rows:
            return
        self.statements += 1
        self._snapshot = True
        with (
            self._conn.cursor() as cur,
            cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row(row)


class Database:
    """A PostgreSQL server (one schema of it) opened for one store object.

    ``url`` is a ``postgresql://`` URL or a libpq connection string; its
    ``options`` may set ``search_path`` to give the store its own schema.
    With ``read_only`` every transaction is ``READ ONLY`` and a write raises
    ``ReadOnlyError``. ``pool_size`` bounds the connections this store object
    holds (threads beyond it wait up to ``pool_timeout_s`` seconds).

    Raises (from the constructor):
        OperationalError: the server cannot be reached (or refused the login).
    """

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        *,
        read_only: bool = False,
        pool_size: int = 8,
        pool_timeout_s: float = 30.0,
    ) -> None:
        self.url = url
        self.path = redact(url)
        self.clock = clock
        self.read_only = read_only
        self.dialect = DIALECT
        self._pool_timeout_s = pool_timeout_s
        self._stats = Stats()
        self._signals = Signals()
        self._listener: notify.Listener | None = None
        self._gate = Gate()
        self._lock = self._gate.lock
        # One direct connection first: a login refused, a missing database or a
        # closed port fails at once with the server's own words (the pool would
        # retry for pool_timeout_s and say only that it timed out).
        try:
            psycopg.connect(url, connect_timeout=max(1, int(min(pool_timeout_s, 10)))).close()
        except psycopg.Error as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise errors.OperationalError(
                detail=f"cannot connect to {self.path}: {reason}"
            ) from exc
        self._pool = Pool(url, pool_size, _configure).pool
        try:
            self._pool.open(wait=True, timeout=pool_timeout_s)
        except PoolTimeout as exc:
            self._pool.close()
            raise errors.OperationalError(
                detail=f"cannot connect to {self.path} within {pool_timeout_s} s: {exc}"
            ) from exc

    # -- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Close the pool once the operations already running have finished.
        Idempotent, and one interrupted (Ctrl-C) is finished by the next; later
        operations raise ``InterfaceError``."""
        self._gate.shut()  # (a close cut short by a cancellation is finished by the next)
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        self._pool.close()

    @contextlib.contextmanager
    def connection(self) -> Any:
        """A pooled connection for one operation, inside the gate. A generator on
        purpose: one a cancellation left suspended (landing as its ``__enter__``
        returned, or as its ``__exit__`` started, which no Python code can
        prevent) is closed when it is collected, and its ``finally`` gives the
        connection back and leaves the gate then (for this thread, whichever
        thread collects it)."""
        me = threading.current_thread()
        self._gate.admit(me)
        try:
            with self._pool.connection(timeout=self._pool_timeout_s) as conn:
                yield conn
        except PoolTimeout as exc:
            raise errors.OperationalError(detail=f"no connection to {self.path}: {exc}") from exc
        finally:
            self._gate.leave(me)

    # -- transactions --------------------------------------------------------------

    def write(
        self,
        operation: str,
        body: Callable[[AnyTx], T],
        *,
        transaction: bool = True,
        retry: bool = True,
        exclusive: bool = True,
        merge: Merge | None = None,
    ) -> T:
        """Run ``body`` as one write transaction (or one autocommit statement),
        retried as a lost race on a serialization failure, deadlock or
        unseen duplicate key. (``exclusive`` and ``merge`` change nothing
        here: PostgreSQL's writers are serialized by the server, not in
        process, and concurrent commits share its WAL flushes.)

        Raises:
            TransactionConflictError: every attempt lost a race.
            DatabaseError: a translated backend failure (original as ``__cause__``).
            TurnkeeperError: whatever domain error ``body`` raised.
        """
        return self._run(operation, body, transaction, retry, commit=True)

    def read(self, operation: str, body: Callable[[AnyTx], T], *, snapshot: bool = False) -> T:
        """Run ``body`` as a read: one autocommit statement, or with ``snapshot``
        a ``REPEATABLE READ, READ ONLY`` transaction that is rolled back (its
        dialect skips no locked rows: read-only transactions take no locks).

        Raises:
            DatabaseError: a translated backend failure (original as ``__cause__``).
            TurnkeeperError: whatever domain error ``body`` raised.
        """
        return self._run(operation, body, snapshot, False, commit=False)

    def scan(self, operation: str, body: Callable[[AnyTx], T]) -> T:
        """A read in one ``REPEATABLE READ`` snapshot that may lock the rows it
        returns (``FOR UPDATE … SKIP LOCKED``: rows another transaction is
        claiming or converging are skipped); rolled back, so it writes nothing
        and the locks go at once. Read-only stores scan without locks."""
        return self._run(operation, body, True, True, commit=False, locking=True)

    def _begin(self, commit: bool, locking: bool, isolation: str) -> str:
        ro = ", READ ONLY" if self.read_only or not (commit or locking) else ""
        return f"BEGIN ISOLATION LEVEL {isolation}{ro}"

    def _run(
        self,
        operation: str,
        body: Callable[[AnyTx], T],
        transaction: bool,
        retry: bool,
        *,
        commit: bool,
        locking: bool = False,
        isolation: str = "REPEATABLE READ",
    ) -> T:
        statements = 0

        def attempt() -> T:
            nonlocal statements
            with self.connection() as conn:
                may_lock = transaction and (commit or locking) and not self.read_only
                tx = Tx(conn, self.clock, transaction, locking=may_lock)
                try:
                    if transaction:
                        tx.exec(self._begin(commit, locking, isolation))
                    else:  # an autocommit write's statement is its commit
                        tx.committing = commit
                    result = body(tx)
                    if transaction:
                        tx.committing = commit
                        tx.exec("COMMIT" if commit else "ROLLBACK")
                    if tx.pending:  # committed: wake the listening processes
                        notify.send(conn, tx.pending)
                    return result
                except psycopg.Error as exc:
                    _rollback(conn, transaction)
                    if retry and isinstance(exc, _CONFLICT):
                        raise Conflict(str(exc)) from exc
                    raise translate(exc, self.path, in_commit=tx.committing) from exc
                except BaseException:
                    _rollback(conn, transaction)
                    raise
                finally:
                    statements += tx.statements

        if not transaction and self.read_only and commit:
            raise errors.ReadOnlyError(self.path, detail="the store was opened read-only")
        return run_attempts(operation, attempt, self._stats, lambda: statements)

    def statement_stats(self) -> dict[str, dict[str, float]]:
        """Per operation: calls, statements per call (incl. BEGIN/COMMIT) and retries."""
        return self._stats.as_dict()

    # -- what else the store needs of a backend -------------------------------------

    def query(self, sql: str, params: Sequence[Any]) -> Any:
        """One analytics read as a ``pyarrow.Table`` (see :mod:`.query`)."""
        return self.snapshot(lambda query: query(sql, params))

    def snapshot(self, body: Callable[[QueryFn], T]) -> T:
        """``body(query)``: each ``query(sql, params)`` is checked and run as
        :meth:`query` runs one, all in one ``REPEATABLE READ, READ ONLY``
        transaction that is rolled back."""
        from .query import run_query

        return self.read(
            "query",
            lambda tx: body(lambda sql, params: run_query(tx, sql, params)),
            snapshot=True,
        )

    def query_batches(
        self,
        sql: str,
        params: Sequence[Any],
        consume: Callable[[Any, Iterator[Any]], T],
        batch_rows: int,
    ) -> T:
        """:meth:`query`, streamed from a server-side cursor: ``consume(schema,
        batches)`` inside the read."""
        from .query import stream_query

        return self.read(
            "query",
            lambda tx: stream_query(tx, sql, params, consume, batch_rows),
            snapshot=True,
        )

    def subscribe(self, topics: tuple[Topic, ...]) -> Subscription:
        """Wake-ups of ``topics`` from every process on this store's schema; the
        first subscription starts this store object's listener (and waits, up to
        five seconds, until it listens)."""
        with self._lock:
            if self._gate.closed:
                raise errors.InterfaceError(detail="the store is closed")
            if self._listener is None:
                self._listener = notify.Listener(self.url, self._signals)
            listener = self._listener
        listener.ready.wait(5.0)
        return Subscription(self._signals, topics)

    def migrations(self) -> list[tuple[int, str]]:
        """PostgreSQL's numbered migrations: the shared ones (``storage/migrations``),
        each followed by its PostgreSQL additions (``storage/postgres/migrations``)."""
        return MIGRATIONS

    def migrate(self, operation: str, body: Callable[[AnyTx], T]) -> T:
        """The migration, in ``READ COMMITTED``: under ``REPEATABLE READ`` the
        snapshot would be taken by the statement that waits for the migration
        lock, so a second opener would not see the schema the first committed."""
        return self._run(operation, body, True, True, commit=True, isolation="READ COMMITTED")

    def lock_migrations(self, tx: AnyTx) -> None:
        """Take the migration advisory lock for this transaction: two processes
        opening a new store at once migrate one after the other (the second
        then finds the schema current)."""
        tx.exec("SELECT pg_advisory_xact_lock(?)", [MIGRATION_LOCK])

    def tables(self, tx: AnyTx) -> set[str]:
        """The tables of the connection's current schema."""
        rows = tx.rows(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
        return {r[0] for r in rows}


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Set up a new pooled connection: the exact text code, UTC."""
    text.register(conn)
    conn.execute("SET TIME ZONE 'UTC'")


def _rollback(conn: psycopg.Connection[Any], transaction: bool) -> None:
    if not transaction or conn.closed:
        return
    with contextlib.suppress(psycopg.Error):
        conn.execute("ROLLBACK")
