"""The simulated fleet behind ``turnkeeper demo``: worker threads racing for sessions.

Every worker shares ONE store object. Each iteration it draws a
:class:`Plan` from its own ``random.Random(seed + index)`` (all random draws
of an iteration happen up front, so a seed fixes the sequence of plans no
matter how the races turn out), takes the lease ``session:<id>`` (purpose
``execution``) and then:

- ``turn``: admits a run under the lease (the user entry is written by the
  admission), starts it, sometimes calls a simulated tool (a tool-execution
  record claimed by execution key, the assistant ``toolCall``, the
  ``toolResult``, the record completed; ``bash`` and ``edit`` are
  side-effecting), finishes the run with the assistant reply and its delivery
  plan in one transaction, renews the lease, finalizes a thread record
  ``<session>-<epoch>`` for the key ``<session>`` (archiving the previous
  active record and rebinding the key) and releases;
- ``abandon``: the same turn, but the lease is never released, so a later
  acquirer takes it over once it expires;
- ``crash``: the worker dies mid-run (after starting it, or in the middle of
  a tool call) without releasing anything: the run is left to the recovery
  coordinator (:mod:`.fleet_services`) once the lease expires;
- ``stall``: admits and starts a run, sleeps past the TTL, then tries an
  append, the run's termination and a finalize with the old lease; all must
  be refused with ``LeaseLostError`` (a stale write that is accepted is an
  audit failure) and the run is left to recovery.

Each turn also goes to the session's ledger (``store.ledger``, see
:mod:`.fleet_ledger`): the worker opens the ledger's writer under its
session lease after the admission and appends ``session_started`` and
``turn_started``, a ``step_done`` per tool call, and the reply's
``step_done`` and ``turn_done``; a stalled worker's late ledger append must
be refused too.

Every message a worker writes starts with a unique marker ``[run.w.i.n]`` so
the audit can check that no write a worker saw refused was stored.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from turnkeeper.spec import LeasePurpose
from turnkeeper.spec.delivery import DeliveryPlan, DeliveryStep
from turnkeeper.spec.errors import (
    BusyError,
    LeaseLostError,
    SessionRecoveryRequiredError,
    SessionRunActiveError,
    TransactionConflictError,
)
from turnkeeper.spec.records import FinalizeRequest, Lease, Run, ThreadRecord
from turnkeeper.storage import BaseStore
from turnkeeper.storage.ops.ledger import LedgerWriter

from .common import one_line
from .fleet_ledger import TurnLedger

MODELS: tuple[tuple[str, str], ...] = (
    ("anthropic", "claude-sonnet-4-5"),
    ("openai", "gpt-5.1"),
    ("google", "gemini-2.5-pro"),
)
"""(provider, model) pairs the simulated assistants answer with."""

TOOLS = ("read", "bash", "grep", "edit")
SIDE_EFFECTING = frozenset({"bash", "edit"})
"""Simulated tools whose calls change the world (never re-run without confirmation)."""
PROMPTS = (
    "Why does the build fail on CI?",
    "Rename the config loader and update its callers.",
    "Summarize the open TODOs in storage/.",
    "Add a test for the lease takeover path.",
    "Explain the epoch check in finalize.",
)

CHOICES_KEPT = 16
"""How many chosen session ids per worker the result keeps (repeatability checks)."""

BUSY_BACKOFF_S = 0.002
"""Seconds a worker waits after a busy refusal before its next iteration."""

MAX_ATTEMPTS = 3
"""Attempts a demo request gets: an interrupted run is retried up to this many times."""

STALL_MARGIN_S = 0.15
"""Seconds a stalled worker sleeps beyond the lease TTL. The lease was granted
before the stall began, so any margin outlives it, however slow the machine."""

DEFAULT_TTL_S = 2.0
"""The fleet's default lease and claim TTL, in seconds. A worker renews its
session lease before it ends a run and again before it finalizes, and between
a turn's other steps once a third of the TTL has passed (``_heartbeat``); the
TTL has to cover the calls between two renewals on a loaded machine (at 0.5 s, a
machine with twice as many busy processes as cores lost a quarter of its turns
to expired leases and outbox claims); stalls still sleep past it."""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Knobs of the simulation; durations in seconds, probabilities per iteration."""

    workers: int = 8
    sessions: int = 20
    duration_s: float = 20.0
    seed: int = 0
    ttl_s: float = DEFAULT_TTL_S
    stall_p: float = 0.15
    abandon_p: float = 0.05
    crash_p: float = 0.06
    tool_p: float = 0.35
    model_change_p: float = 0.05
    min_turns: int = 1
    """Turns the fleet must commit: it runs past ``duration_s`` until it has (a
    fleet that committed none did nothing to audit, see ``turnkeeper demo``)."""


class Plan(NamedTuple):
    """One iteration's choices, drawn before anything touches the store."""

    session: int
    action: str  # "turn" | "abandon" | "crash" | "stall"
    tool: bool
    model: int
    model_change: bool


def plan_iteration(rng: random.Random, cfg: FleetConfig) -> Plan:
    """Draw the next plan (always the same five draws, whatever happens next)."""
    session = rng.randrange(cfg.sessions)
    r = rng.random()
    if r < cfg.stall_p:
        action = "stall"
    elif r < cfg.stall_p + cfg.abandon_p:
        action = "abandon"
    elif r < cfg.stall_p + cfg.abandon_p + cfg.crash_p:
        action = "crash"
    else:
        action = "turn"
    tool = rng.random() < cfg.tool_p
    model = rng.randrange(len(MODELS))
    model_change = rng.random() < cfg.model_change_p
    return Plan(session, action, tool, model, model_change)


def worker_rng(cfg: FleetConfig, index: int) -> random.Random:
    """Worker ``index``'s generator: ``random.Random(seed + index)``."""
    return random.Random(cfg.seed + index)


@dataclass
class WorkerStats:
    """What one worker saw; counters are only written by that worker's thread."""

    index: int
    iterations: int = 0
    turns_committed: int = 0
    entries_written: int = 0
    busy_refusals: int = 0
    stalls: int = 0
    abandoned: int = 0
    crashes: int = 0
    runs_admitted: int = 0
    retries: int = 0
    run_active_refusals: int = 0
    tool_calls: int = 0
    finalized: int = 0
    stale_appends_fenced: int = 0
    stale_finalizes_fenced: int = 0
    stale_finishes_fenced: int = 0
    stale_ledger_appends_fenced: int = 0
    stale_writes_accepted: int = 0
    ledger_records: int = 0
    lost_mid_turn: int = 0
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    refused_markers: list[str] = field(default_factory=list)
    refused_records: list[str] = field(default_factory=list)
    choices: list[str] = field(default_factory=list)


def _ms() -> int:
    return int(time.time() * 1000)


def _text(marker: str, text: str) -> dict[str, Any]:
    return {"type": "text", "text": f"[{marker}] {text}"}


class Worker:
    """One simulated agent runtime; :meth:`run` loops until the deadline or ``stop``.

    ``progress``, if given, is called with the worker's counters after each
    iteration (a process fleet publishes them to its parent)."""

    def __init__(
        self,
        store: BaseStore,
        index: int,
        cfg: FleetConfig,
        session_ids: list[str],
        run_id: str,
        deadline: float,
        stop: threading.Event,
        progress: Callable[[WorkerStats], None] | None = None,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.session_ids = session_ids
        self.run_id = run_id
        self.deadline = deadline
        self.stop = stop
        self.progress = progress
        self.owner = f"demo-worker-{index}"
        self.rng = worker_rng(cfg, index)
        self.stats = WorkerStats(index)
        self._finalized_ids: set[str] = set()
        self.ledger = TurnLedger(store)
        self._renewed_at = time.monotonic()  # when the held lease was granted or renewed

    def run(self) -> None:
        """Loop over iterations; never raises (errors are recorded in ``stats``)."""
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            plan = plan_iteration(self.rng, self.cfg)
            it = self.stats.iterations
            self.stats.iterations += 1
            sid = self.session_ids[plan.session]
            if len(self.stats.choices) < CHOICES_KEPT:
                self.stats.choices.append(sid)
            try:
                self._iteration(it, sid, plan)
            except TransactionConflictError:
                self.stats.conflicts += 1
            except Exception as exc:  # a bug or backend failure: recorded, shown, fails the run
                self.stats.errors.append(f"{type(exc).__name__}: {one_line(str(exc))}")
            self.stats.ledger_records = self.ledger.records
            if self.progress is not None:
                self.progress(self.stats)

    # -- one iteration ---------------------------------------------------------

    def _iteration(self, it: int, sid: str, plan: Plan) -> None:
        if self.store.runs.active(sid) is not None:  # an orphan awaits recovery: leave it be
            self.stats.run_active_refusals += 1
            self.stop.wait(BUSY_BACKOFF_S)
            return
        try:
            lease = self.store.leases.acquire(
                f"session:{sid}", self.owner, self.cfg.ttl_s, purpose=LeasePurpose.EXECUTION
            )
        except BusyError:
            self.stats.busy_refusals += 1
            self.stop.wait(BUSY_BACKOFF_S)
            return
        except SessionRecoveryRequiredError:  # orphaned since the check above
            self.stats.run_active_refusals += 1
            self.stop.wait(BUSY_BACKOFF_S)
            return
        self._renewed_at = time.monotonic()
        try:
            run = self._admit(it, sid, lease)
        except SessionRunActiveError:  # an orphan recovery has not converged yet
            self.stats.run_active_refusals += 1
            self.store.leases.release(lease)
            self.stop.wait(BUSY_BACKOFF_S)
            return
        except LeaseLostError:
            self.stats.lost_mid_turn += 1
            return
        try:
            lease = self._heartbeat(lease)
            writer = self.ledger.start(sid, lease, run, PROMPTS[it % len(PROMPTS)])
        except LeaseLostError:
            self.stats.lost_mid_turn += 1
            return
        if plan.action == "stall":
            self._stall(it, sid, lease, run, writer)
            return
        try:
            leaf = self._run_turn(it, sid, lease, plan, run, writer)
            if leaf is None:
                self.stats.crashes += 1
                return  # died mid-run: nothing released, recovery converges the run
            self.stats.turns_committed += 1
            lease = self._heartbeat(lease, now=True)
            self._finalize(sid, lease, leaf)
        except LeaseLostError:
            self.stats.lost_mid_turn += 1
            return
        if plan.action == "abandon":
            self.stats.abandoned += 1
            return
        self.store.leases.release(lease)

    def _heartbeat(self, lease: Lease, *, now: bool = False) -> Lease:
        """``lease`` renewed (for ``cfg.ttl_s`` more seconds) once a third of its
        TTL has passed since it was granted or last renewed here (``now``:
        always), else as it is: a heartbeat between a turn's steps, so a turn
        that a loaded machine slows keeps its lease (a real runtime heartbeats
        the same way).

        Raises:
            LeaseLostError: the lease had already expired or was taken over.
        """
        if not now and time.monotonic() - self._renewed_at < self.cfg.ttl_s / 3:
            return lease
        lease = self.store.leases.renew(lease, self.cfg.ttl_s)
        self._renewed_at = time.monotonic()
        return lease

    def _marker(self, it: int, n: int) -> str:
        return f"{self.run_id}.{self.stats.index}.{it}.{n}"

    def _admit(self, it: int, sid: str, lease: Lease) -> Run:
        """Admit and start a run under ``lease``: a retry (attempt + 1 of the same
        intent) when the session's latest run was interrupted and has attempts
        left, else a new request. A refusal records the user marker."""
        runs = self.store.runs.list(sid)
        last = runs[-1] if runs else None
        retry_of = None
        if last is not None and last.status == "interrupted" and last.attempt < MAX_ATTEMPTS:
            retry_of = last.id
        m = self._marker(it, 0)
        user = {
            "role": "user",
            "content": [_text(m, PROMPTS[it % len(PROMPTS)])],
            "timestamp": _ms(),
        }
        try:
            run = self.store.runs.admit(
                sid,
                {"prompt": PROMPTS[it % len(PROMPTS)], "marker": m},
                submission_key=m,
                user_message=user,
                lease=lease,
                retry_of=retry_of,
                source="demo",
            )
        except LeaseLostError:
            self.stats.refused_markers.append(m)
            raise
        self.stats.runs_admitted += 1
        self.stats.retries += retry_of is not None
        self.stats.entries_written += 2  # turn start + user
        self.store.runs.start(run.id, lease=lease)
        return run

    def _append(self, sid: str, lease: Lease, marker: str, message: dict[str, Any]) -> str:
        """Append one message entry under ``lease``; a refusal records ``marker``."""
        try:
            entry = self.store.sessions.append(sid, "message", {"message": message}, lease=lease)
        except LeaseLostError:
            self.stats.refused_markers.append(marker)
            raise
        self.stats.entries_written += 1
        return entry.id

    def _run_turn(
        self, it: int, sid: str, lease: Lease, plan: Plan, run: Run, writer: LedgerWriter
    ) -> str | None:
        """Tool call (if planned) and termination, each step also in the ledger
        through ``writer``; returns the turn-end entry id, or ``None`` when the
        plan is a crash (the worker stops mid-run)."""
        provider, model = MODELS[plan.model]
        if plan.model_change:
            self.store.sessions.append(
                sid, "model_change", {"provider": provider, "modelId": model}, lease=lease
            )
            self.stats.entries_written += 1
        usage = {"input": 420 + it % 97, "output": 60 + it % 41, "cacheRead": 0, "cacheWrite": 0}
        assistant = {"api": "demo", "provider": provider, "model": model, "usage": usage}
        crash_in_tool = plan.action == "crash" and plan.tool
        if plan.tool:
            lease = self._heartbeat(lease)
            self._tool_call(it, sid, lease, run, assistant, crash_in_tool)
            if crash_in_tool:
                return None
            lease = self._heartbeat(lease)
            self.ledger.step(writer, run, f"{TOOLS[it % len(TOOLS)]}: ok", usage)
        if plan.action == "crash":
            return None
        lease = self._heartbeat(lease, now=True)  # the heartbeat before the end
        m = self._marker(it, 3)
        reply = {
            "role": "assistant",
            "content": [_text(m, "Done.")],
            **assistant,
            "stopReason": "stop",
            "timestamp": _ms(),
        }
        try:
            self.store.runs.finish(
                run.id,
                "succeeded",
                assistant_message=reply,
                lease=lease,
                delivery_plan=reply_plan(sid, run, m, with_attachment=plan.tool),
            )
        except LeaseLostError:
            self.stats.refused_markers.append(m)
            raise
        self.stats.entries_written += 2  # assistant + turn end
        self.ledger.done(writer, run, "Done.", usage)
        return f"{run.id}:turn-end"

    def _tool_call(
        self,
        it: int,
        sid: str,
        lease: Lease,
        run: Run,
        assistant: dict[str, Any],
        crash: bool,
    ) -> None:
        """Claim the call's record, write the call, (unless crashing) its result,
        and complete the record. The result entry precedes the completion, so a
        completed record always has its result in the transcript."""
        tool = TOOLS[it % len(TOOLS)]
        call_id = f"call_{self.run_id}_{self.stats.index}_{it}"
        args = {"path": "."}
        self.store.tools.claim(
            f"{run.id}:{call_id}",
            sid,
            local_turn_id=run.turn_id,
            provider_call_id=call_id,
            tool_name=tool,
            side_effecting=tool in SIDE_EFFECTING,
            arguments=args,
            run_id=run.id,
            lease=lease,
        )
        self.stats.tool_calls += 1
        m = self._marker(it, 1)
        call = {"type": "toolCall", "id": call_id, "name": tool, "arguments": args}
        self._append(
            sid,
            lease,
            m,
            {
                "role": "assistant",
                "content": [_text(m, "Let me look."), call],
                **assistant,
                "stopReason": "toolUse",
                "timestamp": _ms(),
            },
        )
        if crash:
            return  # the process dies while the tool runs: recovery interrupts the record
        m = self._marker(it, 2)
        output = f"{tool}: ok"
        self._append(
            sid,
            lease,
            m,
            {
                "role": "toolResult",
                "toolCallId": call_id,
                "toolName": tool,
                "content": [_text(m, output)],
                "isError": False,
                "timestamp": _ms(),
            },
        )
        self.store.tools.complete(f"{run.id}:{call_id}", {"text": output}, lease=lease)

    def _finalize(self, sid: str, lease: Lease, leaf: str) -> None:
        """Save ``<sid>-<epoch>`` as the key's active record (archiving the previous)."""
        previous = self.store.threads.resolve(key=sid)
        rec_id = f"{sid}-{lease.epoch}"
        archive = previous is not None and previous.id != rec_id
        record = ThreadRecord(
            id=rec_id,
            key=sid,
            driver_type="demo",
            agent={"owner": self.owner},
            session_codec="pi-jsonl-v3",
            state={"leaf": leaf, "epoch": lease.epoch},
        )
        request = FinalizeRequest(
            record=record,
            previous_id=previous.id if archive and previous is not None else None,
            archive_old=archive,
            rebind_active=True,
            held_leases=(lease,),
        )
        try:
            self.store.threads.finalize(request)
        except LeaseLostError:
            if rec_id not in self._finalized_ids:
                self.stats.refused_records.append(rec_id)
            raise
        self._finalized_ids.add(rec_id)
        self.stats.finalized += 1

    def _stall(self, it: int, sid: str, lease: Lease, run: Run, writer: LedgerWriter) -> None:
        """Stall past the TTL mid-run, then try to write, append to the ledger,
        end the run and finalize with the old lease: all four must be refused. ``stalls`` counts the
        stalls that got that far (the fleet's end cuts a stall short)."""
        if self.stop.wait(self.cfg.ttl_s + STALL_MARGIN_S):
            return  # interrupted: the lease may still be live, so test nothing
        self.stats.stalls += 1
        m = self._marker(it, 1)
        stale = {"role": "assistant", "content": [_text(m, "late")], "timestamp": _ms()}
        try:
            self.store.sessions.append(sid, "message", {"message": stale}, lease=lease)
        except LeaseLostError:
            self.stats.stale_appends_fenced += 1
            self.stats.refused_markers.append(m)
        else:
            self.stats.stale_writes_accepted += 1
        try:
            self.ledger.stale(writer, run)
        except LeaseLostError:
            self.stats.stale_ledger_appends_fenced += 1
        else:
            self.stats.stale_writes_accepted += 1
        m = self._marker(it, 3)
        reply = {"role": "assistant", "content": [_text(m, "late reply")], "timestamp": _ms()}
        try:
            self.store.runs.finish(run.id, "succeeded", assistant_message=reply, lease=lease)
        except LeaseLostError:
            self.stats.stale_finishes_fenced += 1
            self.stats.refused_markers.append(m)
        else:
            self.stats.stale_writes_accepted += 1
        rec_id = f"{sid}-{lease.epoch}-stale-{self.stats.index}.{it}"
        request = FinalizeRequest(
            record=ThreadRecord(id=rec_id, key=sid, driver_type="demo"),
            rebind_active=True,
            held_leases=(lease,),
        )
        try:
            self.store.threads.finalize(request)
        except LeaseLostError:
            self.stats.stale_finalizes_fenced += 1
            self.stats.refused_records.append(rec_id)
        else:
            self.stats.stale_writes_accepted += 1


def reply_plan(sid: str, run: Run, marker: str, *, with_attachment: bool) -> DeliveryPlan:
    """The outbox plan for a run's reply: an optional attachment upload, then the
    message (sent only after the upload is delivered), which names the reply's
    entry (``run.assistant_entry_id``, written by the same ``runs.finish``)."""
    reply = run.assistant_entry_id
    steps = [DeliveryStep("send", "message", payload_digest=marker, entry_id=reply)]
    if with_attachment:
        upload = DeliveryStep("upload", "attachment", artifact_id=f"{marker}-log")
        steps = [
            upload,
            DeliveryStep(
                "send", "message", depends_on="upload", payload_digest=marker, entry_id=reply
            ),
        ]
    return DeliveryPlan(
        platform="demo-chat",
        target_id=f"room-{sid}",
        steps=tuple(steps),
        reply_message_id=run.id,
        transport_context={"thread": sid},
    )
