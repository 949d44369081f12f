"""The run lifecycle (session seed SessionRun; DESIGN machine 2).

A run is one agent execution of an accepted request (an execution intent).
It is ``admitted``, then ``running`` (and ``waiting`` while it waits for
input), then ends in exactly one terminal status. A retry is a new run of
the same intent with attempt + 1, admitted only from the intent's latest
attempt once that attempt is terminal. At most one non-terminal run per
session: the ``active_runs`` table has the session as its primary key.

Facts the guards read in the transaction that writes:

- ``no_active_run``: the session has no non-terminal run;
- ``retry_allowed``: a first attempt, or a retry of the intent's latest
  attempt which is terminal;
- ``cancel_requested``: a cancel was recorded on the run.
"""

from __future__ import annotations

from enum import StrEnum

from .lifecycle import Edge, Lifecycle, fact


class RunStatus(StrEnum):
    """Run statuses (session seed NonTerminal/TerminalSessionRunStatuses)."""

    ADMITTED = "admitted"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    ABANDONED = "abandoned"


class ActiveRunPolicy(StrEnum):
    """What ``runs.admit`` does when the session already has a non-terminal run
    (beyond the seed; the choice durable-execution engines name: Temporal's
    workflow-id conflict policy FAIL / USE_EXISTING / TERMINATE_EXISTING,
    Inngest's singleton mode skip / cancel).

    Each is decided inside the admission's transaction, after its fence: a
    session another worker holds is refused with ``BusyError`` (no lease
    given) or ``LeaseLostError`` (a stale one) whatever the policy, so a run
    whose worker holds a live lease is never returned to or replaced by
    another caller.
    """

    REFUSE = "refuse"
    """``SessionRunActiveError`` naming the active run (the default; Temporal FAIL)."""
    USE_EXISTING = "use_existing"
    """Return the active run as stored and write nothing (with a submission key,
    only the key's row, naming that run); Temporal USE_EXISTING, Inngest skip."""
    CANCEL_EXISTING = "cancel_existing"
    """In the same transaction, record a cancel request on the active run, end it
    ``cancelled`` (stop reason ``replaced``: its open tool calls closed and its
    turn ended, as ``runs.finish`` does) and admit the new run (Temporal
    TERMINATE_EXISTING, Inngest cancel). Only a caller past the fence gets
    here: it holds the session's lease (the active run is its own or an
    orphan's) or nobody does. A worker still executing the replaced run
    learns it at its next write of it (``InvalidTransitionError``: terminal)."""


NON_TERMINAL = frozenset({RunStatus.ADMITTED, RunStatus.RUNNING, RunStatus.WAITING})
"""Statuses that keep a session busy."""

TERMINAL = frozenset(RunStatus) - NON_TERMINAL
"""Statuses a run ends in; a terminal run is never revived."""

TURN_OPEN = "open"
"""The status of a conversation turn that has not ended."""

TURN_END_STATUSES = frozenset({*(s.value for s in TERMINAL), "incomplete"})
"""The statuses a conversation turn ends in (session seed EndConversationTurn:
failed, cancelled and incomplete outcomes are terminal turn states too): a
run's terminal statuses, which ``runs.finish`` gives the turn it closes, and
``incomplete``. Only ``succeeded`` makes a turn a fork boundary."""

_LIVE = ("admitted", "running", "waiting")

RUN = Lifecycle(
    name="run",
    states=("absent", *(s.value for s in RunStatus)),
    initial="absent",
    edges=(
        Edge("admit", "admit", "absent", "admitted", guards=("no_active_run", "retry_allowed")),
        Edge("start", "start", "admitted", "running"),
        Edge("wait", "wait", "running", "waiting"),
        Edge("resume", "resume", "waiting", "running"),
        Edge("succeed", "succeed", "running", "succeeded"),
        *(Edge(f"fail_{s}", "fail", s, "failed") for s in _LIVE),
        *(
            Edge(f"cancel_{s}", "cancel", s, "cancelled", guards=("cancel_requested",))
            for s in _LIVE
        ),
        *(Edge(f"interrupt_{s}", "interrupt", s, "interrupted") for s in _LIVE),
        *(Edge(f"abandon_{s}", "abandon", s, "abandoned") for s in _LIVE),
    ),
    guards={
        "no_active_run": (fact("no_active_run"), "the session has no non-terminal run"),
        "retry_allowed": (
            fact("retry_allowed"),
            "a first attempt, or a retry of the intent's latest attempt, which is terminal",
        ),
        "cancel_requested": (fact("cancel_requested"), "a cancel was recorded on the run"),
    },
    invariants=(
        "at most one non-terminal run per session",
        "a terminal run is never revived",
        "attempts of an intent are 1, 2, 3 … and a retry follows only a terminal latest attempt",
        "every transition appends a run event with the session's next sequence number",
    ),
)

FINISH_TRIGGERS = {
    RunStatus.SUCCEEDED: "succeed",
    RunStatus.FAILED: "fail",
    RunStatus.CANCELLED: "cancel",
    RunStatus.INTERRUPTED: "interrupt",
    RunStatus.ABANDONED: "abandon",
}
"""The trigger that ends a run in each terminal status."""
