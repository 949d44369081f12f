"""``AsyncStore``: the store with ``async def`` methods, and ``open_store``.

One domain layer: each area of the async store (:mod:`.areas`, generated
from ``storage/protocol.py``) awaits the sync area's method through the
store's runner: on a worker of a :class:`~.runner.Runner` (DuckDB, and a
wrapped sync store), where nothing of the store runs on the event loop (see
:mod:`.runner` for the workers, the bounded queue and what a cancellation
leaves); or natively on PostgreSQL, in a greenlet on the event loop whose
every statement the loop awaits (:class:`~.native.NativeRunner`, with the
same bound and the same promise on cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Generator, Iterator, Sequence
from concurrent.futures import Future
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self, TypeVar

from turnkeeper._open import DEFAULT_PATH
from turnkeeper._open import open_store as open_sync_store
from turnkeeper.spec import errors
from turnkeeper.storage import BaseStore
from turnkeeper.storage.bridge import spawn
from turnkeeper.storage.crypto import KeyProvider
from turnkeeper.storage.ops.replays import REPLAY_CACHE_BYTES
from turnkeeper.storage.store import Snapshot
from turnkeeper.storage.validate import check_seconds
from turnkeeper.storage.wakeups import Subscription, Topic

from . import areas
from .ledger import AsyncLedger
from .native import NativeRunner
from .runner import WORKERS, Runner, check_workers, settled

if TYPE_CHECKING:  # (psycopg is the optional extra turnkeeper[postgres])
    from turnkeeper.storage.postgres.native import NativeStore

T = TypeVar("T")


class AsyncStore:
    """The store with ``async def`` methods: the same areas as
    :class:`~turnkeeper.BaseStore` (``store.leases``, ``store.sessions``,
    ``store.runs`` … ``store.ledger``), the same methods, arguments, results
    and errors, awaited. ``sync`` is the sync store it drives, or on
    PostgreSQL its sync twin (for code that must call it from a thread of its
    own). Made by :func:`open_store` (native on PostgreSQL), by :meth:`wrap`
    around an open sync store (worker threads), or by :meth:`native`; an
    async context manager that closes it.
    """

    def __init__(
        self,
        store: BaseStore,
        runner: Runner | NativeRunner,
        *,
        owns_store: bool,
        native: NativeStore | None = None,
    ) -> None:
        self.sync = store
        """The sync store: the one whose methods this one awaits on worker
        threads, or, on a native store (PostgreSQL), its sync twin on the same
        database (sharing its lease secret: tokens of either are the other's),
        for code that must call the store from a thread of its own."""
        self.runner = runner
        """What runs the operations: worker threads (:class:`~.runner.Runner`),
        or greenlets on the event loop (:class:`~.native.NativeRunner`)."""
        self.native_store = native
        """The native store whose methods run on the loop (PostgreSQL), or ``None``."""
        domain: BaseStore = store if native is None else native
        self._domain = domain
        self._owns_store = owns_store
        self._closing: Future[None] | None = None
        self._close_lock = threading.Lock()
        self._closer: asyncio.Task[None] | None = None
        self._subscriptions: weakref.WeakSet[AsyncSubscription] = weakref.WeakSet()
        store = domain
        run = runner.__call__
        self.leases = areas.AsyncLeases(store.leases, run)
        self.threads = areas.AsyncThreads(store.threads, run)
        self.sessions = areas.AsyncSessions(store.sessions, run)
        self.runs = areas.AsyncRuns(store.runs, run)
        self.lineage = areas.AsyncLineage(store.lineage, run)
        self.recovery = areas.AsyncRecovery(store.recovery, run)
        self.outbox = areas.AsyncOutbox(store.outbox, run)
        self.tools = areas.AsyncTools(store.tools, run)
        self.forks = areas.AsyncForks(store.forks, run)
        self.capabilities = areas.AsyncCapabilities(store.capabilities, run)
        self.guidance = areas.AsyncGuidance(store.guidance, run)
        self.resources = areas.AsyncResources(store.resources, run)
        self.projects = areas.AsyncProjects(store.projects, run)
        self.usage = areas.AsyncUsage(store.usage, run)
        self.bindings = areas.AsyncBindings(store.bindings, run)
        self.archives = areas.AsyncArchives(store.archives, run)
        self.ledger = AsyncLedger(store.ledger, run)
        self.keys = areas.AsyncKeys(store.keys, run)

    @classmethod
    def wrap(cls, store: BaseStore, *, workers: int | None = None) -> AsyncStore:
        """An async store over ``store``, an open sync store, with ``workers``
        worker threads (see :func:`open_store`). Closing the async store does
        not close ``store``.

        Raises:
            InvalidInputError: ``store`` is not a turnkeeper store, or a bad ``workers``.
        """
        if not isinstance(store, BaseStore):
            raise errors.InvalidInputError("store", "expected an open turnkeeper store")
        return cls(store, Runner(workers_for(store, workers)), owns_store=False)

    @classmethod
    async def native(
        cls, store: BaseStore, *, workers: int | None = None, owns_store: bool = False
    ) -> AsyncStore:
        """The native async store over ``store``, an open sync PostgreSQL store:
        its operations run on the running event loop (its home loop) with
        psycopg's ``AsyncConnection`` from a pool of its own of the same size
        (:mod:`~turnkeeper.aio.native`); ``sync`` is ``store``, whose lease
        tokens it shares. Closing it closes ``store`` only with ``owns_store``.
        :func:`open_store` gives this on PostgreSQL.

        Raises:
            InvalidInputError: ``store`` is not an open PostgreSQL store, or a
                bad ``workers``.
            OperationalError: no connection within the store's ``pool_timeout_s``.
        """
        if not isinstance(store, BaseStore):
            raise errors.InvalidInputError("store", "expected an open turnkeeper store")
        from turnkeeper.storage.postgres.native import open_twin

        runner = NativeRunner(workers_for(store, workers))
        twin = await open_twin(store)
        return cls(store, runner, owns_store=owns_store, native=twin)

    # -- the store's own methods -------------------------------------------------------

    @property
    def path(self) -> str:
        """The store's path or URL (password removed), as the sync store's."""
        return self.sync.path

    def json_sql(self, expr: str) -> str:
        """:meth:`BaseStore.json_sql` (no I/O)."""
        return self.sync.json_sql(expr)

    def statement_stats(self) -> dict[str, dict[str, float]]:
        """:meth:`BaseStore.statement_stats` (no I/O) of the store whose
        operations this one runs (on a native store: the native one's)."""
        return self._domain.statement_stats()

    async def schema_version(self) -> int:
        """Awaits :meth:`BaseStore.schema_version`."""
        return await self.runner(self._domain.schema_version)

    async def query(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        """Awaits :meth:`BaseStore.query`: a ``pyarrow.Table`` (same checks, same errors)."""
        return await self.runner(self._domain.query, sql, params)

    async def snapshot(self, body: Callable[[Snapshot], T]) -> T:
        """Awaits :meth:`BaseStore.snapshot`: ``body`` runs on a worker thread,
        or on a native store in the operation's greenlet on the event loop (its
        reads are sync calls of the snapshot, in one transaction; keep it short
        of other blocking work there).

        Raises:
            InvalidInputError: ``body`` is an ``async def`` function (it must be sync).
        """
        _sync_callable(body, "body")
        return await self.runner(self._domain.snapshot, body)

    async def query_batches(
        self,
        sql: str,
        consume: Callable[[Any, Iterator[Any]], T],
        params: Sequence[Any] | None = None,
    ) -> T:
        """Awaits :meth:`BaseStore.query_batches`: ``consume`` runs where
        :meth:`snapshot`'s ``body`` does.

        Raises:
            InvalidInputError: ``consume`` is an ``async def`` function (it must be sync).
        """
        _sync_callable(consume, "consume")
        return await self.runner(self._domain.query_batches, sql, consume, params)

    async def subscribe(self, *topics: str) -> AsyncSubscription:
        """Awaits :meth:`BaseStore.subscribe`: an :class:`AsyncSubscription`,
        whose wake-ups come as an async iterator (``async for fired in sub``).

        Raises:
            InvalidInputError: an unknown topic, or none.
            InterfaceError: the store is closed.
            OperationalError: (PostgreSQL) the listening connection could not be made.
        """
        # natively on the loop (a NativeListener: LISTEN over an AsyncConnection)
        subscription = AsyncSubscription(await self.runner(self._domain.subscribe, *topics))
        self._subscriptions.add(subscription)
        return subscription

    async def wait_for(self, *topics: str, timeout_s: float) -> list[Topic]:
        """``(await subscribe(*topics)).wait(timeout_s)``: the topics that fired
        within ``timeout_s`` seconds from now (empty after the timeout).

        Raises:
            InvalidInputError: an unknown topic, or a bad ``timeout_s``.
        """
        async with await self.subscribe(*topics) as subscription:
            return await subscription.wait(timeout_s)

    async def close(self) -> None:
        """Refuse new calls, end every subscription's iteration, wait for the
        operations still running, stop the workers, and close the sync store
        if this async store opened it. Idempotent: every call returns once all
        that is done. A cancelled close raises ``CancelledError`` at once and
        still finishes, on a thread of its own."""
        with self._close_lock:
            if self._closing is None:
                self.runner.closed = True
                for subscription in list(self._subscriptions):
                    subscription.close()
                self._closing = Future()
                if isinstance(self.runner, NativeRunner):
                    self._close_native(self.runner, self._closing)
                else:
                    self._close_thread(self._closing)
            closing = self._closing
        await asyncio.shield(asyncio.wrap_future(closing))

    def _close_thread(self, closing: Future[None]) -> None:
        threading.Thread(
            target=self._finish_close,
            args=(closing,),
            name="turnkeeper-aio-close",
            daemon=True,
        ).start()

    def _close_native(self, runner: NativeRunner, closing: Future[None]) -> None:
        """Close a native store on its home loop: wait for its operations in
        flight, close its pool, then the rest on a thread. A home loop that no
        longer runs has taken its pool's connections with it: the rest closes."""
        home = runner.loop
        if home.is_closed() or not home.is_running():
            self._close_thread(closing)
        elif asyncio.get_running_loop() is home:
            self._closer = home.create_task(self._finish_native(runner, closing))
        else:
            asyncio.run_coroutine_threadsafe(self._finish_native(runner, closing), home)

    async def _finish_native(self, runner: NativeRunner, closing: Future[None]) -> None:
        try:
            await runner.drain()
            if self.native_store is not None:
                await spawn(self.native_store.db.close)
            rest: Future[None] = Future()
            self._close_thread(rest)
            await asyncio.wrap_future(rest)
        except BaseException as failure:  # handed to every close() awaiting it
            closing.set_exception(failure)
        else:
            closing.set_result(None)  # (the task's last step: nothing of it left pending)

    def _finish_close(self, closing: Future[None]) -> None:
        try:
            self.runner.close()
            if self._owns_store:
                self.sync.close()
        except BaseException as failure:  # handed to every close() awaiting it
            closing.set_exception(failure)
        else:
            closing.set_result(None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSubscription:
    """Wake-ups of some topics (:class:`~turnkeeper.storage.wakeups.Subscription`)
    awaited on the event loop: ``await sub.wait(timeout_s)``, or ``async for
    fired in sub`` (each step: the topics that fired since the last, after at
    least one did; the iteration ends when the subscription or its store is
    closed). Advisory, as the sync ones: look in the store after each. An
    async context manager; :meth:`close` stops it, and so does dropping it.
    Use it on the event loop it was made on."""

    def __init__(self, subscription: Subscription) -> None:
        self.sync = subscription
        self.topics = subscription.topics
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._fired = asyncio.Event()
        me = weakref.ref(self)  # the store's signals must not keep a dropped one alive

        def on_fire() -> None:  # on the firing thread
            found = me()
            if found is not None:
                found._wake()

        self._unwatch = subscription.watch(on_fire)
        weakref.finalize(self, self._unwatch)

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop was closed
            self._loop.call_soon_threadsafe(self._fired.set)

    async def wait(self, timeout_s: float) -> list[Topic]:
        """The topics that fired since the last wait, waiting up to ``timeout_s``
        seconds (without blocking the loop) for one to; empty after the timeout.

        Raises:
            InvalidInputError: ``timeout_s`` is not finite seconds >= 0.
            InterfaceError: the subscription (or its store) was closed.
        """
        wait_s = check_seconds(timeout_s, "timeout_s")
        deadline = self._loop.time() + wait_s
        while True:
            self._fired.clear()
            self._open()
            fired = self.sync.wait(0)
            left = deadline - self._loop.time()
            if fired or left <= 0:
                return fired
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._fired.wait()

    def _open(self) -> None:
        if self.closed:
            raise errors.InterfaceError(detail="the subscription was closed")

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> list[Topic]:
        while True:
            self._fired.clear()
            if self.closed:
                raise StopAsyncIteration
            fired = self.sync.wait(0)
            if fired:
                return fired
            await self._fired.wait()

    def close(self) -> None:
        """Stop receiving wake-ups and end the iteration (idempotent)."""
        self.closed = True
        self._unwatch()
        with contextlib.suppress(RuntimeError):  # the loop was closed
            self._loop.call_soon_threadsafe(self._fired.set)

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def _sync_callable(fn: object, field: str) -> None:
    if inspect.iscoroutinefunction(fn) or not callable(fn):
        raise errors.InvalidInputError(
            field, "expected a sync callable (it runs on a worker thread), not an async one"
        )


def workers_for(store: BaseStore, workers: int | None) -> int:
    """How many workers an async store over ``store`` gets: ``workers``, or by
    default :data:`~.runner.WORKERS`, at most the PostgreSQL pool's connections
    (a worker beyond them would only wait for one, and time out).

    Raises:
        InvalidInputError: ``workers`` is more than the pool's connections.
    """
    connections = getattr(store.db, "pool_size", None)
    if workers is None:
        return WORKERS if connections is None else min(WORKERS, connections)
    if connections is not None and isinstance(workers, int) and workers > connections:
        raise errors.InvalidInputError(
            "workers", f"at most the PostgreSQL pool's {connections} connections"
        )
    return workers


class Opening(Coroutine[Any, Any, "AsyncStore"]):
    """What :func:`open_store` returns: a coroutine giving the store (``await
    open_store(...)``, ``asyncio.run``, ``create_task``), and an async context
    manager (``async with open_store(...) as store:``, closed at the block's end)."""

    def __init__(
        self, path: str | os.PathLike[str], workers: int | None, kwargs: dict[str, Any]
    ) -> None:
        self._path = path
        self._workers = workers
        self._kwargs = kwargs
        self._store: AsyncStore | None = None
        self._coroutine: Coroutine[Any, Any, AsyncStore] | None = None

    async def _open(self) -> AsyncStore:
        if self._workers is not None:
            check_workers(self._workers)  # a bad count fails before anything opens
        opener = Runner(1)
        job = opener.submit(open_sync_store, self._path, **self._kwargs)
        try:
            store = await settled(job)
        except BaseException:
            if job.done() and not job.cancelled() and job.exception() is None:
                job.result().close()  # opened after all: a cancelled open leaves nothing open
            raise
        finally:
            opener.close()  # its one call is over
        try:
            if _on_postgres(store):
                return await AsyncStore.native(store, workers=self._workers, owns_store=True)
            return AsyncStore(store, Runner(workers_for(store, self._workers)), owns_store=True)
        except BaseException:
            await asyncio.get_running_loop().run_in_executor(None, store.close)
            raise

    def _started(self) -> Coroutine[Any, Any, AsyncStore]:
        if self._coroutine is None:
            self._coroutine = self._open()
        return self._coroutine

    def send(self, value: Any) -> Any:
        return self._started().send(value)

    def throw(self, *args: Any) -> Any:
        return self._started().throw(*args)

    def close(self) -> None:
        if self._coroutine is not None:
            self._coroutine.close()

    def __await__(self) -> Generator[Any, None, AsyncStore]:
        return self._started().__await__()

    async def __aenter__(self) -> AsyncStore:
        self._store = await self._open()
        return self._store

    async def __aexit__(self, *exc: object) -> None:
        if self._store is not None:
            await self._store.close()


def open_store(
    path: str | os.PathLike[str] = DEFAULT_PATH,
    *,
    workers: int | None = None,
    clock: Callable[[], datetime] | None = None,
    read_only: bool = False,
    replay_cache_bytes: int = REPLAY_CACHE_BYTES,
    pooler: str | None = None,
    listen_url: str | None = None,
    pool_timeout_s: float | None = None,
    reconnect_delay_s: float | None = None,
    reconnect_max_delay_s: float | None = None,
    tenant: str = "",
    encryption: KeyProvider | None = None,
) -> Opening:
    """Open (creating if needed) the store at ``path`` as :func:`turnkeeper.open_store`
    does (same arguments, same errors, raised when awaited), for ``async``
    code: ``store = await open_store(...)`` or ``async with open_store(...) as
    store:``. ``workers`` (1 to 64; default 8, on PostgreSQL at most the pool's
    8 connections) is how many of its operations run at once, each on a worker
    thread on DuckDB (see :mod:`turnkeeper.aio.runner`), natively on the event
    loop with psycopg's async pool on PostgreSQL (:mod:`turnkeeper.aio.native`;
    ``store.sync`` is then a sync twin on the same database, opened with it);
    further ones wait for their turn without blocking the event loop. A
    cancelled open waits for the open under way to end (on PostgreSQL up to
    ``pool_timeout_s``), closes what it opened, and raises ``CancelledError``.

    Raises (when awaited):
        InvalidInputError: a bad ``workers`` (more than the PostgreSQL pool's
            connections, too); and as :func:`turnkeeper.open_store`.
    """
    kwargs: dict[str, Any] = {
        "clock": clock,
        "read_only": read_only,
        "replay_cache_bytes": replay_cache_bytes,
        "pooler": pooler,
        "listen_url": listen_url,
        "pool_timeout_s": pool_timeout_s,
        "reconnect_delay_s": reconnect_delay_s,
        "reconnect_max_delay_s": reconnect_max_delay_s,
        "tenant": tenant,
        "encryption": encryption,
    }
    return Opening(path, workers, kwargs)


def _on_postgres(store: BaseStore) -> bool:
    """Whether ``store`` is a sync PostgreSQL store (without importing psycopg
    for a DuckDB one: it is the optional extra ``turnkeeper[postgres]``)."""
    if type(store).__module__.startswith("turnkeeper.storage.duck"):
        return False
    from turnkeeper.storage.postgres import PostgresStore

    return isinstance(store, PostgresStore)
