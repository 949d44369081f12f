"""Reading runs: one run, a session's active run and its runs, and the run events
by their per-session sequence cursor (session seed GetSessionRun,
ListSessionRunEvents), for a reconnecting client to ask for what it missed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnkeeper.spec.records import (
    Run,
    RunEvent,
)

from ..backend import Tx, utc
from ..codec import check_id, from_json
from ..validate import (
    check_bool,
    check_int,
    check_limit,
)
from . import sealed_json
from .base import Area

EVENT_DATA = "data"
"""The field name a run event's data is sealed under (``run_events.data``)."""

RUN_BASE_COLS = (
    "id, session_id, intent_id, retry_of, attempt, status, cancel_requested, error, "
    "started_at, updated_at, finished_at"
)
"""The columns a run is admitted with."""

RUN_COLS = f"{RUN_BASE_COLS}, usage, context_usage, progress, error_info"
"""Every column :func:`run_row` reads: the admitted ones, then the JSON values
a runtime updates apart from the status (``runs.update_usage`` …)."""


def _json(text: str | None) -> Any:
    return None if text is None else from_json(text)


def event_row(tx: Tx, r: Sequence[Any]) -> RunEvent:
    """A stored run event (session id, seq, id, run id, edge, source, dest,
    data, occurred at), its data opened when sealed (record id: the event's id).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: see ``sealed_json.open_json``.
    """
    data = sealed_json.open_json(tx, r[0], r[2], EVENT_DATA, r[7])
    return RunEvent(r[0], r[1], r[2], r[3], r[4], r[5], r[6], data, utc(r[8]))


def run_row(row: Sequence[Any]) -> Run:
    return Run(
        id=row[0],
        session_id=row[1],
        intent_id=row[2],
        retry_of=row[3],
        attempt=row[4],
        status=row[5],
        cancel_requested=row[6],
        error=row[7],
        started_at=utc(row[8]),
        updated_at=utc(row[9]),
        finished_at=None if row[10] is None else utc(row[10]),
        turn_id=f"{row[0]}:turn",
        usage=_json(row[11]),
        context_usage=_json(row[12]),
        progress=_json(row[13]),
        error_info=_json(row[14]),
    )


def get(tx: Tx, run_id: str) -> Run | None:
    """The run, or ``None``."""
    row = tx.one(f"SELECT {RUN_COLS} FROM runs WHERE id = ?", [run_id])
    return None if row is None else run_row(row)


def active(tx: Tx, session_id: str) -> Run | None:
    """The session's non-terminal run, or ``None``."""
    row = tx.one(
        f"SELECT {', '.join('r.' + c.strip() for c in RUN_COLS.split(','))} "
        "FROM active_runs a JOIN runs r ON r.id = a.run_id WHERE a.session_id = ?",
        [session_id],
    )
    return None if row is None else run_row(row)


def session_runs(tx: Tx, session_id: str) -> list[Run]:
    """Every run of the session, oldest first."""
    rows = tx.rows(
        f"SELECT {RUN_COLS} FROM runs WHERE session_id = ? ORDER BY started_at, attempt, id",
        [session_id],
    )
    return [run_row(r) for r in rows]


def events(
    tx: Tx,
    session_id: str,
    after: int | None,
    before: int | None,
    latest: bool,
    limit: int,
) -> list[RunEvent]:
    """Run events by sequence: after/before a cursor, or the latest ``limit``; ascending."""
    where: list[str] = ["session_id = ?"]
    params: list[Any] = [session_id]
    if after is not None:
        where.append("seq > ?")
        params.append(after)
    if before is not None:
        where.append("seq < ?")
        params.append(before)
    order = "DESC" if latest or (before is not None and after is None) else "ASC"
    rows = tx.rows(
        "SELECT session_id, seq, id, run_id, edge, source, dest, data, occurred_at "
        f"FROM run_events WHERE {' AND '.join(where)} ORDER BY seq {order} LIMIT ?",
        [*params, limit],
    )
    found = [event_row(tx, r) for r in rows]
    return sorted(found, key=lambda e: e.seq)


# -- the store's methods ------------------------------------------------------------


class RunReadsPart(Area):
    """Read runs and run events."""

    def get(self, run_id: str) -> Run | None:
        """The run, or ``None``."""
        check_id(run_id, "run_id")
        return self.db.read("get_run", lambda tx: get(tx, run_id))

    def active(self, session_id: str) -> Run | None:
        """The session's non-terminal run, or ``None`` when it has none.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(
            session_id, self.db.read("active_run", lambda tx: active(tx, session_id))
        )

    def events(
        self,
        session_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        latest: bool = False,
        limit: int = 100,
    ) -> list[RunEvent]:
        """A page of the session's run events, in sequence order (session seed
        ListSessionRunEventsAfter/Before/Latest): at most ``limit`` (default
        100) events ``after`` a cursor (a reconnecting client asks for what it
        missed), ``before`` one, or the ``latest`` ones; with no cursor, the
        first ``limit``. Each event carries its ``seq``: ask again with
        ``after=events[-1].seq`` until a page comes back shorter than ``limit``
        to read them all.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a cursor that is not an integer, or a bad limit.
        """
        check_id(session_id, "session_id")
        for name, cursor in (("after", after), ("before", before)):
            if cursor is not None:
                check_int(cursor, name, 0)
        check_bool(latest, "latest")
        check_limit(limit)
        return self._inside(
            session_id,
            self.db.read(
                "run_events", lambda tx: events(tx, session_id, after, before, latest, limit)
            ),
        )

    def list(self, session_id: str) -> list[Run]:
        """Every run of the session, oldest first.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(
            session_id, self.db.read("session_runs", lambda tx: session_runs(tx, session_id))
        )
