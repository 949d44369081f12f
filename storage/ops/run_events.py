"""Writing run events: each takes the session's next sequence number from its
event cursor (``sessions.event_seq``), so a reconnecting client reads a
session's run events by one gap-free cursor (``runs.events``).

The lifecycle methods write their own events (one per transition, plus the
``decision`` events of a recovery); ``runs.record_event`` (session seed
SaveSessionRunEvent) lets a runtime add its own to a run that has not ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import uuid6

from turnkeeper.spec import RUN, errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.lifecycle import Edge
from turnkeeper.spec.records import Lease, Run, RunEvent
from turnkeeper.spec.run import TERMINAL

from ..backend import Conflict, Tx, present
from ..codec import check_id, from_json, to_json
from ..crypto.keyring import UNREAD
from ..validate import check_lease, check_session_lease
from . import leases, sealed_json
from .base import Area
from .run_reads import EVENT_DATA, event_row, get

DECISION = "decision"
"""The ``edge`` of a run event that records a decision resolution: not a
transition (source and dest are the run's status), kept in the run's history."""

RECORDED = "record"
"""The ``trigger`` of a run event a runtime recorded itself (``runs.record_event``):
not a transition either (source and dest are the run's status)."""

RESERVED = frozenset({*(e.name for e in RUN.edges), DECISION})
"""Event types a runtime cannot record: the lifecycle's own edges (the audit and
the report read them as transitions) and ``decision``."""

CURSOR_IS = "id = ? AND key_version IS NOT DISTINCT FROM ?"
"""The session row whose event cursor :func:`append_events` moves, still
sealed under the key version its events' data is sealed under (``NULL``:
clear): its compare-and-set."""

_EVENT_COLS = "session_id, seq, id, run_id, edge, source, dest, data, occurred_at"


def append_event(tx: Tx, run: Run, edge: Edge, event_id: str, data: Mapping[str, Any]) -> None:
    """Append a run event with the session's next sequence number (its data
    sealed in a sealed session: :func:`append_events`)."""
    append_events(tx, run, [(edge, event_id, data)])


def cursor_bump(tx: Tx, session_id: str, n: int) -> tuple[str, list[Any]]:
    """The ``SET`` item (with its trailing comma) and its values that move
    the session's event cursor past ``n`` new run events, for an update of
    the session row (see :func:`append_events` for the server's ``greatest``)."""
    if tx.dialect.serialized_writes:
        return "event_seq = event_seq + ?, ", [n]
    last = (
        "greatest(event_seq, (SELECT coalesce(max(seq), 0) FROM run_events WHERE session_id = ?))"
    )
    return f"event_seq = {last} + ?, ", [session_id, n]


def append_events(
    tx: Tx,
    run: Run,
    events: Sequence[tuple[Edge, str, Mapping[str, Any]]],
    *,
    taken: bool = False,
    version: int | None = UNREAD,
) -> None:
    """Append run events (edge, event id, data), in order, with the session's
    next sequence numbers, taken from its event cursor (``session_rows.event_seq``,
    the seq of its last run event): a point update and one insert however
    many, whatever the size of the history (the largest seq is never searched
    for among the events, which on DuckDB reads every run event in the store).

    ``taken``: the caller's update of the session row in this transaction
    already moved the cursor past them (``cursor_bump``), so no update here.
    Each event's data is sealed (record id: the event's id, field ``data``)
    under the data key version ``version`` names (the session row's
    ``key_version`` as the caller read it with its head, named in its
    compare-and-set; :data:`UNREAD`: read here when the store is encrypted,
    and named in the cursor's update, its compare-and-set).

    Raises:
        Conflict: the session row is gone, or its data key version moved
            (the transaction retries).
        KeyUnavailableError: (``key_id`` ``None``) the session's payloads are
            sealed and this store object holds no keys (it took the store
            for clear: opened before the store was marked). Nothing is written.
    """
    n = len(events)
    if version == UNREAD:  # (a clear store object: None, checked by the update below)
        version = tx.keys.sealing(tx, run.session_id)[1]
    # On a server the largest seq is also read, through the (session_id, seq) key
    # (an index probe): a turnkeeper older than schema 10 still running in the
    # fleet beside a migrated database numbers events by it and leaves the cursor
    # behind. A DuckDB file has one writing process, and an older turnkeeper
    # cannot open a migrated file (SchemaVersionError): the cursor alone.
    if not taken:
        item, values = cursor_bump(tx, run.session_id, n)
        sql = f"UPDATE sessions SET {item.removesuffix(', ')} WHERE {CURSOR_IS}"
        if tx.count(sql, [*values, run.session_id, version]) != 1:
            _lost(tx, run)
    sql, params = _insert(tx, run, events, "s.event_seq - ?", version)
    tx.exec(sql, [n, *params])


def _lost(tx: Tx, run: Run) -> None:
    """Why the cursor's compare-and-set of ``run``'s session changed no row.

    Raises:
        KeyUnavailableError: the session is sealed and this store object
            holds no keys (``Keyring.sealing``'s refusal).
        Conflict: the session is gone, or its key version moved.
    """
    found = tx.one("SELECT key_version FROM sessions WHERE id = ?", [run.session_id])
    if found is None:
        raise Conflict(f"session {run.session_id!r} of run {run.id!r} is gone")
    if found[0] is not None and not tx.keys.encrypted:  # this store object took it for clear
        tx.keys.sealing(tx, run.session_id, int(found[0]))
    raise Conflict(f"the data key version of session {run.session_id!r} moved")


NewEvents = tuple[Run, Sequence[tuple[Edge, str, Mapping[str, Any]]]]
"""Run events a write appends with its entries: the run, and each event's
edge, id and data (``session_rows.append_chain``'s ``new_events``)."""


def hold_events(tx: Tx, new: NewEvents, version: int | None = UNREAD) -> None:
    """Hold (``Tx.later``) the insert of ``new``'s events numbered from the
    session's event cursor as it is before :func:`cursor_bump`'s update of
    the session row moves it past them: the caller holds that update right
    after this, in the same transaction, with nothing between, so a server
    sends both in one statement (both read the state before it) and DuckDB
    runs this one first. The numbers are the same as :func:`append_events`'
    (the cursor, on a server at least the largest seq, plus 1, 2 …), and
    ``version`` is as there."""
    run, events = new
    base = "s.event_seq"
    if not tx.dialect.serialized_writes:  # as cursor_bump reads it
        base = (
            "greatest(s.event_seq, (SELECT coalesce(max(e.seq), 0) FROM run_events AS e "
            "WHERE e.session_id = s.id))"
        )
    sql, params = _insert(tx, run, events, base, version)
    tx.later(sql, params)


def _insert(
    tx: Tx,
    run: Run,
    events: Sequence[tuple[Edge, str, Mapping[str, Any]]],
    base: str,
    version: int | None,
) -> tuple[str, list[Any]]:
    """The insert of ``events`` numbered ``base`` + 1, 2 … (``base``: SQL over
    the session row ``s``; its parameters come first), and its parameters
    after ``base``'s; the data sealed as :func:`append_events` says."""
    row = "SELECT ?::BIGINT, ?, ?, ?, ?, ?, ?, ?, ?::TIMESTAMPTZ"
    rows = " UNION ALL ".join([row] * len(events))
    texts = [(event_id, EVENT_DATA, to_json(dict(data), "data")) for _, event_id, data in events]
    stored_data = sealed_json.seal(tx, run.session_id, texts, version)
    params: list[Any] = []
    for k, ((edge, event_id, _), text) in enumerate(zip(events, stored_data, strict=True), 1):
        params += [k, event_id, run.id, edge.name, edge.trigger, edge.source, edge.dest]
        params += [text, tx.now]
    sql = (
        f"INSERT INTO run_events SELECT s.id, {base} + v.n, v.id, v.run_id, v.edge, "
        "v.trigger, v.source, v.dest, v.data, v.occurred_at FROM sessions AS s, "
        f"({rows}) AS v (n, id, run_id, edge, trigger, source, dest, data, occurred_at) "
        "WHERE s.id = ?"
    )
    return sql, [*params, run.session_id]


def stored(tx: Tx, event_id: str) -> RunEvent | None:
    """The run event, or ``None``."""
    r = tx.one(f"SELECT {_EVENT_COLS} FROM run_events WHERE id = ?", [event_id])
    return None if r is None else event_row(tx, r)


def record_event(
    tx: Tx,
    run_id: str,
    event_type: str,
    data: dict[str, Any],
    event_id: str,
    lease: Lease | None,
) -> RunEvent:
    """Append a runtime's own event to run ``run_id`` (see
    :meth:`RunEventsPart.record_event`).

    Raises:
        RunNotFoundError, LeaseLostError, BusyError, RunEventConflictError,
        InvalidTransitionError (the run has ended).
    """
    run = get(tx, run_id)
    if run is None:
        raise errors.RunNotFoundError(run_id)
    check_session_lease(run.session_id, lease)
    leases.fence_or_unheld(tx, session_target(run.session_id), lease)
    found = stored(tx, event_id)
    if found is not None:
        if (found.run_id, found.edge, found.data) == (run_id, event_type, data):
            return found  # a retry after an unknown commit result
        raise errors.RunEventConflictError(event_id, found.run_id)
    if run.status in TERMINAL:
        raise errors.InvalidTransitionError(
            "run", "record_event", run.status, detail="the run has ended: its history is closed"
        )
    append_event(tx, run, Edge(event_type, RECORDED, run.status, run.status), event_id, data)
    return present(stored(tx, event_id), "the run event written just now")


# -- the store's methods ------------------------------------------------------------


class RunEventsPart(Area):
    """Record a runtime's own run event."""

    def record_event(
        self,
        run_id: str,
        event_type: str,
        data: Mapping[str, Any] | None = None,
        *,
        event_id: str | None = None,
        lease: Lease | None = None,
    ) -> RunEvent:
        """Append an event of the runtime's own to run ``run_id``'s history
        (session seed SaveSessionRunEvent), with the session's next sequence
        number, so a client reading ``runs.events(session_id, after=…)`` gets
        it in order with the lifecycle's; returns it as stored.

        ``event_type`` names it (``RunEvent.edge``; ``source`` and ``dest``
        are the run's status, as it does not move the run); a lifecycle
        edge's name or ``decision`` is refused, since those are the
        lifecycle's own. ``data`` is a JSON object (default ``{}``).
        ``event_id`` (default: a new id ``<run id>:<event type>:<uuid7>``)
        makes a retry after an unknown commit result safe: the same id with
        the same run, type and data returns the stored event, even once the
        run has ended.

        A session write: under the session's ``lease`` (fenced in the write's
        transaction) or while nobody holds a live lease on it; only while the
        run has not ended (its terminal event closes its history).

        Raises:
            RunNotFoundError: no such run.
            InvalidTransitionError: the run has ended.
            RunEventConflictError: ``event_id`` names another event.
            BusyError: no ``lease`` given and someone holds the session.
            LeaseLostError, InvalidInputError (a reserved or bad type, data
            that is not a JSON object, a bad id).
        On any error nothing is written.
        """
        check_id(run_id, "run_id")
        check_id(event_type, "event_type")
        if event_type in RESERVED:
            raise errors.InvalidInputError(
                "event_type", f"{event_type!r} is a lifecycle event of the store's own"
            )
        if data is not None and not isinstance(data, Mapping):
            raise errors.InvalidInputError("data", "expected a mapping (or None)")
        payload = dict(data or {})
        payload = from_json(to_json(payload, "data"))  # as stored (and compared on a retry)
        if event_id is None:
            event_id = f"{run_id}:{event_type}:{uuid6.uuid7()}"
        check_id(event_id, "event_id")
        if lease is not None:
            check_lease(lease)  # its target is checked against the run's session in the write
        key = event_id
        return self._fenced(
            "record_run_event",
            lease,
            lambda tx: record_event(tx, run_id, event_type, payload, key, lease),
        )
