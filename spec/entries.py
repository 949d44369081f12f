"""Session entry kinds (session seed EntryType) and their required fields.

The seed's kinds are validated on append; unknown kinds (from imports) are
stored verbatim. Validation is pure and raises ``InvalidInputError`` naming
the offending field; nothing is written when it fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from .errors import InvalidInputError


class EntryKind(StrEnum):
    """The seed's entry types (``session`` is the header, never an entry)."""

    MESSAGE = "message"
    MODEL_CHANGE = "model_change"
    MODE_CHANGE = "mode_change"
    THINKING_LEVEL_CHANGE = "thinking_level_change"
    ADDITIONAL_DIRECTORIES = "additional_directories"
    COMPACTION = "compaction"
    BRANCH_SUMMARY = "branch_summary"
    CUSTOM = "custom"
    CUSTOM_MESSAGE = "custom_message"
    LABEL = "label"
    SESSION_INFO = "session_info"
    TURN_START = "turn_start"
    TURN_END = "turn_end"


BASE_FIELDS = ("type", "id", "parentId", "timestamp")
"""Fields of every entry line that the store keeps as columns, not payload."""

_REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    EntryKind.MESSAGE: {"message": dict},
    EntryKind.MODEL_CHANGE: {"provider": str, "modelId": str},
    EntryKind.MODE_CHANGE: {"mode": str},
    EntryKind.THINKING_LEVEL_CHANGE: {"thinkingLevel": str},
    EntryKind.ADDITIONAL_DIRECTORIES: {"directories": list},
    EntryKind.COMPACTION: {"summary": str, "firstKeptEntryId": (str, type(None))},
    EntryKind.BRANCH_SUMMARY: {"summary": str, "fromId": str},
    EntryKind.CUSTOM: {"customType": str},
    EntryKind.CUSTOM_MESSAGE: {"customType": str, "content": (str, list)},
    EntryKind.LABEL: {"targetId": str},
    EntryKind.SESSION_INFO: {"name": str},
    EntryKind.TURN_START: {"turnId": str},
    EntryKind.TURN_END: {"turnId": str, "status": str},
}

CONTEXT_KINDS = frozenset(
    {EntryKind.MESSAGE, EntryKind.CUSTOM_MESSAGE, EntryKind.BRANCH_SUMMARY, EntryKind.COMPACTION}
)
"""Kinds that contribute to replayed model context."""


def is_known_kind(kind: str) -> bool:
    """Whether ``kind`` is one of the seed's entry types."""
    return kind in _REQUIRED


def validate_payload(kind: str, payload: Mapping[str, Any], *, strict: bool = True) -> None:
    """Check ``payload`` carries the fields ``kind`` requires, with the right JSON types.

    With ``strict`` an unknown kind is refused (API appends); imports pass
    ``strict=False`` and keep unknown kinds verbatim.

    Raises:
        InvalidInputError: a kind, field or type is wrong; ``field`` names it.

    raises: InvalidInputError
    post: kind != "session" and (kind in _REQUIRED or not strict)
    post: not any(base in payload for base in BASE_FIELDS)
    post: all(isinstance(payload[n], t) for n, t in _REQUIRED.get(kind, {}).items())
    post: kind != EntryKind.MESSAGE or isinstance(payload["message"]["role"], str)
    """
    if not isinstance(kind, str) or not kind or kind == "session":
        raise InvalidInputError("kind", f"not an entry kind: {kind!r}")
    for base in BASE_FIELDS:
        if base in payload:
            raise InvalidInputError(base, "base fields are arguments, not payload")
    required = _REQUIRED.get(kind)
    if required is None:
        if strict:
            raise InvalidInputError("kind", f"unknown entry kind {kind!r}")
        return
    for name, types in required.items():
        if name not in payload:
            raise InvalidInputError(name, f"{kind} entries need {name!r}")
        if not isinstance(payload[name], types):
            raise InvalidInputError(name, f"{kind}.{name} has the wrong type")
    if kind == EntryKind.MESSAGE and not isinstance(payload["message"].get("role"), str):
        raise InvalidInputError("message.role", "a message needs a string role")
    if kind == EntryKind.LABEL and not isinstance(payload.get("label", ""), str):
        raise InvalidInputError("label", "a label is a string, or absent to clear it")


RESERVED_ENTRY_SUFFIXES = (":turn-start", ":user", ":assistant", ":turn-end", ":interrupted")
"""Endings of the entry ids the store derives itself (from a run id or an
execution key) so that a repeated termination finds its own entries; a
caller may not choose such an id."""
