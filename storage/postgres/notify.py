"""Wake-ups on PostgreSQL: ``NOTIFY`` after a commit, one ``LISTEN`` connection
per store object that subscribes.

A committed operation that published topics sends a ``pg_notify`` per topic,
all in one statement, on the store's channel, ``turnkeeper:<schema>`` (after its ``COMMIT``,
on the same connection: a wake-up is advisory, so it need not be atomic with
the write, and a failure to send it never fails the committed operation). A
store object's first :meth:`~.db.Database.subscribe` starts a
:class:`Listener`: a thread with its own connection (not a pooled one, and
not through a transaction-mode pooler: ``LISTEN`` needs a session, so behind
one it connects to the store's ``listen_url``) that feeds every notification
on the channel to the store object's signals. Each connection it opens is
checked first (:func:`.connect.listen_check`); a check that fails is kept
in :attr:`Listener.problem` for the subscriber to raise. When its
connection breaks, or psycopg fails on it in any other way (an exception
not its own: see :mod:`.faults`), it reconnects with backoff and then fires
every topic once, so that a waiter looks in the store for whatever it missed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any, Protocol

import psycopg

from ..wakeups import Signals, Topic
from . import text


def channel(schema: str | None) -> str:
    """The store's channel name: one per schema, so stores in other schemas of
    the same database do not wake each other."""
    return f"turnkeeper:{schema or ''}"


SQL = "SELECT pg_notify(%s, topic) FROM unnest(%s::TEXT[]) AS topic"
"""The one statement that sends a commit's wake-ups (psycopg placeholders)."""


def statement(name: str, topics: list[str]) -> tuple[str, list[Any]]:
    """The statement that sends each of ``topics`` on channel ``name``, and its
    parameters (the topics once each, in order)."""
    return SQL, [name, list(dict.fromkeys(topics))]


def counted(topics: list[str]) -> int:
    """The statements that send ``topics``: one, or none when there is no topic."""
    return 1 if topics else 0


def send(conn: psycopg.Connection[Any], name: str, topics: list[str]) -> int:
    """Send each of ``topics`` on channel ``name`` (after its commit), all in
    one statement; the number of statements sent (:func:`counted`). Never
    raises (but cancellation): a wake-up is advisory, and the write
    committed. The statement is a transaction of its own that writes no WAL
    before its commit record, so its commit waits for no flush. (A write
    whose held writes go with its ``COMMIT`` sends it in that same round
    trip instead: ``Tx.commit_held``.)"""
    if not topics:
        return 0
    with contextlib.suppress(Exception):  # a driver fault too (see .faults): advisory
        conn.execute(*statement(name, topics))
    return counted(topics)


class Ready(Protocol):
    """Set once a listener listens (or its first connection was refused)."""

    def wait(self, timeout: float | None = None) -> bool: ...


class Listening(Protocol):
    """What a store object's listener offers its subscribers: :class:`Listener`
    (a thread), or the native store's task (``storage/postgres/native.py``)."""

    @property
    def ready(self) -> Ready: ...

    @property
    def problem(self) -> str | None: ...

    def close(self) -> None: ...


def listen(
    url: str,
    signals: Signals,
    name: str,
    check: Callable[[Any, bool], str | None],
    *,
    connect: Callable[[str], ContextManager[Any]],
    stopped: Callable[[], bool],
    pause: Callable[[float], object],
    ready: Callable[[], None],
) -> str | None:
    """``LISTEN`` on channel ``name`` at ``url`` and fire ``signals`` with each
    notification until ``stopped()``: each connection (``connect(url)``, a
    context manager giving a connection in autocommit) vetted by ``check``,
    ``ready()`` called once it listens, and after a failure ``pause(delay)``
    (from 0.1 s, doubling to 5 s) before connecting again and firing every
    topic once. Returns what ``check`` found wrong with the first connection
    (nothing listens then), else ``None`` once stopped. Shared by the
    :class:`Listener` thread and the native store's listener task
    (``storage/postgres/native.py``)."""
    delay = 0.1
    first = True
    while not stopped():
        try:
            with connect(url) as conn:
                text.register(conn)
                problem = check(conn, first)
                if problem is not None:
                    if first:  # a wrong URL: the subscriber raises it
                        return problem
                    raise psycopg.OperationalError(problem)  # try again later
                conn.execute(f"LISTEN {psycopg.sql.Identifier(name).as_string()}")
                ready()
                if not first:  # what was sent while we were away is lost: look again
                    for topic in Topic:
                        signals.fire(topic.value)
                first, delay = False, 0.1
                while not stopped():
                    for note in conn.notifies(timeout=0.5):
                        signals.fire(note.payload)
        except Exception:  # psycopg's errors, a driver fault (.faults), a check's error
            pause(delay)
            delay = min(delay * 2, 5.0)
    return None


def _connect(url: str) -> ContextManager[Any]:
    return psycopg.connect(url, autocommit=True, prepare_threshold=None)


class Listener:
    """A thread that ``LISTEN``s on channel ``name`` at ``url`` and fires
    ``signals`` (:func:`listen`); ``check(conn, first)`` vets each connection
    it opens (what is wrong with it, or ``None``)."""

    def __init__(
        self,
        url: str,
        signals: Signals,
        name: str,
        check: Callable[[Any, bool], str | None],
    ) -> None:
        self._url = url
        self._signals = signals
        self._name = name
        self._check = check
        self._stop = threading.Event()
        self.ready = threading.Event()
        self.problem: str | None = None
        """Why the first connection was refused (then the thread has ended)."""
        self._thread = threading.Thread(target=self._run, name="turnkeeper-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.problem = listen(
            self._url,
            self._signals,
            self._name,
            self._check,
            connect=_connect,
            stopped=self._stop.is_set,
            pause=self._stop.wait,
            ready=self.ready.set,
        )
        if self.problem is not None:
            self.ready.set()

    def close(self) -> None:
        """Stop listening (within about half a second)."""
        self._stop.set()
        self._thread.join(timeout=10)
