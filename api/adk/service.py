"""``TurnkeeperSessionService``: Google ADK's ``BaseSessionService`` on a turnkeeper store.

See :mod:`turnkeeper.adk` for the mapping and the two guards.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from google.adk.errors import StaleSessionError as _AdkStale
from google.adk.errors.already_exists_error import AlreadyExistsError as _AdkExists
from google.adk.errors.session_not_found_error import SessionNotFoundError as _AdkNotFound
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from typing_extensions import override

from turnkeeper.aio import AsyncStore
from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import Entry, Lease
from turnkeeper.spec.records import Session as StoredSession
from turnkeeper.storage.validate import MAX_LIMIT

from . import _codec, _scoped


class StaleSessionError(errors.SessionModifiedError, _AdkStale):
    """The session has been modified in storage since it was loaded (reload it).

    Both turnkeeper's ``SessionModifiedError`` (``session_id`` is the turnkeeper
    session id, ``expected_leaf`` the entry the caller's ``Session`` was loaded
    at, ``actual_leaf`` the stored one) and ADK's
    ``google.adk.errors.StaleSessionError`` (a ``ValueError``), which ADK's
    ``Runner`` catches to drop a stale compaction. Nothing was written.
    """


class SessionExistsError(errors.SessionIDExistsError, _AdkExists):
    """A session with this (app, user, session id) exists or existed (ErrSessionIDExists).

    Both turnkeeper's ``SessionIDExistsError`` and ADK's ``AlreadyExistsError``.
    A deleted session's id stays taken (turnkeeper's tombstone).
    """


class SessionNotFoundError(errors.SessionNotFoundError, _AdkNotFound):
    """No session has this (app, user, session id).

    Both turnkeeper's ``SessionNotFoundError`` and ADK's (a ``ValueError``).
    """


def _created_at(stored: StoredSession) -> float:
    return stored.created_at.timestamp()


def _session_state(stored: StoredSession, last: Entry | None) -> dict[str, Any]:
    """The session-scoped state after the event entry ``last`` (at creation without one)."""
    if last is not None:
        return _codec.state_of(last.payload)
    header = stored.header.get(_codec.HEADER_KEY)
    state = header.get("state") if isinstance(header, dict) else None
    return dict(state) if isinstance(state, dict) else {}


def _update_time(stored: StoredSession, last: Entry | None) -> float:
    """ADK's ``last_update_time``: the event entry ``last``'s timestamp, else the creation's."""
    if last is not None:
        return _codec.timestamp_of(last.payload)
    return _created_at(stored)


def _address(stored: StoredSession) -> tuple[str, str, str] | None:
    header = stored.header.get(_codec.HEADER_KEY)
    if not isinstance(header, dict):
        return None
    parts = (header.get("app_name"), header.get("user_id"), header.get("session_id"))
    if not all(isinstance(p, str) for p in parts):
        return None
    return (str(parts[0]), str(parts[1]), str(parts[2]))


def _filtered(events: list[Event], config: GetSessionConfig | None) -> list[Event]:
    """``config``'s filters as ADK's services apply them: the newest
    ``num_recent_events`` (0: none), then those at or after ``after_timestamp``."""
    if config is None:
        return events
    if config.num_recent_events is not None:
        events = events[-config.num_recent_events :] if config.num_recent_events else []
    if config.after_timestamp is not None:
        after = config.after_timestamp
        events = [e for e in events if e.timestamp >= after]
    return events


class TurnkeeperSessionService(BaseSessionService):
    """Google ADK's ``BaseSessionService`` on a turnkeeper async store.

    ``TurnkeeperSessionService(store, owner="worker-1", ttl_s=30.0)``: ``store``
    is a ``turnkeeper.aio`` store (``await turnkeeper.aio.open_store(...)``);
    ``owner`` names this writer on the session leases it takes (give each
    worker its own); ``ttl_s`` is each lease's time to live in seconds.

    Every ``append_event`` writes under this service's lease on the session
    (taken at its first append, renewed at an append once half of ``ttl_s``
    has passed since it was granted, by this process's monotonic clock), so
    a second writer is refused while the first lives, and a first writer
    whose lease another writer took over is refused on its next append.
    ``release_session`` and ``close`` give the leases back. Reads take no
    lease. A lease that runs out between two appends (a pause longer than
    ``ttl_s``, such as a slow model call) is lost all the same: that append
    raises ``LeaseLostError`` and the next one takes the lease again if it is
    free, so set ``ttl_s`` above the longest pause of a turn.

    Raises (besides what each method says): ``turnkeeper.InvalidInputError``
    for an address no session id can hold (over 512 UTF-8 bytes once encoded).
    """

    def __init__(self, store: AsyncStore, *, owner: str | None = None, ttl_s: float = 30.0):
        self._store = store
        self._owner = owner or f"adk-{uuid.uuid4().hex[:12]}"
        self._ttl_s = ttl_s
        self._leases: dict[str, tuple[Lease, float]] = {}  # lease, monotonic time granted

    @property
    def store(self) -> AsyncStore:
        """The async store this service writes to."""
        return self._store

    @property
    def owner(self) -> str:
        """The owner name on this service's session leases."""
        return self._owner

    # -- sessions -------------------------------------------------------------

    @override
    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session (ADK ``create_session``; turnkeeper ``sessions.create``).

        ``state``'s ``app:`` and ``user:`` keys go to the app's and the user's
        state, ``temp:`` keys nowhere, the rest to the session. ``session_id``
        is stripped of surrounding blanks; ``None`` or blank: a new uuid.

        Raises:
            SessionExistsError: the id is taken in this (app, user), now or before
                a delete; nothing is written.
            turnkeeper.InvalidInputError: ``state`` holds a value with no JSON
                form (``field="state"``); nothing is written.
        """
        sid = (session_id or "").strip() or str(uuid.uuid4())
        key = _codec.session_key(app_name, user_id, sid)
        app_delta, user_delta, session_state = _codec.split_state(state or {}, "state")
        header = {
            _codec.HEADER_KEY: {
                "app_name": app_name,
                "user_id": user_id,
                "session_id": sid,
                "state": session_state,
            }
        }
        try:
            stored = await self._store.sessions.create(
                key, cwd=_codec.user_dir(app_name, user_id), header=header
            )
        except errors.SessionIDExistsError:
            raise SessionExistsError(key) from None
        await _scoped.update(self._store, _codec.app_state_key(app_name), app_delta)
        await _scoped.update(self._store, _codec.user_state_key(app_name, user_id), user_delta)
        session = Session(
            id=sid,
            app_name=app_name,
            user_id=user_id,
            state=await self._merged(app_name, user_id, session_state),
            last_update_time=_created_at(stored),
        )
        session._storage_update_marker = _codec.marker(None)
        return session

    @override
    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events and merged state, ``None`` when there is none.

        ``config.num_recent_events`` keeps the newest events (0: none);
        ``config.after_timestamp`` those at or after it (seconds since the
        epoch). The state and ``last_update_time`` are the session's whatever
        the filters keep. The returned session carries the entry it was read
        at, which its next ``append_event`` expects to be the stored leaf.
        """
        key = _codec.session_key(app_name, user_id, session_id.strip())
        stored = await self._store.sessions.get(key)
        if stored is None:
            return None
        try:
            entries, last, leaf_id = await self._event_entries(stored, config)
        except errors.SessionNotFoundError:
            return None
        session = Session(
            id=session_id.strip(),
            app_name=app_name,
            user_id=user_id,
            state=await self._merged(app_name, user_id, _session_state(stored, last)),
            events=_filtered([_codec.event_of(e.payload) for e in entries], config),
            last_update_time=_update_time(stored, last),
        )
        session._storage_update_marker = _codec.marker(leaf_id)
        return session

    async def _event_entries(
        self, stored: StoredSession, config: GetSessionConfig | None
    ) -> tuple[list[Entry], Entry | None, str | None]:
        """The event entries ``config`` may keep, oldest first; the newest event
        entry; the leaf they were read at.

        With ``num_recent_events`` only the newest that many are read
        (``sessions.custom_entries``) and the leaf is the one ``stored`` was
        read at, before them: an append in between makes the session look
        stale, never current. Otherwise every entry is read.
        """
        recent = None if config is None else config.num_recent_events
        if recent == 0:
            return [], await self._last_event(stored), stored.leaf_id
        if recent is not None and recent <= MAX_LIMIT:
            newest = await self._store.sessions.custom_entries(
                stored.id, _codec.EVENT_TYPE, limit=recent
            )
            return newest[::-1], (newest[0] if newest else None), stored.leaf_id
        entries = await self._store.sessions.entries(stored.id)
        events = [e for e in entries if _codec.is_event(e.payload)]
        return events, (events[-1] if events else None), (entries[-1].id if entries else None)

    @override
    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The sessions of a user (of every user when ``user_id`` is ``None``),
        without events, with merged state, oldest ``last_update_time`` first
        (ties by user id, then session id), as ADK's services order them."""
        found: list[tuple[StoredSession, tuple[str, str, str]]] = []
        cursor: str | None = None
        while True:
            if user_id is not None:
                page = await self._store.sessions.list(
                    cwd=_codec.user_dir(app_name, user_id), limit=200, cursor=cursor
                )
            else:
                page = await self._store.sessions.list(
                    search=_codec.app_search(app_name), limit=200, cursor=cursor
                )
            for stored in page.sessions:
                address = _address(stored)
                if address is None or address[0] != app_name:
                    continue
                if user_id is not None and address[1] != user_id:
                    continue
                if stored.id != _codec.session_key(*address):
                    continue
                found.append((stored, address))
            cursor = page.next_cursor
            if cursor is None:
                break
        app_state = await _scoped.read(self._store, _codec.app_state_key(app_name))
        user_states: dict[str, dict[str, Any]] = {}
        sessions = []
        for stored, (_, uid, sid) in found:
            last = await self._last_event(stored)
            if uid not in user_states:
                user_states[uid] = await _scoped.read(
                    self._store, _codec.user_state_key(app_name, uid)
                )
            sessions.append(
                Session(
                    id=sid,
                    app_name=app_name,
                    user_id=uid,
                    state=_codec.merged(_session_state(stored, last), app_state, user_states[uid]),
                    last_update_time=_update_time(stored, last),
                )
            )
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    @override
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session and its events (turnkeeper ``sessions.delete``: README
        "Deleting sessions"). A missing session is no error, as in ADK. The app's
        and the user's state stay.

        Raises:
            turnkeeper.BusyError: another writer holds the session's lease.
            turnkeeper.LeaseLostError: this service's lease was lost.
        """
        key = _codec.session_key(app_name, user_id, session_id.strip())
        held = self._leases.get(key)
        try:
            await self._store.sessions.delete(key, lease=None if held is None else held[0])
        except errors.SessionNotFoundError:
            pass
        except errors.LeaseLostError:
            self._leases.pop(key, None)
            raise
        self._leases.pop(key, None)

    @override
    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's state in the app, keys without ``user:``; ``{}`` when none."""
        return await _scoped.read(self._store, _codec.user_state_key(app_name, user_id))

    # -- events ---------------------------------------------------------------

    @override
    async def append_event(self, session: Session, event: Event) -> Event:
        """Append ``event`` under this service's lease on the session, fenced on
        the entry ``session`` was loaded at (ADK ``append_event``).

        A partial event is returned unstored. ``temp:`` keys reach
        ``session.state`` only; the rest of the state delta is stored with the
        event (session keys in the event's entry, ``app:`` and ``user:`` keys
        in their scope's record after it). Then ``session`` gets the event, the
        delta, ``last_update_time = event.timestamp`` and the new leaf.

        A cancellation (``asyncio.CancelledError``, never wrapped) before the
        event is stored leaves nothing written; after, the event's ``app:`` and
        ``user:`` changes are still written, and ``session`` is left as it was.

        Raises (each with nothing written and ``session`` unchanged):
            StaleSessionError: the session was appended to since ``session`` was
                loaded (``session`` is stale: reload it).
            SessionNotFoundError: no such session (or it was deleted).
            turnkeeper.InvalidInputError: the event or its state delta holds a
                value with no JSON form (``field`` names which).
            turnkeeper.BusyError: another writer holds the session's lease.
            turnkeeper.LeaseLostError: this service's lease was lost (another
                writer took the session over); the next append tries to take it
                again.
        """
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        key = _codec.session_key(session.app_name, session.user_id, session.id)
        stored = await self._store.sessions.get(key)
        if stored is None:
            raise SessionNotFoundError(key)
        last = await self._last_event(stored)
        expected = self._expected_leaf(key, session, stored, last)
        if expected != stored.leaf_id:
            raise StaleSessionError(key, expected, stored.leaf_id)
        delta = dict(event.actions.state_delta) if event.actions else {}
        app_delta, user_delta, session_delta = _codec.split_state(
            delta, "event.actions.state_delta"
        )
        payload = _codec.event_payload(event, {**_session_state(stored, last), **session_delta})
        lease = await self._lease(key)
        try:
            entry = await self._store.sessions.append(
                key,
                EntryKind.CUSTOM,
                payload,
                expected_leaf=expected,
                lease=lease,
            )
        except errors.SessionModifiedError as modified:
            raise StaleSessionError(key, expected, modified.actual_leaf) from None
        except errors.SessionNotFoundError:
            raise SessionNotFoundError(key) from None
        except errors.LeaseLostError:
            self._leases.pop(key, None)
            raise
        # The event is stored: a cancellation from here on does not cut its
        # scope changes off (they finish in a task of their own).
        await asyncio.shield(
            asyncio.ensure_future(
                self._update_scopes(session.app_name, session.user_id, app_delta, user_delta)
            )
        )
        session.last_update_time = event.timestamp
        session._storage_update_marker = _codec.marker(entry.id)
        return self._commit_event_to_session(session, event)

    async def _update_scopes(
        self, app_name: str, user_id: str, app_delta: dict[str, Any], user_delta: dict[str, Any]
    ) -> None:
        await _scoped.update(self._store, _codec.app_state_key(app_name), app_delta)
        await _scoped.update(self._store, _codec.user_state_key(app_name, user_id), user_delta)

    def _expected_leaf(
        self, key: str, session: Session, stored: StoredSession, last: Entry | None
    ) -> str | None:
        """The leaf ``session`` was loaded at. A session this service did not
        load (no marker) is current only if its last event is the last stored
        one (or both have none); it then expects the stored leaf.

        Raises:
            StaleSessionError: a session without a marker that is not current.
        """
        known, expected = _codec.leaf_of(session._storage_update_marker)
        if known:
            return expected
        stored_last = None if last is None else _codec.event_of(last.payload)
        mine = session.events[-1] if session.events else None
        if mine != stored_last:
            raise StaleSessionError(key, None, stored.leaf_id)
        return stored.leaf_id

    async def _last_event(self, stored: StoredSession) -> Entry | None:
        """The newest event entry of ``stored``: its leaf, unless another kind of
        entry was written after (a title, say), when it is looked up by type."""
        if stored.leaf_id is None:
            return None
        leaf = await self._store.sessions.entry(stored.id, stored.leaf_id)
        if leaf is not None and _codec.is_event(leaf.payload):
            return leaf
        newest = await self._store.sessions.custom_entries(stored.id, _codec.EVENT_TYPE, limit=1)
        return newest[0] if newest else None

    # -- leases ---------------------------------------------------------------

    async def _lease(self, key: str) -> Lease:
        held = self._leases.get(key)
        if held is None:
            lease = await self._store.leases.acquire(
                f"session:{key}", self._owner, ttl_s=self._ttl_s
            )
        elif time.monotonic() - held[1] < self._ttl_s / 2:
            return held[0]
        else:
            try:
                lease = await self._store.leases.renew(held[0], self._ttl_s)
            except errors.LeaseLostError:
                self._leases.pop(key, None)
                raise
        self._leases[key] = (lease, time.monotonic())
        return lease

    def lease(self, *, app_name: str, user_id: str, session_id: str) -> Lease | None:
        """The lease this service holds on the session, ``None`` before its first append."""
        held = self._leases.get(_codec.session_key(app_name, user_id, session_id))
        return None if held is None else held[0]

    async def release_session(self, *, app_name: str, user_id: str, session_id: str) -> bool:
        """Give back this service's lease on the session (``leases.release``);
        ``False`` when it held none or had lost it."""
        held = self._leases.pop(_codec.session_key(app_name, user_id, session_id), None)
        return held is not None and await self._store.leases.release(held[0])

    async def __aenter__(self) -> TurnkeeperSessionService:
        """``async with`` the service: :meth:`close` at the end (as ADK's database service)."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Give back every lease this service holds. The store stays open."""
        while self._leases:
            _, (lease, _granted) = self._leases.popitem()
            await self._store.leases.release(lease)

    async def _merged(
        self, app_name: str, user_id: str, session_state: dict[str, Any]
    ) -> dict[str, Any]:
        return _codec.merged(
            session_state,
            await _scoped.read(self._store, _codec.app_state_key(app_name)),
            await _scoped.read(self._store, _codec.user_state_key(app_name, user_id)),
        )
