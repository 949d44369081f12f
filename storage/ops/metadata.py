"""A session's metadata (session seed Get/SetSessionMetadata): its project and pin."""

from __future__ import annotations

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import Lease, SessionMetadata

from ..backend import STORE_NOW, Tx
from ..codec import check_id
from ..validate import check_session_lease
from . import leases
from .base import Area


def get(tx: Tx, session_id: str) -> SessionMetadata:
    """The session's metadata (the defaults when it has no row).

    Raises:
        SessionNotFoundError.
    """
    row = tx.one(
        "SELECT s.id, m.project_id, m.pinned FROM sessions s "
        "LEFT JOIN session_metadata m ON m.session_id = s.id WHERE s.id = ?",
        [session_id],
    )
    if row is None:
        raise errors.SessionNotFoundError(session_id)
    return SessionMetadata(project_id=row[1], pinned=bool(row[2]))


def lock_project(tx: Tx, project_id: str) -> None:
    """Write project ``project_id``'s row (to its own values), so that a
    concurrent delete of it conflicts with this transaction.

    Raises:
        ProjectNotFoundError.
    """
    if tx.count("UPDATE projects SET updated_at = updated_at WHERE id = ?", [project_id]) == 0:
        raise errors.ProjectNotFoundError(project_id)


def put(tx: Tx, session_id: str, metadata: SessionMetadata, lease: Lease | None) -> SessionMetadata:
    """Store ``metadata`` as the session's.

    Raises:
        SessionNotFoundError, ProjectNotFoundError, LeaseLostError, BusyError.
    """
    if tx.one("SELECT 1 FROM sessions WHERE id = ?", [session_id]) is None:
        raise errors.SessionNotFoundError(session_id)
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    if metadata.project_id is not None:
        lock_project(tx, metadata.project_id)
    tx.exec(
        "INSERT INTO session_metadata (session_id, project_id, pinned, updated_at) "
        f"VALUES (?, ?, ?, {STORE_NOW}) ON CONFLICT (session_id) DO UPDATE SET "
        "project_id = excluded.project_id, pinned = excluded.pinned, "
        "updated_at = excluded.updated_at",
        [session_id, metadata.project_id, metadata.pinned, tx.now],
    )
    return SessionMetadata(project_id=metadata.project_id, pinned=metadata.pinned)


class MetadataPart(Area):
    """``store.sessions.get_metadata`` and ``store.sessions.set_metadata``."""

    def get_metadata(self, session_id: str) -> SessionMetadata:
        """The session's metadata (session seed GetSessionMetadata): its
        project (``None``: none) and whether it is pinned; a session never
        given any has ``SessionMetadata()`` (no project, not pinned).

        Raises:
            SessionNotFoundError: no session has this id.
            InvalidInputError: a bad id.
        """
        check_id(session_id, "session_id")
        return self.db.read("get_session_metadata", lambda tx: get(tx, session_id))

    def set_metadata(
        self, session_id: str, metadata: SessionMetadata, *, lease: Lease | None = None
    ) -> SessionMetadata:
        """Replace the session's metadata with ``metadata`` and return it
        (session seed SetSessionMetadata): ``project_id`` must name a project
        of ``store.projects`` (``None``: move it out of its project). A
        session write: under the session's ``lease``, or only while nobody
        holds a live lease on it.

        Raises:
            SessionNotFoundError: no session has this id.
            ProjectNotFoundError: ``metadata.project_id`` names no project.
            BusyError: no ``lease`` given and a live lease holds the session.
            LeaseLostError: ``lease`` is no longer the held, unexpired one.
            InvalidInputError: a bad id, metadata, or a lease on another target.
        """
        check_id(session_id, "session_id")
        if not isinstance(metadata, SessionMetadata):
            raise errors.InvalidInputError("metadata", "expected a SessionMetadata")
        if metadata.project_id is not None:
            check_id(metadata.project_id, "metadata.project_id")
        if not isinstance(metadata.pinned, bool):
            raise errors.InvalidInputError("metadata.pinned", "expected a bool")
        check_session_lease(session_id, lease)
        return self._fenced(
            "set_session_metadata", lease, lambda tx: put(tx, session_id, metadata, lease)
        )
