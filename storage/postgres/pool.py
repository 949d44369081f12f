"""The PostgreSQL backend's connection pool: ``psycopg_pool``, told how to
check a connection before lending it and how to notice a server that went
away.

- **The check before a lend** (:meth:`Pool.check`) costs no round trip while
  a connection is in use: the server is asked only when the idle
  connection's socket has something to read or was hung up, which is how a
  server that closed it shows (a restart, a failover,
  ``pg_terminate_backend``, ``idle_session_timeout``: its goodbye, then the
  end of the stream), or when the connection was last lent
  :data:`IDLE_CHECK_S` seconds ago or more, after which a middlebox (a NAT,
  a load balancer) may have forgotten it without a word.
- **A dead connection found** makes the pool check every other idle one at
  once (``ConnectionPool.check``): after a restart they are all dead, and
  ``psycopg_pool`` would otherwise back off 1, 2, 4, 8, 16 s between them,
  failing the first operation after a restart with a pool timeout.
- **Reconnecting** after a connection was lost (a restart, a failover) or
  while the server is down: each attempt that fails waits
  ``reconnect_delay_s`` (default :data:`RECONNECT_DELAY_S`), doubling per
  failure up to ``reconnect_max_delay_s`` (:data:`RECONNECT_MAX_DELAY_S`),
  where ``psycopg_pool``'s own schedule (1, 2, 4, 8, 16 s … between
  attempts, not a public setting) left writes failing or waiting up to 16 s
  after the server took connections again. :class:`Backoff` is that
  schedule; :class:`ConnectionPool` gives it to every new connection's
  first attempt (``_add_connection``, a private seam of psycopg_pool 3.2
  and 3.3: ``pyproject.toml`` pins that range, and
  ``model_tests/backends/test_postgres_reconnect.py`` fails if the seam changes).
- **A silent server** (a host gone without a reset, a partition): TCP
  keepalives and ``tcp_user_timeout`` (:data:`TCP_DEFAULTS`) make the
  kernel fail the socket in about half a minute instead of the
  retransmission timeout's quarter of an hour, and ``connect_timeout`` bounds
  a new connection; the user's own values (the URL's, the environment's, a
  service file's) win.
"""

from __future__ import annotations

import os
import select
import time
import weakref
from typing import Any

import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool.base import AttemptWithBackoff

IDLE_CHECK_S = 10.0
"""A connection idle this long (seconds) is checked with a round trip before it is lent."""

TCP_DEFAULTS = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "15",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
"""libpq parameters every pooled connection gets unless the URL sets them, or
their environment variable (:data:`ENVIRONMENT`) does, or the URL or
``PGSERVICE`` names a service (whose file may set them): seconds, but
``tcp_user_timeout`` in milliseconds; they apply to TCP connections only."""

RECONNECT_DELAY_S = 0.1
"""The wait (seconds) after a first failed connection attempt; it doubles per failure."""

RECONNECT_MAX_DELAY_S = 0.5
"""The longest wait (seconds) between two connection attempts: the server is
tried again at most this long after it takes connections again, and a
refused attempt costs the server one short-lived process, so a fleet of 100
store objects of 8 connections each tries about 1,600 times a second while
a server is down."""

POOL_TIMEOUT_S = 30.0
"""How long (seconds) an operation waits for a pooled connection (all lent,
or none can be made: the server is down) before ``OperationalError``."""

ENVIRONMENT = {"connect_timeout": "PGCONNECT_TIMEOUT"}
"""The libpq environment variables of :data:`TCP_DEFAULTS`' parameters (the
others have none)."""


class Backoff(AttemptWithBackoff):
    """The waits between one connection's attempts: ``first_s`` (seconds,
    ±10 % jitter) after the first failure, doubled after each next one,
    never more than ``max_s``; attempts stop ``timeout`` seconds after the
    first failure (``psycopg_pool``'s ``reconnect_timeout``, 5 minutes: the
    pool then gives that connection up and makes a new one when an
    operation needs it)."""

    def __init__(self, *, timeout: float, first_s: float, max_s: float) -> None:
        super().__init__(timeout=timeout)
        self.INITIAL_DELAY = first_s
        self.max_s = max_s

    def update_delay(self, now: float) -> None:
        """Set :attr:`delay`, the wait (seconds) before the next attempt, after
        a failure at ``now`` (``time.monotonic()`` seconds)."""
        super().update_delay(now)
        self.delay = min(self.delay, self.max_s)


class ConnectionPool(psycopg_pool.ConnectionPool[psycopg.Connection[Any]]):
    """``psycopg_pool.ConnectionPool`` whose new connections are attempted on
    the :class:`Backoff` schedule of ``reconnect_delay_s`` and
    ``reconnect_max_delay_s`` (seconds) instead of its 1, 2, 4, 8, 16 s …"""

    def __init__(
        self, *args: Any, reconnect_delay_s: float, reconnect_max_delay_s: float, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.reconnect_delay_s = reconnect_delay_s
        self.reconnect_max_delay_s = reconnect_max_delay_s

    def backoff(self) -> Backoff:
        """A new connection's schedule of attempts."""
        return Backoff(
            timeout=self.reconnect_timeout,
            first_s=self.reconnect_delay_s,
            max_s=self.reconnect_max_delay_s,
        )

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        # psycopg_pool makes each new connection here (AddConnection), with no
        # attempt the first time and the one it rescheduled after a failure
        super()._add_connection(attempt or self.backoff(), growing=growing)


def connection_kwargs(url: str, prepared: bool) -> dict[str, Any]:
    """The keyword arguments of every pooled connection to ``url``: autocommit,
    no prepared statements without ``prepared``, and :data:`TCP_DEFAULTS`
    where neither the URL, the environment nor a service sets them."""
    given = conninfo_to_dict(url)
    if "service" in given or os.environ.get("PGSERVICE"):
        defaults = {}  # the service file may set them: its values win
    else:
        defaults = {
            k: v
            for k, v in TCP_DEFAULTS.items()
            if k not in given and not os.environ.get(ENVIRONMENT.get(k, ""))
        }
    return {"autocommit": True, **({} if prepared else {"prepare_threshold": None}), **defaults}


class Lends:
    """When each connection was last lent, to judge whether the check before a
    lend needs a round trip (module docstring)."""

    def __init__(self) -> None:
        self._lent: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    def needs_round_trip(self, conn: Any) -> bool:
        """Whether ``conn`` (about to be lent: stamped now) must be asked:
        its socket has something to read or was hung up, or it was last lent
        :data:`IDLE_CHECK_S` seconds ago or more.

        Raises:
            psycopg.OperationalError: it is closed or broken already.
        """
        if conn.closed or conn.broken:
            raise psycopg.OperationalError("the connection is closed")
        # Idle since its last lend at most (a ``reset`` callback would stamp its
        # return, but makes the pool give connections back on a worker thread).
        now = time.monotonic()
        last, self._lent[conn] = self._lent.get(conn), now
        stale = last is not None and now - last >= IDLE_CHECK_S
        return stale or readable(conn.pgconn.socket)


class Pool:
    """A :class:`ConnectionPool` of ``size`` connections to ``url``, each set
    up by ``configure``, reconnecting on the schedule of ``reconnect_delay_s``
    and ``reconnect_max_delay_s`` (seconds; see the module docstring). Without
    ``prepared`` its connections prepare no statement (``prepare_threshold=None``:
    behind a transaction-mode pooler a prepared statement's name would reach
    another server connection)."""

    def __init__(
        self,
        url: str,
        size: int,
        configure: Any,
        *,
        prepared: bool = True,
        reconnect_delay_s: float = RECONNECT_DELAY_S,
        reconnect_max_delay_s: float = RECONNECT_MAX_DELAY_S,
    ) -> None:
        self._lends = Lends()
        self.pool = ConnectionPool(
            url,
            reconnect_delay_s=reconnect_delay_s,
            reconnect_max_delay_s=reconnect_max_delay_s,
            min_size=1,
            max_size=size,
            kwargs=connection_kwargs(url, prepared),
            configure=configure,
            check=self.check,
            open=False,
            name="turnkeeper",
        )

    def check(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's check of a connection it is about to lend (module
        docstring).

        Raises:
            Exception: the connection is broken (``psycopg.OperationalError``),
                or psycopg failed on it in another way: the pool drops it and
                lends another; every other idle one was checked too.
        """
        if not self._lends.needs_round_trip(conn):
            return
        try:
            psycopg_pool.ConnectionPool.check_connection(conn)
        except Exception:  # a psycopg error, or a driver fault (see .faults)
            self.pool.check()  # the others are likely dead too: find them all now
            raise


def readable(fd: int) -> bool:
    """Whether socket ``fd`` has something to read or was hung up, without
    waiting (``poll``: ``select`` refuses descriptors above 1023, which a
    worker holding many files or sockets gets)."""
    if not hasattr(select, "poll"):  # Windows: no poll, and no such limit
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class AsyncConnectionPool(psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """:class:`ConnectionPool`'s twin for the native async store
    (``storage/postgres/native.py``): ``psycopg_pool.AsyncConnectionPool``
    whose new connections are attempted on the :class:`Backoff` schedule."""

    def __init__(
        self, *args: Any, reconnect_delay_s: float, reconnect_max_delay_s: float, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.reconnect_delay_s = reconnect_delay_s
        self.reconnect_max_delay_s = reconnect_max_delay_s

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        await super()._add_connection(
            attempt
            or Backoff(
                timeout=self.reconnect_timeout,
                first_s=self.reconnect_delay_s,
                max_s=self.reconnect_max_delay_s,
            ),
            growing=growing,
        )


class AsyncPool:
    """:class:`Pool` for the native async store: an :class:`AsyncConnectionPool`
    of ``size`` ``psycopg.AsyncConnection`` to ``url``, set up by the coroutine
    function ``configure``, with the same connection arguments, the same check
    before a lend and the same reconnection schedule. Open it with ``await
    pool.pool.open(...)`` on the event loop that will use it."""

    def __init__(
        self,
        url: str,
        size: int,
        configure: Any,
        *,
        prepared: bool = True,
        reconnect_delay_s: float = RECONNECT_DELAY_S,
        reconnect_max_delay_s: float = RECONNECT_MAX_DELAY_S,
    ) -> None:
        self._lends = Lends()
        self.pool = AsyncConnectionPool(
            url,
            reconnect_delay_s=reconnect_delay_s,
            reconnect_max_delay_s=reconnect_max_delay_s,
            min_size=1,
            max_size=size,
            kwargs=connection_kwargs(url, prepared),
            configure=configure,
            check=self.check,
            open=False,
            name="turnkeeper-native",
        )

    async def check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """:meth:`Pool.check`, awaited.

        Raises:
            Exception: as :meth:`Pool.check`.
        """
        if not self._lends.needs_round_trip(conn):
            return
        try:
            await psycopg_pool.AsyncConnectionPool.check_connection(conn)
        except Exception:
            await self.pool.check()
            raise
