"""A DuckDB transaction (or autocommit statement) on a thread's cursor: the
small interface the domain layer writes against (``storage/backend.py``), the
store's clock inside it, and the hold of lease targets (their stripes) that
orders a write with the renewals and releases that skip the write lock."""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa

from ..backend import Clock, Conflict, check_changes
from ..codec import check_clock
from ..crypto.keyring import CLEAR, Keyring
from ..crypto.seal import DataKey
from .dialect import DIALECT, commit
from .files import Targets

UNNEST_ROWS = 256
"""Bulk inserts up to this many rows bind one list per column; more go through Arrow."""


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
    keys: Keyring = CLEAR

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
        self.made_keys: dict[tuple[str, int], DataKey] = {}

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

    def rows(
        self, sql: str, params: Sequence[Any] = (), *, binary: bool = False, replan: bool = False
    ) -> list[tuple[Any, ...]]:
        """Execute one statement and return all rows (``binary``: DuckDB has one
        form; ``replan``: DuckDB plans every statement on every run)."""
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

    def later(self, sql: str, params: Sequence[Any] = (), *, changes: int | None = None) -> None:
        """Execute one write now (DuckDB has no data-modifying ``WITH`` to send
        it with others; see ``storage/backend.py``).

        Raises:
            Conflict: it changed another number of rows than ``changes``.
        """
        if changes is None:
            self.exec(sql, params)
        else:
            check_changes(sql, changes, self.count(sql, params))

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
