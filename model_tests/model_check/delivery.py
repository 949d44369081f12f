"""The outbox model: outbox workers claim, progress, deliver and requeue the
operations of one delivery intent (step ``b`` depends on step ``a``); the
clock ticks (claims expire, a requeued operation comes due) and workers
crash (forget their claims).

Every claim decision comes from the ``DELIVERY`` lifecycle given (facts
computed as ``storage/ops/outbox.py`` computes them); the fence on a claim's
writes (owner and epoch current, the claim held and unexpired) and the
repeated result of the same claim are written here as the store does them.

Invariants (the spec's ``DELIVERY`` invariants):

- ``one live claim``: per operation, at most one worker holds a claim whose
  expiry, as told, is still ahead;
- ``delivered once``: an operation is delivered at most once;
- ``no stale result``: no progress, result or requeue commits under a claim
  that is not the operation's newest or whose expiry (as told) has passed;
- ``dependency first``: ``b`` is claimed only after ``a`` is delivered or unsupported;
- ``claim only when due``: a requeued operation is claimed only once due.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from model_check.explorer import Label, Stepped
from model_check.leasing import put
from turnkeeper.spec.delivery import DELIVERY
from turnkeeper.spec.lifecycle import Lifecycle

OPS = ("a", "b")
"""The intent's steps; ``b`` depends on ``a``."""

DEPENDS = {1: 0}
_HELD = frozenset({"claimed", "in_progress"})
_DONE = frozenset({"delivered", "unsupported"})
_TERMINAL = _DONE | {"failed", "uncertain"}

Mem = tuple[int, int] | None
"""What a worker remembers of an operation: (claim epoch, expiry as told)."""


class Op(NamedTuple):
    status: str = "pending"
    owner: str = ""
    epoch: int = 0
    expires: int = -1  # -1: no claim expiry (NULL)
    next_at: int = -1  # -1: no next attempt time (NULL)
    delivered: int = 0


class State(NamedTuple):
    clock: int
    ops: tuple[Op, ...]
    mem: tuple[tuple[Mem, ...], ...]
    stale_result: bool = False
    early_claim: bool = False
    dependency_skipped: bool = False


class DeliveryModel(Stepped[State]):
    """Workers ``workers`` on the operations :data:`OPS`, the clock from 0 to
    ``ticks``, claims for ``ttl`` ticks, at most ``grants`` claims per operation."""

    def __init__(
        self,
        workers: tuple[str, ...] = ("O1", "O2"),
        ticks: int = 3,
        ttl: int = 2,
        grants: int = 3,
        delivery: Lifecycle = DELIVERY,
    ) -> None:
        self.workers, self.ticks, self.ttl, self.grants = workers, ticks, ttl, grants
        self.delivery = delivery
        self.name = (
            f"delivery[{len(workers)} workers x {len(OPS)} operations x {ticks} ticks"
            f" x {grants} claims]"
        )
        self.invariants: Mapping[str, Callable[[State], bool]] = {
            "one live claim": self._one_claim,
            "delivered once": lambda s: all(op.delivered <= 1 for op in s.ops),
            "no stale result": lambda s: not s.stale_result,
            "dependency first": lambda s: not s.dependency_skipped,
            "claim only when due": lambda s: not s.early_claim,
        }

    def initial(self) -> State:
        return State(0, (Op(),) * len(OPS), ((None,) * len(OPS),) * len(self.workers))

    def _one_claim(self, s: State) -> bool:
        for o in range(len(OPS)):
            live = [m for m in (mem[o] for mem in s.mem) if m is not None and s.clock < m[1]]
            if len(live) > 1:
                return False
        return True

    def labels(self, s: State) -> Iterator[Label]:
        """Every step an actor can try from ``s`` (some are refused)."""
        if s.clock < self.ticks:
            yield ("tick",)
        for w, name in enumerate(self.workers):
            for o, op in enumerate(OPS):
                yield ("claim", name, op)
                if s.mem[w][o] is not None:
                    yield ("progress", name, op)
                    yield ("deliver", name, op)
                    yield ("requeue", name, op)
            if any(m is not None for m in s.mem[w]):
                yield ("crash", name)

    def step(self, s: State, label: Label) -> tuple[bool, State]:
        """``(accepted, next state)``; a refused step leaves the state as it was."""
        kind = label[0]
        if kind == "tick":
            return True, s._replace(clock=s.clock + 1)
        w = self.workers.index(label[1])
        if kind == "crash":
            return True, s._replace(mem=put(s.mem, w, (None,) * len(OPS)))
        o = OPS.index(label[2])
        op = s.ops[o]
        if kind == "claim":
            return self._claim(s, w, o)
        mine = s.mem[w][o]
        if mine is None:
            return False, s
        if kind == "deliver" and op.status in _TERMINAL:
            # the same claim's result again: returned as stored, or refused
            same = (op.owner, op.epoch) == (label[1], mine[0])
            return (same and op.status == "delivered"), s
        held = op.status in _HELD and s.clock < op.expires
        if (op.owner, op.epoch) != (label[1], mine[0]) or not held:
            return False, s
        trigger = {"progress": "progress", "deliver": "deliver", "requeue": "requeue"}[kind]
        edge = self.delivery.select(trigger, op.status, {})
        if edge is None:
            return False, s
        stale = s.stale_result or s.clock >= mine[1]
        if kind == "progress":
            new = op._replace(status=edge.dest, expires=s.clock + self.ttl)
            told: Mem = (mine[0], new.expires)
        elif kind == "deliver":
            new = op._replace(status=edge.dest, expires=-1, delivered=op.delivered + 1)
            told = None
        else:  # requeue with a delay of one tick
            new = op._replace(status=edge.dest, expires=-1, next_at=s.clock + 1)
            told = None
        return True, s._replace(
            ops=put(s.ops, o, new),
            mem=put(s.mem, w, put(s.mem[w], o, told)),
            stale_result=stale,
        )

    def _claim(self, s: State, w: int, o: int) -> tuple[bool, State]:
        op = s.ops[o]
        if op.status in _TERMINAL:
            return False, s
        dep = DEPENDS.get(o)
        dep_done = dep is None or s.ops[dep].status in _DONE
        facts = {
            "due": op.next_at <= s.clock,
            "dependency_done": dep_done,
            "claim_expired": op.expires >= 0 and op.expires <= s.clock,
        }
        edge = self.delivery.select("claim", op.status, facts)
        if edge is None or op.epoch + 1 > self.grants:
            return False, s
        new = op._replace(
            status=edge.dest,
            owner=self.workers[w],
            epoch=op.epoch + 1,
            expires=s.clock + self.ttl,
            next_at=-1,
        )
        return True, s._replace(
            ops=put(s.ops, o, new),
            mem=put(s.mem, w, put(s.mem[w], o, (new.epoch, new.expires))),
            early_claim=s.early_claim or op.next_at > s.clock,
            dependency_skipped=s.dependency_skipped or not dep_done,
        )
