"""The base of the DuckDB store: its database and the fenced-write runner.

``DuckDBStore`` is assembled from this base and one mixin per area
(sessions, runs) so that each module stays small.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from turnkeeper.spec import errors
from turnkeeper.spec.records import Lease

from . import leases
from .db import Database, Tx

T = TypeVar("T")


class StoreBase:
    """Holds ``db`` and runs fenced writes, recording refused ones."""

    db: Database

    def _fenced(self, operation: str, lease: Lease | None, body: Callable[[Tx], T]) -> T:
        try:
            return self.db.write(operation, body)
        except errors.LeaseLostError:
            if lease is not None:
                self.db.write(
                    "record_fenced",
                    lambda tx: leases.record_fenced(tx, lease, operation),
                    transaction=False,
                )
            raise
