"""Writing run events: each takes the session's next sequence number from its
event cursor (``sessions.event_seq``), so a reconnecting client reads a
session's run events by one gap-free cursor (``runs.events``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from turnkeeper.spec.lifecycle import Edge
from turnkeeper.spec.records import (
    Run,
)

from ..backend import Conflict, Tx
from ..codec import to_json


def append_event(tx: Tx, run: Run, edge: Edge, event_id: str, data: Mapping[str, Any]) -> None:
    """Append a run event with the session's next sequence number."""
    append_events(tx, run, [(edge, event_id, data)])


def append_events(tx: Tx, run: Run, events: Sequence[tuple[Edge, str, Mapping[str, Any]]]) -> None:
    """Append run events (edge, event id, data), in order, with the session's
    next sequence numbers, taken from its event cursor (``session_rows.event_seq``,
    the seq of its last run event): a point update and one insert however
    many, whatever the size of the history (the largest seq is never searched
    for among the events, which on DuckDB reads every run event in the store).

    Raises:
        Conflict: the session row is gone (the transaction retries).
    """
    n = len(events)
    # On a server the largest seq is also read, through the (session_id, seq) key
    # (an index probe): a turnkeeper older than schema 10 still running in the
    # fleet beside a migrated database numbers events by it and leaves the cursor
    # behind. A DuckDB file has one writing process, and an older turnkeeper
    # cannot open a migrated file (SchemaVersionError): the cursor alone.
    serial = tx.dialect.serialized_writes
    last = (
        "event_seq"
        if serial
        else "greatest(event_seq, (SELECT coalesce(max(seq), 0) FROM run_events "
        "WHERE session_id = ?))"
    )
    bump = [*([] if serial else [run.session_id]), n, run.session_id]
    if tx.count(f"UPDATE sessions SET event_seq = {last} + ? WHERE id = ?", bump) != 1:
        raise Conflict(f"session {run.session_id!r} of run {run.id!r} is gone")
    row = "SELECT ?::BIGINT, ?, ?, ?, ?, ?, ?, ?, ?::TIMESTAMPTZ"
    rows = " UNION ALL ".join([row] * n)
    params: list[Any] = []
    for k, (edge, event_id, data) in enumerate(events, start=1):
        params += [k, event_id, run.id, edge.name, edge.trigger, edge.source, edge.dest]
        params += [to_json(dict(data), "data"), tx.now]
    tx.exec(
        "INSERT INTO run_events SELECT s.id, s.event_seq - ? + v.n, v.id, v.run_id, v.edge, "
        "v.trigger, v.source, v.dest, v.data, v.occurred_at FROM sessions AS s, "
        f"({rows}) AS v (n, id, run_id, edge, trigger, source, dest, data, occurred_at) "
        "WHERE s.id = ?",
        [n, *params, run.session_id],
    )
