"""Replay: the current branch as model context, the way pi builds it.

Pure functions shared by every backend (pi ``buildSessionContext``, see
``corpus/FORMATS.md`` §1.5): walk leaf → root; only the last compaction on
the path counts; emit its summary, then the path entries from its
``firstKeptEntryId`` up to it, then everything after it. A first-kept id not
on the path keeps nothing before the compaction (as pi does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


# -- tool-call pairing in the replayed context ---------------------------------------


@dataclass(frozen=True, slots=True)
class PairingFault:
    """A ``toolResult`` a model provider would reject in a replayed context.

    ``reason`` is ``"unpaired"`` (no ``toolCall`` with its id is in the
    context), ``"duplicate"`` (its call was already answered there),
    ``"late"`` (other messages followed its call before it: a provider takes
    results only right after the call's assistant message) or ``"cut"`` (a
    compaction kept the result but cut its call off; ``entry_id`` is then the
    compaction's id and ``result_id`` the result's).
    """

    entry_id: str
    tool_call_id: str
    reason: str
    result_id: str


def tool_call_ids(entry: Entry) -> list[str]:
    """The ids of the ``toolCall`` blocks of an assistant message entry."""
    if entry.kind != EntryKind.MESSAGE:
        return []
    message = entry.payload.get("message")
    if not isinstance(message, Mapping) or message.get("role") != "assistant":
        return []
    content = message.get("content")
    return [
        block["id"]
        for block in (content if isinstance(content, list) else [])
        if isinstance(block, Mapping)
        and block.get("type") == "toolCall"
        and isinstance(block.get("id"), str)
    ]


def tool_result_call_id(entry: Entry) -> str | None:
    """The ``toolCallId`` of a ``toolResult`` message entry, else ``None``."""
    if entry.kind != EntryKind.MESSAGE:
        return None
    message = entry.payload.get("message")
    if not isinstance(message, Mapping) or message.get("role") != "toolResult":
        return None
    call_id = message.get("toolCallId")
    return call_id if isinstance(call_id, str) else ""


class _Context:
    """The tool calls and results of a replayed context, as it grows.

    A provider takes a call's results only right after the assistant message
    that made it: once any other message follows (a user message, another
    assistant message, a summary …), the calls still unanswered can no longer
    be answered (``expired``).
    """

    def __init__(self) -> None:
        self.open: dict[str, Entry] = {}  # answerable call id → its assistant entry
        self.answered: set[str] = set()
        self.expired: dict[str, Entry] = {}  # lapsed unanswered call id → its entry

    def add(self, entry: Entry) -> PairingFault | None:
        answers = tool_result_call_id(entry)
        if answers is None:
            if context_message(entry) is not None:  # another message: the calls lapse
                self.expired.update(self.open)
                self.open = {}
            for call_id in tool_call_ids(entry):
                self.open[call_id] = entry
                self.answered.discard(call_id)
                self.expired.pop(call_id, None)
            return None
        if answers in self.open:
            del self.open[answers]
            self.answered.add(answers)
            return None
        if answers in self.answered:
            reason = "duplicate"
        elif answers in self.expired:
            reason = "late"
        else:
            reason = "unpaired"
        return PairingFault(entry.id, answers, reason, entry.id)


def _walk_context(path: Sequence[Entry]) -> tuple[_Context, list[PairingFault], int]:
    """The final context, every fault along the path, and where in that list the
    faults of the final context begin (at the last compaction)."""
    faults: list[PairingFault] = []
    context = _Context()
    last_reset = 0
    for i, entry in enumerate(path):
        if entry.kind == EntryKind.COMPACTION:
            context = _Context()
            last_reset = len(faults)
            first_kept = entry.payload.get("firstKeptEntryId")
            start = next((k for k in range(i) if path[k].id == first_kept), i)
            for kept in path[start:i]:
                fault = context.add(kept)
                if fault is not None:
                    faults.append(PairingFault(entry.id, fault.tool_call_id, "cut", kept.id))
            continue
        fault = context.add(entry)
        if fault is not None:
            faults.append(fault)
    return context, faults, last_reset


def pairing_faults(path: Sequence[Entry]) -> list[PairingFault]:
    """Every pairing fault along ``path`` (root → leaf), each judged in the
    context replay would build at that point: a result appended where its call
    is not in the context, and a compaction whose cut keeps a result but not
    its call. Pure; the audit runs it over every branch, appends over the new
    one (see :func:`new_pairing_faults`)."""
    return _walk_context(path)[1]


def context_faults(path: Sequence[Entry]) -> list[PairingFault]:
    """The pairing faults in the context replay builds at the end of ``path``
    (faults a later compaction cut away are not in it)."""
    _, faults, start = _walk_context(path)
    return faults[start:]


def unanswered_tool_calls(path: Sequence[Entry]) -> dict[str, Entry]:
    """Every ``toolCall`` in the replayed context of ``path`` that got no result
    in time: still answerable, or lapsed (other messages followed it)."""
    context = _walk_context(path)[0]
    return {**context.expired, **context.open}


def open_tool_calls(path: Sequence[Entry]) -> dict[str, Entry]:
    """The ``toolCall`` ids in the replayed context of ``path`` that can still be
    answered (no result yet, and no other message since their assistant
    message), each with the assistant entry holding it, in order."""
    return _walk_context(path)[0].open


def affects_pairing(entry: Entry) -> bool:
    """Whether appending ``entry`` can break the pairing: a ``toolResult`` or a
    compaction (every other entry leaves it as it was)."""
    return entry.kind == EntryKind.COMPACTION or tool_result_call_id(entry) is not None


def new_pairing_faults(path: Sequence[Entry], new: int = 1) -> list[PairingFault]:
    """The pairing faults the last ``new`` entries of ``path`` bring (the rest of
    the path was judged when it was written)."""
    if not path or new < 1:
        return []
    ids = {e.id for e in path[-new:]}
    return [f for f in pairing_faults(path) if f.entry_id in ids or f.result_id in ids]
