"""A fake ``AsyncOpenAI`` for the SDK's compaction session (offline): the one call it
makes, ``client.responses.compact``, returns :data:`COMPACTED`."""

from __future__ import annotations

from typing import Any

COMPACTED: list[Any] = [
    {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA-summary"},
    {"role": "user", "content": "message 9"},
]
"""What the fake compaction returns: a compaction item and the kept user message."""


def text(n: int) -> dict[str, Any]:
    """The ``n``-th user message of the tests' histories."""
    return {"role": "user", "content": f"message {n}"}


class _Compacted:
    def __init__(self, output: list[Any]) -> None:
        self.output = output
        self.usage = None


class _FakeResponses:
    def __init__(self, output: list[Any]) -> None:
        self.output = output
        self.calls: list[dict[str, Any]] = []

    async def compact(self, **kwargs: Any) -> _Compacted:
        self.calls.append(kwargs)
        return _Compacted(self.output)


class FakeClient:
    """Stands in for ``AsyncOpenAI`` in ``OpenAIResponsesCompactionSession(client=…)``."""

    def __init__(self, output: list[Any] = COMPACTED) -> None:
        self.responses = _FakeResponses(output)
