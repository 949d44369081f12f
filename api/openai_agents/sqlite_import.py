"""Import an OpenAI Agents SDK ``SQLiteSession`` database: each SDK session becomes a
turnkeeper session bound to its id, whose ``TurnkeeperSession.get_items`` equals the
SDK's ``SQLiteSession.get_items``.

The file is read with ``sqlite3`` in read-only mode, in the SDK's schema
(``agent_sessions`` and ``agent_messages``: ``id``, ``session_id``, ``message_data``,
the table names as ``SQLiteSession`` takes them). Each row becomes one entry with the
id ``openai-agents-sqlite-<row id>``, so importing again (a grown file) adds only the
rows after the last one imported. A row whose ``message_data`` is not JSON is kept
verbatim (an :data:`~.session.UNPARSED_TYPE` entry, which reads skip as the SDK skips
it) and counted in the report.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import NewEntry

from .session import CHANNEL_TYPE, UNPARSED_TYPE, item_entry

if TYPE_CHECKING:
    from turnkeeper.storage.store import BaseStore

_BATCH = 500


@dataclass(frozen=True, slots=True)
class SQLiteImportReport:
    """What :func:`import_sqlite` did: per SDK session id, the turnkeeper session it is
    bound to (``sessions``), the rows added this time (``added``) and the rows kept
    verbatim because they were not JSON (``unparsed``, their SQLite row ids)."""

    sessions: dict[str, str] = field(default_factory=dict)
    added: dict[str, int] = field(default_factory=dict)
    unparsed: dict[str, list[int]] = field(default_factory=dict)


def _entry_id(row_id: int) -> str:
    return f"openai-agents-sqlite-{row_id}"


def _new_entry(row_id: int, raw: Any) -> tuple[NewEntry, bool]:
    try:
        item = json.loads(raw)
    except (json.JSONDecodeError, TypeError):
        item = None
    if isinstance(item, dict):
        return item_entry(cast(Any, item), entry_id=_entry_id(row_id)), True
    payload = {"customType": UNPARSED_TYPE, "data": {"message_data": raw}}
    return NewEntry(EntryKind.CUSTOM, payload, entry_id=_entry_id(row_id)), False


def import_sqlite(
    store: BaseStore,
    path: str | Path,
    *,
    sessions_table: str = "agent_sessions",
    messages_table: str = "agent_messages",
    progress: Callable[[str, int], None] | None = None,
) -> SQLiteImportReport:
    """Import the SDK sessions of the ``SQLiteSession`` database at ``path`` into
    ``store`` (a sync store). Idempotent: rows already imported are not added again.
    ``progress(sdk_session_id, rows_added_so_far)`` is called after each batch.

    Raises:
        SessionFileError: ``path`` is not a readable SQLite database in that schema
            (nothing is imported).
        BusyError: a bound session is held by someone's lease (the sessions before it
            are imported).
    """
    uri = f"{Path(path).resolve().as_uri()}?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True)) as conn:
            ids = [
                r[0]
                for r in conn.execute(
                    f"SELECT session_id FROM {sessions_table} UNION "
                    f"SELECT session_id FROM {messages_table} ORDER BY 1"
                )
            ]
            rows = {
                sid: conn.execute(
                    f"SELECT id, message_data FROM {messages_table} "
                    "WHERE session_id = ? ORDER BY id",
                    (sid,),
                ).fetchall()
                for sid in ids
            }
    except sqlite3.Error as failure:
        raise errors.SessionFileError(str(path), 0, detail=str(failure)) from failure
    report = SQLiteImportReport()
    for sid in ids:
        _import_one(store, sid, rows[sid], report, progress)
    return report


def _import_one(
    store: BaseStore,
    sid: str,
    rows: list[tuple[int, Any]],
    report: SQLiteImportReport,
    progress: Callable[[str, int], None] | None,
) -> None:
    binding = store.bindings.find(CHANNEL_TYPE, sid)
    if binding is None:
        bound = store.bindings.create_bound(CHANNEL_TYPE, sid).id
    else:
        bound = binding.session_id
    # Imports append in the file's order, batch by batch: the rows imported before are
    # a prefix of ``rows``, found by a binary search of entry lookups.
    lo, hi = 0, len(rows)
    while lo < hi:
        mid = (lo + hi) // 2
        if store.sessions.entry(bound, _entry_id(rows[mid][0])) is None:
            hi = mid
        else:
            lo = mid + 1
    start = lo
    report.sessions[sid] = bound
    report.added[sid] = 0
    for lo in range(start, len(rows), _BATCH):
        batch = [_new_entry(row_id, raw) for row_id, raw in rows[lo : lo + _BATCH]]
        store.sessions.append_many(bound, [entry for entry, _ in batch])
        for (row_id, _), (_, parsed) in zip(rows[lo : lo + _BATCH], batch, strict=True):
            if not parsed:
                report.unparsed.setdefault(sid, []).append(row_id)
        report.added[sid] += len(batch)
        if progress is not None:
            progress(sid, report.added[sid])
