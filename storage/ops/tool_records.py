"""Tool-execution records, read and moved along the machine (shared by the record
operations, tools.py, and the transcript pairing, tool_pairing.py).

Every state change reads the record, asks the tool-execution machine which
edge the trigger takes from the stored state, writes the destination with a
compare-and-set (``WHERE state = ? AND attempt = ?``; a moved row is a lost
race, retried by the transaction boundary) and appends an event row, all in
one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnkeeper.machines import machine_for
from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.lifecycle import Edge
from turnkeeper.spec.records import Lease
from turnkeeper.spec.tool_execution import (
    TOOL_EXECUTION,
    ToolExecution,
)

from ..backend import Conflict, Tx, keyed, utc
from . import leases, sealed_json

MACHINE = machine_for(TOOL_EXECUTION)


COLS = (
    "execution_key, session_id, run_id, local_turn_id, provider, api, response_id, "
    "provider_call_id, tool_kind, tool_name, args_digest, side_effecting, state, result, "
    "is_error, provider_metadata, reason, attempt, lease_epoch, created_at, updated_at, "
    "completed_at"
)


RESULT = "result"
"""The field name a record's result is sealed under (``tool_executions.result``)."""

METADATA = "provider_metadata"
"""The field name a record's provider metadata is sealed under
(``tool_executions.provider_metadata``)."""

STATE_AT = "state = ? AND attempt = ?"
"""A record still in this state at this attempt: its compare-and-set."""


def record_row(tx: Tx, row: Sequence[Any]) -> ToolExecution:
    """A stored row (:data:`COLS`) as a record, its result and provider
    metadata opened when sealed (record id: the execution key).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: see
            ``sealed_json.open_json``.
    """
    session_id, key = row[1], row[0]
    return ToolExecution(
        execution_key=row[0],
        session_id=row[1],
        run_id=row[2],
        local_turn_id=row[3],
        provider=row[4],
        api=row[5],
        response_id=row[6],
        provider_call_id=row[7],
        tool_kind=row[8],
        tool_name=row[9],
        args_digest=row[10],
        side_effecting=row[11],
        state=row[12],
        result=None
        if row[13] is None
        else sealed_json.open_json(tx, session_id, key, RESULT, row[13]),
        is_error=row[14],
        provider_metadata=sealed_json.open_json(tx, session_id, key, METADATA, row[15]),
        reason=row[16],
        attempt=row[17],
        lease_epoch=row[18],
        created_at=utc(row[19]),
        updated_at=utc(row[20]),
        completed_at=None if row[21] is None else utc(row[21]),
    )


def facts(rec: ToolExecution) -> dict[str, object]:
    return {"side_effecting": rec.side_effecting}


def get(tx: Tx, execution_key: str) -> ToolExecution | None:
    """The record of ``execution_key``, or ``None``."""
    row = tx.one(f"SELECT {COLS} FROM tool_executions WHERE execution_key = ?", [execution_key])
    return None if row is None else record_row(tx, row)


def load(tx: Tx, execution_key: str) -> ToolExecution:
    rec = get(tx, execution_key)
    if rec is None:
        raise errors.ToolExecutionNotFoundError(execution_key)
    return rec


def select(
    tx: Tx, session_id: str, conditions: str = "TRUE", params: Sequence[Any] = ()
) -> list[ToolExecution]:
    """The session's records that meet ``conditions`` (SQL, with ``params``),
    oldest first: a read of the session's rows (every record, on DuckDB)."""
    rows = tx.rows(
        f"SELECT {COLS} FROM tool_executions WHERE session_id = ? AND {conditions} "
        "ORDER BY created_at, execution_key",
        [session_id, *params],
    )
    return [record_row(tx, r) for r in rows]


def of_turn(
    tx: Tx, session_id: str, turn_id: str, conditions: str = "TRUE", params: Sequence[Any] = ()
) -> list[ToolExecution]:
    """The session's records of local turn ``turn_id`` that meet ``conditions``,
    oldest first, found through ``tool_executions_by_turn`` on DuckDB."""
    return _keyed(tx, "local_turn_id", turn_id, session_id, conditions, params)


def of_run(tx: Tx, session_id: str, run_id: str, turn_id: str) -> list[ToolExecution]:
    """The session's records of run ``run_id`` or of its turn ``turn_id`` (a call
    claimed in the turn before the run was named on it), oldest first, ties in
    the database's order of the keys (as :func:`select` lists them): one
    statement of two lookups, each through an index of its own on DuckDB."""
    rows = tx.rows(
        f"SELECT {COLS} FROM tool_executions WHERE {keyed('run_id', 'session_id = ?')} "
        f"UNION SELECT {COLS} FROM tool_executions "
        f"WHERE {keyed('local_turn_id', 'session_id = ?')} "
        "ORDER BY created_at, execution_key",
        [run_id, session_id, turn_id, session_id],
    )
    return [record_row(tx, r) for r in rows]


def _keyed(
    tx: Tx, key: str, value: str, session_id: str, conditions: str, params: Sequence[Any]
) -> list[ToolExecution]:
    rows = tx.rows(
        f"SELECT {COLS} FROM tool_executions "
        f"WHERE {keyed(key, f'session_id = ? AND {conditions}')} "
        "ORDER BY created_at, execution_key",
        [value, session_id, *params],
    )
    return [record_row(tx, r) for r in rows]


def require_session(tx: Tx, session_id: str) -> int | None:
    """The session's data key version (``sessions.key_version``; ``None``:
    its payloads are clear).

    Raises:
        SessionNotFoundError: no such session.
    """
    return sealed_json.session_version(tx, session_id)


def own_session(session_id: str, lease: Lease | None) -> None:
    if lease is not None and lease.target != session_target(session_id):
        raise errors.InvalidInputError(
            "lease", f"a lease on {lease.target!r} cannot write to {session_id!r}"
        )


def no_other_owner(tx: Tx, session_id: str, lease: Lease | None) -> None:
    """Fence ``lease``; without one, refuse while anyone holds a live session lease.

    Raises:
        LeaseLostError: ``lease`` is no longer the held, unexpired one.
        BusyError: no lease given and a live lease is held (whoever holds it).
    """
    leases.fence_or_unheld(tx, session_target(session_id), lease)


def event(tx: Tx, rec: ToolExecution, edge: Edge) -> None:
    tx.exec(
        "INSERT INTO tool_execution_events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            rec.execution_key,
            rec.session_id,
            rec.attempt,
            edge.name,
            edge.trigger,
            edge.source,
            edge.dest,
            rec.lease_epoch,
            tx.now,
        ],
    )


def move(
    tx: Tx, rec: ToolExecution, edge: Edge, sets: str = "", params: Sequence[Any] = ()
) -> ToolExecution:
    """Compare-and-set ``rec`` along ``edge`` and append its event; a moved row is a race."""
    extra = f", {sets}" if sets else ""
    row = tx.one(
        f"UPDATE tool_executions SET state = ?, updated_at = ?{extra} "
        f"WHERE {keyed('execution_key', STATE_AT)} RETURNING {COLS}",
        [edge.dest, tx.now, *params, rec.execution_key, edge.source, rec.attempt],
    )
    if row is None:
        raise Conflict(f"tool execution {rec.execution_key!r} moved")
    moved = record_row(tx, row)
    event(tx, moved, edge)
    return moved
