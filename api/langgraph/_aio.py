"""``AsyncTurnkeeperSaver``: the LangGraph checkpointer over an async store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from langgraph.checkpoint.serde.base import SerializerProtocol

from turnkeeper.aio import AsyncStore
from turnkeeper.spec import errors
from turnkeeper.spec.records import Lease

from ._saver import TurnkeeperSaver

T = TypeVar("T")


class AsyncTurnkeeperSaver(TurnkeeperSaver):
    """:class:`TurnkeeperSaver` over an async store (``turnkeeper.aio.open_store``
    or ``turnkeeper.aio.AsyncStore.wrap``), for ``graph.ainvoke`` / ``astream``.

    Each ``a…`` method (``aget_tuple``, ``alist``, ``aput``, ``aput_writes``,
    ``adelete_thread``, ``acopy_thread``, ``aprune``, ``adelete_for_runs``)
    runs the one saver's method whole on a worker of the async store's
    runner (``store.runner``, bounded; the event loop never waits on the
    database), with its cancellation rule: a cancelled call waits for the
    method to end, then raises ``asyncio.CancelledError`` (never wrapped), so
    nothing of it is still running; what it wrote is in the store (read it
    with ``aget_tuple``). The sync methods run on ``store.sync`` in the
    caller's thread (not on the event loop's). Same storage, leases and
    errors as :class:`TurnkeeperSaver`.

    Raises:
        InvalidInputError: ``store`` is not a ``turnkeeper.aio.AsyncStore`` (field ``store``).
    """

    def __init__(
        self,
        store: AsyncStore,
        *,
        serde: SerializerProtocol | None = None,
        lease: Lease | None = None,
    ) -> None:
        if not isinstance(store, AsyncStore):
            raise errors.InvalidInputError("store", "expected a turnkeeper.aio store")
        super().__init__(store.sync, serde=serde, lease=lease)
        self.astore = store

    async def _call(self, fn: Callable[..., T], /, *args: Any) -> T:
        return await self.astore.runner(fn, *args)
