"""A run's usage, progress and structured error (session seed
UpdateSessionRunUsage, UpdateSessionRunProgress, UpdateSessionRunErrorInfo):
``store.runs``' writes of the JSON values a runtime keeps on a run apart from
its status, so that a reconnecting client can read a partial or recovered run.

Each is a session write (``storage/protocol.py``): under the run's session
lease, fenced in the write's own transaction, or while nobody holds the
session. Each compare-and-sets the run's status, so a write that read the run
before a concurrent termination retries and judges the run as it ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.records import Lease, Run
from turnkeeper.spec.run import TERMINAL, RunStatus

from ..backend import Conflict, Tx, keyed
from ..codec import check_id, to_json
from ..validate import check_lease
from . import run_reads
from . import tool_records as records
from .base import Area


def _object(value: object, field: str) -> str:
    """``value`` as JSON object text.

    Raises:
        InvalidInputError: not a mapping, or not storable as JSON.
    """
    if not isinstance(value, Mapping):
        raise errors.InvalidInputError(field, "expected a mapping (a JSON object)")
    return to_json(dict(value), field)


def update_columns(
    tx: Tx,
    run_id: str,
    trigger: str,
    values: Mapping[str, str | None],
    lease: Lease | None,
    *,
    empty: frozenset[str] = frozenset(),
) -> Run:
    """Set the run's JSON ``values`` (column → JSON text; ``None`` leaves a
    column as stored) and ``updated_at``; returns the run as stored.

    ``empty`` names the columns whose value is ``{}``: on a run that ended,
    ``progress`` may only be cleared with ``{}``, and a run that succeeded
    carries no ``error_info`` but ``{}``.

    Raises:
        RunNotFoundError, InvalidTransitionError, LeaseLostError, BusyError,
        InvalidInputError (a lease on another session).
    """
    run = run_reads.get(tx, run_id)
    if run is None:
        raise errors.RunNotFoundError(run_id)
    records.own_session(run.session_id, lease)
    records.no_other_owner(tx, run.session_id, lease)
    if values.get("progress") is not None and "progress" not in empty and run.status in TERMINAL:
        raise errors.InvalidTransitionError(
            "run",
            trigger,
            run.status,
            detail="a run that ended has no progress: clear it with {}",
        )
    if (
        values.get("error_info") is not None
        and "error_info" not in empty
        and run.status == RunStatus.SUCCEEDED
    ):
        raise errors.InvalidTransitionError(
            "run", trigger, run.status, detail="a run that succeeded carries no error"
        )
    sets = [f"{column} = coalesce(?, {column})" for column in values]
    params: list[Any] = [*values.values(), tx.now, run_id, run.status]
    row = tx.one(
        f"UPDATE runs SET {', '.join(sets)}, updated_at = ? "
        f"WHERE {keyed('id', 'status = ?')} RETURNING {run_reads.RUN_COLS}",
        params,
    )
    if row is None:
        raise Conflict(f"run {run_id!r} moved")
    return run_reads.run_row(row)


class RunUsagePart(Area):
    """``store.runs``' usage, progress and structured error writes."""

    def _update(
        self,
        operation: str,
        run_id: str,
        values: Mapping[str, str | None],
        lease: Lease | None,
        empty: frozenset[str],
    ) -> Run:
        check_id(run_id, "run_id")
        if lease is not None:
            check_lease(lease)  # its target is checked against the run's session in the write
        return self._fenced(
            operation,
            lease,
            lambda tx: update_columns(tx, run_id, operation, values, lease, empty=empty),
        )

    def update_usage(
        self,
        run_id: str,
        usage: Mapping[str, Any] | None,
        context_usage: Mapping[str, Any] | None = None,
        *,
        lease: Lease | None = None,
    ) -> Run:
        """Store the run's token usage and context-window usage (session seed
        UpdateSessionRunUsage), apart from its termination, so a reconnecting
        client can read a partial or recovered run's figures. Either value is
        a JSON object in the runtime's own shape (for example pi's
        ``{"input", "output", "cacheRead", "cacheWrite", "totalTokens",
        "cost"}``); ``None`` leaves that value as stored. Any run, ended or
        not. Returns the run as stored (``Run.usage``, ``Run.context_usage``).

        A session write: under the run's session ``lease``, or while nobody
        holds the session. Per-request figures for reports are
        ``store.usage.record``'s.

        Raises:
            RunNotFoundError: no run has this id.
            InvalidInputError: both values ``None``, a value that is not a
                JSON object, or a lease on another session.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        On any error nothing is written.
        """
        if usage is None and context_usage is None:
            raise errors.InvalidInputError("usage", "give usage, context_usage or both")
        values = {
            "usage": None if usage is None else _object(usage, "usage"),
            "context_usage": (
                None if context_usage is None else _object(context_usage, "context_usage")
            ),
        }
        return self._update("update_run_usage", run_id, values, lease, frozenset())

    def update_progress(
        self, run_id: str, progress: Mapping[str, Any], *, lease: Lease | None = None
    ) -> Run:
        """Store the run's latest non-terminal retry/recovery projection, a JSON
        object (session seed UpdateSessionRunProgress); it replaces the last
        one. A run that ended keeps no progress: its terminal caller clears
        it with ``{}``, the only value a run that ended takes. Returns the run
        as stored (``Run.progress``).

        A session write: under the run's session ``lease``, or while nobody
        holds the session.

        Raises:
            InvalidTransitionError: a non-empty ``progress`` for a run that ended.
            RunNotFoundError: no run has this id.
            InvalidInputError: not a JSON object, or a lease on another session.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        On any error nothing is written.
        """
        text = _object(progress, "progress")
        empty = frozenset({"progress"}) if not progress else frozenset()
        return self._update("update_run_progress", run_id, {"progress": text}, lease, empty)

    def update_error_info(
        self, run_id: str, info: Mapping[str, Any], *, lease: Lease | None = None
    ) -> Run:
        """Store the run's structured terminal or recovery error, a JSON object
        (session seed UpdateSessionRunErrorInfo), beside the ``error`` summary
        (which it never changes; see ``runs.annotate_error``); it replaces the
        last one. A run in any state but ``succeeded`` (a recovery error is
        recorded while the run has not ended); a run that succeeded carries
        no error, so it takes only ``{}``. Returns the run as stored
        (``Run.error_info``).

        A session write: under the run's session ``lease``, or while nobody
        holds the session.

        Raises:
            InvalidTransitionError: a non-empty ``info`` for a run that succeeded.
            RunNotFoundError: no run has this id.
            InvalidInputError: not a JSON object, or a lease on another session.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        On any error nothing is written.
        """
        text = _object(info, "info")
        empty = frozenset({"error_info"}) if not info else frozenset()
        return self._update("update_run_error_info", run_id, {"error_info": text}, lease, empty)
