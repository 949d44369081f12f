"""The differential state machine for runs and recovery.

Simulated workers and recovery workers take session leases, admit, start,
finish and cancel runs, and recover orphans, on an injected clock; crashes
are workers that stop using their lease (it expires as the clock moves).
Every outcome is compared with a plain-Python oracle, and after every step:

- at most one non-terminal run per session, and it is the one the
  ``active_runs`` table names;
- no run is revived: a run the oracle saw end keeps that status;
- no termination or convergence commits under a lost lease, and no write
  without a lease commits while anyone holds the session (the oracle agrees
  with every outcome).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, MultipleResults, initialize, multiple, rule

import turnkeeper
from turnkeeper import (
    BusyError,
    InvalidTransitionError,
    LeaseLostError,
    LeasePurposeError,
    RecoveryNotNeededError,
    SessionRecoveryRequiredError,
    SessionRunActiveError,
)

from .ambiguous import ambiguously, replayable
from .base import FuzzMachine, bound, checked
from .opener import StoreOpener
from .oracle import Oracle, Outcome

Lease = turnkeeper.Lease

SESSIONS = ("s1", "s2")
OWNERS = ("W1", "W2", "R1")
TERMINAL = ("succeeded", "failed", "cancelled", "interrupted", "abandoned")
LIVE = ("admitted", "running", "waiting")


@dataclass
class RunModel:
    """A run as the model holds it: its session, status, whether a cancel
    was requested, and the recovery that began on it (lease epoch, state)."""

    session: str
    status: str = "admitted"
    cancel_requested: bool = False
    recovery_epoch: int | None = None  # epoch of the recovery lease that began it
    recovery_state: str | None = None


@dataclass
class World:
    """Every run the machine admitted, by id."""

    runs: dict[str, RunModel] = field(default_factory=dict)

    def active(self, session: str) -> str | None:
        """The session's non-terminal run's id, else ``None``."""
        found = [r for r, m in self.runs.items() if m.session == session and m.status in LIVE]
        return found[0] if found else None


def legal(trigger: str, status: str, cancel_requested: bool) -> bool:
    """The run lifecycle, written out by hand (independent of spec/run.py)."""
    if status not in LIVE:
        return False
    return {
        "start": status == "admitted",
        "succeeded": status == "running",
        "failed": True,
        "abandoned": True,
        "interrupted": True,
        "cancelled": cancel_requested,
    }[trigger]


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """``fn(*args, **kwargs)`` as an outcome: ``("ok", value)``, or the
    refusal's kind (``("busy",)``, ``("lost",)`` …); other errors propagate."""
    try:
        return ("ok", fn(*args, **kwargs))
    except BusyError:
        return ("busy",)
    except LeaseLostError:
        return ("lost",)
    except LeasePurposeError:
        return ("purpose",)
    except SessionRunActiveError:
        return ("active",)
    except RecoveryNotNeededError:
        return ("not_needed",)
    except SessionRecoveryRequiredError:
        return ("recovery_required",)
    except InvalidTransitionError:
        return ("transition",)


class RunsAndRecoveryMachine(FuzzMachine):
    """Workers W1, W2 and recovery worker R1 on two sessions' runs."""

    leases = Bundle("leases")
    runs = Bundle("runs")

    def __init__(self) -> None:
        self.marks = 0
        super().__init__()
        self.oracle = Oracle()
        self.world = World()

    @initialize()
    def sessions(self) -> None:
        for sid in SESSIONS:
            self.store.sessions.create(sid)

    def _held(self, session: str) -> bool:
        """Someone holds a live lease on the session (by the oracle)."""
        return self.oracle.live(f"session:{session}", self.clock()) is not None

    def _valid(self, lease: turnkeeper.Lease) -> bool:
        return self.oracle.valid(lease.target, lease.owner, lease.epoch, self.clock())

    def _admit_expected(self, session: str, lease: Lease | None) -> Outcome:
        """What an admission without a known submission key gets (by the oracle)."""
        if lease is not None and lease.purpose not in ("admission", "execution"):
            return ("purpose",)  # a recovery lease never admits a run (checked first)
        if lease is not None and not self._valid(lease):
            return ("lost",)
        if lease is None and self._held(session):
            return ("busy",)  # without a lease, only while nobody holds the session
        if self.world.active(session) is not None:
            return ("active",)
        return ("ok",)

    def _finish_expected(self, model: RunModel, status: str, lease: Lease | None) -> str:
        if model.status == status:
            return "ok"  # a repeated terminalization is idempotent
        if lease is not None and not self._valid(lease):
            return "lost"
        if lease is None and self._held(model.session):
            return "busy"
        if legal(status, model.status, model.cancel_requested):
            return "ok"
        return "transition"

    # -- steps -------------------------------------------------------------------

    @rule(
        target=leases,
        owner=st.sampled_from(OWNERS),
        session=st.sampled_from(SESSIONS),
        ttl=st.sampled_from((1.0, 3.0)),
    )
    def acquire(self, owner: str, session: str, ttl: float) -> Lease | MultipleResults[Lease]:
        purpose = "recovery" if owner.startswith("R") else "execution"
        target, now = f"session:{session}", self.clock()
        active = self.world.active(session) is not None
        if self.oracle.live(target, now) is None and active != (purpose == "recovery"):
            # a grant needs an idle session (execution) or an orphan (recovery)
            expected: Outcome = ("not_needed",) if purpose == "recovery" else ("recovery_required",)
        else:
            expected = self.oracle.acquire(target, owner, ttl, purpose, now)
        got = attempt(self.store.leases.acquire, f"session:{session}", owner, ttl, purpose=purpose)
        assert (got[0] == "ok") == (expected[0] in ("granted", "reacquired")), (got, expected)
        if expected[0] in ("not_needed", "recovery_required"):
            assert got[0] == expected[0], (got, expected)
        return got[1] if got[0] == "ok" else multiple()

    @rule(seconds=st.sampled_from((0.5, 1.0, 2.0)))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(
        target=runs,
        session=st.sampled_from(SESSIONS),
        lease=st.none() | leases,
        start=st.booleans(),
    )
    def admit(self, session: str, lease: Lease | None, start: bool) -> str | MultipleResults[str]:
        if lease is not None and lease.target != f"session:{session}":
            lease = None
        expected = self._admit_expected(session, lease)
        got = attempt(self.store.runs.admit, session, {"q": 1}, lease=lease, start=start)
        assert got[0] == expected[0], (got, expected)
        if got[0] != "ok":
            return multiple()
        model = RunModel(session)
        if start:  # admitted and started in one transaction
            model.status = "running"
        assert got[1].status == model.status, (got, model)
        run_id: str = got[1].id
        self.world.runs[run_id] = model
        return run_id

    @rule(run=runs)
    def start(self, run: str) -> None:
        model = self.world.runs[run]
        ok = legal("start", model.status, model.cancel_requested)
        expected = "transition" if not ok else "busy" if self._held(model.session) else "ok"
        got = attempt(self.store.runs.start, run)
        assert got[0] == expected, (got, model)
        ok = expected == "ok"
        if ok:
            model.status = "running"

    @rule(run=runs)
    def request_cancel(self, run: str) -> None:
        model = self.world.runs[run]
        got = attempt(self.store.runs.request_cancel, run)
        assert got[0] == ("ok" if model.status in LIVE else "transition"), (got, model)
        if got[0] == "ok":
            model.cancel_requested = True

    @rule(
        run=runs,
        status=st.sampled_from(TERMINAL),
        lease=st.none() | leases,
        with_entries=st.booleans(),
    )
    def finish(self, run: str, status: str, lease: Lease | None, with_entries: bool) -> None:
        model = self.world.runs[run]
        if lease is not None and lease.target != f"session:{model.session}":
            lease = None
        expected = self._finish_expected(model, status, lease)
        self.marks += 1
        mark = f"last entry {self.marks}"
        entries = [("message", {"message": {"role": "user", "content": mark}})]
        repeated = model.status == status
        got = attempt(
            self.store.runs.finish,
            run,
            status,
            lease=lease,
            entries=entries if with_entries else (),
        )
        assert got[0] == expected, (got, expected, model, lease)
        stored = [
            e
            for e in self.store.sessions.entries(model.session)
            if e.payload.get("message", {}).get("content") == mark
        ]
        # the turn's last entries are written with the termination, never without it
        assert len(stored) == (with_entries and got[0] == "ok" and not repeated), (got, stored)
        if got[0] == "ok":
            assert expected == "ok", f"run ended under a lost lease {lease}"
            model.status = status

    @rule(
        target=runs,
        session=st.sampled_from(SESSIONS),
        lease=st.none() | leases,
        start=st.booleans(),
        keyed=st.booleans(),
    )
    def admit_ambiguously(
        self, session: str, lease: Lease | None, start: bool, keyed: bool
    ) -> str | MultipleResults[str]:
        """An admission that commits while its caller sees a lost connection,
        then the runtime's retry. With a submission key the retry returns the
        run admitted (the same id, as stored, under any lease or none); without
        one it is refused as the session's active run (nothing admitted twice)."""
        if lease is not None and lease.target != f"session:{session}":
            lease = None
        self.marks += 1
        key = f"sub-{self.marks}" if keyed else None
        replayable(
            "admit_ambiguously",
            session=session,
            lease=None if lease is None else (lease.owner, lease.epoch),
            start=start,
            keyed=keyed,
        )
        expected = self._admit_expected(session, lease)
        call = (self.store.runs.admit, session, {"q": self.marks})
        kw: dict[str, Any] = {"lease": lease, "start": start, "submission_key": key}
        got = ambiguously(self.store, attempt, *call, **kw)
        if expected[0] != "ok":
            assert got == expected, (got, expected)
            return multiple()
        assert got == ("ambiguous", ("admit_run",)), (got, expected)
        stored = self.store.runs.active(session)
        assert stored is not None, "the ambiguous admission committed no run"
        model = RunModel(session, status="running" if start else "admitted")
        self.world.runs[stored.id] = model
        retried = attempt(*call, **kw)
        if keyed:  # the submission's run, whatever happened to the session since
            assert retried[0] == "ok", f"the retry of a keyed admission: {retried}"
            assert (retried[1].id, retried[1].status) == (stored.id, model.status), retried
        else:  # the lease and the session are as the admission left them
            assert retried == self._admit_expected(session, lease) == ("active",), retried
        return stored.id

    @rule(run=runs)
    def start_ambiguously(self, run: str) -> None:
        """A start committed but reported lost, then retried: the run is already
        running, so the retry is the lifecycle's refusal (not idempotent)."""
        replayable("start_ambiguously", run=run)
        model = self.world.runs[run]
        ok = legal("start", model.status, model.cancel_requested)
        expected = "transition" if not ok else "busy" if self._held(model.session) else "ok"
        got = ambiguously(self.store, attempt, self.store.runs.start, run)
        if expected != "ok":
            assert got[0] == expected, (got, model)
            return
        assert got == ("ambiguous", ("start_run",)), (got, model)
        model.status = "running"
        retried = attempt(self.store.runs.start, run)
        assert retried[0] == "transition", (retried, model)

    @rule(
        run=runs,
        status=st.sampled_from(TERMINAL),
        lease=st.none() | leases,
    )
    def finish_ambiguously(self, run: str, status: str, lease: Lease | None) -> None:
        """A termination (with the turn's last entry) committed but reported
        lost, then retried: the retry succeeds as a repeated termination and
        writes the entry no second time."""
        model = self.world.runs[run]
        if lease is not None and lease.target != f"session:{model.session}":
            lease = None
        replayable(
            "finish_ambiguously",
            run=run,
            status=status,
            lease=None if lease is None else (lease.owner, lease.epoch),
        )
        expected = self._finish_expected(model, status, lease)
        self.marks += 1
        mark = f"last entry {self.marks}"
        entries = [("message", {"message": {"role": "user", "content": mark}})]
        call = (self.store.runs.finish, run, status)
        got = ambiguously(self.store, attempt, *call, lease=lease, entries=entries)
        if expected != "ok" or model.status == status:
            # a refusal, or a repeated termination: nothing to commit, but the
            # call still ran its write (which the caller saw fail)
            assert got[0] == (expected if expected != "ok" else "ambiguous"), (got, expected)
            return
        assert got == ("ambiguous", ("finish_run",)), (got, expected)
        model.status = status
        retried = attempt(*call, lease=lease, entries=entries)
        assert retried[0] == "ok", f"the retry of a committed finish: {retried}, {model}"
        assert retried[1].status == status, retried
        stored = [
            e
            for e in self.store.sessions.entries(model.session)
            if e.payload.get("message", {}).get("content") == mark
        ]
        assert len(stored) == 1, f"the turn's last entry written {len(stored)} times"

    @rule(run=runs, lease=leases)
    def recover(self, run: str, lease: Lease) -> None:
        model = self.world.runs[run]
        if lease.target != f"session:{model.session}" or lease.purpose != "recovery":
            return
        if not self._valid(lease):
            expected = "lost"
        elif model.status not in LIVE or (model.recovery_epoch or 0) > lease.epoch:
            expected = "not_needed"
        else:
            expected = "ok"
        got = attempt(self.store.recovery.begin, run, lease)
        assert got[0] == expected, (got, expected, model)
        if got[0] == "ok":
            model.recovery_epoch, model.recovery_state = lease.epoch, "recovering"

    @rule(run=runs, lease=leases)
    def converge(self, run: str, lease: Lease) -> None:
        model = self.world.runs[run]
        if lease.target != f"session:{model.session}" or lease.purpose != "recovery":
            return
        if not self._valid(lease):
            expected = "lost"
        elif model.recovery_state != "recovering":
            expected = "transition"
        elif model.recovery_epoch != lease.epoch:
            expected = "lost"
        else:
            expected = "ok"
        got = attempt(self.store.recovery.converge, run, lease)
        assert got[0] == expected, (got, expected, model)
        if got[0] == "ok":
            model.recovery_state = "completed"
            if model.status in LIVE:
                model.status = "cancelled" if model.cancel_requested else "interrupted"

    # -- invariants --------------------------------------------------------------

    @checked
    def one_non_terminal_run_per_session_and_none_revived(self) -> None:
        rows = self.store.db.read(
            "test-query",
            lambda tx: tx.rows(
                "SELECT r.id, r.session_id, r.status, a.run_id IS NOT NULL FROM runs r "
                "LEFT JOIN active_runs a ON a.run_id = r.id"
            ),
        )
        live: dict[str, list[str]] = {}
        for run_id, session, status, is_active in rows:
            if status in LIVE:
                live.setdefault(session, []).append(run_id)
                assert is_active, f"{run_id} is {status} but not the session's active run"
            else:
                assert not is_active, f"{run_id} is {status} yet still active"
            model = self.world.runs.get(run_id)
            if model is not None and model.status in TERMINAL:
                assert status == model.status, f"{run_id} revived: {model.status} -> {status}"
        for session, ids in live.items():
            assert len(ids) <= 1, f"{session}: several non-terminal runs {ids}"


def machine(opener: StoreOpener) -> type[RunsAndRecoveryMachine]:
    """The machine with its stores from ``opener``."""
    return bound(RunsAndRecoveryMachine, opener, f"RunsAndRecoveryMachine[{opener.name}]")
