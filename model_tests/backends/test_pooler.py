"""PostgreSQL behind PgBouncer in transaction mode (``pool_mode = transaction``).

The pooler lends a server connection for one transaction: prepared
statements, ``LISTEN`` and startup options do not survive it. These tests
run real operations through a real PgBouncer 1.18 (``with_postgres.py``
starts it in front of the test server) and check each thing the store needs
of a session: it works in pooler mode, or is refused with a typed error
that says what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
import with_postgres
from conftest import direct_url, new_pooled_schema, pooler_url, with_schema
from pooler_turns import check, turns

import turnkeeper

pytestmark = pytest.mark.postgres

HERE = Path(__file__).resolve().parents[1]  # model_tests/, where the support modules are
CLI = [sys.executable, "-m", "turnkeeper.cli.main"]
TIMEOUT_S = 600
"""A guard against hangs only (a loaded 2-core machine)."""


@pytest.fixture
def schema() -> tuple[str, str]:
    """A fresh schema and role: its URL through PgBouncer, and its direct URL."""
    return new_pooled_schema()


POOL_SIZE = 20
"""PgBouncer's ``default_pool_size`` in the test harness (``with_postgres.py``):
server connections per database and role."""


def hold_server_connection(url: str, pid: int) -> list[psycopg.Connection]:
    """Client connections through the pooler at ``url``, each in an open
    transaction, until one holds the server connection of backend ``pid``
    (PgBouncer lends its most recently used idle one first); ``[]`` (every
    one closed again) when none did among one fewer than the pool holds: a
    client past the pool's size would wait for a server connection until
    PgBouncer's ``query_wait_timeout`` (this failed once under load, when
    another server connection had been used last)."""
    held: list[psycopg.Connection] = []
    for _ in range(POOL_SIZE - 1):
        conn = psycopg.connect(url)
        held.append(conn)
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        if row is not None and row[0] == pid:
            return held
    for conn in held:
        conn.close()
    return []


def server_pid(store: turnkeeper.BaseStore) -> int:
    """The server backend the store's next transaction runs on (through the pooler)."""
    return int(store.db.read("pid", lambda tx: tx.one("SELECT pg_backend_pid()"))[0])


def reuse_after_a_server_switch(store: turnkeeper.BaseStore, url: str, sid: str = "s") -> None:
    """Run one read often enough for psycopg to prepare it (its fifth run), then
    have the pooler lend the store another server connection, and run it again."""
    store.sessions.create(sid)
    for _ in range(8):
        assert store.sessions.get(sid) is not None
    for _ in range(5):  # the store's server connection, lent to another client
        held = hold_server_connection(url, server_pid(store))
        if held:
            break
    else:
        raise AssertionError("no client of the pooler was lent the store's server connection")
    try:
        assert store.sessions.get(sid) is not None  # on another server connection
        assert list(store.sessions.replay(sid).messages) == []
    finally:
        for conn in held:
            conn.close()


def test_a_statement_run_again_on_another_server_connection_works(schema):
    """Before pooler mode, psycopg prepared a statement on its fifth run and
    executed the name ``_pg3_N`` thereafter; the pooler lends another server
    connection to the next transaction, where the name does not exist (failed
    with ProgrammingError 'prepared statement "_pg3_0" does not exist').
    A detected pooler now turns preparing off."""
    pooled, _ = schema
    with turnkeeper.open_store(pooled) as store:
        reuse_after_a_server_switch(store, pooled)
        assert (store.pooler, store.db.pooler_detected) == ("transaction", True)


def test_detection_is_what_turns_preparing_off(schema, monkeypatch):
    """With the detection broken (every connection looks direct) the same
    sequence fails as before, and the error says which option stops it; told
    ``pooler="transaction"``, the store prepares nothing all the same."""
    from turnkeeper.storage.postgres import connect

    real = connect.probe
    monkeypatch.setattr(connect, "probe", lambda conn: replace(real(conn), pooled=False))
    pooled, _ = schema
    with turnkeeper.open_store(pooled) as store:
        assert store.pooler is None
        with pytest.raises(turnkeeper.ProgrammingError) as err:
            reuse_after_a_server_switch(store, pooled)
        assert "pooler='transaction'" in str(err.value)
    with turnkeeper.open_store(pooled, pooler="transaction") as store:
        assert (store.pooler, store.db.pooler_detected) == ("transaction", False)
        reuse_after_a_server_switch(store, pooled, "s2")


def test_a_direct_connection_is_not_taken_for_a_pooler(schema):
    _, direct = schema
    with turnkeeper.open_store(direct) as store:
        assert (store.pooler, store.db.pooler_detected) == (None, False)
    with turnkeeper.open_store(direct, pooler="session") as store:
        assert store.pooler == "session"


def test_threads_doing_turns_through_the_pooler_see_no_error(schema):
    """8 threads on one store object, each doing turns (admit, appends, a tool
    claim and completion, finish with a delivery plan, the delivery's claim and
    result) through PgBouncer: no error, and every turn stored whole. Before
    pooler mode most turns failed ('prepared statement "_pg3_N" does not
    exist', bind-parameter mismatches, a bare AssertionError)."""
    pooled, _ = schema
    with turnkeeper.open_store(pooled) as store:
        outcomes: dict[int, dict] = {}

        def work(i: int) -> None:
            outcomes[i] = turns(store, f"t{i}", 6)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        assert [o["errors"] for o in outcomes.values()] == [[]] * 8
        assert sum(o["turns"] for o in outcomes.values()) == 48
        for i in range(8):
            check(store, f"t{i}", 6)


def test_processes_doing_turns_through_the_pooler_see_no_error(schema):
    """Four processes, each its own store object, doing turns through PgBouncer
    at once: no error, every turn stored whole (most failed before)."""
    pooled, _ = schema
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "pooler_turns.py"), pooled, "-", f"p{i}", "5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    outs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    outcomes = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [o["errors"] for o in outcomes] == [[]] * 4
    assert [o["turns"] for o in outcomes] == [5] * 4
    with turnkeeper.open_store(pooled) as store:
        for i in range(4):
            check(store, f"p{i}", 5)


def test_concurrent_opens_through_the_pooler_migrate_once(schema):
    """The migration lock is a transaction's (``pg_advisory_xact_lock``), so it
    holds through the pooler: stores opening a new schema at once all open,
    and the schema is migrated once."""
    pooled, _ = schema
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def open_one() -> None:
        try:
            barrier.wait(TIMEOUT_S)
            turnkeeper.open_store(pooled).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert errors == []
    with turnkeeper.open_store(pooled) as store:
        table = store.query("SELECT version, count(*) AS n FROM schema_migrations GROUP BY 1")
        assert set(table.column("n").to_pylist()) == {1}
        assert len(table) == turnkeeper.SCHEMA_VERSION


def test_every_transaction_through_the_pooler_runs_in_utc(schema):
    """The one setting the store makes per connection, ``TimeZone``, holds in
    every transaction though other clients of the same server connections set
    their own (PgBouncer tracks it per client and restores it)."""
    pooled, _ = schema
    with turnkeeper.open_store(pooled) as store:
        for _ in range(5):
            pid = server_pid(store)
            held = hold_server_connection(pooled, pid)
            if held:
                break
        assert held, "no client of the pooler was lent the store's server connection"
        held[-1].execute("SET TIME ZONE 'Asia/Kathmandu'")
        held[-1].commit()
        for conn in held:
            conn.close()
        assert server_pid(store) == pid  # the connection the other client changed
        zone = store.db.write("tz", lambda tx: tx.one("SELECT current_setting('TimeZone')"))
        assert zone == ("UTC",)


# -- wake-ups ---------------------------------------------------------------------


def test_subscribing_through_a_transaction_pooler_is_refused(schema):
    """A listener through the pooler hears nothing (its LISTEN ran on a server
    connection lent for one transaction); it used to subscribe without a
    word. Now: PoolerError saying to give listen_url."""
    pooled, _ = schema
    with turnkeeper.open_store(pooled) as store:
        try:
            deaf = store.subscribe("run_ended")
        except turnkeeper.TurnkeeperError as exc:
            refused = exc
        else:  # what it did before: say nothing, and hear nothing
            finish_one_run(pooled)
            pytest.fail(f"subscribed through the pooler; a run ended, it heard {deaf.wait(2)}")
        assert isinstance(refused, turnkeeper.PoolerError)
        assert (refused.feature, refused.path) == ("LISTEN", store.path)
        assert "listen_url" in str(refused) and "pooler='session'" in str(refused)
    with turnkeeper.open_store(pooled, pooler="transaction") as store:
        with pytest.raises(turnkeeper.PoolerError) as err:
            store.subscribe("run_ended")
        assert "opened with pooler='transaction'" in str(err.value)


def finish_one_run(url: str) -> None:
    """Admit and finish a run through ``url`` (a store object of its own)."""
    with turnkeeper.open_store(url) as other:
        other.sessions.create("w")
        user = {"role": "user", "content": "x"}
        run = other.runs.admit("w", {"t": 1}, user_message=user, start=True)
        other.runs.finish(run.id, "succeeded")


@pytest.mark.parametrize("how", ["argument", "url"])
def test_wake_ups_arrive_through_a_direct_listen_url(schema, how):
    """With ``listen_url`` (an argument, or the URL's percent-encoded
    parameter) the listener connects to the server itself and hears a run
    another store object ends through the pooler."""
    pooled, direct = schema
    if how == "argument":
        store = turnkeeper.open_store(pooled, listen_url=direct)
    else:
        store = turnkeeper.open_store(f"{pooled}&listen_url={quote(direct, safe='')}")
    with store:
        assert store.db.listen_url == direct and "listen_url" not in store.path
        sub = store.subscribe("run_ended")
        finish_one_run(pooled)
        assert sub.wait(TIMEOUT_S) == [turnkeeper.Topic.RUN_ENDED]


def test_a_listen_url_through_the_pooler_is_refused(schema):
    pooled, _ = schema
    with turnkeeper.open_store(pooled, listen_url=pooled) as store:
        with pytest.raises(turnkeeper.PoolerError) as err:
            store.subscribe("run_ended")
        assert err.value.feature == "listen_url" and "pooler too" in str(err.value)


def test_a_listen_url_of_another_database_is_refused(schema):
    """A NOTIFY reaches listeners of its own database only: a listen_url of
    another database would be deaf, so it is refused."""
    pooled, direct = schema
    other = direct.replace("/postgres?", "/template1?", 1)
    with turnkeeper.open_store(pooled, listen_url=other) as store:
        with pytest.raises(turnkeeper.PoolerError) as err:
            store.subscribe("run_ended")
        assert err.value.feature == "listen_url" and "template1" in str(err.value)


def test_a_listen_url_of_another_server_is_refused(schema, monkeypatch):
    """A listen_url on another server (the same database name on another
    host) would hear nothing: the listener's first connection must reach a
    server started when the store's did. (Made here by making the listener's
    connection report another start time.)"""
    from turnkeeper.storage.postgres import connect

    real = connect.probe

    def elsewhere(conn: psycopg.Connection) -> connect.Probe:
        found = real(conn)
        if threading.current_thread().name != "turnkeeper-listen":
            return found
        return replace(found, started=found.started - timedelta(days=1))

    monkeypatch.setattr(connect, "probe", elsewhere)
    pooled, direct = schema
    with turnkeeper.open_store(pooled, listen_url=direct) as store:
        with pytest.raises(turnkeeper.PoolerError) as err:
            store.subscribe("run_ended")
        assert err.value.feature == "listen_url" and "another server" in str(err.value)


def test_the_listener_hears_the_stores_channel_whatever_schema_its_url_lands_in(schema):
    """The channel is the store's (``turnkeeper:<its schema>``), not that of
    the schema the listening connection lands in: a listen_url as another
    role, whose default schema is ``public``, still hears the store."""
    pooled, _ = schema
    with turnkeeper.open_store(pooled, listen_url=direct_url()) as store:
        sub = store.subscribe("run_ended")
        finish_one_run(pooled)
        assert sub.wait(TIMEOUT_S) == [turnkeeper.Topic.RUN_ENDED]


# -- the schema and startup options ----------------------------------------------


def test_a_schema_the_pooler_dropped_is_refused(schema):
    """The test PgBouncer ignores the ``options`` startup parameter (as
    deployments that keep URLs with options configure it): a URL naming a
    schema the role's default search_path does not give used to open (and
    migrate) the store in ``public`` without a word. Now PoolerError, and
    nothing is written."""
    pooled, _ = schema
    role_schema = pooled.split("options=-csearch_path%3D")[1]
    wrong = with_schema(pooler_url(), role_schema)  # as postgres, whose default is public
    tables = "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
    with psycopg.connect(direct_url()) as conn:
        before = conn.execute(tables).fetchone()
    try:
        turnkeeper.open_store(wrong).close()
    except turnkeeper.TurnkeeperError as exc:
        refused = exc
    else:
        refused = None
    with psycopg.connect(direct_url()) as conn:
        assert conn.execute(tables).fetchone() == before  # before: the store's, in public
    assert isinstance(refused, turnkeeper.PoolerError)
    assert refused.feature == "search_path"
    assert "ALTER ROLE" in str(refused) and "'public'" in str(refused)


def test_a_missing_schema_is_named_as_missing(schema):
    """The role's search_path names a missing schema first and an existing one
    after it, where the connections land: refused, naming the missing one.
    (A search_path none of whose schemas exists has its first created at
    open: test_shared_databases.py.)"""
    pooled, _ = schema
    role = pooled.split("postgresql://")[1].split("@")[0]
    with psycopg.connect(direct_url(), autocommit=True) as conn:
        conn.execute(f"ALTER ROLE {role} SET search_path = nowhere_{role}, public")
    with pytest.raises(turnkeeper.PoolerError) as err:
        turnkeeper.open_store(pooled.replace(f"%3D{role}", f"%3Dnowhere_{role}"))
    assert err.value.feature == "search_path" and "does not exist" in str(err.value)


@pytest.fixture
def strict_pooler() -> Iterator[str]:
    """A second PgBouncer that refuses the ``options`` startup parameter
    (PgBouncer's default)."""
    server = Path(direct_url().split("host=", 1)[1].split("&")[0])
    folder = Path(tempfile.mkdtemp(prefix="turnkeeper-pgbouncer-"))
    try:
        yield with_postgres.start_pgbouncer(folder, server, port=6433, ignore="")
    finally:
        with_postgres.stop_pgbouncer(folder, 6433)
        shutil.rmtree(folder)


def test_options_the_pooler_refuses_get_a_typed_error_that_says_what_to_do(schema, strict_pooler):
    """PgBouncer refuses a URL's ``options`` by default: the login failed with a
    bare OperationalError; now PoolerError(feature='options') naming the fix.
    Without options, the role's default search_path gives the schema."""
    pooled, _ = schema
    role = pooled.split("postgresql://")[1].split("@")[0]
    strict = strict_pooler.replace("postgresql://postgres@", f"postgresql://{role}@", 1)
    with pytest.raises(turnkeeper.PoolerError) as err:
        turnkeeper.open_store(with_schema(strict, role), pooler="transaction")
    assert err.value.feature == "options" and "ALTER ROLE" in str(err.value)
    assert isinstance(err.value.__cause__, psycopg.OperationalError)
    with turnkeeper.open_store(strict, pooler="transaction") as store:
        store.sessions.create("s")
        assert store.query("SELECT current_schema() AS s").column("s").to_pylist() == [role]


# -- turnkeeper's connection parameters -----------------------------------------


@pytest.mark.parametrize(
    ("url", "libpq", "found"),
    [
        ("postgresql://u@h/db", "postgresql://u@h/db", {}),
        (
            "postgresql://u@h/db?options=-c%20search_path%3Dx+y&pooler=transaction",
            "postgresql://u@h/db?options=-c%20search_path%3Dx+y",
            {"pooler": "transaction"},
        ),
        (
            "postgresql://u@/db?pooler=session&host=/tmp&listen_url=postgresql%3A%2F%2Fa%40b%2Fc",
            "postgresql://u@/db?host=/tmp",
            {"pooler": "session", "listen_url": "postgresql://a@b/c"},
        ),
        (
            "host=h pooler = transaction dbname='my db' listen_url='host=h2 port=5432'",
            "host=h dbname='my db'",
            {"pooler": "transaction", "listen_url": "host=h2 port=5432"},
        ),
    ],
)
def test_turnkeepers_parameters_come_out_of_the_url_and_the_rest_stays(url, libpq, found):
    """``pooler`` and ``listen_url`` are taken out of a URL (or key=value string)
    before libpq reads it; every other parameter stays as it was written (a
    URL's ``+`` is not re-encoded: libpq reads it as itself)."""
    from turnkeeper.storage.postgres import connect

    assert connect.split(url) == (libpq, found)


@pytest.mark.parametrize(
    ("url", "kwargs", "field"),
    [
        ("postgresql://h/db", {"pooler": "statement"}, "pooler"),
        ("postgresql://h/db?pooler=transactions", {}, "pooler"),
        ("postgresql://h/db?pooler=session", {"pooler": "transaction"}, "pooler"),
        ("postgresql://h/db", {"pooler": 1}, "pooler"),
        ("postgresql://h/db", {"listen_url": ""}, "listen_url"),
        ("postgresql://h/db?listen_url=a", {"listen_url": "b"}, "listen_url"),
        ("postgresql://h/db", {"listen_url": "postgresql://h/db?pooler=session"}, "listen_url"),
        ("store.duckdb", {"pooler": "transaction"}, "pooler"),
        (":memory:", {"listen_url": "postgresql://h/db"}, "listen_url"),
    ],
)
def test_a_bad_pooler_setting_is_refused_before_any_connection(url, kwargs, field):
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        turnkeeper.open_store(url, **kwargs)
    assert err.value.field == field


def test_the_listen_urls_password_is_never_shown(schema):
    """``store.path`` (in every message) is the URL without its password and
    without turnkeeper's parameters, so a listen_url's password is not shown."""
    pooled, direct = schema
    role = pooled.split("postgresql://")[1].split("@")[0]
    secret = direct.replace(f"//{role}@", f"//{role}:hunter2@", 1)  # trust: any password
    with turnkeeper.open_store(f"{pooled}&listen_url={quote(secret, safe='')}") as store:
        assert store.db.listen_url == secret
        assert "hunter2" not in store.path and "listen_url" not in store.path
        store.subscribe("run_ended")


# -- the CLI ----------------------------------------------------------------------


def test_the_cli_runs_a_demo_and_reports_through_the_pooler(schema):
    """``--db`` takes the pooler mode as a URL parameter (libpq refused the
    unknown parameter before: 'invalid URI query parameter: "pooler"'): the
    demo's worker processes run their turns through PgBouncer, and its audit
    and ``report`` pass."""
    pooled, _ = schema
    url = f"{pooled}&pooler=transaction"
    fleet = ["--duration", "4", "--workers", "2", "--sessions", "3", "--seed", "5", "--json"]
    env = {**os.environ, "TURNKEEPER_DB": url}  # report's --db (demo's has its own default)
    demo = subprocess.run(
        [*CLI, "demo", "--db", url, *fleet], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    report = subprocess.run(
        [*CLI, "report", "--json"], capture_output=True, text=True, timeout=TIMEOUT_S, env=env
    )
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["sessions"]["sessions"] >= 1


# -- the harness ------------------------------------------------------------------

HARNESS_PROBE = """
import json, os, pathlib, psycopg
env = {k: os.environ.get(k) for k in
       ("TURNKEEPER_TEST_PG", "TURNKEEPER_TEST_PG_DIRECT", "TURNKEEPER_TEST_PGBOUNCER")}
pooled = {}
for k, url in env.items():
    with psycopg.connect(url, autocommit=True) as c:
        pooled[k] = c.execute("SELECT pg_backend_pid()").fetchone()[0] != c.info.backend_pid
folder = pathlib.Path(env["TURNKEEPER_TEST_PG_DIRECT"].split("host=", 1)[1])
pid = int((folder / "pgbouncer-6432.pid").read_text())
print(json.dumps({"env": env, "pooled": pooled, "folder": str(folder), "pid": pid}))
raise SystemExit(3)
"""


def test_the_harness_runs_pgbouncer_in_front_and_stops_it():
    """with_postgres.py starts PgBouncer in transaction mode on a socket in the
    server's folder and names it (``TURNKEEPER_TEST_PGBOUNCER``); with
    ``--through-pgbouncer`` the suite's URL is the pooler's. Afterwards the
    pooler is gone with the server and its folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_TEST_PG")}
    script = str(HERE / "with_postgres.py")
    runs = [
        subprocess.run(
            [sys.executable, script, *flag, sys.executable, "-c", HARNESS_PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        for flag in ([], ["--through-pgbouncer"])
    ]
    assert [r.returncode for r in runs] == [3, 3], [r.stderr for r in runs]
    plain, through = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    pg, direct, bouncer = plain["env"].values()
    assert pg == direct and bouncer.endswith("&port=6432")
    assert list(plain["pooled"].values()) == [False, False, True]
    pg, direct, bouncer = through["env"].values()
    assert pg == bouncer != direct
    assert list(through["pooled"].values()) == [True, False, True]
    for found in (plain, through):
        assert not os.path.exists(found["folder"])
        with pytest.raises(ProcessLookupError):
            os.kill(found["pid"], 0)
