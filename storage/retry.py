"""The part of a transaction boundary every backend shares: retrying lost races
and counting statements.

A backend's boundary runs one attempt of an operation at a time (begin, the
body, commit, or roll back and translate); an attempt that lost a race raises
:class:`~.backend.Conflict`. :func:`run_attempts` retries those with jittered
exponential backoff (tenacity), so the retry re-reads and surfaces as the
domain error it means, and after :data:`MAX_ATTEMPTS` raises
``TransactionConflictError`` with the last conflict as its cause.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from turnkeeper.spec import errors

from .backend import Conflict

T = TypeVar("T")

MAX_ATTEMPTS = 40
"""Attempts per operation before a conflict becomes ``TransactionConflictError``."""


@dataclass
class _OpStats:
    calls: int = 0
    statements: float = 0
    retries: int = 0
    grouped: int = 0


class Stats:
    """Per operation name: calls, statements (BEGIN and COMMIT included, shared
    out among the calls of a group commit), retries, and the calls committed in
    a group commit's shared transaction."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: dict[str, _OpStats] = {}

    def add(
        self, operation: str, statements: float, attempts: int, *, grouped: bool = False
    ) -> None:
        """Count one call of ``operation`` that took ``attempts`` attempts
        (``grouped``: committed in a group commit with others)."""
        with self._lock:
            s = self._ops.setdefault(operation, _OpStats())
            s.calls += 1
            s.statements += statements
            s.retries += attempts - 1
            s.grouped += grouped

    def as_dict(self) -> dict[str, dict[str, float]]:
        """Per operation: calls, statements per call, retries and grouped calls."""
        with self._lock:
            return {
                op: {
                    "calls": s.calls,
                    "statements_per_call": s.statements / s.calls if s.calls else 0.0,
                    "retries": s.retries,
                    "grouped": s.grouped,
                }
                for op, s in sorted(self._ops.items())
            }


def run_attempts(
    operation: str,
    attempt: Callable[[], T],
    stats: Stats,
    statements: Callable[[], int],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``attempt`` until it does not raise ``Conflict`` (at most
    :data:`MAX_ATTEMPTS` times); count the call in ``stats``, with the
    statements ``statements()`` reports once it is done. ``sleep(seconds)``
    waits between attempts (``time.sleep``; the native async store's waits
    on its event loop: ``storage/bridge.py``).

    The first attempt runs on its own: most calls win it, and tenacity's
    machinery costs about 30 µs a call (a fenced append on PostgreSQL is about
    500 µs). A first attempt that lost a race is handed to tenacity as its
    first outcome, so the waits and the attempts are as tenacity counts them.

    Raises:
        TransactionConflictError: every attempt lost a race.
        whatever else ``attempt`` raised, unchanged.
    """
    attempts = 1
    try:
        try:
            return attempt()
        except Conflict as exc:
            lost: Conflict | None = exc

        def counted() -> T:
            nonlocal attempts, lost
            if lost is not None:  # the first attempt's outcome, already had
                first, lost = lost, None
                raise first
            attempts += 1
            return attempt()

        retrying = Retrying(
            retry=retry_if_exception_type(Conflict),
            stop=stop_after_attempt(MAX_ATTEMPTS),
            wait=wait_random_exponential(multiplier=0.001, max=0.05),
            sleep=sleep,
            reraise=False,
        )
        try:
            return retrying(counted)
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            origin = cause.__cause__ if cause is not None and cause.__cause__ else cause
            raise errors.TransactionConflictError(
                operation, attempts, detail=str(origin)
            ) from origin
    finally:
        stats.add(operation, statements(), attempts)


class Gate:
    """Admits a backend's operations until it closes; closing waits for the ones
    already running (new ones raise ``InterfaceError`` from that moment).

    Used as ``with gate:`` around an operation, never as separate enter and
    leave calls: the ``with`` statement leaves whatever its body raised,
    a cancellation landing on the body's first line included (a gap between
    an ``enter()`` call and a ``try`` left an interrupted operation counted
    as running, and ``close()`` waited for it for ever).

    Operations are counted per thread (its ``Thread`` object: an ident is
    reused once its thread ended), and closing waits only for other threads
    that are still alive: a cancellation landing as ``__exit__``
    starts (before any of it runs, which Python cannot prevent) leaves its
    thread counted, and that must not make the thread's own ``close()``, or
    any ``close()`` after the thread ended, wait for ever.

    A thread is alive while ``threading.enumerate()`` lists it, not while
    ``Thread.is_alive()`` says so: before Python 3.13, a ``join()`` of a
    thread that a Ctrl-C interrupts marks that thread ended while it still
    runs (CPython gh-90882), and closing then went on under its running
    operation (the demo's Ctrl-C: the file closed under a worker's renewal,
    ``OperationalError``, and a crash at exit).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._idle = threading.Condition(self.lock)
        self._inflight: dict[threading.Thread, int] = {}
        self.closed = False
        self.pid = os.getpid()
        """The process that opened the backend: only it may use it."""

    def forked(self) -> bool:
        """Whether this is a process forked from the one that opened the backend
        (``os.fork``, multiprocessing's default on Linux, a pre-forking server):
        its copy of the file's connection or of the pool's sockets is not its
        own, and neither is the store object's lease secret."""
        return os.getpid() != self.pid

    def __enter__(self) -> None:
        """Admit one operation of this thread.

        Raises:
            InterfaceError: the backend is closed (or closing).
        """
        self.admit(threading.current_thread())

    def __exit__(self, *exc: object) -> None:
        self.leave(threading.current_thread())

    def admit(self, me: threading.Thread) -> None:
        """Admit one operation of thread ``me``: for a generator that holds its
        admission and may be finished (collected) on another thread, which
        then leaves with ``me``; everything else uses ``with gate:``.

        Raises:
            InterfaceError: the backend is closed (or closing).
        """
        if self.forked():
            raise errors.InterfaceError(
                detail=f"this store object was opened by process {self.pid}, and this process "
                f"({os.getpid()}) was forked from it: open the store again in this process "
                "(a forked copy of its connections, and of the lease tokens it issues, is not "
                "this process's own)"
            )
        admitted = False
        try:
            with self.lock:
                if self.closed:
                    raise errors.InterfaceError(detail="the store is closed")
                self._inflight[me] = self._inflight.get(me, 0) + 1
                admitted = True
        except BaseException:
            if admitted:  # a cancellation as the lock was let go: not admitted after all
                self.leave(me)
            raise

    def leave(self, me: threading.Thread) -> None:
        """One admitted operation of thread ``me`` ended."""
        with self.lock:
            left = self._inflight.get(me, 0) - 1
            if left > 0:
                self._inflight[me] = left
            else:
                self._inflight.pop(me, None)
            self._idle.notify_all()

    def shut(self) -> None:
        """Close the gate (idempotent) and wait until no other living thread
        runs an operation (see the class docstring); looks again every
        :data:`LOOK_S` seconds, since a thread can end without leaving."""
        me = threading.current_thread()
        with self.lock:
            self.closed = True
            while self._others_running(me):
                self._idle.wait(LOOK_S)

    def _others_running(self, me: threading.Thread) -> bool:
        alive = set(threading.enumerate())  # not is_alive(): see the class docstring
        return any(thread is not me and thread in alive for thread in self._inflight)


LOOK_S = 1.0
"""How often a closing gate looks again whether the threads it waits for still live."""
