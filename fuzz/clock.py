"""The injected clock the differential machines run the store on."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta


class FakeClock:
    """An injectable store clock (``open_store(..., clock=FakeClock())``) that
    only moves when its owner advances it: calling it returns the current
    time, an aware UTC ``datetime`` (by default 2026-01-01 12:00:00.123456).
    Thread-safe; it never raises."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (s, may be fractional)."""
        with self._lock:
            self.now += timedelta(seconds=seconds)
