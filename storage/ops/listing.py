"""Session listings, counts and resume (session seed ListAll(Detailed), ListForDir(Detailed),
CountAll, CountWithMessages, ContinueRecent and the ListOptions): newest first by
creation, keyset cursors stable under concurrent appends; sub-agent sessions left out
unless asked for."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import uuid6

from turnkeeper.spec import errors
from turnkeeper.spec.records import DetailPage, Session, SessionDetail, SessionPage

from ..backend import Tx, keyed, present
from ..codec import check_id, check_instant, check_text, to_json
from ..pairing import Opening
from ..validate import check_bool, check_header, check_int, check_limit
from . import entry_rows, session_rows
from .base import Area
from .session_rows import SESSION_COLS, session_row

_SEARCH = (
    "(s.id ILIKE ? ESCAPE '\\' OR s.cwd ILIKE ? ESCAPE '\\' "
    "OR coalesce(s.title, '') ILIKE ? ESCAPE '\\' "
    "OR coalesce(s.channel_type, '') ILIKE ? ESCAPE '\\' "
    "OR coalesce(s.channel_id, '') ILIKE ? ESCAPE '\\' "
    "OR (s.key_version IS NULL AND EXISTS "
    "(SELECT 1 FROM entries e WHERE e.session_id = s.id "
    "AND e.kind IN ('message', 'session_info', 'custom_message') "
    "AND e.payload ILIKE ? ESCAPE '\\')))"
)
"""What ``search`` matches: ids, directories, titles, channels, and the message
text of a clear session (``key_version`` NULL); a sealed session's payloads are
ciphertext, never searched (their ``enc1:`` base64 would match arbitrary
text: attack finding on issue 23, part 2)."""


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
    return [like, like, like, like, like, _json_like(search)]


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


STATUSES = ("active", "idle")
"""``status=`` of a listing: ``active``, a session with a non-terminal run;
``idle``, one without."""

PREVIEW_CHARS = 100
"""Longest preview of a :class:`SessionDetail` (its first user message's text)."""

_HAS_MESSAGE = "EXISTS (SELECT 1 FROM entries e WHERE e.session_id = s.id AND e.kind = 'message')"
_ACTIVE = "EXISTS (SELECT 1 FROM active_runs a WHERE a.session_id = s.id)"
_IN_PROJECT = (
    "EXISTS (SELECT 1 FROM session_metadata m WHERE m.session_id = s.id AND m.project_id = ?)"
)


@dataclass(frozen=True, slots=True)
class Filter:
    """What a listing or count selects (see ``ListingPart.list``)."""

    search: str | None = None
    messages_only: bool = False
    cwd: str | None = None
    include_sub_agents: bool = False
    status: str | None = None
    project_id: str | None = None
    channel_type: str | None = None
    channel_id: str | None = None


def _source(f: Filter) -> tuple[str, list[Any]]:
    """The ``FROM`` of a listing (alias ``s``) and its parameters: with ``cwd``, the
    directory's sessions read through ``sessions_by_cwd`` first (materialized, so
    that DuckDB keeps the scan's one filter: a top-N pushes its own into the scan),
    with the columns the filters read (``key_version``: :data:`_SEARCH`)."""
    cols = ", ".join(c.strip() for c in SESSION_COLS.split(","))
    if f.cwd is None:
        return "sessions s", []
    only = "TRUE" if f.include_sub_agents else "sub_agent_of IS NULL"
    return (
        f"(WITH d AS MATERIALIZED (SELECT {cols}, key_version FROM sessions "
        f"WHERE {keyed('cwd', only)}) "
        "SELECT * FROM d) s",
        [f.cwd],
    )


def _where(f: Filter) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if not f.include_sub_agents and f.cwd is None:
        where.append("s.sub_agent_of IS NULL")
    if f.search:
        where.append(_SEARCH)
        params += _params(f.search)
    if f.messages_only:
        where.append(_HAS_MESSAGE)
    if f.status == "active":
        where.append(_ACTIVE)
    elif f.status == "idle":
        where.append(f"NOT {_ACTIVE}")
    if f.project_id is not None:
        where.append(_IN_PROJECT)
        params.append(f.project_id)
    if f.channel_type is not None:
        where.append("s.channel_type = ?")
        params.append(f.channel_type)
    if f.channel_id is not None:
        where.append("s.channel_id = ?")
        params.append(f.channel_id)
    return where, params


def list_page(tx: Tx, limit: int, cursor: str | None, f: Filter, offset: int = 0) -> SessionPage:
    """Sessions newest first by (created_at, id), ``limit`` per page after skipping
    ``offset`` (after the cursor's position when given), keyset cursor."""
    source, params = _source(f)
    where, more_params = _where(f)
    params += more_params
    if cursor is not None:
        created, sid = _decode_cursor(cursor)
        where.append("(s.created_at < ? OR (s.created_at = ? AND s.id < ?))")
        params += [created, created, sid]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    cols = ", ".join(f"s.{c.strip()}" for c in SESSION_COLS.split(","))
    rows = tx.rows(
        f"SELECT {cols} FROM {source} {clause} "
        "ORDER BY s.created_at DESC, s.id DESC LIMIT ? OFFSET ?",
        [*params, limit + 1, offset],
    )
    found = [session_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    return SessionPage(tuple(found), _encode_cursor(found[-1]) if more and found else None)


def count(tx: Tx, f: Filter) -> int:
    """Number of sessions ``f`` selects."""
    source, params = _source(f)
    where, more_params = _where(f)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    row = present(
        tx.one(f"SELECT count(*) FROM {source} {clause}", params + more_params),
        "count(*)'s one row",
    )
    return int(row[0])


def most_recent(tx: Tx, cwd: str) -> Session | None:
    """The directory's most recently updated session that is no sub-agent."""
    cols = ", ".join(c.strip() for c in SESSION_COLS.split(","))
    row = tx.one(
        f"WITH d AS MATERIALIZED (SELECT {cols} FROM sessions "
        f"WHERE {keyed('cwd', 'sub_agent_of IS NULL')}) "
        f"SELECT {cols} FROM d ORDER BY updated_at DESC, id DESC LIMIT 1",
        [cwd],
    )
    return None if row is None else session_row(row)


def _text(message: Any) -> str:
    """A message's text: its string content, or its text blocks joined by spaces."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            b["text"]
            for b in content
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    return ""


def _preview(tx: Tx, session_id: str) -> str:
    """The text of the session's first user message (by its clear ``role``,
    ``spec/clear_facts.py``: a sealed payload is opened only for the one
    row), cut to :data:`PREVIEW_CHARS`; ``""`` when it has none."""
    first_user = keyed("session_id", "kind = 'message' AND role = 'user'")
    row = tx.one(
        f"SELECT id, payload FROM entries WHERE {first_user} ORDER BY seq LIMIT 1", [session_id]
    )
    if row is None:
        return ""
    message = entry_rows.payload_of(tx, session_id, row[0], row[1]).get("message")
    text = " ".join(_text(message).split())
    if len(text) > PREVIEW_CHARS:
        text = text[: PREVIEW_CHARS - 1] + "\u2026"
    return text


def details(tx: Tx, sessions: Sequence[Session]) -> list[SessionDetail]:
    """Each session with its message count and preview (two statements per session,
    each a read of the session's entries: its (session_id, seq) key on PostgreSQL)."""
    out = []
    for s in sessions:
        n = present(
            tx.one(
                "SELECT count(*) FROM entries WHERE session_id = ? AND kind = 'message'", [s.id]
            ),
            "count",
        )[0]
        out.append(SessionDetail(s, int(n), _preview(tx, s.id)))
    return out


# -- the store's methods ------------------------------------------------------------


def _filter(
    search: str | None,
    messages_only: bool,
    cwd: str | None,
    include_sub_agents: bool,
    status: str | None,
    project_id: str | None = None,
    channel_type: str | None = None,
    channel_id: str | None = None,
) -> Filter:
    if search is not None:
        check_text(search, "search")
    check_bool(messages_only, "messages_only")
    if cwd is not None:
        check_text(cwd, "cwd")
    check_bool(include_sub_agents, "include_sub_agents")
    if status is not None and status not in STATUSES:
        raise errors.InvalidInputError("status", f"must be one of {STATUSES}, got {status!r}")
    for value, field in (
        (project_id, "project_id"),
        (channel_type, "channel_type"),
        (channel_id, "channel_id"),
    ):
        if value is not None:
            check_id(value, field)
    return Filter(
        search, messages_only, cwd, include_sub_agents, status, project_id, channel_type, channel_id
    )


class ListingPart(Area):
    """List, count and resume sessions (session seed ListAll, ListForDir, CountAll,
    CountWithMessages, ContinueRecent and the ListOptions)."""

    def list(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        search: str | None = None,
        offset: int = 0,
        messages_only: bool = False,
        cwd: str | None = None,
        include_sub_agents: bool = False,
        status: str | None = None,
        project_id: str | None = None,
        channel_type: str | None = None,
        channel_id: str | None = None,
    ) -> SessionPage:
        """Sessions newest first (session seed ListAll, and ListForDir with ``cwd``).

        ``search`` matches id, cwd, title, the bound channel's type and id, and
        message text (WithSearch);
        ``messages_only`` keeps sessions with at least one ``message`` entry
        (WithMessagesOnly); ``cwd`` keeps one working directory's; ``status``
        keeps ``"active"`` sessions (a non-terminal run) or ``"idle"`` ones;
        ``project_id`` keeps a project's sessions (``store.projects``);
        ``channel_type`` and ``channel_id`` keep the sessions bound to channels of
        that type, or that id (``store.bindings``).
        Sub-agent sessions (``new_sub_agent``) are left out unless
        ``include_sub_agents`` (see ``sub_agents``). ``offset`` skips that many
        sessions first (WithOffset; after the cursor's position when both are
        given), ``limit`` (WithLimit) caps the page. Pass the page's
        ``next_cursor`` to continue: keyset pages on creation time and id are
        stable under concurrent writes, offsets are not.

        Raises:
            InvalidInputError: ``limit`` below 1, a negative ``offset``, an
                unknown ``status`` or a foreign cursor.
        """
        check_limit(limit)
        check_int(offset, "offset", 0)
        f = _filter(
            search,
            messages_only,
            cwd,
            include_sub_agents,
            status,
            project_id,
            channel_type,
            channel_id,
        )
        if cursor is not None:
            check_text(cursor, "cursor", allow_empty=False)
        return self.db.read(
            "list_sessions", lambda tx: list_page(tx, limit, cursor, f, offset), snapshot=True
        )

    def list_detailed(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        search: str | None = None,
        offset: int = 0,
        messages_only: bool = False,
        cwd: str | None = None,
        include_sub_agents: bool = False,
        status: str | None = None,
        project_id: str | None = None,
        channel_type: str | None = None,
        channel_id: str | None = None,
    ) -> DetailPage:
        """``list``'s page, each session with its message count and the preview of
        its first user message (session seed ListAllDetailed, ListForDirDetailed
        with ``cwd``), read in one snapshot. Arguments and errors as ``list``."""
        check_limit(limit)
        check_int(offset, "offset", 0)
        f = _filter(
            search,
            messages_only,
            cwd,
            include_sub_agents,
            status,
            project_id,
            channel_type,
            channel_id,
        )
        if cursor is not None:
            check_text(cursor, "cursor", allow_empty=False)

        def body(tx: Tx) -> DetailPage:
            page = list_page(tx, limit, cursor, f, offset)
            return DetailPage(tuple(details(tx, page.sessions)), page.next_cursor)

        return self.db.read("list_sessions_detailed", body, snapshot=True)

    def count(
        self,
        *,
        search: str | None = None,
        messages_only: bool = False,
        cwd: str | None = None,
        include_sub_agents: bool = False,
        status: str | None = None,
        project_id: str | None = None,
        channel_type: str | None = None,
        channel_id: str | None = None,
    ) -> int:
        """Number of sessions ``list`` selects with these arguments (session seed
        CountAll without any; CountWithMessages with ``messages_only``).

        Raises:
            InvalidInputError: an unknown ``status`` or a bad text.
        """
        f = _filter(
            search,
            messages_only,
            cwd,
            include_sub_agents,
            status,
            project_id,
            channel_type,
            channel_id,
        )
        return self.db.read("count_sessions", lambda tx: count(tx, f))

    def continue_recent(self, cwd: str, *, header: Mapping[str, Any] | None = None) -> Session:
        """The working directory's most recently updated session, or a new empty one
        there when it has none (session seed ContinueRecent). Sub-agent sessions
        are never continued. The read and the create are one serializable
        transaction: two callers resuming an empty directory at once get the
        same new session.

        Raises:
            InvalidInputError: a bad ``cwd`` or ``header`` (the header of a new session).
        """
        check_text(cwd, "cwd")
        header_json = to_json(check_header(header), "header")
        new_id = str(uuid6.uuid7())

        def body(tx: Tx) -> Session:
            found = most_recent(tx, cwd)
            return found or session_rows.create(tx, new_id, cwd, header_json, None)

        # Serializable: two resuming the same empty directory at once each
        # find no session there; one of them is retried and finds the other's.
        session = self.db.write("continue_recent", body, serializable=True)
        if session.id == new_id:
            self._openings.put(new_id, Opening(None, session.next_seq))  # empty: none open
        return session
