"""Sync domain code on an event loop: the greenlet bridge of the native async store.

The domain layer (``storage/ops/``) is written once, sync. The native async
store on PostgreSQL (``storage/postgres/native.py``) runs each call of it in
a greenlet spawned from the event loop (:func:`spawn`); wherever the backend
does I/O it calls :func:`await_only` with psycopg's coroutine, which switches
to the loop's greenlet, awaits the coroutine there (the loop serves other
tasks meanwhile) and switches back with its result or exception. This is the
approach of SQLAlchemy's asyncio extension (``greenlet_spawn`` and
``await_only`` in ``sqlalchemy.util._concurrency_py3k``), with no dependency
on SQLAlchemy.

Every greenlet of a loop runs on the loop's one thread, so sync code that
waits for another operation's progress with a thread primitive (a held
``threading.Lock``, a ``Condition``) would stop the loop and with it the
operation it waits for: a deadlock. :class:`Lock` is the lock for state held
across I/O (a ledger writer's appends); :func:`sleep` waits without stopping
the loop; :func:`off_loop` runs blocking I/O that is not the database's (blob
files, object stores) on a worker thread; :func:`in_bridge` lets a caller
choose a path that waits on no other operation (the ledger's appends commit
alone there, not in a group).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Generic, ParamSpec, TypeVar

import greenlet

from turnkeeper.spec import errors

P = ParamSpec("P")
T = TypeVar("T")


class _Bridged(greenlet.greenlet):
    """A greenlet running one sync call for :func:`spawn` (its parent awaits for it)."""

    committing = False
    """Whether the call reached its point of no return (:func:`committing`)."""


def in_bridge() -> bool:
    """Whether the caller runs inside a greenlet of :func:`spawn` (so
    :func:`await_only` may be called)."""
    return isinstance(greenlet.getcurrent(), _Bridged)


@contextlib.contextmanager
def committing(on: bool = True) -> Iterator[None]:
    """Mark the calling operation, inside a greenlet of :func:`spawn`, as past
    its point of no return from the block on (with ``on``): its ``COMMIT``, an
    autocommit write's statement, the wake-ups sent after a commit. The mark
    stays for the rest of the operation: a caller cancelled after it lets the
    operation end (:attr:`Operation.committing`) instead of cancelling it, so
    an operation of several transactions is never cut between them, and a
    ``COMMIT`` is never cut with its outcome unknown. Outside the bridge, nothing."""
    current = greenlet.getcurrent()
    if on and isinstance(current, _Bridged):
        current.committing = True
    yield


class Operation(Generic[T]):
    """One sync call run in a greenlet on this event loop (:meth:`run`), whose
    task may be cancelled while :attr:`committing` is false: the cancellation
    lands in the call where it awaits (psycopg then cancels the statement on
    the server and the transaction rolls back), so nothing of it is written."""

    def __init__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> None:
        self._call = functools.partial(fn, *args, **kwargs)
        self._child: _Bridged | None = None

    @property
    def committing(self) -> bool:
        """Whether the call is past its point of no return (:func:`committing`)."""
        return self._child is not None and self._child.committing

    async def run(self) -> T:
        """The call's result, as :func:`spawn` gives it."""
        child = self._child = _Bridged(self._call, greenlet.getcurrent())
        child.gr_context = contextvars.copy_context()
        handed = child.switch()
        while not child.dead:
            try:
                value = await handed
            except BaseException:
                handed = child.throw(*sys.exc_info())
            else:
                handed = child.switch(value)
        result: T = handed
        return result


async def spawn(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` run in a new greenlet on this event loop,
    awaiting each awaitable it hands up through :func:`await_only`, in a copy
    of the caller's ``contextvars`` context.

    Raises:
        whatever ``fn`` raises, unchanged (``StopIteration`` comes out as
        ``RuntimeError``, as from any coroutine); an exception of an awaited
        call (a cancellation included) is raised inside ``fn`` where it awaited.
    """
    return await Operation(fn, *args, **kwargs).run()


def await_only(awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, awaited by the event loop that runs this
    greenlet (see the module docstring). Sync; only valid inside :func:`spawn`.

    Raises:
        InterfaceError: called outside a greenlet of :func:`spawn` (from a
            plain thread, or on the loop itself): the awaitable is closed, not
            run, and nothing waits.
        whatever the awaitable raises.
    """
    current = greenlet.getcurrent()
    if not isinstance(current, _Bridged):
        if isinstance(awaitable, Coroutine):
            awaitable.close()
        raise errors.InterfaceError(
            detail="a native async store's database call ran outside the event loop's "
            "operation greenlet (turnkeeper.storage.bridge.spawn): await the async store's "
            "methods; use its sync twin (store.sync) from other threads"
        )
    parent = current.parent
    assert parent is not None  # a spawned greenlet's parent is the awaiting one
    result: T = parent.switch(awaitable)
    return result


def off_loop(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``, blocking I/O that is not the database's (a
    blob's file or object store): inside :func:`spawn` on a worker thread of
    the loop's default executor (``asyncio.to_thread``), awaited by the loop,
    which runs other tasks meanwhile; elsewhere called directly.

    Raises:
        whatever ``fn`` raises.
    """
    if in_bridge():
        return await_only(asyncio.to_thread(fn, *args, **kwargs))
    return fn(*args, **kwargs)


def sleep(seconds: float) -> None:
    """Wait ``seconds``: inside :func:`spawn` on the event loop
    (``asyncio.sleep``), else ``time.sleep``."""
    if in_bridge():
        await_only(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


class Lock:
    """A mutual-exclusion lock (``with lock:``) for state held across I/O, that
    greenlets of :func:`spawn` wait for on their event loop (a waiting one
    lets the loop run the holder's I/O) and threads wait for as on a
    ``threading.Lock``. First come first served among greenlets; a greenlet
    cancelled while it waits leaves the queue (handing on a wake-up it got)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._guard = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    def acquire(self) -> None:
        """Take the lock, waiting for it as said in the class docstring."""
        if not in_bridge():
            self._lock.acquire()
            return
        while True:
            with self._guard:
                if self._lock.acquire(blocking=False):
                    return
                loop = asyncio.get_running_loop()
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
            try:
                await_only(waiter)
            except BaseException:
                with self._guard:
                    try:
                        self._waiters.remove((loop, waiter))
                    except ValueError:  # woken already: the wake-up goes on to the next
                        self._wake_next()
                raise

    def release(self) -> None:
        """Let the lock go and wake the first greenlet that waits for it."""
        with self._guard:
            self._lock.release()
            self._wake_next()

    def locked(self) -> bool:
        """Whether some greenlet or thread holds the lock."""
        return self._lock.locked()

    def _wake_next(self) -> None:
        while self._waiters:
            loop, waiter = self._waiters.popleft()
            try:
                loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # its loop is closed: nobody waits there any more
                continue
            return

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
