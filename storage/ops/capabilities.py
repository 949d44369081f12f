"""``store.capabilities``: a session's runtime capability state and its
transitions (session seed SaveSessionCapabilities, LoadSessionCapabilities,
SaveSessionCapabilityEvent, ListSessionCapabilityEvents[After|WithSeq]).

The state is one row per session, replaced whole by each save. The events are
an append-only table of their own: each takes the next number of its session's
counter row (:func:`next_seq`), which the writing transaction locks, so
numbers follow commit order and a reader resuming after ``seq`` never skips
an event that committed late. An event's id is the caller's (deterministic
ids make a retry after an unknown commit safe: the same event again returns
its id and writes nothing) or a new UUIDv7.

Both are session writes (storage/protocol.py): under the session's lease, or
while nobody holds one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import uuid6

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import (
    CapabilityEvent,
    Lease,
    SequencedCapabilityEvent,
    SessionCapabilities,
)

from ..backend import Tx, present, utc
from ..codec import check_id, check_instant, check_text, to_json
from ..validate import check_bool, check_int, check_limit, check_session_lease
from . import leases, sealed_json
from .base import Area

_FLAGS = ("delegate_mode", "multi_agent", "workflows", "web_search", "browser", "a2a_master")
_STATE_COLS = ("session_id", "mode", "display_mode", *_FLAGS, "updated_at")
_TEXTS = ("run_id", "event_type", "source", "actor", "capability", "old_value", "new_value")
_EVENT_COLS = ("id", "session_id", "seq", *_TEXTS, "happened_at", "data")
DATA = "data"
"""The field an event's ``data`` is sealed under (record id the event's id)."""


def next_seq(tx: Tx, session_id: str, stream: str) -> int:
    """The next number of the session's ``stream`` of events (1, 2, …), from its
    counter row, which this transaction now holds (a second writer waits, or
    conflicts and retries), so numbers follow commit order."""
    (seq,) = present(
        tx.one(
            "INSERT INTO event_cursors VALUES (?, ?, 1) ON CONFLICT (session_id, stream) "
            "DO UPDATE SET seq = event_cursors.seq + 1 RETURNING seq",
            [session_id, stream],
        ),
        "the cursor its upsert returns",
    )
    return int(seq)


def session_exists(tx: Tx, session_id: str) -> None:
    """Raises SessionNotFoundError when the session does not exist."""
    if tx.one("SELECT 1 FROM sessions WHERE id = ?", [session_id]) is None:
        raise errors.SessionNotFoundError(session_id)


def save(tx: Tx, caps: SessionCapabilities, lease: Lease | None) -> SessionCapabilities:
    """Replace the session's capability state with ``caps``; returns it as stored."""
    session_exists(tx, caps.session_id)
    leases.fence_or_unheld(tx, session_target(caps.session_id), lease)
    values = [getattr(caps, name) for name in _STATE_COLS[:-1]]
    sets = ", ".join(f"{c} = excluded.{c}" for c in _STATE_COLS[1:])
    row = tx.one(
        f"INSERT INTO session_capabilities ({', '.join(_STATE_COLS)}) "
        f"VALUES ({', '.join('?' for _ in _STATE_COLS)}) "
        f"ON CONFLICT (session_id) DO UPDATE SET {sets} RETURNING {', '.join(_STATE_COLS)}",
        [*values, tx.now],
    )
    return _state(present(row, "the capability row its upsert returns"))


def load(tx: Tx, session_id: str) -> SessionCapabilities | None:
    row = tx.one(
        f"SELECT {', '.join(_STATE_COLS)} FROM session_capabilities WHERE session_id = ?",
        [session_id],
    )
    return None if row is None else _state(row)


def _state(row: Sequence[Any]) -> SessionCapabilities:
    named = dict(zip(_STATE_COLS, row, strict=True))
    named["updated_at"] = utc(named["updated_at"])
    return SessionCapabilities(**named)


def record(tx: Tx, event: CapabilityEvent, data: str | None, lease: Lease | None) -> str:
    """Append ``event`` (its id chosen already); returns its id. The same event
    again (same id, same content) returns the id and writes nothing.

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError,
        CapabilityEventConflictError: the id names another event.
    """
    # (the session's key version, read by every store object: also its existence check)
    version = sealed_json.session_version(tx, event.session_id)
    leases.fence_or_unheld(tx, session_target(event.session_id), lease)
    found = tx.one(
        f"SELECT {', '.join(_EVENT_COLS)} FROM capability_events WHERE id = ?", [event.id]
    )
    if found is not None:
        stored = _event(tx, found).event
        given = replace(event, timestamp=event.timestamp or stored.timestamp)
        if stored != given:
            raise errors.CapabilityEventConflictError(event.id, stored.session_id)
        return event.id
    seq = next_seq(tx, event.session_id, "capability")
    texts = [getattr(event, name) for name in _TEXTS]
    tx.exec(
        f"INSERT INTO capability_events ({', '.join(_EVENT_COLS)}) "
        f"VALUES ({', '.join('?' for _ in _EVENT_COLS)})",
        [
            event.id,
            event.session_id,
            seq,
            *texts,
            event.timestamp or tx.now,
            None
            if data is None
            else sealed_json.seal_one(tx, event.session_id, event.id, DATA, data, version),
        ],
    )
    return event.id


def events(
    tx: Tx, session_id: str, after_seq: int, limit: int | None
) -> list[SequencedCapabilityEvent]:
    session_exists(tx, session_id)
    bound = "" if limit is None else f" LIMIT {int(limit)}"
    rows = tx.rows(
        f"SELECT {', '.join(_EVENT_COLS)} FROM capability_events "
        f"WHERE session_id = ? AND seq > ? ORDER BY seq{bound}",
        [session_id, after_seq],
    )
    return [_event(tx, row) for row in rows]


def _event(tx: Tx, row: Sequence[Any]) -> SequencedCapabilityEvent:
    named = dict(zip(_EVENT_COLS, row, strict=True))
    seq = named.pop("seq")
    named["timestamp"] = utc(named.pop("happened_at"))
    data = named.pop("data")
    if data is not None:
        data = sealed_json.open_json(tx, named["session_id"], named["id"], DATA, data)
    return SequencedCapabilityEvent(seq, CapabilityEvent(**named, data=data))


# -- the store's methods ------------------------------------------------------------


class Capabilities(Area):
    """``store.capabilities``: see the module docstring."""

    def save(
        self, capabilities: SessionCapabilities, *, lease: Lease | None = None
    ) -> SessionCapabilities:
        """Persist the session's runtime capability state, replacing what was
        saved before (session seed SaveSessionCapabilities); returns it as
        stored, ``updated_at`` set to the store's now (seconds precision of
        the backend's timestamp: microseconds). A session write: under the
        session's ``lease``, or while nobody holds it.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: not a SessionCapabilities, a bad id or text, a
                flag that is not a bool; nothing is written.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        """
        if not isinstance(capabilities, SessionCapabilities):
            raise errors.InvalidInputError("capabilities", "expected a SessionCapabilities")
        check_id(capabilities.session_id, "session_id")
        check_text(capabilities.mode, "mode")
        check_text(capabilities.display_mode, "display_mode")
        for flag in _FLAGS:
            check_bool(getattr(capabilities, flag), flag)
        check_session_lease(capabilities.session_id, lease)
        return self._fenced("save_capabilities", lease, lambda tx: save(tx, capabilities, lease))

    def load(self, session_id: str) -> SessionCapabilities | None:
        """The session's saved capability state, or ``None`` when none was saved
        (session seed LoadSessionCapabilities, whose ``found`` is ``is not
        None`` here) or the session does not exist."""
        check_id(session_id, "session_id")
        return self.db.read("load_capabilities", lambda tx: load(tx, session_id))

    def record_event(self, event: CapabilityEvent, *, lease: Lease | None = None) -> str:
        """Append one capability transition to the session's event table
        (session seed SaveSessionCapabilityEvent); returns its id. An empty
        ``event.id`` gets a new UUIDv7; a caller's id makes the call
        idempotent: recording the same event again (after an unknown commit)
        returns its id and writes nothing. ``timestamp`` defaults to the
        store's now. A session write: under the session's ``lease``, or while
        nobody holds it.

        Raises:
            SessionNotFoundError: no such session.
            CapabilityEventConflictError: ``event.id`` already names a
                different event (fields ``event_id``, ``session_id``).
            InvalidInputError: not a CapabilityEvent, an empty capability, a bad
                id, text or timestamp, ``data`` not storable as JSON exactly.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        On any error nothing is written.
        """
        if not isinstance(event, CapabilityEvent):
            raise errors.InvalidInputError("event", "expected a CapabilityEvent")
        check_id(event.session_id, "session_id")
        event_id = str(uuid6.uuid7()) if event.id == "" else check_id(event.id, "id")
        for name in _TEXTS:
            check_text(getattr(event, name), name, allow_empty=name != "capability")
        if event.run_id:
            check_id(event.run_id, "run_id")
        if event.timestamp is not None:
            check_instant(event.timestamp, "timestamp")
        data = None if event.data is None else to_json(event.data, "data")
        check_session_lease(event.session_id, lease)
        given = replace(event, id=event_id)
        return self._fenced(
            "record_capability_event", lease, lambda tx: record(tx, given, data, lease)
        )

    def events(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[SequencedCapabilityEvent]:
        """The session's capability events with their cursor, oldest first
        (session seed ListSessionCapabilityEvents, …WithSeq, and with
        ``after_seq``/``limit`` …After): those numbered above ``after_seq``, at
        most ``limit`` of them (``None``: all).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad id, a negative ``after_seq``, a ``limit``
                below 1.
        """
        check_id(session_id, "session_id")
        check_int(after_seq, "after_seq", 0)
        if limit is not None:
            check_limit(limit)
        return self.db.read(
            "capability_events", lambda tx: events(tx, session_id, after_seq, limit)
        )
