"""The demo fleet's background services: a recovery coordinator and outbox workers.

- :class:`RecoveryCoordinator` sweeps for orphaned runs (non-terminal, no live
  session lease: crashed and stalled workers), takes a ``recovery``-purpose
  lease on the run's session, begins the recovery, interrupts the run's
  running tool calls (an explicit interrupted result in the transcript, never
  an invented output), converges the run to ``interrupted`` and plans a
  notice for the user through the outbox (session seed CreateDeliveryPlan for
  recovery reconciliation).
- :class:`OutboxWorker` lists due delivery operations, claims them and plays
  a provider with injected faults, drawn from its own
  ``random.Random(seed + 1000 + index)``: a transient failure (requeue with a
  delay), a permanent one (``failed``), an uncertain result (``uncertain``),
  a stall past the claim's TTL whose late acknowledgement must be refused
  (``DeliveryLeaseLostError``), and a success acknowledged twice, as after a
  lost commit reply (the repeat must be idempotent).
"""

from __future__ import annotations

import json
import random
import threading
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime

from turnkeeper.spec import LeasePurpose
from turnkeeper.spec.delivery import DeliveryOperation, DeliveryPlan, DeliveryStep
from turnkeeper.spec.errors import (
    BusyError,
    DeliveryLeaseLostError,
    DeliveryOperationBusyError,
    LeaseLostError,
    RecoveryNotNeededError,
    RuntimeLeaseRunMismatchError,
    TransactionConflictError,
)
from turnkeeper.spec.records import Run
from turnkeeper.storage import BaseStore

from .common import one_line

SWEEP_S = 0.05
"""Seconds between recovery sweeps and between empty outbox polls."""

STALL_MARGIN_S = 0.05
"""Seconds a stalled provider call lasts beyond the claim's TTL."""


@dataclass
class ServiceStats:
    """What one background service saw (written only by its thread)."""

    recoveries_converged: int = 0
    recovery_busy: int = 0
    recovery_lost: int = 0
    tools_interrupted: int = 0
    time_to_recovery_s: list[float] = field(default_factory=list)
    claims: int = 0
    claim_refusals: int = 0
    claims_lost: int = 0
    delivered: int = 0
    requeued: int = 0
    failed: int = 0
    uncertain: int = 0
    repeated_acks: int = 0
    replies_read: int = 0
    stale_acks_fenced: int = 0
    stale_acks_accepted: int = 0
    errors: list[str] = field(default_factory=list)

    @classmethod
    def merged(cls, parts: list[ServiceStats]) -> ServiceStats:
        """The sum of several services' counters (lists concatenated)."""
        total = cls()
        for part in parts:
            for f in fields(cls):
                mine, theirs = getattr(total, f.name), getattr(part, f.name)
                setattr(total, f.name, mine + theirs)
        return total


class Service(ABC):
    """A background loop that runs until ``stop``; errors are recorded, never raised."""

    def __init__(self, store: BaseStore, stop: threading.Event, stats: ServiceStats) -> None:
        self.store = store
        self.stop = stop
        self.stats = stats

    def run(self) -> None:
        """Loop over :meth:`step` until ``stop`` is set."""
        while not self.stop.is_set():
            try:
                busy = self.step()
            except TransactionConflictError:
                busy = False
            except Exception as exc:  # a bug or backend failure: recorded, fails the demo
                self.stats.errors.append(f"{type(exc).__name__}: {one_line(str(exc))}")
                busy = False
            if not busy:
                self.stop.wait(SWEEP_S)

    @abstractmethod
    def step(self) -> bool:
        """One pass; returns whether it found work."""


class RecoveryCoordinator(Service):
    """Converges orphaned runs under recovery leases: those of the sessions in its
    ``shard`` (``(index, count)``: sessions whose crc32 is ``index`` modulo
    ``count``), so that several coordinators split the sweep instead of racing."""

    def __init__(
        self,
        store: BaseStore,
        stop: threading.Event,
        stats: ServiceStats,
        ttl_s: float,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        super().__init__(store, stop, stats)
        self.ttl_s = ttl_s
        self.shard = shard
        self.owner = f"demo-recovery-{shard[0]}"

    def step(self) -> bool:
        index, count = self.shard
        orphans = [
            run
            for run in self.store.recovery.list_orphans()
            if zlib.crc32(run.session_id.encode()) % count == index
        ]
        for run in orphans:
            if self.stop.is_set():
                break
            self._recover(run)
        return bool(orphans)

    def _recover(self, run: Run) -> None:
        try:
            lease = self.store.leases.acquire(
                f"session:{run.session_id}",
                self.owner,
                self.ttl_s,
                purpose=LeasePurpose.RECOVERY,
                run_id=run.id,
            )
        except (BusyError, RecoveryNotNeededError, RuntimeLeaseRunMismatchError):
            # held, or the orphan ended or was replaced since it was listed
            self.stats.recovery_busy += 1
            return
        try:
            self.store.recovery.begin(run.id, lease, reason="worker lease expired")
            interrupted = self.store.tools.interrupt(
                run.session_id, local_turn_id=run.turn_id, reason="worker lost", lease=lease
            )
            self.stats.tools_interrupted += len(interrupted)
            self.store.recovery.converge(  # the notice is planned as the run ends
                run.id,
                lease,
                status="interrupted",
                error="the worker lost its lease",
                delivery_plan=notice_plan(run),
            )
            self.stats.recoveries_converged += 1
            self.stats.time_to_recovery_s.append(
                (datetime.now(UTC) - run.updated_at).total_seconds()
            )
        except RecoveryNotNeededError:
            pass
        except LeaseLostError:
            self.stats.recovery_lost += 1
        finally:
            self.store.leases.release(lease)


def notice_plan(run: Run) -> DeliveryPlan:
    """The outbox plan recovery creates: tell the user the run was interrupted."""
    return DeliveryPlan(
        platform="demo-chat",
        target_id=f"room-{run.session_id}",
        steps=(DeliveryStep("notice", "message", payload_digest=f"{run.id}:interrupted"),),
        reply_message_id=run.id,
        transport_context={"thread": run.session_id},
    )


@dataclass(frozen=True, slots=True)
class Faults:
    """Probabilities of the provider faults per claimed operation.

    A stall holds its outbox worker for a whole claim TTL (2 s by default), so
    it is rare: at 4 % the two workers spent most of their time stalled and
    fell behind the fleet's replies, and the drain ran to its limit."""

    transient: float = 0.08
    permanent: float = 0.03
    uncertain: float = 0.03
    stall: float = 0.01
    repeat_ack: float = 0.10


class OutboxWorker(Service):
    """Claims due operations and delivers them through a faulty simulated provider."""

    def __init__(
        self,
        store: BaseStore,
        stop: threading.Event,
        stats: ServiceStats,
        index: int,
        seed: int,
        ttl_s: float,
        faults: Faults = Faults(),
    ) -> None:
        super().__init__(store, stop, stats)
        self.owner = f"demo-outbox-{index}"
        self.rng = random.Random(seed + 1000 + index)
        self.ttl_s = ttl_s
        self.faults = faults

    def step(self) -> bool:
        due = self.store.outbox.list_due(limit=20)
        for op in due:
            if self.stop.is_set():
                break
            try:
                claim = self.store.outbox.claim(op.id, self.owner, self.ttl_s)
            except DeliveryOperationBusyError:
                self.stats.claim_refusals += 1
                continue
            self.stats.claims += 1
            self._read_reply(claim)
            self._deliver(claim.id, claim.lease_epoch, claim.kind)
        return bool(due)

    def _read_reply(self, claim: DeliveryOperation) -> None:
        """What the provider would send: the entry the operation names, read
        beside the claim (``outbox.delivered_entry``); the reply carries the
        marker the plan gave as its payload digest."""
        if claim.entry_id is None:
            return
        body = self.store.outbox.delivered_entry(claim.id)
        self.stats.replies_read += 1
        if body is None or claim.payload_digest not in json.dumps(body.payload):
            self.stats.errors.append(f"{claim.id}: the delivered entry lacks its marker")

    def _deliver(self, op_id: str, epoch: int, kind: str) -> None:
        """Play the provider for one claimed operation and acknowledge its result.

        The claim can expire before any acknowledgement (a slow provider, a
        loaded machine): the store then refuses it with
        ``DeliveryLeaseLostError``. That is the fence doing its job, counted
        in ``claims_lost``; the operation is due again and another claim
        (this worker's or another's) delivers it."""
        try:
            self._provider(op_id, epoch, kind)
        except DeliveryLeaseLostError:
            self.stats.claims_lost += 1

    def _provider(self, op_id: str, epoch: int, kind: str) -> None:
        f, r = self.faults, self.rng.random()
        if r < f.transient:
            delay = 0.05 + self.rng.random() * 0.15
            self.store.outbox.requeue(
                op_id, self.owner, epoch, delay_s=delay, failure_code="rate_limited"
            )
            self.stats.requeued += 1
            return
        r -= f.transient
        if r < f.permanent:
            self.store.outbox.finish(op_id, self.owner, epoch, "failed", failure_code="gone")
            self.stats.failed += 1
            return
        r -= f.permanent
        if r < f.uncertain:
            self.store.outbox.finish(
                op_id, self.owner, epoch, "uncertain", failure_code="timeout_after_send"
            )
            self.stats.uncertain += 1
            return
        r -= f.uncertain
        if r < f.stall:
            # the claim expires while the provider hangs (the claim was granted
            # before the hang began, so it has expired by the end of the wait)
            if self.stop.wait(self.ttl_s + STALL_MARGIN_S):
                return  # the demo is ending: the claim may still be live, test nothing
            try:
                self.store.outbox.finish(op_id, self.owner, epoch, "delivered")
            except DeliveryLeaseLostError:
                self.stats.stale_acks_fenced += 1
            else:
                self.stats.stale_acks_accepted += 1
            return
        repeat = self.rng.random() < f.repeat_ack
        if kind == "attachment":
            self.store.outbox.update_progress(
                op_id, self.owner, epoch, provider_state={"phase": "uploaded"}
            )
        message_id = f"pm-{op_id}"
        self.store.outbox.finish(
            op_id, self.owner, epoch, "delivered", provider_message_id=message_id
        )
        self.stats.delivered += 1
        if repeat:  # the commit reply was lost: the worker acknowledges again
            self.store.outbox.finish(
                op_id, self.owner, epoch, "delivered", provider_message_id=message_id
            )
            self.stats.repeated_acks += 1
