"""The async API: ``turnkeeper.aio.open_store(...)`` gives the store with the
same areas, methods, arguments, results and errors, as ``async def``.

    import turnkeeper.aio

    async with turnkeeper.aio.open_store("agents.duckdb") as store:
        await store.sessions.create("s1")
        lease = await store.leases.acquire("session:s1", "worker-1", ttl_s=30)

One domain layer serves both: on DuckDB each awaited call runs the sync
store's method on a worker thread of a bounded pool (:mod:`.runner`), so the
event loop never waits on the database; on PostgreSQL it is native (:mod:`.native`):
the sync method runs in a greenlet on the event loop and every statement is
awaited through ``psycopg.AsyncConnection`` from an ``AsyncConnectionPool``.
A cancellation never leaves an operation half-done (it ends committed in full
or having written nothing). Wake-ups come as async iterators
(:class:`AsyncSubscription`).
"""

from .ledger import AsyncCatalog, AsyncCommandLog, AsyncLedger, AsyncLedgerWriter
from .native import NativeRunner
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
    "NativeRunner",
    "Opening",
    "Runner",
    "open_store",
]
