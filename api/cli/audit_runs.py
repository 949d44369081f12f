"""Audit checks over runs, the delivery outbox and tool-execution records.

Like :mod:`.audit`, each check reads stored history and returns a
:class:`~.audit.Check`. Orders come from what the store serializes: run
events carry a per-session sequence (each is written in the transaction
that moves the run), delivery claims carry the operation's epoch.
"""

from __future__ import annotations

from turnkeeper.spec.run import TERMINAL
from turnkeeper.storage import DuckDBStore

from .audit import Check, Scope, _rows, _sample

_TERMINAL_SQL = "(" + ", ".join(f"'{s.value}'" for s in sorted(TERMINAL)) + ")"


def check_one_active_run(store: DuckDBStore, scope: Scope) -> Check:
    """Replaying each session's run events in sequence order, at most one run is
    non-terminal at every moment (admissions minus terminations stays 0 or 1)."""
    sql = f"""
    WITH {scope.cte()},
    ev AS (
        SELECT session_id, seq,
               CASE WHEN edge = 'admit' THEN 1 WHEN dest IN {_TERMINAL_SQL} THEN -1 ELSE 0 END AS d
        FROM run_events WHERE {scope.sessions_in("session_id")}
    ),
    live AS (
        SELECT session_id, sum(d) OVER (PARTITION BY session_id ORDER BY seq) AS n FROM ev
    )
    SELECT session_id, max(n) AS peak, min(n) AS low, count(*) AS events FROM live
    GROUP BY session_id
    """
    rows = _rows(store, sql, scope.params())
    bad = [r["session_id"] for r in rows if r["peak"] > 1 or r["low"] < 0]
    return Check(
        "one_active_run_per_session",
        "replaying run events, no session ever had two non-terminal runs",
        len(bad),
        sum(int(r["events"]) for r in rows),
        _sample(sorted(bad)),
    )


def check_no_revival(store: DuckDBStore, scope: Scope) -> Check:
    """No run moves after its terminal event: no event leaves a terminal status,
    a run has one terminal event at most, and a terminal run's status is it."""
    sql = f"""
    WITH {scope.cte()},
    ev AS (SELECT * FROM run_events WHERE {scope.sessions_in("session_id")}),
    term AS (
        SELECT run_id, min(seq) AS tseq, count(*) AS n, arg_min(dest, seq) AS status
        FROM ev WHERE dest IN {_TERMINAL_SQL} GROUP BY run_id
    )
    SELECT DISTINCT e.run_id AS bad FROM ev e JOIN term t USING (run_id) WHERE e.seq > t.tseq
    UNION SELECT run_id FROM term WHERE n > 1
    UNION SELECT t.run_id FROM term t JOIN runs r ON r.id = t.run_id WHERE r.status <> t.status
    UNION SELECT run_id FROM ev WHERE source IN {_TERMINAL_SQL}
    """
    bad = [r["bad"] for r in _rows(store, sql, scope.params())]
    checked = _rows(
        store,
        f"WITH {scope.cte()} SELECT count(*) AS n FROM runs "
        f"WHERE {scope.sessions_in('session_id')}",
        scope.params(),
    )[0]["n"]
    return Check(
        "no_run_revived",
        "no run changed status after it reached a terminal one",
        len(bad),
        int(checked),
        _sample(sorted(bad)),
    )


def check_delivered_once(store: DuckDBStore, scope: Scope) -> Check:
    """Per delivery operation: at most one ``delivered`` result, claims carry epochs
    1, 2, 3 … once each, and a delivered operation has its delivered event."""
    sql = f"""
    WITH {scope.cte()},
    ops AS (
        SELECT o.id, o.status FROM delivery_operations o
        JOIN delivery_intents i ON i.id = o.intent_id WHERE {scope.sessions_in("i.session_id")}
    ),
    ev AS (SELECT * FROM delivery_events WHERE operation_id IN (SELECT id FROM ops)),
    per AS (
        SELECT o.id, o.status,
               count(*) FILTER (WHERE e.dest = 'delivered') AS delivered,
               coalesce(list(e.epoch ORDER BY e.epoch) FILTER (WHERE e.trigger = 'claim'), [])
                   AS claims
        FROM ops o LEFT JOIN ev e ON e.operation_id = o.id GROUP BY o.id, o.status
    )
    SELECT id, status, delivered, claims FROM per
    """
    rows = _rows(store, sql, scope.params())
    bad = [
        r["id"]
        for r in rows
        if r["delivered"] > 1
        or (r["status"] == "delivered") != (r["delivered"] == 1)
        or r["claims"] != list(range(1, len(r["claims"]) + 1))
    ]
    return Check(
        "delivered_at_most_once",
        "no delivery operation was delivered twice; claim epochs rose by one",
        len(bad),
        len(rows),
        _sample(sorted(bad)),
    )


def check_tool_calls_paired(store: DuckDBStore, scope: Scope) -> Check:
    """Every ``toolCall`` in an ended run turn has a ``toolResult`` for it in the
    session (the tool's output, or an explicit interrupted result); every
    tool-execution record that ended (completed, interrupted, abandoned) has
    one too; and a record still running belongs to a run that has not ended."""
    sql = f"""
    WITH {scope.cte()},
    ended AS (
        SELECT session_id, start_seq, end_seq FROM conversation_turns
        WHERE end_seq IS NOT NULL AND {scope.sessions_in("session_id")}
    ),
    blocks AS (
        SELECT e.session_id, e.session_id || '/' || e.id AS entry,
               unnest(json_extract(e.payload, '$.message.content[*]')) AS block
        FROM entries e JOIN ended t ON t.session_id = e.session_id
         AND e.seq BETWEEN t.start_seq AND t.end_seq
        WHERE e.kind = 'message' AND json_extract_string(e.payload, '$.message.role') = 'assistant'
    ),
    calls AS (
        SELECT session_id, entry, json_extract_string(block, '$.type') AS type,
               coalesce(json_extract_string(block, '$.id'), '(no id)') AS call_id
        FROM blocks
    ),
    results AS (
        SELECT session_id, json_extract_string(payload, '$.message.toolCallId') AS call_id
        FROM entries WHERE {scope.sessions_in("session_id")} AND kind = 'message'
          AND json_extract_string(payload, '$.message.role') = 'toolResult'
    ),
    recs AS (SELECT * FROM tool_executions WHERE {scope.sessions_in("session_id")})
    SELECT 'call ' || c.entry || ':' || c.call_id AS bad FROM calls c
    WHERE c.type = 'toolCall' AND NOT EXISTS (
        SELECT 1 FROM results x WHERE x.session_id = c.session_id AND x.call_id = c.call_id)
    UNION
    SELECT 'record ' || r.execution_key FROM recs r
    WHERE r.state IN ('completed', 'interrupted', 'abandoned')
      AND NOT EXISTS (
          SELECT 1 FROM results x
          WHERE x.session_id = r.session_id AND x.call_id = r.provider_call_id)
    UNION
    SELECT 'record ' || r.execution_key FROM recs r JOIN runs u ON u.id = r.run_id
    WHERE r.state = 'running' AND u.status IN {_TERMINAL_SQL}
    """
    bad = [r["bad"] for r in _rows(store, sql, scope.params())]
    counted = f"""
    WITH {scope.cte()},
    ended AS (
        SELECT session_id, start_seq, end_seq FROM conversation_turns
        WHERE end_seq IS NOT NULL AND {scope.sessions_in("session_id")}
    )
    SELECT (SELECT count(*) FROM tool_executions WHERE {scope.sessions_in("session_id")})
         + (SELECT coalesce(sum(len(list_filter(
               json_extract_string(e.payload, '$.message.content[*].type'),
               lambda x: x = 'toolCall'))), 0)
            FROM entries e JOIN ended t ON t.session_id = e.session_id
             AND e.seq BETWEEN t.start_seq AND t.end_seq
            WHERE e.kind = 'message') AS n
    """
    checked = _rows(store, counted, scope.params())[0]["n"]
    return Check(
        "tool_calls_paired",
        "every tool call in an ended turn, and every ended tool record, has a result",
        len(bad),
        int(checked),
        _sample(sorted(bad)),
    )


def run_checks(store: DuckDBStore, scope: Scope) -> list[Check]:
    """Every check of this module."""
    return [
        check_one_active_run(store, scope),
        check_no_revival(store, scope),
        check_delivered_once(store, scope),
        check_tool_calls_paired(store, scope),
    ]
