"""Low-level pieces of the pi JSONL reader: physical lines → JSON records, timestamps.

pi appends one ``JSON.stringify(entry) + "\\n"`` per entry and, on load,
skips every line ``JSON.parse`` refuses (``corpus/FORMATS.md`` §1.5). Real
files hold lines where a write lost its newline, so two records sit on one
line (``{...}{...}``), and lines cut off mid-record. This module splits such
lines back into their records instead of dropping them, and keeps what
cannot be parsed as text, so nothing is lost silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

_RECORD_STARTS = ('{"type"', '{"parentUuid"', '{"timestamp"')
"""How the records of the JSONL formats read here begin: every pi record and
Claude Code bookkeeping row with ``type``, a Claude Code conversation row with
``parentUuid``, a Codex rollout line with ``timestamp``."""

_WS = " \t\r\n"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _reject_constant(name: str) -> Any:
    # JSON.parse refuses NaN / Infinity; so do we (orjson would turn them into null).
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


@dataclass(frozen=True, slots=True)
class Piece:
    """One record of a physical line, or an unparseable run of text.

    ``line`` is the 1-based line number; ``text`` the piece's text exactly as
    in the file (whitespace between glued records excluded). ``value`` is the
    decoded JSON value when ``ok``; otherwise ``reason`` says why not.
    """

    line: int
    text: str
    ok: bool
    value: Any = None
    reason: str = ""


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def _find_start(text: str, start: int) -> int:
    """Offset of the first of :data:`_RECORD_STARTS` at or after ``start``, or -1."""
    found = [p for p in (text.find(s, start) for s in _RECORD_STARTS) if p != -1]
    return min(found, default=-1)


def _next_record_start(text: str, start: int) -> int | None:
    """Offset of the first record a writer could have written that starts at or
    after ``start``.

    A candidate starts as a record does (:data:`_RECORD_STARTS`), decodes as
    a JSON object and has a ``timestamp`` or a ``uuid`` (every pi header and
    entry, Claude Code conversation row and Codex line does; the content
    blocks nested inside messages, which also start with ``{"type"``, do not).
    """
    pos = _find_start(text, start)
    while pos != -1:
        try:
            value, _ = _DECODER.raw_decode(text, pos)
        except ValueError:
            pass
        else:
            if isinstance(value, dict) and ("timestamp" in value or "uuid" in value):
                return pos
        pos = _find_start(text, pos + 1)
    return None


def _reason(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON: {exc.msg} (column {exc.colno})"
    return f"invalid JSON: {exc}"


def split_line(text: str, line: int) -> list[Piece]:
    """Split one physical line into its records.

    Records are decoded one after another with ``JSONDecoder.raw_decode``,
    skipping whitespace between them. Where decoding fails (a cut-off record,
    stray text) the text up to the next plausible record start (see
    :func:`_next_record_start`) becomes one unparseable piece and decoding
    resumes there; with no later record start the rest of the line is one
    unparseable piece. A blank line gives ``[]``. Never raises.
    """
    pieces: list[Piece] = []
    pos = _skip_ws(text, 0)
    while pos < len(text):
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except ValueError as exc:
            nxt = _next_record_start(text, pos + 1)
            stop = len(text) if nxt is None else nxt
            pieces.append(Piece(line, text[pos:stop].rstrip(_WS), False, reason=_reason(exc)))
            pos = stop
            continue
        pieces.append(Piece(line, text[pos:end], True, value))
        pos = _skip_ws(text, end)
    return pieces


def split_lines(text: str) -> Iterator[tuple[int, str, list[Piece]]]:
    """``(line number, line text, pieces)`` for every non-blank line of ``text``.

    Lines end at ``"\\n"`` only (as pi splits them; JSON strings may hold a
    raw U+2028), a trailing ``"\\r"`` is dropped, a leading byte-order mark
    is ignored.
    """
    if text.startswith("\ufeff"):
        text = text[1:]
    for number, raw in enumerate(text.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        pieces = split_line(raw, number)
        if pieces:
            yield number, raw, pieces


def storable_text(text: str) -> str:
    """``text`` with every code point UTF-8 cannot hold replaced by U+FFFD.

    Those are surrogates: a lone ``\\udXXX`` escape, or a byte ``parse_file``
    could not decode (``surrogateescape``), one U+FFFD each. Returns ``text``
    itself when nothing needed replacing.
    """
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub("\ufffd", text)


def parse_timestamp(value: object) -> datetime | None:
    """An entry timestamp as an aware UTC ``datetime``, or ``None`` when unusable.

    Accepts ISO 8601 strings as JavaScript's ``toISOString`` writes them
    (``2025-12-17T19:39:21.535Z``; a string without an offset is taken as
    UTC) and epoch milliseconds (the numeric form pi uses inside messages).
    """
    try:
        if isinstance(value, str):
            parsed = datetime.fromisoformat(value)
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            return parsed.astimezone(UTC)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None


def format_timestamp(value: datetime) -> str:
    """``value`` in UTC as JavaScript's ``toISOString`` writes it.

    ``YYYY-MM-DDTHH:MM:SS.mmmZ`` when the microseconds are whole milliseconds,
    otherwise with all six digits (``.ffffffZ``) so no precision is lost.
    """
    v = value.astimezone(UTC)
    base = f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:{v.second:02d}"
    if v.microsecond % 1000 == 0:
        return f"{base}.{v.microsecond // 1000:03d}Z"
    return f"{base}.{v.microsecond:06d}Z"
