"""``store.guidance``: guidance queued for a session's runtime (session seed
SaveESMGuidance, ListESMGuidance, ConsumeESMGuidance).

Saving guidance is a request addressed to the session's holder, as a cancel
request is: anyone may queue it while a runtime holds the session (outside
the session-write rule, storage/protocol.py). Consuming it is the runtime's
own session write: under the session's lease, or while nobody holds one.
A guidance id is the caller's, so saving the same guidance again (a retry
after an unknown commit) writes nothing; another guidance under a used id is
``GuidanceConflictError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import Guidance, Lease

from ..backend import Tx, utc
from ..codec import check_id, check_instant, check_text
from ..validate import check_limit, check_session_lease
from . import leases, sealed_json
from .base import Area
from .capabilities import session_exists

_COLS = (
    "id",
    "session_id",
    "objective_version",
    "guidance",
    "status",
    "created_at",
    "consumed_at",
)
_STATUSES = ("pending", "consumed")


GUIDANCE = "guidance"
"""The field name guidance text is sealed under (``esm_guidance.guidance``)."""


def _row(tx: Tx, row: Sequence[Any]) -> Guidance:
    """A stored row as guidance, its text opened when sealed (record id: its id).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: see ``sealed_json.open_text``.
    """
    named = dict(zip(_COLS, row, strict=True))
    named[GUIDANCE] = sealed_json.open_text(
        tx, named["session_id"], named["id"], GUIDANCE, named[GUIDANCE]
    )
    named["created_at"] = utc(named["created_at"])
    if named["consumed_at"] is not None:
        named["consumed_at"] = utc(named["consumed_at"])
    return Guidance(**named)


def save(tx: Tx, g: Guidance) -> Guidance:
    """Queue ``g`` (pending); the same guidance again returns what is stored.

    Raises:
        SessionNotFoundError, GuidanceConflictError.
    """
    version = sealed_json.session_version(tx, g.session_id)
    # No lease (guidance is queued while a run holds the session), but the
    # session's row is written all the same: a concurrent delete then
    # conflicts with this save and, retried, deletes the guidance too.
    leases.touch_session(tx, session_target(g.session_id))
    found = tx.one(f"SELECT {', '.join(_COLS)} FROM esm_guidance WHERE id = ?", [g.id])
    if found is not None:
        stored = _row(tx, found)
        same = (stored.session_id, stored.objective_version, stored.guidance) == (
            g.session_id,
            g.objective_version,
            g.guidance,
        )
        if not same or (g.created_at is not None and g.created_at != stored.created_at):
            raise errors.GuidanceConflictError(g.id, stored.session_id)
        return stored
    created = g.created_at or tx.now
    tx.exec(
        f"INSERT INTO esm_guidance ({', '.join(_COLS)}) VALUES (?, ?, ?, ?, 'pending', ?, NULL)",
        [
            g.id,
            g.session_id,
            g.objective_version,
            sealed_json.seal_one(tx, g.session_id, g.id, GUIDANCE, g.guidance, version),
            created,
        ],
    )
    return Guidance(g.id, g.session_id, g.guidance, g.objective_version, "pending", created)


def listed(tx: Tx, session_id: str, status: str, limit: int | None) -> list[Guidance]:
    session_exists(tx, session_id)
    where, params = "session_id = ?", [session_id]
    if status:
        where, params = where + " AND status = ?", [*params, status]
    bound = "" if limit is None else f" LIMIT {int(limit)}"
    rows = tx.rows(
        f"SELECT {', '.join(_COLS)} FROM esm_guidance WHERE {where} ORDER BY created_at, id{bound}",
        params,
    )
    return [_row(tx, r) for r in rows]


def consume(tx: Tx, session_id: str, ids: Sequence[str], lease: Lease | None) -> int:
    """Mark the session's pending guidance among ``ids`` consumed; returns how
    many it marked (already consumed ones and other sessions' ids are left)."""
    session_exists(tx, session_id)
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    marked = 0
    for guidance_id in dict.fromkeys(ids):
        marked += tx.count(
            "UPDATE esm_guidance SET status = 'consumed', consumed_at = ? "
            "WHERE id = ? AND session_id = ? AND status = 'pending'",
            [tx.now, guidance_id, session_id],
        )
    return marked


# -- the store's methods ------------------------------------------------------------


class GuidanceQueue(Area):
    """``store.guidance``: see the module docstring."""

    def save(self, guidance: Guidance) -> Guidance:
        """Queue guidance for the session's runtime, pending until consumed
        (session seed SaveESMGuidance); returns it as stored. Saving the same
        guidance again (same id, session, text and objective version) returns
        the stored one and writes nothing. A request addressed to the
        session's holder: allowed while a runtime holds the session.

        Raises:
            SessionNotFoundError: no such session.
            GuidanceConflictError: the id names other guidance (fields
                ``guidance_id``, ``session_id``).
            InvalidInputError: not a Guidance, a bad id, empty guidance text,
                a status other than pending, a naive ``created_at``.
        """
        if not isinstance(guidance, Guidance):
            raise errors.InvalidInputError("guidance", "expected a Guidance")
        check_id(guidance.id, "id")
        check_id(guidance.session_id, "session_id")
        check_text(guidance.guidance, "guidance", allow_empty=False)
        check_text(guidance.objective_version, "objective_version")
        if guidance.status != "pending" or guidance.consumed_at is not None:
            raise errors.InvalidInputError("status", "new guidance is pending")
        if guidance.created_at is not None:
            check_instant(guidance.created_at, "created_at")
        return self.db.write("save_guidance", lambda tx: save(tx, guidance))

    def list(
        self, session_id: str, *, status: str = "", limit: int | None = None
    ) -> list[Guidance]:
        """The session's guidance, oldest first (session seed ListESMGuidance):
        all of it, or only ``status`` (``"pending"``, ``"consumed"``), at most
        ``limit`` (``None``: all).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad id, an unknown status, a ``limit`` below 1.
        """
        check_id(session_id, "session_id")
        if status not in ("", *_STATUSES):
            raise errors.InvalidInputError("status", f"must be one of {', '.join(_STATUSES)}")
        if limit is not None:
            check_limit(limit)
        return self.db.read("list_guidance", lambda tx: listed(tx, session_id, status, limit))

    def consume(self, session_id: str, ids: Sequence[str], *, lease: Lease | None = None) -> int:
        """Mark the session's pending guidance ``ids`` consumed, now (session seed
        ConsumeESMGuidance); returns how many were pending and are now
        consumed (consuming again is a no-op, so a retry is safe). A session
        write: under the session's ``lease``, or while nobody holds it.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad session id or guidance id, ``ids`` not a list.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        On any error nothing is written.
        """
        check_id(session_id, "session_id")
        if isinstance(ids, str) or not isinstance(ids, Sequence):
            raise errors.InvalidInputError("ids", "expected a list of guidance ids")
        for guidance_id in ids:
            check_id(guidance_id, "ids")
        check_session_lease(session_id, lease)
        return self._fenced(
            "consume_guidance", lease, lambda tx: consume(tx, session_id, list(ids), lease)
        )
