"""Deleting sessions (session seed DeleteSession) and retention by age or count.

A delete removes, in one transaction, everything turnkeeper stores *of* the
session (:data:`REMOVED`): its row and entries, opaque import lines,
execution intents, runs, run events, submissions, conversation turns, orphan
recoveries and their events, response lineage, response archives (runs,
turns, items), delivery intents with their operations and events,
tool-execution records with their events, its ledger (records, tip, catalog
entry and the blobs in the database's blob table, of
every tenant), its metadata, capability state and
events, guidance, input resource events, usage records, its channel tool
selection, its channel binding (the channel identity is free for another
session afterwards), and the record of the fork that made it (when it is a
fork). It
writes one ``deleted_sessions`` row in their place: counts and times, no
content (:class:`~turnkeeper.spec.records.DeletedSession`). A session's
sub-agent sessions are part of it: they go with it, in the same transaction,
each refused as the session would be (held, or a run not terminal).

What stays (:data:`KEPT`): the lease rows and lease/fence events of
``session:<id>`` (owners, epochs, times: an epoch never restarts, so a stale
lease from before the delete stays fenced out), the fork records whose
*source* it was (each fork is a copy of its own and survives its source; its
record names a source that no longer exists), and thread records (the
threadstore's own area). A deleted id is never reused: creating, importing
or forking into it raises ``SessionIDExistsError`` (every store object caches
a session by its head, which a new session of the same id could reach with
other content).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import DeletedSession, Lease, RetentionReport

from ..backend import STORE_NOW, Tx, utc
from ..codec import check_id
from ..validate import check_int, check_lease, check_session_lease
from . import leases
from .base import Area
from .replays import BranchCache

NON_TERMINAL = ("admitted", "running", "waiting")
"""Run statuses that refuse a delete (``SessionRunActiveError``)."""

REMOVED: tuple[tuple[str, str], ...] = (
    # rows found through another table's rows of the session: before those
    ("recovery_events", "run_id IN (SELECT id FROM runs WHERE session_id = ?)"),
    (
        "delivery_events",
        "intent_id IN (SELECT id FROM delivery_intents WHERE session_id = ?)",
    ),
    (
        "delivery_operations",
        "intent_id IN (SELECT id FROM delivery_intents WHERE session_id = ?)",
    ),
    ("delivery_intents", "session_id = ?"),
    ("tool_execution_events", "session_id = ?"),
    ("tool_executions", "session_id = ?"),
    ("run_recoveries", "session_id = ?"),
    ("run_events", "session_id = ?"),
    ("active_runs", "session_id = ?"),
    ("submissions", "session_id = ?"),
    ("conversation_turns", "session_id = ?"),
    ("runs", "session_id = ?"),
    ("execution_intents", "session_id = ?"),
    ("response_states", "session_id = ?"),
    ("response_runs", "session_id = ?"),
    ("response_turns", "session_id = ?"),
    ("response_items", "session_id = ?"),
    ("opaque_records", "session_id = ?"),
    ("import_sources", "session_id = ?"),
    ("session_metadata", "session_id = ?"),
    ("session_capabilities", "session_id = ?"),
    ("capability_events", "session_id = ?"),
    ("esm_guidance", "session_id = ?"),
    ("input_resource_events", "session_id = ?"),
    ("event_cursors", "session_id = ?"),
    ("usage_records", "session_id = ?"),
    ("channel_tools", "session_id = ?"),
    ("channel_bindings", "session_id = ?"),
    ("session_forks", "fork_session_id = ?"),
    ("ledger_records", "session_id = ?"),
    ("ledger_tips", "session_id = ?"),
    ("ledger_catalog", "session_id = ?"),
    ("ledger_blobs", "session_id = ?"),
    ("ledger_blob_condemned", "session_id = ?"),
    ("replay_snapshots", "session_id = ?"),
    ("session_keys", "session_id = ?"),
    ("entries", "session_id = ?"),
    ("sessions", "id = ?"),
)
"""Every table holding rows of a session, and the condition naming them (one
parameter: the session id), in the order a delete removes them."""

KEPT = {
    "leases": "epochs never restart: a stale lease stays fenced out",
    "lease_events": "lease history (owners, epochs, times), no content",
    "fence_events": "refused writes (owner, epoch, operation name), no content",
    "session_forks": "the records of forks *of* the session: each fork survives its source",
    "thread_records": "the threadstore's records, keyed by the host's keys",
    "thread_record_events": "the threadstore's history",
    "active_thread_keys": "the threadstore's key bindings",
    "projects": "projects are not a session's (store.projects.delete removes one)",
    "deleted_sessions": "the delete's own aggregate row",
    "schema_migrations": "the schema",
    "store_encryption": "the store's marker that it is encrypted, no content",
}
"""Tables a session delete leaves alone, and why (a test holds REMOVED and KEPT
to every table of the schema)."""

_COUNTS = (
    "SELECT (SELECT count(*) FROM entries WHERE session_id = ?), "
    "(SELECT count(*) FROM runs WHERE session_id = ?), "
    "(SELECT count(*) FROM run_events WHERE session_id = ?), "
    "(SELECT count(*) FROM tool_executions WHERE session_id = ?), "
    "(SELECT count(*) FROM delivery_operations WHERE intent_id IN "
    "(SELECT id FROM delivery_intents WHERE session_id = ?))"
)

HEAD = "updated_at, next_seq, event_seq"
"""What a retention pass remembers of a session it chose: written since (a
transcript write moves ``updated_at`` and ``next_seq``, a run event
``event_seq``), the session is kept."""

_DELETED_COLS = (
    "session_id, reason, created_at, last_updated_at, deleted_at, entries, runs, run_events, "
    "tool_executions, delivery_operations, lease_epoch"
)


def deleted_row(row: Sequence[Any]) -> DeletedSession:
    return DeletedSession(
        session_id=row[0],
        reason=row[1],
        created_at=utc(row[2]),
        last_updated_at=utc(row[3]),
        deleted_at=utc(row[4]),
        entries=int(row[5]),
        runs=int(row[6]),
        run_events=int(row[7]),
        tool_executions=int(row[8]),
        delivery_operations=int(row[9]),
        lease_epoch=None if row[10] is None else int(row[10]),
    )


def refuse_deleted(tx: Tx, session_id: str) -> None:
    """Refuse a new session under the id of a deleted one.

    Raises:
        SessionIDExistsError: ``session_id`` was deleted (``detail`` says so).
    """
    if tx.one("SELECT 1 FROM deleted_sessions WHERE session_id = ?", [session_id]) is not None:
        raise errors.SessionIDExistsError(
            session_id, detail="a deleted session's id is never reused"
        )


def delete(
    tx: Tx,
    session_id: str,
    lease: Lease | None,
    reason: str,
    held: Mapping[str, Lease] | None = None,
) -> list[DeletedSession]:
    """Delete session ``session_id`` (see the module docstring) and its
    sub-agent sessions, theirs after each (with the same ``reason``), inside ``tx``;
    returns what remains of each, the session's first.

    ``lease``: the session's lease (fenced), else nobody may hold a live one.
    ``held``: leases by target for the sub-agents (each fenced), else nobody
    may hold a live one on a sub-agent either.

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError, SessionRunActiveError
        (for a sub-agent too: its id in the error).
    """
    done = [_delete_one(tx, session_id, lease, reason)]
    children = tx.rows(
        "SELECT id FROM sessions WHERE sub_agent_of = ? ORDER BY id", [done[0].session_id]
    )
    for (child,) in children:
        done += delete(tx, child, (held or {}).get(session_target(child)), reason, held)
    return done


def _delete_one(tx: Tx, session_id: str, lease: Lease | None, reason: str) -> DeletedSession:
    row = tx.one("SELECT created_at, updated_at FROM sessions WHERE id = ?", [session_id])
    if row is None:
        raise errors.SessionNotFoundError(session_id)
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    active = tx.one(
        "SELECT id FROM runs WHERE session_id = ? AND status IN (?, ?, ?) ORDER BY id LIMIT 1",
        [session_id, *NON_TERMINAL],
    )
    if active is not None:
        raise errors.SessionRunActiveError(session_id, active[0])
    counts = tx.one(_COUNTS, [session_id] * 5)
    assert counts is not None  # one row of scalar subqueries
    for table, condition in REMOVED:
        tx.exec(f"DELETE FROM {table} WHERE {condition}", [session_id])
    out = tx.one(
        f"INSERT INTO deleted_sessions ({_DELETED_COLS}) "
        f"VALUES (?, ?, ?, ?, {STORE_NOW}, ?, ?, ?, ?, ?, ?) RETURNING {_DELETED_COLS}",
        [
            session_id,
            reason,
            row[0],
            row[1],
            tx.now,
            *counts,
            None if lease is None else lease.epoch,
        ],
    )
    assert out is not None  # the row just inserted
    return deleted_row(out)


MAX_AGE_S = 1e10
"""The largest ``max_age_s`` (about 317 years): what every backend's
timestamp arithmetic holds."""


class Changed(Exception):
    """A session a retention pass chose was written after it chose it (kept)."""


_FAMILIES = (
    "WITH RECURSIVE fam(root, id) AS ("
    "SELECT id, id FROM sessions "
    "WHERE sub_agent_of IS NULL OR sub_agent_of NOT IN (SELECT id FROM sessions) "
    "UNION ALL SELECT f.root, s.id FROM sessions s JOIN fam f ON s.sub_agent_of = f.id)"
)
"""Each session with its root: a user's session is its own root, a sub-agent's
is the session it was made under (through its parent's parent …). A
retention pass judges a family whole: its sub-agents go with the root."""


def _family_heads(tx: Tx, root: str) -> tuple[tuple[Any, ...], ...]:
    """The :data:`HEAD` of every session of ``root``'s family, by id (empty
    when ``root`` is gone)."""
    rows = tx.rows(
        f"{_FAMILIES} SELECT s.id, {', '.join('s.' + c.strip() for c in HEAD.split(','))} "
        "FROM fam f JOIN sessions s ON s.id = f.id WHERE f.root = ? ORDER BY s.id",
        [root],
    )
    return tuple(tuple(r) for r in rows)


def _retain_one(
    tx: Tx, *, session_id: str, expect: tuple[Any, ...], lease: Lease
) -> list[DeletedSession]:
    leases.fence(tx, lease)
    heads = _family_heads(tx, session_id)
    if not heads:
        raise errors.SessionNotFoundError(session_id)
    if heads != expect:
        raise Changed(session_id)
    return delete(tx, session_id, None, "retention")


def _choose(
    tx: Tx, max_age_s: float | None, keep_last: int | None, limit: int
) -> list[tuple[str, tuple[Any, ...]]]:
    """The families a retention pass deletes, oldest first: each root session
    (no sub-agent) with the :data:`HEAD` of every session of its family. A
    family's age and rank are its most recently written session's."""
    conditions = []
    params: list[Any] = []
    if max_age_s is not None:
        conditions.append(f"updated_at < {STORE_NOW} - ?::INTERVAL")
        params += [tx.now, timedelta(seconds=max_age_s)]
    if keep_last is not None:
        conditions.append("newest > ?")
        params.append(keep_last)
    rows = tx.rows(
        f"{_FAMILIES}, agg AS (SELECT f.root AS id, max(s.updated_at) AS updated_at "
        "FROM fam f JOIN sessions s ON s.id = f.id GROUP BY f.root) "
        "SELECT id FROM (SELECT id, updated_at, "
        "row_number() OVER (ORDER BY updated_at DESC, id DESC) AS newest FROM agg) AS s "
        f"WHERE {' AND '.join(conditions)} ORDER BY updated_at, id LIMIT ?",
        [*params, limit],
    )
    return [(r[0], _family_heads(tx, r[0])) for r in rows]


# -- the store's methods ------------------------------------------------------------


class DeletesPart(Area):
    """``store.sessions.delete``, ``store.sessions.deleted`` and ``store.sessions.retain``."""

    _branches: BranchCache

    def _forget(self, session_id: str) -> None:
        """Drop this store object's caches of a deleted session."""
        self._branches.drop(session_id)
        self._openings.put(session_id, None)
        self.db.keyring.forget(session_id)

    def delete(self, session_id: str, *, lease: Lease | None = None) -> DeletedSession:
        """Delete the session and everything stored of it, in one transaction
        (session seed DeleteSession). A session write: under the session's
        ``lease``, or only while nobody holds a live lease on it.

        Removed: the session row, its entries (every branch), opaque import lines,
        execution intents, runs, run events, submissions, conversation turns, orphan
        recoveries and their events, response lineage, delivery intents, operations and
        their events, tool-execution records and their events, its metadata (project,
        pinned), its channel binding (the channel identity is free afterwards:
        ``store.bindings``) and channel tool selection, and the record of the fork that
        made it. Kept: one ``deleted_sessions`` row (returned: counts and times, no
        content), the lease rows and lease/fence events of ``session:<id>``, and the
        records of forks made *from* it (a fork is a copy of its own and survives its
        source; ``store.forks.get`` still returns its record, whose
        ``source_session_id`` no longer exists). The id is never reused
        (``SessionIDExistsError`` on a create, import or fork into it). Its
        sub-agent sessions (``new_sub_agent``), and theirs, are deleted with it in the
        same transaction, each leaving its own ``deleted_sessions`` row (the same
        ``reason``); returned is the session's (``deleted(id)`` reads a sub-agent's).

        Raises:
            SessionNotFoundError: no session has this id (a second delete too).
            BusyError: no ``lease`` given and a live lease holds the session,
                or a live lease holds one of its sub-agents (its target named).
            LeaseLostError: ``lease`` is no longer the held, unexpired one.
            SessionRunActiveError: a run of the session or of a sub-agent is
                not terminal (``session_id`` and ``run_id`` name it); finish or
                recover it first. Refused, nothing is deleted.
            InvalidInputError: a bad id, or a lease on another target.
        """
        check_id(session_id, "session_id")
        check_session_lease(session_id, lease)
        try:
            done = self._fenced(
                "delete_session", lease, lambda tx: delete(tx, session_id, lease, "delete")
            )
        except BaseException:
            self._forget_unsure(session_id)
            raise
        for gone in done:
            self._forget(gone.session_id)
        return done[0]

    def _forget_unsure(self, session_id: str) -> None:
        """Drop this store object's caches of a session whose delete failed: it
        may have committed all the same (an error at ``COMMIT``: the caller
        cannot tell), and its data key must not outlive its key rows in memory
        (crypto-shredding). A session still there loses only re-derivable caches."""
        self._forget(session_id)

    def deleted(self, session_id: str) -> DeletedSession | None:
        """What remains of a deleted session (its ``deleted_sessions`` row), or
        ``None`` when no session of this id was deleted."""
        check_id(session_id, "session_id")
        row = self.db.read(
            "get_deleted_session",
            lambda tx: tx.one(
                f"SELECT {_DELETED_COLS} FROM deleted_sessions WHERE session_id = ?",
                [session_id],
            ),
        )
        return None if row is None else deleted_row(row)

    def retain(
        self,
        lease: Lease,
        *,
        max_age_s: float | None = None,
        keep_last: int | None = None,
        limit: int = 1000,
    ) -> RetentionReport:
        """Delete whole sessions by age or count (retention), under ``lease``.

        A session is chosen when it was last written (its ``updated_at``) more
        than ``max_age_s`` seconds before the store's now (if given) and is
        not among the ``keep_last`` most recently written sessions (if
        given); at least one of the two is required. At most ``limit`` are
        chosen, oldest first. Each is then deleted as :meth:`delete` deletes
        it (``reason`` ``"retention"``), in a transaction of its own that
        fences ``lease`` (any target, e.g. ``"retention:main"``: one pass at a
        time) and checks again that nobody holds the session, no run of it is
        active, and it was not written since it was chosen; a session failing
        one is kept and reported (``RetentionReport.skipped``). A session is
        deleted whole or not at all, so every session left replays as before.
        When ``lease`` is lost the pass stops, reporting what it removed
        (``lease_lost``). Sub-agent sessions are judged with their session: a
        session and its sub-agents (and theirs) count as one, written when the
        last of them was, never chosen apart, and kept whole when any of them
        was written since the pass chose them; a removed family is reported
        session by session, the root first.

        Raises:
            InvalidInputError: neither bound given, a bound out of range (a
                negative one, ``max_age_s`` above :data:`MAX_AGE_S` or not a
                number), a bad lease.
            LeaseLostError: ``lease`` is not the held, unexpired one at the start.
        """
        check_lease(lease)
        if max_age_s is None and keep_last is None:
            raise errors.InvalidInputError("max_age_s", "give max_age_s, keep_last or both")
        if max_age_s is not None and (
            isinstance(max_age_s, bool)
            or not isinstance(max_age_s, int | float)
            or not 0 <= max_age_s <= MAX_AGE_S
        ):
            raise errors.InvalidInputError("max_age_s", f"expected seconds from 0 to {MAX_AGE_S:g}")
        if keep_last is not None:
            check_int(keep_last, "keep_last", 0)
        check_int(limit, "limit", 1)
        self._fenced("validate_retention_lease", lease, lambda tx: leases.fence(tx, lease))
        chosen = self.db.read(
            "retention_candidates",
            lambda tx: _choose(tx, max_age_s, keep_last, limit),
            snapshot=True,
        )
        removed: list[DeletedSession] = []
        skipped: dict[str, str] = {}
        for session_id, expect in chosen:
            try:
                done = self._fenced(
                    "retain_session",
                    lease,
                    partial(_retain_one, session_id=session_id, expect=expect, lease=lease),
                )
            except errors.LeaseLostError:
                return RetentionReport(removed, skipped, lease_lost=True)
            except errors.BusyError:
                skipped[session_id] = "busy"
                continue
            except errors.SessionRunActiveError:
                skipped[session_id] = "active"
                continue
            except Changed:
                skipped[session_id] = "changed"
                continue
            except errors.SessionNotFoundError:
                skipped[session_id] = "gone"
                continue
            except BaseException:  # an error at COMMIT: the delete may have committed
                self._forget_unsure(session_id)
                raise
            for gone in done:
                self._forget(gone.session_id)
            removed += done
        return RetentionReport(removed, skipped)
