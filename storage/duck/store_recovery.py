"""Orphan-run recovery of the DuckDB store (session seed recovery functions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.delivery import DeliveryPlan
from turnkeeper.spec.records import Lease, Recovery, Run
from turnkeeper.spec.run import RunStatus

from ..codec import check_id, check_text, to_json
from ..validate import check_int, check_lease, check_plan, check_seconds
from . import recovery
from .store_base import StoreBase


class RecoveryMixin(StoreBase):
    """List orphans; begin, converge, fail or detach their recovery."""

    def list_orphaned_runs(self) -> list[Run]:
        """Non-terminal runs with no live lease on their session by the store's
        clock (including runs admitted without one), oldest first, leaving out
        runs whose recovery is detached, dead-lettered, or failed and not yet due
        (session seed ListOrphanedSessionRuns). A read: recover each through
        :meth:`begin_recovery` under a recovery lease."""
        return self.db.read("list_orphaned_runs", recovery.orphans, snapshot=True)

    def get_recovery(self, run_id: str) -> Recovery | None:
        """The run's recovery record, or ``None``."""
        check_id(run_id, "run_id")
        return self.db.read("get_recovery", lambda tx: recovery.get(tx, run_id))

    def begin_recovery(
        self, run_id: str, lease: Lease, *, trigger_source: str = "sweep", reason: str = "orphaned"
    ) -> Recovery:
        """Begin recovering ``run_id`` under ``lease`` (purpose ``recovery``, on the
        run's session), re-checking in the same transaction that the run is still
        its session's non-terminal run (session seed BeginSessionRunRecovery). A
        failed recovery is retried once due; a recovery whose worker lost its
        lease is taken over.

        Raises:
            RecoveryNotNeededError: the run is terminal, or its recovery is parked.
            LeasePurposeError: the lease's purpose is not ``recovery``.
            LeaseLostError, RunNotFoundError, InvalidInputError.
        """
        self._check(run_id, lease)
        check_text(trigger_source, "trigger_source")
        check_text(reason, "reason")
        return self._fenced(
            "begin_recovery",
            lease,
            lambda tx: recovery.begin(tx, run_id, lease, trigger_source, reason),
        )

    def converge_recovery(
        self,
        run_id: str,
        lease: Lease,
        *,
        status: str = RunStatus.INTERRUPTED,
        error: str | None = None,
        stop_reason: str | None = None,
        decisions: Sequence[Mapping[str, Any]] = (),
        delivery_plan: DeliveryPlan | None = None,
    ) -> Recovery:
        """Converge: record the resolutions of the run's pending decisions (one
        ``decision`` run event each: a JSON object with a string ``id``, for
        example ``{"id": "approval-7", "resolution": "expired"}``), end the run
        in ``status`` (``cancelled`` instead when a cancel was requested; a run
        already terminal keeps its status), close its open turn, write the
        terminal event and complete the record, in one transaction that
        revalidates the recovery lease (session seed
        ConvergeSessionRunRecovery). A run that already ended keeps its status
        and gets no decision events (its own finalizer stays authoritative):
        check ``get_run`` first if the resolutions must be recorded.
        ``delivery_plan`` (say, a notice that the run was interrupted) is
        written in the same transaction as the run's end, as ``finish_run``
        does, so a recovery that ends a run never loses its notice; a run
        that ended some other way gets none.

        Raises:
            LeaseLostError: the lease is stale or another worker took over.
            InvalidTransitionError: the record is not ``recovering``.
            InvalidInputError: ``status`` is not a terminal run status.
        """
        self._check(run_id, lease)
        try:
            final = RunStatus(status)
        except ValueError:
            raise errors.InvalidInputError("status", f"not a run status: {status!r}") from None
        if final in (RunStatus.ADMITTED, RunStatus.RUNNING, RunStatus.WAITING):
            raise errors.InvalidInputError("status", "convergence ends the run")
        for name, value in (("error", error), ("stop_reason", stop_reason)):
            if value is not None:
                check_text(value, name)
        resolved = _check_decisions(decisions)
        plan = None if delivery_plan is None else check_plan(delivery_plan)
        return self._fenced(
            "converge_recovery",
            lease,
            lambda tx: recovery.converge(
                tx, run_id, lease, final, error, stop_reason, resolved, plan
            ),
        )

    def fail_recovery(
        self,
        run_id: str,
        lease: Lease,
        message: str,
        *,
        max_attempts: int = 5,
        base_delay_s: float = 1.0,
        max_delay_s: float = 300.0,
    ) -> Recovery:
        """Record a failed recovery attempt under the same fenced owner (session
        seed MarkSessionRunRecoveryFailed): retry after ``base_delay_s * 2 **
        (attempt - 1)`` seconds (capped at ``max_delay_s``, plus up to 10 %
        jitter), or dead-letter once ``max_attempts`` attempts failed.

        Raises:
            LeaseLostError, InvalidTransitionError, InvalidInputError.
        """
        self._check(run_id, lease)
        check_text(message, "message")
        check_int(max_attempts, "max_attempts", 1)
        base = check_seconds(base_delay_s, "base_delay_s", allow_zero=False)
        if base > check_seconds(max_delay_s, "max_delay_s", allow_zero=False):
            raise errors.InvalidInputError("base_delay_s", "need base_delay_s <= max_delay_s")
        return self._fenced(
            "fail_recovery",
            lease,
            lambda tx: recovery.fail(
                tx, run_id, lease, message, max_attempts, base_delay_s, max_delay_s
            ),
        )

    def detach_recovery(self, run_id: str, lease: Lease) -> Recovery:
        """Mark the recovery detached: a remote execution still owns the run
        (session seed MarkSessionRunRecoveryDetached). The run is left as it is.

        Raises:
            LeaseLostError, InvalidTransitionError, InvalidInputError.
        """
        self._check(run_id, lease)
        return self._fenced("detach_recovery", lease, lambda tx: recovery.detach(tx, run_id, lease))

    @staticmethod
    def _check(run_id: str, lease: Lease) -> None:
        check_id(run_id, "run_id")
        check_lease(lease)


def _check_decisions(decisions: object) -> list[dict[str, Any]]:
    """Decision resolutions: a sequence of JSON objects, each with a non-empty
    string ``id``, ids unique."""
    if not isinstance(decisions, Sequence) or isinstance(decisions, str | bytes):
        raise errors.InvalidInputError("decisions", "expected a sequence of mappings")
    out: list[dict[str, Any]] = []
    for i, decision in enumerate(decisions):
        if not isinstance(decision, Mapping):
            raise errors.InvalidInputError(f"decisions[{i}]", "expected a mapping")
        check_id(decision.get("id"), f"decisions[{i}].id")
        to_json(dict(decision), f"decisions[{i}]")
        out.append(dict(decision))
    if len({d["id"] for d in out}) != len(out):
        raise errors.InvalidInputError("decisions", "decision ids must be unique")
    return out
