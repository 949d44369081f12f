"""The recovery lifecycle (session seed SessionRunRecovery; DESIGN machine 3).

Per orphaned run (non-terminal, no live lease on its session by the store's
clock). Taken only under a ``recovery``-purpose lease on the session;
``recovering``, then ``completed`` (converged), ``failed`` (retried later
with backoff), ``dead_lettered`` after a capped number of attempts, or
``detached`` (a remote execution still owns it: detaching needs the run's
remote run record, ``store.archives``, to show a live provider execution). The
marker is not the evidence (session seed MarkSessionRunRecoveryDetached): the
response record is, so a detached run whose remote run has ended (or whose
record is gone) is an orphan again, and its recovery begins anew
(``reclaim``). The recovery record never grants ownership: the recovery
lease is the only authority, revalidated in every transaction that writes.

Facts the guards read:

- ``due``: a failed recovery's next retry time has come;
- ``superseded``: the record's recovery lease epoch is older than the caller's
  (the previous recovery worker died or lost its lease);
- ``attempts_exhausted``: this failure reaches the attempt cap;
- ``remote_ended``: the detached run's newest remote run record has reached a
  terminal state, lacks its response id or provider, or is gone.
"""

from __future__ import annotations

from enum import StrEnum

from .lifecycle import Edge, Lifecycle, fact


class RecoveryState(StrEnum):
    """Recovery record states (session seed SessionRunRecoveryState)."""

    RECOVERING = "recovering"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    DETACHED = "detached"


RECOVERY = Lifecycle(
    name="recovery",
    states=("absent", *(s.value for s in RecoveryState)),
    initial="absent",
    edges=(
        Edge("begin", "begin", "absent", "recovering"),
        Edge("retry", "begin", "failed", "recovering", guards=("due",)),
        Edge("supersede", "begin", "recovering", "recovering", guards=("superseded",)),
        Edge("converge", "converge", "recovering", "completed"),
        Edge("fail", "fail", "recovering", "failed", unless=("attempts_exhausted",)),
        Edge("dead_letter", "fail", "recovering", "dead_lettered", guards=("attempts_exhausted",)),
        Edge("detach", "detach", "recovering", "detached"),
        Edge("reclaim", "begin", "detached", "recovering", guards=("remote_ended",)),
    ),
    guards={
        "due": (fact("due"), "the failed recovery's next retry time has come"),
        "superseded": (
            fact("superseded"),
            "the record's recovery lease epoch is older than the caller's",
        ),
        "attempts_exhausted": (fact("attempts_exhausted"), "this failure reaches the cap"),
        "remote_ended": (
            fact("remote_ended"),
            "no remote run record keeps the detached run recoverable any more",
        ),
    },
    invariants=(
        "only a live recovery-purpose lease on the run's session writes a recovery",
        "convergence closes open turns, ends the run and completes the record atomically",
        "terminal and cancel-requested runs are never revived",
        "a stale recovery worker can never commit after another owner takes over",
    ),
)


def retry_delay_s(attempt: int, base_s: float, max_s: float, jitter: float) -> float:
    """Seconds until recovery attempt ``attempt`` + 1: exponential backoff with jitter.

    ``base_s * 2 ** (attempt - 1)``, capped at ``max_s``, stretched by
    ``jitter`` (a fraction in [0, 1], drawn by the caller) of up to 10 %.

    pre: attempt >= 1
    pre: 0 < base_s <= max_s
    pre: 0 <= jitter <= 1
    post: base_s <= __return__ <= max_s * 1.1
    post: attempt > 1 or __return__ <= base_s * 1.1
    """
    delay = min(max_s, base_s * 2.0 ** min(attempt - 1, 62))
    return delay * (1.0 + 0.1 * jitter)
