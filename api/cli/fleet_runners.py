"""Where the demo's workers and services run: threads of this process (DuckDB,
whose file one process writes), or processes (PostgreSQL, a store for many).

Both runners start the same :class:`~.fleet.Worker` and service objects with
the same configuration; a process opens its own store on the URL, says it is
ready, waits for the fleet to begin (:meth:`go`: the fleet's clock starts
when every unit is ready, not when it was spawned), runs its one unit until
``stop``, and sends back its counters and the statements its store ran. The
demo's figures and audit are the same either way.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from turnkeeper.storage import BaseStore

from .fleet import FleetConfig, Worker, WorkerStats
from .fleet_services import OutboxWorker, RecoveryCoordinator, Service, ServiceStats

RECOVERY_WORKERS = 2
"""Recovery coordinators, each sweeping its own share of the sessions."""

OUTBOX_WORKERS = 2
"""Outbox workers delivering the runs' replies."""

JOIN_S = 120.0
"""Seconds a runner waits for a unit to end after it was told to stop."""

READY_S = 600.0
"""Seconds a runner waits for its units to be ready (a hang guard: a spawned
process imports and connects first, which takes seconds on a loaded machine)."""

READY_TICK_S = 0.1
"""Seconds between looks at whether a unit died while the others get ready."""

LIVE_FIELDS = (
    "iterations",
    "turns_committed",
    "stale_appends_fenced",
    "stale_finalizes_fenced",
    "stale_finishes_fenced",
    "stale_ledger_appends_fenced",
    "busy_refusals",
)
"""The worker counters a process fleet publishes while it runs (progress, and
the parent's decision that the fleet did its ``min_turns``)."""

Statements = dict[str, dict[str, float]]
"""Per operation ``{"calls", "statements", "statements_per_call", "retries"}``."""


def stats_delta(before: Statements, after: Statements) -> Statements:
    """Per operation, what happened between two ``statement_stats()`` snapshots.

    Returns ``{op: {"calls", "statements", "statements_per_call", "retries"}}``
    for operations called in between.
    """
    out: Statements = {}
    for op, a in after.items():
        b = before.get(op, {"calls": 0, "statements_per_call": 0.0, "retries": 0})
        calls = int(a["calls"] - b["calls"])
        if calls <= 0:
            continue
        statements = round(
            a["calls"] * a["statements_per_call"] - b["calls"] * b["statements_per_call"]
        )
        out[op] = {
            "calls": calls,
            "statements": statements,
            "statements_per_call": round(statements / calls, 3),
            "retries": int(a["retries"] - b["retries"]),
        }
    return out


def merge_statements(parts: list[Statements]) -> Statements:
    """The sum of several stores' :func:`stats_delta` (one per process): calls,
    statements and retries added, statements per call recomputed."""
    out: Statements = {}
    for part in parts:
        for op, d in part.items():
            total = out.setdefault(op, {"calls": 0, "statements": 0, "retries": 0})
            for key in ("calls", "statements", "retries"):
                total[key] += int(d[key])
    for d in out.values():
        d["statements_per_call"] = round(d["statements"] / d["calls"], 3)
    return out


class Flag(Protocol):
    """What the units use as their stop signal (a thread or process event)."""

    def is_set(self) -> bool: ...
    def set(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


SERVICES = [f"recovery-{i}" for i in range(RECOVERY_WORKERS)] + [
    f"outbox-{i}" for i in range(OUTBOX_WORKERS)
]
"""The demo's services, by name."""


def make_service(name: str, store: BaseStore, stop: Any, cfg: FleetConfig) -> Service:
    """The service ``name`` (one of :data:`SERVICES`) on ``store``, stopped by ``stop``."""
    kind, _, number = name.partition("-")
    i = int(number)
    if kind == "recovery":
        return RecoveryCoordinator(store, stop, ServiceStats(), cfg.ttl_s, (i, RECOVERY_WORKERS))
    return OutboxWorker(store, stop, ServiceStats(), i, cfg.seed, cfg.ttl_s)


class UnitThreads:
    """Daemon threads, each running one body, whose end is known by an event
    each body sets as it returns (or raises), not by ``Thread.join`` or
    ``is_alive``: on CPython before 3.13 a ``join`` that Ctrl-C interrupts
    marks the thread it waited for as stopped (bpo-45274's handling), after
    which ``join`` returns at once and ``is_alive`` says ``False`` while the
    thread still runs; the demo then closed its store under a running worker."""

    def __init__(self, bodies: list[tuple[str, Callable[[], None]]]) -> None:
        self._done = [threading.Event() for _ in bodies]
        self._threads = [
            threading.Thread(target=self._ending(body, done), name=name, daemon=True)
            for (name, body), done in zip(bodies, self._done, strict=True)
        ]

    @staticmethod
    def _ending(body: Callable[[], None], done: threading.Event) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            finally:
                done.set()

        return run

    @property
    def count(self) -> int:
        return len(self._threads)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _running(self) -> list[threading.Event]:
        """The end events of the threads started (``start()`` can be cut short)."""
        return [d for t, d in zip(self._threads, self._done, strict=True) if t.ident is not None]

    def alive(self) -> bool:
        """Whether a started thread has not ended."""
        return any(not d.is_set() for d in self._running())

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for each started thread to end."""
        for done in self._running():
            done.wait(timeout_s)


class ThreadFleet:
    """The fleet as threads sharing ``store`` (whose statement counts are the
    parent's: :meth:`finish` returns no separate ones)."""

    def __init__(
        self, store: BaseStore, cfg: FleetConfig, sessions: list[str], run_id: str
    ) -> None:
        self.stop = threading.Event()
        self.service_stop = threading.Event()
        self._go = threading.Event()
        self._ready = threading.Semaphore(0)
        self.workers = [
            Worker(store, i, cfg, sessions, run_id, math.inf, self.stop) for i in range(cfg.workers)
        ]
        self.services = [make_service(n, store, self.service_stop, cfg) for n in SERVICES]
        self._worker_threads = UnitThreads(
            [(f"demo-worker-{i}", self._unit(w.run)) for i, w in enumerate(self.workers)]
        )
        self._service_threads = UnitThreads(
            [(f"demo-service-{i}", self._unit(s.run)) for i, s in enumerate(self.services)]
        )

    def _unit(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            self._ready.release()
            self._go.wait()
            body()

        return run

    def start(self) -> None:
        """Start every unit (each then waits for :meth:`go`)."""
        self._worker_threads.start()
        self._service_threads.start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until every unit is ready; ``False`` if one is not within ``timeout_s``."""
        give_up = time.monotonic() + timeout_s
        for _ in range(self._worker_threads.count + self._service_threads.count):
            if not self._ready.acquire(timeout=max(0.0, give_up - time.monotonic())):
                return False
        return True

    def go(self) -> None:
        """Let every ready unit begin."""
        self._go.set()

    def workers_alive(self) -> bool:
        return self._worker_threads.alive()

    def live_stats(self) -> list[WorkerStats]:
        """The workers' counters so far (threads share them)."""
        return [w.stats for w in self.workers]

    def join_workers(self, timeout_s: float) -> None:
        self._worker_threads.join(timeout_s)

    def finish(self) -> tuple[list[WorkerStats], list[ServiceStats], list[Statements]]:
        """Stop everything; every unit's counters (statements: none apart, the
        store is the caller's)."""
        self.stop.set()
        self.service_stop.set()
        self._go.set()
        self._worker_threads.join(JOIN_S)
        self._service_threads.join(JOIN_S)
        return [w.stats for w in self.workers], [s.stats for s in self.services], []


def exit_when_orphaned() -> None:
    """End this spawned process when its parent dies (a killed ``demo``): a
    service runs until told to stop, and nobody else would tell it. The process
    exits at once, as if killed (every write of the store is atomic, so nothing
    half-written stays): setting the shared ``stop`` event instead can hang for
    ever, since a multiprocessing Condition waits for every process that was
    waiting on it to wake, the dead parent included."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="demo-parent-watch", daemon=True).start()


def _publisher(live: Any, index: int) -> Callable[[WorkerStats], None]:
    """What worker ``index`` of a process fleet calls after each iteration: its
    :data:`LIVE_FIELDS` into its slots of the shared array ``live``."""
    base = index * len(LIVE_FIELDS)

    def publish(stats: WorkerStats) -> None:
        for j, name in enumerate(LIVE_FIELDS):
            live[base + j] = getattr(stats, name)

    return publish


def _run_unit(
    url: str,
    kind: str,
    index: int,
    cfg: FleetConfig,
    sessions: list[str],
    run_id: str,
    flags: tuple[Any, Any, Any, Any],
    results: Any,
) -> None:
    """A process's body: one worker or service on its own store (spawned); it
    stops when the parent process dies. ``flags`` is ``(ready, go, stop,
    live)``: the unit releases ``ready`` once its store is open, waits for
    ``go``, runs until ``stop``, and sends its counters and the delta of its
    store's statement counts. Ctrl-C reaches the whole process group: the
    parent answers it (one line, exit 130) and the units ignore it, ending
    through ``stop`` or the parent's death instead of with a traceback each."""
    import turnkeeper

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C pending since start() is dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    exit_when_orphaned()
    ready, go, stop, live = flags

    with turnkeeper.open_store(url) as store:
        ready.release()
        go.wait()
        before = store.statement_stats()
        if kind == "worker":
            publish = _publisher(live, index)
            worker = Worker(store, index, cfg, sessions, run_id, math.inf, stop, publish)
            worker.run()
            statements = stats_delta(before, store.statement_stats())
            results.put(("worker", index, worker.stats, statements))
            return
        service = make_service(kind, store, stop, cfg)
        service.run()
        statements = stats_delta(before, store.statement_stats())
        results.put(("service", index, service.stats, statements))


class ProcessFleet:
    """The fleet as processes, each with its own store on ``url``.

    The processes are spawned (not forked: a fork would copy the parent's
    pooled connections), so each starts a fresh interpreter: on a loaded
    machine that takes seconds, so the units wait for :meth:`go` once ready,
    and the parent stops them (``stop``) when the fleet's time is up.
    """

    def __init__(self, url: str, cfg: FleetConfig, sessions: list[str], run_id: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.service_stop = ctx.Event()
        self._go = ctx.Event()
        self._ready = ctx.Semaphore(0)
        self._live = ctx.RawArray("q", cfg.workers * len(LIVE_FIELDS))
        self._results = ctx.Queue()
        self._cfg = cfg
        args = (cfg, sessions, run_id)
        self._workers = [
            ctx.Process(
                target=_run_unit,
                args=(url, "worker", i, *args, self._flags(self.stop), self._results),
                name=f"demo-worker-{i}",
            )
            for i in range(cfg.workers)
        ]
        self._services = [
            ctx.Process(
                target=_run_unit,
                args=(url, kind, i, *args, self._flags(self.service_stop), self._results),
                name=f"demo-{kind}",
            )
            for i, kind in enumerate(SERVICES)
        ]

    def _flags(self, stop: Any) -> tuple[Any, Any, Any, Any]:
        return (self._ready, self._go, stop, self._live)

    def start(self) -> None:
        """Start every unit with Ctrl-C blocked from its first instruction (the
        signal mask is inherited across the spawn's fork and exec, so an
        interpreter still starting prints no traceback). A Ctrl-C meanwhile is
        held until every unit has started, then raised here (the parent
        answers Ctrl-C): blocked in this thread, and, should it land on
        another thread of this process (a process-directed signal may), only
        recorded by a handler, never raised between two starts or inside one
        (a unit whose arguments were cut off mid-write would die)."""
        caught: list[int] = []
        # (only the main thread sets handlers; an ignored Ctrl-C stays ignored)
        previous = signal.getsignal(signal.SIGINT)
        hold = threading.current_thread() is threading.main_thread() and (
            previous is not signal.SIG_IGN
        )
        if hold:
            signal.signal(signal.SIGINT, lambda n, _: caught.append(n))
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for p in [*self._workers, *self._services]:
                p.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            if hold:  # (None: a handler not set from Python; Python's own goes back)
                signal.signal(
                    signal.SIGINT, signal.default_int_handler if previous is None else previous
                )
        if caught:
            raise KeyboardInterrupt

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until every unit has opened its store; ``False`` as soon as one
        died first, or when they are not all ready within ``timeout_s``."""
        units = [*self._workers, *self._services]
        give_up = time.monotonic() + timeout_s
        for _ in units:
            while not self._ready.acquire(timeout=READY_TICK_S):
                if time.monotonic() >= give_up or any(p.exitcode is not None for p in units):
                    return False
        return True

    def go(self) -> None:
        """Let every ready unit begin."""
        self._go.set()

    def workers_alive(self) -> bool:
        return any(p.is_alive() for p in self._workers)

    def live_stats(self) -> list[WorkerStats]:
        """The workers' :data:`LIVE_FIELDS` so far (the rest come when they end)."""
        k, live = len(LIVE_FIELDS), list(self._live)
        out = []
        for i in range(len(self._workers)):
            stats = WorkerStats(i)
            for j, name in enumerate(LIVE_FIELDS):
                setattr(stats, name, int(live[i * k + j]))
            out.append(stats)
        return out

    def join_workers(self, timeout_s: float) -> None:
        for p in self._workers:
            p.join(timeout_s)

    def finish(self) -> tuple[list[WorkerStats], list[ServiceStats], list[Statements]]:
        """Stop everything and join every unit started; every unit's counters and
        statement counts (a unit that died or never started sends none: it is
        counted as an error)."""
        self.stop.set()
        self.service_stop.set()
        self._go.set()
        started = [p for p in [*self._workers, *self._services] if p.pid is not None]
        expected = len(started)
        workers: dict[int, WorkerStats] = {}
        services: list[ServiceStats] = []
        statements: list[Statements] = []
        give_up = time.monotonic() + JOIN_S
        while len(workers) + len(services) < expected and time.monotonic() < give_up:
            try:
                kind, index, stats, counted = self._results.get(timeout=1.0)
            except Exception:  # queue.Empty: see who is still alive
                if not any(p.is_alive() for p in started):
                    break
                continue
            statements.append(counted)
            if kind == "worker":
                workers[index] = stats
            else:
                services.append(stats)
        for p in started:
            p.join(JOIN_S)
        lost = ServiceStats()
        for p in [*self._workers, *self._services]:
            if p.pid is None:
                lost.errors.append(f"{p.name} never started")
            elif p.exitcode != 0:
                lost.errors.append(f"{p.name} exited with {p.exitcode}")
        if len(workers) < len(self._workers):
            lost.errors.append(f"{len(self._workers) - len(workers)} workers sent no counters")
        return [workers[i] for i in sorted(workers)], [*services, lost], statements
