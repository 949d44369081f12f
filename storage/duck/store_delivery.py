"""The delivery outbox of the DuckDB store (session seed delivery functions)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.delivery import (
    RESULT_TRIGGERS,
    DeliveryIntent,
    DeliveryOperation,
    DeliveryPlan,
    DeliveryStatus,
)
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import Lease

from ..codec import check_id, check_text, to_json
from ..validate import (
    check_int,
    check_lease,
    check_limit,
    check_plan,
    check_seconds,
    check_session_lease,
    check_ttl,
)
from . import delivery, leases, runs
from .db import Tx
from .store_base import StoreBase


class DeliveryMixin(StoreBase):
    """Plan, list, claim, progress, finish and requeue outbox operations."""

    def create_delivery_plan(
        self, run_id: str, plan: DeliveryPlan, *, lease: Lease | None = None
    ) -> DeliveryIntent:
        """Persist ``plan`` for a terminal run outside its termination (session
        seed CreateDeliveryPlan): for recovery reconciliation and tools only;
        a runtime passes the plan to ``finish_run`` instead. The same plan
        again returns the stored intent. A session write: under the run's
        session ``lease``, or while nobody holds the session.

        Raises:
            InvalidTransitionError: the run is not terminal yet.
            DeliveryPlanConflictError: the run has a different plan.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
            RunNotFoundError, InvalidInputError.
        """
        check_id(run_id, "run_id")
        check_plan(plan)
        if lease is not None:
            check_lease(lease)

        def body(tx: Tx) -> DeliveryIntent:
            run = runs.get(tx, run_id)
            if run is None:
                raise errors.RunNotFoundError(run_id)
            check_session_lease(run.session_id, lease)
            if run.finished_at is None:
                raise errors.InvalidTransitionError(
                    "delivery", "plan", run.status, detail="a plan follows its run's termination"
                )
            leases.fence_or_unheld(tx, session_target(run.session_id), lease)
            return delivery.create_plan(tx, run, plan)

        return self._fenced("create_delivery_plan", lease, body)

    def get_delivery_plan(
        self, intent_id: str
    ) -> tuple[DeliveryIntent, list[DeliveryOperation]] | None:
        """The intent and its operations in execution order (session seed
        GetDeliveryPlan), or ``None``. A run's intent id is ``<run id>:delivery``."""
        check_id(intent_id, "intent_id")

        def body(tx: Tx) -> tuple[DeliveryIntent, list[DeliveryOperation]] | None:
            intent = delivery.get_intent(tx, intent_id)
            return None if intent is None else (intent, delivery.operations(tx, intent_id))

        return self.db.read("get_delivery_plan", body, snapshot=True)

    def get_delivery_operation(self, operation_id: str) -> DeliveryOperation | None:
        """One operation, without its intent's transport context (session seed
        GetDeliveryOperation), or ``None``."""
        check_id(operation_id, "operation_id")
        return self.db.read(
            "get_delivery_operation", lambda tx: delivery.get_operation(tx, operation_id)
        )

    def list_due_deliveries(self, *, limit: int = 100) -> list[DeliveryOperation]:
        """Operations a worker may claim now, oldest first (session seed
        ListDueDeliveryOperations): pending ones whose next attempt time has
        come and whose dependency is delivered or unsupported, and claimed ones
        whose claim expired. A read: claim each with :meth:`claim_delivery`."""
        check_limit(limit)
        return self.db.read(
            "list_due_deliveries", lambda tx: delivery.due(tx, limit), snapshot=True
        )

    def claim_delivery(self, operation_id: str, owner: str, ttl_s: float) -> DeliveryOperation:
        """Claim the operation for ``owner`` for ``ttl_s`` seconds (session seed
        ClaimDeliveryOperation). Every claim raises the operation's epoch by
        one; the returned operation carries the new ``lease_epoch``, which
        every later update must present.

        Raises:
            DeliveryOperationBusyError: terminal, claimed by a live claim, not
                due yet, or waiting on its dependency (``reason`` says which).
            DeliveryOperationNotFoundError, InvalidInputError.
        """
        check_id(operation_id, "operation_id")
        check_id(owner, "owner")
        ttl = check_ttl(ttl_s)
        return self.db.write(
            "claim_delivery", lambda tx: delivery.claim(tx, operation_id, owner, ttl)
        )

    def update_delivery_progress(
        self,
        operation_id: str,
        owner: str,
        epoch: int,
        *,
        provider_asset_id: str | None = None,
        provider_message_id: str | None = None,
        provider_state: Mapping[str, Any] | None = None,
        failure_code: str | None = None,
    ) -> DeliveryOperation:
        """Record an in-flight provider phase (``in_progress``) under the current
        claim, extending the claim by its ttl (session seed
        UpdateDeliveryOperationProgress). ``None`` leaves a field as it is.

        Raises:
            DeliveryLeaseLostError: ``owner``/``epoch`` is not the current,
                unexpired claim.
            DeliveryOperationNotFoundError, InvalidInputError.
        """
        result = _result(operation_id, owner, epoch, locals())
        return self.db.write(
            "update_delivery_progress",
            lambda tx: delivery.progress(tx, operation_id, owner, epoch, result),
        )

    def finish_delivery(
        self,
        operation_id: str,
        owner: str,
        epoch: int,
        status: str,
        *,
        provider_asset_id: str | None = None,
        provider_message_id: str | None = None,
        provider_state: Mapping[str, Any] | None = None,
        failure_code: str | None = None,
    ) -> DeliveryOperation:
        """Record the terminal provider result ``status`` (``delivered``,
        ``unsupported``, ``failed`` or ``uncertain``) under the current claim and
        recompute the intent's status (session seed UpdateDeliveryOperation and
        RefreshDeliveryIntentStatus). Repeating the stored result under the
        same claim returns it and writes nothing.

        Raises:
            DeliveryLeaseLostError: ``owner``/``epoch`` is not the current,
                unexpired claim.
            InvalidTransitionError: this claim already recorded another result.
            DeliveryOperationNotFoundError, InvalidInputError.
        """
        result = _result(operation_id, owner, epoch, locals())
        try:
            final = DeliveryStatus(status)
        except ValueError:
            final = None
        if final not in RESULT_TRIGGERS:
            allowed = ", ".join(s.value for s in RESULT_TRIGGERS)
            raise errors.InvalidInputError("status", f"must be one of {allowed}, got {status!r}")
        assert final is not None
        return self.db.write(
            "finish_delivery",
            lambda tx: delivery.finish(tx, operation_id, owner, epoch, final, result),
        )

    def requeue_delivery(
        self,
        operation_id: str,
        owner: str,
        epoch: int,
        *,
        delay_s: float = 0.0,
        failure_code: str = "",
    ) -> DeliveryOperation:
        """Release the claim for an explicit retry ``delay_s`` seconds from now
        (session seed RequeueDeliveryOperation): for a provider call that did
        not yield a trustworthy result. The next claim has epoch + 1.

        Raises:
            DeliveryLeaseLostError, DeliveryOperationNotFoundError, InvalidInputError.
        """
        _result(operation_id, owner, epoch, {})
        check_text(failure_code, "failure_code")
        delay = check_seconds(delay_s, "delay_s")
        return self.db.write(
            "requeue_delivery",
            lambda tx: delivery.requeue(tx, operation_id, owner, epoch, delay, failure_code),
        )


def _result(operation_id: str, owner: str, epoch: int, given: Mapping[str, Any]) -> dict[str, Any]:
    """Check the claim identity and the provider fields; the fields that were given."""
    check_id(operation_id, "operation_id")
    check_id(owner, "owner")
    check_int(epoch, "epoch", 1)
    result: dict[str, Any] = {}
    for name in ("provider_asset_id", "provider_message_id", "failure_code"):
        value = given.get(name)
        if value is not None:
            result[name] = check_text(value, name)
    state = given.get("provider_state")
    if state is not None:
        if not isinstance(state, Mapping):
            raise errors.InvalidInputError("provider_state", "expected a mapping")
        to_json(dict(state), "provider_state")
        result["provider_state"] = dict(state)
    return result
