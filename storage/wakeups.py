"""Wake-ups: advisory notifications after durable transitions (session seed
NotifyRuntimeStateChanged).

An operation that makes work for someone else publishes a topic *in its
transaction* (``tx.notify``); the backend delivers it only once that
transaction commits: DuckDB to the store objects of this process, PostgreSQL
with ``NOTIFY`` (which the server sends at commit) to every listening
process. A worker subscribes, looks for work in the store, and waits for the
next wake-up or its timeout before it looks again. The store stays the
authority: a wake-up carries no state, may be lost (a listener reconnecting,
a dropped notification) or spurious, and only shortens the wait; a worker
that polls on its timeout does all the work without any.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from enum import StrEnum

from turnkeeper.spec import errors


class Topic(StrEnum):
    """What a wake-up says happened (durably, at commit)."""

    RUN_ENDED = "run_ended"
    """A run reached a terminal status (finish, recovery convergence)."""
    DELIVERY_DUE = "delivery_due"
    """An outbox operation may have become claimable: a plan was written, a claim
    requeued or released, or a step finished (its dependents may be free)."""
    LEASE_RELEASED = "lease_released"
    """A lease was released (its target is free at once)."""
    ORPHAN = "orphan"
    """A non-terminal run lost its owner: its session's lease was released, or a
    recovery attempt failed and will be due again. (An owner whose lease merely
    expires publishes nothing: coordinators find those on their timeout.)"""


def check_topics(topics: Iterable[object]) -> tuple[Topic, ...]:
    """``topics`` as :class:`Topic` values (at least one).

    Raises:
        InvalidInputError: an unknown topic, or none.
    """
    if isinstance(topics, str):
        topics = [topics]
    found = []
    for t in topics:
        try:
            found.append(Topic(t if isinstance(t, str) else ""))
        except ValueError:
            names = ", ".join(x.value for x in Topic)
            raise errors.InvalidInputError("topics", f"{t!r} is not one of {names}") from None
    if not found:
        raise errors.InvalidInputError("topics", "subscribe to at least one topic")
    return tuple(found)


class Signals:
    """Counters per topic and a condition to wait on: what a backend's deliveries
    feed and its subscriptions wait on (one per process and store file, or per
    PostgreSQL store object)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._counts: Counter[str] = Counter()
        self._watchers: dict[int, Callable[[], None]] = {}
        self._next_watcher = 0

    def fire(self, topic: str) -> None:
        """Count one wake-up of ``topic``, wake every waiter and call every
        watcher (on the firing thread, outside the lock)."""
        with self._cond:
            self._counts[topic] += 1
            self._cond.notify_all()
            watchers = list(self._watchers.values())
        for watcher in watchers:
            watcher()

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after every wake-up, on the thread that fires it
        (it must be quick and must not raise: the async store's subscriptions
        hand it to their event loop); returns the function that stops it."""
        with self._cond:
            key = self._next_watcher
            self._next_watcher += 1
            self._watchers[key] = callback

        def unwatch() -> None:
            with self._cond:
                self._watchers.pop(key, None)

        return unwatch

    def counts(self, topics: Iterable[str]) -> dict[str, int]:
        """The current count of each of ``topics``."""
        with self._cond:
            return {t: self._counts[t] for t in topics}

    def wait(self, since: dict[str, int], timeout_s: float) -> list[str]:
        """Wait up to ``timeout_s`` seconds for a topic of ``since`` to count past
        it; returns the topics that did (empty on timeout) and moves ``since``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                fired = [t for t, n in since.items() if self._counts[t] > n]
                if fired:
                    since.update({t: self._counts[t] for t in since})
                    return fired
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left)


class Subscription:
    """Wake-ups of some topics since this subscription was made (or since its last
    :meth:`wait`). Subscribe first, then look for work, then wait: a wake-up
    that comes between the look and the wait is not missed."""

    def __init__(self, signals: Signals, topics: tuple[Topic, ...]) -> None:
        self.topics = topics
        self._signals = signals
        self._since = signals.counts([t.value for t in topics])

    def wait(self, timeout_s: float) -> list[Topic]:
        """Block up to ``timeout_s`` seconds for a wake-up; returns the topics
        that fired (empty after the timeout: look in the store anyway).

        Raises:
            InvalidInputError: ``timeout_s`` is not finite seconds >= 0.
        """
        from .validate import check_seconds

        wait_s = check_seconds(timeout_s, "timeout_s")
        return [Topic(t) for t in self._signals.wait(self._since, wait_s)]

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after each wake-up of any topic from now on (see
        :meth:`Signals.watch`); returns the function that stops it. What fired
        is then learnt from :meth:`wait` with ``timeout_s=0``."""
        return self._signals.watch(callback)
