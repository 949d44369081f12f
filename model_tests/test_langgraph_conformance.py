"""LangGraph's own checkpointer conformance suite (``langgraph-checkpoint-conformance``,
run from the installed package with its ``validate``) over ``turnkeeper.langgraph``'s
savers, on both backends: every capability, base and extended, must be detected and pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

import turnkeeper
import turnkeeper.aio
from turnkeeper.langgraph import AsyncTurnkeeperSaver, TurnkeeperSaver


def _run(saver: BaseCheckpointSaver[str], name: str) -> dict[str, tuple[int, int]]:
    @checkpointer_test(name=name)
    async def factory() -> AsyncIterator[BaseCheckpointSaver[str]]:
        yield saver

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
    astore = turnkeeper.aio.AsyncStore.wrap(store)
    try:
        passed = _run(AsyncTurnkeeperSaver(astore), "AsyncTurnkeeperSaver")
    finally:
        asyncio.run(astore.close())
    assert sum(p for p, _ in passed.values()) >= 81, passed  # 0.0.2 has 81
