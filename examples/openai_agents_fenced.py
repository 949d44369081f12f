"""An OpenAI Agents SDK loop whose conversation lives in turnkeeper, fenced by a lease.

Offline: the agent's model is :class:`CalculatorModel`, a deterministic ``agents.Model``
that calls the ``add`` tool for "what is A + B?" and then answers with its result.

Worker A holds the conversation's lease and runs a turn; worker B is refused while A
holds it. A hands over (releases); B takes the lease and runs the next turn with the
whole history. A, now stale, tries one more turn and is refused (``LeaseLostError``):
nothing it would have written is stored.

Run: ``python examples/openai_agents_fenced.py [STORE]`` (default: in memory; a DuckDB
file path or a ``postgresql://`` URL keeps the conversation).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # offline: no trace export

from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import turnkeeper
import turnkeeper.aio
from turnkeeper.openai_agents import TurnkeeperSession


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class CalculatorModel(Model):
    """A deterministic model: on a user question "what is A + B?" it calls ``add``; on
    the tool's output it answers, counting the questions it has seen in the history."""

    def _output(self, items: str | list[Any]) -> list[Any]:
        history = [{"role": "user", "content": items}] if isinstance(items, str) else items
        last = history[-1]
        asked = [i for i in history if i.get("role") == "user"]
        if last.get("type") == "function_call_output":
            text = f"{last['output']} (question {len(asked)} of this conversation)"
            content = [ResponseOutputText(type="output_text", text=text, annotations=[])]
            return [
                ResponseOutputMessage(
                    id=f"msg_{len(history)}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=content,
                )
            ]
        a, b = map(int, re.findall(r"-?\d+", str(last.get("content")))[:2])
        call_id = f"call_{len(history)}"
        return [
            ResponseFunctionToolCall(
                id=call_id,
                call_id=call_id,
                type="function_call",
                name="add",
                arguments=json.dumps({"a": a, "b": b}),
            )
        ]

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        return ModelResponse(output=self._output(input), usage=Usage(), response_id=None)

    async def stream_response(  # type: ignore[override]
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        response = Response(
            id="calculator",
            created_at=0,
            model="calculator",
            object="response",
            output=self._output(input),
            tool_choice="none",
            tools=[],
            top_p=None,
            parallel_tool_calls=False,
            status="completed",
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )


async def main(target: str = ":memory:") -> list[str]:
    """Runs the two workers; returns what happened, one line per step."""
    log: list[str] = []
    agent = Agent(name="calculator", model=CalculatorModel(), tools=[add])
    async with turnkeeper.aio.open_store(target) as store:
        a = await TurnkeeperSession.acquire("support-chat", store, "worker-a", ttl_s=60)
        first = await Runner.run(agent, "what is 2 + 3?", session=a)
        log.append(f"worker-a: {first.final_output}")
        try:
            await TurnkeeperSession.acquire("support-chat", store, "worker-b", ttl_s=60)
        except turnkeeper.BusyError as busy:
            log.append(f"worker-b: refused while {busy.holder} holds the conversation")
        assert a.lease is not None
        await store.leases.release(a.lease)  # A hands the conversation over
        b = await TurnkeeperSession.acquire("support-chat", store, "worker-b", ttl_s=60)
        second = await Runner.run(agent, "and what is 10 + 20?", session=b)
        log.append(f"worker-b: {second.final_output}")
        try:
            await Runner.run(agent, "what is 1 + 1?", session=a)
        except turnkeeper.LeaseLostError:
            log.append("worker-a: stale, refused")
        items = await b.get_items()
        log.append(f"stored: {len(items)} items, last: {items[-1]['content'][0]['text']!r}")
    return log


if __name__ == "__main__":
    for line in asyncio.run(main(*sys.argv[1:2])):
        print(line)
