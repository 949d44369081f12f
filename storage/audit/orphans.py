"""Audit check: no row outlives what it belongs to.

Every row a session owns names its session, and a few name another owner (a
run, a delivery intent, a project); a delete (``store.sessions.delete``,
retention, a project's delete) removes a session with every row of it in one
transaction, so no row is ever left naming a session, run, intent or project
that does not exist. A row that does was left by a partial delete made
around the store (raw SQL, a tool of its own), or written around the store.
"""

from __future__ import annotations

from turnkeeper.storage.store import Snapshot

from .base import Check, Scope, sample
from .base import rows as query_rows

OWNED: tuple[tuple[str, str, str, str], ...] = (
    ("entries", "session_id", "sessions", "id"),
    ("replay_snapshots", "session_id", "sessions", "id"),
    ("session_keys", "session_id", "sessions", "id"),
    ("opaque_records", "session_id", "sessions", "id"),
    ("import_sources", "session_id", "sessions", "id"),
    ("execution_intents", "session_id", "sessions", "id"),
    ("runs", "session_id", "sessions", "id"),
    ("active_runs", "session_id", "sessions", "id"),
    ("run_events", "session_id", "sessions", "id"),
    ("submissions", "session_id", "sessions", "id"),
    ("conversation_turns", "session_id", "sessions", "id"),
    ("run_recoveries", "session_id", "sessions", "id"),
    ("response_states", "session_id", "sessions", "id"),
    ("response_runs", "session_id", "sessions", "id"),
    ("response_turns", "session_id", "sessions", "id"),
    ("response_items", "session_id", "sessions", "id"),
    ("delivery_intents", "session_id", "sessions", "id"),
    ("tool_executions", "session_id", "sessions", "id"),
    ("tool_execution_events", "session_id", "sessions", "id"),
    ("session_metadata", "session_id", "sessions", "id"),
    ("session_capabilities", "session_id", "sessions", "id"),
    ("capability_events", "session_id", "sessions", "id"),
    ("esm_guidance", "session_id", "sessions", "id"),
    ("input_resource_events", "session_id", "sessions", "id"),
    ("event_cursors", "session_id", "sessions", "id"),
    ("usage_records", "session_id", "sessions", "id"),
    ("channel_tools", "session_id", "sessions", "id"),
    ("channel_bindings", "session_id", "sessions", "id"),
    ("session_forks", "fork_session_id", "sessions", "id"),
    ("ledger_records", "session_id", "sessions", "id"),
    ("ledger_tips", "session_id", "sessions", "id"),
    ("ledger_catalog", "session_id", "sessions", "id"),
    ("ledger_blobs", "session_id", "sessions", "id"),
    ("ledger_blob_condemned", "session_id", "sessions", "id"),
    ("sessions", "sub_agent_of", "sessions", "id"),
    ("recovery_events", "run_id", "runs", "id"),
    ("delivery_operations", "intent_id", "delivery_intents", "id"),
    ("delivery_events", "intent_id", "delivery_intents", "id"),
    ("session_metadata", "project_id", "projects", "id"),
)
"""(table, column naming the owner, the owner's table, its key): every owned row."""


def check_no_orphans(store: Snapshot, scope: Scope) -> Check:
    """No row names a session, run, delivery intent or project that does not
    exist. Scoped to sessions, only the rows naming one of them are judged."""
    parts = []
    for table, column, owner, key in OWNED:
        if owner == "sessions":
            within = scope.keys_in(f"t.{column}")
        else:  # its session cannot be told once its owner is gone: whole-store audits only
            within = "TRUE" if scope.sessions is None else "FALSE"
        parts.append(
            f"SELECT '{table}.{column}:' || t.{column} AS item, "
            f"NOT EXISTS (SELECT 1 FROM {owner} o WHERE o.{key} = t.{column}) AS orphan "
            f"FROM {table} t WHERE t.{column} IS NOT NULL AND {within}"
        )
    sql = (
        f"WITH {scope.cte()}, owned AS ({' UNION ALL '.join(parts)}) "
        "SELECT (SELECT count(*) FROM owned) AS checked, "
        "(SELECT array_agg(DISTINCT item ORDER BY item) FROM owned WHERE orphan) AS bad"
    )
    params = scope.params()
    row = query_rows(store, sql, params)[0]
    bad = list(row["bad"] or [])
    return Check(
        "no_orphan_rows",
        "every row of a session, run, delivery intent or project belongs to one that exists",
        len(bad),
        int(row["checked"]),
        sample(bad),
    )


def check_bindings_agree(store: Snapshot, scope: Scope) -> Check:
    """Each session's row repeats exactly its channel binding (``store.bindings``
    writes both in one transaction): a session row naming a channel without the
    binding, or another one, was written around the store."""
    sql = (
        f"WITH {scope.cte()}, judged AS (SELECT s.id, "
        "(s.channel_type IS DISTINCT FROM b.channel_type "
        "OR s.channel_id IS DISTINCT FROM b.channel_id) AS bad "
        "FROM sessions s LEFT JOIN channel_bindings b ON b.session_id = s.id "
        f"WHERE {scope.keys_in('s.id')}) "
        "SELECT (SELECT count(*) FROM judged) AS checked, "
        "(SELECT array_agg(id ORDER BY id) FROM judged WHERE bad) AS bad"
    )
    row = query_rows(store, sql, scope.params())[0]
    bad = list(row["bad"] or [])
    return Check(
        "bindings_agree",
        "each session's row names the channel it is bound to, and only that one",
        len(bad),
        int(row["checked"]),
        sample(bad),
    )
