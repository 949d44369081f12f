"""Outbox claims (session seed ClaimDeliveryOperation, UpdateDeliveryOperation,
RequeueDeliveryOperation): each claim raises the operation's epoch by one,
and every progress, result or requeue must carry the owner and epoch of the
current, unexpired claim (the fence), so a delayed worker never overwrites a
later retry."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.delivery import (
    CLAIMED_STATES,
    DONE,
    RESULT_TRIGGERS,
    TERMINAL,
    DeliveryOperation,
    DeliveryStatus,
)
from turnkeeper.spec.lifecycle import Edge

from ..backend import Conflict, Tx, keyed, present
from ..codec import check_id, check_text, to_json
from ..validate import (
    check_int,
    check_seconds,
    check_ttl,
)
from ..wakeups import Topic
from . import outbox_plans
from .outbox_plans import OutboxPlansPart

_CLAIM_IS = "status = ? AND lease_epoch = ?"
"""An operation still in this status under this claim epoch: its compare-and-set."""


def claim(tx: Tx, operation_id: str, owner: str, ttl_s: float) -> DeliveryOperation:
    """Claim the operation for ``owner`` for ``ttl_s`` seconds, raising its epoch by one.

    Raises:
        DeliveryOperationBusyError: it is terminal, claimed by a live claim,
            not due, or waiting on its dependency.
        DeliveryOperationNotFoundError.
    """
    if tx.dialect.skip_locked:  # another worker's claim in flight: busy at once, no wait
        locked = tx.one(
            "SELECT id FROM delivery_operations o WHERE id = ?" + tx.dialect.skip_locked_of("o"),
            [operation_id],
        )
        if locked is None and outbox_plans.get_operation(tx, operation_id) is not None:
            raise errors.DeliveryOperationBusyError(
                operation_id, "another worker is claiming or updating it"
            )
    op = outbox_plans.load(tx, operation_id)
    now = tx.clock_after_locks()  # after the row's lock (taken above on a server)
    dep = None if op.depends_on is None else outbox_plans.get_operation(tx, op.depends_on)
    facts = {
        "due": op.next_attempt_at is None or op.next_attempt_at <= now,
        "dependency_done": dep is None or dep.status in DONE,
        "claim_expired": op.lease_expires_at is not None and op.lease_expires_at <= now,
    }
    edge = (
        outbox_plans.MACHINE.decide("claim", op.status, facts)
        if op.status not in TERMINAL
        else None
    )
    if edge is None:
        raise errors.DeliveryOperationBusyError(operation_id, _why_busy(op, dep, facts))
    row = tx.one(
        "UPDATE delivery_operations SET status = 'claimed', lease_owner = ?, "
        "lease_epoch = lease_epoch + 1, lease_ttl_s = ?, lease_expires_at = ?, "
        "attempt_count = attempt_count + 1, next_attempt_at = NULL, updated_at = ? "
        f"WHERE {keyed('id', _CLAIM_IS)} RETURNING {outbox_plans.OP_COLS}",
        [owner, ttl_s, now + timedelta(seconds=ttl_s), now, op.id, op.status, op.lease_epoch],
    )
    if row is None:
        raise Conflict(f"delivery operation {op.id!r} moved")
    claimed = outbox_plans.op_row(row)
    outbox_plans.event(tx, claimed, edge)
    return claimed


def _why_busy(
    op: DeliveryOperation, dep: DeliveryOperation | None, facts: Mapping[str, bool]
) -> str:
    if op.status in TERMINAL:
        return f"it is {op.status}"
    if op.status in CLAIMED_STATES:
        return f"claimed by {op.lease_owner!r} (epoch {op.lease_epoch}) until {op.lease_expires_at}"
    if not facts["dependency_done"]:
        assert dep is not None
        return f"waiting on {dep.id!r}, which is {dep.status}"
    return f"not due until {op.next_attempt_at}"


def _fence(tx: Tx, operation_id: str, owner: str, epoch: int) -> DeliveryOperation:
    """The operation, if ``owner``/``epoch`` is its current, unexpired claim: its
    row read locked (``Dialect.update_lock``), the claim's expiry judged at a
    clock read after that (``Tx.clock_after_locks``) and kept as the write's
    limit (``Tx.valid_until``), as a lease's fence judges its lease."""
    op = outbox_plans.load(tx, operation_id, tx.dialect.update_lock())
    if op.lease_owner != owner or op.lease_epoch != epoch:
        raise errors.DeliveryLeaseLostError(
            operation_id, owner, epoch, detail=f"the current claim is epoch {op.lease_epoch}"
        )
    if op.status not in CLAIMED_STATES:
        raise errors.DeliveryLeaseLostError(
            operation_id, owner, epoch, detail=f"the claim ended: the operation is {op.status}"
        )
    lost = errors.DeliveryLeaseLostError(operation_id, owner, epoch, detail="the claim expired")
    if op.lease_expires_at is None or op.lease_expires_at <= tx.clock_after_locks():
        raise lost
    tx.valid_until(op.lease_expires_at, lost)
    return op


def _move(tx: Tx, op: DeliveryOperation, edge: Edge, sets: str, params: list[Any]) -> Any:
    row = tx.one(
        f"UPDATE delivery_operations SET status = ?, updated_at = ?, {sets} "
        f"WHERE {keyed('id', _CLAIM_IS)} RETURNING {outbox_plans.OP_COLS}",
        [edge.dest, tx.now, *params, op.id, edge.source, op.lease_epoch],
    )
    if row is None:
        raise Conflict(f"delivery operation {op.id!r} moved")
    moved = outbox_plans.op_row(row)
    outbox_plans.event(tx, moved, edge)
    return moved


_RESULT_SETS = (
    "provider_asset_id = coalesce(?, provider_asset_id), "
    "provider_message_id = coalesce(?, provider_message_id), "
    "provider_state = coalesce(?, provider_state), failure_code = coalesce(?, failure_code)"
)


def _result_params(result: Mapping[str, Any]) -> list[Any]:
    state = result.get("provider_state")
    return [
        result.get("provider_asset_id"),
        result.get("provider_message_id"),
        None if state is None else to_json(dict(state), "provider_state"),
        result.get("failure_code"),
    ]


def progress(
    tx: Tx, operation_id: str, owner: str, epoch: int, result: Mapping[str, Any]
) -> DeliveryOperation:
    """Record an in-flight provider phase, keeping the claim and extending it by its ttl.

    Raises:
        DeliveryLeaseLostError, DeliveryOperationNotFoundError.
    """
    op = _fence(tx, operation_id, owner, epoch)
    edge = outbox_plans.MACHINE.require("progress", op.status, {})
    row = tx.one("SELECT lease_ttl_s FROM delivery_operations WHERE id = ?", [op.id])
    row = present(row, "the claimed operation's lease_ttl_s")
    assert tx.now is not None  # always set inside a transaction
    expires = tx.now + timedelta(seconds=row[0])
    moved: DeliveryOperation = _move(
        tx, op, edge, f"{_RESULT_SETS}, lease_expires_at = ?", [*_result_params(result), expires]
    )
    return moved


def _same_result(op: DeliveryOperation, status: str, result: Mapping[str, Any]) -> bool:
    state = result.get("provider_state")
    return (
        op.status == status
        and all(
            result.get(name) is None or result.get(name) == getattr(op, name)
            for name in ("provider_asset_id", "provider_message_id", "failure_code")
        )
        and (state is None or dict(state) == dict(op.provider_state))
    )


def finish(
    tx: Tx,
    operation_id: str,
    owner: str,
    epoch: int,
    status: DeliveryStatus,
    result: Mapping[str, Any],
) -> DeliveryOperation:
    """Record a terminal provider result and refresh the intent's status.

    Raises:
        DeliveryLeaseLostError: the claim is stale, expired or ended (unless
            this very result is already stored under it: then idempotent).
        InvalidTransitionError: this claim already recorded another result.
        DeliveryOperationNotFoundError.
    """
    op = outbox_plans.load(tx, operation_id)
    trigger = RESULT_TRIGGERS[status]
    if op.status in TERMINAL and op.lease_owner == owner and op.lease_epoch == epoch:
        if _same_result(op, status, result):
            return op  # a retry after an unknown commit result
        raise errors.InvalidTransitionError(
            "delivery", trigger, op.status, detail="this claim already recorded a result"
        )
    op = _fence(tx, operation_id, owner, epoch)
    edge = outbox_plans.MACHINE.require(trigger, op.status, {})
    moved: DeliveryOperation = _move(
        tx, op, edge, f"{_RESULT_SETS}, lease_expires_at = NULL", _result_params(result)
    )
    outbox_plans.refresh_intent(tx, moved.intent_id)
    tx.notify(Topic.DELIVERY_DUE)  # a finished step frees its dependents; a requeue is due
    return moved


def requeue(
    tx: Tx, operation_id: str, owner: str, epoch: int, delay_s: float, failure_code: str
) -> DeliveryOperation:
    """Release the claim for an explicit retry after ``delay_s`` seconds.

    Raises:
        DeliveryLeaseLostError, DeliveryOperationNotFoundError.
    """
    op = _fence(tx, operation_id, owner, epoch)
    edge = outbox_plans.MACHINE.require("requeue", op.status, {})
    assert tx.now is not None
    moved: DeliveryOperation = _move(
        tx,
        op,
        edge,
        "next_attempt_at = ?, failure_code = ?, lease_expires_at = NULL",
        [tx.now + timedelta(seconds=delay_s), failure_code],
    )
    tx.notify(Topic.DELIVERY_DUE)  # a finished step frees its dependents; a requeue is due
    return moved


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


# -- the store's methods ------------------------------------------------------------


class Outbox(OutboxPlansPart):
    """Claim, progress, finish and requeue outbox operations."""

    def claim(self, operation_id: str, owner: str, ttl_s: float) -> DeliveryOperation:
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
        return self.db.write("claim_delivery", lambda tx: claim(tx, operation_id, owner, ttl))

    def update_progress(
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
            lambda tx: progress(tx, operation_id, owner, epoch, result),
        )

    def finish(
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
            lambda tx: finish(tx, operation_id, owner, epoch, final, result),
        )

    def requeue(
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
            lambda tx: requeue(tx, operation_id, owner, epoch, delay, failure_code),
        )
