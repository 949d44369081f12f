"""One-line summaries of session entries and the short ids that tell them apart,
shared by ``turnkeeper sessions show``'s tree (:mod:`.sessions_view`) and its
paged list (:mod:`.sessions_pages`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from turnkeeper.spec.records import Entry

from .common import visible

SUMMARY_CHARS = 90
"""Longest one-line summary of an entry."""

SHORT_ID = 8
"""Fewest characters of an entry id's base shown in the tree (see :func:`short_ids`)."""


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def short_ids(ids: Iterable[str], minimum: int = SHORT_ID) -> dict[str, str]:
    """A short display form of each id that still tells them apart: ``{id: shown}``.

    An id ``<base>:<suffix>`` (the store derives entry ids from their run:
    ``<run id>:turn-start``, ``<run id>:user`` …) shows its base cut short and
    its whole suffix; any other id is all base. A base is cut to its shortest
    prefix of at least ``minimum`` characters that no other base among
    ``ids`` shares: UUIDv7 run ids share their first 8 characters (a time
    prefix) for about a minute, so theirs are longer. A prefix never ends
    with ``-``. Two ids never get the same form.
    """
    parts = {i: i.partition(":") for i in ids}
    bases = sorted({base for base, _, _ in parts.values()})
    cut: dict[str, str] = {}
    for k, base in enumerate(bases):
        shared = max(
            _common_prefix(base, bases[k - 1]) if k > 0 else 0,
            _common_prefix(base, bases[k + 1]) if k + 1 < len(bases) else 0,
        )
        n = min(len(base), max(minimum, shared + 1))
        while n < len(base) and base[n - 1] == "-":
            n += 1
        cut[base] = base[:n]
    return {i: cut[base] + sep + suffix for i, (base, sep, suffix) in parts.items()}


def _clip(text: str, limit: int = SUMMARY_CHARS) -> str:
    flat = " ".join(visible(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _content_text(content: Any) -> str:
    """The text of a message ``content`` (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, Mapping):
                continue
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind == "toolCall":
                args = json.dumps(block.get("arguments", {}), ensure_ascii=False)
                parts.append(f"→ {block.get('name', '?')}({args})")
            elif kind == "image":
                parts.append("[image]")
            elif kind == "thinking":
                parts.append("[thinking]")
    return " ".join(p for p in parts if p)


def _message_summary(message: Mapping[str, Any]) -> str:
    role = str(message.get("role", "?"))
    if role == "toolResult":
        err = " (error)" if message.get("isError") else ""
        body = f"{message.get('toolName', '?')}{err}: {_content_text(message.get('content'))}"
    elif role == "bashExecution":
        body = f"$ {message.get('command', '')}"
    else:
        body = _content_text(message.get("content"))
        if role == "assistant" and message.get("model"):
            body = f"({message.get('model')}) {body}"
    return f"{role}: {body}"


def summarize_entry(entry: Entry, shown: Mapping[str, str] | None = None) -> str:
    """A one-line summary of an entry: role and text for messages, the key field
    otherwise. ``shown`` maps entry ids to their display form (:func:`short_ids`),
    for the entry a label names."""
    p = entry.payload
    kind = entry.kind
    if kind == "message" and isinstance(p.get("message"), Mapping):
        text = _message_summary(p["message"])
    elif kind == "model_change":
        text = f"{p.get('provider', '?')}/{p.get('modelId', p.get('model', '?'))}"
    elif kind == "thinking_level_change":
        text = str(p.get("thinkingLevel", ""))
    elif kind == "session_info":
        text = f"title: {p.get('name', '')}"
    elif kind == "label":
        target_id = str(p.get("targetId", ""))
        target = (shown or {}).get(target_id, target_id[:SHORT_ID])
        text = f"{target} = {p['label']}" if "label" in p else f"{target} cleared"
    elif kind in ("compaction", "branch_summary"):
        text = str(p.get("summary", ""))
    elif kind in ("custom", "custom_message"):
        text = f"{p.get('customType', '')} {_content_text(p.get('content', ''))}"
    elif kind in ("turn_start", "turn_end"):
        text = f"{p.get('turnId', '')} {p.get('status', '')}"
    elif kind == "mode_change":
        text = str(p.get("mode", ""))
    else:
        text = ", ".join(list(p)[:4])
    return _clip(text)
