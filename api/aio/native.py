"""Running the store's operations natively on the event loop (PostgreSQL).

On PostgreSQL the async store's operations run on the event loop itself,
with psycopg's ``AsyncConnection`` from a ``psycopg_pool.AsyncConnectionPool``
(``storage/postgres/native.py``): each ``await store.<area>.<method>(...)``
runs the one domain layer's sync method in a greenlet
(``storage/bridge.py``), whose every database call is awaited by the loop.
No worker thread runs a database operation; the loop never blocks on the
database.

:class:`NativeRunner` is :class:`~.runner.Runner`'s twin for that, with its
promises:

- bounded: at most ``workers`` operations at once (the pool's connections
  by default); further callers wait, asynchronously, first come first
  served (:class:`~.runner.Slots`);
- cancellation (``CancelledError``, never wrapped): cancelled while it
  waits for its turn, nothing ran; cancelled while its operation runs
  before its point of no return (``bridge.committing``: its ``COMMIT``, an
  autocommit write's statement), the operation is cancelled where it awaits
  (psycopg cancels a statement under way on the server) and rolls back, so
  the call ends at once with nothing written, whatever the statement waited
  for (a lock, a slow query, a connection during an outage); cancelled past
  that point, the operation (a task of its own, shielded) runs to its end
  and the call then raises. A call from another loop is cancelled on the
  home loop the same way;
- one home loop: the loop that opened the store. A call from another
  running loop (on another thread) is handed to the home loop and awaited
  (its operation runs there); once the home loop stopped or closed, every
  call raises ``InterfaceError`` naming it, at once, and a call handed over
  whose home loop stops under it raises it too, its outcome unknown
  (never a hang);
- :meth:`close` waits for the operations in flight before the store's pool
  closes under them (the backend's gate counts operations per thread, and
  every greenlet runs on the loop's thread: it cannot tell them apart).

What blocks but is not database I/O never runs on the loop: a ledger's
blobs in files or an object store (``with_blobs(FsspecBlobs(...))``: their
puts with fsync, gets, lists and deletes) run on worker threads of the
loop's default executor, awaited by the operation (``bridge.off_loop``);
closing the sync twin runs on a thread of its own. ``LISTEN`` is native
too: a task on the loop reads an ``AsyncConnection``'s ``notifies()``
(``storage/postgres/native.py``). A retry's wait is ``asyncio.sleep``.

Lock audit (sync code on one thread: a wait on another greenlet's progress
would stop the loop that progress needs): the ledger's group commit
(``group.Batcher``, followers wait on a ``Condition`` for a leader) is not
used inside the bridge, each append commits itself; a ledger writer's lock,
held across its append's I/O, is a ``bridge.Lock`` (greenlets wait for it on
the loop); the backend's ``Gate`` counts operations per thread, so this
runner drains its operations before the pool closes; ``run_attempts``
sleeps through ``bridge.sleep``. The other locks reachable from an
operation (the replay and pairing caches, statistics, the gate's own lock,
the wake-up signals' condition) are held for no I/O and never waited on
across a switch.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from turnkeeper.spec import errors
from turnkeeper.storage import bridge

from .runner import Slots, check_workers, outlast

P = ParamSpec("P")
T = TypeVar("T")

LOOK_S = 1.0
"""How often (seconds) a call handed to the home loop looks whether that loop still runs."""


class NativeRunner:
    """Runs sync store calls in greenlets on its home event loop (see the
    module docstring). ``workers`` (1 to 64) bounds the operations at once.

    Raises (from the constructor):
        InvalidInputError: a bad ``workers``.
        RuntimeError: no running event loop (make it inside a coroutine).
    """

    def __init__(self, workers: int) -> None:
        self.workers = check_workers(workers)
        self.loop = asyncio.get_running_loop()
        """The home loop: every operation runs on it."""
        self._slots = Slots(workers)
        self._pid = os.getpid()
        self._inflight: set[asyncio.Task[object]] = set()
        self.closed = False

    async def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` in a greenlet on the home loop, once a slot is free.

        Raises:
            whatever ``fn`` raises, unchanged (``StopIteration`` as ``RuntimeError``).
            InterfaceError: the store was closed, this process is a fork, or
                the home loop no longer runs.
            asyncio.CancelledError: see the module docstring.
        """
        self._usable()
        if asyncio.get_running_loop() is not self.loop:
            return await self._forward(fn, *args, **kwargs)
        await self._slots.acquire()
        try:
            self._usable()
            operation = bridge.Operation(fn, *args, **kwargs)
            task: asyncio.Task[T] = self.loop.create_task(operation.run())
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():
                    if not operation.committing:  # nothing written yet: cancel it
                        task.cancel()
                    await outlast(task)
                raise
        finally:
            self._slots.release()

    async def _forward(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        home = self.loop
        if home.is_closed() or not home.is_running():
            raise errors.InterfaceError(
                detail=f"this async store's operations run on the event loop that opened it "
                f"({home!r}), which no longer runs: open the store on this event loop"
            )
        started: list[asyncio.Task[Any]] = []

        async def on_home() -> tuple[bool, T | None]:
            """The call on the home loop: ``(True, result)``, or ``(False, None)``
            when it was cancelled there (as this caller asked, or by that loop)."""
            task = asyncio.current_task()
            assert task is not None
            started.append(task)
            try:
                return True, await self(fn, *args, **kwargs)
            except asyncio.CancelledError:
                return False, None

        job = asyncio.run_coroutine_threadsafe(on_home(), home)
        waiter = asyncio.wrap_future(job)
        cancelled = asked = False
        while not waiter.done():  # a cancelled call waits for its operation's end
            if cancelled and not asked:  # cancel it on the home loop, as a call made there
                if job.cancel():  # not started there: it never runs
                    break
                if started:
                    home.call_soon_threadsafe(started[0].cancel)
                    asked = True
            try:
                await asyncio.wait([waiter], timeout=LOOK_S if not cancelled or asked else 0.01)
            except asyncio.CancelledError:
                cancelled = True
                continue
            if not waiter.done() and (home.is_closed() or not home.is_running()):
                job.cancel()
                raise errors.InterfaceError(
                    detail=f"the event loop this async store's operations run on ({home!r}) "
                    "stopped while this call's operation ran there: whether it took effect "
                    "is unknown (read the store to learn)"
                )
        if cancelled:
            if waiter.done() and not waiter.cancelled():
                waiter.exception()  # (retrieved: the caller was cancelled)
            raise asyncio.CancelledError
        ran, result = waiter.result()
        if not ran:  # cancelled by the home loop (its shutdown): as any cancellation
            raise asyncio.CancelledError
        return result  # type: ignore[return-value]  # (ran: the call's result)

    def _usable(self) -> None:
        if os.getpid() != self._pid:
            raise errors.InterfaceError(
                detail=f"this async store was opened in process {self._pid}, and this process "
                f"({os.getpid()}) was forked from it: open the store again in this process"
            )
        if self.closed:
            raise errors.InterfaceError(detail="the async store is closed")

    def close(self) -> None:
        """Refuse new calls (the store's close waits for the running ones: :meth:`drain`)."""
        self.closed = True

    async def drain(self) -> None:
        """Wait (on the home loop) until no operation runs; a cancellation of
        this wait is raised once they all ended."""
        cancelled = False
        while self._inflight:
            for task in list(self._inflight):
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    if not task.done():
                        cancelled = True
                        await outlast(task)
                except BaseException:  # its caller has it
                    pass
        if cancelled:
            raise asyncio.CancelledError
