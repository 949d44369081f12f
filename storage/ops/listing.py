"""Session listings and search (session seed ListOption, WithSearch, CountWithMessages):
newest first by creation, keyset cursors stable under concurrent appends."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

import orjson

from turnkeeper.spec import errors
from turnkeeper.spec.records import (
    Session,
    SessionPage,
)

from ..backend import Tx, present
from ..codec import check_instant, check_text
from ..validate import (
    check_limit,
)
from .base import Area
from .session_rows import SESSION_COLS, session_row

_SEARCH = (
    "(s.id ILIKE ? ESCAPE '\\' OR s.cwd ILIKE ? ESCAPE '\\' "
    "OR coalesce(s.title, '') ILIKE ? ESCAPE '\\' OR EXISTS "
    "(SELECT 1 FROM entries e WHERE e.session_id = s.id "
    "AND e.kind IN ('message', 'session_info', 'custom_message') "
    "AND e.payload ILIKE ? ESCAPE '\\'))"
)


def _like(search: str) -> str:
    """``search`` as a literal ILIKE substring pattern (``%`` and ``_`` match themselves)."""
    escaped = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _json_like(search: str) -> str:
    """:func:`_like` of ``search`` as stored JSON text spells it inside a string
    (a quote as ``\\"``, a backslash as ``\\\\``, a newline as ``\\n``, NUL as
    ``\\u0000`` …): the pattern that finds it in a payload."""
    return _like(orjson.dumps(search).decode("utf-8")[1:-1])


def _params(search: str) -> list[str]:
    """The parameters of :data:`_SEARCH` for ``search``."""
    like = _like(search)
    return [like, like, like, _json_like(search)]


def _encode_cursor(session: Session) -> str:
    raw = f"{session.created_at.isoformat()}|{session.id}".encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, sep, sid = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        when = datetime.fromisoformat(created)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.InvalidInputError("cursor", "not a cursor this store issued") from exc
    if not sep or not sid or when.tzinfo is None:
        raise errors.InvalidInputError("cursor", "not a cursor this store issued")
    return check_instant(when, "cursor"), sid


def list_page(tx: Tx, limit: int, cursor: str | None, search: str | None) -> SessionPage:
    """Sessions newest first by (created_at, id), ``limit`` per page, keyset cursor."""
    where: list[str] = []
    params: list[Any] = []
    if search:
        where.append(_SEARCH)
        params += _params(search)
    if cursor is not None:
        created, sid = _decode_cursor(cursor)
        where.append("(s.created_at < ? OR (s.created_at = ? AND s.id < ?))")
        params += [created, created, sid]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    cols = ", ".join(f"s.{c.strip()}" for c in SESSION_COLS.split(","))
    rows = tx.rows(
        f"SELECT {cols} FROM sessions s {clause} ORDER BY s.created_at DESC, s.id DESC LIMIT ?",
        [*params, limit + 1],
    )
    found = [session_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    return SessionPage(tuple(found), _encode_cursor(found[-1]) if more and found else None)


def count(tx: Tx, search: str | None) -> int:
    """Number of sessions (matching ``search`` when given)."""
    if search:
        row = tx.one(f"SELECT count(*) FROM sessions s WHERE {_SEARCH}", _params(search))
    else:
        row = tx.one("SELECT count(*) FROM sessions")
    row = present(row, "count(*)'s one row")
    return int(row[0])


# -- the store's methods ------------------------------------------------------------


class ListingPart(Area):
    """List and count sessions."""

    def list(
        self, *, limit: int = 50, cursor: str | None = None, search: str | None = None
    ) -> SessionPage:
        """Sessions newest first; ``search`` matches id, cwd, title and message text.

        Pass the page's ``next_cursor`` to continue; pages are stable under
        concurrent appends (keyset on creation time and id).

        Raises:
            InvalidInputError: ``limit`` below 1 or a foreign cursor.
        """
        check_limit(limit)
        if search is not None:
            check_text(search, "search")
        if cursor is not None:
            check_text(cursor, "cursor", allow_empty=False)
        return self.db.read("list_sessions", lambda tx: list_page(tx, limit, cursor, search))

    def count(self, *, search: str | None = None) -> int:
        """Number of sessions (matching ``search`` when given)."""
        if search is not None:
            check_text(search, "search")
        return self.db.read("count_sessions", lambda tx: count(tx, search))
