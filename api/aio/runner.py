"""Running the sync store's operations off the event loop.

The async store (:class:`~turnkeeper.aio.AsyncStore`) has no domain logic of
its own: each ``await store.<area>.<method>(...)`` runs the sync method of the
one domain layer on a worker thread of its :class:`Runner`, so the event loop
never waits on the database. On DuckDB those threads are the writers that the
backend's group commit (``storage/duck/group.py``) already gathers into
shared commits; on PostgreSQL each takes a connection of the store's pool.

The runner is bounded: at most ``workers`` operations run at once, and
further callers wait, asynchronously, for a free worker (a bounded queue:
the loop is never blocked, and a burst of callers never makes an unbounded
backlog of threads or connections).

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


class Runner:
    """A bounded pool of worker threads running sync store calls for the
    event loop (see the module docstring). ``workers`` is how many run at once
    (1 to 64). Usable from any event loop; :meth:`close` waits for the calls
    still running.

    Raises (from the constructor):
        InvalidInputError: ``workers`` is not an integer from 1 to 64.
    """

    def __init__(self, workers: int = WORKERS) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64:
            raise errors.InvalidInputError("workers", "expected an integer from 1 to 64")
        self.workers = workers
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="turnkeeper-aio")
        self._slots = asyncio.Semaphore(workers)
        self.closed = False

    async def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a worker thread, once one is free.

        Raises:
            whatever ``fn`` raises, unchanged.
            InterfaceError: the store was closed.
            asyncio.CancelledError: the call was cancelled (see the module
                docstring: the operation is then over, committed or not).
        """
        async with self._slots:
            return await settled(self.submit(fn, *args, **kwargs))

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """``fn(*args, **kwargs)`` handed to a worker, in the caller's context
        (``contextvars``); await it with :func:`settled`.

        Raises:
            InterfaceError: the store was closed.
        """
        if self.closed:
            raise errors.InterfaceError(detail="the async store is closed")
        call = functools.partial(fn, *args, **kwargs)
        return self._executor.submit(contextvars.copy_context().run, call)

    def close(self) -> None:
        """Refuse new calls and wait for the running ones to end (blocking:
        run it on a thread of its own, as :meth:`AsyncStore.close` does)."""
        self.closed = True
        self._executor.shutdown(wait=True)


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
