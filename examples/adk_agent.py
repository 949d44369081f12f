"""A Google ADK agent whose sessions live in turnkeeper, offline.

    python examples/adk_agent.py agents.duckdb

The model is a fake (an ADK ``BaseLlm`` that answers deterministically, no
network): asked to add two numbers it calls the ``add`` tool, and once the
tool answered it says the sum. The tool keeps a running total in the user's
state (``user:total``), which outlives the session. Run it twice on one file:
the second run starts a new session and finds the first run's total.
"""

from __future__ import annotations

import asyncio
import re
import sys
import uuid
from collections.abc import AsyncGenerator

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools.tool_context import ToolContext
from google.genai import types

import turnkeeper.aio
from turnkeeper.adk import TurnkeeperSessionService


class FakeModel(BaseLlm):
    """Calls ``add`` with the two numbers of the last user message, then states the result."""

    model: str = "fake-adder"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1].parts or []
        answered = [p.function_response for p in last if p.function_response]
        if answered:
            result = (answered[0].response or {}).get("sum")
            part = types.Part(text=f"The sum is {result}.")
        else:
            a, b = (int(n) for n in re.findall(r"-?\d+", last[0].text or "")[:2])
            call = types.FunctionCall(id=uuid.uuid4().hex, name="add", args={"a": a, "b": b})
            part = types.Part(function_call=call)
        usage = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=len(llm_request.contents), candidates_token_count=1
        )
        yield LlmResponse(content=types.Content(role="model", parts=[part]), usage_metadata=usage)


def add(a: int, b: int, tool_context: ToolContext) -> dict[str, int]:
    """Adds two integers and keeps a running total for the user."""
    total = tool_context.state.get("user:total", 0) + a + b
    tool_context.state["user:total"] = total
    return {"sum": a + b, "total": total}


async def main(path: str) -> None:
    agent = LlmAgent(name="adder", model=FakeModel(), tools=[add], instruction="Add numbers.")
    async with (
        turnkeeper.aio.open_store(path) as store,
        TurnkeeperSessionService(store, owner="example-worker") as sessions,
    ):
        runner = Runner(app_name="adder", agent=agent, session_service=sessions)
        session = await sessions.create_session(app_name="adder", user_id="alice")
        for question in ("What is 2 plus 3?", "And 10 plus 20?"):
            message = types.Content(role="user", parts=[types.Part(text=question)])
            async for event in runner.run_async(
                user_id="alice", session_id=session.id, new_message=message
            ):
                if event.is_final_response() and event.content and event.content.parts:
                    print(f"{question} -> {event.content.parts[0].text}")
        stored = await sessions.get_session(
            app_name="adder", user_id="alice", session_id=session.id
        )
        assert stored is not None
        print(f"session {session.id}: {len(stored.events)} events stored")
        print(f"user total: {stored.state['user:total']}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "adk-example.duckdb"))
