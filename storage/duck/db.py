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

Group commit. A write's cost is its commit, so writes that queue up while
another one runs are committed together: the thread that next takes the
write lock (the leader) runs every queued operation's body, in arrival
order, in one transaction and commits once (:data:`GROUP_MAX` at most).
Each operation is still fenced and checked on its own, inside that
transaction, and sees the writes of the ones before it, as if run one after
another; each caller is acknowledged only after the shared commit. A fence
judges its lease's expiry at the clock read as it runs, after the group took
the write lock and the fence its target, and every lease (and delivery
claim) the group's writes were fenced under is judged again right before the
shared COMMIT (``Tx.valid_until``, :meth:`Tx.lapsed`): a write whose lease
expired while the writes after it ran is handled as a failing one (below),
and alone it is refused, so none commits after its lease expired. When an
operation's body raises, the transaction is rolled back and nothing of it is
kept: the operations before it are committed again as a group, the failing
one runs alone in a transaction of its own (so its outcome, error or
success, is its own against what is committed), and the ones after it as
another group. So one failing operation never fails or rolls back another
caller's.

Commit delay. The writers a group acknowledges come back with their next
write while the leader is already taking its next batch, so without a wait
groups settle at about half the busy writers. When the previous group ran
more than one write, a leader therefore waits up to :data:`COMMIT_DELAY_S`
for as many writes to be queued as that group ran (the writers it just
acknowledged), then takes them all; after a lone write it never waits, so a
single writer pays nothing. The wait only shapes batches: no outcome
depends on it.

Merged writes. Consecutive queued writes that carry the same
:class:`~turnkeeper.storage.backend.Merge` (appends to sessions) run as one
call of its ``many`` inside the group's transaction: set-based statements
for all of them (one read of their sessions, one fence of their leases, one
compare-and-set of their session rows, one insert), so that a group of N
appends costs about what one does. ``many`` reports each request's own
outcome and writes nothing for a request that fails, so a refused append is
delivered as its error after the group commits, beside the others'
successes; an unexpected error from ``many`` is handled as a failing body
(the group splits and each runs alone).

- a lost race (a DuckDB write-write conflict, or a duplicate key the
  transaction's snapshot could not see, see :func:`~.dialect.is_conflict`) rolls back
  and is retried with jittered backoff (tenacity); the retry re-reads, so it
  surfaces as the domain error it means (busy, modified, exists …) or
  succeeds. With the write lock this is a backstop (another connection to
  the file in this process, a query's rolled-back write), not the rule;
- after the last attempt it is ``TransactionConflictError``;
- any other ``duckdb.Error`` is translated into the PEP 249-style classes of
  :mod:`turnkeeper.spec.errors` with the original as ``__cause__``;
- domain errors raised by the operation roll back and pass through as-is;
- a database DuckDB invalidated (it refuses every call after a fatal error,
  such as a checkpoint that hit a full disk) is reopened by the call that
  meets it (:func:`~.files.reopen`, for every store object on the file),
  and that call runs again when it committed nothing: a read always, a
  write whose failure came before its commit took effect. A ``COMMIT``
  DuckDB reports durable although the checkpoint after it failed is a
  commit (:func:`~.dialect.commit`); a single autocommit statement that did
  so (a renewal …) cannot give its result and raises
  ``StoreInvalidatedError`` saying it committed. When the file cannot be
  reopened yet, the call raises ``StoreInvalidatedError`` and the next one
  tries again;
- ``BaseException`` (cancellation) rolls back and is re-raised unwrapped; a
  query DuckDB reports as interrupted (SIGINT) is raised as
  ``KeyboardInterrupt``, never as a database error; a thread's cursor whose
  transaction a cancellation left open is replaced before its next use
  (:mod:`.cursors`), and a queued write run alone whose COMMIT took effect
  is never run again (:meth:`Database._settle`).

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
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from turnkeeper.spec import errors

from ..backend import Clock, Conflict, Merge, QueryFn, present
from ..backend import Tx as AnyTx
from ..codec import check_clock
from ..migrations import load
from ..retry import Gate, Stats, run_attempts
from ..wakeups import Subscription, Topic
from .cursors import Cursors, Holder
from .dialect import DIALECT, commit, interrupted, is_conflict, translate
from .files import SharedFile, Targets, open_shared, recover, release
from .query import check_read

MIGRATIONS = load("turnkeeper.storage.duck")
"""DuckDB's numbered migrations (the shared ones and DuckDB's additions), loaded once."""

UNNEST_ROWS = 256
"""Bulk inserts up to this many rows bind one list per column; more go through Arrow."""

GROUP_MAX = 64
"""Most queued writes one group commit runs in its shared transaction."""

WAKE_S = 1.0
"""Longest a queued write sleeps (seconds) before it looks again whether a
leader is still running: the leader's wake-up could be lost to a cancellation
landing in it, and then this is what finds the write a new leader."""

COMMIT_DELAY_S = 0.001
"""Longest a leader waits (seconds) before taking a batch, for as many writes
to queue as its previous group ran (PostgreSQL's ``commit_delay`` with
``commit_siblings``): see :meth:`Database._gather`."""

T = TypeVar("T")


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
    read pins the snapshot first. An injected clock is read after the
    snapshot too (read before it, a grant could be stamped before the
    release it followed). A single autocommit statement passes ``None`` and
    uses DuckDB's ``now()``, fixed as that statement starts.
    """

    PIN = "SELECT 1 FROM schema_migrations LIMIT 1"
    dialect = DIALECT

    def __init__(
        self,
        cursor: duckdb.DuckDBPyConnection,
        clock: Clock | None,
        in_transaction: bool,
        targets: Targets | None = None,
        *,
        skips_write_lock: bool = False,
    ) -> None:
        self._cursor = cursor
        self._clock = clock
        self._in_transaction = in_transaction
        self._now: datetime | None = None
        self._snapshot = False
        self.statements = 0
        self.pending: list[str] = []
        self._targets = targets
        self._skips_write_lock = skips_write_lock
        self._held: dict[int, threading.RLock] = {}
        self.snapshot_ticket: int | None = None
        """The file's ticket taken right before this transaction's snapshot."""
        self.item = 0
        """The position in its group of the queued write running now (0 alone)."""
        self._until: list[tuple[int, datetime, Exception]] = []

    @property
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """The thread's cursor this transaction runs on (for parsing SQL)."""
        return self._cursor

    @property
    def now(self) -> datetime | None:
        """The store's now (fixed per transaction), or ``None`` for SQL ``now()``."""
        if self._now is None:
            if self._in_transaction and not self._snapshot:
                self.exec(self.PIN)  # the snapshot first, the clock (injected or not) after it
            if self._clock is not None:
                self._now = check_clock(self._clock())
            elif self._in_transaction:
                self._now = datetime.now(UTC)
        return self._now

    def clock_after_locks(self, server_now: datetime | None = None) -> datetime:
        """The store's clock read now (see ``storage/backend.py``): the injected
        clock again, else the host clock (DuckDB's; ``server_now`` is for a
        server). Every lock a DuckDB write takes (the write lock, its targets'
        stripes) is taken before its guards read this."""
        now = check_clock(self._clock()) if self._clock is not None else datetime.now(UTC)
        if self._now is None and self._in_transaction and self._snapshot:
            self._now = now
        return now

    def valid_until(self, expires_at: datetime, lost: Exception) -> None:
        """Judge ``expires_at`` again right before COMMIT (:meth:`lapsed`): a
        group commit runs other queued writes between a guard and its COMMIT."""
        self._until.append((self.item, expires_at, lost))

    def lapsed(self) -> tuple[int, Exception] | None:
        """The first guard of :meth:`valid_until` whose expiry has passed by the
        clock read now, as ``(item, lost)`` (``item``: the queued write that
        registered it, see :attr:`item`), or ``None``; called right before COMMIT.
        Nothing can move an expiry meanwhile: the write lock and the held
        targets keep every grant, renewal and release out until COMMIT."""
        if not self._until:
            return None
        now = check_clock(self._clock()) if self._clock is not None else datetime.now(UTC)
        for item, expires_at, lost in self._until:
            if expires_at <= now:
                return item, lost
        return None

    def _execute(self, sql: str, params: Sequence[Any]) -> duckdb.DuckDBPyConnection:
        self.statements += 1
        if sql != "BEGIN TRANSACTION":
            self._snapshot_taken()
        if sql == "COMMIT":
            return commit(self._cursor)  # durable even when the checkpoint after it failed
        return self._cursor.execute(sql, list(params))

    def _snapshot_taken(self) -> None:
        """A statement other than ``BEGIN`` is about to run: in a transaction,
        the first one takes the snapshot, and the file's ticket is taken first."""
        if not self._snapshot:
            self._snapshot = True
            if self._in_transaction and self._targets is not None:
                self.snapshot_ticket = self._targets.ticket()

    def notify(self, topic: str) -> None:
        """Publish wake-up ``topic`` once this transaction commits."""
        self.pending.append(topic)

    def hold(self, target: str) -> None:
        """Take ``target``'s lock (one of the file's stripes) until :meth:`end`.

        Renewals and releases skip the write lock, so this is what keeps one
        from committing between a check of ``target``'s lease row and this
        transaction's commit. One that committed after this transaction's
        snapshot but before this hold would be invisible to it (and a lease
        row written with ``RETURNING`` over it would lose its update, DuckDB
        2.0.1): that is a :class:`~turnkeeper.storage.backend.Conflict`, and
        the write runs again on a fresh snapshot.

        Raises:
            HoldConflict: a renewal or release wrote ``target``'s stripe after
                this transaction's snapshot (the retry holds it before its own).
        """
        if self._targets is None:
            return
        stripe = zlib.crc32(target.encode()) % len(self._targets.locks)
        if stripe in self._held:
            return
        lock = self._targets.locks[stripe]
        # Recorded before it is taken, and let go by end() only if this thread
        # owns it: a cancellation landing as acquire() returns (before anything
        # here could note that it did) never leaves the stripe locked.
        self._held[stripe] = lock
        lock.acquire()
        if stale_since(self, stripe):
            raise HoldConflict(target)  # end() lets go of it

    def end(self) -> None:
        """Let go of the targets this transaction held (it committed or rolled
        back); a write that skipped the write lock first marks their stripes
        with a new ticket (see :func:`stale_since`)."""
        if self._skips_write_lock and self._held and self._targets is not None:
            ticket = self._targets.ticket()
            for stripe in self._held:
                self._targets.written[stripe] = ticket
        for stripe, lock in list(self._held.items()):
            if lock._is_owned():  # type: ignore[attr-defined]  # (see hold)
                lock.release()  # released before it is forgotten: a cancellation never leaks one
            del self._held[stripe]

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

    def count(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute one data-changing statement; the number of rows it changed."""
        row = self._execute(sql, params).fetchone()
        return 0 if row is None else int(row[0])

    def insert_rows(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """Insert ``rows`` (values in ``columns`` order, every column of ``table``
        in table order) in one statement: up to :data:`UNNEST_ROWS` as one list
        parameter per column (``unnest``), more through an Arrow table (whose
        registration costs more than a few rows do)."""
        if not rows:
            return
        if len(rows) <= UNNEST_ROWS:
            values = ", ".join(f"unnest(?) AS {name}" for name in columns)
            self.exec(
                f"INSERT INTO {table} SELECT {values}",
                [[r[i] for r in rows] for i in range(len(columns))],
            )
            return
        data = pa.table({name: pa.array([r[i] for r in rows]) for i, name in enumerate(columns)})
        self.statements += 1
        self._snapshot_taken()
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
        self._snapshot_taken()
        return self._cursor.sql(sql, params=list(params)).to_arrow_table()


class HoldConflict(Conflict):
    """:meth:`Tx.hold` found ``target``'s stripe written after the snapshot."""

    def __init__(self, target: str) -> None:
        super().__init__(f"the lease of {target!r} was written after this snapshot")
        self.target = target


def stale_since(tx: Tx, stripe: int) -> bool:
    """Whether a write that skipped the write lock (a renewal, a release) wrote
    ``stripe`` after ``tx`` took its snapshot: its ticket, taken after its
    commit, is larger than the one ``tx`` took before its snapshot (a commit
    between the two tickets counts too: a needless retry, never a missed write)."""
    ticket = tx.snapshot_ticket
    return ticket is not None and tx._targets is not None and tx._targets.written[stripe] > ticket


@dataclass(eq=False)
class _Queued:
    """A write waiting for a group commit, and its outcome once ``done``."""

    operation: str
    body: Callable[[AnyTx], Any]
    retry: bool
    merge: Merge | None = None
    committing: bool = False
    """Run alone, its COMMIT was about to be sent (see :meth:`Database._settle`)."""
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class _Failed:
    """A merged request's error, delivered once the group commits."""

    error: Exception


def _merged_run(batch: Sequence[_Queued], at: int) -> int:
    """The end of the run of writes from ``at`` that share its merge (``at + 1``
    for a write without one)."""
    merge = batch[at].merge
    end = at + 1
    if merge is not None:
        while end < len(batch) and (other := batch[end].merge) is not None:
            if other.many is not merge.many:
                break
            end += 1
    return end


def _wait(condition: threading.Condition, lock: threading.RLock, timeout: float) -> None:
    """``condition.wait(timeout)`` that never returns, or raises, without
    ``lock`` held: a cancellation landing right after the wait let go of it
    (before it could take it back) has it taken again here, so that the
    caller's ``with lock:`` lets go of its own hold, never another thread's."""
    try:
        condition.wait(timeout)
    except BaseException:
        if not lock._is_owned():  # type: ignore[attr-defined]
            lock.acquire()
        raise


def _run_items(tx: Tx, items: Sequence[_Queued]) -> list[Any]:
    """The outcomes of ``items``: one body, or one ``many`` call of a merged run."""
    merge = items[0].merge
    if len(items) == 1 or merge is None:
        return [items[0].body(tx)]
    outcomes = merge.many(tx, [q.merge.request for q in items if q.merge is not None])
    if len(outcomes) != len(items):
        raise RuntimeError(f"a merged write returned {len(outcomes)} outcomes for {len(items)}")
    return [_Failed(o) if isinstance(o, Exception) else o for o in outcomes]


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
        given: list[SharedFile] = []
        try:
            self._file = open_shared(self.path, read_only=read_only, user=self, given=given)
            self._write_lock = self._file.write_lock
            self._gate = Gate()
            self._lock = self._gate.lock
            self._cursors = Cursors(self._file, self._lock)
            self._closed = False
            self._stats = Stats()
            self._queue: list[_Queued] = []
            # Entered only as ``with self._queue_lock:`` (the lock's own C
            # ``__enter__``: taken or not, nothing runs between), never through a
            # condition's Python ``__enter__``, where a cancellation landing after
            # the take leaked the lock. Reentrant, so that the conditions' waits
            # let go of it and take it back in C, and a cancellation landing in a
            # wait can never release it while another thread holds it.
            self._queue_lock = threading.RLock()
            self._queue_changed = threading.Condition(self._queue_lock)
            self._queue_grew = threading.Condition(self._queue_lock)
            self._leading = False
            self._last_group = 1
            self._gathering = 0
        except BaseException:
            # Cancelled as it opened: let go of the file (closing it when no other
            # store object here uses it), never leaving it open for good.
            if given and release(given[0], self):
                with contextlib.suppress(duckdb.Error):
                    given[0].con.close()
            raise

    @property
    def _con(self) -> duckdb.DuckDBPyConnection:
        """The file's connection (replaced when the file is reopened)."""
        return self._file.con

    @_con.setter
    def _con(self, con: duckdb.DuckDBPyConnection) -> None:
        self._file.con = con

    def close(self) -> None:
        """Checkpoint and close the store once the operations already running have
        finished.

        New operations raise ``InterfaceError`` from the moment ``close`` is
        called; the file lock is released when it returns or raises.
        Idempotent, and a close interrupted (Ctrl-C) is finished by the next
        one. The last store object on a file in this process closes
        the file, running an explicit ``CHECKPOINT`` first when writable
        (which folds the write-ahead log into the database file: DuckDB's own
        checkpoint at close ignores a failure silently); the others leave it
        to that one.

        Raises:
            CheckpointError: the checkpoint failed (a full disk …). The store
                is closed all the same and nothing committed is lost: the
                ``.wal`` keeps every write and the next open replays it.
            OperationalError: DuckDB failed to close the file.
        """
        self._gate.shut()
        failed: duckdb.Error | None = None
        with self._lock:
            # Until this call gets to the end, a later close() does it all again
            # (each step may be done twice): one cancelled while it waited for the
            # running operations, or here, never leaves the file open for good.
            if self._closed:
                return
            try:
                self._cursors.close_all()
                if not release(self._file, self):
                    self._closed = True
                    return  # another store object in this process still uses the file
                if self._file.closed_by is not None:  # not reopened after an invalidation
                    failed = duckdb.ConnectionException(self._file.closed_by)
                elif not self._file.read_only and self.path != ":memory:":
                    try:
                        self._con.execute("CHECKPOINT")
                    except duckdb.Error as exc:
                        if interrupted(exc):
                            raise KeyboardInterrupt(str(exc)) from exc
                        failed = exc
                    except RuntimeError as exc:
                        if interrupted(exc):
                            raise KeyboardInterrupt(str(exc)) from exc
                        raise
                self._con.close()
                self._closed = True
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
        exclusive: bool = True,
        merge: Merge | None = None,
    ) -> T:
        """Run ``body`` as one write: one transaction (or, with
        ``transaction=False``, one autocommit statement, which DuckDB runs
        atomically on its own), under the file's write lock, with retries.

        ``retry=False`` reports a lost race as the translated error at once.
        ``exclusive=False`` (a single autocommit statement on one lease row:
        a heartbeat's renewal) skips the write lock, so that it never waits
        behind another thread's long write; a conflict with a write of the
        same row is retried as a lost race. ``merge``: a group commit may run
        it merged with the queued writes of the same ``many`` (module
        docstring); alone it runs ``body``.

        Raises:
            TransactionConflictError: every attempt lost a write-write conflict.
            DiskFullError: the disk is full: nothing of the write was committed.
            StoreInvalidatedError: the database was invalidated and could not be
                reopened yet, or it was as this autocommit statement committed.
            DatabaseError: a translated backend failure (original as ``__cause__``).
            TurnkeeperError: whatever domain error ``body`` raised.
        """
        with self._gate:
            if self.read_only:
                raise errors.ReadOnlyError(self.path, detail="the store was opened read-only")
            return recover(
                self._file,
                lambda: self._write(operation, body, transaction, retry, exclusive, merge),
                writes=True,
            )

    def _write(
        self,
        operation: str,
        body: Callable[[AnyTx], T],
        transaction: bool,
        retry: bool,
        exclusive: bool,
        merge: Merge | None,
    ) -> T:
        """:meth:`write` inside its gate."""
        if not exclusive:
            return self._run(
                operation, body, transaction, retry, commit=True, skips_write_lock=True
            )
        if not transaction:
            with self._write_lock:
                return self._run(operation, body, transaction, retry, commit=True)
        return self._grouped(_Queued(operation, body, retry, merge))  # type: ignore[no-any-return]

    # -- group commit (module docstring) ---------------------------------------------

    def _grouped(self, item: _Queued) -> Any:
        """Queue ``item`` and wait: for a leader to run it, or to become the
        leader (one at a time) and lead group commits until it is done; its
        result or error. Waiters sleep on a condition the leader signals after
        each group, not on the write lock, so a finished group's callers
        return at once instead of taking the lock in turn to see they are done."""
        lead = False
        try:
            with self._queue_lock:
                try:
                    self._queue.append(item)
                    if self._gathering and len(self._queue) >= self._gathering:
                        self._queue_grew.notify()  # the leader's batch is complete (_gather)
                    while not item.done and self._leading:
                        _wait(self._queue_changed, self._queue_lock, WAKE_S)
                except BaseException:
                    # Cancelled while queued: a write no leader has taken yet never
                    # runs; one a leader is running ends as that group does.
                    if item in self._queue:
                        self._queue.remove(item)
                    raise
                if not item.done:
                    lead = True  # before the flag: an interrupt between leaves it unset
                    self._leading = True
            if lead:
                self._lead(item)
        finally:
            if lead:
                self._leading = False  # first: a waiter that misses the notify sees it
                with self._queue_lock:
                    if not item.done and item in self._queue:
                        self._queue.remove(item)  # cancelled before it led: never runs
                    self._queue_changed.notify_all()
        if item.error is not None:
            raise item.error
        return item.result

    def _lead(self, item: _Queued) -> None:
        """Run queued writes as groups under the write lock until ``item`` is done."""
        with self._write_lock:
            while not item.done:
                batch: list[_Queued] = []
                try:
                    self._gather()
                    with self._queue_lock:
                        batch = self._queue[:GROUP_MAX]
                        del self._queue[:GROUP_MAX]
                    self._last_group = len(batch)
                    self._group(batch)
                except BaseException:
                    # Cancelled while leading (KeyboardInterrupt …): what did not
                    # run goes back to the front of the queue for the next leader;
                    # our own write is abandoned with the cancellation. A write
                    # run alone whose COMMIT returned (or took effect, _settle)
                    # is done: never queued to run a second time.
                    for q in batch:
                        if q.committing and not q.done:
                            q.done = True
                    with self._queue_lock:
                        self._queue[:0] = [
                            q
                            for q in batch
                            if not q.done and q is not item and q not in self._queue
                        ]
                        if item in self._queue:  # beyond this batch: never to run now
                            self._queue.remove(item)
                    item.done = True
                    raise
                with self._queue_lock:  # this group's callers return now
                    self._queue_changed.notify_all()

    def _gather(self) -> None:
        """Wait until as many writes are queued as the previous group ran, or for
        :data:`COMMIT_DELAY_S` (module docstring, commit delay); not at all
        after a group of one."""
        expected = min(self._last_group, GROUP_MAX)
        deadline = time.monotonic() + COMMIT_DELAY_S
        with self._queue_lock:
            if expected > 1:
                self._gathering = expected
                try:
                    while len(self._queue) < expected:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        _wait(self._queue_grew, self._queue_lock, remaining)
                finally:
                    self._gathering = 0

    def _group(self, batch: list[_Queued]) -> None:
        """Run ``batch`` as group commits, splitting around a failing operation."""
        if not batch:
            return
        if len(batch) == 1:
            self._alone(batch[0])
            return
        failed = self._shared(batch)
        if failed is None:
            return
        self._group(batch[:failed])
        self._alone(batch[failed])
        self._group(batch[failed + 1 :])

    def _alone(self, item: _Queued) -> None:
        """One queued write in its own transaction, with retries (its outcome
        decided by :meth:`_settle` when a cancellation lands as it commits)."""
        try:
            item.result = self._run(
                item.operation, item.body, True, item.retry, commit=True, item=item
            )
        except Exception as exc:
            item.error = exc
        item.done = True

    def _shared(self, batch: list[_Queued]) -> int | None:
        """Run every body of ``batch`` (consecutive writes of one merge as one
        call of its ``many``) in one transaction and commit it; ``None`` when
        committed (every item done, a merged request that failed with its
        error), else the index of the operation whose body raised (or 0 when
        the commit failed): nothing was kept."""
        holder = self._cursors.holder()
        tx = Tx(holder.cursor, self.clock, True, self._file.targets)
        try:
            return self._shared_in(batch, holder, tx)
        finally:
            tx.end()

    def _shared_in(self, batch: list[_Queued], holder: Holder, tx: Tx) -> int | None:
        """:meth:`_shared`'s transaction on ``tx``."""
        results: list[Any] = []
        spent: list[float] = []
        failed: int | None = None
        committing = False
        try:
            holder.clean = False
            tx.exec("BEGIN TRANSACTION")
            at = 0
            while at < len(batch):
                end = _merged_run(batch, at)
                before = tx.statements
                tx.item = at
                try:
                    outcomes = _run_items(tx, batch[at:end])
                except Exception as exc:
                    if interrupted(exc):
                        raise KeyboardInterrupt(str(exc)) from exc
                    failed = at
                    break
                results.extend(outcomes)
                spent.extend([(tx.statements - before) / (end - at)] * (end - at))
                at = end
            if failed is None and (late := tx.lapsed()) is not None:
                failed = late[0]  # a lease expired since its fence: that write runs alone
            if failed is None:
                committing = True
                tx.exec("COMMIT")
                holder.clean = True
                self._deliver(batch, results, spent, tx)
                return None
        except duckdb.Error:
            failed = 0  # the commit failed: nothing is kept; each runs on its own
        except BaseException as exc:
            # Cancelled (KeyboardInterrupt …). Once COMMIT was sent, whether it
            # took effect decides: a transaction still open was not committed
            # (rolled back now; the others are queued again by the leader), none
            # open means the COMMIT completed, and every caller gets its outcome,
            # never a second run of a committed write.
            if not (self._rollback(holder, True) is False and committing):
                if interrupted(exc):
                    raise KeyboardInterrupt(str(exc)) from exc
                raise
            self._deliver(batch, results, spent, tx)
            if interrupted(exc):
                raise KeyboardInterrupt(str(exc)) from exc
            raise
        self._rollback(holder, True)
        return failed

    def _deliver(
        self, batch: list[_Queued], results: list[Any], spent: list[float], tx: Tx
    ) -> None:
        """Give each write of a committed group its outcome (idempotent: a
        delivery cut short by a cancellation is finished by the handler)."""
        share = 2 / len(batch)  # BEGIN and COMMIT
        for item, result, statements in zip(batch, results, spent, strict=True):
            if item.done:
                continue
            if isinstance(result, _Failed):
                item.error = result.error
            else:
                item.result = result
            item.done = True
            self._stats.add(item.operation, statements + share, 1, grouped=True)
        for topic in dict.fromkeys(tx.pending):  # committed: wake this process
            self._file.signals.fire(topic)

    def read(self, operation: str, body: Callable[[AnyTx], T], *, snapshot: bool = False) -> T:
        """Run ``body`` as a read, without the write lock: one autocommit
        statement, or with ``snapshot`` several statements in one transaction
        (one consistent snapshot) that ends with ``ROLLBACK``, so that nothing
        it did is kept.

        Raises:
            StoreInvalidatedError: the database was invalidated and could not be
                reopened yet.
            DatabaseError: a translated backend failure (original as ``__cause__``).
            TurnkeeperError: whatever domain error ``body`` raised.
        """
        with self._gate:
            return recover(
                self._file,
                lambda: self._run(operation, body, snapshot, False, commit=False),
                writes=False,
            )

    def scan(self, operation: str, body: Callable[[AnyTx], T]) -> T:
        """A read in one snapshot (DuckDB has no row locks to skip)."""
        return self.read(operation, body, snapshot=True)

    def _run(
        self,
        operation: str,
        body: Callable[[AnyTx], T],
        transaction: bool,
        retry: bool,
        *,
        commit: bool,
        cursor: duckdb.DuckDBPyConnection | None = None,
        skips_write_lock: bool = False,
        item: _Queued | None = None,
    ) -> T:
        """One operation's attempts on ``cursor`` (default: this thread's);
        ``skips_write_lock``: run without the write lock (``exclusive=False``);
        ``item``: the queued write this runs alone (:meth:`_settle`)."""
        statements = 0
        # Targets whose hold conflicted: a retry holds them before its snapshot,
        # so that a heartbeat renewing at the wrong moment cannot win every time.
        prehold: list[str] = []

        def attempt() -> T:
            nonlocal statements
            holder = self._cursors.holder() if cursor is None else Holder(cursor)
            tx = Tx(
                holder.cursor,
                self.clock,
                transaction,
                self._file.targets,
                skips_write_lock=skips_write_lock,
            )
            if item is not None:
                item.committing = False
            try:
                for target in prehold:
                    tx.hold(target)
                if transaction:
                    holder.clean = False
                    tx.exec("BEGIN TRANSACTION")
                result = body(tx)
                if transaction:
                    if commit and (late := tx.lapsed()) is not None:
                        raise late[1]  # a lease or claim expired since its guard
                    if item is not None:
                        item.result, item.committing = result, True
                    tx.exec("COMMIT" if commit else "ROLLBACK")
                    holder.clean = True
                for topic in dict.fromkeys(tx.pending):  # committed: wake this process
                    self._file.signals.fire(topic)
                return result
            except (duckdb.InterruptException, RuntimeError) as exc:
                # DuckDB turns SIGINT during a query into an exception of its own;
                # cancellation is never translated: it surfaces as KeyboardInterrupt.
                self._settle(holder, transaction, item)
                if interrupted(exc):
                    raise KeyboardInterrupt(str(exc)) from exc
                raise
            except duckdb.Error as exc:
                if item is not None:
                    item.committing = False  # a COMMIT that raised did not commit
                self._rollback(holder, transaction)
                if retry and is_conflict(exc):
                    raise Conflict(str(exc)) from exc
                raise translate(exc, self.path) from exc
            except Conflict as exc:
                if isinstance(exc, HoldConflict):
                    prehold.append(exc.target)
                self._rollback(holder, transaction)
                raise
            except BaseException:
                self._settle(holder, transaction, item)
                raise
            finally:
                tx.end()
                statements += tx.statements

        return run_attempts(operation, attempt, self._stats, lambda: statements)

    def _settle(self, holder: Holder, transaction: bool, item: _Queued | None) -> None:
        """After a cancellation (or an interrupted query): roll back. For ``item``
        (a queued write run alone) whose COMMIT was sent, whether a transaction
        is still open decides its outcome, as for a shared group: none open
        means the COMMIT took effect (done, with its result, never run again),
        one open was rolled back (it runs again, queued), and when the rollback
        failed too the outcome is unknown (done, with ``OperationalError``)."""
        state: bool | None = None
        try:
            state = self._rollback(holder, transaction)
        finally:  # also when the rollback itself was interrupted
            if item is not None and item.committing:
                if state is True:
                    item.committing = False
                elif state is None:
                    item.error = errors.OperationalError(
                        detail="cancelled as it committed: whether the write committed is unknown"
                    )
                    item.done = True
                else:
                    item.done = True

    @staticmethod
    def _rollback(holder: Holder, transaction: bool) -> bool | None:
        """Roll back the open transaction: ``True`` when one was open, ``False``
        when DuckDB says none is (it ended: committed, or aborted and closed),
        ``None`` when the rollback failed otherwise (or ``transaction`` is
        false). The cursor is marked clean once no transaction is open on it;
        otherwise it is replaced before its next use (:mod:`.cursors`).

        Raises:
            KeyboardInterrupt: the rollback itself was interrupted (DuckDB
                reports that as an exception of its own, never passed on).
        """
        if not transaction:
            return None
        try:
            holder.cursor.execute("ROLLBACK")
        except duckdb.TransactionException as exc:
            if "no transaction is active" in str(exc):
                holder.clean = True
                return False
            return None
        except (duckdb.Error, RuntimeError) as exc:  # DuckDB may have aborted it already
            if interrupted(exc):
                raise KeyboardInterrupt(str(exc)) from exc
            if not isinstance(exc, duckdb.Error):
                raise
            return None
        holder.clean = True
        return True

    # -- what else the store needs of a backend -------------------------------------

    def query(self, sql: str, params: Sequence[Any]) -> Any:
        """One analytics read as a ``pyarrow.Table``: parsed and refused unless a
        read (:mod:`.query`), run in a snapshot that is rolled back, on a
        connection that reaches nothing beyond the database (module docstring).

        Raises:
            InvalidInputError: not one read statement.
            ProgrammingError: DuckDB rejected it.
        """
        return self.snapshot(lambda query: query(sql, params), pure=True)

    def snapshot(self, body: Callable[[QueryFn], T], *, pure: bool = False) -> T:
        """``body(query)``: each ``query(sql, params)`` is checked and run as
        :meth:`query` runs one, all in one snapshot that is rolled back, on a
        cursor of its own (so that ``body`` may run other operations on this
        thread's cursor meanwhile). Once ``body`` was called, the snapshot is
        never run again after a reopen (:func:`~.files.recover`) unless ``pure``
        (``body`` only queries)."""
        started = [False]

        def run(tx: AnyTx) -> T:
            assert isinstance(tx, Tx)
            started[0] = not pure

            def query(sql: str, params: Sequence[Any]) -> Any:
                check_read(tx.cursor, sql)
                return tx.arrow(sql, params)

            return body(query)

        def attempt() -> T:
            with self._lock:
                cursor = self._file.cursor()  # inherits the settings, locked
            try:
                return self._run("query", run, True, False, commit=False, cursor=cursor)
            finally:
                with contextlib.suppress(duckdb.Error):
                    cursor.close()

        with self._gate:
            return recover(self._file, attempt, writes=False, started=started)

    def query_batches(
        self,
        sql: str,
        params: Sequence[Any],
        consume: Callable[[Any, Iterator[Any]], T],
        batch_rows: int,
    ) -> T:
        """:meth:`query`, streamed: ``consume(schema, batches)`` inside the read
        (never run again after a reopen once ``consume`` was called)."""
        started = [False]

        def body(tx: AnyTx) -> T:
            assert isinstance(tx, Tx)
            check_read(tx.cursor, sql)
            tx.statements += 1
            relation = tx.cursor.sql(sql, params=list(params))
            reader = present(relation.to_arrow_reader(batch_rows), "a SELECT's result")
            started[0] = True
            try:
                return consume(reader.schema, iter(reader))
            finally:
                reader.close()  # else it keeps the database open until collected (reopen)

        with self._gate:
            return recover(
                self._file,
                lambda: self._run("query", body, True, False, commit=False),
                writes=False,
                started=started,
            )

    def subscribe(self, topics: tuple[Topic, ...]) -> Subscription:
        """Wake-ups of ``topics`` published by every store object on this file in
        this process (DuckDB has no other writer)."""
        return Subscription(self._file.signals, topics)

    def migrations(self) -> list[tuple[int, str]]:
        """DuckDB's numbered migrations: the shared ones (``storage/migrations``),
        each followed by its DuckDB additions (``storage/duck/migrations``)."""
        return MIGRATIONS

    def migrate(self, operation: str, body: Callable[[AnyTx], T]) -> T:
        """The migration: one write (one process writes a DuckDB file)."""
        return self.write(operation, body)

    def lock_migrations(self, tx: AnyTx) -> None:
        """Nothing to do: one process at a time opens a DuckDB file to write, and
        in it the migration runs under the write lock."""

    def tables(self, tx: AnyTx) -> set[str]:
        """The tables of the database's main schema."""
        return {r[0] for r in tx.rows("SELECT table_name FROM duckdb_tables()")}

    def statement_stats(self) -> dict[str, dict[str, float]]:
        """Per operation: calls, statements per call (incl. BEGIN/COMMIT) and retries."""
        return self._stats.as_dict()
