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
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

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

ENVIRONMENT = {"connect_timeout": "PGCONNECT_TIMEOUT"}
"""The libpq environment variables of :data:`TCP_DEFAULTS`' parameters (the
others have none)."""


class Pool:
    """A ``psycopg_pool.ConnectionPool`` of ``size`` connections to ``url``,
    each set up by ``configure`` (see the module docstring). Without
    ``prepared`` its connections prepare no statement (``prepare_threshold=None``:
    behind a transaction-mode pooler a prepared statement's name would reach
    another server connection)."""

    def __init__(self, url: str, size: int, configure: Any, *, prepared: bool = True) -> None:
        given = conninfo_to_dict(url)
        if "service" in given or os.environ.get("PGSERVICE"):
            defaults = {}  # the service file may set them: its values win
        else:
            defaults = {
                k: v
                for k, v in TCP_DEFAULTS.items()
                if k not in given and not os.environ.get(ENVIRONMENT.get(k, ""))
            }
        self._lent: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url,
            min_size=1,
            max_size=size,
            kwargs={
                "autocommit": True,
                **({} if prepared else {"prepare_threshold": None}),
                **defaults,
            },
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
        if conn.closed or conn.broken:
            raise psycopg.OperationalError("the connection is closed")
        # Idle since its last lend at most (a ``reset`` callback would stamp its
        # return, but makes the pool give connections back on a worker thread).
        now = time.monotonic()
        last, self._lent[conn] = self._lent.get(conn), now
        stale = last is not None and now - last >= IDLE_CHECK_S
        if not (stale or readable(conn.pgconn.socket)):
            return
        try:
            ConnectionPool.check_connection(conn)
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
