"""The native async PostgreSQL backend: psycopg's ``AsyncConnection`` from a
``psycopg_pool.AsyncConnectionPool``, on the event loop, under the one
domain layer.

:class:`NativeDatabase` is :class:`~.db.Database` (the same transaction
boundary, retries, error translation and pooler handling: nothing of it is
copied) whose one place of taking a connection, :meth:`~.db.Database.connection`,
lends a sync-looking proxy (:class:`Connection`) over a pooled
``psycopg.AsyncConnection``. Each of the proxy's calls that does I/O hands
psycopg's coroutine to the event loop with :func:`~turnkeeper.storage.bridge.await_only`,
so a store call of the domain layer, run in a greenlet by
:func:`~turnkeeper.storage.bridge.spawn`, does all its database I/O on the
loop's thread, and other tasks run while it waits. Retries wait on the loop
(:func:`~turnkeeper.storage.bridge.sleep`).

The proxies cover exactly what the backend does on a connection
(``db.py``, ``faults.py``, ``connect.py``, ``notify.py``, ``query.py``,
``text.py``, ``ahead.py``): ``execute`` (with ``prepare``), ``pipeline``,
``raw_cursor()``, ``cursor()`` and
named server-side cursors (``execute``, ``fetchone``, ``fetchmany``,
``fetchall``, ``nextset``, ``description``, ``rowcount``, ``adapters``,
``close``), ``COPY`` (``copy``, ``write_row``), and ``closed``, ``broken``,
``info``, ``pgconn``, ``adapters``, ``close``.

A native database is a twin of an open sync :class:`~.db.Database`
(:attr:`~.db.Database.opened`): the same URL, schema, pooler mode, pool
size and reconnection schedule, with no probe of its own. Its pool belongs
to the event loop that opened it (:meth:`NativeDatabase.open`). Wake-ups
(``LISTEN``) come from a :class:`NativeListener`: the sync listener's loop
(:func:`.notify.listen`) as a task on the event loop, over an
``AsyncConnection``'s ``notifies()`` (behind a transaction pooler on
``listen_url``, exactly as the sync listener). What blocks without being
database I/O stays off the loop: blob files and object stores
(``bridge.off_loop``), and the async store closes the sync twin on a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from turnkeeper.spec import errors

from .. import bridge
from ..bridge import await_only
from ..store import BaseStore
from ..wakeups import Signals
from . import notify, text
from .db import SETUP_SQL, Database, Opened
from .pool import AsyncPool


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    """Set up a new pooled async connection as ``db._configure`` does a sync one."""
    text.register(conn)  # type: ignore[arg-type]  # (it only registers adapters)
    await conn.execute(SETUP_SQL)


@contextlib.contextmanager
def bridged(manager: Any) -> Iterator[Any]:
    """The async context manager ``manager`` used as a sync one inside a
    greenlet of :func:`~turnkeeper.storage.bridge.spawn`."""
    value = await_only(manager.__aenter__())
    try:
        yield value
    except BaseException:
        if not await_only(manager.__aexit__(*sys.exc_info())):
            raise
    else:
        await_only(manager.__aexit__(None, None, None))


class Copy:
    """A ``COPY … FROM STDIN`` in progress (``psycopg.AsyncCopy``), sync."""

    def __init__(self, copy: psycopg.AsyncCopy) -> None:
        self._copy = copy

    def write_row(self, row: Sequence[Any]) -> None:
        """Send one row."""
        await_only(self._copy.write_row(row))


class Cursor:
    """A ``psycopg.AsyncCursor`` or ``AsyncServerCursor``, sync (see the module docstring)."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def adapters(self) -> Any:
        return self._cursor.adapters

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Cursor:
        await_only(self._cursor.execute(query, params, **kwargs))
        return self

    def fetchone(self) -> Any:
        return await_only(self._cursor.fetchone())

    def fetchmany(self, size: int = 0) -> list[Any]:
        found: list[Any] = await_only(self._cursor.fetchmany(size))
        return found

    def fetchall(self) -> list[Any]:
        found: list[Any] = await_only(self._cursor.fetchall())
        return found

    def nextset(self) -> bool | None:
        return self._cursor.nextset()  # type: ignore[no-any-return]

    def close(self) -> None:
        await_only(self._cursor.close())

    @contextlib.contextmanager
    def copy(self, statement: str) -> Iterator[Copy]:
        with bridged(self._cursor.copy(statement)) as copy:
            yield Copy(copy)

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Connection:
    """A pooled ``psycopg.AsyncConnection``, sync (see the module docstring)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.aconn = conn
        """The async connection every call goes to."""

    @property
    def closed(self) -> bool:
        return self.aconn.closed

    @property
    def broken(self) -> bool:
        return self.aconn.broken

    @property
    def info(self) -> Any:
        return self.aconn.info

    @property
    def pgconn(self) -> Any:
        return self.aconn.pgconn

    @property
    def adapters(self) -> Any:
        return self.aconn.adapters

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Cursor:
        return Cursor(await_only(self.aconn.execute(query, params, **kwargs)))

    def raw_cursor(self) -> Cursor:
        """A cursor that sends its SQL as written (``AsyncRawCursor``:
        :func:`.ahead.cursor`)."""
        return Cursor(psycopg.AsyncRawCursor(self.aconn))

    def cursor(self, name: str = "") -> Cursor:
        if name:
            return Cursor(self.aconn.cursor(name=name))
        return Cursor(self.aconn.cursor())

    @contextlib.contextmanager
    def pipeline(self) -> Iterator[Any]:
        with bridged(self.aconn.pipeline()) as pipeline:
            yield pipeline

    def close(self) -> None:
        await_only(self.aconn.close())

    def notifies(self, *, timeout: float | None = None) -> Iterator[psycopg.Notify]:
        """The notifications that arrive within ``timeout`` seconds
        (``AsyncConnection.notifies``), each awaited on the loop."""
        found = self.aconn.notifies(timeout=timeout)
        while True:
            try:
                yield await_only(found.__anext__())
            except StopAsyncIteration:
                return


@contextlib.contextmanager
def _listen_connection(url: str) -> Iterator[Connection]:
    """A connection of its own (not pooled) for ``LISTEN``, closed at the end."""
    conn = await_only(psycopg.AsyncConnection.connect(url, autocommit=True, prepare_threshold=None))
    try:
        yield Connection(conn)
    finally:
        await_only(conn.close())


class _Ready:
    """A :class:`.notify.Ready` on the event loop (waited for inside the bridge)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def set(self) -> None:
        self.event.set()

    def wait(self, timeout: float | None = None) -> bool:
        return bool(await_only(_waited(self.event, timeout)))


async def _waited(event: asyncio.Event, timeout: float | None) -> bool:
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


class NativeListener:
    """The native store's ``LISTEN``: :func:`.notify.listen` (the sync
    listener's very loop) in a greenlet task on the event loop, over an
    ``AsyncConnection`` and its ``notifies()`` generator, firing the store
    object's signals on the loop's thread (its async subscriptions wake at
    once). Made and closed inside the bridge."""

    def __init__(
        self, url: str, signals: Signals, name: str, check: Callable[[Any, bool], str | None]
    ) -> None:
        self.ready = _Ready()
        self.problem: str | None = None
        self._stopped = False
        self._task = asyncio.get_running_loop().create_task(
            bridge.spawn(self._run, url, signals, name, check), name="turnkeeper-listen"
        )

    def _run(
        self, url: str, signals: Signals, name: str, check: Callable[[Any, bool], str | None]
    ) -> None:
        self.problem = notify.listen(
            url,
            signals,
            name,
            check,
            connect=_listen_connection,
            stopped=lambda: self._stopped,
            pause=bridge.sleep,
            ready=self.ready.set,
        )
        if self.problem is not None:
            self.ready.set()

    def close(self) -> None:
        """Stop listening: the task is cancelled, its connection closed (inside the bridge)."""
        self._stopped = True
        self._task.cancel()
        await_only(asyncio.wait([self._task]))


class NativeDatabase(Database):
    """:class:`~.db.Database` on a ``psycopg_pool.AsyncConnectionPool`` (see the
    module docstring): a twin of the open sync database ``twin``; its
    operations run inside greenlets of :func:`~turnkeeper.storage.bridge.spawn`
    on the loop that awaited :meth:`open` (elsewhere they raise
    ``InterfaceError``)."""

    _sleep = staticmethod(bridge.sleep)

    def __init__(self, twin: Database) -> None:
        opened: Opened = twin.opened
        self._adopt(opened)
        self.opened = opened
        self.twin = twin
        """The sync database whose settings and listener this one shares."""
        self._pool_async = AsyncPool(
            self.url,
            opened.pool_size,
            _configure,
            prepared=self._prepared,
            reconnect_delay_s=opened.reconnect_delay_s,
            reconnect_max_delay_s=opened.reconnect_max_delay_s,
        ).pool

    async def open(self) -> None:
        """Open the pool on the running event loop, waiting for its first connection.

        Raises:
            OperationalError: no connection within ``pool_timeout_s``.
        """
        try:
            await self._pool_async.open(wait=True, timeout=self._pool_timeout_s)
        except PoolTimeout as exc:
            await self._pool_async.close()
            raise errors.OperationalError(
                detail=f"cannot connect to {self.path} within {self._pool_timeout_s} s: {exc}"
            ) from exc
        except BaseException:  # a cancelled open leaves no pool open
            await asyncio.shield(self._pool_async.close())
            raise

    @contextlib.contextmanager
    def connection(self) -> Any:
        """A pooled async connection (proxied) for one operation, inside the
        gate (greenlets count as their loop's thread: the async store waits
        for its operations in flight before it closes this database)."""
        me = threading.current_thread()
        self._gate.admit(me)
        try:
            try:
                lending = bridged(self._pool_async.connection(timeout=self._pool_timeout_s))
                conn = lending.__enter__()
            except PoolTimeout as exc:
                raise errors.OperationalError(
                    detail=f"no connection to {self.path}: {exc}"
                ) from exc
            with contextlib.ExitStack() as stack:
                stack.push(lending)
                yield Connection(conn)
        finally:
            self._gate.leave(me)

    def close(self) -> None:
        """Close the gate, the listener and the pool (inside
        :func:`~turnkeeper.storage.bridge.spawn`: the async store calls it once
        its operations in flight ended). Idempotent."""
        self._gate.shut()
        if self._gate.forked():
            return
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        await_only(self._pool_async.close())

    def _new_listener(self, url: str, check: Callable[[Any, bool], str | None]) -> notify.Listening:
        """A :class:`NativeListener` (on the event loop, inside the bridge)."""
        return NativeListener(url, self._signals, self.channel, check)


class NativeStore(BaseStore):
    """The store over a :class:`NativeDatabase`: every method of its areas is
    the one domain layer's, sync, and must run inside a greenlet of
    :func:`~turnkeeper.storage.bridge.spawn` on the database's loop (the
    async store, ``turnkeeper.aio``, runs them so). Made by :func:`open_twin`."""

    db: NativeDatabase


async def open_twin(store: BaseStore) -> NativeStore:
    """A :class:`NativeStore` on the same PostgreSQL database, schema and
    settings as the open sync ``store`` (a ``PostgresStore``), sharing its
    lease secret (tokens of either are the other's), clock, tenant and replay
    cache bound; its pool opened on the running event loop.

    Raises:
        InvalidInputError: ``store`` is not an open PostgreSQL store.
        OperationalError: no connection within ``pool_timeout_s``.
        SchemaVersionError, DatabaseError: as opening the store.
    """
    if not isinstance(store.db, Database) or isinstance(store.db, NativeDatabase):
        raise errors.InvalidInputError("store", "expected an open sync PostgreSQL store")
    db = NativeDatabase(store.db)
    await db.open()
    try:
        return await bridge.spawn(NativeStore, db, **store._twin_options())
    except BaseException:
        await bridge.spawn(db.close)
        raise
