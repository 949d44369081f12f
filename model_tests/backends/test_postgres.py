"""What only PostgreSQL has: many processes on one store.

Eight worker processes, a recovery coordinator and two outbox workers share
one store while random workers are killed with SIGKILL; afterwards the audit
passes and every acknowledged write is there. Several processes migrate a
new store at once; threads contending for one session get the serial
outcome (their lost races are retried, none escapes); a wake-up crosses
processes.
"""

from __future__ import annotations

import random
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import direct_for, new_pg_schema, open_pg, with_listen

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.storage.audit import run_audit

pytestmark = pytest.mark.postgres

HERE = Path(__file__).resolve().parents[1]  # model_tests/, where the support modules are
MSG = {"message": {"role": "user", "content": "x"}}


HANG_GUARD_S = 300.0
"""Seconds any wait below gets before the test fails (hang guards only: every
wait is for a process to be ready or for work to be done, never for a time)."""


def _spawn(role: str, url: str, acks: Path, *extra: str) -> subprocess.Popen[bytes]:
    """Start one fleet process and wait until it says it is ready (store open)."""
    where = with_listen(url)  # the recovery and outbox processes subscribe
    p = subprocess.Popen(
        [sys.executable, str(HERE / "fleet_process.py"), role, where, str(acks), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        assert sel.select(HANG_GUARD_S), f"{role} {extra} not ready after {HANG_GUARD_S} s"
    line = p.stdout.readline()
    assert line == b"ready\n", (line, _err(p))
    return p


def _err(p: subprocess.Popen[bytes]) -> str:
    if p.poll() is None:
        return ""
    return p.stderr.read().decode() if p.stderr else ""


def _acked(acks: Path) -> list[str]:
    """The acknowledged lines so far (a line is written whole, then flushed)."""
    return acks.read_text().splitlines() if acks.exists() else []


def _by_worker(lines: list[str], index: int) -> int:
    """How many of ``lines`` worker ``index`` acknowledged (``KIND w<index>-<n> ID``;
    a line being written as it is read may be cut short: not counted yet)."""
    return sum(1 for line in lines if len(f := line.split()) == 3 and f[1].startswith(f"w{index}-"))


def _until_acked(acks: Path, done: Callable[[list[str]], bool], what: str) -> list[str]:
    """Wait until the acknowledged lines satisfy ``done`` (work done, not time)."""
    give_up = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < give_up:
        lines = _acked(acks)
        if done(lines):
            return lines
        time.sleep(0.05)  # pacing the look only
    pytest.fail(f"{what}: not after {HANG_GUARD_S} s ({len(_acked(acks))} lines acknowledged)")


def _settle(store: turnkeeper.BaseStore) -> None:
    """Wait until no run is orphaned or active and nothing is due."""
    give_up = time.monotonic() + HANG_GUARD_S
    sub = store.subscribe("run_ended", "delivery_due", "orphan")
    busy = -1
    while time.monotonic() < give_up:
        busy = store.query(
            "SELECT (SELECT count(*) FROM active_runs) + "
            "(SELECT count(*) FROM delivery_operations WHERE status NOT IN "
            "('delivered', 'failed', 'uncertain', 'unsupported')) AS n"
        ).to_pylist()[0]["n"]
        if busy == 0:
            return
        sub.wait(1.0)
    pytest.fail(f"{busy} runs and deliveries still unsettled after {HANG_GUARD_S} s")


KILLS = 6
MIN_ACKS_BEFORE_A_KILL = 2
"""Writes a worker's current process must have acknowledged before it is killed."""
MIN_ACKS = 40
"""Writes acknowledged in all before the fleet is stopped."""


@pytest.mark.slow
def test_eight_worker_processes_with_kills_lose_no_acknowledged_write(tmp_path):
    """Each process is waited for until ready; each kill waits until its victim's
    current process acknowledged writes of its own, and the fleet stops once
    every worker's did and MIN_ACKS were acknowledged in all (a loaded machine
    saw 0 acknowledgements when the kills and the end were paced by sleeps)."""
    url = new_pg_schema()
    with turnkeeper.open_store(url):
        pass  # migrated once here; test_concurrent_opens_migrate_once races it
    acks = tmp_path / "acks.log"
    rng = random.Random(7)
    workers: dict[int, subprocess.Popen[bytes]] = {}
    services: list[subprocess.Popen[bytes]] = []
    since: dict[int, int] = {}  # a worker's lines before its current process began
    killed = 0
    try:
        services += [_spawn("recovery", url, acks), _spawn("outbox", url, acks)]
        services.append(_spawn("outbox", url, acks))
        for i in range(8):
            workers[i] = _spawn("worker", url, acks, str(i))
            since[i] = 0
        for _ in range(KILLS):
            i = rng.randrange(8)
            _until_acked(
                acks,
                lambda lines, i=i: _by_worker(lines, i) >= since[i] + MIN_ACKS_BEFORE_A_KILL,
                f"worker {i} acknowledging {MIN_ACKS_BEFORE_A_KILL} writes before its kill",
            )
            workers[i].send_signal(signal.SIGKILL)
            workers[i].wait(60)
            killed += 1
            since[i] = _by_worker(_acked(acks), i)
            workers[i] = _spawn("worker", url, acks, str(i))
        _until_acked(
            acks,
            lambda lines: (
                len(lines) >= MIN_ACKS and all(_by_worker(lines, i) > since[i] for i in workers)
            ),
            "every worker's current process acknowledging a write",
        )
        for p in workers.values():
            p.send_signal(signal.SIGTERM)
        for p in workers.values():  # ready, so SIGTERM only sets its stop flag
            assert p.wait(HANG_GUARD_S) == 0, _err(p)
        with open_pg(url) as store:
            _settle(store)
    finally:
        for p in [*workers.values(), *services]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in services:
            assert p.wait(120) in (0, -signal.SIGTERM), _err(p)
    lines = _acked(acks)
    assert killed == KILLS and len(lines) >= MIN_ACKS
    with turnkeeper.open_store(url) as store:
        for line in lines:
            kind, sid, ident = line.split()
            if kind == "entry":
                assert store.sessions.entry(sid, ident) is not None, line
            else:
                assert store.runs.get(ident) is not None, line
        assert store.query("SELECT count(*) AS n FROM active_runs").to_pylist() == [{"n": 0}]
        failed = [c for c in run_audit(store) if not c.passed]
        assert failed == []
        statuses = {r["status"] for r in store.query("SELECT status FROM runs").to_pylist()}
        assert "succeeded" in statuses


OPENER = """
import sys, turnkeeper
with turnkeeper.open_store(sys.argv[1]) as s:
    print(s.schema_version())
"""


def test_concurrent_opens_migrate_once(tmp_path):
    """Four processes open a new store at once: the advisory lock lets one
    migrate and the others find the schema current."""
    url = new_pg_schema()
    procs = [
        subprocess.Popen([sys.executable, "-c", OPENER, url], stdout=subprocess.PIPE)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120)[0].decode().strip() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4
    assert outs == [str(turnkeeper.SCHEMA_VERSION)] * 4
    with turnkeeper.open_store(url) as s:
        rows = s.query("SELECT version FROM schema_migrations ORDER BY version").to_pylist()
        assert [r["version"] for r in rows] == list(range(1, turnkeeper.SCHEMA_VERSION + 1))


def test_threads_contending_for_one_session_get_the_serial_outcome():
    """Lost races between connections are serialization failures, retried: every
    append lands, in one chain, and none escapes as TransactionConflictError."""
    with turnkeeper.open_store(new_pg_schema()) as store:
        store.sessions.create("s")
        failures: list[BaseException] = []

        def work(i: int) -> None:
            try:
                for _ in range(5):
                    store.sessions.append("s", EntryKind.MESSAGE, MSG)
            except BaseException as exc:
                failures.append(exc)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(work, range(8)))
        assert failures == []
        entries = store.sessions.entries("s")
        assert len(entries) == 40
        assert [e.parent_id for e in entries] == [None] + [e.id for e in entries[:-1]]


WAITER = """
import sys, turnkeeper
with turnkeeper.open_store(sys.argv[1]) as s:
    sub = s.subscribe("run_ended")
    print("ready", flush=True)
    print(",".join(sub.wait(120)), flush=True)
"""


def test_a_wake_up_crosses_processes():
    url = new_pg_schema()
    with turnkeeper.open_store(url) as store:
        store.sessions.create("s")
        run = store.runs.admit("s", {"q": 1})
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, with_listen(url)], stdout=subprocess.PIPE, text=True
        )
        assert waiter.stdout is not None
        assert waiter.stdout.readline().strip() == "ready"
        store.runs.finish(run.id, "failed")
        assert waiter.stdout.readline().strip() == "run_ended"
        assert waiter.wait(60) == 0


def _terminate(url: str, name: str, *, listening: bool) -> int:
    """Close (from the server side) the connections named ``name``; their count,
    once their server processes have ended (as after a restart)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        pids = [
            pid
            for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid() "
                "AND (query LIKE 'LISTEN%%') = %s",
                [name, listening],
            ).fetchall()
        ]
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        while admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
        ).fetchone():
            time.sleep(0.01)
    return len(pids)


def test_the_listener_reconnects_and_wakes_its_waiters_to_look_again():
    """A broken listening connection loses what was sent meanwhile: the listener
    reconnects and fires every topic once, so a waiter looks in the store."""
    # the server itself, also when the suite runs through PgBouncer: the test
    # closes the store's own server connections
    url = direct_for(new_pg_schema()) + "&application_name=tk_listener_test"
    with turnkeeper.open_store(url) as store:
        sub = store.subscribe("run_ended")
        assert _terminate(url, "tk_listener_test", listening=True) == 1
        assert sub.wait(60) == [turnkeeper.Topic.RUN_ENDED]


def test_a_pooled_connection_the_server_closed_is_replaced(monkeypatch):
    """A connection the server closed (a restart, a failover) is replaced: the
    next operation succeeds (the pool checks each connection before lending it).
    The check costs no round trip while the server has said nothing on an idle
    connection: it asks the server only when the socket has something to read
    (the server's goodbye, or its end)."""
    from psycopg_pool import ConnectionPool

    real, asked = ConnectionPool.check_connection, []

    def check(conn: object) -> None:
        asked.append(conn)
        real(conn)  # type: ignore[arg-type]

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(check))
    # the server itself, also when the suite runs through PgBouncer: the test
    # closes the store's own server connections
    url = direct_for(new_pg_schema()) + "&application_name=tk_pool_test"
    with turnkeeper.open_store(url) as store:
        store.sessions.create("s")
        for _ in range(5):
            store.sessions.append("s", EntryKind.MESSAGE, MSG)
        assert asked == []
        assert _terminate(url, "tk_pool_test", listening=False) >= 1
        store.sessions.append("s", EntryKind.MESSAGE, MSG)
        assert len(store.sessions.entries("s")) == 6
        assert asked  # the closed connection was checked, and replaced


def test_a_connection_with_a_high_file_descriptor_is_lent(tmp_path):
    """A worker holding many files or sockets gets pool connections whose
    descriptors lie above select()'s limit (1024): the pool's check must still
    look at them (it did not: every check failed and the pool timed out)."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1200
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"the file limit ({hard}) leaves no descriptor above 1024")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with turnkeeper.open_store(new_pg_schema()) as store:
            store.sessions.create("s")
            store.sessions.append("s", EntryKind.MESSAGE, MSG)
            assert len(store.sessions.entries("s")) == 1
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _grow_pool(store: turnkeeper.BaseStore, n: int) -> None:
    """Make the store's pool hold ``n`` idle connections (``n`` lent at once)."""
    held = [store.db._pool.connection() for _ in range(n)]  # type: ignore[attr-defined]
    for cm in held:
        cm.__enter__()
    for cm in held:
        cm.__exit__(None, None, None)


def test_after_a_restart_the_next_operation_succeeds_whatever_the_pool_held():
    """Attack helper: after every pooled connection was closed by the server
    (a restart), the next operation spent psycopg_pool's backoff between
    one failed check and the next (1, 2, 4, 8, 16 s): with six or more idle
    connections it failed with a pool timeout. The first dead one found now
    has the pool check all the others at once."""
    # the server itself, also when the suite runs through PgBouncer: the test
    # closes the store's own server connections
    url = direct_for(new_pg_schema()) + "&application_name=tk_restart_test"
    with turnkeeper.open_store(url) as store:
        store.sessions.create("s")
        _grow_pool(store, 7)
        assert _terminate(url, "tk_restart_test", listening=False) == 7
        store.sessions.append("s", EntryKind.MESSAGE, MSG)
        assert len(store.sessions.entries("s")) == 1


def test_a_connection_idle_a_while_is_checked_before_it_is_lent(monkeypatch):
    """A middlebox may forget an idle connection without a word: one idle for
    IDLE_CHECK_S is checked with a round trip (a quiet socket proves nothing
    then); one just given back is lent as it is."""
    from psycopg_pool import ConnectionPool

    from turnkeeper.storage.postgres import pool as pg_pool

    real, asked = ConnectionPool.check_connection, []

    def check(conn: object) -> None:
        asked.append(conn)
        real(conn)  # type: ignore[arg-type]

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(check))
    with turnkeeper.open_store(new_pg_schema()) as store:
        store.sessions.create("s")
        store.sessions.append("s", EntryKind.MESSAGE, MSG)
        assert asked == []
        monkeypatch.setattr(pg_pool, "IDLE_CHECK_S", 0.0)
        store.sessions.append("s", EntryKind.MESSAGE, MSG)
        assert len(asked) == 1


def test_pooled_connections_notice_a_silent_server_unless_the_url_says_otherwise():
    """Keepalives and tcp_user_timeout bound how long a vanished server (no
    reset: a host gone, a partition) can hold an operation; the URL's own
    values win."""
    url = new_pg_schema() + "&keepalives_idle=99"
    with (
        turnkeeper.open_store(url) as store,
        store.db._pool.connection() as conn,  # type: ignore[attr-defined]
    ):
        given = conn.info.get_parameters()
    assert given["keepalives"] == "1" and given["tcp_user_timeout"] == "30000"
    assert given["keepalives_idle"] == "99"


def test_the_environment_and_a_service_file_keep_their_own_timeouts(tmp_path, monkeypatch):
    """Attack helper: the pool's defaults overrode PGCONNECT_TIMEOUT and a
    pg_service.conf service's values; the user's own values win."""
    from psycopg.conninfo import conninfo_to_dict

    url = new_pg_schema()
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "3")
    with (
        turnkeeper.open_store(url) as store,
        store.db._pool.connection() as conn,  # type: ignore[attr-defined]
    ):
        given = conn.info.get_parameters()
    assert given["connect_timeout"] == "3" and given["tcp_user_timeout"] == "30000"
    monkeypatch.delenv("PGCONNECT_TIMEOUT")
    where = conninfo_to_dict(url)
    lines = [f"{k}={v}" for k, v in where.items() if k in ("host", "port", "user", "dbname")]
    services = tmp_path / "pg_service.conf"
    services.write_text("[tks]\n" + "\n".join([*lines, "tcp_user_timeout=7000"]) + "\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    options = where.get("options", "")
    with (
        turnkeeper.open_store(f"service=tks options='{options}'") as store,
        store.db._pool.connection() as conn,  # type: ignore[attr-defined]
    ):
        given = conn.info.get_parameters()
    assert given["tcp_user_timeout"] == "7000"


def test_an_autocommit_write_cut_off_says_its_outcome_is_unknown(monkeypatch):
    """Attack helper: a one-statement append whose connection broke before the
    reply came raised a plain OperationalError although the entry may be
    stored (it was): a caller that retries writes it twice. It now says the
    outcome is unknown, as a broken COMMIT does."""
    from turnkeeper.storage.ops import appends

    def cut(tx: Any, request: Any) -> Any:
        tx.exec("SELECT pg_terminate_backend(pg_backend_pid())")  # the connection breaks

    monkeypatch.setattr(appends, "one_statement", cut)
    with turnkeeper.open_store(new_pg_schema()) as store:
        store.sessions.create("s")
        with pytest.raises(turnkeeper.OperationalError) as err:
            store.sessions.append("s", EntryKind.MESSAGE, MSG)
        assert "unknown" in str(err.value)


def test_the_throwaway_server_starts_answers_and_is_gone_afterwards(tmp_path):
    """model_tests/with_postgres.py (what make test and .ci/run use) starts its own
    server on a socket in a new folder, hands CMD its URL, passes CMD's exit status
    through, and stops the server and deletes the folder afterwards, even when CMD
    fails; a second one started meanwhile does not collide."""
    import os

    probe = (
        "import os, sys, psycopg; url = os.environ['TURNKEEPER_TEST_PG']; "
        "c = psycopg.connect(url); print(url); "
        "print(c.execute('SHOW fsync').fetchone()[0]); sys.exit(3)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TURNKEEPER_TEST_PG"}
    script = str(HERE / "with_postgres.py")
    runs = [
        subprocess.Popen(
            [sys.executable, script, *flag, sys.executable, "-c", probe],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for flag in ([], ["--durable"])
    ]
    outs = [(p.communicate(timeout=600)[0].split(), p.returncode) for p in runs]
    (fast_url, fsync_fast), (durable_url, fsync_durable) = (o for o, _ in outs)
    assert [rc for _, rc in outs] == [3, 3]
    assert (fsync_fast, fsync_durable) == ("off", "on")
    assert fast_url != durable_url
    for url in (fast_url, durable_url):
        folder = url.split("host=", 1)[1]
        assert not os.path.exists(folder), folder
