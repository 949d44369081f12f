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

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import orjson

from turnkeeper.machines import machine_for
from turnkeeper.spec import errors
from turnkeeper.spec.delivery import (
    DELIVERY,
    DONE,
    DeliveryIntent,
    DeliveryOperation,
    DeliveryPlan,
    intent_status,
)
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.lifecycle import Edge
from turnkeeper.spec.records import Entry, Lease, Run

from ..backend import Dialect, Tx, present, utc
from ..codec import check_id, derived_id, from_json, to_json
from ..crypto.keyring import UNREAD
from ..validate import (
    check_lease,
    check_limit,
    check_plan,
    check_session_lease,
)
from ..wakeups import Topic
from . import entry_rows, leases, run_reads, sealed_json
from .base import Area

MACHINE = machine_for(DELIVERY)

_INTENT_COLS = (
    "id, session_id, run_id, platform, target_id, reply_message_id, status, created_at, "
    "updated_at, transport_context"
)
OP_COLS = (
    "id, intent_id, operation_key, kind, artifact_id, sequence, depends_on, idempotency_key, "
    "payload_digest, status, provider_asset_id, provider_message_id, provider_state, "
    "attempt_count, next_attempt_at, failure_code, lease_owner, lease_epoch, lease_expires_at, "
    "created_at, updated_at, entry_id"
)


_OP_VALUES = (
    ("intent_id", "VARCHAR"),
    ("created_at", "TIMESTAMPTZ"),
    ("updated_at", "TIMESTAMPTZ"),
    ("id", "VARCHAR[]"),
    ("operation_key", "VARCHAR[]"),
    ("kind", "VARCHAR[]"),
    ("artifact_id", "VARCHAR[]"),
    ("sequence", "INTEGER[]"),
    ("depends_on", "VARCHAR[]"),
    ("idempotency_key", "VARCHAR[]"),
    ("payload_digest", "VARCHAR[]"),
    ("entry_id", "VARCHAR[]"),
)
"""The columns of a plan's operations its insert is given, and their types
(an array: one value per step; else one for all)."""


@functools.cache
def _insert_ops(dialect: Dialect) -> str:
    """A plan's ``pending`` operations as one insert (see ``create_plan``)."""
    values = ", ".join(
        f"unnest({dialect.typed(t)})" if t.endswith("[]") else dialect.typed(t)
        for _, t in _OP_VALUES
    )
    return (
        f"INSERT INTO delivery_operations ({', '.join(c for c, _ in _OP_VALUES)}, "
        "status, provider_asset_id, provider_message_id, provider_state, attempt_count, "
        "next_attempt_at, failure_code, lease_owner, lease_epoch, lease_expires_at, lease_ttl_s) "
        f"SELECT {values}, 'pending', '', '', '{{}}', 0, NULL, '', '', 0, NULL, 0"
    )


@functools.cache
def _insert_events(dialect: Dialect) -> str:
    """The ``plan`` event of each of a plan's operations as one insert."""
    ids, one, at = (dialect.typed(t) for t in ("VARCHAR[]", "VARCHAR", "TIMESTAMPTZ"))
    return f"INSERT INTO delivery_events SELECT unnest({ids}), {', '.join([one] * 5)}, '', 0, {at}"


CONTEXT = "transport_context"
"""The field an intent's transport context is sealed under (record id the intent's id)."""


def intent_row(tx: Tx, row: Sequence[Any]) -> DeliveryIntent:
    """A delivery intent read (``_INTENT_COLS``), its transport context opened.

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: as ``Keyring.open_json``.
    """
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
        transport_context=sealed_json.open_json(tx, row[1], row[0], CONTEXT, row[9]),
    )


def op_row(row: Sequence[Any]) -> DeliveryOperation:
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
        entry_id=row[21],
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
            # an entry only where named: a plan of schema 27 keeps its digest
            + ([] if s.entry_id is None else [s.entry_id])
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
    return None if row is None else intent_row(tx, row)


def operations(tx: Tx, intent_id: str) -> list[DeliveryOperation]:
    """The intent's operations in execution order."""
    rows = tx.rows(
        f"SELECT {OP_COLS} FROM delivery_operations WHERE intent_id = ? ORDER BY sequence",
        [intent_id],
    )
    return [op_row(r) for r in rows]


def get_operation(tx: Tx, operation_id: str, lock: str = "") -> DeliveryOperation | None:
    """The operation, or ``None``; ``lock``: a row lock clause for its ``SELECT``
    (``Dialect.update_lock``)."""
    row = tx.one(f"SELECT {OP_COLS} FROM delivery_operations WHERE id = ?{lock}", [operation_id])
    return None if row is None else op_row(row)


def delivered_entry(tx: Tx, operation_id: str) -> Entry | None:
    """See ``OutboxPlansPart.delivered_entry``."""
    op = load(tx, operation_id)
    if op.entry_id is None:
        return None
    intent = present(
        tx.one("SELECT session_id FROM delivery_intents WHERE id = ?", [op.intent_id]),
        "the operation's intent",
    )
    found = entry_rows.entry(tx, intent[0], op.entry_id)
    if found is None:
        raise errors.EntryNotFoundError(intent[0], op.entry_id)
    return found


def event(tx: Tx, op: DeliveryOperation, edge: Edge) -> None:
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


def create_plan(
    tx: Tx, run: Run, plan: DeliveryPlan, *, first: bool = False, version: int | None = UNREAD
) -> DeliveryIntent:
    """Write the run's intent and its ``pending`` operations (``plan`` edges).

    The same plan again returns the stored intent and writes nothing.
    ``first``: the run ended in this transaction, so it has no plan yet (a
    plan follows its run's termination): nothing is looked up. ``version``:
    the session's data key version as the caller read it in ``tx`` (the
    transport context is sealed under it), else read here.

    Raises:
        DeliveryPlanConflictError: the run already has a different plan.
        EntryNotFoundError: a step's ``entry_id`` is no entry of the run's session.
    """
    intent_id = intent_id_for(run.id)
    digest = plan_digest(plan)
    found = (
        None
        if first
        else tx.one("SELECT plan_digest FROM delivery_intents WHERE id = ?", [intent_id])
    )
    if found is not None:
        if found[0] != digest:
            raise errors.DeliveryPlanConflictError(run.id, intent_id)
        existing = get_intent(tx, intent_id)
        existing = present(existing, "the delivery intent whose digest it read")
        return existing
    for step in plan.steps:  # before any write: a refused plan leaves nothing
        if (
            step.entry_id is not None
            and entry_rows.entry(tx, run.session_id, step.entry_id) is None
        ):
            raise errors.EntryNotFoundError(run.session_id, step.entry_id)
    tx.notify(Topic.DELIVERY_DUE)
    now = tx.now
    intent = (
        intent_id,
        run.session_id,
        run.id,
        plan.platform,
        plan.target_id,
        plan.reply_message_id,
        "pending",
        now,
        now,
        sealed_json.seal_one(
            tx,
            run.session_id,
            intent_id,
            CONTEXT,
            to_json(dict(plan.transport_context), "transport_context"),
            sealed_json.session_version(tx, run.session_id) if version == UNREAD else version,
        ),
    )
    # Three held writes (``Tx.later``; none reads another's rows): the intent,
    # every operation, and every operation's ``plan`` event, each one statement
    # however many steps (one array per column).
    tx.later(
        f"INSERT INTO delivery_intents ({_INTENT_COLS}, plan_digest) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [*intent, digest],
    )
    edge = MACHINE.require("plan", "absent", {})
    op_ids = [derived_id(f"{intent_id}:", step.key) for step in plan.steps]
    steps = [
        (
            op_id,
            step.key,
            step.kind,
            step.artifact_id,
            seq,
            None if step.depends_on is None else derived_id(f"{intent_id}:", step.depends_on),
            step.idempotency_key or op_id,
            step.payload_digest,
            step.entry_id,
        )
        for seq, (op_id, step) in enumerate(zip(op_ids, plan.steps, strict=True), start=1)
    ]
    if not steps:
        return intent_row(tx, intent)
    columns = [list(c) for c in zip(*steps, strict=True)]
    tx.later(_insert_ops(tx.dialect), [intent_id, now, now, *columns])
    tx.later(
        _insert_events(tx.dialect),
        [op_ids, intent_id, edge.name, edge.trigger, edge.source, edge.dest, now],
    )
    return intent_row(tx, intent)  # as stored: no read back


def due(tx: Tx, limit: int) -> list[DeliveryOperation]:
    """Operations a worker may claim now (session seed ListDueDeliveryOperations):
    pending, due and with their dependency done, or claimed with an expired claim."""
    done = ", ".join(f"'{s.value}'" for s in DONE)
    rows = tx.rows(
        f"SELECT {', '.join('o.' + c.strip() for c in OP_COLS.split(','))} "
        "FROM delivery_operations o LEFT JOIN delivery_operations d ON d.id = o.depends_on "
        "WHERE (o.status = 'pending' AND coalesce(o.next_attempt_at <= ?, TRUE) "
        f"AND (o.depends_on IS NULL OR d.status IN ({done}))) "
        "OR (o.status IN ('claimed', 'in_progress') AND o.lease_expires_at <= ?) "
        "ORDER BY o.created_at, o.intent_id, o.sequence LIMIT ?" + tx.dialect.skip_locked_of("o"),
        # PostgreSQL: leave out operations another worker is claiming right now
        [tx.now, tx.now, limit],
        replan=True,  # two states, each with its time bound: a plan for the values (Tx.rows)
    )
    return [op_row(r) for r in rows]


def load(tx: Tx, operation_id: str, lock: str = "") -> DeliveryOperation:
    """The operation (see :func:`get_operation`).

    Raises:
        DeliveryOperationNotFoundError: no such operation.
    """
    op = get_operation(tx, operation_id, lock)
    if op is None:
        raise errors.DeliveryOperationNotFoundError(operation_id)
    return op


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
        intent = present(intent, "the delivery intent it updated")
    return intent


# -- the store's methods ------------------------------------------------------------


class OutboxPlansPart(Area):
    """Plan, list, claim, progress, finish and requeue outbox operations."""

    def create_plan(
        self, run_id: str, plan: DeliveryPlan, *, lease: Lease | None = None
    ) -> DeliveryIntent:
        """Persist ``plan`` for a terminal run outside its termination (session
        seed CreateDeliveryPlan): for recovery reconciliation and tools only;
        a runtime passes the plan to ``runs.finish`` instead. The same plan
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
            run = run_reads.get(tx, run_id)
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

    def get_plan(self, intent_id: str) -> tuple[DeliveryIntent, list[DeliveryOperation]] | None:
        """The intent and its operations in execution order (session seed
        GetDeliveryPlan), or ``None``. A run's intent id is ``<run id>:delivery``."""
        check_id(intent_id, "intent_id")

        def body(tx: Tx) -> tuple[DeliveryIntent, list[DeliveryOperation]] | None:
            intent = get_intent(tx, intent_id)
            return None if intent is None else (intent, operations(tx, intent_id))

        return self.db.read("get_delivery_plan", body, snapshot=True)

    def get_operation(self, operation_id: str) -> DeliveryOperation | None:
        """One operation, without its intent's transport context (session seed
        GetDeliveryOperation), or ``None``."""
        check_id(operation_id, "operation_id")
        return self.db.read("get_delivery_operation", lambda tx: get_operation(tx, operation_id))

    def delivered_entry(self, operation_id: str) -> Entry | None:
        """The session entry the operation delivers (its step's ``entry_id``, in
        its run's session), or ``None`` when it names none: what a worker sends
        after :meth:`outbox.claim`, read by id (three index lookups), with no
        guess at an entry id.

        Raises:
            DeliveryOperationNotFoundError: no such operation.
            EntryNotFoundError: the entry it names is gone from the session.
            InvalidInputError: a bad ``operation_id``.
        """
        check_id(operation_id, "operation_id")
        return self.db.read(
            "delivered_entry", lambda tx: delivered_entry(tx, operation_id), snapshot=True
        )

    def list_due(self, *, limit: int = 100) -> list[DeliveryOperation]:
        """Operations a worker may claim now, oldest first (session seed
        ListDueDeliveryOperations): pending ones whose next attempt time has
        come and whose dependency is delivered or unsupported, and claimed ones
        whose claim expired. A read: claim each with :meth:`outbox.claim`.
        On PostgreSQL an operation another worker is claiming at this moment
        is left out (its row lock is skipped, not waited for)."""
        check_limit(limit)
        return self.db.scan("list_due_deliveries", lambda tx: due(tx, limit))
