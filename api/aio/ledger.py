"""The async ledger's methods whose results are not plain values: another
view of the ledger (``with_tenant``, ``with_blobs``), a writer to drive
(``open``, ``command_log``), a stream to page (``replay``), and the catalog.
The rest of ``store.ledger`` is generated in :mod:`.areas`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from turnkeeper.spec import errors
from turnkeeper.spec.catalog import SessionMeta
from turnkeeper.spec.ledger import (
    AppendResult,
    CommandApplication,
    LedgerEntry,
    LedgerRecord,
)
from turnkeeper.spec.records import Lease
from turnkeeper.storage.ops.ledger import (
    DEFAULT_OFFLOAD_THRESHOLD,
    MAX_BODY_BYTES,
    Catalog,
    LedgerWriter,
    RuntimeCommandLog,
)
from turnkeeper.storage.ops.ledger.blobs import BlobStore
from turnkeeper.storage.ops.ledger.catalog import NewRecord
from turnkeeper.storage.ops.ledger.replay import PAGE_ROWS

from .areas import AsyncLedgerBase
from .runner import Call

if TYPE_CHECKING:
    from turnkeeper.storage.protocol import LedgerAPI


class AsyncLedger(AsyncLedgerBase):
    """``store.ledger`` with ``async def`` methods (:class:`LedgerAPI`)."""

    def __init__(self, area: LedgerAPI, run: Call) -> None:
        super().__init__(area, run)
        catalog = getattr(area, "catalog", None)
        self.catalog = AsyncCatalog(catalog, run) if isinstance(catalog, Catalog) else None
        """This tenant's catalog of sessions, async (``store.ledger.catalog``)."""

    def with_tenant(self, tenant: str) -> AsyncLedger:
        """:meth:`LedgerAPI.with_tenant`, async (no I/O: returns at once).

        Raises:
            InvalidInputError: a malformed tenant.
        """
        return AsyncLedger(self.sync.with_tenant(tenant), self._run)

    def with_blobs(
        self,
        blobs: BlobStore | None = None,
        *,
        offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> AsyncLedger:
        """:meth:`LedgerAPI.with_blobs`, async (no I/O: returns at once).

        Raises:
            InvalidInputError, InvalidBackendError: as the sync method.
        """
        return AsyncLedger(
            self.sync.with_blobs(
                blobs, offload_threshold=offload_threshold, max_body_bytes=max_body_bytes
            ),
            self._run,
        )

    async def open(
        self, session_id: str, lease: Lease | None, *, opening: Sequence[LedgerEntry] = ()
    ) -> AsyncLedgerWriter:
        """Awaits :meth:`LedgerAPI.open` (same arguments and errors); the writer's
        appends are awaited too."""
        return AsyncLedgerWriter(
            await self._run(self.sync.open, session_id, lease, opening=opening), self._run
        )

    async def command_log(self, session_id: str, writer: AsyncLedgerWriter) -> AsyncCommandLog:
        """Awaits :meth:`LedgerAPI.command_log` for an async writer."""
        if not isinstance(writer, AsyncLedgerWriter):
            raise errors.InvalidInputError("writer", "expected the async store's ledger writer")
        return AsyncCommandLog(
            await self._run(self.sync.command_log, session_id, writer.sync), self._run
        )

    async def replay(
        self, session_id: str, from_seq: int = 1, *, page_rows: int = PAGE_ROWS
    ) -> AsyncIterator[LedgerRecord]:
        """:meth:`LedgerAPI.replay` as an async iterator: each page of
        ``page_rows`` records is read and verified on a worker, the records
        yielded on the loop. Same bounds, same errors (raised from the
        iteration; the arguments are checked at the first step)."""
        records = self.sync.replay(session_id, from_seq, page_rows=page_rows)
        while True:
            page = await self._run(_page, records, page_rows)
            for record in page:
                yield record
            if len(page) < page_rows:
                return


def _page(records: Iterator[LedgerRecord], rows: int) -> list[LedgerRecord]:
    """Up to ``rows`` more records of a replay (fewer: it ended)."""
    page: list[LedgerRecord] = []
    for record in records:
        page.append(record)
        if len(page) == rows:
            break
    return page


class AsyncLedgerWriter:
    """A ledger writer (:class:`LedgerWriter`, sessionstore SessionJournal)
    whose appends are awaited; an async context manager that closes it."""

    def __init__(self, writer: LedgerWriter, run: Call) -> None:
        self.sync = writer
        """The sync writer this one drives."""
        self._run = run
        self.session_id = writer.session_id
        self.lease = writer.lease
        self.epoch = writer.epoch
        self.fence_seq = writer.fence_seq
        self.opening = writer.opening

    @property
    def state(self) -> str:
        """``open``, ``fenced`` or ``closed`` (see :class:`LedgerWriter`)."""
        return self.sync.state

    async def append(self, kind: str, payload: bytes, idempotency_id: str) -> AppendResult:
        """Awaits :meth:`LedgerWriter.append` (same arguments, result and errors)."""
        return await self._run(self.sync.append, kind, payload, idempotency_id)

    async def append_many(self, entries: Sequence[LedgerEntry]) -> list[AppendResult]:
        """Awaits :meth:`LedgerWriter.append_many` (same arguments, result and errors)."""
        return await self._run(self.sync.append_many, entries)

    async def close(self) -> None:
        """Awaits :meth:`LedgerWriter.close` (idempotent), on a worker: it waits
        for the writer's appends in flight, which the event loop must not."""
        await self._run(self.sync.close)

    async def __aenter__(self) -> AsyncLedgerWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncCommandLog:
    """A session's command log (:class:`RuntimeCommandLog`), awaited."""

    def __init__(self, log: RuntimeCommandLog, run: Call) -> None:
        self.sync = log
        self._run = run
        self.session_id = log.session_id

    async def append_command_application(self, app: CommandApplication) -> AppendResult:
        """Awaits :meth:`RuntimeCommandLog.append_command_application`."""
        return await self._run(self.sync.append_command_application, app)

    async def read_command_application_at(self, seq: int) -> CommandApplication:
        """Awaits :meth:`RuntimeCommandLog.read_command_application_at`."""
        return await self._run(self.sync.read_command_application_at, seq)


class AsyncCatalog:
    """The ledger's catalog of sessions (:class:`Catalog`), awaited."""

    def __init__(self, catalog: Catalog, run: Call) -> None:
        self.sync = catalog
        self._run = run
        self.tenant = catalog.tenant

    def configure(
        self,
        *,
        clock: Callable[[], datetime] | None = None,
        on_update_failed: Callable[[Exception], None] | None = None,
    ) -> None:
        """:meth:`Catalog.configure` (no I/O)."""
        self.sync.configure(clock=clock, on_update_failed=on_update_failed)

    def is_stuck(self, session_id: str) -> bool:
        """:meth:`Catalog.is_stuck` (no I/O)."""
        return self.sync.is_stuck(session_id)

    async def read_meta(self, session_id: str) -> SessionMeta | None:
        """Awaits :meth:`Catalog.read_meta`."""
        return await self._run(self.sync.read_meta, session_id)

    async def list_sessions(
        self, *, on_unreadable: Callable[[errors.CatalogReadError], None] | None = None
    ) -> list[SessionMeta]:
        """Awaits :meth:`Catalog.list_sessions` (``on_unreadable`` is called on a worker)."""
        return await self._run(self.sync.list_sessions, on_unreadable=on_unreadable)

    async def update_on_event(self, session_id: str, records: Sequence[NewRecord]) -> SessionMeta:
        """Awaits :meth:`Catalog.update_on_event`."""
        return await self._run(self.sync.update_on_event, session_id, records)

    async def catch_up(self, session_id: str) -> SessionMeta:
        """Awaits :meth:`Catalog.catch_up`."""
        return await self._run(self.sync.catch_up, session_id)

    async def repair(self, session_id: str) -> SessionMeta:
        """Awaits :meth:`Catalog.repair`."""
        return await self._run(self.sync.repair, session_id)
