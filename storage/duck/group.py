"""Group commit: writes that queue up while another one runs are committed
together (see :mod:`.db`, "Group commit", "Commit delay" and "Merged writes"):
the queue, the leader's batches, a group's shared transaction and its split
around a failing write. :class:`GroupCommit` is the part of
:class:`~.db.Database` that does it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import duckdb

from ..backend import Clock, Merge
from ..backend import Tx as AnyTx
from ..crypto.keyring import Keyring
from ..retry import Stats
from .cursors import Cursors, Holder
from .dialect import interrupted
from .files import SharedFile
from .tx import Tx

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


class GroupCommit:
    """The group-commit methods of :class:`~.db.Database` (which holds the
    queue, its lock and conditions, the write lock, the file and the stats
    these use, and ``_run``/``_rollback``, the one-operation boundary)."""

    _queue: list[_Queued]
    _queue_lock: threading.RLock
    _queue_changed: threading.Condition
    _queue_grew: threading.Condition
    _leading: bool
    _last_group: int
    _gathering: int
    _write_lock: threading.RLock
    _file: SharedFile
    _cursors: Cursors
    _stats: Stats
    clock: Clock | None
    keyring: Keyring
    _run: Callable[..., Any]
    _rollback: Callable[[Holder, bool], bool | None]

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
        tx.keys = self.keyring
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
