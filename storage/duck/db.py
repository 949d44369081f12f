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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import duckdb

from turnkeeper.spec import errors

from ..backend import Clock, Conflict, Merge, QueryFn, present
from ..backend import Tx as AnyTx
from ..crypto.keyring import CLEAR, Keyring
from ..migrations import load
from ..retry import Gate, Stats, run_attempts
from ..wakeups import Subscription, Topic
from .cursors import Cursors, Holder
from .dialect import DIALECT, interrupted, is_conflict, translate
from .files import SharedFile, open_shared, recover, release
from .group import GroupCommit, _Queued
from .query import check_read
from .tx import HoldConflict, Tx

MIGRATIONS = load("turnkeeper.storage.duck")
"""DuckDB's numbered migrations (the shared ones and DuckDB's additions), loaded once."""

T = TypeVar("T")


class Database(GroupCommit):
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
        self.keyring: Keyring = CLEAR
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
        if self._gate.forked():  # the file's connection is the parent's: leave it be
            return
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
        serializable: bool = False,
    ) -> T:
        """Run ``body`` as one write: one transaction (or, with
        ``transaction=False``, one autocommit statement, which DuckDB runs
        atomically on its own), under the file's write lock, with retries
        (that lock makes every write serializable: ``serializable`` asks
        nothing more).

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
            tx.keys = self.keyring
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
        """The tables of the database's main schema, where the store creates its
        own (not views, sequences or macros, not another schema's tables)."""
        return {
            r[0]
            for r in tx.rows(
                "SELECT table_name FROM duckdb_tables() "
                "WHERE database_name = current_database() AND schema_name = 'main'"
            )
        }

    def object_names(self, tx: AnyTx) -> set[str]:
        """The names of every table, view, sequence, index and type of the
        database's main schema."""
        where = "WHERE database_name = current_database() AND schema_name = 'main'"
        return {
            r[0]
            for r in tx.rows(
                f"SELECT table_name FROM duckdb_tables() {where} "
                f"UNION SELECT view_name FROM duckdb_views() {where} AND NOT internal "
                f"UNION SELECT sequence_name FROM duckdb_sequences() {where} "
                f"UNION SELECT index_name FROM duckdb_indexes() {where} "
                f"UNION SELECT type_name FROM duckdb_types() {where} AND NOT internal"
            )
        }

    def statement_stats(self) -> dict[str, dict[str, float]]:
        """Per operation: calls, statements per call (incl. BEGIN/COMMIT) and retries."""
        return self._stats.as_dict()
