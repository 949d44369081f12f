"""The child process of ``test_openai_agents_kill.py``: runs one compaction through the
SDK's ``OpenAIResponsesCompactionSession`` and kills itself (``SIGKILL``) right after
the first write to the wrapped session's history completes: between the SDK's
``clear_session`` and ``add_items`` for a session without an atomic replacement.

``python openai_agents_compaction_process.py KIND TARGET``: ``KIND`` is ``sqlite`` (the
SDK's ``SQLiteSession`` on the file ``TARGET``), ``turnkeeper`` (a ``TurnkeeperSession``
on the store at ``TARGET``) or ``turnkeeper-unguarded`` (the same with its atomic
replacement hook removed, so the SDK falls back to clear then add). Exits 3 if it
was not killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agents import SQLiteSession
from agents.memory import OpenAIResponsesCompactionSession
from openai_agents_fakes import FakeClient

import turnkeeper
from turnkeeper.aio import AsyncStore
from turnkeeper.openai_agents import TurnkeeperSession

WRITES = ("clear_session", "add_items", "replace_items")


def die_after_first_write(session: Any) -> None:
    """The deterministic hook point: the first history write returns, then SIGKILL."""
    for name in WRITES:
        real = getattr(session, name, None)
        if real is None:
            continue

        async def killing(*args: Any, _real: Any = real) -> Any:
            result = await _real(*args)
            os.kill(os.getpid(), signal.SIGKILL)
            return result

        setattr(session, name, killing)


async def compact(session: Any) -> None:
    die_after_first_write(session)
    wrapper = OpenAIResponsesCompactionSession(
        "chat",
        session,
        client=FakeClient(),  # type: ignore[arg-type]
        compaction_mode="input",
    )
    await wrapper.run_compaction({"force": True})


def main(kind: str, target: str) -> int:
    if kind == "sqlite":
        asyncio.run(compact(SQLiteSession("chat", target)))
        return 3
    if kind == "turnkeeper-unguarded":
        del TurnkeeperSession._atomic_replace_items
    with turnkeeper.open_store(target) as store:
        asyncio.run(compact(TurnkeeperSession("chat", AsyncStore.wrap(store))))
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
