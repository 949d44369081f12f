"""The exact text code of the PostgreSQL backend: U+0000 survives ``text``.

PostgreSQL's ``text`` cannot hold U+0000; turnkeeper text (a title, a reason,
an imported raw line) may. Every string this backend sends is encoded and
every text it reads back is decoded with a reversible per-character code:

- U+0000 → U+E000 U+E001, and U+E000 (the escape) → U+E000 U+E000;
- every other character is itself.

Strings without U+0000 or U+E000 (almost all) are sent unchanged. The code
maps equal strings to equal strings and is a homomorphism on concatenation,
so equality, ordering of ids, ``LIKE`` substring search (a pattern of plain
characters) and primary keys behave as they would on the strings
themselves. JSON text never holds a raw U+0000 (it is written ``\\u0000``).

Analytics queries (``store.query``) read their results through
:func:`register_query`: text is decoded leniently (text a query computed,
such as a substring that cut a code in two, keeps a lone escape as itself),
and ``json``/``jsonb`` results come back as JSON text, never as Python
objects, with the code of U+0000 that ``Dialect.json`` put into strings
written back as ``\\u0000``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.string import StrDumperUnknown, TextLoader

ESCAPE = "\ue000"
_NUL_CODE = "\ue000\ue001"
_ESCAPE_CODE = "\ue000\ue000"


def encode(value: str) -> str:
    """``value`` as stored (see the module docstring)."""
    if "\x00" not in value and ESCAPE not in value:
        return value
    return value.replace(ESCAPE, _ESCAPE_CODE).replace("\x00", _NUL_CODE)


def decode(stored: str) -> str:
    """The string ``stored`` encodes.

    Raises:
        ValueError: ``stored`` is not an encoding (a lone escape at its end, or
            an escape followed by neither code character).
    """
    if ESCAPE not in stored:
        return stored
    out: list[str] = []
    i = 0
    while i < len(stored):
        c = stored[i]
        if c != ESCAPE:
            out.append(c)
            i += 1
            continue
        nxt = stored[i + 1 : i + 2]
        if nxt == ESCAPE:
            out.append(ESCAPE)
        elif nxt == "\ue001":
            out.append("\x00")
        else:
            raise ValueError(f"not an encoded string (escape at {i})")
        i += 2
    return "".join(out)


def decode_lenient(stored: str) -> str:
    """:func:`decode` for text a query computed: an escape followed by neither
    code character (a lone one at the end, or one before another character)
    is kept as itself. Never raises."""
    if ESCAPE not in stored:
        return stored
    out: list[str] = []
    i = 0
    while i < len(stored):
        c = stored[i]
        nxt = stored[i + 1 : i + 2]
        if c == ESCAPE and nxt in (ESCAPE, "\ue001"):
            out.append(ESCAPE if nxt == ESCAPE else "\x00")
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def json_text(stored: str) -> str:
    """The JSON text a query's ``json``/``jsonb`` value spells: decoded
    leniently (:func:`decode_lenient`), each U+0000 then written as the JSON
    escape ``\\u0000`` (a U+0000 can only sit inside a JSON string, where
    ``Dialect.json`` put its code). Never raises."""
    value = decode_lenient(stored)
    return value.replace("\x00", "\\u0000") if "\x00" in value else value


class _Dumper(StrDumperUnknown):
    def dump(self, obj: str) -> Any:
        if "\x00" in obj or ESCAPE in obj:
            obj = encode(obj)
        return obj.encode(self._encoding)


class _Loader(TextLoader):
    """psycopg's text loader with :func:`decode` folded in: one Python call per
    value (it runs for every text value read: three calls per value made a
    cold replay's reading twice as slow)."""

    def load(self, data: Any) -> Any:
        if not self._encoding:  # an SQL_ASCII database: bytes, as psycopg gives them
            return super().load(data)
        value = str(data, self._encoding)
        return value if ESCAPE not in value else decode(value)


class _QueryLoader(TextLoader):
    """A query's text result: :func:`decode_lenient`."""

    def load(self, data: Any) -> Any:
        if not self._encoding:
            return super().load(data)
        return decode_lenient(str(data, self._encoding))


class _QueryJsonLoader(TextLoader):
    """A query's ``json``/``jsonb`` result: its JSON text (:func:`json_text`)."""

    def load(self, data: Any) -> Any:
        if not self._encoding:
            return super().load(data)
        return json_text(str(data, self._encoding))


TEXT_TYPES = ("text", "varchar", "bpchar", "name")
"""The text types whose values the code applies to."""


def register_query(cur: psycopg.Cursor[Any]) -> None:
    """Read ``cur``'s results as an analytics query's (see the module docstring)."""
    for name in TEXT_TYPES:
        cur.adapters.register_loader(name, _QueryLoader)
    for name in ("json", "jsonb"):
        cur.adapters.register_loader(name, _QueryJsonLoader)


def register(conn: psycopg.Connection[Any]) -> None:
    """Use the code for every string parameter and text result on ``conn``."""
    conn.adapters.register_dumper(str, _Dumper)
    for name in TEXT_TYPES:
        conn.adapters.register_loader(name, _Loader)
