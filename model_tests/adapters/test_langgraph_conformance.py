"""LangGraph's own checkpointer conformance suite (``langgraph-checkpoint-conformance``,
run from the installed package with its ``validate``) over ``turnkeeper.langgraph``'s
savers, on both backends: every capability, base and extended, must be detected and pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from through_aio import async_store

import turnkeeper
import turnkeeper.aio
from turnkeeper.langgraph import AsyncTurnkeeperSaver, TurnkeeperSaver


def _run(
    saver: BaseCheckpointSaver[str] | Callable[[], AbstractAsyncContextManager[Any]], name: str
) -> dict[str, tuple[int, int]]:
    """The conformance report of ``saver``, or of the saver each test gets
    from ``saver()`` (an async context manager, entered on the suite's loop)."""

    @checkpointer_test(name=name)
    async def factory() -> AsyncIterator[BaseCheckpointSaver[str]]:
        if isinstance(saver, BaseCheckpointSaver):
            yield saver
        else:
            async with saver() as made:
                yield made

    report = asyncio.run(validate(factory))
    failures = {cap: result.failures for cap, result in report.results.items() if not result.passed}
    assert not failures, failures
    assert set(report.results) == {c.value for c in ALL_CAPABILITIES}
    assert all(r.detected for r in report.results.values())
    return {cap: (r.tests_passed, r.tests_failed) for cap, r in report.results.items()}


def test_each_saver_refuses_the_other_kind_of_store(store: turnkeeper.BaseStore) -> None:
    astore = turnkeeper.aio.AsyncStore.wrap(store)
    try:
        for make, given in ((AsyncTurnkeeperSaver, store), (TurnkeeperSaver, astore)):
            try:
                make(given)  # type: ignore[arg-type]
            except turnkeeper.InvalidInputError as refused:
                assert refused.field == "store"
            else:
                raise AssertionError(f"{make.__name__} took {type(given).__name__}")
    finally:
        asyncio.run(astore.close())


def test_sync_saver_passes_conformance(store: turnkeeper.BaseStore) -> None:
    passed = _run(TurnkeeperSaver(store), "TurnkeeperSaver")
    assert sum(p for p, _ in passed.values()) >= 81, passed  # 0.0.2 has 81


def test_async_saver_passes_conformance(store: turnkeeper.BaseStore) -> None:
    """Over the async store as the suite's loop opens it (native on PostgreSQL)."""

    @asynccontextmanager
    async def saver() -> AsyncIterator[AsyncTurnkeeperSaver]:
        async with await async_store(store) as astore:
            yield AsyncTurnkeeperSaver(astore)

    passed = _run(saver, "AsyncTurnkeeperSaver")
    assert sum(p for p, _ in passed.values()) >= 81, passed  # 0.0.2 has 81
