"""The model of the tool-records machine (:mod:`.tools`): tool-execution
records, their runs and their session leases, as plain Python.

:class:`ToolModel` is written by hand from the README and the store's
docstrings, not from ``spec/tool_execution.py``, so a guard the spec and the
store share is checked against an independent reading. Each operation
returns ``(expected outcome, apply)``: the outcome the store should give
(``("ok", …)`` with the result's summary, or the refusal: ``("lost",)``,
``("busy",)``, ``("conflict", field)``, ``("invalid", field)``,
``("not_reclaimable", reason)``, ``("transition",)``, ``("not_found",)``),
and ``apply``, what the model does once the store did it (``None``: the
call writes nothing). The machine calls ``apply`` only after the store
agreed, and again for a retry after an ambiguous commit, so an operation
that is not idempotent shows.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from turnkeeper import Lease

from .oracle import Oracle, Outcome

SESSIONS = ("s1", "s2")
"""The sessions the machine's records belong to."""
FREE_TURN = "t-free"
"""The turn a claim without a run names."""
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
"""The reason an interrupt gives a record."""
ABANDONED = "abandoned after interruption"
"""The reason an abandon gives a record."""
UNCERTAIN = ("running", "interrupted", "retry_requested")
"""The states an abandon takes (whether the tool ran is not known)."""

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
    """A run the machine admitted: its id, session, turn, and whether it ended."""

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
        """The bound call's fields, in :data:`BINDING`'s order."""
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
        """The call's fields, in :data:`BINDING`'s order."""
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
        """The session's last admitted run, else ``None``."""
        return self.runs[session][-1] if self.runs[session] else None

    def active(self, session: str) -> bool:
        """The session has a non-terminal run."""
        run = self.latest(session)
        return run is not None and not run.ended

    def run(self, run_id: str) -> RunModel:
        """The run ``run_id`` (one the machine admitted: else ``StopIteration``)."""
        return next(r for rs in self.runs.values() for r in rs if r.id == run_id)

    def ordered(self, found: list[RecordModel]) -> list[RecordModel]:
        """In the store's order: by claim time, then key."""
        return sorted(found, key=lambda r: (r.created, r.key))

    def of_session(self, session: str) -> list[RecordModel]:
        """The session's records, in the store's order."""
        return self.ordered([r for r in self.records.values() if r.session_id == session])

    def fence(self, session: str, lease: Lease | None, now: datetime) -> Outcome | None:
        """The refusal of a fenced write to ``session`` (the lease is on it), or None."""
        if lease is None:
            return ("busy",) if self.leases.live(f"session:{session}", now) else None
        valid = self.leases.valid(lease.target, lease.owner, lease.epoch, now)
        return None if valid else ("lost",)

    def event(self, rec: RecordModel, edge: str) -> None:
        """Count one ``edge`` event of ``rec`` (at its attempt and lease epoch)."""
        epoch = -1 if rec.lease_epoch is None else rec.lease_epoch
        self.events[(rec.key, rec.attempt, edge, epoch)] += 1

    # -- the calls a step makes ----------------------------------------------------

    def new_call(self, key: str, session: str, run_pick: str, side_effecting: bool) -> Call:
        """A first claim's call of ``key`` in ``session``: read-only (``ls``) or
        side-effecting (``rm``), in the run ``run_pick`` names (``"none"``: no
        run, turn :data:`FREE_TURN`; ``"latest"``: the session's latest run and
        its turn; ``"other"``: the other session's latest run; ``"wrong_turn"``:
        the latest run with :data:`FREE_TURN`); no run admitted yet: none."""
        other = other_session(session)
        run = self.latest(other if run_pick == "other" else session)
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

    def varied(self, rec: RecordModel, vary: str) -> Call:
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

    def turn(self, session: str, pick: str) -> str:
        """The turn ``pick`` names: ``"latest"``, the session's latest run's
        (if any); otherwise :data:`FREE_TURN`."""
        run = self.latest(session)
        return run.turn if pick == "latest" and run is not None else FREE_TURN

    # -- the area's operations: (expected outcome, what the model does on success) ---

    def claim(
        self, key: str, call: Call, lease: Lease | None, now: datetime
    ) -> tuple[Outcome, Callable[[], None] | None]:
        """``store.tools.claim(key, …call…, lease=lease)`` at ``now``: ``("ok", key,
        created, state, attempt)``; a claimed key's same call writes nothing, a
        different one conflicts on its first differing field."""
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
        """``store.tools.complete``: ``("ok", "completed", result, is_error)``; the
        stored result repeated writes nothing (and needs no fence)."""
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
        """``store.tools.interrupt``: ``("ok", keys)``, the running records of
        ``session`` (of ``turn``; ``None``: every turn) made interrupted."""
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
        """``store.tools.reclaim``: ``("ok", "running", attempt, run_id)`` in
        ``run_id`` (``None``: the record's own run); a terminal record, or a
        side-effecting one without a confirmed retry, is not reclaimable."""
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
        """``store.tools.abandon_interrupted``: ``("ok", n)``, the turn's
        :data:`UNCERTAIN` records made abandoned."""
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
