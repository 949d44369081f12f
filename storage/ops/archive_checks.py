"""Input checks of ``store.archives`` (storage/ops/archives.py): each record
checked whole before anything is written, its JSON values encoded once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.records import ResponseItem, ResponseRun, ResponseTurn

from ..codec import check_id, check_instant, check_text, to_json
from ..validate import check_bool, check_int

MAX_ARCHIVE_JSON_BYTES = 128 * 1024
"""The largest JSON value (as UTF-8 JSON text) a summary or an item may be
(the seed's maxResponseArchiveJSONBytes)."""


def archive_json(value: Any, field: str) -> str:
    """``value`` as JSON text of at most :data:`MAX_ARCHIVE_JSON_BYTES` bytes.

    Raises:
        InvalidInputError: not storable as JSON exactly, or too large.
    """
    text = to_json(value, field)
    size = len(text.encode("utf-8"))
    if size > MAX_ARCHIVE_JSON_BYTES:
        raise errors.InvalidInputError(
            field, f"is {size:,} bytes as JSON; at most {MAX_ARCHIVE_JSON_BYTES:,} are archived"
        )
    return text


def _texts(record: object, names: Sequence[str], required: Sequence[str]) -> None:
    for name in names:
        check_text(getattr(record, name), name, allow_empty=name not in required)


def _optional_int(value: object, field: str) -> None:
    if value is not None:
        check_int(value, field, 0)


def _optional_instant(value: object, field: str) -> None:
    if value is not None:
        check_instant(value, field)


def check_run(run: object) -> ResponseRun:
    if not isinstance(run, ResponseRun):
        raise errors.InvalidInputError("run", "expected a ResponseRun")
    check_id(run.session_id, "session_id")
    check_id(run.local_run_id, "local_run_id")
    if run.local_turn_id:
        check_id(run.local_turn_id, "local_turn_id")
    _texts(
        run,
        ("response_id", "provider", "api", "state", "polling_url"),
        ("provider", "api", "state"),
    )
    _optional_int(run.message_id, "message_id")
    _optional_int(run.last_event_sequence, "last_event_sequence")
    check_bool(run.cancel_requested, "cancel_requested")
    _optional_instant(run.created_at, "created_at")
    _optional_instant(run.updated_at, "updated_at")
    return run


def check_turn(turn: object) -> tuple[ResponseTurn, tuple[str | None, str | None]]:
    if not isinstance(turn, ResponseTurn):
        raise errors.InvalidInputError("turn", "expected a ResponseTurn")
    check_id(turn.session_id, "session_id")
    check_id(turn.local_turn_id, "local_turn_id")
    required = ("provider", "api", "model", "state_mode", "status")
    optional = (
        "request_id",
        "response_id",
        "previous_response_id",
        "conversation_id",
        "incomplete_reason",
    )
    _texts(turn, (*required, *optional), required)
    _optional_int(turn.message_id, "message_id")
    _optional_instant(turn.created_at, "created_at")
    _optional_instant(turn.completed_at, "completed_at")
    summaries = tuple(
        None if getattr(turn, n) is None else archive_json(getattr(turn, n), n)
        for n in ("request_summary", "response_summary")
    )
    return turn, (summaries[0], summaries[1])


def check_item(item: object) -> tuple[ResponseItem, str]:
    """The item with its key filled in, and its sanitized JSON text."""
    if not isinstance(item, ResponseItem):
        raise errors.InvalidInputError("item", "expected a ResponseItem")
    check_id(item.session_id, "session_id")
    check_id(item.local_turn_id, "local_turn_id")
    _texts(item, ("item_type", "response_id", "item_id", "item_status"), ("item_type",))
    check_int(item.output_index, "output_index", 0)
    _optional_instant(item.created_at, "created_at")
    if item.sanitized is None:
        raise errors.InvalidInputError("sanitized", "the sanitized item is required")
    sanitized = archive_json(item.sanitized, "sanitized")
    key = item.item_key
    if key == "":
        key = (
            f"{item.item_id}:{item.output_index}" if item.item_id else f"output:{item.output_index}"
        )
    check_id(key, "item_key")
    return ResponseItem(
        session_id=item.session_id,
        local_turn_id=item.local_turn_id,
        item_type=item.item_type,
        sanitized=item.sanitized,
        response_id=item.response_id,
        item_id=item.item_id,
        output_index=item.output_index,
        item_status=item.item_status,
        item_key=key,
        created_at=item.created_at,
    ), sanitized
