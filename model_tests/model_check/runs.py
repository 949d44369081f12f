"""The runs-with-recovery model: runtime workers (``W…``, ``execution``
leases) admit, start, park and finish runs on bounded sessions; recovery
workers (``R…``, ``recovery`` leases) begin, fail and converge the recovery
of orphans; anyone requests a cancel; the clock ticks (leases expire, a failed
recovery comes due) and workers crash (forget their leases).

Every decision comes from the lifecycles given: ``LEASE`` (through
``leasing``), ``RUN`` and ``RECOVERY`` (``Lifecycle.select`` over facts
computed from the model state as the store computes them:
``storage/ops/run_admission.py``, ``run_lifecycle.py``, ``recovery.py``).
What the store adds around the lifecycles is written here as it does it: a
granting acquire needs an idle session (``execution``) or an active run
(``recovery``); a repeated ``finish`` with the run's own status is a no-op;
``begin`` under the lease that already began the recovery returns it; a
recovery write needs the record's lease epoch to be the caller's.

Invariants (the spec's ``RUN`` and ``RECOVERY`` invariants):

- ``one active run``: at most one non-terminal run per session;
- ``no revival``: a run that ended keeps its terminal status;
- ``attempts numbered``: an intent's attempts are 1, 2, 3 … without repeats;
- ``cancel needs a request``: a run ends ``cancelled`` only after a cancel request;
- ``no stale write``: no run or recovery write commits under a lease whose
  epoch is not the session's newest or whose expiry (as told) has passed;
- ``capped failures dead-letter``: no recovery rests ``failed`` once its
  attempts reached the cap;
- ``retry only when due``: a failed recovery is begun again only once its
  next retry time has come.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from model_check import leasing
from model_check.explorer import Label, Stepped
from model_check.leasing import Row, put
from turnkeeper.spec.lease import GRANTING_EDGES, LEASE
from turnkeeper.spec.lifecycle import Lifecycle
from turnkeeper.spec.recovery import RECOVERY
from turnkeeper.spec.run import FINISH_TRIGGERS, NON_TERMINAL, RUN, RunStatus

MAX_ATTEMPTS = 2
"""The recovery attempt cap the model (and the replay's ``recovery.fail``) uses."""

FINISHES = ("succeeded", "cancelled")
"""The statuses a runtime worker ends a run with (``failed`` and the others
have no guards; recovery's convergence ends runs ``interrupted``)."""

LIVE = frozenset(s.value for s in NON_TERMINAL)

Mem = tuple[int, int] | None


class Run(NamedTuple):
    session: int
    intent: int
    attempt: int
    status: str
    cancel: bool = False
    rec: str = "absent"
    rec_epoch: int = 0
    rec_attempt: int = 0
    rec_due: int = 0


class State(NamedTuple):
    clock: int
    rows: tuple[Row | None, ...]
    mem: tuple[tuple[Mem, ...], ...]
    top: tuple[int, ...]
    runs: tuple[Run, ...] = ()
    ended: frozenset[tuple[int, str]] = frozenset()
    stale_write: bool = False
    early_retry: bool = False


def purpose_of(actor: str) -> str:
    """``recovery`` for a recovery worker (``R…``), else ``execution``."""
    return "recovery" if actor.startswith("R") else "execution"


class RunsModel(Stepped[State]):
    """Actors ``actors`` on sessions ``sessions``, at most ``max_runs`` runs
    in all, the clock from 0 to ``ticks``, leases for ``ttl`` ticks, at most
    ``grants`` lease epochs per session."""

    def __init__(
        self,
        actors: tuple[str, ...] = ("W1", "R1"),
        sessions: tuple[str, ...] = ("s1",),
        ticks: int = 3,
        ttl: int = 2,
        max_runs: int = 2,
        grants: int = 3,
        lease: Lifecycle = LEASE,
        run: Lifecycle = RUN,
        recovery: Lifecycle = RECOVERY,
    ) -> None:
        self.actors, self.sessions, self.ticks, self.ttl = actors, sessions, ticks, ttl
        self.max_runs, self.grants = max_runs, grants
        self.lease, self.run, self.recovery = lease, run, recovery
        self.name = (
            f"runs[{len(actors)} actors x {len(sessions)} sessions x {ticks} ticks"
            f" x {max_runs} runs x {grants} grants]"
        )
        self.invariants: Mapping[str, Callable[[State], bool]] = {
            "one active run": self._one_active,
            "no revival": lambda s: all(s.runs[i].status == st for i, st in s.ended),
            "attempts numbered": self._attempts,
            "cancel needs a request": lambda s: all(
                r.cancel for r in s.runs if r.status == "cancelled"
            ),
            "no stale write": lambda s: not s.stale_write,
            "capped failures dead-letter": lambda s: all(
                not (r.rec == "failed" and r.rec_attempt >= MAX_ATTEMPTS) for r in s.runs
            ),
            "retry only when due": lambda s: not s.early_retry,
        }

    def initial(self) -> State:
        n = len(self.sessions)
        return State(0, (None,) * n, ((None,) * n,) * len(self.actors), (0,) * n)

    # -- invariants -------------------------------------------------------------

    @staticmethod
    def _one_active(s: State) -> bool:
        live = Counter(r.session for r in s.runs if r.status in LIVE)
        return all(n <= 1 for n in live.values())

    @staticmethod
    def _attempts(s: State) -> bool:
        by_intent: dict[int, list[int]] = {}
        for r in s.runs:
            by_intent.setdefault(r.intent, []).append(r.attempt)
        return all(sorted(a) == list(range(1, len(a) + 1)) for a in by_intent.values())

    # -- steps ------------------------------------------------------------------

    def labels(self, s: State) -> Iterator[Label]:
        """Every step an actor can try from ``s`` (some are refused)."""
        if s.clock < self.ticks:
            yield ("tick",)
        for i, r in enumerate(s.runs):
            if r.status in LIVE and not r.cancel:
                yield ("request_cancel", f"r{i}")
        for a, actor in enumerate(self.actors):
            for t, session in enumerate(self.sessions):
                yield ("acquire", actor, session)
                if s.mem[a][t] is None:
                    continue
                yield ("release", actor, session)
                mine = [(i, r) for i, r in enumerate(s.runs) if r.session == t]
                if purpose_of(actor) == "execution":
                    if len(s.runs) < self.max_runs:
                        yield ("admit", actor, session)
                        for i, _ in mine:
                            yield ("admit", actor, session, f"r{i}")
                    for i, _ in mine:
                        yield ("start", actor, f"r{i}")
                        yield ("wait", actor, f"r{i}")
                        for status in FINISHES:
                            yield ("finish", actor, f"r{i}", status)
                else:
                    for i, _ in mine:
                        yield ("begin", actor, f"r{i}")
                        yield ("fail", actor, f"r{i}")
                        yield ("converge", actor, f"r{i}")
            if any(m is not None for m in s.mem[a]):
                yield ("crash", actor)

    def step(self, s: State, label: Label) -> tuple[bool, State]:
        """``(accepted, next state)``; a refused step leaves the state as it was."""
        kind = label[0]
        if kind == "tick":
            return True, s._replace(clock=s.clock + 1)
        if kind == "request_cancel":
            i = int(label[1][1:])
            if s.runs[i].status not in LIVE:
                return False, s
            return True, s._replace(runs=put(s.runs, i, s.runs[i]._replace(cancel=True)))
        a = self.actors.index(label[1])
        if kind == "crash":
            return True, s._replace(mem=put(s.mem, a, (None,) * len(self.sessions)))
        if kind in ("acquire", "release", "admit"):
            t = self.sessions.index(label[2])
            if kind == "acquire":
                return self._acquire(s, a, t)
            if kind == "release":
                return self._release(s, a, t)
            retry = int(label[3][1:]) if len(label) > 3 else None
            return self._admit(s, a, t, retry)
        i = int(label[2][1:])
        t = s.runs[i].session
        if s.mem[a][t] is None:
            return False, s  # no lease to present
        if kind == "finish" and s.runs[i].status == label[3]:
            return True, s  # a repeated terminalization is a no-op (before the fence)
        if not self._fence(s, a, t):
            return False, s
        if kind in ("start", "wait", "finish"):
            trigger = FINISH_TRIGGERS[RunStatus(label[3])] if kind == "finish" else kind
            ok, nxt = self._run_edge(s, i, trigger)
        else:
            ok, nxt = self._recovery_step(s, a, i, kind)
        if not ok:
            return False, s
        return True, nxt._replace(stale_write=nxt.stale_write or self._stale(s, a, t))

    # -- leases -----------------------------------------------------------------

    def _acquire(self, s: State, a: int, t: int) -> tuple[bool, State]:
        actor, purpose = self.actors[a], purpose_of(self.actors[a])
        got = leasing.acquire(self.lease, s.rows[t], actor, purpose, s.clock, self.ttl)
        if got is None:
            return False, s
        edge, new = got
        if edge in GRANTING_EDGES:
            if new.epoch > self.grants:
                return False, s  # beyond the bound: not explored
            active = any(r.session == t and r.status in LIVE for r in s.runs)
            if active != (purpose == "recovery"):
                return False, s  # recovery needed / not needed (admission_check)
        return True, s._replace(
            rows=put(s.rows, t, new),
            mem=put(s.mem, a, put(s.mem[a], t, (new.epoch, new.expires))),
            top=put(s.top, t, max(s.top[t], new.epoch)),
        )

    def _release(self, s: State, a: int, t: int) -> tuple[bool, State]:
        mine, row = s.mem[a][t], s.rows[t]
        assert mine is not None
        actor = self.actors[a]
        if not leasing.passes(
            self.lease, "release", row, actor, mine[0], purpose_of(actor), s.clock
        ):
            return False, s
        assert row is not None
        new = row._replace(state="released", expires=min(row.expires, s.clock))
        return True, s._replace(rows=put(s.rows, t, new), mem=put(s.mem, a, put(s.mem[a], t, None)))

    def _fence(self, s: State, a: int, t: int) -> bool:
        mine = s.mem[a][t]
        if mine is None:
            return False
        actor = self.actors[a]
        return leasing.fenced(self.lease, s.rows[t], actor, mine[0], purpose_of(actor), s.clock)

    @staticmethod
    def _stale(s: State, a: int, t: int) -> bool:
        mine = s.mem[a][t]
        return mine is None or mine[0] != s.top[t] or s.clock >= mine[1]

    # -- runs -------------------------------------------------------------------

    def _admit(self, s: State, a: int, t: int, retry: int | None) -> tuple[bool, State]:
        if not self._fence(s, a, t):
            return False, s
        active = any(r.session == t and r.status in LIVE for r in s.runs)
        if retry is None:
            intent, attempt, allowed = len(s.runs), 1, True
        else:
            prev = s.runs[retry]
            intent, attempt = prev.intent, prev.attempt + 1
            latest = max(r.attempt for r in s.runs if r.intent == prev.intent)
            allowed = latest == prev.attempt and prev.status not in LIVE
        facts = {"no_active_run": not active, "retry_allowed": allowed}
        if self.run.select("admit", "absent", facts) is None:
            return False, s
        stale = s.stale_write or self._stale(s, a, t)
        run = Run(t, intent, attempt, "admitted")
        return True, s._replace(runs=(*s.runs, run), stale_write=stale)

    def _run_edge(self, s: State, i: int, trigger: str) -> tuple[bool, State]:
        run = s.runs[i]
        edge = self.run.select(trigger, run.status, {"cancel_requested": run.cancel})
        if edge is None:
            return False, s
        return True, self._set_status(s, i, edge.dest)

    def _set_status(self, s: State, i: int, status: str) -> State:
        ended = s.ended if status in LIVE else s.ended | {(i, status)}
        return s._replace(runs=put(s.runs, i, s.runs[i]._replace(status=status)), ended=ended)

    # -- recovery ---------------------------------------------------------------

    def _recovery_step(self, s: State, a: int, i: int, kind: str) -> tuple[bool, State]:
        run = s.runs[i]
        mine = s.mem[a][run.session]
        assert mine is not None
        epoch = mine[0]
        if kind == "begin":
            if run.status not in LIVE:
                return False, s
            exists = run.rec != "absent"
            facts = {
                "due": exists and run.rec_due <= s.clock,
                "superseded": exists and run.rec_epoch < epoch,
                "remote_ended": False,
            }
            edge = self.recovery.select("begin", run.rec, facts)
            if run.rec_attempt >= MAX_ATTEMPTS + 1:
                return False, s  # beyond the bound: not explored
            if edge is None:
                return False, s  # (or the same lease's begin again: a no-op)
            early = s.early_retry or (run.rec == "failed" and run.rec_due > s.clock)
            new = run._replace(
                rec=edge.dest, rec_epoch=epoch, rec_attempt=run.rec_attempt + 1, rec_due=0
            )
            return True, s._replace(runs=put(s.runs, i, new), early_retry=early)
        if run.rec != "recovering" or run.rec_epoch != epoch:
            return False, s
        if kind == "fail":
            exhausted = run.rec_attempt >= MAX_ATTEMPTS
            edge = self.recovery.select("fail", run.rec, {"attempts_exhausted": exhausted})
            if edge is None:
                return False, s
            new = run._replace(rec=edge.dest, rec_due=s.clock + 1)
            return True, s._replace(runs=put(s.runs, i, new))
        edge = self.recovery.select("converge", run.rec, {})
        if edge is None:
            return False, s
        if run.status in LIVE:
            trigger = "cancel" if run.cancel else "interrupt"
            ended = self.run.select(trigger, run.status, {"cancel_requested": run.cancel})
            if ended is None:
                return False, s
            s = self._set_status(s, i, ended.dest)
        return True, s._replace(runs=put(s.runs, i, s.runs[i]._replace(rec=edge.dest)))
