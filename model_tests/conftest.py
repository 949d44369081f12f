"""Shared fixtures: one store per backend, an injected clock, Hypothesis profiles.

Profiles (``HYPOTHESIS_PROFILE``): ``dev`` (default, quick), ``ci`` (bounded
for CI), ``nightly`` (long runs on demand).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import turnkeeper

settings.register_profile(
    "dev",
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    max_examples=120,
    stateful_step_count=30,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "nightly",
    max_examples=5000,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

BACKENDS = ["duckdb"]
"""Every backend the conformance suite runs over."""


class FakeClock:
    """An injectable store clock that only moves when a test advances it."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += timedelta(seconds=seconds)


def open_backend(
    backend: str, path: Path, clock: Callable[[], datetime] | None
) -> turnkeeper.Store:
    if backend == "duckdb":
        return turnkeeper.open_store(str(path / "store.duckdb"), clock=clock)
    raise ValueError(backend)


CORPUS = Path(
    os.environ.get("TURNKEEPER_CORPUS")
    or Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
)
"""The shared corpus of real session files (read in place, never copied)."""


@pytest.fixture(scope="session")
def pi_dir() -> Path:
    """The corpus's pi files: a test without them skips locally and fails in CI."""
    folder = CORPUS / "pi"
    if not folder.is_dir():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"corpus folder {folder} is missing (set TURNKEEPER_CORPUS)")
        pytest.skip(f"corpus folder {folder} is missing")
    return folder


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=BACKENDS)
def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[turnkeeper.DuckDBStore]:
    s = open_backend(request.param, tmp_path, clock)
    yield s  # type: ignore[misc]
    s.close()


@pytest.fixture(params=BACKENDS)
def real_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[turnkeeper.DuckDBStore]:
    """A store on the database's own clock."""
    s = open_backend(request.param, tmp_path, None)
    yield s  # type: ignore[misc]
    s.close()


def forge(store: turnkeeper.DuckDBStore, sql: str, params: list[Any] | None = None) -> None:
    """Write ``sql`` straight to the store's database, bypassing every check: tests
    use it to forge states the store itself never writes (``query`` only reads)."""
    store.db.write("forge", lambda tx: tx.exec(sql, params or []), transaction=False, retry=False)
