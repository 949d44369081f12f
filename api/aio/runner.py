"""Running the sync store's operations off the event loop.

The async store (:class:`~turnkeeper.aio.AsyncStore`) has no domain logic of
its own: each ``await store.<area>.<method>(...)`` runs the sync method of the
one domain layer on a worker thread of its :class:`Runner`, so the event loop
never waits on the database. On DuckDB those threads are the writers that the
backend's group commit (``storage/duck/group.py``) already gathers into
shared commits; on PostgreSQL each takes a connection of the store's pool.

The runner is bounded: at most ``workers`` operations run at once, and
further callers wait, asynchronously and first come first served, for a
free worker (:class:`Slots`, a queue that serves callers from any event
loop): the loop is never blocked, and a burst of callers never makes a
backlog of threads or connections.

Cancellation. ``asyncio.CancelledError`` is never wrapped, and a cancelled
call never leaves an operation half-done or still running:

- cancelled while it waits for a worker, or before its worker took it up,
  nothing ran;
- cancelled while its operation runs, the call waits for the operation to
  end (its transaction commits or rolls back as a whole; a thread cannot be
  interrupted mid-statement), then raises ``CancelledError``.

So once ``CancelledError`` comes out of an awaited store call, the operation
has either committed in full or written nothing, and nothing of it is in
flight: read the store to learn which (an append given its own ``entry_id``,
an outbox operation by its id, a ledger record by its idempotency id).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, Protocol, TypeVar

from turnkeeper.spec import errors

P = ParamSpec("P")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

WORKERS = 8
"""Default number of worker threads (operations running at once) of an async
store: enough for DuckDB's group commit to gather concurrent writes into one
commit, and no more than PostgreSQL's default pool (8 connections), so none waits for one."""


class Call(Protocol):
    """``await run(fn, *args, **kwargs)``: ``fn(*args, **kwargs)`` on a worker."""

    def __call__(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[T]: ...


def check_workers(workers: object) -> int:
    """``workers``, a number of worker threads.

    Raises:
        InvalidInputError: not an integer from 1 to 64.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64:
        raise errors.InvalidInputError("workers", "expected an integer from 1 to 64")
    return workers


class Slots:
    """At most ``size`` holders at once; callers from any event loop (and any
    thread) wait for a slot without blocking their loop, first come first
    served. A waiter cancelled before it got its slot leaves the queue; one
    cancelled just as its slot was handed over gives it to the next."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._free = size
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    async def acquire(self) -> None:
        """Wait for a slot (cancellable; see the class docstring)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            with self._lock:
                try:
                    self._waiters.remove((loop, waiter))
                    handed = False
                except ValueError:  # its slot was handed over already
                    handed = True
            if handed:
                self.release()
            raise

    def release(self) -> None:
        """Give the slot back: to the first waiter whose loop still runs, else free it."""
        with self._lock:
            while self._waiters:
                loop, waiter = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(_hand_over, waiter)
                except RuntimeError:  # its loop is closed: nobody waits there any more
                    continue
                return
            self._free += 1


def _hand_over(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # cancelled meanwhile: its acquire gives the slot on
        waiter.set_result(None)


class Runner:
    """A bounded pool of worker threads running sync store calls for event
    loops (see the module docstring). ``workers`` is how many run at once (1
    to 64); usable from any event loop and thread; :meth:`close` waits for the
    calls still running. A runner belongs to the process that made it: in a
    process forked from it, every call raises ``InterfaceError``.

    Raises (from the constructor):
        InvalidInputError: ``workers`` is not an integer from 1 to 64.
    """

    def __init__(self, workers: int = WORKERS) -> None:
        self.workers = check_workers(workers)
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="turnkeeper-aio")
        self._slots = Slots(workers)
        self._pid = os.getpid()
        self.closed = False

    async def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a worker thread, once one is free.

        Raises:
            whatever ``fn`` raises, unchanged, except ``StopIteration``, which
                no coroutine can raise (PEP 479): ``RuntimeError`` with it as
                ``__cause__``, as from any coroutine.
            InterfaceError: the store was closed, or this process was forked
                from the one that opened it.
            asyncio.CancelledError: the call was cancelled (see the module
                docstring: the operation is then over, committed or not).
        """
        self._usable()
        await self._slots.acquire()
        try:
            return await settled(self.submit(fn, *args, **kwargs))
        finally:
            self._slots.release()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """``fn(*args, **kwargs)`` handed to a worker, in the caller's context
        (``contextvars``); await it with :func:`settled`.

        Raises:
            InterfaceError: the store was closed, or this process is a fork.
        """
        self._usable()
        call = functools.partial(_no_stop_iteration, fn, *args, **kwargs)
        return self._executor.submit(contextvars.copy_context().run, call)

    def _usable(self) -> None:
        if os.getpid() != self._pid:
            raise errors.InterfaceError(
                detail=f"this async store was opened in process {self._pid}, and this process "
                f"({os.getpid()}) was forked from it: open the store again in this process"
            )
        if self.closed:
            raise errors.InterfaceError(detail="the async store is closed")

    def close(self) -> None:
        """Refuse new calls and wait for the running ones to end (blocking:
        run it on a thread of its own, as :meth:`AsyncStore.close` does)."""
        self.closed = True
        self._executor.shutdown(wait=True)


def _no_stop_iteration(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``, its ``StopIteration`` raised as ``RuntimeError``
    (an awaited future cannot carry one: asyncio would never complete it)."""
    try:
        return fn(*args, **kwargs)
    except StopIteration as stop:
        raise RuntimeError(f"{getattr(fn, '__name__', 'the call')} raised StopIteration") from stop


async def settled(job: Future[T]) -> T:
    """The result of ``job``, a call handed to a worker. Cancelled before the
    worker took it up, it never runs; cancelled while it runs, this waits for
    it to end and then raises ``CancelledError`` (its result dropped).

    Raises:
        whatever the call raised; asyncio.CancelledError as said.
    """
    waiter = asyncio.wrap_future(job)
    try:
        return await asyncio.shield(waiter)
    except asyncio.CancelledError:
        if not job.cancel():  # already running: outlast it, whatever comes
            await outlast(waiter)
        raise


async def outlast(waiter: asyncio.Future[T]) -> None:
    """Wait for ``waiter`` to end, through any number of cancellations (the
    caller re-raises the first), and mark its outcome retrieved."""
    while not waiter.done():
        try:
            await asyncio.wait([waiter])
        except asyncio.CancelledError:
            continue
    if not waiter.cancelled():
        waiter.exception()
