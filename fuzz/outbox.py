"""The differential state machine for the delivery outbox.

Simulated delivery workers claim, progress, finish and requeue the operations
of one plan on an injected clock; a crashed worker is one that stops using
its claim (it expires as the clock moves) and may wake up later to use it
again. Every outcome is compared with a hand-written model (independent of
``spec/delivery.py``), and after every step:

- each operation's status, owner and epoch equal the model's, and its epoch
  only ever grew by one per claim;
- no operation is recorded delivered twice, and none is claimed after a
  terminal result;
- no progress, requeue or result commits under a stale, expired or ended
  claim (the model agrees with every outcome);
- the intent is ``delivered`` exactly when every operation is delivered or
  unsupported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, rule

from turnkeeper import (
    DeliveryLeaseLostError,
    DeliveryOperationBusyError,
    DeliveryPlan,
    DeliveryStep,
    InvalidTransitionError,
)

from .ambiguous import ambiguously, replayable
from .base import FuzzMachine, bound, checked
from .opener import StoreOpener
from .oracle import Outcome

OWNERS = ("W1", "W2", "W3")
KEYS = ("upload", "send", "react")
DEPENDS = {"send": "upload"}
RESULTS = ("delivered", "unsupported", "failed", "uncertain")
HELD = ("claimed", "in_progress")
NEVER = 10**9  # the epoch of a claim that failed: no operation reaches it


@dataclass
class OpModel:
    """An outbox operation as the model holds it (``expires`` and
    ``next_attempt``: aware datetimes of the injected clock)."""

    status: str = "pending"
    owner: str = ""
    epoch: int = 0
    expires: datetime | None = None
    next_attempt: datetime | None = None
    delivered_count: int = 0


@dataclass(frozen=True)
class Claim:
    """A claim some worker was given (``epoch`` :data:`NEVER` when refused)."""

    key: str
    owner: str
    epoch: int


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """``fn(*args, **kwargs)`` as an outcome: ``("ok", value)``, ``("busy",)``,
    ``("lost",)`` or ``("transition",)``; other errors propagate."""
    try:
        return ("ok", fn(*args, **kwargs))
    except DeliveryOperationBusyError:
        return ("busy",)
    except DeliveryLeaseLostError:
        return ("lost",)
    except InvalidTransitionError:
        return ("transition",)


class OutboxMachine(FuzzMachine):
    """Workers W1, W2, W3 delivering one plan's three operations."""

    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.store.sessions.create("s")
        run = self.store.runs.admit("s", {"q": 1})
        self.store.runs.start(run.id)
        steps = tuple(DeliveryStep(k, "message", depends_on=DEPENDS.get(k)) for k in KEYS)
        self.store.runs.finish(run.id, "succeeded", delivery_plan=DeliveryPlan("chat", "t", steps))
        self.intent = f"{run.id}:delivery"
        self.model = {k: OpModel() for k in KEYS}
        self.results: dict[str, str] = {}

    def op_id(self, key: str) -> str:
        return f"{self.intent}:{key}"

    def current(self, claim: Claim) -> bool:
        m = self.model[claim.key]
        return (
            m.owner == claim.owner
            and m.epoch == claim.epoch
            and m.status in HELD
            and m.expires is not None
            and m.expires > self.clock()
        )

    def _claim_expected(self, key: str) -> str:
        m, now = self.model[key], self.clock()
        dep = DEPENDS.get(key)
        dep_done = dep is None or self.model[dep].status in ("delivered", "unsupported")
        free = m.status == "pending" and (m.next_attempt is None or m.next_attempt <= now)
        lapsed = m.status in HELD and m.expires is not None and m.expires <= now
        return "ok" if (free and dep_done) or lapsed else "busy"

    def _finish_expected(self, claim: Claim, result: str) -> str:
        m = self.model[claim.key]
        mine = m.owner == claim.owner and m.epoch == claim.epoch
        if m.status not in HELD and m.status != "pending" and mine:
            return "ok" if m.status == result else "transition"  # a repeated result
        return "ok" if self.current(claim) else "lost"

    # -- steps -------------------------------------------------------------------

    @rule(
        target=claims,
        key=st.sampled_from(KEYS),
        owner=st.sampled_from(OWNERS),
        ttl=st.sampled_from((1.0, 5.0)),
    )
    def claim(self, key: str, owner: str, ttl: float) -> Claim:
        m, now = self.model[key], self.clock()
        expected = self._claim_expected(key)
        got = attempt(self.store.outbox.claim, self.op_id(key), owner, ttl)
        assert got[0] == expected, (key, owner, m, got)
        if got[0] != "ok":
            return Claim(key, owner, NEVER)  # a claim it never had: every use is refused
        m.status, m.owner, m.epoch = "claimed", owner, m.epoch + 1
        m.expires, m.next_attempt = now + timedelta(seconds=ttl), None
        assert got[1].lease_epoch == m.epoch
        return Claim(key, owner, m.epoch)

    @rule(claim=claims)
    def progress(self, claim: Claim) -> None:
        expected = "ok" if self.current(claim) else "lost"
        got = attempt(
            self.store.outbox.update_progress, self.op_id(claim.key), claim.owner, claim.epoch
        )
        assert got[0] == expected, (claim, self.model[claim.key], got)
        if expected == "ok":
            m = self.model[claim.key]
            row = self.store.outbox.get_operation(self.op_id(claim.key))
            assert row is not None, claim
            m.status, m.expires = "in_progress", row.lease_expires_at

    @rule(claim=claims, result=st.sampled_from(RESULTS))
    def finish(self, claim: Claim, result: str) -> None:
        m = self.model[claim.key]
        expected = self._finish_expected(claim, result)
        got = attempt(
            self.store.outbox.finish,
            self.op_id(claim.key),
            claim.owner,
            claim.epoch,
            result,
        )
        assert got[0] == expected, (claim, result, m, got)
        if expected == "ok" and m.status in HELD:
            m.status, m.expires = result, None
            m.delivered_count += result == "delivered"

    @rule(
        target=claims,
        key=st.sampled_from(KEYS),
        owner=st.sampled_from(OWNERS),
        ttl=st.sampled_from((1.0, 5.0)),
    )
    def claim_ambiguously(self, key: str, owner: str, ttl: float) -> Claim:
        """A claim that commits while its worker sees a lost connection, then
        the worker's retry: refused as busy (its own live claim: a claim is
        not idempotent, each raises the epoch), so the worker reads the
        operation to learn the claim it holds (owner and epoch its own)."""
        replayable("claim_ambiguously", key=key, owner=owner, ttl=ttl)
        expected = self._claim_expected(key)
        got = ambiguously(self.store, attempt, self.store.outbox.claim, self.op_id(key), owner, ttl)
        if expected != "ok":
            assert got[0] == expected, (key, owner, self.model[key], got)
            return Claim(key, owner, NEVER)
        assert got == ("ambiguous", ("claim_delivery",)), (key, owner, got)
        m = self.model[key]
        m.status, m.owner, m.epoch = "claimed", owner, m.epoch + 1
        m.expires, m.next_attempt = self.clock() + timedelta(seconds=ttl), None
        retried = attempt(self.store.outbox.claim, self.op_id(key), owner, ttl)
        assert retried[0] == self._claim_expected(key) == "busy", (retried, m)
        op = self.store.outbox.get_operation(self.op_id(key))
        assert op is not None, key
        assert (op.lease_owner, op.lease_epoch) == (owner, m.epoch), (op, m)
        return Claim(key, owner, op.lease_epoch)

    @rule(claim=claims, result=st.sampled_from(RESULTS))
    def finish_ambiguously(self, claim: Claim, result: str) -> None:
        """A result (a delivery …) recorded while its worker sees a lost
        connection, then the worker's retry of the same result under the same
        claim: idempotent (the operation is not delivered twice)."""
        replayable("finish_ambiguously", claim=claim, result=result)
        m = self.model[claim.key]
        expected = self._finish_expected(claim, result)
        call = (self.store.outbox.finish, self.op_id(claim.key), claim.owner, claim.epoch, result)
        got = ambiguously(self.store, attempt, *call)
        if expected != "ok":
            assert got[0] == expected, (claim, result, m, got)
            return
        assert got == ("ambiguous", ("finish_delivery",)), (claim, result, m, got)
        if m.status in HELD:
            m.status, m.expires = result, None
            m.delivered_count += result == "delivered"
        assert self._finish_expected(claim, result) == "ok"
        retried = attempt(*call)
        assert retried[0] == "ok", f"the retry of a recorded result: {retried}, {m}"
        assert retried[1].status == result, retried

    @rule(claim=claims, delay=st.sampled_from((0.0, 3.0)))
    def requeue(self, claim: Claim, delay: float) -> None:
        expected = "ok" if self.current(claim) else "lost"
        got = attempt(
            self.store.outbox.requeue,
            self.op_id(claim.key),
            claim.owner,
            claim.epoch,
            delay_s=delay,
        )
        assert got[0] == expected, (claim, self.model[claim.key], got)
        if expected == "ok":
            m = self.model[claim.key]
            m.status, m.expires = "pending", None
            m.next_attempt = self.clock() + timedelta(seconds=delay)

    @rule(seconds=st.sampled_from((0.5, 1.5, 4.0)))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def workers_crash(self) -> None:
        """Every worker dies holding its claims: nothing is released, every claim
        outlives its TTL (the longest is 5 s). Their claims stay in the bundle,
        so a later step is a crashed worker waking up and using a dead claim."""
        self.clock.advance(5.5)

    # -- invariants ----------------------------------------------------------------

    @checked
    def operations_match_the_model(self) -> None:
        plan = self.store.outbox.get_plan(self.intent)
        assert plan is not None
        intent, ops = plan
        for op in ops:
            m = self.model[op.key]
            assert (op.status, op.lease_owner, op.lease_epoch) == (m.status, m.owner, m.epoch)
            assert m.delivered_count <= 1
        statuses = {m.status for m in self.model.values()}
        assert (intent.status == "delivered") == (statuses <= {"delivered", "unsupported"})

    @checked
    def each_operation_is_delivered_at_most_once(self) -> None:
        rows = self.store.query(
            "SELECT operation_id, count(*) AS n FROM delivery_events "
            "WHERE dest = 'delivered' GROUP BY operation_id HAVING count(*) > 1"
        ).to_pylist()
        assert rows == []
        epochs: dict[str, list[int]] = {}
        for row in self.store.query(
            "SELECT operation_id, epoch FROM delivery_events WHERE trigger = 'claim' "
            "ORDER BY occurred_at, epoch"
        ).to_pylist():
            epochs.setdefault(row["operation_id"], []).append(row["epoch"])
        for op, seen in epochs.items():
            assert seen == list(range(1, len(seen) + 1)), (op, seen)


def machine(opener: StoreOpener) -> type[OutboxMachine]:
    """The machine with its stores from ``opener``."""
    return bound(OutboxMachine, opener, f"OutboxMachine[{opener.name}]")
