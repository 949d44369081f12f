"""Audit queries over a stored database: the invariants the demo must leave intact.

Each check reads the stored history (``lease_events``, ``entries``,
``thread_records`` …) through :meth:`Snapshot.query`, all of them in one
snapshot of the store, and returns a :class:`Check` with the number of
violations it found and how many things it examined. The checks are scoped
to a list of session ids (their lease targets are ``session:<id>`` and their
thread keys the ids themselves), or to the whole database when the scope is
``None``.

Which times may be compared. The store stamps an entry's ``ts`` and a
lease event's ``occurred_at`` with its clock: inside a transaction, the
clock read after the transaction's snapshot was taken, so a transaction's
stamp is at or after the commit of everything it read (a grant's stamp
follows every event of the epoch it replaced; see ``storage.duck.tx.Tx``).
Single-statement renewals and releases are stamped as their statement
starts. The checks still prefer orders the store serializes outright:
epochs (each grant is a compare-and-set on the lease row) and entry ``seq``
(each append is a compare-and-set on the session row and, with a lease,
also writes the lease row).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from turnkeeper.storage import BaseStore
from turnkeeper.storage.store import Snapshot

from .base import Check, Scope, rows, sample
from .ledger import check_ledger_tips, ledger_checks
from .orphans import check_bindings_agree, check_no_orphans
from .runs import run_checks

GRANTING = "('grant', 'regrant', 'takeover')"
"""SQL list of the lease edges that issue a new epoch."""

EXTENDING = "('grant', 'regrant', 'takeover', 'reacquire', 'renew')"
"""SQL list of the lease edges whose event row carries a new expiry."""

_MARKER = re.compile(r"^\[([^\]]+)\]")


def marker(payload: Mapping[str, Any]) -> str | None:
    """The demo marker of a message entry: ``x`` of a first text block ``[x] …``."""
    message = payload.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    first = content[0] if isinstance(content, list) and content else None
    text = first.get("text") if isinstance(first, Mapping) else None
    found = _MARKER.match(text) if isinstance(text, str) else None
    return found.group(1) if found else None


def check_epochs(store: Snapshot, scope: Scope) -> Check:
    """Per target, the granting events (grant, regrant, takeover) carry epochs 1, 2, 3 …
    with no repeat or gap, every other event names a granted epoch, and the
    ``leases`` row's epoch is the largest granted one.

    The grants are ordered by epoch; :func:`check_grant_order` checks their
    stamps."""
    sql = f"""
    WITH {scope.cte()},
    g AS (
        SELECT target, epoch,
               row_number() OVER (PARTITION BY target ORDER BY epoch, occurred_at) AS rn
        FROM lease_events WHERE edge IN {GRANTING} AND {scope.targets_in("target")}),
    m AS (SELECT target, max(epoch) AS mx FROM g GROUP BY target),
    t AS (SELECT target FROM m UNION SELECT target FROM leases WHERE {scope.targets_in("target")}),
    bad AS (
        SELECT target FROM g WHERE rn <> epoch
        UNION
        SELECT e.target FROM lease_events e
        WHERE {scope.targets_in("e.target")} AND NOT EXISTS
            (SELECT 1 FROM g WHERE g.target = e.target AND g.epoch = e.epoch)
        UNION
        SELECT t.target FROM t LEFT JOIN leases l ON l.target = t.target
        LEFT JOIN m ON m.target = t.target WHERE l.epoch IS DISTINCT FROM m.mx)
    SELECT (SELECT count(*) FROM t) AS checked,
           (SELECT array_agg(target ORDER BY target) FROM bad) AS bad
    """
    row = rows(store, sql, scope.params())[0]
    bad = row["bad"] or []
    return Check(
        "epochs_strictly_increasing",
        "per target, grants carry epochs 1,2,3… once each; the leases row has the max",
        len(bad),
        int(row["checked"]),
        sample(bad),
    )


def check_fenced_entries(store: Snapshot, scope: Scope) -> Check:
    """Every entry written under a lease was written while that lease was the live one.

    For an entry with ``lease_epoch`` e in session s (target ``session:<s>``),
    written at ``ts`` (its ``written_at``: the store's clock at the write, not
    the entry's own timestamp, which a caller may set):

    - e was granted on the target, by an event stamped at or before the
      entry's ``ts`` (the holder acquires before it appends);
    - no entry earlier in the session's ``seq`` order carries a higher
      epoch: once a later grant has written, a lower epoch never writes
      again (the order-based form of "no grant of a higher epoch preceded it");
    - e was not released before ``ts``;
    - the latest expiry e had at ``ts`` (its grant, reacquire or renew
      stamped at or before ``ts``) lies after ``ts``.
    """
    sql = f"""
    WITH {scope.cte()},
    w AS (
        SELECT session_id, id, seq, lease_epoch AS ep, written_at AS ts,
               'session:' || session_id AS target,
               max(lease_epoch) OVER (PARTITION BY session_id ORDER BY seq
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS earlier_max
        FROM entries WHERE lease_epoch IS NOT NULL AND {scope.sessions_in("session_id")}),
    ev AS (
        SELECT target, epoch, edge, occurred_at, expires_at FROM lease_events
        WHERE target IN (SELECT DISTINCT target FROM w)),
    judged AS (
        SELECT w.session_id, w.id,
            EXISTS (SELECT 1 FROM ev WHERE ev.target = w.target AND ev.epoch = w.ep
                    AND ev.edge IN {GRANTING} AND ev.occurred_at <= w.ts) AS granted,
            coalesce(w.earlier_max > w.ep, FALSE) AS superseded,
            EXISTS (SELECT 1 FROM ev WHERE ev.target = w.target AND ev.epoch = w.ep
                    AND ev.edge = 'release' AND ev.occurred_at < w.ts) AS released,
            coalesce((SELECT max(ev.expires_at) FROM ev WHERE ev.target = w.target
                      AND ev.epoch = w.ep AND ev.edge IN {EXTENDING}
                      AND ev.occurred_at <= w.ts) > w.ts, FALSE) AS unexpired
        FROM w)
    SELECT (SELECT count(*) FROM judged) AS checked,
           (SELECT array_agg(session_id || '/' || id ORDER BY session_id, id) FROM judged
            WHERE NOT granted OR superseded OR released OR NOT unexpired) AS bad
    """
    row = rows(store, sql, scope.params())[0]
    bad = row["bad"] or []
    return Check(
        "no_entry_under_lost_lease",
        "leased entries: epoch granted, never below an earlier entry's, not released, unexpired",
        len(bad),
        int(row["checked"]),
        sample(bad),
    )


def check_grant_order(store: Snapshot, scope: Scope) -> Check:
    """Every grant of epoch e + 1 is stamped at or after every event of epoch e.

    A grant reads the previous epoch's final state (released, or expired by
    the clock) and stamps itself after that snapshot, so a grant stamped
    before its predecessor's last event means the predecessor wrote after it
    was replaced, or the store's clock ran backwards."""
    sql = f"""
    WITH {scope.cte()},
    e AS (SELECT target, epoch, edge, occurred_at FROM lease_events
          WHERE {scope.targets_in("target")}),
    last AS (SELECT target, epoch, max(occurred_at) AS t FROM e GROUP BY target, epoch),
    g AS (SELECT * FROM e WHERE edge IN {GRANTING})
    SELECT (SELECT count(*) FROM g) AS checked,
           (SELECT array_agg(g.target || '#' || g.epoch ORDER BY g.target, g.epoch) FROM g JOIN last
              ON last.target = g.target AND last.epoch = g.epoch - 1
            WHERE g.occurred_at < last.t) AS bad
    """
    row = rows(store, sql, scope.params())[0]
    bad = row["bad"] or []
    return Check(
        "grants_follow_prior_epoch",
        "each grant is stamped at or after every event of the epoch it replaced",
        len(bad),
        int(row["checked"]),
        sample(bad),
    )


def check_refused_absent(
    store: Snapshot,
    scope: Scope,
    refused_markers: Sequence[str],
    refused_records: Sequence[str],
) -> Check:
    """Every write a worker saw refused is absent: no message entry carries a refused
    marker and no thread record has a refused record id."""
    refused = set(refused_markers)
    sql = f"""
    WITH {scope.cte()}
    SELECT session_id || '/' || id AS entry, payload FROM entries
    WHERE {scope.sessions_in("session_id")} AND kind = 'message'
    """
    bad = [
        r["entry"]
        for r in rows(store, sql, scope.params())
        if marker(orjson.loads(r["payload"])) in refused
    ]
    found = rows(
        store,
        "SELECT id FROM thread_records WHERE id IN (SELECT unnest(?::VARCHAR[]))",
        [list(refused_records)],
    )
    bad += [r["id"] for r in found]
    return Check(
        "refused_writes_absent",
        "no write a worker saw refused (LeaseLostError) is stored",
        len(bad),
        len(refused_markers) + len(refused_records),
        sample(sorted(bad)),
    )


def check_one_active(store: Snapshot, scope: Scope) -> Check:
    """At most one active thread record per key, and every active record is the one
    ``active_thread_keys`` points at (and every pointer names an active record)."""
    sql = f"""
    WITH {scope.cte()},
    dup AS (
        SELECT 'duplicate:' || key AS bad FROM thread_records
        WHERE status = 'active' AND {scope.keys_in("key")}
        GROUP BY key HAVING count(*) > 1),
    unbound AS (
        SELECT 'unbound:' || r.id AS bad FROM thread_records r
        LEFT JOIN active_thread_keys k ON k.key = r.key AND k.record_id = r.id
        WHERE r.status = 'active' AND {scope.keys_in("r.key")} AND k.key IS NULL),
    dangling AS (
        SELECT 'dangling:' || k.key AS bad FROM active_thread_keys k
        LEFT JOIN thread_records r ON r.id = k.record_id
        WHERE {scope.keys_in("k.key")}
          AND (r.id IS NULL OR r.status <> 'active' OR r.key <> k.key))
    SELECT (SELECT count(DISTINCT key) FROM thread_records
            WHERE {scope.keys_in("key")}) AS checked,
           (SELECT array_agg(bad ORDER BY bad) FROM
               (SELECT bad FROM dup UNION ALL SELECT bad FROM unbound
                UNION ALL SELECT bad FROM dangling) AS every) AS bad
    """
    row = rows(store, sql, scope.params())[0]
    bad = row["bad"] or []
    return Check(
        "one_active_record_per_key",
        "at most one active thread record per key, the one active_thread_keys names",
        len(bad),
        int(row["checked"]),
        sample(bad),
    )


def tree_problems(
    entries: Sequence[tuple[str, str | None, int]],
    leaf_id: str | None,
    entry_count: int,
    next_seq: int,
) -> list[str]:
    """What is wrong with one session's tree; ``entries`` are (id, parent_id, seq).

    Checks: every parent exists in the session (or is NULL), seq values are
    exactly 1..n, the leaf exists (or is NULL), no parent chain loops, and
    the session row's ``entry_count``/``next_seq`` match.
    """
    problems: list[str] = []
    parent = {eid: pid for eid, pid, _ in entries}
    if len(parent) != len(entries):
        problems.append("duplicate entry id")
    seqs = sorted(seq for _, _, seq in entries)
    if seqs != list(range(1, len(entries) + 1)):
        problems.append("seq is not 1..n")
    missing = [eid for eid, pid in parent.items() if pid is not None and pid not in parent]
    if missing:
        problems.append(f"missing parent of {missing[0]}")
    if leaf_id is not None and leaf_id not in parent:
        problems.append(f"leaf {leaf_id} missing")
    if entry_count != len(entries) or next_seq != len(entries) + 1:
        problems.append(f"counts {entry_count}/{next_seq} for {len(entries)} entries")
    done: set[str] = set()
    for start in parent:
        path: list[str] = []
        on_path: set[str] = set()
        node: str | None = start
        while node is not None and node in parent and node not in done:
            if node in on_path:
                problems.append(f"cycle through {node}")
                break
            on_path.add(node)
            path.append(node)
            node = parent[node]
        done.update(path)
        if problems and problems[-1].startswith("cycle"):
            break
    return problems


def check_trees(store: Snapshot, scope: Scope) -> Check:
    """Every session tree in scope is well formed (see :func:`tree_problems`)."""
    head = store.query(
        f"WITH {scope.cte()} SELECT id, leaf_id, entry_count, next_seq FROM sessions "
        f"WHERE {scope.sessions_in('id')} ORDER BY id",
        scope.params(),
    ).to_pydict()
    body = store.query(
        f"WITH {scope.cte()} SELECT session_id, id, parent_id, seq FROM entries "
        f"WHERE {scope.sessions_in('session_id')} ORDER BY session_id, seq",
        scope.params(),
    ).to_pydict()
    by_session: dict[str, list[tuple[str, str | None, int]]] = {}
    for sid, eid, pid, seq in zip(
        body["session_id"], body["id"], body["parent_id"], body["seq"], strict=True
    ):
        by_session.setdefault(sid, []).append((eid, pid, seq))
    bad: list[str] = []
    sessions = head["id"]
    for sid, leaf, count, next_seq in zip(
        sessions, head["leaf_id"], head["entry_count"], head["next_seq"], strict=True
    ):
        problems = tree_problems(by_session.pop(sid, []), leaf, count, next_seq)
        if problems:
            bad.append(f"{sid}: {problems[0]}")
    bad.extend(f"{sid}: entries without a session" for sid in sorted(by_session))
    return Check(
        "session_trees_well_formed",
        "parents exist, seq is 1..n, leaf exists, no cycles, counts match",
        len(bad),
        len(sessions),
        sample(bad),
    )


def run_audit(
    store: BaseStore,
    sessions: Sequence[str] | None = None,
    *,
    refused_markers: Sequence[str] | None = None,
    refused_records: Sequence[str] = (),
) -> list[Check]:
    """Run every check over ``sessions`` (``None``: the whole database).

    ``refused_markers``/``refused_records`` are the demo markers and thread
    record ids of writes that workers saw refused; when ``refused_markers``
    is ``None`` that check is skipped (a stored database alone cannot know
    which writes were refused). Every check reads the same snapshot of the
    store (:meth:`BaseStore.snapshot`), so an audit of a store that other
    processes are writing to sees one consistent state; then the ledger
    checks that replay through ``store.ledger`` (:mod:`.ledger`).
    """
    scope = Scope(sessions)
    checks = store.snapshot(lambda snap: _checks(snap, scope, refused_markers, refused_records))
    return checks + ledger_checks(store, scope)


def _checks(
    store: Snapshot,
    scope: Scope,
    refused_markers: Sequence[str] | None,
    refused_records: Sequence[str],
) -> list[Check]:
    checks = [
        check_epochs(store, scope),
        check_grant_order(store, scope),
        check_fenced_entries(store, scope),
        check_one_active(store, scope),
        check_trees(store, scope),
    ]
    if refused_markers is not None:
        checks.insert(3, check_refused_absent(store, scope, refused_markers, refused_records))

    checks.extend(run_checks(store, scope))
    checks.append(check_no_orphans(store, scope))
    checks.append(check_bindings_agree(store, scope))
    checks.append(check_ledger_tips(store, scope))
    return checks
