"""The differential state machine for tool-execution records (issue 22).

Runtime workers take session leases (``leases`` bundle: a lease stays in it
after it lapses, is released or taken over, so a later step is a stale worker
using it) and race on the records of two sessions as explicit steps, on an
injected clock: claim an execution key (the first claim, a retry of the same
call, a second worker claiming it, a claim that differs in one bound field,
under a run that ended, of another session or of another turn), complete it
(and repeat the completion), interrupt the session's running records, ask for
a retry of side-effecting calls, reclaim, and abandon; runs are admitted and
finished under the same leases (a finish interrupts the run's running
records). Every write rule may lose its reply (``lost_reply``: the write
commits and the caller sees ``OperationalError``, ``ambiguous.py``); the
retry that follows is compared with the model again.

The model (:class:`ToolModel`, written by hand from the README and the
docstrings, not from ``spec/tool_execution.py``) predicts each outcome, the
success or the typed refusal, and after every step:

- every record the store holds (state, result, attempt, bound call, reason,
  the epoch of the lease that claimed or reclaimed it, argument digest) is
  the model's, in the store's order;
- the events table holds exactly the model's transitions (a write under a
  stale or foreign lease, or without one while the session is held, would
  add one), each key has one claim at attempt 1 and one reclaim per later
  attempt, at most one completion (a result is recorded once), its last
  event's destination is its state, and no event names a lease epoch never
  granted on its session.

``make_machine(backend)`` returns the machine class for a backend.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from conftest import close_backend, open_backend
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from turnkeeper import (
    BusyError,
    InvalidInputError,
    InvalidTransitionError,
    Lease,
    LeaseLostError,
    OperationalError,
    RecoveryNotNeededError,
    RunNotFoundError,
    SessionRecoveryRequiredError,
    ToolExecution,
    ToolExecutionConflictError,
    ToolExecutionNotFoundError,
    ToolExecutionNotReclaimableError,
    TurnkeeperError,
)
from turnkeeper.fuzz import FakeClock
from turnkeeper.fuzz.ambiguous import INJECTED, ambiguously, replayable
from turnkeeper.fuzz.oracle import Oracle

SESSIONS = ("s1", "s2")
WORKERS = ("W1", "W2", "R1")
"""Runtime workers (execution leases) and a recovery worker (``R…``: a recovery
lease, granted only while the session's run has no live owner)."""
KEYS = ("k1", "k2", "k3")
TTLS = (2.0, 5.0)
STEPS_S = (1.0, 2.0, 3.0)
"""Clock steps: sums reach each TTL exactly (a lease is live iff now < expires_at)."""
RESULTS: tuple[Any, ...] = ("done", [{"type": "text", "text": "a.txt"}], {"n": 1})
FREE_TURN = "t-free"
"""The turn a claim without a run names."""
RUN_PICKS = ("none", "latest", "other", "wrong_turn")
"""A new claim's run: none (turn :data:`FREE_TURN`), the session's latest run
(its turn), the other session's latest run, or the latest run with
:data:`FREE_TURN` as its turn."""
VARY = (
    "none",
    "session_id",
    "run_id",
    "local_turn_id",
    "provider_call_id",
    "tool_name",
    "side_effecting",
    "args",
)
"""What a claim of an existing key changes in the bound call (``none``: the same call)."""
BINDING = (
    "session_id",
    "run_id",
    "local_turn_id",
    "provider_call_id",
    "tool_name",
    "side_effecting",
    "args",
)
"""What the first claim binds, in the order the conflict names the first difference."""
PROCESS_LOST = "process lost"
ABANDONED = "abandoned after interruption"
UNCERTAIN = ("running", "interrupted", "retry_requested")
TERMINAL_RUN = ("succeeded", "failed", "cancelled", "interrupted", "abandoned")

Outcome = tuple[Any, ...]
"""What a call gave: ``("ok", …)`` with the result's summary, or the refusal
(``("lost",)``, ``("busy",)``, ``("conflict", field)``, ``("invalid", field)``,
``("not_reclaimable", reason)``, ``("transition",)``, ``("not_found",)``,
``("no_run",)``, ``("unexpected", error type)``)."""

Event = tuple[str, int, str, int]
"""(execution key, attempt, edge, lease epoch or -1): one tool-execution event."""


def other_session(session: str) -> str:
    """The session that is not ``session``."""
    return next(s for s in SESSIONS if s != session)


def digest(arguments: Any) -> str:
    """sha256 hex of ``arguments`` as canonical JSON (sorted keys, compact), as
    the README says a claim stores them."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class RunModel:
    id: str
    session: str
    turn: str
    ended: bool = False


@dataclass
class RecordModel:
    """One execution key's record, as the model holds it."""

    key: str
    session_id: str
    run_id: str | None
    local_turn_id: str
    provider_call_id: str
    tool_name: str
    side_effecting: bool
    args: Any
    created: datetime
    state: str = "running"
    result: Any = None
    is_error: bool = False
    reason: str | None = None
    attempt: int = 1
    lease_epoch: int | None = None

    def binding(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in BINDING)


@dataclass(frozen=True)
class Call:
    """A claim's call: what it binds an execution key to."""

    session_id: str
    run_id: str | None
    local_turn_id: str
    provider_call_id: str
    tool_name: str
    side_effecting: bool
    args: Any

    def binding(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in BINDING)


@dataclass
class ToolModel:
    """The tool records of the sessions, their runs, the session leases, and
    every transition the store should have recorded."""

    leases: Oracle = field(default_factory=Oracle)
    runs: dict[str, list[RunModel]] = field(default_factory=dict)  # session -> oldest first
    records: dict[str, RecordModel] = field(default_factory=dict)
    events: Counter[Event] = field(default_factory=Counter)

    # -- reads -----------------------------------------------------------------

    def latest(self, session: str) -> RunModel | None:
        return self.runs[session][-1] if self.runs[session] else None

    def active(self, session: str) -> bool:
        """The session has a non-terminal run."""
        run = self.latest(session)
        return run is not None and not run.ended

    def run(self, run_id: str) -> RunModel:
        return next(r for rs in self.runs.values() for r in rs if r.id == run_id)

    def ordered(self, found: list[RecordModel]) -> list[RecordModel]:
        """In the store's order: by claim time, then key."""
        return sorted(found, key=lambda r: (r.created, r.key))

    def of_session(self, session: str) -> list[RecordModel]:
        return self.ordered([r for r in self.records.values() if r.session_id == session])

    def fence(self, session: str, lease: Lease | None, now: datetime) -> Outcome | None:
        """The refusal of a fenced write to ``session`` (the lease is on it), or None."""
        if lease is None:
            return ("busy",) if self.leases.live(f"session:{session}", now) else None
        valid = self.leases.valid(lease.target, lease.owner, lease.epoch, now)
        return None if valid else ("lost",)

    def event(self, rec: RecordModel, edge: str) -> None:
        epoch = -1 if rec.lease_epoch is None else rec.lease_epoch
        self.events[(rec.key, rec.attempt, edge, epoch)] += 1

    # -- the area's operations: (expected outcome, what the model does on success) ---

    def claim(
        self, key: str, call: Call, lease: Lease | None, now: datetime
    ) -> tuple[Outcome, Callable[[], None] | None]:
        if lease is not None and lease.target != f"session:{call.session_id}":
            return ("invalid", "lease"), None
        found = self.records.get(key)
        if found is not None:
            pairs = zip(BINDING, found.binding(), call.binding(), strict=True)
            differs = [f for f, a, b in pairs if a != b]
            if differs:
                name = "args_digest" if differs[0] == "args" else differs[0]
                return ("conflict", name), None
            return ("ok", key, False, found.state, found.attempt), None  # writes nothing
        if lease is not None and (refused := self.fence(call.session_id, lease, now)):
            return refused, None
        if call.run_id is not None:
            run = self.run(call.run_id)
            if run.session != call.session_id or run.ended:
                return ("invalid", "run_id"), None
            if run.turn != call.local_turn_id:
                return ("invalid", "local_turn_id"), None
        if lease is None and (refused := self.fence(call.session_id, None, now)):
            return refused, None

        def apply() -> None:
            rec = RecordModel(key, **vars(call), created=now)
            rec.lease_epoch = None if lease is None else lease.epoch
            self.records[key] = rec
            self.event(rec, "claim")

        return ("ok", key, True, "running", 1), apply

    def complete(
        self, key: str, result: Any, is_error: bool, lease: Lease | None, now: datetime
    ) -> tuple[Outcome, Callable[[], None] | None]:
        rec = self.records.get(key)
        if rec is None:
            return ("not_found",), None
        if lease is not None and lease.target != f"session:{rec.session_id}":
            return ("invalid", "lease"), None
        if rec.state == "completed" and (rec.result, rec.is_error) == (result, is_error):
            return ("ok", "completed", result, is_error), None  # a repeat: writes nothing
        if refused := self.fence(rec.session_id, lease, now):
            return refused, None
        if rec.state != "running":
            return ("transition",), None

        def apply() -> None:
            rec.state, rec.result, rec.is_error = "completed", result, is_error
            self.event(rec, "complete")

        return ("ok", "completed", result, is_error), apply

    def interrupt(
        self, session: str, turn: str | None, lease: Lease | None, now: datetime
    ) -> tuple[Outcome, Callable[[], None] | None]:
        if lease is not None and lease.target != f"session:{session}":
            return ("invalid", "lease"), None
        if refused := self.fence(session, lease, now):
            return refused, None
        running = [
            r
            for r in self.of_session(session)
            if r.state == "running" and turn in (None, r.local_turn_id)
        ]

        def apply() -> None:
            for rec in running:
                rec.state, rec.reason = "interrupted", PROCESS_LOST
                self.event(rec, "interrupt")

        return ("ok", [r.key for r in running]), apply

    def request_recovery(
        self, session: str, turn: str, call_ids: list[str]
    ) -> tuple[Outcome, Callable[[], None] | None]:
        """Unfenced (the user's confirmation): no lease, no refusal."""
        chosen = [
            r
            for r in self.of_session(session)
            if r.local_turn_id == turn and r.provider_call_id in call_ids
        ]
        moved = [r for r in chosen if r.state == "interrupted" and r.side_effecting]
        out = [r.key for r in chosen if r.state == "retry_requested" or r in moved]

        def apply() -> None:
            for rec in moved:
                rec.state = "retry_requested"
                self.event(rec, "request_retry")

        return ("ok", out), apply

    def reclaim(
        self, key: str, run_id: str | None, lease: Lease | None, now: datetime
    ) -> tuple[Outcome, Callable[[], None] | None]:
        rec = self.records.get(key)
        if rec is None:
            return ("not_found",), None
        if lease is not None and lease.target != f"session:{rec.session_id}":
            return ("invalid", "lease"), None
        if rec.state in ("completed", "abandoned"):
            return ("not_reclaimable", "terminal"), None
        if rec.side_effecting and rec.state != "retry_requested":
            return ("not_reclaimable", "needs_confirmation"), None
        if refused := self.fence(rec.session_id, lease, now):
            return refused, None
        if run_id is None:  # the record's own run, which must not have ended
            if rec.run_id is not None and self.run(rec.run_id).ended:
                return ("invalid", "run_id"), None
            run_id, turn = rec.run_id, rec.local_turn_id
        else:
            run = self.run(run_id)
            if run.session != rec.session_id or run.ended:
                return ("invalid", "run_id"), None
            turn = run.turn

        def apply() -> None:
            edge = f"reclaim_{'confirmed' if rec.state == 'retry_requested' else rec.state}"
            rec.state, rec.attempt, rec.reason = "running", rec.attempt + 1, None
            rec.lease_epoch = None if lease is None else lease.epoch
            rec.run_id, rec.local_turn_id = run_id, turn
            self.event(rec, edge)

        return ("ok", "running", rec.attempt + 1, run_id), apply

    def abandon(
        self, session: str, turn: str, lease: Lease | None, now: datetime
    ) -> tuple[Outcome, Callable[[], None] | None]:
        if lease is not None and lease.target != f"session:{session}":
            return ("invalid", "lease"), None
        if refused := self.fence(session, lease, now):
            return refused, None
        found = [
            r for r in self.of_session(session) if r.local_turn_id == turn and r.state in UNCERTAIN
        ]

        def apply() -> None:
            for rec in found:
                edge = f"abandon_{rec.state}"
                rec.state, rec.reason = "abandoned", ABANDONED
                self.event(rec, edge)

        return ("ok", len(found)), apply

    def run_ended(self, run: RunModel, status: str) -> None:
        """``runs.finish``: the run's running records (by run, or by its turn) are
        interrupted, saying how the run ended."""
        run.ended = True
        for rec in self.of_session(run.session):
            mine = rec.run_id == run.id or rec.local_turn_id == run.turn
            if rec.state == "running" and mine:
                rec.state, rec.reason = "interrupted", f"the run ended {status}"
                self.event(rec, "interrupt")


def attempt(
    shape: Callable[[Any], Outcome], fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Outcome:
    """``fn(*args, **kwargs)`` as an outcome: ``("ok", *shape(result))`` or the
    refusal; the injected ``OperationalError`` (a lost reply) propagates, and
    any other error of the store is ``("unexpected", …)``, which no model
    outcome equals."""
    try:
        return ("ok", *shape(fn(*args, **kwargs)))
    except ToolExecutionConflictError as e:
        return ("conflict", e.field)
    except ToolExecutionNotReclaimableError as e:
        return ("not_reclaimable", e.reason)
    except InvalidTransitionError:
        return ("transition",)
    except ToolExecutionNotFoundError:
        return ("not_found",)
    except RunNotFoundError:
        return ("no_run",)
    except InvalidInputError as e:
        return ("invalid", e.field)
    except LeaseLostError:
        return ("lost",)
    except BusyError:
        return ("busy",)
    except OperationalError as e:
        if e.detail == INJECTED:  # a lost reply: ``ambiguously`` tells the caller
            raise
        return ("unexpected", type(e).__name__, str(e))
    except TurnkeeperError as e:  # any other typed error disagrees with the model
        return ("unexpected", type(e).__name__, str(e))


def _epoch(epoch: int | None) -> int:
    return -1 if epoch is None else epoch


def claimed(got: tuple[ToolExecution, bool]) -> Outcome:
    return (got[0].execution_key, got[1], got[0].state, got[0].attempt)


def completed(rec: ToolExecution) -> Outcome:
    return (rec.state, rec.result, rec.is_error)


def keys(recs: list[ToolExecution]) -> Outcome:
    return ([r.execution_key for r in recs],)


def reclaimed(rec: ToolExecution) -> Outcome:
    return (rec.state, rec.attempt, rec.run_id)


def counted(n: int) -> Outcome:
    return (n,)


def make_machine(backend: str = "duckdb") -> type[RuleBasedStateMachine]:
    """The machine class with its stores on ``backend``."""

    class ToolRecordsMachine(RuleBasedStateMachine):
        leases = Bundle("leases")
        keys = Bundle("keys")
        """Execution keys a claim named (claimed, or refused: then unknown)."""

        def __init__(self) -> None:
            super().__init__()
            self.clock = FakeClock()
            self.store = open_backend(backend, None, self.clock)
            self.model = ToolModel()

        @initialize()
        def sessions(self) -> None:
            """Two idle sessions: runs are admitted under the workers' leases."""
            for sid in SESSIONS:
                self.store.sessions.create(sid)
                self.model.runs[sid] = []

        def teardown(self) -> None:
            close_backend(self.store)

        # -- the write harness -------------------------------------------------------

        def _write(
            self,
            step: str,
            args: dict[str, Any],
            operation: str,
            expect: Callable[[], tuple[Outcome, Callable[[], None] | None]],
            shape: Callable[[Any], Outcome],
            call: Callable[[], Any],
            lost_reply: bool,
        ) -> Outcome:
            """Run one write and compare it with the model; with ``lost_reply``
            the write commits and the caller sees ``OperationalError``, then
            retries it, and the retry is compared with the model too."""
            replayable(step, **args, lost_reply=lost_reply)
            expected, apply = expect()
            if not lost_reply:
                got = attempt(shape, call)
                assert got == expected, (step, args, got, expected)
                if apply is not None:
                    apply()
                return got
            got = ambiguously(self.store, attempt, shape, call)
            if expected[0] != "ok":
                assert got == expected, (step, args, got, expected)
                return got
            assert got == ("ambiguous", (operation,)), (step, args, got, expected)
            if apply is not None:
                apply()
            expected, apply = expect()  # the retry, as the model now says
            got = attempt(shape, call)
            assert got == expected, f"the retry of {step}{args}: {got} != {expected}"
            if apply is not None:
                apply()
            return got

        def _call(self, key: str, session: str, run_pick: str, side_effecting: bool) -> Call:
            other = other_session(session)
            run = self.model.latest(other if run_pick == "other" else session)
            if run_pick == "none" or run is None:
                run = None
            return Call(
                session_id=session,
                run_id=None if run is None else run.id,
                local_turn_id=FREE_TURN if run is None or run_pick == "wrong_turn" else run.turn,
                provider_call_id=f"call-{key}",
                tool_name="rm" if side_effecting else "ls",
                side_effecting=side_effecting,
                args={"key": key},
            )

        def _varied(self, rec: RecordModel, vary: str) -> Call:
            """``rec``'s call (the same call claimed again), with ``vary`` changed."""
            call = Call(**{f: getattr(rec, f) for f in BINDING})
            other = other_session(rec.session_id)
            changes: dict[str, dict[str, Any]] = {
                "none": {},
                "session_id": {"session_id": other},
                "run_id": {"run_id": "run-x" if rec.run_id is None else None},
                "local_turn_id": {
                    "local_turn_id": "t-other" if rec.local_turn_id == FREE_TURN else FREE_TURN
                },
                "provider_call_id": {"provider_call_id": f"{rec.provider_call_id}-x"},
                "tool_name": {"tool_name": f"{rec.tool_name}-x"},
                "side_effecting": {"side_effecting": not rec.side_effecting},
                "args": {"args": {"key": rec.key, "v": 2}},
            }
            return replace(call, **changes[vary])

        def _turn(self, session: str, pick: str) -> str:
            run = self.model.latest(session)
            return run.turn if pick == "latest" and run is not None else FREE_TURN

        # -- leases and runs ---------------------------------------------------------

        @rule(
            target=leases,
            owner=st.sampled_from(WORKERS),
            session=st.sampled_from(SESSIONS),
            ttl=st.sampled_from(TTLS),
        )
        def acquire(self, owner: str, session: str, ttl: float) -> Lease | None:
            replayable("acquire", owner=owner, session=session, ttl=ttl)
            target, now = f"session:{session}", self.clock()
            purpose = "recovery" if owner.startswith("R") else "execution"
            active = self.model.active(session)
            if self.model.leases.live(target, now) is None and active != (purpose == "recovery"):
                # a grant needs an idle session (execution) or an orphan run (recovery)
                expected: Outcome = ("recovery_required",) if active else ("not_needed",)
            else:
                expected = self.model.leases.acquire(target, owner, ttl, purpose, now)
            try:
                lease = self.store.leases.acquire(target, owner, ttl, purpose=purpose)
            except BusyError as e:
                assert expected == ("busy", e.holder), (expected, e)
                return None
            except SessionRecoveryRequiredError:
                assert expected == ("recovery_required",), expected
                return None
            except RecoveryNotNeededError:
                assert expected == ("not_needed",), expected
                return None
            assert expected[0] in ("granted", "reacquired"), (expected, lease)
            assert lease.epoch == expected[1], (lease, expected)
            return lease

        @rule(lease=leases)
        def release(self, lease: Lease | None) -> None:
            replayable("release", lease=lease)
            if lease is None:
                return
            expected = self.model.leases.release(
                lease.target, lease.owner, lease.epoch, self.clock()
            )
            assert ("released", self.store.leases.release(lease)) == expected, (lease, expected)

        @rule(seconds=st.sampled_from(STEPS_S))
        def time_passes(self, seconds: float) -> None:
            """Leases lapse as the clock moves (a worker that stopped renewing: crashed)."""
            replayable("time_passes", seconds=seconds)
            self.clock.advance(seconds)

        @rule(lease=leases)
        def admit_run(self, lease: Lease | None) -> None:
            """A runtime worker admits and starts its session's next run (only on an
            idle session, and not a recovery worker: the runs machine's area)."""
            replayable("admit_run", lease=lease)
            if lease is None or lease.purpose != "execution":
                return
            session = lease.target.removeprefix("session:")
            if self.model.active(session):
                return
            lost = self.model.fence(session, lease, self.clock())
            try:
                run = self.store.runs.admit(session, {"q": session}, lease=lease, start=True)
            except LeaseLostError:
                assert lost == ("lost",), lease
                return
            assert lost is None, (lease, run)
            self.model.runs[session].append(RunModel(run.id, session, run.turn_id))

        @rule(lease=leases, status=st.sampled_from(("succeeded", "failed")))
        def finish_run(self, lease: Lease | None, status: str) -> None:
            """A worker (a recovery worker too) finishes its session's run: the
            run's running records become interrupted."""
            replayable("finish_run", lease=lease, status=status)
            if lease is None:
                return
            session = lease.target.removeprefix("session:")
            run = self.model.latest(session)
            if run is None or run.ended:
                return
            lost = self.model.fence(session, lease, self.clock())
            try:
                self.store.runs.finish(run.id, status, lease=lease)
            except LeaseLostError:
                assert lost == ("lost",), lease
                return
            assert lost is None, lease
            self.model.run_ended(run, status)

        # -- the tool records --------------------------------------------------------

        @rule(
            target=keys,
            key=st.sampled_from(KEYS),
            session=st.sampled_from(SESSIONS),
            run_pick=st.sampled_from(RUN_PICKS),
            side_effecting=st.booleans(),
            vary=st.just("none") | st.sampled_from(VARY),  # the same call: half the time
            lease=st.none() | leases,
            lost_reply=st.booleans(),
        )
        def claim(
            self,
            key: str,
            session: str,
            run_pick: str,
            side_effecting: bool,
            vary: str,
            lease: Lease | None,
            lost_reply: bool,
        ) -> str:
            """A worker claims ``key``: a new call (``session``, ``run_pick``,
            ``side_effecting``), or, the key claimed already, that same call
            again (``vary`` none: a retry, or a second worker of the run) or
            one differing in ``vary``."""
            found = self.model.records.get(key)
            call = (
                self._call(key, session, run_pick, side_effecting)
                if found is None
                else self._varied(found, vary)
            )

            def store_call() -> Any:
                return self.store.tools.claim(
                    key,
                    call.session_id,
                    local_turn_id=call.local_turn_id,
                    provider_call_id=call.provider_call_id,
                    tool_name=call.tool_name,
                    side_effecting=call.side_effecting,
                    arguments=call.args,
                    run_id=call.run_id,
                    lease=lease,
                )

            self._write(
                "claim",
                {
                    "key": key,
                    "session": session,
                    "run_pick": run_pick,
                    "side_effecting": side_effecting,
                    "vary": vary,
                    "lease": lease,
                },
                "claim_tool_execution",
                lambda: self.model.claim(key, call, lease, self.clock()),
                claimed,
                store_call,
                lost_reply,
            )
            return key

        @rule(
            key=keys,
            result=st.sampled_from(range(len(RESULTS))),
            is_error=st.booleans(),
            lease=st.none() | leases,
            lost_reply=st.booleans(),
        )
        def complete(
            self, key: str, result: int, is_error: bool, lease: Lease | None, lost_reply: bool
        ) -> None:
            """A worker records the tool's result (``RESULTS[result]``)."""
            value = RESULTS[result]
            self._write(
                "complete",
                {"key": key, "result": result, "is_error": is_error, "lease": lease},
                "complete_tool_execution",
                lambda: self.model.complete(key, value, is_error, lease, self.clock()),
                completed,
                lambda: self.store.tools.complete(key, value, is_error=is_error, lease=lease),
                lost_reply,
            )

        @rule(
            session=st.sampled_from(SESSIONS),
            turn=st.sampled_from(("all", "latest", "free")),
            lease=st.none() | leases,
            lost_reply=st.booleans(),
        )
        def interrupt(self, session: str, turn: str, lease: Lease | None, lost_reply: bool) -> None:
            """The session's running records (of one turn, or all) are marked
            interrupted: their process is gone."""
            turn_id = None if turn == "all" else self._turn(session, turn)
            self._write(
                "interrupt",
                {"session": session, "turn": turn, "lease": lease},
                "interrupt_tool_executions",
                lambda: self.model.interrupt(session, turn_id, lease, self.clock()),
                keys,
                lambda: self.store.tools.interrupt(session, local_turn_id=turn_id, lease=lease),
                lost_reply,
            )

        @rule(
            session=st.sampled_from(SESSIONS),
            turn=st.sampled_from(("latest", "free")),
            calls=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
            lost_reply=st.booleans(),
        )
        def request_recovery(
            self, session: str, turn: str, calls: list[str], lost_reply: bool
        ) -> None:
            """The user confirms a retry of the turn's selected interrupted calls
            (by provider call id)."""
            turn_id = self._turn(session, turn)
            ids = [f"call-{k}" for k in calls]
            self._write(
                "request_recovery",
                {"session": session, "turn": turn, "calls": calls},
                "request_tool_execution_recovery",
                lambda: self.model.request_recovery(session, turn_id, ids),
                keys,
                lambda: self.store.tools.request_recovery(session, turn_id, ids),
                lost_reply,
            )

        @rule(
            key=keys,
            run_pick=st.sampled_from(("own", "latest", "other")),
            lease=st.none() | leases,
            lost_reply=st.booleans(),
        )
        def reclaim(self, key: str, run_pick: str, lease: Lease | None, lost_reply: bool) -> None:
            """A worker reopens ``key`` to run its tool again, in the record's own
            run, the session's latest run, or (refused) the other session's."""
            rec = self.model.records.get(key)
            run_id: str | None = None
            if rec is not None and run_pick != "own":
                other = other_session(rec.session_id)
                run = self.model.latest(rec.session_id if run_pick == "latest" else other)
                run_id = None if run is None else run.id
            self._write(
                "reclaim",
                {"key": key, "run_pick": run_pick, "lease": lease},
                "reclaim_tool_execution",
                lambda: self.model.reclaim(key, run_id, lease, self.clock()),
                reclaimed,
                lambda: self.store.tools.reclaim(key, run_id=run_id, lease=lease),
                lost_reply,
            )

        @rule(
            session=st.sampled_from(SESSIONS),
            turn=st.sampled_from(("latest", "free")),
            lease=st.none() | leases,
            lost_reply=st.booleans(),
        )
        def abandon(self, session: str, turn: str, lease: Lease | None, lost_reply: bool) -> None:
            """The turn's uncertain records are explicitly abandoned."""
            turn_id = self._turn(session, turn)
            self._write(
                "abandon",
                {"session": session, "turn": turn, "lease": lease},
                "abandon_interrupted_tool_executions",
                lambda: self.model.abandon(session, turn_id, lease, self.clock()),
                counted,
                lambda: self.store.tools.abandon_interrupted(session, turn_id, lease=lease),
                lost_reply,
            )

        # -- invariants -------------------------------------------------------------

        @invariant()
        def records_are_the_models(self) -> None:
            for sid in SESSIONS:
                stored = [
                    (
                        r.execution_key,
                        r.run_id,
                        r.local_turn_id,
                        r.provider_call_id,
                        r.tool_name,
                        r.side_effecting,
                        r.args_digest,
                        r.state,
                        r.result,
                        r.is_error,
                        r.reason,
                        r.attempt,
                        r.lease_epoch,
                    )
                    for r in self.store.tools.list(sid)
                ]
                model = [
                    (
                        m.key,
                        m.run_id,
                        m.local_turn_id,
                        m.provider_call_id,
                        m.tool_name,
                        m.side_effecting,
                        digest(m.args),
                        m.state,
                        m.result,
                        m.is_error,
                        m.reason,
                        m.attempt,
                        m.lease_epoch,
                    )
                    for m in self.model.of_session(sid)
                ]
                assert stored == model, (sid, stored, model)

        @invariant()
        def events_are_the_models(self) -> None:
            rows = self.store.query(
                "SELECT execution_key, session_id, attempt, edge, dest, lease_epoch "
                "FROM tool_execution_events"
            ).to_pylist()
            seen: Counter[Event] = Counter(
                (r["execution_key"], r["attempt"], r["edge"], _epoch(r["lease_epoch"]))
                for r in rows
            )
            assert seen == self.model.events, (seen - self.model.events, self.model.events - seen)
            by_key: dict[str, list[dict[str, Any]]] = {}
            for r in rows:
                by_key.setdefault(r["execution_key"], []).append(r)
            for key, events in by_key.items():
                claims = sorted(e["attempt"] for e in events if e["edge"] == "claim")
                reclaims = sorted(e["attempt"] for e in events if e["edge"].startswith("reclaim"))
                assert claims == [1], (key, "one claim, at attempt 1", claims)
                assert reclaims == list(range(2, len(reclaims) + 2)), (key, reclaims)
                assert sum(e["edge"] == "complete" for e in events) <= 1, (key, "two results")
                last = max(events, key=lambda e: (e["attempt"], _ORDER[e["edge"]]))
                rec = self.model.records[key]
                assert last["dest"] == rec.state, (key, last, rec.state)
                granted = self.model.leases.leases.get(f"session:{last['session_id']}")
                top = 0 if granted is None else granted.epoch
                assert all(e["lease_epoch"] is None or e["lease_epoch"] <= top for e in events), (
                    key,
                    "an epoch never granted",
                    events,
                )

    return ToolRecordsMachine


_ORDER = {
    "claim": 0,
    "reclaim_running": 0,
    "reclaim_interrupted": 0,
    "reclaim_confirmed": 0,
    "interrupt": 1,
    "request_retry": 2,
    "complete": 3,
    "abandon_running": 3,
    "abandon_interrupted": 3,
    "abandon_retry_requested": 3,
}
"""Within one attempt, the order a record's edges can follow each other in (an
attempt begins with its claim and ends completed or abandoned)."""
