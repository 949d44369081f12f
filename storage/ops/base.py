"""The base every area of the store's API shares: the backend, the
fenced-write runner, and the check that a read inside a session found the
session.

``BaseStore`` (``storage/store.py``) holds one object per area
(``store.leases``, ``store.sessions``, ``store.runs`` …), each a class of
``storage/ops/`` named after it; an area too big for one module is assembled
from parts (``…Part`` classes) in modules beside it, so each module stays
small and holds both its transactions and its public methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from turnkeeper.spec import errors
from turnkeeper.spec.records import Lease

from ..backend import STORE_NOW, Backend, Merge, Tx
from .pairing_checks import OpeningCache

T = TypeVar("T")


@dataclass(frozen=True)
class Shared:
    """What every area of one store object shares."""

    db: Backend
    secret: bytes
    """The store object's key for lease token digests (see ``leases``)."""
    openings: OpeningCache
    """Per session, the calls open at the head this store object's last write
    of it left (see ``pairing_checks``)."""


class Area:
    """One area of the store's API over the shared backend: holds ``db``, runs
    fenced writes (recording refused ones), and checks reads inside a session."""

    def __init__(self, shared: Shared) -> None:
        self.db = shared.db
        self._secret = shared.secret
        self._openings = shared.openings

    def _inside(self, session_id: str, found: T) -> T:
        """``found``, read inside session ``session_id``; an empty answer for a
        session that does not exist is ``SessionNotFoundError``. A later
        existence check answers for the read: a session id is never reused
        once deleted, so a session missing now either never existed or was
        deleted, and an empty read of it is the deleted state."""
        if not found:
            row = self.db.read(
                "session_exists",
                lambda tx: tx.one("SELECT 1 FROM sessions WHERE id = ?", [session_id]),
            )
            if row is None:
                raise errors.SessionNotFoundError(session_id)
        return found

    def _fenced(
        self,
        operation: str,
        lease: Lease | None,
        body: Callable[[Tx], T],
        merge: Merge | None = None,
        *,
        transaction: bool = True,
        exclusive: bool = True,
    ) -> T:
        """``db.write(operation, body, …)``; a ``LeaseLostError`` is recorded
        against ``lease`` in ``fence_events`` (in a write of its own) and raised."""
        try:
            return self.db.write(
                operation, body, merge=merge, transaction=transaction, exclusive=exclusive
            )
        except errors.LeaseLostError:
            if lease is not None:
                self._record_fenced(lease, operation)
            raise

    def _record_fenced(self, lease: Lease, operation: str) -> None:
        """Record a write refused under ``lease`` in ``fence_events`` (autocommit)."""
        self.db.write(
            "record_fenced", lambda tx: record_fenced(tx, lease, operation), transaction=False
        )


def record_fenced(tx: Tx, lease: Lease, operation: str) -> None:
    """Append a ``fence_events`` row for a write refused under ``lease`` (autocommit)."""
    tx.exec(
        f"INSERT INTO fence_events VALUES (?, ?, ?, ?, {STORE_NOW})",
        [lease.target, lease.owner, lease.epoch, operation, tx.now],
    )
