"""The delivery outbox (session seed DeliveryIntent/DeliveryOperation; DESIGN machine 4).

A run's reply leaves the system through an outbox: one *intent* per run
(platform, target, opaque transport context) holding ordered *operations*
(upload an attachment, send the message …), each independently recoverable.
An operation is ``pending`` until a worker claims it; every claim raises the
operation's own epoch by one and gives the claim an expiry, so a delayed
worker holding an older epoch can never overwrite a later attempt (fencing
by owner and epoch). Progress keeps the claim (``in_progress``); a terminal
result ends it (``delivered``, ``unsupported``, ``failed``, ``uncertain``);
a requeue releases it with a next attempt time. An operation with a
dependency is claimable only once that dependency is delivered or
unsupported.

Facts the guards read in the claiming transaction:

- ``due``: the operation's next attempt time has come (or it has none);
- ``dependency_done``: no dependency, or the dependency is delivered or
  unsupported;
- ``claim_expired``: the current claim's expiry has passed (store clock).

The intent's status is an aggregate recomputed after every result (session
seed RefreshDeliveryIntentStatus): ``delivered`` only when every operation is
delivered or unsupported, ``pending`` while any operation is still to be
done, else ``failed`` if any operation failed, else ``uncertain``: failed and
uncertain operations stay visible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from .lifecycle import Edge, Lifecycle, fact


class DeliveryStatus(StrEnum):
    """Delivery operation statuses."""

    PENDING = "pending"
    CLAIMED = "claimed"
    IN_PROGRESS = "in_progress"
    DELIVERED = "delivered"
    UNSUPPORTED = "unsupported"
    FAILED = "failed"
    UNCERTAIN = "uncertain"


CLAIMED_STATES = frozenset({DeliveryStatus.CLAIMED, DeliveryStatus.IN_PROGRESS})
"""Statuses in which a claim (owner, epoch, expiry) is current."""

DONE = frozenset({DeliveryStatus.DELIVERED, DeliveryStatus.UNSUPPORTED})
"""Terminal statuses that count as delivered for the intent and for dependents."""

TERMINAL = DONE | {DeliveryStatus.FAILED, DeliveryStatus.UNCERTAIN}
"""Statuses an operation ends in; a terminal operation is never claimed again."""

RESULT_TRIGGERS = {
    DeliveryStatus.DELIVERED: "deliver",
    DeliveryStatus.UNSUPPORTED: "mark_unsupported",
    DeliveryStatus.FAILED: "fail",
    DeliveryStatus.UNCERTAIN: "mark_uncertain",
}
"""The trigger that records each terminal result."""

_HELD = ("claimed", "in_progress")

DELIVERY = Lifecycle(
    name="delivery",
    states=("absent", *(s.value for s in DeliveryStatus)),
    initial="absent",
    edges=(
        Edge("plan", "plan", "absent", "pending"),
        Edge("claim", "claim", "pending", "claimed", guards=("due", "dependency_done")),
        *(Edge(f"reclaim_{s}", "claim", s, "claimed", guards=("claim_expired",)) for s in _HELD),
        *(Edge(f"progress_{s}", "progress", s, "in_progress") for s in _HELD),
        *(Edge(f"requeue_{s}", "requeue", s, "pending") for s in _HELD),
        *(Edge(f"{t}_{s}", t, s, st.value) for st, t in RESULT_TRIGGERS.items() for s in _HELD),
    ),
    guards={
        "due": (fact("due"), "the operation's next attempt time has come"),
        "dependency_done": (
            fact("dependency_done"),
            "no dependency, or it is delivered or unsupported",
        ),
        "claim_expired": (fact("claim_expired"), "the current claim's expiry has passed"),
    },
    invariants=(
        "every claim raises the operation's epoch by one",
        "progress, requeue and results carry the owner and epoch of the current, unexpired claim",
        "an operation is delivered at most once, and never claimed again once terminal",
        "an operation is claimed only after its dependency is delivered or unsupported",
        "the intent is delivered only when every operation is delivered or unsupported",
    ),
)


_DONE_NAMES = ("delivered", "unsupported")
_TERMINAL_NAMES = ("delivered", "unsupported", "failed", "uncertain")


def intent_status(statuses: Sequence[str]) -> str:
    """The intent aggregate of its operations' statuses (see the module docstring).

    post: __return__ in ("pending", "delivered", "failed", "uncertain")
    post: (__return__ == "delivered") == all(s in ("delivered", "unsupported") for s in statuses)
    post: (__return__ == "pending") == any(s not in _TERMINAL_NAMES for s in statuses)
    post: __return__ != "uncertain" or "failed" not in statuses
    """
    if any(s not in _TERMINAL_NAMES for s in statuses):
        return "pending"
    if all(s in _DONE_NAMES for s in statuses):
        return "delivered"
    if "failed" in statuses:
        return "failed"
    return "uncertain"


@dataclass(frozen=True, slots=True)
class DeliveryStep:
    """One operation of a plan, as the runtime describes it.

    ``key`` names the step within its intent (the operation id is
    ``<intent id>:<key>``); ``depends_on`` is the key of an earlier step;
    ``idempotency_key`` is what the provider deduplicates on (default: the
    operation id); ``payload_digest`` identifies the bytes to send.
    ``entry_id`` names the entry of the run's session the step delivers (a
    reply message): the plan is refused when the session has no such entry,
    and a worker reads it with ``store.outbox.delivered_entry``.
    """

    key: str
    kind: str
    artifact_id: str = ""
    depends_on: str | None = None
    idempotency_key: str = ""
    payload_digest: str = ""
    entry_id: str | None = None


@dataclass(frozen=True, slots=True)
class DeliveryPlan:
    """What to deliver for one run (session seed DeliveryPlan): where to and
    the ordered steps. ``transport_context`` is opaque runtime state (a JSON
    object), stored but never shown in reprs or reports."""

    platform: str
    target_id: str
    steps: tuple[DeliveryStep, ...]
    reply_message_id: str = ""
    transport_context: Mapping[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class DeliveryIntent:
    """The stored run-level outbox identity (session seed DeliveryIntent).

    ``status`` is the aggregate of its operations (:func:`intent_status`).
    """

    id: str
    session_id: str
    run_id: str
    platform: str
    target_id: str
    reply_message_id: str
    status: str
    created_at: datetime
    updated_at: datetime
    transport_context: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True)
class DeliveryOperation:
    """One stored outbox operation (session seed DeliveryOperation).

    ``sequence`` is its 1-based order in the intent; ``depends_on`` the id of
    the operation it waits for. The claim is ``lease_owner`` +
    ``lease_epoch`` (raised by one on every claim) until
    ``lease_expires_at``; ``attempt_count`` counts claims.
    ``next_attempt_at`` is set by a requeue. ``entry_id`` is the session
    entry the operation delivers (its step's), or ``None``.
    """

    id: str
    intent_id: str
    key: str
    kind: str
    artifact_id: str
    sequence: int
    depends_on: str | None
    idempotency_key: str
    payload_digest: str
    status: str
    provider_asset_id: str
    provider_message_id: str
    provider_state: Mapping[str, Any]
    attempt_count: int
    next_attempt_at: datetime | None
    failure_code: str
    lease_owner: str
    lease_epoch: int
    lease_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    entry_id: str | None = None
