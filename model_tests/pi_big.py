"""Write synthetic pi session files (version 3) of any length, for the big-session
tests and ``reports/bench_cli.py``.

A file is a header, then a linear chain of turns of four entries: a user
message, an assistant message calling a tool (``toolCall``), its
``toolResult``, and the assistant's reply carrying ``usage`` (as pi writes
them, ``corpus/FORMATS.md`` §1.3), so every replayed context keeps the
tool-call pairing the store checks. Each message's text is padded so an
entry is about :data:`ENTRY_BYTES` long, the size of the entries of the
200,000-entry, 66 MB file issue 21 measured. Ids are ``e<index>`` in hex, so
two files of the same ``session_id`` agree on their common entries: a longer
file is a shorter one grown.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

ENTRY_BYTES = 330
"""About the bytes of one entry's line (66 MB / 200,000 entries)."""
START = datetime(2026, 1, 1, tzinfo=UTC)


def _stamp(i: int) -> str:
    t = START + timedelta(seconds=i)
    return t.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _text(i: int, room: int) -> str:
    return (f"turn {i} " + "lorem ipsum dolor sit amet " * 20)[: max(room, 8)]


def entry(i: int) -> dict[str, Any]:
    """The record of entry ``i`` (0-based) of a synthetic file."""
    eid, parent = f"e{i:07x}", (f"e{i - 1:07x}" if i else None)
    base: dict[str, Any] = {"type": "message", "id": eid, "parentId": parent}
    base["timestamp"] = _stamp(i)
    call = f"call{i // 4:07x}"
    step = i % 4
    if step == 0:
        message: dict[str, Any] = {"role": "user", "content": _text(i, 220)}
    elif step == 1:
        message = {
            "role": "assistant",
            "content": [{"type": "toolCall", "id": call, "name": "read", "arguments": {"p": "f"}}],
            "model": "m1",
            "provider": "p1",
            "stopReason": "toolUse",
        }
    elif step == 2:
        message = {
            "role": "toolResult",
            "toolCallId": call,
            "toolName": "read",
            "content": [{"type": "text", "text": _text(i, 160)}],
            "isError": False,
        }
    else:
        message = {
            "role": "assistant",
            "content": [{"type": "text", "text": _text(i, 60)}],
            "model": "m1",
            "provider": "p1",
            "stopReason": "stop",
            "usage": {"input": 10, "output": 5, "totalTokens": 15},
        }
    message["timestamp"] = 1767225600000 + i * 1000
    base["message"] = message
    return base


def header(session_id: str) -> dict[str, Any]:
    return {
        "type": "session",
        "version": 3,
        "id": session_id,
        "timestamp": _stamp(0),
        "cwd": "/w",
    }


def write(path: str | os.PathLike[str], entries: int, session_id: str = "big-1") -> int:
    """Write a file of ``entries`` entries (see the module docstring); returns its bytes."""
    with open(path, "wb") as f:
        f.write(orjson.dumps(header(session_id)) + b"\n")
        for i in range(entries):
            f.write(orjson.dumps(entry(i)) + b"\n")
    return os.path.getsize(path)


def append(path: str | os.PathLike[str], start: int, count: int) -> None:
    """Append entries ``start`` … ``start + count - 1`` to a file written by :func:`write`."""
    with open(path, "ab") as f:
        for i in range(start, start + count):
            f.write(orjson.dumps(entry(i)) + b"\n")


def spy_parses(monkeypatch: Any) -> list[int]:
    """The line numbers every pi line reader splits into records from now on
    (a spy on ``split_line``, which every reader of a file's lines calls once
    per line: the header's detection included; the split itself runs)."""
    from turnkeeper.formats import _rows, pi_parse

    seen: list[int] = []
    real = pi_parse.split_line

    def spy(text: str, line: int) -> list[pi_parse.Piece]:
        seen.append(line)
        return real(text, line)

    monkeypatch.setattr(pi_parse, "split_line", spy)
    monkeypatch.setattr(_rows, "split_line", spy)
    return seen
