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
    store.create_session(sid)
    run = store.admit_run(sid, {"q": 1}, user_message=USER, start=True)
    return lambda: store.finish_run(
        run.id,
        "succeeded",
        entries=ENTRIES,
        assistant_message={"role": "assistant", "content": "ok"},
    )


def assert_finished(store: turnkeeper.BaseStore, sid: str) -> None:
    """Session ``sid``'s run succeeded, with the entries its finish wrote."""
    assert [r.status for r in store.session_runs(sid)] == ["succeeded"]
    custom = [e.payload for e in store.entries(sid) if e.kind == "custom"]
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
        before = store.entries("s")
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
        assert store.entries("s") == before  # nothing of the finish was written
        assert store.get_run(store.active_run("s").id).status == "running"  # type: ignore[union-attr]
        finish()  # the next operation gets another connection
        assert_finished(store, "s")


def test_a_connection_lost_during_a_streamed_query_is_an_operational_error(url, patch_once):
    """``store.query()`` streams from a server-side cursor: through PgBouncer a
    connection lost before its FETCH raised ``InternalError: received 2
    results from command 'FETCH …'`` ("the backend reported an internal
    fault")."""
    from turnkeeper.storage.postgres import query as pg_query

    with turnkeeper.open_store(url) as store:
        store.create_session("s")
        patch_once(pg_query, "batches", lambda cur, *rest: cut_off(cur.connection))
        with pytest.raises(turnkeeper.TurnkeeperError) as err:
            store.query("SELECT id FROM sessions")
        assert_lost(err.value)
        assert store.query("SELECT id FROM sessions").column("id").to_pylist() == ["s"]


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
        before = store.entries("s")
        monkeypatch.setattr(psycopg.Copy, "finish", finish)
        with pytest.raises(turnkeeper.TurnkeeperError) as err:
            run_finish()
        assert type(err.value) is turnkeeper.InternalError, repr(err.value)
        assert isinstance(err.value.__cause__, ValueError)
        assert "nothing of it was written" in str(err.value)
        assert store.entries("s") == before
        run_finish()
        assert_finished(store, "s")
