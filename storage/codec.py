"""Values in and out of storage: JSON text (orjson) and text checks.

Shared by every backend. Text that cannot be stored intact (a lone
surrogate has no UTF-8 form) is refused with ``InvalidInputError`` before
anything is written; NUL characters are stored and returned intact in
payloads and free text, and refused in identifiers (:func:`check_id`).
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from datetime import UTC, datetime
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


_INVISIBLE = {"Cc", "Cf", "Zl", "Zp"}
"""Unicode categories no id holds: control, format (zero-width, BOM, bidi marks)
and line/paragraph separators."""

_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _invisible(text: str) -> str | None:
    """The first character of ``text`` in :data:`_INVISIBLE`, or ``None``."""
    if text.isascii():
        found = _ASCII_CONTROL.search(text)
        return None if found is None else found.group()
    return next((c for c in text if unicodedata.category(c) in _INVISIBLE), None)


MAX_ID_BYTES = 512
"""The longest id, in UTF-8 bytes. Keys hold up to two ids (a session's and
its entry's), and PostgreSQL refuses a key above 2704 bytes (after its text
code, which may double an id's size): every id fits both backends alike."""

MAX_TARGET_BYTES = MAX_ID_BYTES + 64
"""The longest lease target, in UTF-8 bytes: a kind prefix (``session:``,
``thread-key:`` …) of up to 64 bytes and an id."""


def check_instant(value: object, field: str) -> datetime:
    """``value`` as an aware datetime in UTC, if it is one that both backends
    store and give back: aware, and within the years 1 to 9999 once in UTC
    (Python's range: PostgreSQL stores year 0 and earlier, which no Python
    datetime can hold, so every later read of the row would fail).

    Raises:
        InvalidInputError: not a datetime, naive, or outside that range.
    """
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidInputError(field, "must be an aware datetime (with a time zone)")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInputError(field, "must lie within the years 1 to 9999 in UTC") from None


LAST_CLOCK = datetime(9989, 1, 1, tzinfo=UTC)
"""The latest time an injected clock may return: ten years (the longest lease,
``validate.MAX_TTL_S``) before the end of the year 9999, so that every expiry
and retry time it derives is one too."""


def check_clock(value: object) -> datetime:
    """An injected clock's value: :func:`check_instant`, and no later than
    :data:`LAST_CLOCK`.

    Raises:
        InvalidInputError: (field ``clock``) not such a datetime.
    """
    now = check_instant(value, "clock")
    if now > LAST_CLOCK:
        raise InvalidInputError("clock", f"must not be later than {LAST_CLOCK.isoformat()}")
    return now


def check_tenant(value: object) -> str:
    """Return ``value`` if it is a tenant: ``""`` (the default tenant) or an
    identifier as :func:`check_id` judges one (a tenant names where records
    and blobs are filed: NUL, 100k characters or a bidi override were taken).

    Raises:
        InvalidInputError: otherwise (field ``tenant``).
    """
    if value == "":
        return ""
    return check_id(value, "tenant")


def check_id(value: object, field: str, *, max_bytes: int = MAX_ID_BYTES) -> str:
    """Return ``value`` if it is an identifier: a string that UTF-8 can hold, not
    blank, at most ``max_bytes`` UTF-8 bytes (:data:`MAX_ID_BYTES`), without
    control characters (NUL, newlines, escapes …), invisible format
    characters (zero-width space, BOM, bidi marks) or line separators, which
    no id needs and which would make two ids look alike, or one ambiguous in
    a lease target, a log line or a backend that cannot store NUL. Payload
    text keeps every character.

    Raises:
        InvalidInputError: not a string, empty or blank, a lone surrogate, too
            long, or one of those characters.
    """
    text = check_text(value, field, allow_empty=False)
    if not text.strip():
        raise InvalidInputError(field, "an id is not blank")
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > max_bytes:
        raise InvalidInputError(
            field, f"an id is at most {max_bytes} bytes of UTF-8 (this one is {size})"
        )
    found = _invisible(text)
    if found is not None:
        raise InvalidInputError(
            field, f"an id holds no control or invisible characters (found {found!r})"
        )
    return text


def derived_id(prefix: str, part: str, suffix: str = "") -> str:
    """An id the store derives from ``part`` (a caller's id, key or a provider's
    call id) between a ``prefix`` and a ``suffix`` of its own:
    ``prefix + part + suffix`` when that is a valid id (:func:`check_id`),
    else with ``part`` spelled as ``sha256-`` and 16 hex digits of its
    digest. So a derived id is always one a caller can pass back, however
    long the part it was derived from."""
    whole = f"{prefix}{part}{suffix}"
    try:
        return check_id(whole, "id")
    except InvalidInputError:
        return f"{prefix}{_digest(part)}{suffix}"


def _digest(value: str) -> str:
    return "sha256-" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite(v) for v in value)
    return False


_JSON_SCALARS = (str, int, float, bool, type(None))


def _inexact(value: Any, where: str) -> str | None:
    """Where in ``value`` something JSON cannot hold exactly sits (a path and a
    type), or ``None``; walked only once a round trip came back different."""
    if isinstance(value, dict):
        for k, v in value.items():
            found = _inexact(v, f"{where}.{k}")
            if found:
                return found
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _inexact(v, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(value, tuple):
        return f"{where} is a tuple (it would come back as a list: pass a list)"
    if not isinstance(value, _JSON_SCALARS):
        return f"{where} is a {type(value).__name__}, which JSON has no exact form for"
    return None


def to_json_exact(value: Any, field: str) -> tuple[str, Any]:
    """Encode ``value`` as JSON text, keeping key order; returns the text and the
    value decoded from it, which equals ``value``.

    Only what JSON holds exactly is accepted: dicts with string keys, lists,
    strings, integers within 64 bits, finite floats, booleans and ``None``.
    A ``datetime``, ``UUID``, ``Enum``, dataclass, tuple or other value that
    would come back as something else is refused, never converted silently;
    ``str`` and ``int`` subclasses (``StrEnum``, ``IntEnum``) equal their
    plain value and are stored as it.

    Raises:
        InvalidInputError: the value is not JSON-serialisable, holds text that
            UTF-8 cannot hold (a lone surrogate), a NaN or infinite float
            (JSON has none; it would come back as ``null``), or a value that
            would not come back equal (named with its path in the message).
    """
    try:
        text = orjson.dumps(value).decode("utf-8")
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise InvalidInputError(field, f"not storable as JSON: {exc}") from None
    if "null" in text and _non_finite(value):
        raise InvalidInputError(field, "NaN and infinite numbers have no JSON form")
    decoded = orjson.loads(text)
    if decoded != value:
        where = _inexact(value, field) or f"{field} would not come back equal"
        raise InvalidInputError(field, f"not storable as JSON exactly: {where}")
    return text, decoded


def to_json(value: Any, field: str) -> str:
    """Encode ``value`` as JSON text (see :func:`to_json_exact`).

    Raises:
        InvalidInputError: as :func:`to_json_exact`.
    """
    return to_json_exact(value, field)[0]


def from_json(text: str) -> Any:
    """Decode JSON text written by :func:`to_json`."""
    return orjson.loads(text)


def stored_json(value: Any) -> str:
    """JSON text of a value decoded from stored JSON (it round-trips: no check)."""
    return orjson.dumps(value).decode("utf-8")
