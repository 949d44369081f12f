"""The lease model: K workers acquire, renew, release and write under their
tokens on bounded targets, the clock ticks (leases expire, at the boundary
too: expired means ``now >= expires``) and workers crash (forget their tokens).

Every decision comes from the ``LEASE`` lifecycle given (``leasing``); the
invariants are the spec's, judged on what the workers were told:

- ``one live holder``: per target, at most one worker holds a token whose
  expiry, as the store told it, is still ahead;
- ``epochs increase``: every grant's epoch is above every earlier one on the target;
- ``no stale write``: no write is accepted under a token whose epoch is not
  the target's newest or whose expiry (as told) has passed;
- ``no revival``: a lease that expired is never live again under its epoch
  (others may already act on its expiry: a recovery, a takeover).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from model_check import leasing
from model_check.explorer import Label, Stepped
from model_check.leasing import Row, put
from turnkeeper.spec.lease import GRANTING_EDGES, LEASE
from turnkeeper.spec.lifecycle import Lifecycle

PURPOSE = "mutation"
"""The purpose every worker asks for (a ``session:`` lease the store grants on an idle session)."""

Mem = tuple[int, int] | None
"""What a worker remembers of a target: (epoch, expiry as told), or nothing."""


class State(NamedTuple):
    clock: int
    rows: tuple[Row | None, ...]
    mem: tuple[tuple[Mem, ...], ...]
    lapsed: tuple[frozenset[int], ...]
    top: tuple[int, ...]
    stale_write: bool = False
    epoch_reused: bool = False


class LeaseModel(Stepped[State]):
    """Workers ``workers`` on targets ``targets`` (session ids), the clock
    from 0 to ``ticks``, every lease for ``ttl`` ticks, at most ``grants``
    epochs per target (an acquire that would grant more is not offered)."""

    def __init__(
        self,
        workers: tuple[str, ...] = ("A", "B"),
        targets: tuple[str, ...] = ("s1",),
        ticks: int = 3,
        ttl: int = 2,
        lifecycle: Lifecycle = LEASE,
        grants: int = 3,
    ) -> None:
        self.workers, self.targets, self.ticks, self.ttl = workers, targets, ticks, ttl
        self.grants = grants
        self.lifecycle = lifecycle
        self.name = (
            f"leases[{len(workers)} workers x {len(targets)} targets x {ticks} ticks"
            f" x {grants} grants]"
        )
        self.invariants: Mapping[str, Callable[[State], bool]] = {
            "one live holder": self._one_holder,
            "epochs increase": lambda s: not s.epoch_reused,
            "no stale write": lambda s: not s.stale_write,
            "no revival": self._no_revival,
        }

    def initial(self) -> State:
        n = len(self.targets)
        return State(
            0,
            (None,) * n,
            ((None,) * n,) * len(self.workers),
            (frozenset(),) * n,
            (0,) * n,
        )

    # -- invariants -------------------------------------------------------------

    def _one_holder(self, s: State) -> bool:
        for t in range(len(self.targets)):
            live = [m for m in (mem[t] for mem in s.mem) if m is not None and s.clock < m[1]]
            if len(live) > 1:
                return False
        return True

    def _no_revival(self, s: State) -> bool:
        return all(
            row is None or row.state != "held" or s.clock >= row.expires or row.epoch not in lapsed
            for row, lapsed in zip(s.rows, s.lapsed, strict=True)
        )

    # -- steps ------------------------------------------------------------------

    def labels(self, s: State) -> Iterator[Label]:
        """Every step an actor can try from ``s`` (some are refused)."""
        if s.clock < self.ticks:
            yield ("tick",)
        for w, name in enumerate(self.workers):
            for t, target in enumerate(self.targets):
                yield ("acquire", name, target)
                if s.mem[w][t] is not None:
                    yield ("renew", name, target)
                    yield ("write", name, target)
                    yield ("release", name, target)
            if any(m is not None for m in s.mem[w]):
                yield ("crash", name)

    def step(self, s: State, label: Label) -> tuple[bool, State]:
        """``(accepted, next state)``; a refused step leaves the state as it was."""
        kind = label[0]
        if kind == "tick":
            return True, self._tick(s)
        w = self.workers.index(label[1])
        if kind == "crash":
            mem = put(s.mem, w, (None,) * len(self.targets))
            return True, s._replace(mem=mem)
        t = self.targets.index(label[2])
        row, mine = s.rows[t], s.mem[w][t]
        if kind == "acquire":
            got = leasing.acquire(self.lifecycle, row, label[1], PURPOSE, s.clock, self.ttl)
            if got is None:
                return False, s
            edge, new = got
            if new.epoch > self.grants:
                return False, s  # beyond the bound: not explored
            reused = s.epoch_reused or (edge in GRANTING_EDGES and new.epoch <= s.top[t])
            return True, s._replace(
                rows=put(s.rows, t, new),
                mem=put(s.mem, w, put(s.mem[w], t, (new.epoch, new.expires))),
                top=put(s.top, t, max(s.top[t], new.epoch)),
                epoch_reused=reused,
            )
        if mine is None:
            return False, s  # nothing to present
        args = (row, label[1], mine[0], PURPOSE, s.clock)
        if kind == "write":
            if not leasing.fenced(self.lifecycle, *args):
                return False, s
            stale = mine[0] != s.top[t] or s.clock >= mine[1]
            return True, s._replace(stale_write=s.stale_write or stale)
        if not leasing.passes(self.lifecycle, kind, *args):
            return False, s
        assert row is not None
        if kind == "renew":
            new = row._replace(expires=s.clock + self.ttl)
            told: Mem = (mine[0], new.expires)
        else:  # release: the row keeps its epoch; its expiry is at most now
            new = row._replace(state="released", expires=min(row.expires, s.clock))
            told = None
        return True, s._replace(rows=put(s.rows, t, new), mem=put(s.mem, w, put(s.mem[w], t, told)))

    def _tick(self, s: State) -> State:
        now = s.clock + 1
        lapsed = tuple(
            lap | {row.epoch}
            if row is not None and row.state == "held" and now >= row.expires
            else lap
            for row, lap in zip(s.rows, s.lapsed, strict=True)
        )
        return s._replace(clock=now, lapsed=lapsed)
