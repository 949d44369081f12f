"""``import_sqlite``: a LangGraph SQLite checkpoint database into a store."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import NewEntry

from . import _reads
from ._records import (
    StoredCheckpoint,
    StoredWrite,
    checkpoint_entry_id,
    write_entry_id,
)
from ._saver import CHUNK, TurnkeeperSaver

SQLITE_MAGIC = b"SQLite format 3\x00"
KNOWN_TABLES = {"checkpoints", "writes"}


@dataclass
class SqliteImport:
    """What :func:`import_sqlite` did: per thread id its session id
    (``threads``), the threads that got a new session (``created``), entries
    added (``checkpoints_added``, ``writes_added``), rows already there
    (``skipped``), checkpoints stored already with other content, kept as they
    were (``conflicts``: ``thread_id/ns/checkpoint_id``; a checkpoint is never
    rewritten), and tables that are not LangGraph's, not imported
    (``unknown_tables``)."""

    path: str
    threads: dict[str, str] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    checkpoints_added: int = 0
    writes_added: int = 0
    skipped: int = 0
    conflicts: list[str] = field(default_factory=list)
    unknown_tables: list[str] = field(default_factory=list)


def looks_like_sqlite(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` starts as an SQLite database does."""
    with open(path, "rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def import_sqlite(
    store: Any,
    path: str | os.PathLike[str],
    *,
    serde: SerializerProtocol | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SqliteImport:
    """Import the LangGraph SQLite checkpoint database at ``path`` (the tables
    ``checkpoints`` and ``writes`` of ``langgraph-checkpoint-sqlite``'s
    ``SqliteSaver``, read only) into ``store``: each thread becomes the
    session :class:`TurnkeeperSaver` serves it from, whose ``get_tuple`` and
    ``list`` then return what ``SqliteSaver`` returns (the checkpoint bytes
    are copied as stored; the metadata, JSON there, is kept as the values it
    decodes to). Idempotent: a re-import adds nothing, a grown database only
    its new rows (a special write SQLite replaced becomes a new version).
    ``progress(threads done, threads)`` is called after each thread.

    Raises:
        SessionFileError: the file is not a LangGraph SQLite checkpoint
            database (``detail`` says why); nothing is written.
        OSError: the file cannot be read.
        BusyError: a thread's session is held by a lease (that thread and
            the ones after it are not imported; the ones before are).
    """
    where = os.fspath(path)
    if not looks_like_sqlite(where):
        raise errors.SessionFileError(where, 0, detail="not an SQLite database")
    uri = Path(where).resolve().as_uri() + "?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables >= KNOWN_TABLES:
            raise errors.SessionFileError(
                where, 0, detail="no LangGraph 'checkpoints' and 'writes' tables"
            )
        columns = {r[1] for r in db.execute("PRAGMA table_info(writes)")}
        task_path = "task_path" if "task_path" in columns else "''"
        result = SqliteImport(where, unknown_tables=sorted(tables - KNOWN_TABLES))
        threads = [
            r[0]
            for r in db.execute(
                "SELECT thread_id FROM checkpoints UNION SELECT thread_id FROM writes ORDER BY 1"
            )
        ]
        saver = TurnkeeperSaver(store, serde=serde or JsonPlusSerializer())
        for done, thread_id in enumerate(threads, 1):
            _import_thread(db, saver, str(thread_id), task_path, result)
            if progress is not None:
                progress(done, len(threads))
    return result


def _import_thread(
    db: sqlite3.Connection,
    saver: TurnkeeperSaver,
    thread_id: str,
    task_path: str,
    result: SqliteImport,
) -> None:
    existed = saver.session_id(thread_id)
    sid = saver.session_id(thread_id, create=True)
    assert sid is not None
    result.threads[thread_id] = sid
    if existed is None:
        result.created.append(thread_id)
    have_cps = {c.entry_id: c for c in _reads.checkpoints(saver.store, sid, None)}
    have_writes = _stored_writes(saver, sid)
    new: list[NewEntry] = []
    for ns, cid, parent, type_, blob, metadata in db.execute(
        "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata "
        "FROM checkpoints WHERE thread_id = ? ORDER BY checkpoint_ns, checkpoint_id",
        [thread_id],
    ):
        md = json.loads(metadata) if metadata is not None else {}
        run_id = md.get("run_id") if isinstance(md, dict) else None
        stored = StoredCheckpoint(
            ns,
            cid,
            parent,
            (type_, bytes(blob)),
            saver.serde.dumps_typed(md),
            None if run_id is None else str(run_id),
            checkpoint_entry_id(ns, cid),
        )
        seen = have_cps.get(stored.entry_id)
        if seen is None:
            new.append(NewEntry(EntryKind.CUSTOM, stored.payload(), entry_id=stored.entry_id))
            result.checkpoints_added += 1
        elif seen.checkpoint == stored.checkpoint and saver.serde.loads_typed(
            seen.metadata
        ) == saver.serde.loads_typed(stored.metadata):
            result.skipped += 1
        else:
            result.conflicts.append(f"{thread_id}/{ns}/{cid}")
    current: dict[tuple[str, str, tuple[str, int]], StoredWrite] = {}
    for w in have_writes:  # per checkpoint and key, the highest version
        key = (w.ns, w.checkpoint_id, w.key)
        if key not in current or w.version > current[key].version:
            current[key] = w
    for ns, cid, task_id, path, idx, channel, type_, value in db.execute(
        f"SELECT checkpoint_ns, checkpoint_id, task_id, {task_path}, idx, channel, type, value "
        "FROM writes WHERE thread_id = ? ORDER BY checkpoint_ns, checkpoint_id, task_id, idx",
        [thread_id],
    ):
        typed = (type_, bytes(value) if value is not None else b"")
        seen_w = current.get((ns, cid, (task_id, idx)))
        if seen_w is not None and seen_w.value == typed and seen_w.channel == channel:
            result.skipped += 1
            continue
        version = 0 if seen_w is None else seen_w.version + 1
        w = StoredWrite(
            ns,
            cid,
            task_id,
            path,
            idx,
            channel,
            typed,
            version,
            write_entry_id(ns, cid, task_id, idx, version),
        )
        new.append(NewEntry(EntryKind.CUSTOM, w.payload(), entry_id=w.entry_id))
        result.writes_added += 1
    for start in range(0, len(new), CHUNK):
        saver.store.sessions.append_many(sid, new[start : start + CHUNK])


def _stored_writes(saver: TurnkeeperSaver, session_id: str) -> list[StoredWrite]:
    table = saver.store.query(
        "SELECT id, payload FROM entries WHERE session_id = ? AND kind = 'custom' "
        "AND id LIKE 'lgw/%'",
        [session_id],
    )
    rows = [(r["id"], r["payload"]) for r in table.to_pylist()]
    return [StoredWrite.of(i, p) for i, p in saver.store._payloads(session_id, rows)]
