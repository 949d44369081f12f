"""A failover under a writing fleet: a primary and a synchronous standby.

The test forms a pair of PostgreSQL servers on this machine with streaming
replication (``initdb``, ``pg_basebackup -R``, ``synchronous_standby_names``
with ``synchronous_commit=on``), each on a free TCP port of 127.0.0.1 and run
as the ``postgres`` user the way ``with_postgres.py`` runs its throwaway
server (its helpers). Three worker processes and a recovery process
(``failover_process.py``: ``fleet_process.py``'s fenced turns) reach the
pair through a libpq multi-host URL with ``target_session_attrs=read-write``.
Once every worker has acknowledged writes, the primary is stopped hard
(``pg_ctl stop -m immediate``) and the standby promoted (``pg_ctl
promote``). Then:

- (a) every write a worker saw acknowledged is on the new primary;
- (b) the audit passes there;
- (c) the same worker processes write again (each acknowledges writes
  after the failover), and every error a worker saw on the way is a
  :class:`turnkeeper.TurnkeeperError` (an untyped one ends its process and
  fails the test); the errors seen are listed by kind in the output.

Synchronous replication is what makes (a) hold: a commit is acknowledged
only once the standby has flushed it. ``test_an_asynchronous_standby_loses_
an_acknowledged_write`` shows the check of (a) firing when it does not.

Every wait is for work done or a server's state (hang guards only, no
timing asserts): the fleet's writes resume some seconds after the promotion
(the pool's reconnect backoff), however long that is. The test forms its own
servers, so it runs once, in ``make test`` (marked ``own_servers``: the
PgBouncer pass leaves it out).
"""

from __future__ import annotations

import collections
import io
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest
import with_postgres

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.spec import errors as error_types
from turnkeeper.storage.audit import run_audit

T = TypeVar("T")

HERE = Path(__file__).resolve().parents[1]  # model_tests/, where the support modules are
HANG_GUARD_S = 300.0
"""Seconds any wait below gets before the test fails (a guard against hangs only)."""

WORKERS = 3
ACKS_BEFORE = 3
"""Writes each worker acknowledges before the primary is stopped."""
ACKS_AFTER = 4
"""Writes each worker acknowledges after the promotion (a turn's worth: one
line may be of a write the old primary acknowledged just before it stopped)."""

SYNCHRONOUS = ("synchronous_standby_names='*'", "synchronous_commit=on")
"""The primary waits for the standby to flush each commit before acknowledging it."""
BASEBACKUP = ["-R", "-X", "stream", "-c", "fast", "-h", "127.0.0.1", "-U", "postgres"]
"""pg_basebackup's arguments beside the folder and port: a standby's copy (``-R``:
``standby.signal`` and ``primary_conninfo``), the WAL streamed meanwhile."""
ASYNCHRONOUS = ("synchronous_standby_names=''",)
"""The primary acknowledges a commit once it flushed it itself (the standby may lag)."""


PORT_TRIES = 5
"""Ports tried for a server (another program may take a free port before it binds)."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Pair:
    """A primary and its standby, each in a folder of ``root`` with its port."""

    bin: Path
    root: Path
    primary: Path
    standby: Path
    primary_port: int
    standby_port: int

    @property
    def url(self) -> str:
        """The multi-host URL the fleet uses: whichever accepts writes."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary_port},127.0.0.1:{self.standby_port}"
            "/postgres?target_session_attrs=read-write"
        )

    def direct(self, port: int) -> str:
        return f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def pg_ctl(self, folder: Path, *args: str) -> None:
        subprocess.run(
            [str(self.bin / "pg_ctl"), "-D", str(folder / "data"), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            cwd=folder,
            **with_postgres.server_user(),
        )

    def start_standby(self) -> None:
        self.standby_port = listen(self.bin, self.standby, (), port=self.standby_port)

    def promote(self) -> None:
        """Promote the standby and wait until it accepts writes."""
        self.pg_ctl(self.standby, "-w", "-t", str(int(HANG_GUARD_S)), "promote")


def tcp(port: int) -> tuple[str, ...]:
    """A server's settings beyond ``with_postgres``'s: on 127.0.0.1's ``port``,
    each commit flushed before it is acknowledged (``with_postgres`` turns that
    off for speed; ``fsync=off`` stays: no machine crashes here)."""
    return ("listen_addresses='127.0.0.1'", f"port={port}", "synchronous_commit=on")


def listen(bin_: Path, folder: Path, extra: tuple[str, ...], *, port: int = 0) -> int:
    """Start the cluster of ``folder`` (``with_postgres``'s test settings, then
    :func:`tcp`'s and ``extra``) on ``port``, or on a free one; its port.
    A port taken meanwhile ("could not bind") is replaced by another free one."""
    log = folder / "server.log"
    for attempt in range(PORT_TRIES):
        port = port or free_port()
        options = [*with_postgres.settings_for(folder, durable=False), *tcp(port), *extra]
        seen = log.stat().st_size if log.exists() else 0
        try:
            with_postgres.launch(bin_, folder, options)
            return port
        except subprocess.CalledProcessError:
            with log.open(errors="replace") as text:
                text.seek(seen)
                taken = "could not bind" in text.read()
            if attempt == PORT_TRIES - 1 or not taken:
                raise
            port = 0
    raise AssertionError("unreachable")


@contextmanager
def pair(replication: tuple[str, ...]) -> Iterator[Pair]:
    """A primary (``replication``: its settings) and a standby streaming from it,
    both running, the standby's state at the primary settled (``sync`` under
    :data:`SYNCHRONOUS`: it reads ``async`` for a moment first); both stopped
    and their folders deleted on the way out."""
    bin_ = with_postgres.bindir()
    assert bin_ is not None, "PostgreSQL's initdb and pg_ctl are not installed"
    root = Path(tempfile.mkdtemp(prefix="turnkeeper-failover-"))
    with_postgres.give_to_server(root)
    p = Pair(bin_, root, root / "primary", root / "standby", 0, 0)
    try:
        p.primary.mkdir()
        p.standby.mkdir()
        with_postgres.give_to_server(p.standby)
        with_postgres.create(bin_, p.primary)
        p.primary_port = listen(bin_, p.primary, replication)
        port = str(p.primary_port)
        subprocess.run(
            [str(bin_ / "pg_basebackup"), "-D", str(p.standby / "data"), *BASEBACKUP, "-p", port],
            check=True,
            stdout=subprocess.DEVNULL,
            cwd=p.standby,
            **with_postgres.server_user(),
        )
        p.start_standby()
        state = ("streaming", "sync" if replication == SYNCHRONOUS else "async")
        until(
            lambda: rows(p.direct(p.primary_port), STANDBY_STATE) == [state],
            f"the standby at the primary: {state}",
        )
        yield p
    except BaseException:
        for folder in (p.primary, p.standby):  # the servers' side of a failure
            log = folder / "server.log"
            if log.exists():
                sys.stderr.write(f"--- {folder.name} log\n{log.read_text()[-3000:]}\n")
        raise
    finally:
        for folder in (p.standby, p.primary):
            if (folder / "data").exists():
                with_postgres.halt(bin_, folder)
        shutil.rmtree(root, ignore_errors=True)


STANDBY_STATE = "SELECT state, sync_state FROM pg_stat_replication"


def rows(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def until(look: Callable[[], T], what: str) -> T:
    """``look()`` once it is truthy (a hang guard, not a timing assert)."""
    give_up = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < give_up:
        found = look()
        if found:
            return found
        time.sleep(0.1)  # pacing the look only
    pytest.fail(f"{what}: not after {HANG_GUARD_S} s")


def lost_acks(store: turnkeeper.BaseStore, lines: list[str]) -> list[str]:
    """The acknowledged lines (``entry|run <session> <id>``) whose write is not in ``store``."""
    lost = []
    for line in lines:
        kind, sid, ident = line.split()
        found = store.sessions.entry(sid, ident) if kind == "entry" else store.runs.get(ident)
        if found is None:
            lost.append(line)
    return lost


def error_kinds(lines: list[str]) -> collections.Counter[str]:
    """The errors the fleet saw (``<type name> <message>`` lines) counted by kind;
    each kind must be a :class:`turnkeeper.TurnkeeperError`."""
    kinds = collections.Counter(line.split(" ", 1)[0] for line in lines)
    for kind in kinds:
        cls = getattr(error_types, kind, None)
        assert isinstance(cls, type) and issubclass(cls, turnkeeper.TurnkeeperError), kind
    return kinds


def spawn(role: str, url: str, acks: Path, errors: Path, *extra: str) -> subprocess.Popen[bytes]:
    """Start one failover process and wait until it says it is ready (store open)."""
    program = [sys.executable, str(HERE / "failover_process.py")]
    proc = subprocess.Popen(
        [*program, role, url, str(acks), str(errors), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(HANG_GUARD_S), f"{role} {extra} not ready after {HANG_GUARD_S} s"
    line = proc.stdout.readline()
    assert line == b"ready\n", (line, proc.stderr.read() if proc.poll() is not None else b"")
    return proc


def acked(acks: Path) -> list[str]:
    """The acknowledged lines so far (whole lines only: one being written is not yet)."""
    text = acks.read_text() if acks.exists() else ""
    return [line for line in text.splitlines(keepends=True) if line.endswith("\n")]


def by_worker(lines: list[str], index: int) -> int:
    return sum(1 for line in lines if line.split()[1].startswith(f"w{index}-"))


@pytest.mark.postgres
@pytest.mark.own_servers
@pytest.mark.slow
def test_failover_under_a_writing_fleet_loses_no_acknowledged_write(tmp_path):
    """(a), (b) and (c) of the module's docstring through one hard failover:
    the primary stopped with ``-m immediate`` once every worker acknowledged
    :data:`ACKS_BEFORE` writes, the standby promoted, and the same processes
    waited for until each acknowledged :data:`ACKS_AFTER` more (or one ended:
    an untyped error, a failure)."""
    acks, errors = tmp_path / "acks.log", tmp_path / "errors.log"
    workers: list[subprocess.Popen[bytes]] = []
    procs: list[subprocess.Popen[bytes]] = []
    with pair(SYNCHRONOUS) as p:
        assert rows(p.direct(p.primary_port), STANDBY_STATE) == [("streaming", "sync")]
        with turnkeeper.open_store(p.url):
            pass  # migrated once, before the fleet
        try:
            procs.append(spawn("recovery", p.url, acks, errors))
            for i in range(WORKERS):
                workers.append(spawn("worker", p.url, acks, errors, str(i)))
            procs += workers
            until(
                lambda: all(by_worker(acked(acks), i) >= ACKS_BEFORE for i in range(WORKERS)),
                "every worker acknowledging writes before the failover",
            )
            with_postgres.halt(p.bin, p.primary)
            before = acked(acks)
            since = [by_worker(before, i) for i in range(WORKERS)]
            p.promote()
            promoted = time.monotonic()
            until(
                lambda: (
                    all(by_worker(acked(acks), i) >= since[i] + ACKS_AFTER for i in range(WORKERS))
                    or any(w.poll() is not None for w in procs)
                ),
                "every worker acknowledging writes after the failover",
            )
            assert [w.poll() for w in procs] == [None] * len(procs), "a process ended"
            resumed_s = time.monotonic() - promoted  # reported, not judged
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:  # each finishes its turn and exits
                assert w.wait(HANG_GUARD_S) == 0, w.stderr.read() if w.stderr else ""
            with turnkeeper.open_store(p.direct(p.standby_port)) as store:
                until(  # runs the failover cut short: recovered once their lease expired
                    lambda: (
                        store.query("SELECT count(*) AS n FROM active_runs").to_pylist()
                        == [{"n": 0}]
                    ),
                    "the recovery process converging the runs the failover cut short",
                )
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        assert procs[0].returncode == 0, procs[0].stderr.read() if procs[0].stderr else ""
        lines = acked(acks)
        seen = errors.read_text().splitlines() if errors.exists() else []
        kinds = error_kinds(seen)
        print(f"\nacknowledged writes: {len(lines)} ({len(before)} before the failover)")
        print(f"every worker writing again {resumed_s:.1f} s after the promotion")
        print(f"errors the fleet saw: {len(seen)}: {dict(kinds)}")
        for line in seen:
            print(f"  {line}")
        # Whether a worker saw an error depends on whether one was mid-operation
        # when the primary stopped (on a quiet machine the pool may move every
        # connection before the next operation): timing, so not asserted. That
        # the fleet moved is shown below: its writes after the promotion are on
        # the promoted standby, the old primary being down.
        with turnkeeper.open_store(p.direct(p.standby_port)) as store:
            assert lost_acks(store, lines) == []
            assert [c for c in run_audit(store) if not c.passed] == []


@pytest.mark.postgres
@pytest.mark.own_servers
@pytest.mark.slow
def test_an_asynchronous_standby_loses_an_acknowledged_write(tmp_path):
    """The check of (a) fires on a lost write: with asynchronous replication an
    acknowledged commit the standby had not received is gone after the
    promotion. The standby is stopped while the write is made (so it cannot
    have received it), then started and promoted once the primary is down."""
    with pair(ASYNCHRONOUS) as p:
        with turnkeeper.open_store(p.url) as store:
            store.sessions.create("s")
            kept = store.sessions.append("s", EntryKind.CUSTOM, {"customType": "n", "data": {}})
            until(
                lambda: (
                    rows(
                        p.direct(p.primary_port),
                        "SELECT replay_lsn >= pg_current_wal_flush_lsn() FROM pg_stat_replication",
                    )
                    == [(True,)]
                ),
                "the standby replaying the first write",
            )
            p.pg_ctl(p.standby, "-m", "fast", "-w", "stop")
            lost = store.sessions.append("s", EntryKind.CUSTOM, {"customType": "n", "data": {}})
            with_postgres.halt(p.bin, p.primary)
        p.start_standby()
        p.promote()
        lines = [f"entry s {kept.id}", f"entry s {lost.id}"]
        with turnkeeper.open_store(p.url) as store:
            assert lost_acks(store, lines) == [f"entry s {lost.id}"]


def test_error_kinds_refuses_an_untyped_error():
    """The check of (c): an error line of a type outside turnkeeper's hierarchy fails it."""
    assert error_kinds(["OperationalError the connection was lost"]) == {"OperationalError": 1}
    with pytest.raises(AssertionError):
        error_kinds(["OperationalError lost", "ConnectionResetError [Errno 104]"])


def test_a_worker_process_ends_on_an_untyped_error(monkeypatch):
    """The check of (c): ``keep_going`` goes on after a typed error and lets any
    other one end the process (the test then sees it gone)."""
    import failover_process
    import fleet_process

    monkeypatch.setattr(fleet_process, "STOP", threading.Event())
    calls: list[int] = []

    def body() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise turnkeeper.OperationalError("the connection to the server was lost")
        raise ConnectionResetError("untyped")

    log = io.StringIO()
    with pytest.raises(ConnectionResetError):
        failover_process.keep_going(body, log)
    line = log.getvalue()
    assert line == f"OperationalError {turnkeeper.OperationalError('x')}\n"
    assert len(calls) == 2


@pytest.mark.postgres
@pytest.mark.own_servers
def test_a_server_whose_port_was_taken_starts_on_another():
    """``listen``'s retry: a port something else took before the server bound it
    ("could not bind") is replaced by a free one (other programs on this machine
    take ports too); a failure for another reason is not retried."""
    bin_ = with_postgres.bindir()
    assert bin_ is not None
    folder = Path(tempfile.mkdtemp(prefix="turnkeeper-port-"))
    try:
        with_postgres.create(bin_, folder)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            started = listen(bin_, folder, (), port=port)
            assert started != port
            assert rows(f"postgresql://postgres@127.0.0.1:{started}/postgres", "SELECT 1") == [(1,)]
            with_postgres.halt(bin_, folder)
            with pytest.raises(subprocess.CalledProcessError):
                listen(bin_, folder, ("no_such_setting=1",))
    finally:
        with_postgres.stop(bin_, folder)
