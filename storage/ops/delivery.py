"""The delivery outbox on DuckDB (session seed Create/Claim/Update/RequeueDeliveryOperation).

Every change is a compare-and-set on the operation's status and epoch in the
caller's transaction, checked by the delivery machine first and followed by
a ``delivery_events`` row. Progress, requeue and results are fenced by the
claim: the row's owner and epoch must be the caller's and its expiry must be
ahead of the store's clock, else ``DeliveryLeaseLostError``. A terminal
result that repeats the stored one (same owner, epoch, status and provider
ids) returns the stored operation and writes nothing, so a retry after an
unknown commit result is idempotent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import orjson

from turnkeeper.machines import machine_for
from turnkeeper.spec import errors
from turnkeeper.spec.delivery import (
    CLAIMED_STATES,
    DELIVERY,
    DONE,
    RESULT_TRIGGERS,
    TERMINAL,
    DeliveryIntent,
    DeliveryOperation,
    DeliveryPlan,
    DeliveryStatus,
    intent_status,
)
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.lifecycle import Edge
from turnkeeper.spec.records import Lease, Run

from ..backend import Conflict, Tx, utc
from ..codec import check_id, check_text, from_json, to_json
from ..validate import (
    check_int,
    check_lease,
    check_limit,
    check_plan,
    check_seconds,
    check_session_lease,
    check_ttl,
)
from ..wakeups import Topic
from . import leases, runs
from .base import StoreBase

_MACHINE = machine_for(DELIVERY)

_INTENT_COLS = (
    "id, session_id, run_id, platform, target_id, reply_message_id, status, created_at, "
    "updated_at, transport_context"
)
_OP_COLS = (
    "id, intent_id, operation_key, kind, artifact_id, sequence, depends_on, idempotency_key, "
    "payload_digest, status, provider_asset_id, provider_message_id, provider_state, "
    "attempt_count, next_attempt_at, failure_code, lease_owner, lease_epoch, lease_expires_at, "
    "created_at, updated_at"
)


def _intent(row: Sequence[Any]) -> DeliveryIntent:
    return DeliveryIntent(
        id=row[0],
        session_id=row[1],
        run_id=row[2],
        platform=row[3],
        target_id=row[4],
        reply_message_id=row[5],
        status=row[6],
        created_at=utc(row[7]),
        updated_at=utc(row[8]),
        transport_context=from_json(row[9]),
    )


def _op(row: Sequence[Any]) -> DeliveryOperation:
    return DeliveryOperation(
        id=row[0],
        intent_id=row[1],
        key=row[2],
        kind=row[3],
        artifact_id=row[4],
        sequence=row[5],
        depends_on=row[6],
        idempotency_key=row[7],
        payload_digest=row[8],
        status=row[9],
        provider_asset_id=row[10],
        provider_message_id=row[11],
        provider_state=from_json(row[12]),
        attempt_count=row[13],
        next_attempt_at=None if row[14] is None else utc(row[14]),
        failure_code=row[15],
        lease_owner=row[16],
        lease_epoch=row[17],
        lease_expires_at=None if row[18] is None else utc(row[18]),
        created_at=utc(row[19]),
        updated_at=utc(row[20]),
    )


def plan_digest(plan: DeliveryPlan) -> str:
    """sha256 of the plan's canonical JSON: the same plan twice has one digest."""
    body = {
        "platform": plan.platform,
        "target": plan.target_id,
        "reply": plan.reply_message_id,
        "context": dict(plan.transport_context),
        "steps": [
            [s.key, s.kind, s.artifact_id, s.depends_on, s.idempotency_key, s.payload_digest]
            for s in plan.steps
        ],
    }
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def intent_id_for(run_id: str) -> str:
    """The delivery intent id of a run (one intent per run, derived so retries agree)."""
    return f"{run_id}:delivery"


def get_intent(tx: Tx, intent_id: str) -> DeliveryIntent | None:
    """The intent, or ``None``."""
    row = tx.one(f"SELECT {_INTENT_COLS} FROM delivery_intents WHERE id = ?", [intent_id])
    return None if row is None else _intent(row)


def operations(tx: Tx, intent_id: str) -> list[DeliveryOperation]:
    """The intent's operations in execution order."""
    rows = tx.rows(
        f"SELECT {_OP_COLS} FROM delivery_operations WHERE intent_id = ? ORDER BY sequence",
        [intent_id],
    )
    return [_op(r) for r in rows]


def get_operation(tx: Tx, operation_id: str) -> DeliveryOperation | None:
    """The operation, or ``None``."""
    row = tx.one(f"SELECT {_OP_COLS} FROM delivery_operations WHERE id = ?", [operation_id])
    return None if row is None else _op(row)


def _event(tx: Tx, op: DeliveryOperation, edge: Edge) -> None:
    tx.exec(
        "INSERT INTO delivery_events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            op.id,
            op.intent_id,
            edge.name,
            edge.trigger,
            edge.source,
            edge.dest,
            op.lease_owner,
            op.lease_epoch,
            tx.now,
        ],
    )


def create_plan(tx: Tx, run: Run, plan: DeliveryPlan) -> DeliveryIntent:
    """Write the run's intent and its ``pending`` operations (``plan`` edges).

    The same plan again returns the stored intent and writes nothing.

    Raises:
        DeliveryPlanConflictError: the run already has a different plan.
    """
    intent_id = intent_id_for(run.id)
    digest = plan_digest(plan)
    found = tx.one("SELECT plan_digest FROM delivery_intents WHERE id = ?", [intent_id])
    if found is not None:
        if found[0] != digest:
            raise errors.DeliveryPlanConflictError(run.id, intent_id)
        existing = get_intent(tx, intent_id)
        assert existing is not None
        return existing
    tx.notify(Topic.DELIVERY_DUE)
    now = tx.now
    tx.exec(
        f"INSERT INTO delivery_intents ({_INTENT_COLS}, plan_digest) "
        "VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
        [
            intent_id,
            run.session_id,
            run.id,
            plan.platform,
            plan.target_id,
            plan.reply_message_id,
            now,
            now,
            to_json(dict(plan.transport_context), "transport_context"),
            digest,
        ],
    )
    edge = _MACHINE.require("plan", "absent", {})
    for seq, step in enumerate(plan.steps, start=1):
        op_id = f"{intent_id}:{step.key}"
        dep = None if step.depends_on is None else f"{intent_id}:{step.depends_on}"
        row = tx.one(
            f"INSERT INTO delivery_operations ({_OP_COLS}, lease_ttl_s) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', '', '', '{}', 0, NULL, '', '', 0, NULL, "
            f"?, ?, 0) RETURNING {_OP_COLS}",
            [
                op_id,
                intent_id,
                step.key,
                step.kind,
                step.artifact_id,
                seq,
                dep,
                step.idempotency_key or op_id,
                step.payload_digest,
                now,
                now,
            ],
        )
        assert row is not None
        _event(tx, _op(row), edge)
    intent = get_intent(tx, intent_id)
    assert intent is not None
    return intent


def due(tx: Tx, limit: int) -> list[DeliveryOperation]:
    """Operations a worker may claim now (session seed ListDueDeliveryOperations):
    pending, due and with their dependency done, or claimed with an expired claim."""
    done = ", ".join(f"'{s.value}'" for s in DONE)
    rows = tx.rows(
        f"SELECT {', '.join('o.' + c.strip() for c in _OP_COLS.split(','))} "
        "FROM delivery_operations o LEFT JOIN delivery_operations d ON d.id = o.depends_on "
        "WHERE (o.status = 'pending' AND coalesce(o.next_attempt_at <= ?, TRUE) "
        f"AND (o.depends_on IS NULL OR d.status IN ({done}))) "
        "OR (o.status IN ('claimed', 'in_progress') AND o.lease_expires_at <= ?) "
        "ORDER BY o.created_at, o.intent_id, o.sequence LIMIT ?" + tx.dialect.skip_locked_of("o"),
        # PostgreSQL: leave out operations another worker is claiming right now
        [tx.now, tx.now, limit],
    )
    return [_op(r) for r in rows]


def _load(tx: Tx, operation_id: str) -> DeliveryOperation:
    op = get_operation(tx, operation_id)
    if op is None:
        raise errors.DeliveryOperationNotFoundError(operation_id)
    return op


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
        if locked is None and get_operation(tx, operation_id) is not None:
            raise errors.DeliveryOperationBusyError(
                operation_id, "another worker is claiming or updating it"
            )
    op = _load(tx, operation_id)
    now = tx.now
    assert now is not None
    dep = None if op.depends_on is None else get_operation(tx, op.depends_on)
    facts = {
        "due": op.next_attempt_at is None or op.next_attempt_at <= now,
        "dependency_done": dep is None or dep.status in DONE,
        "claim_expired": op.lease_expires_at is not None and op.lease_expires_at <= now,
    }
    edge = _MACHINE.decide("claim", op.status, facts) if op.status not in TERMINAL else None
    if edge is None:
        raise errors.DeliveryOperationBusyError(operation_id, _why_busy(op, dep, facts))
    row = tx.one(
        "UPDATE delivery_operations SET status = 'claimed', lease_owner = ?, "
        "lease_epoch = lease_epoch + 1, lease_ttl_s = ?, lease_expires_at = ?, "
        "attempt_count = attempt_count + 1, next_attempt_at = NULL, updated_at = ? "
        f"WHERE id = ? AND status = ? AND lease_epoch = ? RETURNING {_OP_COLS}",
        [owner, ttl_s, now + timedelta(seconds=ttl_s), now, op.id, op.status, op.lease_epoch],
    )
    if row is None:
        raise Conflict(f"delivery operation {op.id!r} moved")
    claimed = _op(row)
    _event(tx, claimed, edge)
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
    """The operation, if ``owner``/``epoch`` is its current, unexpired claim."""
    op = _load(tx, operation_id)
    now = tx.now
    assert now is not None
    if op.lease_owner != owner or op.lease_epoch != epoch:
        raise errors.DeliveryLeaseLostError(
            operation_id, owner, epoch, detail=f"the current claim is epoch {op.lease_epoch}"
        )
    if op.status not in CLAIMED_STATES:
        raise errors.DeliveryLeaseLostError(
            operation_id, owner, epoch, detail=f"the claim ended: the operation is {op.status}"
        )
    if op.lease_expires_at is None or op.lease_expires_at <= now:
        raise errors.DeliveryLeaseLostError(operation_id, owner, epoch, detail="the claim expired")
    return op


def _move(tx: Tx, op: DeliveryOperation, edge: Edge, sets: str, params: list[Any]) -> Any:
    row = tx.one(
        f"UPDATE delivery_operations SET status = ?, updated_at = ?, {sets} "
        f"WHERE id = ? AND status = ? AND lease_epoch = ? RETURNING {_OP_COLS}",
        [edge.dest, tx.now, *params, op.id, edge.source, op.lease_epoch],
    )
    if row is None:
        raise Conflict(f"delivery operation {op.id!r} moved")
    moved = _op(row)
    _event(tx, moved, edge)
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
    edge = _MACHINE.require("progress", op.status, {})
    row = tx.one("SELECT lease_ttl_s FROM delivery_operations WHERE id = ?", [op.id])
    assert row is not None and tx.now is not None
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
    op = _load(tx, operation_id)
    trigger = RESULT_TRIGGERS[status]
    if op.status in TERMINAL and op.lease_owner == owner and op.lease_epoch == epoch:
        if _same_result(op, status, result):
            return op  # a retry after an unknown commit result
        raise errors.InvalidTransitionError(
            "delivery", trigger, op.status, detail="this claim already recorded a result"
        )
    op = _fence(tx, operation_id, owner, epoch)
    edge = _MACHINE.require(trigger, op.status, {})
    moved: DeliveryOperation = _move(
        tx, op, edge, f"{_RESULT_SETS}, lease_expires_at = NULL", _result_params(result)
    )
    refresh_intent(tx, moved.intent_id)
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
    edge = _MACHINE.require("requeue", op.status, {})
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


def refresh_intent(tx: Tx, intent_id: str) -> DeliveryIntent:
    """Recompute the intent's aggregate status (session seed RefreshDeliveryIntentStatus).

    Raises:
        DeliveryOperationNotFoundError: no such intent.
    """
    rows = tx.rows("SELECT status FROM delivery_operations WHERE intent_id = ?", [intent_id])
    intent = get_intent(tx, intent_id)
    if intent is None:
        raise errors.DeliveryOperationNotFoundError(intent_id, detail="no such delivery intent")
    status = intent_status([r[0] for r in rows])
    if status != intent.status:
        tx.exec(
            "UPDATE delivery_intents SET status = ?, updated_at = ? WHERE id = ?",
            [status, tx.now, intent_id],
        )
        intent = get_intent(tx, intent_id)
        assert intent is not None
    return intent


# -- the store's methods ------------------------------------------------------------


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
            return create_plan(tx, run, plan)

        return self._fenced("create_delivery_plan", lease, body)

    def get_delivery_plan(
        self, intent_id: str
    ) -> tuple[DeliveryIntent, list[DeliveryOperation]] | None:
        """The intent and its operations in execution order (session seed
        GetDeliveryPlan), or ``None``. A run's intent id is ``<run id>:delivery``."""
        check_id(intent_id, "intent_id")

        def body(tx: Tx) -> tuple[DeliveryIntent, list[DeliveryOperation]] | None:
            intent = get_intent(tx, intent_id)
            return None if intent is None else (intent, operations(tx, intent_id))

        return self.db.read("get_delivery_plan", body, snapshot=True)

    def get_delivery_operation(self, operation_id: str) -> DeliveryOperation | None:
        """One operation, without its intent's transport context (session seed
        GetDeliveryOperation), or ``None``."""
        check_id(operation_id, "operation_id")
        return self.db.read("get_delivery_operation", lambda tx: get_operation(tx, operation_id))

    def list_due_deliveries(self, *, limit: int = 100) -> list[DeliveryOperation]:
        """Operations a worker may claim now, oldest first (session seed
        ListDueDeliveryOperations): pending ones whose next attempt time has
        come and whose dependency is delivered or unsupported, and claimed ones
        whose claim expired. A read: claim each with :meth:`claim_delivery`.
        On PostgreSQL an operation another worker is claiming at this moment
        is left out (its row lock is skipped, not waited for)."""
        check_limit(limit)
        return self.db.scan("list_due_deliveries", lambda tx: due(tx, limit))

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
        return self.db.write("claim_delivery", lambda tx: claim(tx, operation_id, owner, ttl))

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
            lambda tx: progress(tx, operation_id, owner, epoch, result),
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
            lambda tx: finish(tx, operation_id, owner, epoch, final, result),
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
            lambda tx: requeue(tx, operation_id, owner, epoch, delay, failure_code),
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
