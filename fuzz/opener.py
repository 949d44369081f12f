"""Where a differential machine gets its stores: an injected opener.

Each example of a machine opens a new, empty store with the opener and closes
it at the example's end. The test suite's opener hands out template copies and
reused PostgreSQL schemas (``model_tests/conftest.py``); ``turnkeeper fuzz``'s
opens scratch stores beside the user's configuration (:mod:`.scratch`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from turnkeeper.storage import BaseStore


class StoreOpener(Protocol):
    """Opens a new, empty store per example and closes it afterwards.

    ``name`` names the configuration (``"duckdb"``, ``"postgres+enc"`` …), for
    the machine's class name and the report.
    """

    @property
    def name(self) -> str:
        """The configuration's name (no password or path in it)."""
        ...

    def open(self, clock: Callable[[], datetime]) -> BaseStore:
        """A new, empty, migrated store whose clock is ``clock``.

        Raises whatever :func:`turnkeeper.open_store` raises (a
        :class:`~turnkeeper.spec.errors.TurnkeeperError`)."""
        ...

    def close(self, store: BaseStore) -> None:
        """Close ``store`` (one this opener opened) and discard its data."""
        ...

    def peer(self, store: BaseStore, clock: Callable[[], datetime]) -> BaseStore | None:
        """A second store object on ``store``'s data, on ``clock``: another
        worker's connections, for machines that race two workers. ``None``
        where the engine gives one process one store per file (DuckDB).

        The caller closes a peer with its ``close()`` before it closes
        ``store`` with :meth:`close`. Raises what :meth:`open` raises."""
        ...
