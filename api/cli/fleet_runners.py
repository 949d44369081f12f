"""Where the demo's workers and services run: threads of this process (DuckDB,
whose file one process writes), or processes (PostgreSQL, a store for many).

Both runners start the same :class:`~.fleet.Worker` and service objects with
the same configuration; a process opens its own store on the URL, runs its
one unit until the deadline or ``stop``, and sends its counters back. The
demo's figures and audit are the same either way.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
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


class ThreadFleet:
    """The fleet as threads sharing ``store``."""

    def __init__(
        self, store: BaseStore, cfg: FleetConfig, sessions: list[str], run_id: str, deadline: float
    ) -> None:
        self.stop = threading.Event()
        self.service_stop = threading.Event()
        self.workers = [
            Worker(store, i, cfg, sessions, run_id, deadline, self.stop) for i in range(cfg.workers)
        ]
        self.services = [make_service(n, store, self.service_stop, cfg) for n in SERVICES]
        self._worker_threads = [
            threading.Thread(target=w.run, name=f"demo-worker-{i}", daemon=True)
            for i, w in enumerate(self.workers)
        ]
        self._service_threads = [
            threading.Thread(target=s.run, name=f"demo-service-{i}", daemon=True)
            for i, s in enumerate(self.services)
        ]

    def start(self) -> None:
        for t in [*self._worker_threads, *self._service_threads]:
            t.start()

    def workers_alive(self) -> bool:
        return any(t.is_alive() for t in self._worker_threads)

    def live_stats(self) -> list[WorkerStats]:
        """The workers' counters so far (threads share them)."""
        return [w.stats for w in self.workers]

    def join_workers(self, timeout_s: float) -> None:
        for t in self._worker_threads:
            t.join(timeout_s)

    def finish(self) -> tuple[list[WorkerStats], list[ServiceStats]]:
        """Stop everything; every unit's counters."""
        self.stop.set()
        self.service_stop.set()
        for t in [*self._worker_threads, *self._service_threads]:
            if t.ident is not None:  # started (start() can be cut short)
                t.join(JOIN_S)
        return [w.stats for w in self.workers], [s.stats for s in self.services]


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


def _run_unit(
    url: str,
    kind: str,
    index: int,
    cfg: FleetConfig,
    sessions: list[str],
    run_id: str,
    deadline: float,
    stop: Any,
    results: Any,
) -> None:
    """A process's body: one worker or service on its own store (spawned); it
    stops when the parent process dies. Ctrl-C reaches the whole process group:
    the parent answers it (one line, exit 130) and the units ignore it, ending
    through ``stop`` or the parent's death instead of with a traceback each."""
    import turnkeeper

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C pending since start() is dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    exit_when_orphaned()

    with turnkeeper.open_store(url) as store:
        if kind == "worker":
            worker = Worker(store, index, cfg, sessions, run_id, deadline, stop)
            worker.run()
            results.put(("worker", index, worker.stats))
            return
        service = make_service(kind, store, stop, cfg)
        service.run()
        results.put(("service", index, service.stats))


class ProcessFleet:
    """The fleet as processes, each with its own store on ``url``.

    The processes are spawned (not forked: a fork would copy the parent's
    pooled connections), so each starts a fresh interpreter; the deadline is
    on the monotonic clock, which every process on the host shares.
    """

    def __init__(
        self, url: str, cfg: FleetConfig, sessions: list[str], run_id: str, deadline: float
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.service_stop = ctx.Event()
        self._results = ctx.Queue()
        self._cfg = cfg
        args = (cfg, sessions, run_id, deadline)
        self._workers = [
            ctx.Process(
                target=_run_unit,
                args=(url, "worker", i, *args, self.stop, self._results),
                name=f"demo-worker-{i}",
            )
            for i in range(cfg.workers)
        ]
        self._services = [
            ctx.Process(
                target=_run_unit,
                args=(url, kind, i, *args, self.service_stop, self._results),
                name=f"demo-{kind}",
            )
            for i, kind in enumerate(SERVICES)
        ]

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

    def workers_alive(self) -> bool:
        return any(p.is_alive() for p in self._workers)

    def live_stats(self) -> list[WorkerStats]:
        """Counters come back when a process ends: none while the fleet runs."""
        return []

    def join_workers(self, timeout_s: float) -> None:
        for p in self._workers:
            p.join(timeout_s)

    def finish(self) -> tuple[list[WorkerStats], list[ServiceStats]]:
        """Stop everything and join every unit started; every unit's counters (a
        unit that died or never started sends none: it is counted as an error)."""
        self.stop.set()
        self.service_stop.set()
        started = [p for p in [*self._workers, *self._services] if p.pid is not None]
        expected = len(started)
        workers: dict[int, WorkerStats] = {}
        services: list[ServiceStats] = []
        give_up = time.monotonic() + JOIN_S
        while len(workers) + len(services) < expected and time.monotonic() < give_up:
            try:
                kind, index, stats = self._results.get(timeout=1.0)
            except Exception:  # queue.Empty: see who is still alive
                if not any(p.is_alive() for p in started):
                    break
                continue
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
        return [workers[i] for i in sorted(workers)], [*services, lost]
