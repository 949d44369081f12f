"""Deleting sessions (session seed DeleteSession).

A delete removes, in one transaction, everything turnkeeper stores *of* the
session (:data:`REMOVED`): its row and entries, opaque import lines,
execution intents, runs, run events, submissions, conversation turns, orphan
recoveries and their events, response lineage, delivery intents with their
operations and events, tool-execution records with their events, its
metadata, and the record of the fork that made it (when it is a fork). It
writes one ``deleted_sessions`` row in their place: counts and times, no
content (:class:`~turnkeeper.spec.records.DeletedSession`).

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

from collections.abc import Sequence
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import DeletedSession, Lease

from ..backend import STORE_NOW, Tx, utc
from ..codec import check_id
from ..validate import check_session_lease
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
    ("opaque_records", "session_id = ?"),
    ("session_metadata", "session_id = ?"),
    ("session_forks", "fork_session_id = ?"),
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


def delete(tx: Tx, session_id: str, lease: Lease | None, reason: str) -> DeletedSession:
    """Delete session ``session_id`` (see the module docstring) inside ``tx``.

    ``lease``: the session's lease (fenced), else nobody may hold a live one.

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError, SessionRunActiveError.
    """
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


# -- the store's methods ------------------------------------------------------------


class DeletesPart(Area):
    """``store.sessions.delete`` and ``store.sessions.deleted``."""

    _branches: BranchCache

    def _forget(self, session_id: str) -> None:
        """Drop this store object's caches of a deleted session."""
        self._branches.drop(session_id)
        self._openings.put(session_id, None)

    def delete(self, session_id: str, *, lease: Lease | None = None) -> DeletedSession:
        """Delete the session and everything stored of it, in one transaction
        (session seed DeleteSession). A session write: under the session's
        ``lease``, or only while nobody holds a live lease on it.

        Removed: the session row, its entries (every branch), opaque import
        lines, execution intents, runs, run events, submissions, conversation
        turns, orphan recoveries and their events, response lineage, delivery
        intents, operations and their events, tool-execution records and their
        events, its metadata (project, pinned), and the record of the fork
        that made it. Kept: one ``deleted_sessions`` row (returned: counts and
        times, no content), the lease rows and lease/fence events of
        ``session:<id>``, and the records of forks made *from* it (a fork is a
        copy of its own and survives its source; ``store.forks.get`` still
        returns its record, whose ``source_session_id`` no longer exists). The
        id is never reused (``SessionIDExistsError`` on a create, import or
        fork into it).

        Raises:
            SessionNotFoundError: no session has this id (a second delete too).
            BusyError: no ``lease`` given and a live lease holds the session.
            LeaseLostError: ``lease`` is no longer the held, unexpired one.
            SessionRunActiveError: a run of the session is not terminal
                (``run_id`` names it); finish or recover it first.
            InvalidInputError: a bad id, or a lease on another target.
        """
        check_id(session_id, "session_id")
        check_session_lease(session_id, lease)
        done = self._fenced(
            "delete_session", lease, lambda tx: delete(tx, session_id, lease, "delete")
        )
        self._forget(session_id)
        return done

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
