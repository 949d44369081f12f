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
commits and the caller sees ``OperationalError``, :mod:`.ambiguous`); the
retry that follows is compared with the model again.

The model (:class:`~.tools_model.ToolModel`, written by hand from the README
and the docstrings, not from ``spec/tool_execution.py``) predicts each outcome, the
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

``machine(opener)`` returns the machine class with its stores from
``opener``; the guard kill tests (``model_tests/stateful/test_stateful_tool_records.py``)
run the same class with one guard patched out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, rule

from turnkeeper import (
    BusyError,
    Lease,
    LeaseLostError,
    RecoveryNotNeededError,
    SessionRecoveryRequiredError,
)

from .ambiguous import ambiguously, replayable
from .base import FuzzMachine, bound, checked
from .opener import StoreOpener
from .oracle import Outcome
from .tools_model import SESSIONS, RunModel, ToolModel, other_session
from .tools_store import (
    EVENT_COLUMNS,
    attempt,
    check_events,
    claimed,
    completed,
    counted,
    keys_of,
    model_record,
    reclaimed,
    stored_record,
)

WORKERS = ("W1", "W2", "R1")
"""Runtime workers (execution leases) and a recovery worker (``R…``: a recovery
lease, granted only while the session's run has no live owner)."""
KEYS = ("k1", "k2", "k3")
TTLS = (2.0, 5.0)
STEPS_S = (1.0, 2.0, 3.0)
"""Clock steps: sums reach each TTL exactly (a lease is live iff now < expires_at)."""
RESULTS: tuple[Any, ...] = ("done", [{"type": "text", "text": "a.txt"}], {"n": 1})
RUN_PICKS = ("none", "latest", "other", "wrong_turn")
"""A new claim's run: none (turn ``t-free``), the session's latest run
(its turn), the other session's latest run, or the latest run with
``t-free`` as its turn."""
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


class ToolRecordsMachine(FuzzMachine):
    """Workers W1, W2 and recovery worker R1 on two sessions' tool records."""

    leases = Bundle("leases")
    keys = Bundle("keys")
    """Execution keys a claim named (claimed, or refused: then unknown)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = ToolModel()

    @initialize()
    def sessions(self) -> None:
        """Two idle sessions: runs are admitted under the workers' leases."""
        for sid in SESSIONS:
            self.store.sessions.create(sid)
            self.model.runs[sid] = []

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

    # -- leases and runs ---------------------------------------------------------

    @rule(
        target=leases,
        owner=st.sampled_from(WORKERS),
        session=st.sampled_from(SESSIONS),
        ttl=st.sampled_from(TTLS),
    )
    def acquire(self, owner: str, session: str, ttl: float) -> Lease | None:
        """``owner`` takes ``session``'s lease for ``ttl`` s (execution, or
        recovery for ``R…``): the lease, or ``None`` when refused as the model
        says (busy, recovery required, recovery not needed)."""
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
        """A worker releases its lease (a no-op, ``False``, once it is lost)."""
        replayable("release", lease=lease)
        if lease is None:
            return
        expected = self.model.leases.release(lease.target, lease.owner, lease.epoch, self.clock())
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
            self.model.new_call(key, session, run_pick, side_effecting)
            if found is None
            else self.model.varied(found, vary)
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
        turn_id = None if turn == "all" else self.model.turn(session, turn)
        self._write(
            "interrupt",
            {"session": session, "turn": turn, "lease": lease},
            "interrupt_tool_executions",
            lambda: self.model.interrupt(session, turn_id, lease, self.clock()),
            keys_of,
            lambda: self.store.tools.interrupt(session, local_turn_id=turn_id, lease=lease),
            lost_reply,
        )

    @rule(
        session=st.sampled_from(SESSIONS),
        turn=st.sampled_from(("latest", "free")),
        calls=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
        lost_reply=st.booleans(),
    )
    def request_recovery(self, session: str, turn: str, calls: list[str], lost_reply: bool) -> None:
        """The user confirms a retry of the turn's selected interrupted calls
        (by provider call id)."""
        turn_id = self.model.turn(session, turn)
        ids = [f"call-{k}" for k in calls]
        self._write(
            "request_recovery",
            {"session": session, "turn": turn, "calls": calls},
            "request_tool_execution_recovery",
            lambda: self.model.request_recovery(session, turn_id, ids),
            keys_of,
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
        turn_id = self.model.turn(session, turn)
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

    @checked
    def records_are_the_models(self) -> None:
        for sid in SESSIONS:
            stored = [stored_record(r) for r in self.store.tools.list(sid)]
            model = [model_record(m) for m in self.model.of_session(sid)]
            assert stored == model, (sid, stored, model)

    @checked
    def events_are_the_models(self) -> None:
        sql = f"SELECT {EVENT_COLUMNS} FROM tool_execution_events"
        check_events(self.store.query(sql).to_pylist(), self.model)


def machine(opener: StoreOpener) -> type[ToolRecordsMachine]:
    """The machine with its stores from ``opener``."""
    return bound(ToolRecordsMachine, opener, f"ToolRecordsMachine[{opener.name}]")
