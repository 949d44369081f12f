"""A run's error annotation (session seed AnnotateSessionRunError): ``store.runs``'
write that records why a run that ended without success ended, after the fact.
"""

from __future__ import annotations

from turnkeeper.spec import errors
from turnkeeper.spec.records import Lease
from turnkeeper.spec.run import TERMINAL, RunStatus

from ..backend import Conflict, Tx, keyed
from ..codec import check_id, check_text
from ..validate import check_lease
from . import run_reads
from . import tool_records as records
from .base import Area

_UNANNOTATED = "status = ? AND coalesce(error, '') = ''"


def annotate_run_error(tx: Tx, run_id: str, reason: str, lease: Lease | None) -> bool:
    """Set the error of a run that ended without success and has none; returns
    whether it did (``False``: it has one already).

    Raises:
        RunNotFoundError, InvalidTransitionError (succeeded, or not ended),
        LeaseLostError, BusyError, InvalidInputError (a lease on another session).
    """
    run = run_reads.get(tx, run_id)
    if run is None:
        raise errors.RunNotFoundError(run_id)
    if run.status not in TERMINAL or run.status == RunStatus.SUCCEEDED:
        why = (
            "a run that succeeded carries no error"
            if run.status in TERMINAL
            else ("the run has not ended: end it with finish_run")
        )
        raise errors.InvalidTransitionError("run", "annotate_error", run.status, detail=why)
    records.own_session(run.session_id, lease)
    records.no_other_owner(tx, run.session_id, lease)
    if run.error:
        return False
    row = tx.one(
        f"UPDATE runs SET error = ?, updated_at = ? WHERE {keyed('id', _UNANNOTATED)} RETURNING 1",
        [reason, tx.now, run_id, run.status],
    )
    if row is None:
        raise Conflict(f"run {run_id!r} moved")
    return True


class RunErrorsPart(Area):
    """``store.runs``' error annotation."""

    def annotate_error(self, run_id: str, reason: str, *, lease: Lease | None = None) -> bool:
        """Record ``reason`` as the error of a run that ended without success and
        without an error, for example a run abandoned after an interrupted tool
        execution (session seed AnnotateSessionRunError). Never changes the
        run's status; a no-op (``False``) when the run already carries an
        error, so an earlier finalizer stays authoritative. Returns whether
        the annotation was applied. A session write: under the run's session
        ``lease``, or while nobody holds the session.

        A finished run's outcome is final: a run that ``succeeded`` carries no
        error, and a run that has not ended is ended with ``runs.finish``.

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
            lambda tx: annotate_run_error(tx, run_id, reason, lease),
        )
