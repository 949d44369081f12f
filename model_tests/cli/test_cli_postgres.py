"""The CLI on PostgreSQL while a fleet writes: an SRE runs ``report``,
``sessions``, ``audit`` and ``export`` against the server a running demo
(worker processes) is writing to, and every one answers from a consistent
snapshot; the demo's own audit passes after it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import new_pg_schema

import turnkeeper

pytestmark = pytest.mark.postgres

CLI = [sys.executable, "-m", "turnkeeper.cli.main"]


def tk(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_report_sessions_audit_and_export_answer_while_a_demo_writes(tmp_path: Path) -> None:
    url = new_pg_schema()
    turnkeeper.open_store(url).close()  # migrated: a read-only open cannot migrate
    fleet = ["--duration", "12", "--workers", "3", "--sessions", "4", "--ttl", "1", "--seed", "7"]
    demo = subprocess.Popen(
        [*CLI, "demo", "--db", url, *fleet, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rounds = 0
    try:
        while demo.poll() is None:
            report = tk("report", "--db", url, "--json")
            assert report.returncode == 0, report.stderr
            listed = tk("sessions", "list", "--db", url, "--json")
            assert listed.returncode == 0, listed.stderr
            audit = tk("audit", "--db", url, "--json")
            assert audit.returncode == 0, audit.stdout + audit.stderr
            sessions = json.loads(listed.stdout)["sessions"]
            if sessions:
                sid = sessions[0]["id"]
                shown = tk("sessions", "show", sid, "--db", url)
                assert shown.returncode == 0, shown.stderr
                out = tmp_path / f"{rounds}.jsonl"
                exported = tk("export", sid, "--db", url, "-o", str(out))
                assert exported.returncode == 0, exported.stderr
                header = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
                assert header["id"] == sid
                rounds += 1
            time.sleep(0.5)
        stdout, stderr = demo.communicate(timeout=300)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, stderr
    figures = json.loads(stdout)
    assert figures["audit_passed"], figures["audit"]
    assert rounds >= 1, "no read round saw a session while the demo ran"
    final = tk("audit", "--db", url, "--json")
    assert final.returncode == 0, final.stdout
    parquet = tmp_path / "parquet"
    report = tk("report", "--db", url, "--parquet", str(parquet))
    assert report.returncode == 0, report.stderr
    assert (parquet / "entries.parquet").stat().st_size > 0


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_a_killed_demo_leaves_no_worker_or_service_process_behind() -> None:
    """kill -9 of a demo on PostgreSQL: its spawned workers and services see their
    parent die and stop on their own (services run until told to stop, and
    nobody else would tell them)."""
    url = new_pg_schema()
    fleet = ["--duration", "600", "--workers", "2", "--sessions", "2", "--seed", "3"]
    demo = subprocess.Popen(
        [*CLI, "demo", "--db", url, *fleet, "--json"], stdout=subprocess.DEVNULL
    )
    with _reaped(demo) as children:
        children[:] = _units_of(demo)
        os.kill(demo.pid, signal.SIGKILL)
        demo.wait()
        _all_gone(children)


@contextlib.contextmanager
def _reaped(demo: subprocess.Popen[Any]) -> Iterator[list[int]]:
    """The list of ``demo``'s children the test fills in; whatever is still alive
    of the demo and of them is killed at the end, pass or fail."""
    children: list[int] = []
    try:
        yield children
    finally:
        if demo.poll() is None:
            demo.kill()
        for c in children:
            if _alive(c):
                os.kill(c, signal.SIGKILL)


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


@pytest.mark.slow
def test_ctrl_c_on_a_process_fleet_demo_prints_one_line_and_exits_130() -> None:
    """SIGINT to the demo's process group (Ctrl-C in a terminal): the demo says it
    was interrupted in one line and exits 130; its worker and service processes
    print no tracebacks and end."""
    url = new_pg_schema()
    fleet = ["--duration", "600", "--workers", "2", "--sessions", "2", "--seed", "5"]
    demo = subprocess.Popen(
        [*CLI, "demo", "--db", url, *fleet],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    with _reaped(demo) as children:
        children[:] = _units_of(demo)
        os.killpg(demo.pid, signal.SIGINT)
        _, stderr = demo.communicate(timeout=300)
        assert demo.returncode == 130, stderr
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
        assert stderr.strip().splitlines()[-1] == "turnkeeper: interrupted", stderr
        _all_gone(children)


def _units_of(demo: subprocess.Popen[str]) -> list[int]:
    """The demo's five spawned worker and service processes, once all run."""
    children: list[int] = []
    for _ in range(600):  # the processes are spawned: wait until all five run
        children = [c for c in _children(demo.pid) if "multiprocessing" in _cmd(c)]
        if len(children) >= 5:
            break
        time.sleep(0.2)
    assert len(children) >= 5, children
    return children


def _all_gone(children: list[int]) -> None:
    """Every one of ``children`` ends (a liveness bound for a loaded machine, not a
    timing figure)."""
    for _ in range(600):
        if not any(_alive(c) for c in children):
            break
        time.sleep(0.2)
    assert not any(_alive(c) for c in children), [c for c in children if _alive(c)]


@pytest.mark.slow
@pytest.mark.parametrize("when", ["held_until_started", "on_another_thread", "between_two_starts"])
def test_ctrl_c_while_the_fleet_starts_still_stops_every_unit(
    when: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C that arrives while the units are being started still stops and
    joins every unit that started before the demo exits: a demo that exited
    without them unlinked the shared events' semaphores, and units still starting
    died with a traceback each (CI failure: the SIGINT came before the sixth unit
    started). ``held_until_started``: the signal waits, blocked, until start()
    unblocks it; ``on_another_thread``: it lands, after the fourth unit, on a
    thread that does not block it (a process-directed signal may: CI), and is
    still held until every unit started; ``between_two_starts``: an interrupt
    raised after the fourth unit stops the four."""
    from turnkeeper.cli import demo as demo_module
    from turnkeeper.cli.fleet import FleetConfig
    from turnkeeper.cli.fleet_runners import ProcessFleet

    fleets: list[ProcessFleet] = []
    original = ProcessFleet.start
    go, sent, done = threading.Event(), threading.Event(), threading.Event()

    def signal_this_thread() -> None:  # started before the fleet: SIGINT unblocked here
        go.wait()
        if not done.is_set():
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        sent.set()

    other = threading.Thread(target=signal_this_thread, daemon=True)
    other.start()

    def interrupted_start(self: ProcessFleet) -> None:
        fleets.append(self)
        if when == "held_until_started":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        else:
            process_class = type(self._services[1])
            start_one = process_class.start

            def start_then_interrupt(process: Any) -> None:
                start_one(process)
                if process is not self._services[1]:
                    return
                if when == "between_two_starts":
                    raise KeyboardInterrupt
                go.set()
                sent.wait()

            monkeypatch.setattr(process_class, "start", start_then_interrupt)
        original(self)

    monkeypatch.setattr(ProcessFleet, "start", interrupted_start)
    cfg = FleetConfig(workers=2, sessions=2, duration_s=600, seed=5)
    with turnkeeper.open_store(new_pg_schema()) as store:
        try:
            with pytest.raises(KeyboardInterrupt):
                demo_module.run_fleet(store, cfg, None)
            (fleet,) = fleets
            units = [*fleet._workers, *fleet._services]
            started = 4 if when == "between_two_starts" else 6
            assert [p.exitcode for p in units] == [0] * started + [None] * (6 - started)
        finally:
            done.set()
            go.set()
            other.join()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            for f in fleets:
                for p in [*f._workers, *f._services]:
                    if p.is_alive():
                        p.kill()
                        p.join()
    assert "Traceback" not in capfd.readouterr().err
