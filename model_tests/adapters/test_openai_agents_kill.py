"""A compaction through ``TurnkeeperSession`` survives ``kill -9``: the SDK's compaction
session replaces the history in one transaction (``_atomic_replace_items``), so a
process killed right after its first history write leaves the new history, never an
empty session. Controls: the SDK's own ``SQLiteSession`` (clear, then add) and a
``TurnkeeperSession`` with that hook removed lose the history at the same point."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import SQLiteSession
from conftest import BACKENDS, new_pg_schema, open_pg
from openai_agents_fakes import COMPACTED, text

import turnkeeper
from turnkeeper.aio import AsyncStore
from turnkeeper.openai_agents import TurnkeeperSession

CHILD = Path(__file__).resolve().parents[1] / "openai_agents_compaction_process.py"
HISTORY = [text(i) for i in range(10)]

pytestmark = pytest.mark.slow


def _kill_during_compaction(kind: str, target: str) -> None:
    done = subprocess.run(
        [sys.executable, str(CHILD), kind, target], capture_output=True, timeout=300
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()


def _open(backend: str, target: str) -> turnkeeper.BaseStore:
    return turnkeeper.open_store(target) if backend == "duckdb" else open_pg(target)


async def _in_session(store: turnkeeper.BaseStore, op: str, *args: Any) -> Any:
    async with AsyncStore.wrap(store) as astore:
        return await getattr(TurnkeeperSession("chat", astore), op)(*args)


def _items_after_kill(backend: str, tmp_path: Path, kind: str) -> list[Any]:
    target = str(tmp_path / "store.duckdb") if backend == "duckdb" else new_pg_schema()
    with _open(backend, target) as store:
        asyncio.run(_in_session(store, "add_items", HISTORY))
    _kill_during_compaction(kind, target)
    with _open(backend, target) as store:  # after the restart
        return list(asyncio.run(_in_session(store, "get_items")))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_compaction_leaves_the_history_whole(backend: str, tmp_path: Path) -> None:
    assert _items_after_kill(backend, tmp_path, "turnkeeper") == COMPACTED


@pytest.mark.parametrize("backend", BACKENDS)
def test_control_clear_then_add_loses_the_history(backend: str, tmp_path: Path) -> None:
    assert _items_after_kill(backend, tmp_path, "turnkeeper-unguarded") == []


def test_control_the_sdks_sqlite_session_loses_the_history(tmp_path: Path) -> None:
    db = str(tmp_path / "sessions.db")
    first = SQLiteSession("chat", db)
    asyncio.run(first.add_items(HISTORY))
    first.close()
    _kill_during_compaction("sqlite", db)
    again = SQLiteSession("chat", db)
    assert asyncio.run(again.get_items()) == []
    again.close()
