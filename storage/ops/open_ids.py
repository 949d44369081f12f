"""Open a session by id prefix, and sub-agent sessions (session seed OpenByID,
OpenByPathOrID, NewSubAgent).

A prefix is looked up through the index of the ids' first :data:`HEAD`
characters (``sessions.id_head`` on DuckDB, ``substr(id, 1, 8)`` on
PostgreSQL: schema version 14), so a value shorter than :data:`HEAD` opens
only the session with exactly that id; the seed sets no minimum, and a
UUIDv7 id's first 8 characters already name one minute's sessions. A
sub-agent session (``new_sub_agent``) is a session whose row names its
parent (``sub_agent_of``) and whose header says ``parentSession`` and
``subAgent: true``; listings leave it out unless asked
(``store.sessions.list(include_sub_agents=True)``), ``sub_agents`` reads a
parent's, and a prefix never opens one (it is no user-continuable session;
``get`` opens it by its whole id).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson
import uuid6

from turnkeeper.spec import errors
from turnkeeper.spec.records import Session

from ..backend import Tx, keyed
from ..codec import check_id, check_instant, check_text, to_json
from ..pairing import Opening
from ..validate import check_header
from . import session_rows
from .base import Area
from .session_rows import ID_HEAD, SESSION_COLS, session_row

HEAD = ID_HEAD
"""Fewest characters of a prefix match; a shorter value must be a whole id."""

CANDIDATES = 10
"""Most candidates an ``AmbiguousSessionIDError`` names."""

_COLS = ", ".join(c.strip() for c in SESSION_COLS.split(","))


def by_prefix(tx: Tx, prefix: str, cwd: str | None) -> list[Session]:
    """The sessions (no sub-agents; only ``cwd``'s when given) whose id starts with
    ``prefix`` (at least :data:`HEAD` characters), at most ``CANDIDATES + 1``, by id."""
    head = "id_head" if tx.dialect.name == "duckdb" else f"substr(id, 1, {HEAD})"
    match = "starts_with(id, ?) AND sub_agent_of IS NULL" + (" AND cwd = ?" if cwd else "")
    rows = tx.rows(  # materialized: DuckDB's top-N would add a filter to the index scan
        f"WITH m AS MATERIALIZED (SELECT {_COLS} FROM sessions WHERE {keyed(head, match)}) "
        f"SELECT {_COLS} FROM m ORDER BY id LIMIT ?",
        [prefix[:HEAD], prefix, *([cwd] if cwd else []), CANDIDATES + 1],
    )
    return [session_row(r) for r in rows]


def resolve(tx: Tx, value: str, cwd: str | None) -> Session:
    """The session ``value`` names: its whole id (in ``cwd`` when given), else the
    one session whose id it begins.

    Raises:
        SessionNotFoundError, AmbiguousSessionIDError.
    """
    exact = session_rows.get(tx, value)
    if exact is not None and (cwd is None or exact.cwd == cwd):
        return exact
    found = by_prefix(tx, value, cwd) if len(value) >= HEAD else []
    found = [s for s in found if s.id != value]  # a whole id in another cwd is no prefix
    if not found:
        raise errors.SessionNotFoundError(value)
    if len(found) > 1:
        raise errors.AmbiguousSessionIDError(value, tuple(s.id for s in found[:CANDIDATES]))
    return found[0]


def file_session_id(path: str) -> str:
    """The session id in the header line of a pi session file.

    Raises:
        InvalidInputError: unreadable, or its first line is no session header.
    """
    try:
        with open(path, "rb") as f:
            first = f.readline()
        header = orjson.loads(first)
    except (OSError, orjson.JSONDecodeError) as exc:
        raise errors.InvalidInputError("value", f"{path!r}: {exc}") from exc
    if not isinstance(header, dict) or header.get("type") != "session":
        raise errors.InvalidInputError("value", f"{path!r} starts with no session header")
    return check_id(header.get("id"), "value")


def _looks_like_path(value: str) -> bool:
    """A value written as a path (a folder separator or a ``.jsonl`` name): an id
    that names a file in the working directory by chance stays an id."""
    return os.sep in value or (os.altsep or os.sep) in value or value.endswith(".jsonl")


class OpenIdsPart(Area):
    """Open by id or prefix; create and list sub-agent sessions."""

    def open(self, value: str, *, cwd: str | None = None) -> Session:
        """The session ``value`` names (session seed OpenByID, OpenByPathOrID).

        ``value`` is a whole session id, a prefix of one of at least ``HEAD``
        (8) characters, or the path of a pi session file (one that exists,
        written with a folder separator or ending ``.jsonl``: the session its
        header names, imported before). With ``cwd`` only
        that working directory's sessions match. A prefix matches no
        sub-agent session.

        Raises:
            SessionNotFoundError: nothing matches (``session_id`` is ``value``).
            AmbiguousSessionIDError: more than one session's id starts with
                ``value`` (``prefix``, ``candidates``).
            InvalidInputError: a bad value or ``cwd``, or a file without a
                session header.
        """
        check_id(value, "value")
        if cwd is not None:
            check_text(cwd, "cwd")
        if _looks_like_path(value) and os.path.isfile(value):
            value = file_session_id(value)
        return self.db.read("open_session", lambda tx: resolve(tx, value, cwd), snapshot=True)

    def new_sub_agent(
        self,
        parent_id: str,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        header: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> Session:
        """Create an empty sub-agent session of ``parent_id`` (session seed NewSubAgent):
        kept apart from the user's sessions (listings, counts, ``continue_recent``
        and prefix opens leave it out) and reachable from its parent through
        ``sub_agents``. Its header holds ``parentSession`` (the parent's id) and
        ``subAgent: true`` beside ``header``'s fields; ``cwd`` defaults to the
        parent's. Creating it writes nothing of the parent's (no lease needed).
        Deleting the parent deletes its sub-agents (``store.sessions.delete``).

        Raises:
            SessionNotFoundError: no session ``parent_id``.
            SessionIDExistsError: ``session_id`` is taken.
            InvalidInputError: a bad id, cwd, header or naive ``created_at``.
        """
        check_id(parent_id, "parent_id")
        sid = str(uuid6.uuid7()) if session_id is None else check_id(session_id, "session_id")
        if cwd is not None:
            check_text(cwd, "cwd")
        fields = {**check_header(header), "parentSession": parent_id, "subAgent": True}
        header_json = to_json(fields, "header")
        if created_at is not None:
            check_instant(created_at, "created_at")

        def body(tx: Tx) -> Session:
            # The parent's row is written (to its own values): a concurrent
            # delete of the parent then conflicts with this transaction and,
            # retried, deletes the new sub-agent with it (or this one finds
            # the parent gone), so no sub-agent outlives its parent.
            tx.count("UPDATE sessions SET updated_at = updated_at WHERE id = ?", [parent_id])
            parent = session_rows.get(tx, parent_id)
            if parent is None:
                raise errors.SessionNotFoundError(parent_id)
            where = parent.cwd if cwd is None else cwd
            return session_rows.create(tx, sid, where, header_json, created_at, parent_id)

        session = self.db.write("new_sub_agent", body)
        self._openings.put(sid, Opening(None, session.next_seq))  # empty: no call is open
        return session

    def sub_agents(self, parent_id: str) -> list[Session]:
        """The sub-agent sessions of ``parent_id``, oldest first (``[]`` for none)."""
        check_id(parent_id, "parent_id")
        return self.db.read(
            "sub_agents",
            lambda tx: [
                session_row(r)
                for r in tx.rows(
                    f"SELECT {_COLS} FROM sessions WHERE sub_agent_of = ? ORDER BY created_at, id",
                    [parent_id],
                )
            ],
        )
