"""``store.resources``: the lifecycle events of the input resources a runtime
materializes for its runs (session seed SaveInputResourceEvent,
ListInputResourceEvents).

Each event takes the next number of its session's ``resource`` stream
(:func:`.capabilities.next_seq`: a counter row the writing transaction locks),
so the events list in durable (commit) order. An event's id is the caller's
deterministic id, so a retry after an unknown commit writes nothing (another
event under a used id is ``ResourceEventConflictError``), or a new UUIDv7. A
session write: under the session's lease, or while nobody holds one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import uuid6

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import InputResourceEvent, Lease

from ..backend import Tx, utc
from ..codec import check_id, check_instant, check_text, to_json
from ..validate import check_session_lease
from . import leases, sealed_json
from .base import Area
from .capabilities import next_seq, session_exists

_TEXTS = ("resource_id", "run_id", "event_type", "status")
_COLS = ("id", "session_id", "seq", *_TEXTS, "happened_at", "data")


DATA = "data"
"""The field name a resource event's data is sealed under
(``input_resource_events.data``)."""


def _row(tx: Tx, row: Sequence[Any]) -> InputResourceEvent:
    """A stored row as an event, its data opened when sealed (record id: its id).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: see ``sealed_json.open_json``.
    """
    named = dict(zip(_COLS, row, strict=True))
    named.pop("seq")
    named["timestamp"] = utc(named.pop("happened_at"))
    data = named.pop("data")
    if data is not None:
        data = sealed_json.open_json(tx, named["session_id"], named["id"], DATA, data)
    return InputResourceEvent(**named, data=data)


def checked(event: InputResourceEvent) -> tuple[InputResourceEvent, str | None]:
    """``event`` checked, its empty id replaced by a new UUIDv7, and its data as
    stored JSON text.

    Raises:
        InvalidInputError: not an InputResourceEvent, an empty resource id or
            event type, a bad id, text or timestamp, ``data`` not storable as
            JSON exactly.
    """
    if not isinstance(event, InputResourceEvent):
        raise errors.InvalidInputError("event", "expected an InputResourceEvent")
    check_id(event.session_id, "session_id")
    event_id = str(uuid6.uuid7()) if event.id == "" else check_id(event.id, "id")
    check_id(event.resource_id, "resource_id")
    check_text(event.event_type, "event_type", allow_empty=False)
    check_text(event.status, "status")
    if event.run_id:
        check_id(event.run_id, "run_id")
    if event.timestamp is not None:
        check_instant(event.timestamp, "timestamp")
    data = None if event.data is None else to_json(event.data, "data")
    return replace(event, id=event_id), data


def record(tx: Tx, event: InputResourceEvent, data: str | None, lease: Lease | None) -> str:
    """Append ``event`` (its id chosen already); returns its id.

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError, ResourceEventConflictError.
    """
    version = sealed_json.session_version(tx, event.session_id)
    leases.fence_or_unheld(tx, session_target(event.session_id), lease)
    return write(tx, event, data, version)


def write(tx: Tx, event: InputResourceEvent, data: str | None, version: int | None) -> str:
    """Append ``event`` (checked by :func:`checked`) in a transaction that
    already fenced its session's lease, or found nobody holding it (session
    seed AppendInputResourceEventTx: ``record`` and ``runs.admit`` call it);
    returns its id. The same event under its id again writes nothing.
    ``data`` is sealed under the session's data key version ``version`` (as
    the caller read it: ``None``, clear).

    Raises:
        ResourceEventConflictError: the id names a different event.
    """
    found = tx.one(f"SELECT {', '.join(_COLS)} FROM input_resource_events WHERE id = ?", [event.id])
    if found is not None:
        stored = _row(tx, found)
        if stored != replace(event, timestamp=event.timestamp or stored.timestamp):
            raise errors.ResourceEventConflictError(event.id, stored.session_id)
        return event.id
    seq = next_seq(tx, event.session_id, "resource")
    tx.exec(
        f"INSERT INTO input_resource_events ({', '.join(_COLS)}) "
        f"VALUES ({', '.join('?' for _ in _COLS)})",
        [
            event.id,
            event.session_id,
            seq,
            *(getattr(event, name) for name in _TEXTS),
            event.timestamp or tx.now,
            None
            if data is None
            else sealed_json.seal_one(tx, event.session_id, event.id, DATA, data, version),
        ],
    )
    return event.id


def events(tx: Tx, session_id: str) -> list[InputResourceEvent]:
    session_exists(tx, session_id)
    rows = tx.rows(
        f"SELECT {', '.join(_COLS)} FROM input_resource_events WHERE session_id = ? ORDER BY seq",
        [session_id],
    )
    return [_row(tx, r) for r in rows]


# -- the store's methods ------------------------------------------------------------


class Resources(Area):
    """``store.resources``: see the module docstring."""

    def record_event(self, event: InputResourceEvent, *, lease: Lease | None = None) -> str:
        """Append one resource lifecycle event (session seed
        SaveInputResourceEvent); returns its id. An empty ``event.id`` gets a
        new UUIDv7; with a deterministic id, recording the same event again
        (after an unknown commit) returns the id and writes nothing.
        ``timestamp`` defaults to the store's now. A session write: under the
        session's ``lease``, or while nobody holds it.

        Raises:
            SessionNotFoundError: no such session.
            ResourceEventConflictError: ``event.id`` names a different event
                (fields ``event_id``, ``session_id``).
            InvalidInputError: not an InputResourceEvent, an empty resource id
                or event type, a bad id, text or timestamp, ``data`` not
                storable as JSON exactly.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        On any error nothing is written.
        """
        given, data = checked(event)
        check_session_lease(given.session_id, lease)
        return self._fenced(
            "record_resource_event", lease, lambda tx: record(tx, given, data, lease)
        )

    def events(self, session_id: str) -> list[InputResourceEvent]:
        """The session's resource lifecycle events in durable (commit) order
        (session seed ListInputResourceEvents).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad id.
        """
        check_id(session_id, "session_id")
        return self.db.read("resource_events", lambda tx: events(tx, session_id))
