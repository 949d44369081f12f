"""Tool-execution records on DuckDB (session seed ToolExecutionRecord functions).

Every state change reads the record, asks the tool-execution machine which
edge the trigger takes from the stored state, writes the destination with a
compare-and-set (``WHERE state = ? AND attempt = ?``; a moved row is a lost
race, retried by the transaction boundary) and appends an event row, all in
one transaction. Interrupting closes, in the same transaction, every call
open in the replayed context (the tool's own result from the completed
record that belongs to it, else an explicit interrupted one), and
abandoning gives each abandoned record's call still open there its
interrupted result, in call order and in the call's shape (a pi
``toolResult``, or an OpenAI ``tool`` message: ``tool_pairing``), so every
call is paired and no output is invented. Interrupting, reclaiming and
abandoning refuse while another owner holds a live lease on the session:
only an owner that knows the previous process is gone may touch its calls.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from turnkeeper.spec import errors
from turnkeeper.spec.records import Lease
from turnkeeper.spec.run import TERMINAL
from turnkeeper.spec.tool_execution import (
    UNCERTAIN,
    ToolExecution,
    ToolExecutionState,
)

from ..backend import Conflict, Tx, keyed, present
from ..codec import check_id, check_text, from_json, to_json
from ..validate import check_bool, check_lease, check_session_lease
from . import run_reads, sealed_json, tool_pairing
from . import tool_records as records
from .base import Area

"""A run still in this status and without an error: an annotation's compare-and-set."""


def session_records(tx: Tx, session_id: str) -> list[ToolExecution]:
    """Every record of the session, oldest first."""
    return records.select(tx, session_id)


BINDING = (
    "session_id",
    "run_id",
    "local_turn_id",
    "provider_call_id",
    "tool_name",
    "side_effecting",
    "args_digest",
)
"""What the first claim binds an execution key to; a later claim must match it."""


def claim(tx: Tx, columns: Mapping[str, Any], lease: Lease | None) -> tuple[ToolExecution, bool]:
    """Claim ``columns["execution_key"]``; returns ``(record, created)``.

    An existing key bound to the same call (every :data:`BINDING` field equal:
    a retried claim) returns its record, whatever its state, and writes nothing.

    Raises:
        ToolExecutionConflictError: the key is bound to another call.
        SessionNotFoundError, RunNotFoundError, LeaseLostError,
        InvalidInputError (the run belongs to another session).
    """
    found = records.get(tx, columns["execution_key"])
    if found is not None:
        differs = next((f for f in BINDING if getattr(found, f) != columns[f]), None)
        if differs is not None:
            raise errors.ToolExecutionConflictError(found.execution_key, differs, found.run_id)
        return found, False
    session_id = columns["session_id"]
    version = records.require_session(tx, session_id)
    if lease is not None:  # a stale holder learns it lost, whatever its run did since
        records.no_other_owner(tx, session_id, lease)
    run_id = columns["run_id"]
    if run_id is not None:
        run = run_reads.get(tx, run_id)
        if run is None:
            raise errors.RunNotFoundError(run_id)
        if run.session_id != session_id:
            raise errors.InvalidInputError("run_id", f"run {run_id!r} is not in {session_id!r}")
        if run.status in TERMINAL:
            raise errors.InvalidInputError("run_id", f"run {run_id!r} ended {run.status}")
        if columns["local_turn_id"] != run.turn_id:
            raise errors.InvalidInputError(
                "local_turn_id", f"run {run_id!r} runs turn {run.turn_id!r}"
            )
    if lease is None:  # without a lease, nobody else may hold the session
        records.no_other_owner(tx, session_id, None)
    edge = records.MACHINE.require("claim", "absent", {"side_effecting": columns["side_effecting"]})
    key, metadata = columns["execution_key"], columns["provider_metadata"]
    metadata = sealed_json.seal_one(tx, session_id, key, records.METADATA, metadata, version)
    values = {
        **columns,
        "provider_metadata": metadata,
        "state": edge.dest,
        "result": None,
        "is_error": False,
        "reason": None,
        "attempt": 1,
        "lease_epoch": None if lease is None else lease.epoch,
        "created_at": tx.now,
        "updated_at": tx.now,
        "completed_at": None,
    }
    names = [c.strip() for c in records.COLS.split(",")]
    row = tx.one(
        f"INSERT INTO tool_executions ({records.COLS}) VALUES ({', '.join('?' for _ in names)}) "
        f"RETURNING {records.COLS}",
        [values[n] for n in names],
    )
    row = present(row, "the tool record its INSERT returns")
    rec = records.record_row(tx, row)
    records.event(tx, rec, edge)
    return rec, True


def complete(
    tx: Tx, execution_key: str, result_json: str, is_error: bool, lease: Lease | None
) -> ToolExecution:
    """Record the tool's own result on a running record.

    Repeating the completion with the same result returns the stored record
    and writes nothing (a retry after an unknown commit result).

    Raises:
        ToolExecutionNotFoundError, InvalidTransitionError (not running, or
        completed with another result), LeaseLostError, InvalidInputError.
    """
    rec = records.load(tx, execution_key)
    records.own_session(rec.session_id, lease)
    same = (rec.result, rec.is_error) == (from_json(result_json), is_error)
    if rec.state == ToolExecutionState.COMPLETED and same:
        return rec  # a repeated completion after an unknown commit result
    records.no_other_owner(tx, rec.session_id, lease)
    edge = records.MACHINE.require("complete", rec.state, records.facts(rec))
    key = rec.execution_key
    stored = sealed_json.seal_one(tx, rec.session_id, key, records.RESULT, result_json)
    return records.move(
        tx, rec, edge, "result = ?, is_error = ?, completed_at = ?", [stored, is_error, tx.now]
    )


def interrupt(
    tx: Tx, session_id: str, local_turn_id: str | None, reason: str, lease: Lease | None
) -> list[ToolExecution]:
    """Mark the session's running records (of one turn, if given) interrupted and
    close every call open at the leaf (``tool_pairing.close_session``).

    Raises:
        SessionNotFoundError, BusyError, LeaseLostError.
    """
    records.require_session(tx, session_id)
    records.no_other_owner(tx, session_id, lease)
    epoch = None if lease is None else lease.epoch
    return tool_pairing.close_session(tx, session_id, local_turn_id, reason, epoch)


def request_retry(
    tx: Tx, session_id: str, local_turn_id: str, call_ids: Sequence[str]
) -> list[ToolExecution]:
    """Mark the turn's selected interrupted side-effecting calls ``retry_requested``.

    Returns the selected records now retry-requested (including ones a
    previous request already marked); completed, abandoned, running and
    read-only records are left untouched and not returned.

    Raises:
        SessionNotFoundError.
    """
    records.require_session(tx, session_id)
    selected = records.of_turn(
        tx, session_id, local_turn_id, "provider_call_id = ANY(?::VARCHAR[])", [list(call_ids)]
    )
    out = []
    for rec in selected:
        if rec.state == ToolExecutionState.RETRY_REQUESTED:
            out.append(rec)
            continue
        if rec.state != ToolExecutionState.INTERRUPTED:
            continue
        edge = records.MACHINE.decide("request_retry", rec.state, records.facts(rec))
        if edge is not None:  # read-only calls need no confirmation: they are reclaimed
            out.append(records.move(tx, rec, edge))
    return out


def reclaim(tx: Tx, execution_key: str, run_id: str | None, lease: Lease | None) -> ToolExecution:
    """Reopen an eligible record as ``running`` with attempt + 1; returns it.

    Raises:
        ToolExecutionNotReclaimableError: the record is completed or abandoned
            (``terminal``), or side-effecting without a confirmed retry
            request (``needs_confirmation``).
        ToolExecutionNotFoundError, BusyError, LeaseLostError, InvalidInputError.
    """
    rec = records.load(tx, execution_key)
    records.own_session(rec.session_id, lease)
    try:
        edge = records.MACHINE.decide("reclaim", rec.state, records.facts(rec))
    except errors.InvalidTransitionError:  # completed or abandoned: never reopened
        raise errors.ToolExecutionNotReclaimableError(
            rec.execution_key, rec.state, "terminal"
        ) from None
    if edge is None:  # the side_effecting guard: only a confirmed retry runs it again
        raise errors.ToolExecutionNotReclaimableError(
            rec.execution_key, rec.state, "needs_confirmation"
        )
    records.no_other_owner(tx, rec.session_id, lease)
    run_id, turn_id = _reclaiming_run(tx, rec, run_id)
    epoch = None if lease is None else lease.epoch
    row = tx.one(
        "UPDATE tool_executions SET state = ?, updated_at = ?, attempt = attempt + 1, "
        "reason = NULL, lease_epoch = ?, run_id = ?, local_turn_id = ? "
        f"WHERE {keyed('execution_key', records.STATE_AT)} "
        f"RETURNING {records.COLS}",
        [edge.dest, tx.now, epoch, run_id, turn_id, rec.execution_key, edge.source, rec.attempt],
    )
    if row is None:
        raise Conflict(f"tool execution {rec.execution_key!r} moved")
    reopened = records.record_row(tx, row)
    records.event(tx, reopened, edge)
    return reopened


def _reclaiming_run(tx: Tx, rec: ToolExecution, run_id: str | None) -> tuple[str | None, str]:
    """The run (and turn) a reclaimed record belongs to: ``run_id`` if given (a
    live run of the record's session), else the record's own, which must not
    have ended."""
    if run_id is None:
        current = None if rec.run_id is None else run_reads.get(tx, rec.run_id)
        if current is not None and current.status in TERMINAL:
            raise errors.InvalidInputError(
                "run_id", f"run {current.id!r} ended: name the run that re-executes the call"
            )
        return rec.run_id, rec.local_turn_id
    run = run_reads.get(tx, run_id)
    if run is None or run.session_id != rec.session_id or run.status in TERMINAL:
        raise errors.InvalidInputError(
            "run_id", f"{run_id!r} is not a live run of session {rec.session_id!r}"
        )
    return run.id, run.turn_id


def abandon(tx: Tx, session_id: str, local_turn_id: str, reason: str, lease: Lease | None) -> int:
    """Abandon the turn's uncertain records; returns how many.

    A call still unpaired in the transcript gets the explicit interrupted
    ``toolResult``.

    Raises:
        SessionNotFoundError, BusyError, LeaseLostError.
    """
    records.require_session(tx, session_id)
    records.no_other_owner(tx, session_id, lease)
    uncertain = sorted(s.value for s in UNCERTAIN)
    found = records.of_turn(tx, session_id, local_turn_id, "state = ANY(?::VARCHAR[])", [uncertain])
    moved = []
    for rec in found:
        edge = records.MACHINE.require("abandon", rec.state, records.facts(rec))
        moved.append(records.move(tx, rec, edge, "reason = ?, completed_at = ?", [reason, tx.now]))
    tool_pairing.pair_all(tx, session_id, moved, None if lease is None else lease.epoch)
    return len(found)


# -- the store's methods ------------------------------------------------------------


def args_digest(arguments: Any) -> str:
    """sha256 hex digest of ``arguments`` as canonical JSON (sorted keys)."""
    to_json(arguments, "arguments")  # refuses what JSON cannot hold, naming the field
    try:
        canonical = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise errors.InvalidInputError("arguments", f"not storable as JSON: {exc}") from None
    return hashlib.sha256(canonical).hexdigest()


class Tools(Area):
    """Claim, complete, interrupt, recover, reclaim and abandon tool executions."""

    def claim(
        self,
        execution_key: str,
        session_id: str,
        *,
        local_turn_id: str,
        provider_call_id: str,
        tool_name: str,
        side_effecting: bool,
        arguments: Any = None,
        run_id: str | None = None,
        provider: str = "",
        api: str = "",
        response_id: str = "",
        tool_kind: str = "",
        provider_metadata: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
    ) -> tuple[ToolExecution, bool]:
        """Atomically claim ``execution_key`` before running a tool (session seed
        ClaimToolExecutionRecord); returns ``(record, created)``.

        ``created`` true: the record is new and ``running`` (attempt 1) and the
        caller may execute the tool. ``created`` false: this same call was
        claimed before (a retry, or another worker of the same run); the
        existing record is returned, whatever its state, and nothing is
        written: consult it (its ``state`` and ``result``) and never execute
        a second time.

        How a key is scoped: the first claim binds ``execution_key`` to its
        session, ``run_id``, ``local_turn_id``, ``provider_call_id``,
        ``tool_name``, ``side_effecting`` and argument digest (a reclaim moves
        it to the fresh run). A claim that differs in any of them is another
        call and is refused (``ToolExecutionConflictError``): another run's
        record, and its result, is never returned as this call's. Provider
        call ids are reused across turns and processes, and some providers
        number them afresh in each reply, so derive keys from the run and the
        assistant message, e.g. ``f"{run.id}:{entry.id}:{provider_call_id}"``.
        ``provider_call_id``
        is the ``toolCall`` block's ``id``; ``arguments`` (any JSON value) is
        stored only as a sha256 digest of its canonical JSON. ``side_effecting``
        decides recovery: read-only calls are reclaimed automatically after an
        interruption, side-effecting ones only after an explicit request. With
        ``lease`` (on ``session:<session_id>``) the lease is fenced in the same
        transaction and its epoch stored on the record.

        Raises:
            ToolExecutionConflictError: the key is bound to another call
                (``field`` names what differs, ``run_id`` the owning run).
            SessionNotFoundError: no such session.
            RunNotFoundError: ``run_id`` names no run.
            LeaseLostError: ``lease`` is no longer valid (checked before the
                run: a stale holder learns it lost whatever its run did since).
            BusyError: no ``lease`` given and someone holds the session.
            InvalidInputError: a bad argument, or ``run_id`` is in another
                session, has ended, or runs another turn than ``local_turn_id``.
        On any error nothing is written.
        """
        for name, value in (
            ("execution_key", execution_key),
            ("session_id", session_id),
            ("local_turn_id", local_turn_id),
            ("provider_call_id", provider_call_id),
            ("tool_name", tool_name),
        ):
            check_id(value, name)
        for name, value in (
            ("provider", provider),
            ("api", api),
            ("response_id", response_id),
            ("tool_kind", tool_kind),
        ):
            check_text(value, name)
        check_bool(side_effecting, "side_effecting")
        if run_id is not None:
            check_id(run_id, "run_id")
        if provider_metadata is not None and not isinstance(provider_metadata, Mapping):
            raise errors.InvalidInputError("provider_metadata", "expected a mapping")
        check_session_lease(session_id, lease)
        columns = {
            "execution_key": execution_key,
            "session_id": session_id,
            "run_id": run_id,
            "local_turn_id": local_turn_id,
            "provider": provider,
            "api": api,
            "response_id": response_id,
            "provider_call_id": provider_call_id,
            "tool_kind": tool_kind,
            "tool_name": tool_name,
            "args_digest": args_digest(arguments),
            "side_effecting": side_effecting,
            "provider_metadata": to_json(dict(provider_metadata or {}), "provider_metadata"),
        }
        return self._fenced("claim_tool_execution", lease, lambda tx: claim(tx, columns, lease))

    def complete(
        self,
        execution_key: str,
        result: Any,
        *,
        is_error: bool = False,
        lease: Lease | None = None,
    ) -> ToolExecution:
        """Record the tool's own result on a ``running`` record: ``completed``
        (session seed UpdateToolExecutionRecord). ``result`` is the result
        summary as JSON (any JSON value); ``is_error`` when the tool reported an
        error. The transcript's ``toolResult`` is the runtime's to append.
        Repeating the same completion returns the stored record and writes
        nothing (a retry after an unknown commit result). With ``lease`` (on
        the record's session) the lease is fenced in the same transaction.

        Raises:
            ToolExecutionNotFoundError: no record has this key.
            InvalidTransitionError: the record is not ``running`` (a call marked
                interrupted keeps its interrupted result; a completed one keeps
                its first result).
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
            InvalidInputError: a bad argument, or a lease on another session.
        On any error nothing is written.
        """
        check_id(execution_key, "execution_key")
        result_json = to_json(result, "result")
        check_bool(is_error, "is_error")
        if lease is not None:
            check_lease(lease)
        return self._fenced(
            "complete_tool_execution",
            lease,
            lambda tx: complete(tx, execution_key, result_json, is_error, lease),
        )

    def interrupt(
        self,
        session_id: str,
        *,
        local_turn_id: str | None = None,
        reason: str = "process lost",
        lease: Lease | None = None,
    ) -> list[ToolExecution]:
        """End what the session's lost tool executions left open, in one
        transaction: mark the session's
        ``running`` records (only ``local_turn_id``'s, if given)
        ``interrupted``, and close every tool call open in the replayed
        context at the leaf, in call order and in the call's shape, as a
        run's end does (``runs.finish``): the tool's own result, unchanged,
        when the record that belongs to the call completed (only its
        transcript entry was lost); an explicit interrupted result when that
        record is running (it is marked ``interrupted`` too, whatever its
        turn), was interrupted or abandoned, or when the call has no record
        at all (never claimed; or left open by an older turnkeeper, whose
        run ends closed only pi-style calls).
        Nothing is re-run and no output is invented. The interrupted result
        is a ``toolResult`` with ``isError`` true and a text saying it was
        interrupted (an OpenAI ``tool`` message saying so for an OpenAI-style
        call); its entry id is ``<execution_key>:interrupted`` for a record
        interrupted now (``<execution_key>:<attempt>:interrupted`` after a
        reclaim), else ``<assistant entry id>:<call id>:interrupted``, which
        is also the id of a completed record's result (an id the session
        holds already gets a random one instead). A record belongs to a call
        by its provider call id and, when the session reuses the id, by
        when it was claimed (README, "Tool calls and their results"): a
        record of an earlier call with the same id gives a later call
        nothing. Returns the records interrupted, oldest first (empty when
        none was running, though calls may have been closed). Call it before
        the run's turn is closed (``recovery.converge``, ``runs.finish``),
        so that the results land inside the turn, or to let a message in
        while the run goes on.

        Call it only once the previous owner is gone: with ``lease`` (on
        ``session:<session_id>``) the lease is fenced; without one, a live
        lease held by anyone on the session refuses it.

        Raises:
            BusyError: no ``lease`` given and the session's lease is live.
            SessionNotFoundError, LeaseLostError, InvalidInputError.
        On any error nothing is written.
        """
        check_id(session_id, "session_id")
        if local_turn_id is not None:
            check_id(local_turn_id, "local_turn_id")
        check_text(reason, "reason", allow_empty=False)
        check_session_lease(session_id, lease)
        return self._fenced(
            "interrupt_tool_executions",
            lease,
            lambda tx: interrupt(tx, session_id, local_turn_id, reason, lease),
        )

    def request_recovery(
        self, session_id: str, local_turn_id: str, provider_call_ids: Sequence[str]
    ) -> list[ToolExecution]:
        """Record the user's explicit confirmation to retry the selected
        interrupted calls of a turn (session seed RequestToolExecutionRecovery,
        RequestToolExecutionRecoveryRecords): each selected ``interrupted``
        side-effecting record becomes ``retry_requested``. Returns the
        selected records that are now retry-requested (a repeated request
        returns them again and writes nothing more). Completed, abandoned and
        running records are never changed; read-only ones need no
        confirmation (:meth:`tools.reclaim` takes them) and are not
        returned. No tool is executed: the caller reclaims each returned
        record before running it again, in a fresh run.

        Raises:
            SessionNotFoundError, InvalidInputError.
        On any error nothing is written.
        """
        check_id(session_id, "session_id")
        check_id(local_turn_id, "local_turn_id")
        if isinstance(provider_call_ids, str) or not isinstance(provider_call_ids, Sequence):
            raise errors.InvalidInputError("provider_call_ids", "expected a list of call ids")
        ids = [check_id(c, f"provider_call_ids[{i}]") for i, c in enumerate(provider_call_ids)]
        return self.db.write(
            "request_tool_execution_recovery",
            lambda tx: request_retry(tx, session_id, local_turn_id, ids),
        )

    def reclaim(
        self, execution_key: str, *, run_id: str | None = None, lease: Lease | None = None
    ) -> ToolExecution:
        """Atomically reopen a record after a process interruption (session seed
        ReclaimInterruptedToolExecution): a read-only ``running`` or
        ``interrupted`` record, or a side-effecting ``retry_requested`` one,
        becomes ``running`` with attempt + 1, and the caller may execute the
        tool again. Returns the reopened record. Where the seed answers
        ``false``, this raises :class:`ToolExecutionNotReclaimableError`,
        whose ``reason`` says why (the tool-execution lifecycle,
        ``spec/tool_execution.py``, has no ``reclaim`` edge from there):
        ``"terminal"`` for a completed record (use its stored result) or an
        abandoned one (a new run makes a new call), ``"needs_confirmation"``
        for a side-effecting one without an explicit, user-confirmed retry
        request (:meth:`tools.request_recovery`).

        ``run_id`` is the fresh, non-terminal run of the same session that
        re-executes the call: the record moves to it (and its turn). It is
        required when the record's run has ended (a terminal run is never
        reactivated to consume a record).

        With ``lease`` (on the record's session) the lease is fenced and its
        epoch stored on the record; without one, a live lease held by anyone
        on the session refuses the reclaim.

        Raises:
            ToolExecutionNotReclaimableError: the record is not eligible (see
                above; its ``source`` is the record's state).
            ToolExecutionNotFoundError: no record has this key.
            BusyError: no ``lease`` given and the session's lease is live.
            LeaseLostError: ``lease`` is no longer valid.
            InvalidInputError: a bad argument, a lease on another session, or
                ``run_id`` missing (the record's run ended), unknown, terminal
                or of another session.
        On any error nothing is written.
        """
        check_id(execution_key, "execution_key")
        if run_id is not None:
            check_id(run_id, "run_id")
        if lease is not None:
            check_lease(lease)
        return self._fenced(
            "reclaim_tool_execution",
            lease,
            lambda tx: reclaim(tx, execution_key, run_id, lease),
        )

    def abandon_interrupted(
        self,
        session_id: str,
        local_turn_id: str,
        *,
        reason: str = "abandoned after interruption",
        lease: Lease | None = None,
    ) -> int:
        """Mark the turn's uncertain records (``running``, ``interrupted``,
        ``retry_requested``) explicitly ``abandoned`` (session seed
        AbandonInterruptedToolExecutionRecords), so that a later user-submitted
        run is a new operation, never a silent replay. Never retries a tool or
        invents an output: a call still open in the replayed context gets the
        explicit interrupted result, in call order (as
        :meth:`tools.interrupt`). Returns how many were abandoned.

        Call it only once no runtime owns the session: with ``lease`` the lease
        is fenced; without one, a live lease held by anyone refuses it.

        Raises:
            BusyError: no ``lease`` given and the session's lease is live.
            SessionNotFoundError, LeaseLostError, InvalidInputError.
        On any error nothing is written.
        """
        check_id(session_id, "session_id")
        check_id(local_turn_id, "local_turn_id")
        check_text(reason, "reason", allow_empty=False)
        check_session_lease(session_id, lease)
        return self._fenced(
            "abandon_interrupted_tool_executions",
            lease,
            lambda tx: abandon(tx, session_id, local_turn_id, reason, lease),
        )

    def get(self, execution_key: str) -> ToolExecution | None:
        """The record of ``execution_key``, or ``None``."""
        check_id(execution_key, "execution_key")
        return self.db.read("get_tool_execution", lambda tx: records.get(tx, execution_key))

    def list(self, session_id: str) -> list[ToolExecution]:
        """Every tool-execution record of the session, oldest first.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(
            session_id,
            self.db.read("session_tool_executions", lambda tx: session_records(tx, session_id)),
        )
