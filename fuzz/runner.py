"""The ``turnkeeper fuzz`` loop: the machines round-robin, in small
Hypothesis batches, until the time is up.

Each batch is one ``run_state_machine_as_test`` of one machine (``examples``
examples of at most ``steps`` steps; no example database, no deadline). The
time is checked between batches, so a run overruns ``minutes`` by at most one
batch (a failing batch's shrinking included). A failing machine is reported
once, with the shrunk steps Hypothesis prints (the machines ``note()`` each
ambiguous step as the call that replays it) and its error, and is not run
again; the others go on.
"""

from __future__ import annotations

import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.configuration import set_hypothesis_home_dir, storage_directory
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from . import bindings, deletes, leases, ledger, outbox, runs, sessions, tools
from .base import FuzzMachine
from .opener import StoreOpener

MACHINES: dict[str, Callable[[StoreOpener], type[FuzzMachine]]] = {
    "leases": leases.machine,
    "runs": runs.machine,
    "outbox": outbox.machine,
    "bindings": bindings.machine,
    "tools": tools.machine,
    "sessions": sessions.machine,
    "ledger": ledger.machine,
    "deletes": deletes.machine,
}
"""Each machine ``turnkeeper fuzz`` runs (``--machine NAME``), by name."""

COVERS = {
    "leases": "leases (acquire, renew, release, expiry), fenced appends, thread records",
    "runs": "runs: admission, start, finish, cancel; recovery of orphans",
    "outbox": "the delivery outbox: claims, progress, results, requeues, crashed workers",
    "bindings": "channel bindings: bind, unbind, transfer, bound creates, rotations, tool "
    "selections, deletes under session leases; gateways racing on stale views",
    "tools": "tool-execution records: claims, results, interrupts, retry requests, reclaims, "
    "abandons under session leases",
    "sessions": "sessions and forks: appends under leaf races, batches, branches, compactions, "
    "titles, labels, turns, forks by request id; two workers' store objects (PostgreSQL)",
    "ledger": "the ledger: fenced writers, takeovers, redeliveries, blob offload, crashes "
    "mid-offload, GC (its lease lapsing mid-delete); damage injection is the test suite's",
    "deletes": "deletes and retention passes among every other writer; the audit after each",
}
"""What each machine races, for the report."""


@dataclass
class Failure:
    """A machine's failure: ``steps``, the shrunk example as Hypothesis prints
    it (a replayable script, with the machine's notes), and ``error``, the
    exception's type and message (``traceback``: the whole of it)."""

    steps: str
    error: str
    traceback: str


@dataclass
class MachineResult:
    """What one machine ran: ``batches``, ``examples`` (stores opened),
    ``steps`` (rules completed), ``invariants`` (invariant checks) and its
    ``failure``, if any."""

    name: str
    batches: int = 0
    examples: int = 0
    steps: int = 0
    invariants: int = 0
    failure: Failure | None = None


@dataclass
class FuzzResult:
    """A run: each machine's result (in ``--machine`` order), the seconds it
    took, and whether it was cut short (an interrupt)."""

    machines: list[MachineResult] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def failed(self) -> bool:
        """Whether any machine failed."""
        return any(m.failure is not None for m in self.machines)


def batch_settings(examples: int, steps: int, seed: int | None) -> settings:
    """A batch's Hypothesis settings: ``examples`` examples of at most
    ``steps`` steps each; no example database and no deadline; random unless
    ``seed`` is given (then the batch's seed is set, see :func:`run`)."""
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        database=None,
        deadline=None,
        derandomize=False,
        report_multiple_bugs=False,
        print_blob=False,
        verbosity=Verbosity.normal,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )


def run(
    opener: StoreOpener,
    names: list[str],
    *,
    minutes: float,
    examples: int = 10,
    steps: int = 30,
    seed: int | None = None,
    progress: Callable[[FuzzResult, float], None] | None = None,
) -> FuzzResult:
    """Run the machines ``names`` (keys of :data:`MACHINES`) round-robin on
    stores from ``opener`` until ``minutes`` (min) have passed, checked between
    batches: every machine runs at least one batch. ``examples`` per batch and
    ``steps`` per example bound a batch. ``seed`` makes the run repeatable
    (batch ``i`` of a machine uses seed ``seed + i``). ``progress(result,
    elapsed_s)`` is called after each batch.

    Returns the :class:`FuzzResult`; a ``KeyboardInterrupt`` ends the run
    early with ``interrupted`` set (nothing re-raised). A machine's failure
    is in its result; other errors (``opener`` failing outside a batch)
    propagate.
    """
    classes = {name: MACHINES[name](opener) for name in names}
    result = FuzzResult([MachineResult(name) for name in names])
    started = time.monotonic()
    # Hypothesis's own files (a constants cache) go in a folder of the run's,
    # not in a ``.hypothesis`` left in the user's current folder.
    home = storage_directory(intent_to_write=False).home_directory
    own = tempfile.TemporaryDirectory(prefix="turnkeeper-fuzz-hypothesis-")
    set_hypothesis_home_dir(own.name)
    try:
        while True:
            live = [m for m in result.machines if m.failure is None]
            if not live:
                break
            for machine in live:
                cls = classes[machine.name]
                if seed is not None:
                    hypothesis_seed(seed + machine.batches)(cls)
                machine.batches += 1
                machine.failure = _batch(cls, batch_settings(examples, steps, seed))
                tally = cls.tally
                machine.examples, machine.steps = tally.examples, tally.steps
                machine.invariants = tally.invariants
                if progress is not None:
                    progress(result, time.monotonic() - started)
            if time.monotonic() - started >= minutes * 60:
                break
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        set_hypothesis_home_dir(home)
        own.cleanup()
    result.seconds = time.monotonic() - started
    return result


def _batch(cls: type[FuzzMachine], batch: settings) -> Failure | None:
    """One batch of ``cls``; its failure (what Hypothesis reported and noted
    on the error: the shrunk steps and the machine's notes; and the error),
    or ``None``."""
    printed: list[str] = []
    with with_reporter(lambda value: printed.append(str(value))):
        try:
            run_state_machine_as_test(cls, settings=batch)
        except Exception as exc:  # an assertion, a store error, a Hypothesis error
            return Failure(
                steps="\n".join([*printed, *getattr(exc, "__notes__", ())]).strip(),
                error=f"{type(exc).__name__}: {exc}".strip(),
                traceback="".join(traceback.format_exception(exc)),
            )
    return None
