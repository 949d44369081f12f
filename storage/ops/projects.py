"""``store.projects``: projects that group sessions (session seed CreateProject,
ListProjects, RenameProject, DeleteProject).

A project is an id and a display name. A session belongs to at most one
project, through its metadata (``store.sessions.set_metadata``, session seed
SessionMetadata.ProjectID); a project's sessions are those whose metadata
names it. Deleting a project deletes its sessions with it, each as
``store.sessions.delete`` deletes one, all in one transaction: refused as a
whole while any of them is held or has an active run. A caller who wants to
keep a session moves it out of the project first (``set_metadata`` with
another ``project_id`` or ``None``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import uuid6

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import DeletedSession, Lease, Project

from ..backend import STORE_NOW, Tx, utc
from ..codec import check_id, check_text
from ..validate import check_session_leases
from . import deletes
from .base import Area, Shared
from .replays import BranchCache

_COLS = "id, name, created_at, updated_at"


def project_row(row: Sequence[Any]) -> Project:
    return Project(id=row[0], name=row[1], created_at=utc(row[2]), updated_at=utc(row[3]))


def _name(name: object) -> str:
    text = check_text(name, "name", allow_empty=False)
    if not text.strip():
        raise errors.InvalidInputError("name", "a project's name is not blank")
    return text


def create(tx: Tx, project_id: str, name: str) -> Project:
    if tx.one("SELECT 1 FROM projects WHERE id = ?", [project_id]) is not None:
        raise errors.ProjectExistsError(project_id)
    row = tx.one(
        f"INSERT INTO projects ({_COLS}) VALUES (?, ?, {STORE_NOW}, {STORE_NOW}) RETURNING {_COLS}",
        [project_id, name, tx.now, tx.now],
    )
    assert row is not None  # the row just inserted
    return project_row(row)


def rename(tx: Tx, project_id: str, name: str) -> Project:
    row = tx.one(
        f"UPDATE projects SET name = ?, updated_at = {STORE_NOW} WHERE id = ? RETURNING {_COLS}",
        [name, tx.now, project_id],
    )
    if row is None:
        raise errors.ProjectNotFoundError(project_id)
    return project_row(row)


def delete(tx: Tx, project_id: str, held: dict[str, Lease]) -> list[DeletedSession]:
    """Delete the project and its sessions (module docstring).

    Raises:
        ProjectNotFoundError, and for any of its sessions BusyError,
        LeaseLostError, SessionRunActiveError.
    """
    if tx.count("DELETE FROM projects WHERE id = ?", [project_id]) == 0:
        raise errors.ProjectNotFoundError(project_id)
    sessions = tx.rows(
        "SELECT session_id FROM session_metadata WHERE project_id = ? ORDER BY session_id",
        [project_id],
    )
    done: list[DeletedSession] = []
    for (sid,) in sessions:
        if all(gone.session_id != sid for gone in done):  # not gone with its parent
            done += deletes.delete(tx, sid, held.get(session_target(sid)), "project", held)
    return done


class Projects(Area):
    """``store.projects``: see the module docstring. Not session writes, except
    :meth:`delete`, which deletes sessions under the one session-write rule."""

    def __init__(self, shared: Shared, branches: BranchCache) -> None:
        super().__init__(shared)
        self._branches = branches

    def create(self, name: str, *, project_id: str | None = None) -> Project:
        """Create a project named ``name`` (session seed CreateProject); its id
        is ``project_id``, else a new UUIDv7. Names need not be unique.

        Raises:
            ProjectExistsError: ``project_id`` is taken.
            InvalidInputError: a blank name or a bad id.
        """
        text = _name(name)
        pid = str(uuid6.uuid7()) if project_id is None else check_id(project_id, "project_id")
        return self.db.write("create_project", lambda tx: create(tx, pid, text))

    def get(self, project_id: str) -> Project | None:
        """The project, or ``None`` when there is none."""
        check_id(project_id, "project_id")
        row = self.db.read(
            "get_project",
            lambda tx: tx.one(f"SELECT {_COLS} FROM projects WHERE id = ?", [project_id]),
        )
        return None if row is None else project_row(row)

    def rename(self, project_id: str, name: str) -> Project:
        """Rename the project and return it (session seed RenameProject).

        Raises:
            ProjectNotFoundError: no project has this id.
            InvalidInputError: a blank name or a bad id.
        """
        check_id(project_id, "project_id")
        text = _name(name)
        return self.db.write("rename_project", lambda tx: rename(tx, project_id, text))

    def delete(self, project_id: str, *, leases: Sequence[Lease] = ()) -> list[DeletedSession]:
        """Delete the project and every session in it, in one transaction
        (session seed DeleteProject); returns what remains of each deleted
        session (see ``store.sessions.delete``: the same tables go, the same
        aggregate row stays, with ``reason`` ``"project"``). Each session is
        deleted under its lease in ``leases`` (leases on ``session:<id>``; one
        on a session outside the project is ignored), else only while nobody
        holds a live lease on it.

        Raises:
            ProjectNotFoundError: no project has this id.
            BusyError: a session of it is held and its lease is not in ``leases``.
            LeaseLostError: a lease in ``leases`` is no longer the held one.
            SessionRunActiveError: a run of one of its sessions is not terminal.
            InvalidInputError: a bad id or lease.

        Refused, it deletes nothing: not the project, not any session.
        """
        check_id(project_id, "project_id")
        held = check_session_leases(leases)
        try:
            done = self.db.write("delete_project", lambda tx: delete(tx, project_id, held))
        except errors.LeaseLostError as lost:
            if lost.target in held:
                self._record_fenced(held[lost.target], "delete_project")
            raise
        for gone in done:
            self._branches.drop(gone.session_id)
            self._openings.put(gone.session_id, None)
        return done

    def list(self) -> list[Project]:
        """Every project, oldest first (session seed ListProjects)."""
        rows = self.db.read(
            "list_projects",
            lambda tx: tx.rows(f"SELECT {_COLS} FROM projects ORDER BY created_at, id"),
        )
        return [project_row(r) for r in rows]
