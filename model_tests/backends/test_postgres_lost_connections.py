"""A connection lost in the middle of an operation, on the server and through PgBouncer.

psycopg expects one result per statement. A server connection terminated in
the middle of a transaction answers directly with one error (``terminating
connection due to administrator command``); through PgBouncer the client
hears two, the server's and PgBouncer's own (``server conn crashed?``), and
psycopg then failed on its own terms: ``ValueError: too many values to
unpack`` at the end of a ``COPY``, ``ProgrammingError: COPY cannot be mixed
with other operations`` at its start, ``InternalError: received 2 results``
from a server-side cursor's ``FETCH``. Each is a lost connection: the
store says so (``OperationalError``, the original as ``__cause__``), nothing
of the operation is written, and the next operation runs on another
connection.

Each test terminates the server process at a chosen moment (a hook in the
operation, ``pg_terminate_backend`` from a connection of its own) and waits
until the store's connection has heard of it, so the moment is the same in
every run.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from conftest import direct_for, direct_url, new_pg_schema, new_pooled_schema

import turnkeeper
from turnkeeper import EntryKind

pytestmark = pytest.mark.postgres

TIMEOUT_S = 120
"""A guard against hangs only (a loaded 2-core machine)."""

ENTRIES = [(EntryKind.CUSTOM, {"customType": "n", "data": {"i": i}}) for i in range(3)]
USER = {"role": "user", "content": "go"}


@pytest.fixture(params=["direct", "pgbouncer"])
def url(request: pytest.FixtureRequest) -> str:
    """A fresh schema's URL: on the server itself, or through PgBouncer."""
    if request.param == "direct":
        return direct_for(new_pg_schema())
    return new_pooled_schema()[0]


def server_pid(conn: psycopg.Connection[Any]) -> int:
    """The server process ``conn``'s transaction runs on (through PgBouncer: the
    server connection it was lent)."""
    return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]


def cut_off(conn: psycopg.Connection[Any], pid: int | None = None) -> None:
    """Terminate server process ``pid`` (by default the one ``conn`` is on) and
    wait until ``conn`` has heard of it (its socket has something to read)."""
    pid = server_pid(conn) if pid is None else pid
    with psycopg.connect(direct_url(), autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN)
    assert poller.poll(TIMEOUT_S * 1000), "the terminated connection heard nothing"


def assert_lost(err: BaseException) -> None:
    """``err`` says the connection was lost and nothing was written, with
    psycopg's own exception (not a wrapper of ours) as its cause."""
    assert type(err) is turnkeeper.OperationalError, repr(err)
    assert "connection to the server was lost" in str(err)
    assert "nothing of it was written" in str(err)
    cause = err.__cause__
    assert cause is not None and type(cause).__module__.split(".")[0] in ("psycopg", "builtins")


def finish_with_entries(store: turnkeeper.BaseStore, sid: str) -> Callable[[], Any]:
    """A running run in session ``sid``, and the call that finishes it with
    entries (written with one ``COPY``)."""
    store.sessions.create(sid)
    run = store.runs.admit(sid, {"q": 1}, user_message=USER, start=True)
    return lambda: store.runs.finish(
        run.id,
        "succeeded",
        entries=ENTRIES,
        assistant_message={"role": "assistant", "content": "ok"},
    )


def assert_finished(store: turnkeeper.BaseStore, sid: str) -> None:
    """Session ``sid``'s run succeeded, with the entries its finish wrote."""
    assert [r.status for r in store.runs.list(sid)] == ["succeeded"]
    custom = [e.payload for e in store.sessions.entries(sid) if e.kind == "custom"]
    assert custom == [p for _, p in ENTRIES]


@pytest.fixture
def patch_once(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """``patch_once(owner, name, before)``: ``owner.name`` calls ``before(*args)``
    the first time, then itself."""

    def patch(owner: Any, name: str, before: Callable[..., None]) -> None:
        real = getattr(owner, name)
        fired = threading.Event()

        def hooked(*args: Any, **kwargs: Any) -> Any:
            if not fired.is_set():
                fired.set()
                before(*args)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, hooked)

    yield patch


@pytest.mark.parametrize("moment", ["copy_start", "copy_end", "statement"])
def test_a_connection_lost_during_a_bulk_write_is_an_operational_error(url, moment, patch_once):
    """finish_run with entries COPYs them: through PgBouncer a connection lost
    as the COPY ended raised a bare ``ValueError: too many values to unpack
    (expected 1)``, and one lost as it started ``ProgrammingError: COPY cannot
    be mixed with other operations`` (a "schema or SQL fault")."""
    from turnkeeper.storage.postgres import db as pg_db

    with turnkeeper.open_store(url) as store:
        finish = finish_with_entries(store, "s")
        before = store.sessions.entries("s")
        pids: list[int] = []

        def before_copy(tx: Any, *args: Any) -> None:
            if moment == "copy_end":  # cut off once the COPY has begun
                pids.append(server_pid(tx.conn))
                return
            cut_off(tx.conn)
            if moment == "statement":
                tx.exec("SELECT 1")

        patch_once(pg_db.Tx, "insert_rows", before_copy)
        if moment == "copy_end":
            patch_once(
                psycopg.Copy, "write_row", lambda copy, row: cut_off(copy.connection, pids[0])
            )
        with pytest.raises(turnkeeper.TurnkeeperError) as err:
            finish()
        assert_lost(err.value)
        assert store.sessions.entries("s") == before  # nothing of the finish was written
        assert store.runs.get(store.runs.active("s").id).status == "running"  # type: ignore[union-attr]
        finish()  # the next operation gets another connection
        assert_finished(store, "s")


def test_a_connection_lost_during_a_streamed_query_is_an_operational_error(url, patch_once):
    """``store.query()`` streams from a server-side cursor: through PgBouncer a
    connection lost before its FETCH raised ``InternalError: received 2
    results from command 'FETCH …'`` ("the backend reported an internal
    fault")."""
    from turnkeeper.storage.postgres import query as pg_query

    with turnkeeper.open_store(url) as store:
        store.sessions.create("s")
        patch_once(pg_query, "batches", lambda cur, *rest: cut_off(cur.connection))
        with pytest.raises(turnkeeper.TurnkeeperError) as err:
            store.query("SELECT id FROM sessions")
        assert_lost(err.value)
        assert store.query("SELECT id FROM sessions").column("id").to_pylist() == ["s"]


def test_a_connection_lost_in_a_pinned_autocommit_statement_is_an_operational_error(
    monkeypatch,
):
    """Through a transaction pooler an autocommit statement goes in one pipeline
    with the search_path pin (``connect.pinned``): the server connection cut
    off after the pin ran and before the statement (the one-statement append)
    is a lost connection, typed, its outcome said to be unknown (an autocommit
    write's statement is its commit); the next append works."""
    from turnkeeper.storage.postgres import connect

    pooled, _ = new_pooled_schema()
    role = pooled.split("postgresql://", 1)[1].split("@", 1)[0]
    real, cut = psycopg.Connection.execute, threading.Event()

    def execute(conn: psycopg.Connection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        cur = real(conn, query, *args, **kwargs)
        if query == connect.PIN_SQL and cut.is_set():
            cut.clear()
            with psycopg.connect(direct_url(), autocommit=True) as admin:
                pid, deadline = None, time.monotonic() + TIMEOUT_S
                while pid is None:  # the pin's server process (it has the pin's text)
                    assert time.monotonic() < deadline, "the pin never reached the server"
                    row = admin.execute(
                        "SELECT pid FROM pg_stat_activity WHERE usename = %s AND query = %s",
                        [role, connect.PIN_SQL.replace("%s", "$1")],
                    ).fetchone()
                    pid = None if row is None else row[0]
            cut_off(conn, pid)
        return cur

    with turnkeeper.open_store(pooled) as store:
        store.sessions.create("s")
        monkeypatch.setattr(psycopg.Connection, "execute", execute)
        cut.set()
        with pytest.raises(turnkeeper.TurnkeeperError) as err:
            store.sessions.append("s", EntryKind.MESSAGE, {"message": USER})
        assert not cut.is_set()  # it was cut off there
        assert type(err.value) is turnkeeper.OperationalError, repr(err.value)
        assert "whether it took effect is unknown" in str(err.value)
        assert store.sessions.entries("s") == []
        store.sessions.append("s", EntryKind.MESSAGE, {"message": USER})
        assert [e.payload for e in store.sessions.entries("s")] == [{"message": USER}]


def test_a_driver_fault_on_a_live_connection_is_typed_and_the_connection_is_dropped(
    url, monkeypatch
):
    """An exception psycopg raises that is not one of its errors, the
    connection still there: ``InternalError`` (the original as ``__cause__``),
    nothing written, and the connection, its protocol state unknown (here:
    inside a COPY that never ended), is closed rather than lent again, so the
    next operation works."""
    real, failed = psycopg.Copy.finish, threading.Event()

    def finish(copy: psycopg.Copy, exc: BaseException | None) -> None:
        if failed.is_set():
            return real(copy, exc)
        failed.set()
        raise ValueError("too many values to unpack (expected 1)")

    with turnkeeper.open_store(url) as store:
        run_finish = finish_with_entries(store, "s")
        before = store.sessions.entries("s")
        monkeypatch.setattr(psycopg.Copy, "finish", finish)
        with pytest.raises(turnkeeper.TurnkeeperError) as err:
            run_finish()
        assert type(err.value) is turnkeeper.InternalError, repr(err.value)
        assert isinstance(err.value.__cause__, ValueError)
        assert "nothing of it was written" in str(err.value)
        assert store.sessions.entries("s") == before
        run_finish()
        assert_finished(store, "s")


# -- the other psycopg paths: the pool's check, wake-ups --------------------------


def test_a_pool_check_failing_with_a_driver_fault_checks_every_other_connection(monkeypatch):
    """The pool's check of a connection before a lend: one that fails makes the
    pool check every other idle connection at once (after a restart they are
    all dead). It did so only for a psycopg error; a check failing with any
    other exception (which psycopg_pool also takes as a failed check) left
    the others to be found one backoff at a time."""
    from psycopg_pool import ConnectionPool

    from turnkeeper.storage.postgres import pool as pg_pool

    real, checked_all, failed = ConnectionPool.check_connection, [], threading.Event()

    def check(conn: Any) -> None:
        if not failed.is_set():
            failed.set()
            raise AssertionError("a driver fault in the check")
        real(conn)

    with turnkeeper.open_store(new_pg_schema()) as store:
        store.sessions.create("s")
        monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(check))
        monkeypatch.setattr(pg_pool, "IDLE_CHECK_S", 0.0)  # every lend checks
        monkeypatch.setattr(store.db._pool, "check", lambda: checked_all.append(True))  # type: ignore[attr-defined]
        assert store.sessions.get("s") is not None
        assert failed.is_set() and checked_all == [True]


def test_a_wake_up_that_fails_after_the_commit_never_fails_the_write(monkeypatch):
    """The wake-ups go out after the COMMIT: a failure sending them must not
    make a committed write look failed. A psycopg error was ignored; any
    other exception (a driver fault) reached the caller of the committed
    finish_run."""
    real = psycopg.Connection.execute

    def execute(conn: psycopg.Connection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(query, str) and query.startswith("SELECT pg_notify"):
            raise ValueError("a driver fault while notifying")
        return real(conn, query, *args, **kwargs)

    with turnkeeper.open_store(new_pg_schema()) as store:
        finish = finish_with_entries(store, "s")
        monkeypatch.setattr(psycopg.Connection, "execute", execute)
        finish()
        monkeypatch.undo()
        assert store.runs.get(store.runs.list("s")[0].id).status == "succeeded"


def test_the_listener_survives_a_driver_fault_and_wakes_its_waiters(monkeypatch):
    """The listener thread reconnected after a psycopg error only: any other
    exception from its connection ended the thread, and the store object was
    deaf from then on without a word. Now it reconnects and fires every
    topic once (what was sent meanwhile is lost), and hears later wake-ups."""
    real, failed = psycopg.Connection.notifies, threading.Event()

    def notifies(conn: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> Any:
        if not failed.is_set():
            failed.set()
            raise ValueError("a driver fault while listening")
        return real(conn, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "notifies", notifies)
    # the server itself (LISTEN), also when the suite runs through PgBouncer
    with turnkeeper.open_store(direct_for(new_pg_schema())) as store:
        sub = store.subscribe("run_ended")
        assert failed.wait(TIMEOUT_S)
        assert sub.wait(TIMEOUT_S) == [turnkeeper.Topic.RUN_ENDED]  # look again
        finish_with_entries(store, "s")()
        deadline = time.monotonic() + TIMEOUT_S
        heard: list[turnkeeper.Topic] = []
        while not heard and time.monotonic() < deadline:
            heard = sub.wait(1.0)
        assert heard == [turnkeeper.Topic.RUN_ENDED]
