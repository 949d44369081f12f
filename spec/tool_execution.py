"""The tool-execution record (session seed ToolExecutionRecord; DESIGN machine 5).

One record per *execution key*, the local deduplication authority for one
tool invocation. Claiming a key creates the record ``running``; a second
claimer gets the existing record and must consult it, never start a second
execution. A running record ends ``completed`` with the tool's own result,
or is marked ``interrupted`` after the process running it was lost; the
transcript then gets an explicit interrupted ``toolResult`` (``isError``),
never an invented output. An interrupted call runs again only by reclaiming
its record: automatically for a read-only tool, and for a side-effecting
tool only after an explicit, user-confirmed ``retry_requested``. Any
uncertain record (running, interrupted, retry requested) can be
``abandoned`` instead, which makes the next user-submitted run a new
operation rather than a silent replay.

Facts the guards read in the transaction that writes:

- ``side_effecting``: the record's tool has side effects (stored at claim).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from .lifecycle import Edge, Lifecycle, fact


class ToolExecutionState(StrEnum):
    """Tool-execution record states (session seed ExecutionState values)."""

    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    RETRY_REQUESTED = "retry_requested"
    ABANDONED = "abandoned"


TERMINAL = frozenset({ToolExecutionState.COMPLETED, ToolExecutionState.ABANDONED})
"""States a record ends in; a terminal record is never reopened."""

_UNCERTAIN = ("running", "interrupted", "retry_requested")

UNCERTAIN = frozenset(ToolExecutionState(s) for s in _UNCERTAIN)
"""States whose outcome is unknown to the store: these may be abandoned."""

TOOL_EXECUTION = Lifecycle(
    name="tool_execution",
    states=("absent", *(s.value for s in ToolExecutionState)),
    initial="absent",
    edges=(
        Edge("claim", "claim", "absent", "running"),
        Edge("complete", "complete", "running", "completed"),
        Edge("interrupt", "interrupt", "running", "interrupted"),
        Edge(
            "request_retry",
            "request_retry",
            "interrupted",
            "retry_requested",
            guards=("side_effecting",),
        ),
        Edge("reclaim_running", "reclaim", "running", "running", unless=("side_effecting",)),
        Edge(
            "reclaim_interrupted", "reclaim", "interrupted", "running", unless=("side_effecting",)
        ),
        Edge("reclaim_confirmed", "reclaim", "retry_requested", "running"),
        *(Edge(f"abandon_{s}", "abandon", s, "abandoned") for s in _UNCERTAIN),
    ),
    guards={
        "side_effecting": (
            fact("side_effecting"),
            "the record's tool has side effects (as claimed)",
        ),
    },
    invariants=(
        "a second claim of an execution key returns the existing record, never a second execution",
        "a completed or abandoned record is never reopened or changed",
        "a side-effecting call runs again only after an explicit retry request; "
        "only read-only calls are reclaimed automatically",
        "an interrupted or abandoned call has one tool result in the transcript, the tool's "
        "own or an explicit interrupted one; no output is invented",
        "every transition appends a tool-execution event in the same transaction",
    ),
)


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """The idempotency record of one tool invocation (session seed ToolExecutionRecord).

    ``execution_key`` is local and the deduplication authority.
    ``provider_call_id`` is the ``toolCall`` block's ``id`` in the assistant
    message (the ``toolCallId`` of its ``toolResult``); ``local_turn_id``
    the conversation turn it belongs to. ``args_digest`` is the sha256 hex
    digest of the call's arguments as canonical JSON (sorted keys); the
    arguments themselves live in the transcript. ``state`` is a
    :class:`ToolExecutionState` value. ``result`` is the JSON result summary
    given at completion (``is_error`` when the tool reported an error);
    ``reason`` says why the record was interrupted or abandoned. ``attempt``
    counts executions from 1 (a reclaim adds one); ``lease_epoch`` is the
    epoch of the session lease the latest claim or reclaim was fenced by.
    Times are aware UTC, by the store's clock.
    """

    execution_key: str
    session_id: str
    run_id: str | None
    local_turn_id: str
    provider: str
    api: str
    response_id: str
    provider_call_id: str
    tool_kind: str
    tool_name: str
    args_digest: str
    side_effecting: bool
    state: str
    result: Any
    is_error: bool
    provider_metadata: Any
    reason: str | None
    attempt: int
    lease_epoch: int | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None


INTERRUPTED_TEXT = (
    "Tool execution was interrupted before it reported a result. "
    "It was not run again and no output is available."
)
"""The text of the explicit interrupted ``toolResult`` written to the transcript."""


def interrupted_result(record: ToolExecution, timestamp_ms: int) -> dict[str, Any]:
    """The pi ``toolResult`` message that pairs ``record``'s ``toolCall`` when it
    was interrupted: ``isError`` true, a text saying so, and no tool output.

    ``timestamp_ms`` is the message's epoch-milliseconds timestamp.
    """
    return {
        "role": "toolResult",
        "toolCallId": record.provider_call_id,
        "toolName": record.tool_name,
        "content": [{"type": "text", "text": INTERRUPTED_TEXT}],
        "details": {
            "executionKey": record.execution_key,
            "executionState": ToolExecutionState.INTERRUPTED.value,
            "attempt": record.attempt,
        },
        "isError": True,
        "timestamp": timestamp_ms,
    }


def unrecorded_interrupted_result(
    call_id: str, tool_name: str, timestamp_ms: int
) -> dict[str, Any]:
    """The interrupted ``toolResult`` for a ``toolCall`` that has no execution
    record (the process died before claiming it): like :func:`interrupted_result`,
    without record details."""
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": tool_name,
        "content": [{"type": "text", "text": INTERRUPTED_TEXT}],
        "details": {"executionState": ToolExecutionState.INTERRUPTED.value, "recorded": False},
        "isError": True,
        "timestamp": timestamp_ms,
    }


def is_content(value: Any) -> bool:
    """Whether ``value`` is a list of content blocks (each a JSON object with a
    string ``type``, as pi's ``text`` and ``image`` blocks): a tool result's
    content as it stands."""
    return isinstance(value, list) and all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in value
    )


def result_content(result: Any) -> list[Any]:
    """The ``toolResult`` content of a result stored by ``tools.complete``:
    a string is one ``text`` block holding it; content blocks (:func:`is_content`)
    are the content as they are; any other JSON value has no content form, and
    its JSON text (sorted keys, no spaces) is one ``text`` block."""
    if isinstance(result, str):
        return [{"type": "text", "text": result}]
    if is_content(result):
        return list(result)
    return [{"type": "text", "text": result_json(result)}]


def result_json(result: Any) -> str:
    """``result`` as JSON text: sorted keys, no spaces, non-ASCII kept."""
    return json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def recorded_result(record: ToolExecution, timestamp_ms: int) -> dict[str, Any]:
    """The ``toolResult`` rebuilt from a completed record (the tool ran and
    reported; the process died before the transcript got its result): the
    tool's own result as ``tools.complete`` stored it, unchanged,
    with the record's ``is_error``. Its content is :func:`result_content`; a
    result that is neither text nor content blocks is also kept as it is in
    ``details.result``. ``details`` marks it as rebuilt (``fromRecord``)."""
    result = record.result
    details: dict[str, Any] = {
        "executionKey": record.execution_key,
        "executionState": ToolExecutionState.COMPLETED.value,
        "fromRecord": True,
    }
    if not isinstance(result, str) and not is_content(result):
        details["result"] = result
    return {
        "role": "toolResult",
        "toolCallId": record.provider_call_id,
        "toolName": record.tool_name,
        "content": result_content(result),
        "details": details,
        "isError": record.is_error,
        "timestamp": timestamp_ms,
    }


def openai_content(result: Any) -> Any:
    """The content of an OpenAI chat ``tool`` message for a result stored by
    ``tools.complete``: a string or content blocks as they are, any
    other JSON value as its JSON text (:func:`result_json`)."""
    if isinstance(result, str) or is_content(result):
        return result
    return result_json(result)


def openai_result(call_id: str, content: Any) -> dict[str, Any]:
    """The OpenAI chat ``tool`` message answering the ``tool_calls`` item
    ``call_id`` with ``content`` (a string, or content parts): only the fields
    the chat API takes (it refuses others), so an interrupted one says so in
    its text (:data:`INTERRUPTED_TEXT`) and carries no record details."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}
