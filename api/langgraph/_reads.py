"""The reads the savers make: a checkpoint by its key, a namespace's
checkpoints, a checkpoint's writes, never the whole session.

A checkpoint named by its id is one ``store.sessions.custom_entry`` (a lookup
through the entries' id index). The others are one read query each
(``store.query``, in one read transaction's snapshot): a ``LIKE`` on the id
prefix (``_records``) of the session's entries, each payload decoded by the
store's own JSON codec. ``sessions.custom_entries`` pages a type's entries
newest first by ``seq`` and matches a key prefix after reading them: the
writes of one checkpoint would read every write of the session, and
LangGraph orders checkpoints by id, not by when they were stored (an import,
a copy or a put of an older id).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnkeeper.spec import errors

from ._records import (
    CHANNEL_TYPE,
    CHECKPOINT,
    StoredCheckpoint,
    StoredWrite,
    checkpoint_entry_id,
    checkpoint_prefix,
    writes_prefix,
)


def _rows(store: Any, sql: str, params: Sequence[Any]) -> list[tuple[str, Any]]:
    """``(id, decoded payload)`` of the session's entries ``sql`` selects
    (``params[0]`` the session id); sealed payloads opened by the store."""
    table = store.query(sql, list(params))
    return list(store._payloads(params[0], [(r["id"], r["payload"]) for r in table.to_pylist()]))


def checkpoints(
    store: Any,
    session_id: str,
    ns: str | None,
    *,
    checkpoint_id: str | None = None,
    before: str | None = None,
    limit: int | None = None,
) -> list[StoredCheckpoint]:
    """The session's checkpoints of namespace ``ns`` (all: ``None``), newest
    checkpoint id first; only ``checkpoint_id`` when given; only ids below
    ``before``; at most ``limit`` (``None``: all). With a namespace, the order
    and the bounds are the query's (the id's hex keeps the order)."""
    if checkpoint_id is not None and ns is not None:
        if (limit is not None and limit <= 0) or (before is not None and checkpoint_id >= before):
            return []
        try:
            found = store.sessions.custom_entry(
                session_id, CHECKPOINT, checkpoint_entry_id(ns, checkpoint_id)
            )
        except errors.SessionNotFoundError:
            return []  # deleted meanwhile
        return [] if found is None else [StoredCheckpoint.of(found.id, found.payload)]
    sql = "SELECT id, payload FROM entries WHERE session_id = ? AND kind = 'custom' AND id LIKE ?"
    params: list[Any] = [session_id, checkpoint_prefix(ns) + "%"]
    pushed = ns is not None
    if pushed and before is not None:
        sql += " AND id < ?"
        params.append(checkpoint_entry_id(ns or "", before))
    if pushed:
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(max(limit, 0))
    found = [StoredCheckpoint.of(i, p) for i, p in _rows(store, sql, params)]
    if not pushed:
        found = [
            c
            for c in found
            if (checkpoint_id is None or c.checkpoint_id == checkpoint_id)
            and (before is None or c.checkpoint_id < before)
        ]
        found.sort(key=lambda c: c.checkpoint_id, reverse=True)
        if limit is not None:
            found = found[: max(limit, 0)]
    return found


def writes(store: Any, session_id: str, ns: str, checkpoint_id: str) -> list[StoredWrite]:
    """Every stored write entry of one checkpoint (every version)."""
    sql = "SELECT id, payload FROM entries WHERE session_id = ? AND kind = 'custom' AND id LIKE ?"
    rows = _rows(store, sql, [session_id, writes_prefix(ns, checkpoint_id) + "%"])
    return [
        w
        for w in (StoredWrite.of(i, p) for i, p in rows)
        if w.ns == ns and w.checkpoint_id == checkpoint_id
    ]


def sessions_with_runs(store: Any, run_ids: Sequence[str]) -> list[str]:
    """The LangGraph sessions holding a checkpoint of one of ``run_ids``."""
    if not run_ids:
        return []
    if store.db.keyring.encrypted:
        return _sealed_sessions_with_runs(store, run_ids)
    payload = store.json_sql("e.payload")
    marks = ", ".join("?" for _ in run_ids)
    sql = (
        "SELECT DISTINCT e.session_id AS id FROM entries e "
        "JOIN sessions s ON s.id = e.session_id "
        "WHERE s.channel_type = ? AND e.kind = 'custom' AND e.id LIKE 'lgc/%' "
        f"AND {payload} ->> 'customType' = ? "
        f"AND {payload} -> 'data' ->> 'run_id' IN ({marks}) ORDER BY 1"
    )
    table = store.query(sql, [CHANNEL_TYPE, CHECKPOINT, *run_ids])
    return [r["id"] for r in table.to_pylist()]


def _sealed_sessions_with_runs(store: Any, run_ids: Sequence[str]) -> list[str]:
    """:func:`sessions_with_runs` in an encrypted store: SQL cannot read a
    sealed payload, so every checkpoint entry of the LangGraph sessions is
    read and opened (a scan of them all, per call)."""
    table = store.query(
        "SELECT e.session_id AS sid, e.id AS id, e.payload AS payload FROM entries e "
        "JOIN sessions s ON s.id = e.session_id "
        "WHERE s.channel_type = ? AND e.kind = 'custom' AND e.id LIKE 'lgc/%' "
        "ORDER BY e.session_id",
        [CHANNEL_TYPE],
    )
    by_session: dict[str, list[tuple[str, str]]] = {}
    for r in table.to_pylist():
        by_session.setdefault(r["sid"], []).append((r["id"], r["payload"]))
    wanted = set(run_ids)
    found: list[str] = []
    for sid, rows in by_session.items():
        for _, payload in store._payloads(sid, rows):
            data = payload.get("data") if isinstance(payload, dict) else None
            if (
                payload.get("customType") == CHECKPOINT
                and isinstance(data, dict)
                and data.get("run_id") in wanted
            ):
                found.append(sid)
                break
    return sorted(found)
