"""Tool-execution records of the DuckDB store (session seed ToolExecutionRecord)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from turnkeeper.spec import errors
from turnkeeper.spec.records import Lease
from turnkeeper.spec.tool_execution import ToolExecution

from ..codec import check_id, check_text, to_json
from ..validate import check_bool, check_lease, check_session_lease
from . import tools
from .store_base import StoreBase


def args_digest(arguments: Any) -> str:
    """sha256 hex digest of ``arguments`` as canonical JSON (sorted keys)."""
    to_json(arguments, "arguments")  # refuses what JSON cannot hold, naming the field
    try:
        canonical = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise errors.InvalidInputError("arguments", f"not storable as JSON: {exc}") from None
    return hashlib.sha256(canonical).hexdigest()


class ToolsMixin(StoreBase):
    """Claim, complete, interrupt, recover, reclaim and abandon tool executions."""

    def claim_tool_execution(
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
        call ids are reused across turns and processes, so derive keys from
        the run, e.g. ``f"{run.id}:{provider_call_id}"``. ``provider_call_id``
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
        return self._fenced(
            "claim_tool_execution", lease, lambda tx: tools.claim(tx, columns, lease)
        )

    def complete_tool_execution(
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
            lambda tx: tools.complete(tx, execution_key, result_json, is_error, lease),
        )

    def interrupt_tool_executions(
        self,
        session_id: str,
        *,
        local_turn_id: str | None = None,
        reason: str = "process lost",
        lease: Lease | None = None,
    ) -> list[ToolExecution]:
        """Mark the session's ``running`` records (only ``local_turn_id``'s, if
        given) ``interrupted`` after the process running them was lost, in one
        transaction that also appends, for each call without a result in the
        transcript, an explicit interrupted ``toolResult`` message entry
        (``isError`` true, a text saying it was interrupted, no tool output;
        entry id ``<execution_key>:interrupted``) under the current leaf, so
        every ``toolCall`` is paired. Nothing is re-run. Returns the records
        interrupted, oldest first (empty when none was running). Call it
        before the run's turn is closed (``converge_recovery``,
        ``finish_run``) so that the results land inside the turn.

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
            lambda tx: tools.interrupt(tx, session_id, local_turn_id, reason, lease),
        )

    def request_tool_execution_recovery(
        self, session_id: str, local_turn_id: str, provider_call_ids: Sequence[str]
    ) -> list[ToolExecution]:
        """Record the user's explicit confirmation to retry the selected
        interrupted calls of a turn (session seed RequestToolExecutionRecovery,
        RequestToolExecutionRecoveryRecords): each selected ``interrupted``
        side-effecting record becomes ``retry_requested``. Returns the
        selected records that are now retry-requested (a repeated request
        returns them again and writes nothing more). Completed, abandoned and
        running records are never changed; read-only ones need no
        confirmation (:meth:`reclaim_tool_execution` takes them) and are not
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
            lambda tx: tools.request_retry(tx, session_id, local_turn_id, ids),
        )

    def reclaim_tool_execution(
        self, execution_key: str, *, run_id: str | None = None, lease: Lease | None = None
    ) -> bool:
        """Atomically reopen a record after a process interruption (session seed
        ReclaimInterruptedToolExecution): a read-only ``running`` or
        ``interrupted`` record, or a side-effecting ``retry_requested`` one,
        becomes ``running`` with attempt + 1, and the caller may execute the
        tool again. Returns whether it did; ``False`` (nothing written) for a
        completed or abandoned record, or a side-effecting one without an
        explicit retry request.

        ``run_id`` is the fresh, non-terminal run of the same session that
        re-executes the call: the record moves to it (and its turn). It is
        required when the record's run has ended (a terminal run is never
        reactivated to consume a record).

        With ``lease`` (on the record's session) the lease is fenced and its
        epoch stored on the record; without one, a live lease held by anyone
        on the session refuses the reclaim.

        Raises:
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
            lambda tx: tools.reclaim(tx, execution_key, run_id, lease),
        )

    def abandon_interrupted_tool_executions(
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
        invents an output: a call still without a result in the transcript
        gets the explicit interrupted ``toolResult`` (as
        :meth:`interrupt_tool_executions`). Returns how many were abandoned.

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
            lambda tx: tools.abandon(tx, session_id, local_turn_id, reason, lease),
        )

    def annotate_run_error(self, run_id: str, reason: str, *, lease: Lease | None = None) -> bool:
        """Record ``reason`` as the error of a run that ended without success and
        without an error, for example a run abandoned after an interrupted tool
        execution (session seed AnnotateSessionRunError). Never changes the
        run's status; a no-op (``False``) when the run already carries an
        error, so an earlier finalizer stays authoritative. Returns whether
        the annotation was applied. A session write: under the run's session
        ``lease``, or while nobody holds the session.

        A finished run's outcome is final: a run that ``succeeded`` carries no
        error, and a run that has not ended is ended with ``finish_run``.

        Raises:
            InvalidTransitionError: the run succeeded, or has not ended.
            RunNotFoundError, InvalidInputError (empty reason).
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        On any error nothing is written.
        """
        check_id(run_id, "run_id")
        check_text(reason, "reason", allow_empty=False)
        if lease is not None:
            check_lease(lease)
        return self._fenced(
            "annotate_run_error",
            lease,
            lambda tx: tools.annotate_run_error(tx, run_id, reason, lease),
        )

    def get_tool_execution(self, execution_key: str) -> ToolExecution | None:
        """The record of ``execution_key``, or ``None``."""
        check_id(execution_key, "execution_key")
        return self.db.read("get_tool_execution", lambda tx: tools.get(tx, execution_key))

    def session_tool_executions(self, session_id: str) -> list[ToolExecution]:
        """Every tool-execution record of the session, oldest first.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(
            session_id,
            self.db.read(
                "session_tool_executions", lambda tx: tools.session_records(tx, session_id)
            ),
        )
