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
  write's statement), whatever psycopg raised for it (through PgBouncer a
  ``ValueError`` at a ``COPY``'s end, say: :mod:`.faults` judges a failure
  by the connection too, and closes one psycopg left in a state it cannot
  vouch for); the pool (:mod:`.pool`) checks a connection before
  lending it and replaces broken ones, so a server restart fails the
  operations caught in flight and the next ones succeed;
- domain errors roll back and pass through; cancellation (``BaseException``)
  rolls back and is re-raised unwrapped.

Behind a connection pooler (:mod:`.connect`: told at open, or detected by
the first connection) in transaction mode the pool's connections prepare no
statements, the schema the connections land in is checked against the URL's
and its search path pinned in every transaction and autocommit statement
(another client of the pool may have left its own on a server connection),
and wake-ups listen on the direct ``listen_url``; a prepared statement the
server does not know, while the store prepares, says which option stops it.

Round trips: a transaction's ``BEGIN`` goes with its first statement, and
the writes it held to its end with the expiry check before ``COMMIT``, the
``COMMIT`` and its wake-ups, each group in one libpq pipeline (:mod:`.ahead`;
the held writes' compare-and-sets then judged on the server: :mod:`.chain`).
Statements go through a raw cursor, with PostgreSQL's numbered placeholders.

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
import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from turnkeeper.spec import errors

from .. import bridge
from ..backend import Clock, Conflict, Dialect, Merge, QueryFn, present
from ..backend import Tx as AnyTx
from ..codec import check_clock
from ..crypto.keyring import CLEAR, Keyring
from ..crypto.seal import DataKey
from ..migrations import load
from ..retry import Gate, Stats, run_attempts
from ..wakeups import Signals, Subscription, Topic
from . import ahead, chain, connect, faults, notify, text
from .connect import redact
from .faults import translate
from .pool import POOL_TIMEOUT_S, RECONNECT_DELAY_S, RECONNECT_MAX_DELAY_S, Pool

T = TypeVar("T")

DIALECT = Dialect("postgres", skip_locked=True, one_statement_appends=True)
"""PostgreSQL's dialect: claims and scans skip rows another transaction holds."""

MIGRATIONS = load("turnkeeper.storage.postgres")
"""PostgreSQL's numbered migrations, loaded once."""

LAPSED = "TKLAP"
"""The SQLSTATE of the check before COMMIT that a fenced lease expired
(:meth:`Tx.commit_statement`)."""

MIGRATION_LOCK = 0x7475726E6B656570  # "turnkeep"
"""The advisory lock key that serializes migrations of several processes."""

_PLACEHOLDER = re.compile(r"%|\?")
_QUESTION = re.compile(r"\?")


@lru_cache(maxsize=1024)
def _pg(sql: str) -> str:
    """The domain SQL's ``?`` placeholders as psycopg's ``%s`` (a literal ``%``
    doubled); the domain SQL holds no ``?`` inside literals."""
    return _PLACEHOLDER.sub(lambda m: "%%" if m.group() == "%" else "%s", sql)


@lru_cache(maxsize=1024)
def _numbered(sql: str) -> str:
    """The domain SQL's ``?`` placeholders as PostgreSQL's ``$1``, ``$2`` … in
    order, for a raw cursor (:func:`.ahead.cursor`; a ``%`` stays as written)."""
    numbers = itertools.count(1)
    return _QUESTION.sub(lambda m: f"${next(numbers)}", sql)


_CONFLICT = (
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
    pg_errors.UniqueViolation,
    pg_errors.LockNotAvailable,
)


@dataclass(frozen=True)
class Opened:
    """What a :class:`Database` was opened with (``where``: the URL and
    turnkeeper's parameters; the pool's settings) and what its first
    connection found (``found``, ``user``): all a twin of it needs to reach
    the same server and schema the same way without probing again."""

    where: connect.Target
    found: connect.Probe
    user: str
    clock: Clock | None
    read_only: bool
    pool_size: int
    pool_timeout_s: float
    reconnect_delay_s: float
    reconnect_max_delay_s: float
    pipelines: bool = False


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
        search_path: str | None = None,
        pipelines: bool = False,
    ) -> None:
        self.dialect = DIALECT if locking else _NO_LOCKS
        self.keys: Keyring = CLEAR
        self.made_keys: dict[tuple[str, int], DataKey] = {}
        self._pipelines = pipelines  # statements travel together (:mod:`.ahead`)
        self._conn = conn
        self._search_path = search_path  # pinned in an autocommit statement (pooler mode)
        self._clock = clock
        self._in_transaction = in_transaction
        self._now: datetime | None = None
        self._until: list[tuple[datetime, Exception]] = []
        self.statements = 0
        self._snapshot = False  # a statement other than BEGIN has run (it took the snapshot)
        self.committing = False
        self.pending: list[str] = []
        self._held: list[chain.Held] = []
        self._ahead: list[str] = []  # BEGIN and its pin, not sent yet (:mod:`.ahead`)
        self._judged: list[chain.Held] = []  # the held writes sent with COMMIT
        self._cursors: list[psycopg.Cursor[Any]] = []  # … and their statements' cursors

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The connection this transaction runs on (its ``BEGIN`` sent first,
        if still held: the caller runs statements on it directly)."""
        self._send_ahead()
        return self._conn

    def begin(self, statements: Sequence[str]) -> None:
        """Open the transaction with ``statements`` (its ``BEGIN``, and the
        pin of its search_path behind a transaction pooler: parameterless,
        one command each), sent with its next statement in one round trip
        (:mod:`.ahead`); each is counted as it is sent."""
        self._ahead = list(statements)

    def _send_ahead(self) -> None:
        """Send the statements :meth:`begin` holds, alone (a ``COPY`` or a
        simple query of two commands cannot go in a pipeline with them)."""
        held, self._ahead = self._ahead, []
        if held:
            self.statements += len(held)
            with faults.driver():
                ahead.send(self._conn, held, pipeline=self._pipelines)

    def end(self, sql: str) -> None:
        """Send the statement that ends the transaction (``COMMIT``, the
        expiry check and ``COMMIT``: :meth:`commit_statement`, or
        ``ROLLBACK``); a ``BEGIN`` still held (the body ran no statement)
        goes with a one-command ending, else before it."""
        if sql not in ("COMMIT", "ROLLBACK"):
            self._send_ahead()
        self.exec(sql)

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

    def clock_after_locks(self, server_now: datetime | None = None) -> datetime:
        """The store's clock read after the locks taken so far (see
        ``storage/backend.py``): the injected clock again, else ``server_now``
        (a locking statement's ``RETURNING clock_timestamp()``), else one
        ``SELECT clock_timestamp()``."""
        if self._clock is not None:
            now = check_clock(self._clock())
        elif server_now is not None:
            now = server_now.astimezone(UTC)
        else:
            row = self.one("SELECT clock_timestamp()")
            if row is None:
                raise errors.InternalError(detail="SELECT clock_timestamp() returned no row")
            now = row[0].astimezone(UTC)
        if self._now is None and self._in_transaction and self._snapshot:
            self._now = now
        return now

    def valid_until(self, expires_at: datetime, lost: Exception) -> None:
        """Judge ``expires_at`` again as this transaction commits
        (:meth:`commit_statement`): after its fence it may still wait for
        other locks (a row, a table another transaction holds)."""
        self._until.append((expires_at, lost))

    def commit_statement(self) -> str:
        """The SQL that commits this transaction: ``COMMIT``, preceded, when
        :meth:`valid_until` kept expiries, by a check of the earliest against
        the server's clock read right then, in the same round trip (no
        parameters: psycopg sends the two as one simple query, and an error
        in the first skips the ``COMMIT``). With an injected clock the check
        is made here.

        Raises:
            the kept error of the earliest expiry, when it has passed by the
            injected clock (a server's check fails with :data:`LAPSED`).
        """
        check = self._commit_check()
        return "COMMIT" if check is None else f"{check}; COMMIT"

    def _commit_check(self, held: bool = False) -> str | None:
        """The ``DO`` block that checks the earliest expiry :meth:`valid_until`
        kept against the server's clock (first, with ``held``, the mark of
        the held writes: :data:`.chain.HELD_CHECK`); ``None`` when there is
        nothing for the server to check.

        Raises:
            the kept error of the earliest expiry, when it has passed by the
            injected clock.
        """
        if not self._until:
            return None
        expires_at, lost = min(self._until, key=lambda u: u[0])
        if self._clock is not None:
            if expires_at <= check_clock(self._clock()):
                raise lost
            return None
        at = expires_at.astimezone(UTC).isoformat()
        return (
            f"DO $lapse$BEGIN {chain.HELD_CHECK if held else ''}IF clock_timestamp() >= "
            f"'{at}'::TIMESTAMPTZ THEN RAISE EXCEPTION USING ERRCODE = '{LAPSED}', "
            "MESSAGE = 'turnkeeper: a fenced lease expired before COMMIT'; END IF; END$lapse$"
        )

    def commits_held(self) -> bool:
        """Whether the writes still held go with the ``COMMIT``
        (:meth:`commit_held`): there are some, and the server checks an
        expiry before the ``COMMIT`` (so the check of their counts joins a
        statement sent anyway)."""
        return (
            bool(self._held)
            and bool(self._until)
            and self._clock is None
            and not self._ahead
            and self._pipelines
        )

    def commit_held(self, channel: str) -> None:
        """Send the held writes (one marked statement: :mod:`.chain`), the
        check before ``COMMIT`` (their mark, then the expiry), ``COMMIT`` and
        the wake-ups :meth:`notify` kept (on ``channel``, advisory: a failure
        of theirs never fails the committed write) in one round trip
        (:mod:`.ahead`); the server judges the held writes' counts, so
        nothing commits when one lost its race.

        Raises:
            psycopg.Error: with SQLSTATE :data:`.chain.HELD` (a held write
                changed another number of rows: :meth:`held_lost`) or
                :data:`LAPSED` (the lease expired), or the server's own;
                the ``COMMIT`` did not run.
        """
        held, self._held = self._held, []
        sql, params = chain.statement(held, marked=True)
        check = present(self._commit_check(held=True), "the expiry check before COMMIT")
        self._judged = held
        self._cursors = []
        self.statements += 3
        self._snapshot = True
        topics, self.pending = self.pending, []
        wake = notify.statement(channel, topics) if topics else None
        self.statements += notify.counted(topics)
        with faults.driver():
            try:
                ahead.run(
                    self._conn,
                    [(_numbered(sql), params), (check, None), ("COMMIT", None)],
                    self._cursors,
                    advisory=wake,
                    pipeline=self._pipelines,
                )
            except psycopg.Error:
                if wake is None or not _committed(self._cursors):
                    raise  # (else the wake-ups failed after the COMMIT: advisory)

    def held_lost(self) -> Conflict:
        """The lost race :meth:`commit_held`'s check found (its error:
        :data:`.chain.HELD`): the held write that changed another number of
        rows, judged by the counts the marked statement returned."""
        try:
            with faults.driver():
                row = self._cursors[0].fetchone() if self._cursors else None
            chain.check(self._judged, present(row, "the counts of the held writes"))
        except Conflict as exc:
            return exc
        except Exception:  # (no counts to name it by: the server's judgement stands)
            pass
        return Conflict("the check before COMMIT found a held write's count changed")

    def lapsed(self) -> Exception:
        """The kept error of the earliest expiry (its check failed as it committed)."""
        return min(self._until, key=lambda u: u[0])[1]

    def later(self, sql: str, params: Sequence[Any] = (), *, changes: int | None = None) -> None:
        """Hold one write until the next other statement, or the end of the
        operation's body (before its COMMIT), where the writes held are sent as
        one statement (:mod:`.chain`; see ``storage/backend.py``); outside a
        transaction that statement is an autocommit write of its own."""
        self._held.append((sql, list(params), changes))

    def flush(self) -> None:
        """Send the writes :meth:`later` held, as one statement, and judge their counts.

        Raises:
            Conflict: a held compare-and-set changed another number of rows.
        """
        held, self._held = self._held, []
        if not held:
            return
        if len(held) == 1:
            sql, params, _ = held[0]
            counts = [max(self._execute(sql, params).rowcount, 0)]
        else:
            sql, params = chain.statement(held)
            cur = self._execute(sql, params)
            with faults.driver():
                row = cur.fetchone()
            counts = list(present(row, "the counts of the held writes"))
        chain.check(held, counts)

    def _execute(
        self, sql: str, params: Sequence[Any], binary: bool = False, replan: bool = False
    ) -> psycopg.Cursor[Any]:
        if self._held:
            self.flush()
        self.statements += 1
        self._snapshot = self._snapshot or not sql.startswith("BEGIN")
        # numbered placeholders for a raw cursor; without parameters sent as it is
        query, args = (_numbered(sql), list(params)) if params else (sql, None)
        with faults.driver():
            if self._ahead:  # the BEGIN (and pin) go with it, in one round trip
                held, self._ahead = self._ahead, []
                self.statements += len(held)
                cur = ahead.send(
                    self._conn, held, query, args, binary, self._pipelines, prepare=not replan
                )
                return present(cur, "the cursor of the statement sent with BEGIN")
            if self._search_path is not None and not self._in_transaction:
                self.statements += 1  # the pin, sent in the same round trip
                query = _pg(sql) if params else sql  # (psycopg's placeholders)
                return connect.pinned(self._conn, self._search_path, query, args, binary)
            # (prepare=None: psycopg prepares it on its fifth run; False: never)
            prepare = False if replan else None
            return ahead.cursor(self._conn).execute(query, args, binary=binary, prepare=prepare)

    def notify(self, topic: str) -> None:
        """Publish wake-up ``topic`` once this transaction commits."""
        self.pending.append(topic)

    def hold(self, target: str) -> None:
        """Nothing: the lease row's lock orders this transaction with a renewal."""

    def rows(
        self, sql: str, params: Sequence[Any] = (), *, binary: bool = False, replan: bool = False
    ) -> list[tuple[Any, ...]]:
        """Execute one statement and return all rows (``binary``: in binary form,
        so a ``BYTEA`` value arrives as its bytes rather than hex text;
        ``replan``: never prepared, planned for its values on every run)."""
        cur = self._execute(sql, params, binary, replan)
        with faults.driver():
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
        """Insert ``rows`` with one ``COPY … FROM STDIN`` (bulk loading).

        Raises:
            InternalError: outside a transaction behind a transaction pooler
                (a ``COPY`` cannot carry the pinned search_path; every caller
                runs it in a transaction).
        """
        if not rows:
            return
        self.flush()
        self._send_ahead()  # (a COPY cannot share a pipeline)
        if self._search_path is not None and not self._in_transaction:
            raise errors.InternalError(
                detail="a bulk insert (COPY) runs only inside a transaction behind a "
                "transaction pooler, where each transaction pins the store's search_path"
            )
        self.statements += 1
        self._snapshot = True
        with (
            faults.driver(),
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
    holds (threads beyond it wait up to ``pool_timeout_s`` seconds); a lost
    connection is made again after ``reconnect_delay_s`` seconds, doubling
    per failed attempt up to ``reconnect_max_delay_s`` (:mod:`.pool`).
    ``pooler`` and ``listen_url`` (also parameters of ``url``): the pooler
    mode and the direct URL for ``LISTEN`` (:mod:`.connect`). After the
    open, :attr:`pooler` is the mode in force: the one given, else
    ``"transaction"`` when a pooler was detected, else ``None``.

    Raises (from the constructor):
        InvalidInputError: ``pooler`` or ``listen_url`` is not a valid value.
        OperationalError: the server cannot be reached (or refused the login).
        PoolerError: a pooler refused the URL's ``options``, or its server
            connections are not in the schema they name.
    """

    _sleep: Callable[[float], None] = staticmethod(time.sleep)
    """How a retry waits between attempts (a native twin's waits on its event loop)."""

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        *,
        read_only: bool = False,
        pool_size: int = 8,
        pool_timeout_s: float = POOL_TIMEOUT_S,
        reconnect_delay_s: float = RECONNECT_DELAY_S,
        reconnect_max_delay_s: float = RECONNECT_MAX_DELAY_S,
        pooler: str | None = None,
        listen_url: str | None = None,
    ) -> None:
        where = connect.target(url, pooler, listen_url)
        # One connection of its own first: a login refused, a missing database or a
        # closed port fails at once with the server's own words (the pool would
        # retry for pool_timeout_s and say only that it timed out); it also
        # tells whether a pooler sits between, and which schema the store is in.
        redacted = redact(where.url)
        try:
            with psycopg.connect(
                where.url,
                autocommit=True,
                prepare_threshold=None,
                connect_timeout=max(1, int(min(pool_timeout_s, 10))),
            ) as conn:
                found = connect.probe(conn)
                user = conn.info.user
                pipelines = ahead.pays(conn)
        except psycopg.Error as exc:
            refused = connect.refused(exc, redacted)
            if refused is not None:
                raise refused from exc
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise errors.OperationalError(detail=f"cannot connect to {redacted}: {reason}") from exc
        self.opened = Opened(
            where,
            found,
            user,
            clock,
            read_only,
            pool_size,
            pool_timeout_s,
            reconnect_delay_s,
            reconnect_max_delay_s,
            pipelines,
        )
        """What it was opened with and found (for a twin: ``storage/postgres/native.py``)."""
        self._adopt(self.opened)
        self._pool = Pool(
            self.url,
            pool_size,
            _configure,
            prepared=self._prepared,
            reconnect_delay_s=reconnect_delay_s,
            reconnect_max_delay_s=reconnect_max_delay_s,
        ).pool
        try:
            self._pool.open(wait=True, timeout=pool_timeout_s)
        except PoolTimeout as exc:
            self._pool.close()
            raise errors.OperationalError(
                detail=f"cannot connect to {self.path} within {pool_timeout_s} s: {exc}"
            ) from exc

    def _adopt(self, opened: Opened) -> None:
        """Take the settings and what the first connection found (no I/O).

        Raises:
            TemporarySchemaError, PoolerError: see the class docstring.
        """
        where, found, user = opened.where, opened.found, opened.user
        self.url = where.url
        self.path = redact(where.url)
        self.listen_url = where.listen_url
        self.clock = opened.clock
        self.read_only = opened.read_only
        self.dialect = DIALECT
        self.keyring: Keyring = CLEAR
        self._pool_timeout_s = opened.pool_timeout_s
        self._stats = Stats()
        self._signals = Signals()
        self._listener: notify.Listening | None = None
        self._gate = Gate()
        self._lock = self._gate.lock
        self.pooler: str | None = where.pooler or ("transaction" if found.pooled else None)
        self.pooler_detected = where.pooler is None and found.pooled
        self._refuse_temporary(found, user)
        if self.pooler is not None:
            connect.check_schema(self.path, self.url, found)
        # behind a transaction pooler every transaction and autocommit statement
        # pins the search_path: a server connection may carry another client's SET
        self._pinned = connect.pinned_path(found, user) if self.pooler == "transaction" else None
        # no schema of the search_path exists: the migration creates its first
        self._missing = connect.missing_schema(found, user)
        self._user = user
        self.channel = notify.channel(found.schema or self._missing)
        self._prepared = self.pooler != "transaction"
        self.pool_size = opened.pool_size
        """The most connections this store object holds at once."""
        self.pipelines = opened.pipelines
        """Whether transactions send their statements in libpq pipelines
        (:mod:`.ahead`: ``BEGIN`` with the first statement; held writes with
        the expiry check, ``COMMIT`` and wake-ups): chosen at open, where the
        server's round trip is long enough for them to pay; may be set."""

    # -- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Close the pool once the operations already running have finished.
        Idempotent, and one interrupted (Ctrl-C) is finished by the next; later
        operations raise ``InterfaceError``."""
        self._gate.shut()  # (a close cut short by a cancellation is finished by the next)
        if self._gate.forked():  # the pool's sockets are the parent's: leave them be
            return
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
        serializable: bool = False,
    ) -> T:
        """Run ``body`` as one write transaction (or one autocommit statement),
        retried as a lost race on a serialization failure, deadlock or
        unseen duplicate key; with ``serializable`` in ``SERIALIZABLE``
        isolation (a decision resting on rows found absent: two such
        transactions that each miss the other's insert are a serialization
        failure, retried). (``exclusive`` and ``merge`` change nothing
        here: PostgreSQL's writers are serialized by the server, not in
        process, and concurrent commits share its WAL flushes.)

        Raises:
            TransactionConflictError: every attempt lost a race.
            DatabaseError: a translated backend failure (original as ``__cause__``).
            TurnkeeperError: whatever domain error ``body`` raised.
        """
        isolation = "SERIALIZABLE" if serializable else "REPEATABLE READ"
        return self._run(operation, body, transaction, retry, commit=True, isolation=isolation)

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

    def _begin(self, commit: bool, locking: bool, isolation: str) -> list[str]:
        """The statements that open a transaction: its ``BEGIN``, then behind a
        transaction pooler the pin of its search_path (sent with the
        transaction's first statement: :meth:`Tx.begin`)."""
        ro = ", READ ONLY" if self.read_only or not (commit or locking) else ""
        pin = [] if self._pinned is None else [connect.pin_sql(self._pinned)]
        return [f"BEGIN ISOLATION LEVEL {isolation}{ro}", *pin]

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
                tx = Tx(
                    conn,
                    self.clock,
                    transaction,
                    locking=may_lock,
                    search_path=self._pinned,
                    pipelines=self.pipelines,
                )
                tx.keys = self.keyring
                try:
                    if transaction:
                        tx.begin(self._begin(commit, locking, isolation))
                    else:  # an autocommit write's statement is its commit
                        tx.committing = commit
                    # (bridge.committing: a native caller cancelled from here on
                    # lets the operation end; before, it cancels it, nothing written)
                    with bridge.committing(tx.committing):
                        result = body(tx)
                        # the held writes: with the COMMIT when the server checks an
                        # expiry before it, else now, judged before the COMMIT is sent
                        with_commit = transaction and commit and tx.commits_held()
                        if not with_commit:
                            tx.flush()
                    if transaction:
                        ending = tx.commit_statement() if commit and not with_commit else "ROLLBACK"
                        tx.committing = commit
                    with bridge.committing(tx.committing):
                        if with_commit:
                            tx.commit_held(self.channel)
                        elif transaction:
                            tx.end(ending)
                            tx.statements += ending != "COMMIT" and commit  # the DO before it
                        if tx.pending:  # committed: wake the listening processes
                            tx.statements += notify.send(conn, self.channel, tx.pending)
                    return result
                except psycopg.Error as exc:
                    lost = faults.settle(conn, transaction, exc)  # rolled back
                    if exc.sqlstate == chain.HELD:  # a held write lost its race: retried,
                        raise tx.held_lost() from None  # named as the judge in Python names it
                    if exc.sqlstate == LAPSED:  # the COMMIT's check: nothing committed
                        raise tx.lapsed() from exc
                    if retry and isinstance(exc, _CONFLICT):
                        raise Conflict(str(exc)) from exc
                    raise faults.judged(exc, lost, tx.committing) or translate(
                        exc, self.path, in_commit=tx.committing, prepared=self._prepared
                    ) from faults.original(exc)
                except BaseException:
                    _rollback(conn, transaction)
                    raise
                finally:
                    statements += tx.statements

        if not transaction and self.read_only and commit:
            raise errors.ReadOnlyError(self.path, detail="the store was opened read-only")
        return run_attempts(operation, attempt, self._stats, lambda: statements, self._sleep)

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
        five seconds, until it listens), on ``listen_url`` when there is one.

        Raises:
            PoolerError: ``feature="LISTEN"``: the store is in transaction
                pooler mode and has no ``listen_url``; ``feature="listen_url"``:
                that URL goes through a transaction pooler too, or reaches
                another server or database (checked as the listener connects).
            InterfaceError: the store is closed.
        """
        with self._lock:
            if self._gate.closed:
                raise errors.InterfaceError(detail="the store is closed")
            listener = self._listener
        if listener is None:
            listener = self._start_listener()
        listener.ready.wait(5.0)
        if listener.problem is not None:
            with self._lock:
                if self._listener is listener:
                    self._listener = None
            listener.close()
            raise errors.PoolerError(self.path, "listen_url", detail=listener.problem)
        return Subscription(self._signals, topics)

    def _start_listener(self) -> notify.Listening:
        """This store object's listener (started by the first subscriber)."""
        if self.listen_url is None and self.pooler == "transaction":
            how = (
                "a pooler was detected between this process and the server (its process "
                "id is not the server's); if it pools sessions, open the store with "
                "pooler='session'"
                if self.pooler_detected
                else "the store was opened with pooler='transaction'"
            )
            raise errors.PoolerError(
                self.path,
                "LISTEN",
                detail="wake-ups need a session of their own, which a transaction-mode pooler "
                "does not keep (a listener through it hears nothing): give the store "
                f"listen_url=<a direct URL to the same server and database>; {how}",
            )
        expected = None
        if self.listen_url is not None:  # the listener must reach this store's server
            expected = self.read(
                "subscribe",
                lambda tx: connect.probe(tx.conn),  # type: ignore[attr-defined]
            )
        check = connect.listen_check(expected, allow_pooled=self.pooler == "session")
        with self._lock:
            if self._gate.closed:
                raise errors.InterfaceError(detail="the store is closed")
            if self._listener is None:
                self._listener = self._new_listener(self.listen_url or self.url, check)
            return self._listener

    def _new_listener(self, url: str, check: Callable[[Any, bool], str | None]) -> notify.Listening:
        """This store object's listener on ``url`` (a thread: :class:`.notify.Listener`)."""
        return notify.Listener(url, self._signals, self.channel, check)

    def _refuse_temporary(self, found: connect.Probe, user: str) -> None:
        """Refuse a search_path that puts the store in the session's temporary
        schema (:func:`.connect.creates_in_temporary`).

        Raises:
            TemporarySchemaError: it does (nothing was written).
        """
        if connect.creates_in_temporary(found, user):
            raise errors.TemporarySchemaError(
                self.path,
                connect.first_in_path(found.search_path) or "pg_temp",
                detail=(
                    f"search_path {found.search_path!r} would put the store's tables in the "
                    "session's temporary schema, dropped when its connection closes: name a "
                    "schema of its own first (options=-csearch_path%3Dagents)"
                ),
            )

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
        then finds the schema current). Then create the schema the
        search_path names when none of its schemas existed at open
        (:func:`.connect.missing_schema`), so that the store's tables have a
        schema to go to.

        Raises:
            SchemaNotFoundError: that schema does not exist and the role may
                not create it (``detail`` says what to run; nothing written).
        """
        tx.exec("SELECT pg_advisory_xact_lock(?)", [MIGRATION_LOCK])
        if self._missing is None:
            return
        name = psycopg.sql.Identifier(self._missing).as_string()
        try:
            tx.exec(f"CREATE SCHEMA IF NOT EXISTS {name}")
        except pg_errors.InsufficientPrivilege as exc:
            role = psycopg.sql.Identifier(self._user).as_string()
            raise errors.SchemaNotFoundError(
                self.path,
                self._missing,
                detail=(
                    f"the search_path names it first, and role {self._user!r} may not "
                    f"create it: run CREATE SCHEMA {name} AUTHORIZATION {role} as a role "
                    "that may (the database's owner, a superuser), or GRANT CREATE ON "
                    "DATABASE to the role"
                ),
            ) from exc

    def tables(self, tx: AnyTx) -> set[str]:
        """The tables of the connection's current schema (the one the store
        creates its tables in) that no extension owns: ordinary, partitioned
        and foreign tables. Not views (``pg_stat_statements`` is two), not
        sequences or functions, not other schemas' tables, and not an
        extension's own tables (``pg_depend`` deptype ``e``: PostGIS's
        ``spatial_ref_sys``): a database other software shares holds these
        without being another application's."""
        rows = tx.rows(
            "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = pg_catalog.current_schema() "
            "AND c.relkind IN ('r', 'p', 'f') AND NOT EXISTS ("
            "SELECT 1 FROM pg_catalog.pg_depend d "
            "WHERE d.classid = 'pg_catalog.pg_class'::regclass "
            "AND d.objid = c.oid AND d.deptype = 'e')"
        )
        return {r[0] for r in rows}

    def object_names(self, tx: AnyTx) -> set[str]:
        """The names of every relation and type of the connection's current
        schema (an extension's, a view's, an index's …)."""
        rows = tx.rows(
            "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = pg_catalog.current_schema() "
            "UNION SELECT t.typname FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n "
            "ON n.oid = t.typnamespace WHERE n.nspname = pg_catalog.current_schema()"
        )
        return {r[0] for r in rows}


SETUP_SQL = "SET TIME ZONE 'UTC'"
"""What every new pooled connection runs (after :func:`.text.register`)."""


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Set up a new pooled connection: the exact text code, UTC."""
    text.register(conn)
    conn.execute(SETUP_SQL)


def _committed(cursors: Sequence[psycopg.Cursor[Any]]) -> bool:
    """Whether the last of ``cursors`` (a pipeline's ``COMMIT``) committed."""
    with contextlib.suppress(Exception):
        return cursors[-1].statusmessage == "COMMIT"
    return False


def _rollback(conn: psycopg.Connection[Any], transaction: bool) -> None:
    if not transaction or conn.closed:
        return
    with contextlib.suppress(Exception):  # the failure that brought us here is the news
        conn.execute("ROLLBACK")
