"""Replay: the current branch as model context, the way pi builds it.

Pure functions shared by every backend (pi ``buildSessionContext``, see
``corpus/FORMATS.md`` §1.5): walk leaf → root; only the last compaction on
the path counts; emit its summary, then the path entries from its
``firstKeptEntryId`` up to it, then everything after it. A first-kept id not
on the path keeps nothing before the compaction (as pi does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import Entry, Replay


def _ms(entry: Entry) -> int:
    return int(entry.timestamp.timestamp() * 1000)


def context_message(entry: Entry) -> Mapping[str, Any] | None:
    """The model-context message an entry contributes, or ``None``."""
    p = entry.payload
    if entry.kind == EntryKind.MESSAGE:
        message: Mapping[str, Any] = p["message"]
        return message
    if entry.kind == EntryKind.CUSTOM_MESSAGE:
        return {
            "role": "custom",
            "customType": p.get("customType"),
            "content": p.get("content"),
            "display": p.get("display"),
            "details": p.get("details"),
            "timestamp": _ms(entry),
        }
    if entry.kind == EntryKind.BRANCH_SUMMARY and p.get("summary"):
        return {
            "role": "branchSummary",
            "summary": p["summary"],
            "fromId": p.get("fromId"),
            "timestamp": _ms(entry),
        }
    return None


def build_replay(path: Sequence[Entry]) -> Replay:
    """Replay for ``path`` (root → leaf). Turn start/end and settings entries are skipped."""
    compaction_at = -1
    for i, entry in enumerate(path):
        if entry.kind == EntryKind.COMPACTION:
            compaction_at = i
    messages: list[Mapping[str, Any]] = []
    ids: list[str] = []

    def add(entry: Entry) -> None:
        msg = context_message(entry)
        if msg is not None:
            messages.append(msg)
            ids.append(entry.id)

    if compaction_at < 0:
        for entry in path:
            add(entry)
    else:
        comp = path[compaction_at]
        messages.append(
            {
                "role": "compactionSummary",
                "summary": comp.payload.get("summary"),
                "tokensBefore": comp.payload.get("tokensBefore"),
                "timestamp": _ms(comp),
            }
        )
        ids.append(comp.id)
        first_kept = comp.payload.get("firstKeptEntryId")
        keeping = False
        for entry in path[:compaction_at]:
            keeping = keeping or entry.id == first_kept
            if keeping:
                add(entry)
        for entry in path[compaction_at + 1 :]:
            add(entry)
    model, thinking = path_settings(path)
    return Replay(tuple(messages), tuple(ids), model, thinking)


def path_settings(
    path: Sequence[Entry], model: Mapping[str, Any] | None = None, thinking: str = "off"
) -> tuple[Mapping[str, Any] | None, str]:
    """The model and thinking level after ``path`` (root → leaf), starting from
    ``model`` and ``thinking`` (a replay's, to carry one on along new entries):
    the latest model change or assistant model, the latest thinking-level change."""
    for entry in path:
        if entry.kind == EntryKind.MODEL_CHANGE:
            model = {
                "provider": entry.payload.get("provider"),
                "modelId": entry.payload.get("modelId"),
            }
        elif entry.kind == EntryKind.THINKING_LEVEL_CHANGE:
            thinking = str(entry.payload.get("thinkingLevel"))
        elif (
            entry.kind == EntryKind.MESSAGE and entry.payload["message"].get("role") == "assistant"
        ):
            msg = entry.payload["message"]
            if msg.get("provider") or msg.get("model"):
                model = {"provider": msg.get("provider"), "modelId": msg.get("model")}
    return model, thinking


def path_to(entries: Mapping[str, Entry], leaf_id: str | None) -> list[Entry]:
    """Root → leaf path through ``entries`` (by id); stops at a missing parent or a cycle."""
    path: list[Entry] = []
    seen: set[str] = set()
    node = entries.get(leaf_id) if leaf_id is not None else None
    while node is not None and node.id not in seen:
        seen.add(node.id)
        path.append(node)
        node = entries.get(node.parent_id) if node.parent_id is not None else None
    path.reverse()
    return path
