"""The one adaptation of the vendored SDK session tests: what constructs the session.

``make_session(session_id, db_path=":memory:", session_settings=None)`` takes
``SQLiteSession``'s arguments and builds the session of the current ``session_backend``:
the SDK's ``SQLiteSession`` (the control), or ``TurnkeeperSession`` on a DuckDB store or
a PostgreSQL schema. Sessions given the same ``db_path`` share one store, as
``SQLiteSession``'s share one file; each ``":memory:"`` session gets a store of its own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, SQLiteSession

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from conftest import new_pg_schema, open_pg  # noqa: E402

import turnkeeper  # noqa: E402
from turnkeeper.aio import AsyncStore  # noqa: E402
from turnkeeper.openai_agents import TurnkeeperSession  # noqa: E402

# Offline: the SDK's tracing would export to OpenAI (it only warns without a key).
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

_current: list[Callable[..., Any]] = []


def make_session(session_id: str, db_path: str | Path = ":memory:", **kwargs: Any) -> Any:
    """The session under test, built as ``SQLiteSession(session_id, db_path, **kwargs)``."""
    return _current[-1](session_id, db_path, **kwargs)


def _offline(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """The SDK's own test conftest's ``disable_real_model_clients``: a real model's
    calls fail the test, unless it is marked ``allow_call_model_methods``."""
    if request.node.get_closest_marker("allow_call_model_methods"):
        return

    def failing_version(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("Real models should not be used in tests!")

    for model in (OpenAIResponsesModel, OpenAIChatCompletionsModel):
        monkeypatch.setattr(model, "get_response", failing_version)
        monkeypatch.setattr(model, "stream_response", failing_version)


@pytest.fixture(params=["sqlite", "duckdb", "postgres"])
def session_backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    _offline(monkeypatch, request)
    stores: dict[str, turnkeeper.BaseStore] = {}
    wrapped: dict[str, AsyncStore] = {}

    def open_for(db_path: str | Path) -> AsyncStore:
        key = str(db_path)
        if key == ":memory:":
            key = f":memory:{len(stores)}"
        if key not in stores:
            if request.param == "duckdb":
                stores[key] = turnkeeper.open_store(str(tmp_path / f"store{len(stores)}.duckdb"))
            else:
                stores[key] = open_pg(new_pg_schema())
            wrapped[key] = AsyncStore.wrap(stores[key])
        return wrapped[key]

    def turnkeeper_session(
        session_id: str, db_path: str | Path = ":memory:", **kwargs: Any
    ) -> TurnkeeperSession:
        return TurnkeeperSession(session_id, open_for(db_path), **kwargs)

    _current.append(SQLiteSession if request.param == "sqlite" else turnkeeper_session)
    try:
        yield request.param
    finally:
        _current.pop()
        for astore in wrapped.values():
            astore.runner.close()  # its worker threads; the sync store next
        for store in stores.values():
            store.close()
