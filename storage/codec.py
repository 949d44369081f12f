"""Values in and out of storage: JSON text (orjson) and text checks.

Shared by every backend. Text that cannot be stored intact (a lone
surrogate has no UTF-8 form) is refused with ``InvalidInputError`` before
anything is written; NUL characters are stored and returned intact.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from turnkeeper.spec.errors import InvalidInputError


def check_text(value: object, field: str, *, allow_empty: bool = True) -> str:
    """Return ``value`` if it is a string that UTF-8 can hold.

    Raises:
        InvalidInputError: not a string, empty when not allowed, or holds a
            lone surrogate.
    """
    if not isinstance(value, str):
        raise InvalidInputError(field, f"expected a string, got {type(value).__name__}")
    if not allow_empty and not value:
        raise InvalidInputError(field, "must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(field, f"not storable as UTF-8: {exc.reason}") from None
    return value


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite(v) for v in value)
    return False


def to_json(value: Any, field: str) -> str:
    """Encode ``value`` as JSON text, keeping key order.

    Raises:
        InvalidInputError: the value is not JSON-serialisable, holds text that
            UTF-8 cannot hold (a lone surrogate), or a NaN or infinite float
            (JSON has none; it would come back as ``null``).
    """
    try:
        text = orjson.dumps(value).decode("utf-8")
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise InvalidInputError(field, f"not storable as JSON: {exc}") from None
    if "null" in text and _non_finite(value):
        raise InvalidInputError(field, "NaN and infinite numbers have no JSON form")
    return text


def from_json(text: str) -> Any:
    """Decode JSON text written by :func:`to_json`."""
    return orjson.loads(text)
