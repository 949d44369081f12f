"""The store protocol every backend implements and the conformance suite tests.

Synchronous and thread-safe: many threads may share one store object.
Errors are those of :mod:`turnkeeper.spec.errors`; each method's docstring in
the DuckDB backend lists them and what remains stored after a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from turnkeeper.spec.records import (
    ANY_LEAF,
    Entry,
    FinalizeRequest,
    ImportBatch,
    ImportResult,
    Lease,
    OpaqueRecord,
    Replay,
    Session,
    SessionPage,
    ThreadRecord,
)


class Store(Protocol):
    """Leases, thread records and sessions (threadstore Store + session seed Store)."""

    # leases
    def acquire_lease(
        self, target: str, owner: str, ttl_s: float, *, purpose: str = ...
    ) -> Lease: ...
    def renew_lease(self, lease: Lease, ttl_s: float) -> Lease: ...
    def release_lease(self, lease: Lease) -> bool: ...
    def validate_lease(self, lease: Lease) -> None: ...

    # thread records
    def resolve(
        self, *, id: str | None = None, key: str | None = None, include_archived: bool = False
    ) -> ThreadRecord | None: ...
    def finalize(self, request: FinalizeRequest) -> ThreadRecord: ...

    # sessions
    def create_session(
        self,
        session_id: str | None = None,
        *,
        cwd: str = "",
        header: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> Session: ...
    def get_session(self, session_id: str) -> Session | None: ...
    def append(
        self,
        session_id: str,
        kind: str,
        payload: Mapping[str, Any],
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        entry_id: str | None = None,
        timestamp: datetime | None = None,
    ) -> Entry: ...
    def branch(
        self, session_id: str, entry_id: str | None, *, expected_leaf: str | None = ANY_LEAF
    ) -> None: ...
    def branch_with_summary(
        self,
        session_id: str,
        entry_id: str,
        summary: str,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        details: Any = None,
    ) -> Entry: ...
    def entries(self, session_id: str) -> list[Entry]: ...
    def entry(self, session_id: str, entry_id: str) -> Entry | None: ...
    def replay(self, session_id: str) -> Replay: ...
    def labels(self, session_id: str) -> dict[str, str]: ...
    def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, search: str | None = None
    ) -> SessionPage: ...
    def count_sessions(self, *, search: str | None = None) -> int: ...

    # imports
    def import_batch(self, batch: ImportBatch) -> ImportResult: ...
    def opaque_records(self, session_id: str) -> list[OpaqueRecord]: ...

    def close(self) -> None: ...
