"""A sync view of the async store, so that the conformance suite runs over
``turnkeeper.aio`` unchanged (issue 20: "the conformance suite runs over the
async facade too, on both backends").

:class:`ThroughAio` wraps an open sync store in an :class:`~turnkeeper.aio.AsyncStore`
driven by an event loop on a thread of its own (on PostgreSQL the native
store, :meth:`AsyncStore.native`, whose operations run on that loop with
psycopg's async pool, sharing the sync store's lease secret); every area
method the test calls is the async store's, awaited on that loop, and its
result or exception comes back unchanged. What is
not an area method (``store.db``, ``store.query`` …) is the sync store's.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, Self

import turnkeeper
from turnkeeper.aio import AsyncCatalog, AsyncCommandLog, AsyncLedger, AsyncLedgerWriter, AsyncStore
from turnkeeper.aio.native import NativeRunner

AREAS = [
    "leases",
    "threads",
    "sessions",
    "runs",
    "lineage",
    "recovery",
    "outbox",
    "tools",
    "forks",
    "capabilities",
    "guidance",
    "resources",
    "projects",
    "usage",
    "bindings",
    "archives",
    "ledger",
]


WRAPPED = (AsyncLedger, AsyncLedgerWriter, AsyncCommandLog, AsyncCatalog)
"""Objects of the async store that are called through, like its areas."""


class _Loop:
    """An event loop running on a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class _Area:
    """An object of the async store (an area, a ledger writer, the catalog …)
    called synchronously: its coroutine methods are awaited on the loop, its
    async iterators drained there, anything else used as it is."""

    def __init__(self, area: Any, loop: _Loop) -> None:
        self._area = area
        self._loop = loop
        self.calls = 0

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, WRAPPED):
            return _Area(value, self._loop)
        return value

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._area, name)
        if inspect.iscoroutinefunction(value):

            def call(*args: Any, **kwargs: Any) -> Any:
                self.calls += 1
                return self._wrap(self._loop.run(value(*args, **kwargs)))

            return call
        if inspect.isasyncgenfunction(value):

            def stream(*args: Any, **kwargs: Any) -> Iterator[Any]:
                self.calls += 1
                agen = value(*args, **kwargs)

                async def take() -> list[Any]:
                    return [item async for item in agen]

                return iter(self._loop.run(take()))

            return stream
        if callable(value):
            return lambda *args, **kwargs: self._wrap(value(*args, **kwargs))
        return self._wrap(value)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ThroughAio:
    """``store`` as the conformance tests see it, every area call going through
    the async store (see the module docstring)."""

    def __init__(self, store: turnkeeper.BaseStore) -> None:
        self.sync = store
        self._loop = _Loop()
        if isinstance(store, turnkeeper.DuckDBStore):
            self.aio = AsyncStore.wrap(store)
        else:  # PostgreSQL: the native store (psycopg's async pool), as open_store gives
            self.aio = self._loop.run(AsyncStore.native(store))
            assert isinstance(self.aio.runner, NativeRunner)
        self.areas = {name: _Area(getattr(self.aio, name), self._loop) for name in AREAS}

    def __getattr__(self, name: str) -> Any:
        if name in AREAS:
            return self.areas[name]
        if name == "statement_stats":  # the counts of the operations the areas ran
            return self.aio.statement_stats
        return getattr(self.sync, name)

    def area_calls(self) -> int:
        """How many area calls went through the async store."""
        return sum(a.calls for a in self.areas.values())

    def close(self) -> None:
        self._loop.run(self.aio.close())
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def async_store(store: turnkeeper.BaseStore) -> AsyncStore:
    """The async store the adapters' tests use over the open sync ``store``, on
    the running loop: native on PostgreSQL (as ``turnkeeper.aio.open_store``
    gives), worker threads on DuckDB; closing it leaves ``store`` open."""
    if isinstance(store, turnkeeper.DuckDBStore):
        return AsyncStore.wrap(store)
    return await AsyncStore.native(store)
