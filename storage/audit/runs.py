"""Audit checks over runs, the delivery outbox and tool-execution records.

Like :mod:`.checks`, each check reads stored history and returns a
:class:`~.base.Check`. Orders come from what the store serializes: run
events carry a per-session sequence (each is written in the transaction
that moves the run), delivery claims carry the operation's epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

from turnkeeper.spec.records import Entry
from turnkeeper.spec.run import TERMINAL
from turnkeeper.storage.crypto.columns import SEALED
from turnkeeper.storage.ops.entry_rows import ENTRY_SELECT
from turnkeeper.storage.pairing import calls_of, tree_faults, unanswered_calls
from turnkeeper.storage.replay import context_message, path_to
from turnkeeper.storage.store import Snapshot, Unopened

from .base import Check, Scope, sample
from .base import rows as query_rows

_TERMINAL_SQL = "(" + ", ".join(f"'{s.value}'" for s in sorted(TERMINAL)) + ")"


def check_one_active_run(store: Snapshot, scope: Scope) -> Check:
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
    rows = query_rows(store, sql, scope.params())
    bad = [r["session_id"] for r in rows if r["peak"] > 1 or r["low"] < 0]
    return Check(
        "one_active_run_per_session",
        "replaying run events, no session ever had two non-terminal runs",
        len(bad),
        sum(int(r["events"]) for r in rows),
        sample(sorted(bad)),
    )


def check_no_revival(store: Snapshot, scope: Scope) -> Check:
    """No run moves after its terminal event: no event leaves a terminal status,
    a run has one terminal event at most, and a terminal run's status is it."""
    sql = f"""
    WITH {scope.cte()},
    ev AS (SELECT * FROM run_events WHERE {scope.sessions_in("session_id")}),
    term AS (
        SELECT run_id, min(seq) AS tseq, count(*) AS n, (array_agg(dest ORDER BY seq))[1] AS status
        FROM ev WHERE dest IN {_TERMINAL_SQL} GROUP BY run_id
    )
    SELECT DISTINCT e.run_id AS bad FROM ev e JOIN term t USING (run_id) WHERE e.seq > t.tseq
    UNION SELECT run_id FROM term WHERE n > 1
    UNION SELECT t.run_id FROM term t JOIN runs r ON r.id = t.run_id WHERE r.status <> t.status
    UNION SELECT run_id FROM ev WHERE source IN {_TERMINAL_SQL}
    """
    bad = [r["bad"] for r in query_rows(store, sql, scope.params())]
    checked = query_rows(
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
        sample(sorted(bad)),
    )


def check_delivered_once(store: Snapshot, scope: Scope) -> Check:
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
               coalesce(array_agg(e.epoch ORDER BY e.epoch) FILTER (WHERE e.trigger = 'claim'),
                        ARRAY[]::BIGINT[])
                   AS claims
        FROM ops o LEFT JOIN ev e ON e.operation_id = o.id GROUP BY o.id, o.status
    )
    SELECT id, status, delivered, claims FROM per
    """
    rows = query_rows(store, sql, scope.params())
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
        sample(sorted(bad)),
    )


def _trees(store: Snapshot, scope: Scope) -> tuple[dict[str, dict[str, Entry]], Check]:
    """Every in-scope session's entries by id (a session with an entry whose
    sealed payload did not open left out: its tree is not known), and the
    check of those payloads (:func:`check_payloads_open`)."""
    found = query_rows(
        store,
        f"WITH {scope.cte()} SELECT {ENTRY_SELECT} FROM entries "
        f"WHERE {scope.sessions_in('session_id')} ORDER BY session_id, seq",
        scope.params(),
    )
    opened, unopened = store.opened_entries([list(row.values()) for row in found])
    out: dict[str, dict[str, Entry]] = {}
    for entry in opened:
        out.setdefault(entry.session_id, {})[entry.id] = entry
    for u in unopened:
        out.pop(u.session_id, None)
    checked, other = _sealed_values(store, scope)
    return out, check_payloads_open(len(found) + checked, [*unopened, *other])


_NOT_WALKED = {("entries", "payload")}
"""Sealed columns :func:`_sealed_values` leaves out: the entries, opened with
the trees. (A replay snapshot that does not open is not served, the replay
reads the rows; the audit still names it: a clear snapshot in a sealed
session is a clear copy at rest.)"""


def _sealed_values(store: Snapshot, scope: Scope) -> tuple[int, list[Unopened]]:
    """Every other sealed column's values of the in-scope sessions that exist
    (``crypto/columns.py``), each opened: how many, and those that did not
    open. A ledger blob is read one at a time (up to 64 MiB each)."""
    checked = 0
    unopened: list[Unopened] = []
    for column in SEALED:
        if (column.table, column.column) in _NOT_WALKED:
            continue
        t, c, sid = column.table, column.column, column.session
        record = f"CAST({column.record} AS VARCHAR)"
        # (a row of a session that no longer exists is an orphan, no_orphan_rows' to
        # name: its key went with the session, so it does not open)
        where = (
            f"{scope.sessions_in(sid)} AND {sid} IN (SELECT id FROM sessions) AND {c} IS NOT NULL"
        )
        if column.table != "ledger_blobs":
            found = query_rows(
                store,
                f"WITH {scope.cte()} SELECT {sid} AS s, {record} AS r, {c} AS v FROM {t} "
                f"WHERE {where}",
                scope.params(),
            )
            rows = [[row["s"], row["r"], row["v"]] for row in found]
            checked += len(rows)
            unopened += store.unopened_values(column, rows)
            continue
        keys = query_rows(
            store,
            f"WITH {scope.cte()} SELECT {sid} AS s, {record} AS r FROM {t} WHERE {where}",
            scope.params(),
        )
        for key in keys:
            blob = query_rows(store, f"SELECT {c} AS v FROM {t} WHERE key = ?", [key["r"]])
            checked += 1
            unopened += store.unopened_values(column, [[key["s"], key["r"], blob[0]["v"]]])
    return checked, unopened


def check_payloads_open(checked: int, unopened: Sequence[Unopened]) -> Check:
    """Every sealed value opens under its session's data key (encryption at
    rest): the entries' payloads and every other sealed column
    (``crypto/columns.py``: tool results, run requests and events, the
    ledger's records and blobs …); one that fails authentication (a flipped
    byte, a value moved from another row, a clear value in a sealed
    session) or whose key is gone is a violation. A store opened
    without its key opens none; that is said, not counted, and the sessions'
    tree checks below skip them."""
    bad = [u for u in unopened if not u.keyless]
    skipped = sorted({u.session_id for u in unopened if u.keyless})
    detail = ""
    if bad:
        detail = sample(sorted(f"{u.session_id}/{u.column}/{u.entry_id}: {u.error}" for u in bad))
    elif skipped:
        detail = (
            f"the payloads of {len(skipped)} session(s) are sealed and the store was opened "
            "without its key (--key-file or $TURNKEEPER_MASTER_KEY): not opened, their trees "
            "not checked"
        )
    return Check(
        "payloads_open",
        "every sealed value opens under its session's data key",
        len(bad),
        checked - sum(1 for u in unopened if u.keyless),
        detail,
    )


def check_tool_calls_paired(
    store: Snapshot, scope: Scope, trees: dict[str, dict[str, Entry]]
) -> Check:
    """Every tool call of an ended run turn has a result (the tool's output, or
    an explicit interrupted result) in the context replay builds at the
    turn's end (``storage/pairing.py``'s rule: calls of an incomplete reply
    need none), or, for one still open there (a turn an older turnkeeper
    ended), right after it on a branch on from the turn's end (the
    ``tools.interrupt`` that closed it after the upgrade); and a
    tool-execution record still running belongs to a run that has not
    ended. (A call on a branch the turn left, or a record whose
    call never reached the transcript, is in no context and needs no result.)"""
    turns = query_rows(
        store,
        f"WITH {scope.cte()} SELECT session_id, id, start_seq, end_seq FROM conversation_turns "
        f"WHERE end_seq IS NOT NULL AND {scope.sessions_in('session_id')}",
        scope.params(),
    )
    bad: list[str] = []
    checked = 0
    kids: dict[str, dict[str, list[Entry]]] = {}
    for turn in turns:
        by_id = trees.get(turn["session_id"], {})
        children = kids.get(turn["session_id"])
        if children is None:
            children = kids[turn["session_id"]] = {}
            for e in by_id.values():
                if e.parent_id is not None:
                    children.setdefault(e.parent_id, []).append(e)
        end = next((e for e in by_id.values() if e.seq == turn["end_seq"]), None)
        path = path_to(by_id, end.id if end is not None else None)
        in_turn = {e.id for e in path if turn["start_seq"] <= e.seq <= turn["end_seq"]}
        checked += sum(
            len(calls_of(m))
            for e in path
            if e.id in in_turn and (m := context_message(e)) is not None
        )
        for call_id, holder in unanswered_calls(path, children):
            if holder in in_turn:
                bad.append(f"call {turn['session_id']}/{holder}:{call_id}")
    sql = f"""
    WITH {scope.cte()}
    SELECT 'record ' || r.execution_key AS record,
           r.state = 'running' AND u.status IN {_TERMINAL_SQL} AS stuck
    FROM tool_executions r LEFT JOIN runs u ON u.id = r.run_id
    WHERE {scope.sessions_in("r.session_id")}
    """
    records = query_rows(store, sql, scope.params())
    checked += len(records)
    bad += [r["record"] for r in records if r["stuck"]]
    return Check(
        "tool_calls_paired",
        "every tool call of an ended turn has a result, and no record runs past its run",
        len(bad),
        checked,
        sample(sorted(bad)),
    )


def check_tool_results_in_context(trees: dict[str, dict[str, Entry]]) -> Check:
    """Along every branch of every session tree, every entry keeps the replayed
    context valid for a model provider, judged by the very rule every write
    path enforces (``storage/pairing.py``, ``tree_faults``): each result
    answers a call in its context, once, right after the call's assistant
    message; no other message follows calls before their results; no
    compaction keeps a fault (a result cut from its call). So a state the
    writes refuse is exactly a state this check flags; one can only be stored
    by going around the store (raw SQL, a file edited in place)."""
    bad: set[str] = set()
    checked = 0
    for sid, by_id in trees.items():
        checked += sum(1 for e in by_id.values() if context_message(e) is not None)
        for f in tree_faults(by_id):
            where = f" (compaction {f.entry_id})" if f.entry_id != f.message_id else ""
            bad.add(f"{sid}/{f.message_id}: {f.reason} {f.tool_call_id!r}{where}")
    return Check(
        "tool_results_in_context",
        "every message keeps its replayed context valid: each tool call answered once, "
        "right after it",
        len(bad),
        checked,
        sample(sorted(bad)),
    )


def run_checks(store: Snapshot, scope: Scope) -> list[Check]:
    """Every check of this module."""
    trees, payloads = _trees(store, scope)
    return [
        payloads,
        check_one_active_run(store, scope),
        check_no_revival(store, scope),
        check_delivered_once(store, scope),
        check_tool_calls_paired(store, scope, trees),
        check_tool_results_in_context(trees),
    ]
