"""Wake-ups on PostgreSQL: ``NOTIFY`` after a commit, one ``LISTEN`` connection
per store object that subscribes.

A committed operation that published topics sends one ``pg_notify`` per
topic on the channel ``turnkeeper:<schema>`` (after its ``COMMIT``, on the
same connection: a wake-up is advisory, so it need not be atomic with the
write, and a failure to send it never fails the committed operation). A
store object's first :meth:`~.db.Database.subscribe` starts a
:class:`Listener`: a thread with its own connection (not a pooled one, and
not through a transaction-mode pooler: ``LISTEN`` needs a session) that
feeds every notification on the channel to the store object's signals.
When its connection breaks it reconnects with backoff and then fires every
topic once, so that a waiter looks in the store for whatever it missed.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import psycopg

from turnkeeper.spec import errors

from ..backend import present
from ..wakeups import Signals, Topic
from . import text

CHANNEL_SQL = "SELECT 'turnkeeper:' || current_schema()"
"""The store's channel name: one per schema, so stores in other schemas of the
same database do not wake each other."""


def send(conn: psycopg.Connection[Any], topics: list[str]) -> None:
    """Send each of ``topics`` on the store's channel (after its commit)."""
    for topic in dict.fromkeys(topics):
        with contextlib.suppress(psycopg.Error):
            conn.execute("SELECT pg_notify('turnkeeper:' || current_schema(), %s)", [topic])


class Listener:
    """A thread that ``LISTEN``s on the store's channel and fires ``signals``."""

    def __init__(self, url: str, signals: Signals) -> None:
        self._url = url
        self._signals = signals
        self._stop = threading.Event()
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="turnkeeper-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay = 0.1
        first = True
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True) as conn:
                    text.register(conn)
                    row = present(conn.execute(CHANNEL_SQL).fetchone(), "the channel's name")
                    conn.execute(f"LISTEN {psycopg.sql.Identifier(row[0]).as_string(conn)}")
                    self.ready.set()
                    if not first:  # what was sent while we were away is lost: look again
                        for topic in Topic:
                            self._signals.fire(topic.value)
                    first, delay = False, 0.1
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._signals.fire(note.payload)
            except (psycopg.Error, errors.TurnkeeperError):  # (one more try)
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def close(self) -> None:
        """Stop listening (within about half a second)."""
        self._stop.set()
        self._thread.join(timeout=10)
