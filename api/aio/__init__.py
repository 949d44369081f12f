"""The async API: ``turnkeeper.aio.open_store(...)`` gives the store with the
same areas, methods, arguments, results and errors, as ``async def``.

    import turnkeeper.aio

    async with turnkeeper.aio.open_store("agents.duckdb") as store:
        await store.sessions.create("s1")
        lease = await store.leases.acquire("session:s1", "worker-1", ttl_s=30)

One domain layer serves both: each awaited call runs the sync store's method
on a worker thread of a bounded pool (:mod:`.runner`), so the event loop never
waits on the database, and a cancellation never leaves an operation half-done
(it ends committed in full or having written nothing). Wake-ups come as async
iterators (:class:`AsyncSubscription`).
"""

from .ledger import AsyncCatalog, AsyncCommandLog, AsyncLedger, AsyncLedgerWriter
from .runner import WORKERS, Runner
from .store import AsyncStore, AsyncSubscription, Opening, open_store

__all__ = [
    "WORKERS",
    "AsyncCatalog",
    "AsyncCommandLog",
    "AsyncLedger",
    "AsyncLedgerWriter",
    "AsyncStore",
    "AsyncSubscription",
    "Opening",
    "Runner",
    "open_store",
]
