"""Every guard of the modelled lifecycles: which model finds a counterexample
with it removed, or why its removal changes nothing the invariants see.

``FOUND`` maps ``(lifecycle, edge, guard)`` to the model and bound that
exhibit the counterexample (stored under ``counterexamples/``);
``EQUIVALENT`` maps the others to the reason. The two together cover every
guard pair of ``LEASE``, ``RUN``, ``RECOVERY``, ``DELIVERY`` and
``LEDGER_WRITER`` (a test checks that).
"""

from __future__ import annotations

from typing import Any

from turnkeeper.spec.delivery import DELIVERY
from turnkeeper.spec.lease import LEASE
from turnkeeper.spec.ledger import LEDGER_WRITER
from turnkeeper.spec.lifecycle import Lifecycle
from turnkeeper.spec.recovery import RECOVERY
from turnkeeper.spec.run import RUN

LIFECYCLES: dict[str, Lifecycle] = {
    "lease": LEASE,
    "run": RUN,
    "recovery": RECOVERY,
    "delivery": DELIVERY,
    "ledger_writer": LEDGER_WRITER,
}
"""The modelled lifecycles, by name."""

KEYWORD = {
    "lease": "lifecycle",
    "run": "run",
    "recovery": "recovery",
    "delivery": "delivery",
    "ledger_writer": "ledger",
}
"""The keyword each model takes a lifecycle by (the leases model: ``lifecycle``)."""

MODEL_OF = {"lease": "leases", "delivery": "delivery", "ledger_writer": "ledger"}
"""The model whose CI bound explores a lifecycle's equivalent mutants (else ``runs``)."""

Pair = tuple[str, str, str]

_LEASES: dict[str, Any] = {"workers": ["A", "B"], "targets": ["s1"], "ticks": 4, "grants": 3}
_DELIVERY: dict[str, Any] = {"workers": ["O1", "O2"], "ticks": 3}
_RUNS: dict[str, Any] = {"actors": ["W1", "R1"], "sessions": ["s1"], "ticks": 3, "max_runs": 2}
_LEDGER: dict[str, Any] = {
    "workers": ["A", "B"],
    "sessions": ["s1"],
    "ticks": 2,
    "grants": 2,
    "length": 3,
    "gc": 0,
}

FOUND: dict[Pair, tuple[str, dict[str, Any]]] = {
    ("lease", "takeover", "expired"): ("leases", _LEASES),
    ("lease", "renew", "token_matches"): ("leases", _LEASES),
    ("lease", "renew", "expired"): ("leases", _LEASES),
    ("lease", "release", "token_matches"): ("leases", _LEASES),
    ("run", "admit", "no_active_run"): ("runs", _RUNS),
    ("run", "admit", "retry_allowed"): ("runs", {**_RUNS, "max_runs": 3}),
    ("run", "cancel_admitted", "cancel_requested"): ("runs", _RUNS),
    ("run", "cancel_running", "cancel_requested"): ("runs", _RUNS),
    ("run", "cancel_waiting", "cancel_requested"): ("runs", _RUNS),
    ("recovery", "retry", "due"): ("runs", _RUNS),
    ("recovery", "fail", "attempts_exhausted"): ("runs", _RUNS),
    ("delivery", "claim", "due"): ("delivery", _DELIVERY),
    ("delivery", "claim", "dependency_done"): ("delivery", _DELIVERY),
    ("delivery", "reclaim_claimed", "claim_expired"): ("delivery", _DELIVERY),
    ("delivery", "reclaim_in_progress", "claim_expired"): ("delivery", _DELIVERY),
    ("ledger_writer", "plant_fence", "lease_held"): ("ledger", _LEDGER),
    ("ledger_writer", "plant_fence", "tip_unmoved"): ("ledger", {**_LEDGER, "handles": 2}),
    ("ledger_writer", "append", "lease_held"): ("ledger", _LEDGER),
}

_TOKEN = (
    "the store issues an acquire's token from (target, owner, epoch, purpose), so "
    "token_matches, same_owner and same_purpose together say the caller is the row's "
    "owner with the row's purpose: with any one of the three removed the other two "
    "still say it (the models do not bind, the one step that reissues a token)"
)
_BIND = (
    "not modelled: bind_run needs an admitted run bound to the lease, which neither "
    "model takes (its fence is storage/ops/leases.fence, the renew edge's guards, "
    "whose removal the leases model finds)"
)

EQUIVALENT: dict[Pair, str] = {
    ("lease", "reacquire", "same_owner"): _TOKEN,
    ("lease", "reacquire", "same_purpose"): _TOKEN,
    ("lease", "reacquire", "token_matches"): _TOKEN,
    ("lease", "reacquire", "expired"): (
        "edge order: takeover comes before reacquire and fires on every expired held "
        "lease, so reacquire is never selected on one, with or without the guard"
    ),
    ("lease", "bind", "token_matches"): _BIND,
    ("lease", "bind", "expired"): _BIND,
    ("recovery", "supersede", "superseded"): (
        "a begin passes the lease fence first, so the caller holds the session's newest "
        "epoch and the record's epoch is never above it: without the guard, only the "
        "caller's own recovering record is begun again (an attempt counted twice: the cap "
        "then dead-letters one attempt early, safe), no other worker's"
    ),
    ("recovery", "dead_letter", "attempts_exhausted"): (
        "edge order: fail (unless attempts_exhausted) comes before dead_letter, so "
        "dead_letter is selected only when the attempts are exhausted, with or without the guard"
    ),
    ("ledger_writer", "opening_conflict", "lease_held"): (
        "both edges end the opening fenced and raise: without the guard a conflict "
        "with the lease lost is taken for a conflict, whose release of the grant the "
        "lease fence makes a no-op (taken over: the token no longer matches) or "
        "releases a lease already expired; with one handle a worker (the CI bound) "
        "only another epoch's fence moves the tip under an opening whose lease is "
        "lost (a takeover), so the state space is the same; with two, the same epoch "
        "can move it before its lease expires, and the mutant then releases the "
        "expired lease (a later acquire regrants where it would take over: epoch + 1 "
        "either way)"
    ),
    ("ledger_writer", "opening_conflict", "tip_unmoved"): (
        "edge order: plant_fence comes first and fires whenever the lease is held "
        "and the tip unmoved, so opening_conflict is selected only on a moved tip"
    ),
    ("ledger_writer", "opening_lost", "lease_held"): (
        "edge order: plant_fence and opening_conflict together fire whenever the "
        "lease is held, so opening_lost is selected only when it is not"
    ),
    ("ledger_writer", "overtaken", "lease_held"): (
        "edge order: append comes first and fires whenever the lease is held, so "
        "overtaken is selected only when it is not"
    ),
    ("recovery", "reclaim", "remote_ended"): (
        "not modelled: detach needs the run's remote run record (store.archives), which "
        "the runs model does not write, so no recovery is ever detached"
    ),
}
