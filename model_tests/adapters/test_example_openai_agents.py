"""``examples/openai_agents_fenced.py`` runs, offline, on both backends: the stale
worker is refused and the conversation holds both turns; its model also streams."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from agents import Agent, Runner, SQLiteSession
from conftest import BACKENDS, new_pg_schema, with_listen

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_agents_fenced.py"

EXPECTED = [
    "worker-a: 5 (question 1 of this conversation)",
    "worker-b: refused while worker-a holds the conversation",
    "worker-b: 30 (question 2 of this conversation)",
    "worker-a: stale, refused",
    "stored: 8 items, last: '30 (question 2 of this conversation)'",
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_example_runs(backend: str, tmp_path: Path) -> None:
    target = str(tmp_path / "chat.duckdb") if backend == "duckdb" else with_listen(new_pg_schema())
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), target], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == EXPECTED


def test_the_examples_model_streams() -> None:
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import openai_agents_fenced as example
    finally:
        sys.path.remove(str(EXAMPLE.parent))

    async def turn() -> tuple[object, int]:
        agent = Agent(name="calculator", model=example.CalculatorModel(), tools=[example.add])
        session = SQLiteSession("streamed")
        streamed = Runner.run_streamed(agent, "what is 4 + 5?", session=session)
        async for _ in streamed.stream_events():
            pass
        return streamed.final_output, len(await session.get_items())

    assert asyncio.run(turn()) == ("9 (question 1 of this conversation)", 4)
