"""The native async store on PostgreSQL (issue 20: "on PostgreSQL it is
native: psycopg's async connection and pool"): ``turnkeeper.aio.open_store``
runs every operation of the one domain layer in a greenlet on the event loop
(``storage/bridge.py``, ``storage/postgres/native.py``, ``aio/native.py``).

Here: that it is native (every database call on the loop's thread, through
``psycopg.AsyncConnection``, no worker thread), the hazards of sync code on
one thread (each test hangs or fails without its fix: a harness timeout
turns a hang into a failure, nothing is timed), cancellation, other loops,
and a server killed and restarted under async calls. The conformance suite
runs over the native store too (conftest ``any_store``, ``through_aio.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import psycopg
import pytest
import with_postgres
from conftest import direct_for, listen_for, new_pg_schema, new_pooled_schema, pg_url
from test_postgres_lost_connections import ENTRIES, USER, assert_lost, cut_off
from test_postgres_reconnect import pg_ctl, restart_options

import turnkeeper
from turnkeeper import EntryKind, aio
from turnkeeper.aio.native import NativeRunner
from turnkeeper.storage import bridge
from turnkeeper.storage.postgres.native import NativeDatabase

pytestmark = pytest.mark.postgres

MESSAGE = {"message": {"role": "user", "content": "hello"}}

HANG_S = 120
"""A guard that turns a hang into a failure (a loaded 2-core machine); nothing is timed."""


def bounded(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """``asyncio.run(main())`` on a thread of its own; a failure if it has not
    ended within :data:`HANG_S` (a loop blocked by sync code cannot be
    interrupted from inside: ``asyncio.timeout`` would never fire)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(("ok", asyncio.run(main())))
        except BaseException as exc:  # re-raised below
            outcome.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True, name="test-loop")
    thread.start()
    thread.join(HANG_S)
    if thread.is_alive():
        pytest.fail(f"the event loop hung (still running after {HANG_S} s)")
    how, value = outcome[0]
    if how == "raised":
        raise value
    return value


def open_native(**kwargs: Any) -> aio.Opening:
    """``aio.open_store`` on a fresh schema (with the direct ``listen_url``
    wake-ups need through PgBouncer)."""
    url = new_pg_schema()
    listen = listen_for(url)
    return aio.open_store(url, **kwargs, **({} if listen is None else {"listen_url": listen}))


def test_every_database_call_runs_on_the_loop_through_async_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """400 concurrent operations (appends in 20 sessions, replays, listings,
    ledger appends, an analytics query): every statement goes through
    ``psycopg.AsyncConnection``/``AsyncCursor`` on the loop's thread, none
    through a sync connection, no ``turnkeeper-aio`` worker thread exists,
    and several operations were in flight at once on that one thread."""
    native_threads: list[int] = []
    sync_threads: list[int] = []
    measuring = threading.Event()

    def spy(cls: Any, name: str, into: list[int]) -> None:
        real = getattr(cls, name)

        def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
            if measuring.is_set():
                into.append(threading.get_ident())
            return real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, recorded)

    for cls, name in [
        (psycopg.AsyncConnection, "execute"),
        (psycopg.AsyncCursor, "execute"),
        (psycopg.AsyncCursor, "copy"),
        (psycopg.AsyncServerCursor, "execute"),
    ]:
        spy(cls, name, native_threads)
    for cls, name in [
        (psycopg.Connection, "execute"),
        (psycopg.Cursor, "execute"),
        (psycopg.Cursor, "copy"),
        (psycopg.ServerCursor, "execute"),
    ]:
        spy(cls, name, sync_threads)
    lent = 0
    most_lent = 0
    real_connection = NativeDatabase.connection

    def connection(self: NativeDatabase) -> Any:
        manager = real_connection(self)

        class Counted:
            def __enter__(self) -> Any:
                nonlocal lent, most_lent
                got = manager.__enter__()
                lent += 1
                most_lent = max(most_lent, lent)
                return got

            def __exit__(self, *exc: Any) -> Any:
                nonlocal lent
                lent -= 1
                return manager.__exit__(*exc)

        return Counted()

    monkeypatch.setattr(NativeDatabase, "connection", connection)

    async def main() -> tuple[int, list[str]]:
        async with open_native() as store:
            assert isinstance(store.runner, NativeRunner)
            measuring.set()
            loop_thread = threading.get_ident()
            for i in range(20):
                await store.sessions.create(f"s{i}")
            await store.sessions.create("L")
            lease = await store.leases.acquire("session:L", "w", ttl_s=60)
            writer = await store.ledger.open("L", lease)

            async def work(i: int) -> None:
                for j in range(15):
                    await store.sessions.append(f"s{i % 20}", EntryKind.MESSAGE, MESSAGE)
                    if i < 4:
                        await writer.append("note", f"{i}-{j}".encode(), f"{i}-{j}")
                await store.sessions.replay(f"s{i % 20}")
                await store.sessions.list()

            await asyncio.gather(*(work(i) for i in range(25)))
            table = await store.query("SELECT count(*) AS n FROM sessions")
            assert table.column("n").to_pylist() == [21]
            workers = [t.name for t in threading.enumerate() if t.name.startswith("turnkeeper-aio")]
            measuring.clear()
            await writer.close()
            return loop_thread, workers

    loop_thread, workers = bounded(main)
    assert native_threads, "no statement went through psycopg.AsyncConnection"
    assert set(native_threads) == {loop_thread}
    assert sync_threads == []
    assert workers == []
    assert most_lent > 1, "the operations never overlapped"


def test_a_call_outside_the_bridge_is_refused_typed_never_hangs() -> None:
    """The native store's sync areas called from a plain thread, and
    ``await_only`` outside a greenlet: ``InterfaceError`` at once."""

    async def main() -> None:
        async with open_native() as store:
            assert store.native_store is not None
            native = store.native_store
            with pytest.raises(turnkeeper.InterfaceError):
                await asyncio.to_thread(native.sessions.count)
            with pytest.raises(turnkeeper.InterfaceError):
                bridge.await_only(asyncio.sleep(0))
            assert await store.sessions.count() == 0  # the store is unharmed

    bounded(main)


# -- the lock audit: each hazard of sync code on one thread ---------------------------


def test_ledger_appends_of_many_writers_at_once_do_not_wait_for_a_group_leader() -> None:
    """Hazard: the ledger's group commit (``group.Batcher``) makes followers
    wait on a ``threading.Condition`` for a leader; greenlets share the loop's
    thread, so a waiting follower stops the loop the leader's I/O needs (a
    hang before the fix: inside the bridge each append commits itself)."""

    async def main() -> list[list[int]]:
        async with open_native() as store:
            writers = []
            for i in range(8):
                await store.sessions.create(f"s{i}")
                lease = await store.leases.acquire(f"session:s{i}", "w", ttl_s=60)
                writers.append(await store.ledger.open(f"s{i}", lease))

            async def appends(i: int) -> list[int]:
                return [(await writers[i].append("note", b"x", f"id{j}")).seq for j in range(10)]

            return await asyncio.gather(*(appends(i) for i in range(8)))

    found = bounded(main)
    assert all(seqs == sorted(seqs) and len(set(seqs)) == 10 for seqs in found)


def test_appends_on_one_ledger_writer_at_once_and_its_close_take_turns() -> None:
    """Hazard: a ledger writer holds its lock across the append's I/O; a
    second append (or its close) on the same writer waiting on a
    ``threading.Lock`` stops the loop the holder's I/O needs (a hang before
    the fix: the lock is ``bridge.Lock``, waited for on the loop)."""

    async def main() -> tuple[list[int], str]:
        async with open_native() as store:
            await store.sessions.create("s1")
            lease = await store.leases.acquire("session:s1", "w", ttl_s=60)
            writer = await store.ledger.open("s1", lease)
            results = await asyncio.gather(
                *(writer.append("note", f"{j}".encode(), f"id{j}") for j in range(12)),
                writer.close(),
                return_exceptions=True,
            )
            seqs = [r.seq for r in results[:-1] if not isinstance(r, BaseException)]
            refused = [r for r in results[:-1] if isinstance(r, BaseException)]
            assert all(isinstance(r, turnkeeper.InterfaceError) for r in refused)  # after close
            assert results[-1] is None
            return seqs, writer.state

    seqs, state = bounded(main)
    assert len(seqs) == len(set(seqs)) and state == "closed"


def _close_under_appends() -> tuple[list[Any], int]:
    """24 appends under way (8 running, the rest waiting for their turn) and a
    close: the appends' outcomes, and how many entries the session holds after."""
    sync = turnkeeper.open_store(new_pg_schema())

    async def main() -> list[Any]:
        store = await aio.AsyncStore.native(sync)
        await store.sessions.create("s1")
        appends = [
            asyncio.ensure_future(
                store.sessions.append("s1", EntryKind.MESSAGE, MESSAGE, entry_id=f"e{i}")
            )
            for i in range(24)
        ]
        await asyncio.sleep(0)  # they are under way
        await store.close()
        results = await asyncio.gather(*appends, return_exceptions=True)
        with pytest.raises(turnkeeper.InterfaceError):
            await store.sessions.count()
        return results

    try:
        results = bounded(main)
        return results, len(sync.sessions.entries("s1"))
    finally:
        sync.close()


def _refused_before_it_ran(outcome: Any) -> bool:
    return isinstance(outcome, turnkeeper.InterfaceError) and "async store is closed" in str(
        outcome
    )


def test_close_waits_for_the_operations_in_flight() -> None:
    """Hazard: the backend's gate counts operations per thread, and every
    greenlet runs on the loop's thread, so closing would not wait for them:
    the pool closed under the operations in flight. The runner drains them
    first: each append either committed (and returned) or was refused before
    it ran (``InterfaceError``: the store is closed), nothing else."""
    results, entries = _close_under_appends()
    done = [r for r in results if not isinstance(r, BaseException)]
    assert [
        r for r in results if isinstance(r, BaseException) and not _refused_before_it_ran(r)
    ] == []
    assert done and len(done) == entries


def test_control_without_the_drain_close_fails_the_operations_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test above with the runner's drain broken: operations in flight
    fail as the pool closes under them (what the drain prevents)."""

    async def no_drain(self: NativeRunner) -> None:
        return None

    monkeypatch.setattr(NativeRunner, "drain", no_drain)
    results, _ = _close_under_appends()
    assert [r for r in results if isinstance(r, BaseException) and not _refused_before_it_ran(r)]


def test_a_retry_waits_on_the_loop_not_with_time_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hazard: ``run_attempts`` waited between attempts with tenacity's
    ``time.sleep``, which inside a greenlet stops the loop. A native
    operation that loses races twice: both waits are ``asyncio.sleep`` on
    the loop (``bridge.sleep``), and it then succeeds."""
    from turnkeeper.storage.backend import Conflict

    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(seconds: float, *args: Any) -> Any:
        waits.append(seconds)
        return await real_sleep(seconds, *args)

    async def main() -> int:
        async with open_native() as store:
            assert store.native_store is not None
            db = store.native_store.db
            attempts = 0

            def body(tx: Any) -> int:
                nonlocal attempts
                attempts += 1
                tx.exec("SELECT 1")
                if attempts < 3:
                    raise Conflict("a lost race (forged)")
                return attempts

            monkeypatch.setattr(asyncio, "sleep", recorded)
            try:
                return await store.runner(db.write, "forged_conflict", body)
            finally:
                monkeypatch.setattr(asyncio, "sleep", real_sleep)

    assert bounded(main) == 3
    assert len(waits) == 2 and all(w > 0 for w in waits), waits


def test_blob_files_are_written_and_read_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocking I/O that is not the database's: a ledger offloading to an
    fsspec directory (``FsspecBlobs``, files and fsync) puts, gets and lists
    its blobs on worker threads (``bridge.off_loop``), never on the loop's
    thread, inside the native operation."""
    from turnkeeper.storage.ops.ledger.blob_files import FsspecBlobs

    seen: dict[str, set[int]] = {}
    for name in ("put", "get", "list"):
        real = getattr(FsspecBlobs, name)

        def spied(self: Any, *args: Any, _real: Any = real, _name: str = name) -> Any:
            seen.setdefault(_name, set()).add(threading.get_ident())
            return _real(self, *args)

        monkeypatch.setattr(FsspecBlobs, name, spied)

    async def main() -> tuple[int, list[bytes]]:
        async with open_native() as store:
            ledger = store.ledger.with_blobs(
                FsspecBlobs(str(tmp_path / "blobs")), offload_threshold=8
            )
            await store.sessions.create("s1")
            lease = await store.leases.acquire("session:s1", "w", ttl_s=60)
            async with await ledger.open("s1", lease) as writer:
                for i in range(3):
                    await writer.append(
                        "note", b"a payload longer than eight bytes %d" % i, f"i{i}"
                    )
            payloads = [r.payload async for r in ledger.replay("s1")]
            await ledger.gc("s1", lease)
            return threading.get_ident(), payloads

    loop_thread, payloads = bounded(main)
    assert payloads[-3:] == [b"a payload longer than eight bytes %d" % i for i in range(3)]
    assert seen.get("put") and seen.get("get") and seen.get("list"), seen
    assert all(loop_thread not in threads for threads in seen.values()), seen


# -- cancellation, other loops, wake-ups -------------------------------------------------


def _gated_append(at_commit: bool) -> Any:
    """An append held (until the returned gate opens) in its body, or just
    before its ``COMMIT`` is sent; the caller is cancelled there. Returns
    ``(what came out of the call, whether the entry is stored)``."""

    async def main() -> tuple[str, bool]:
        async with open_native() as store:
            assert store.native_store is not None
            await store.sessions.create("s1")
            db = store.native_store.db
            real_write = db.write
            entered = asyncio.Event()
            gate = asyncio.Event()

            def write(operation: str, body: Any, **kwargs: Any) -> Any:
                if not operation.startswith("append"):
                    return real_write(operation, body, **kwargs)

                def held(tx: Any) -> Any:
                    result = body(tx)
                    real_exec = tx.exec

                    def exec_(sql: str, params: Any = ()) -> None:
                        if "COMMIT" in sql:
                            entered.set()
                            bridge.await_only(gate.wait())  # the cancel lands here
                        real_exec(sql, params)

                    if at_commit:
                        tx.exec = exec_
                    else:
                        entered.set()
                        bridge.await_only(gate.wait())  # the cancel lands here
                    return result

                return real_write(operation, held, **kwargs)

            db.write = write  # type: ignore[method-assign]
            task = asyncio.create_task(
                store.sessions.append("s1", EntryKind.MESSAGE, MESSAGE, entry_id="e1")
            )
            await entered.wait()
            task.cancel()
            if at_commit:  # past its point of no return: the call waits for it
                asyncio.get_running_loop().call_later(0.05, gate.set)
            try:
                await task
                came = "returned"
            except asyncio.CancelledError as cancelled:
                came = type(cancelled).__name__
            gate.set()
            db.write = real_write  # type: ignore[method-assign]
            return came, await store.sessions.entry("s1", "e1") is not None

    return bounded(main)


def test_a_call_cancelled_before_its_commit_ends_at_once_and_writes_nothing() -> None:
    """Cancelled in its body (the gate never opens while it runs): the
    operation is cancelled where it awaits, its transaction rolls back, and
    ``CancelledError`` (never wrapped) comes at once (before: the call waited
    for the operation however long it took; a harness timeout makes that a
    failure)."""
    assert _gated_append(at_commit=False) == ("CancelledError", False)


def test_a_call_cancelled_at_its_commit_ends_after_it_committed() -> None:
    """Cancelled as its ``COMMIT`` is about to go (past its point of no return,
    ``bridge.committing``): ``CancelledError`` comes only once the transaction
    committed, and the entry is there."""
    assert _gated_append(at_commit=True) == ("CancelledError", True)


def test_control_without_the_commit_mark_a_cancel_at_the_commit_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mark is what holds the cancel back at the ``COMMIT``: without it the
    same cancel lands there and the append is rolled back (so the test above
    can fail)."""
    monkeypatch.setattr(bridge, "committing", lambda on=True: contextlib.nullcontext())
    assert _gated_append(at_commit=True) == ("CancelledError", False)


def _two_transactions(sticky: bool, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One operation of two write transactions (two session creates), its
    caller cancelled between them: the sessions stored afterwards."""
    if not sticky:  # the mark lifted again after its block (test-only)

        @contextlib.contextmanager
        def passing(on: bool = True) -> Any:
            current = bridge.greenlet.getcurrent()
            before = getattr(current, "committing", False)
            if on and bridge.in_bridge():
                current.committing = True
            try:
                yield
            finally:
                if bridge.in_bridge():
                    current.committing = before

        monkeypatch.setattr(bridge, "committing", passing)

    async def main() -> list[str]:
        async with open_native() as store:
            assert store.native_store is not None
            domain = store.native_store
            between = asyncio.Event()
            gate = asyncio.Event()

            def two() -> None:
                domain.sessions.create("a")
                between.set()
                bridge.await_only(gate.wait())  # the cancel lands here
                domain.sessions.create("b")

            task = asyncio.create_task(store.runner(two))
            await between.wait()
            task.cancel()
            asyncio.get_running_loop().call_later(0.05, gate.set)
            with contextlib.suppress(asyncio.CancelledError):
                await task
            gate.set()
            return sorted(s.id for s in (await store.sessions.list()).sessions)

    return list(bounded(main))


def test_an_operation_past_its_first_commit_is_never_cut_before_its_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The point of no return stays passed: an operation of two transactions
    whose caller is cancelled between them runs to its end (both stored),
    never left half-done. The control lifts the mark after each commit: the
    same cancel then cuts it between the two."""
    assert _two_transactions(True, monkeypatch) == ["a", "b"]
    assert _two_transactions(False, monkeypatch) == ["a"]


def test_a_call_cancelled_while_its_statement_waits_for_a_lock_ends_at_once() -> None:
    """Another session holds ``entries`` locked: an append waits on the server.
    Cancelled, psycopg cancels the statement on the server and the call ends
    while the lock is still held (before: it waited for the lock, then
    committed after the caller's timeout), writing nothing."""
    url = new_pg_schema()

    async def main() -> tuple[bool, bool]:
        listen = listen_for(url)
        async with aio.open_store(
            url, **({} if listen is None else {"listen_url": listen})
        ) as store:
            await store.sessions.create("s1")
            holder = await psycopg.AsyncConnection.connect(direct_for(url))
            try:
                await holder.execute("BEGIN")
                await holder.execute("LOCK TABLE entries IN ACCESS EXCLUSIVE MODE")
                task = asyncio.create_task(
                    store.sessions.append("s1", EntryKind.MESSAGE, MESSAGE, entry_id="e1")
                )
                while True:  # until the append waits for the lock on the server
                    cur = await holder.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND pid <> pg_backend_pid()"
                    )
                    row = await cur.fetchone()
                    if row is not None and row[0] > 0:
                        break
                    await asyncio.sleep(0.05)
                task.cancel()
                done, _ = await asyncio.wait([task], timeout=HANG_S / 2)
                ended_under_the_lock = task in done
                await holder.execute("ROLLBACK")
            finally:
                await holder.close()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return ended_under_the_lock, await store.sessions.entry("s1", "e1") is None

    assert bounded(main) == (True, True)


def test_a_call_cancelled_while_it_waits_for_its_turn_never_runs() -> None:
    """One operation at a time, the first held inside its operation: a
    second call cancelled while it queues writes nothing."""

    async def main() -> tuple[bool, int]:
        async with open_native(workers=1) as store:
            assert store.native_store is not None
            await store.sessions.create("s1")
            db = store.native_store.db
            real_write = db.write
            entered = asyncio.Event()
            gate = asyncio.Event()

            def write(operation: str, body: Any, **kwargs: Any) -> Any:
                def held(tx: Any) -> Any:
                    entered.set()
                    bridge.await_only(gate.wait())
                    return body(tx)

                return real_write(operation, held, **kwargs)

            db.write = write  # type: ignore[method-assign]
            first = asyncio.create_task(store.sessions.append("s1", EntryKind.MESSAGE, MESSAGE))
            await entered.wait()
            db.write = real_write  # type: ignore[method-assign]
            queued = asyncio.create_task(
                store.sessions.append("s1", EntryKind.MESSAGE, MESSAGE, entry_id="queued")
            )
            await asyncio.sleep(0.01)
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            gate.set()
            await first
            return (
                await store.sessions.entry("s1", "queued") is None,
                len(await store.sessions.entries("s1")),
            )

    assert bounded(main) == (True, 1)


def test_a_call_from_another_running_loop_runs_on_the_home_loop() -> None:
    """The store's home loop runs on a thread; two other loops on other
    threads call it at once: their operations run on the home loop and all
    complete. Once the home loop stopped, a call raises ``InterfaceError``
    naming it, at once."""
    home = asyncio.new_event_loop()
    home_thread = threading.Thread(target=home.run_forever, daemon=True)
    home_thread.start()
    try:
        store = asyncio.run_coroutine_threadsafe(open_native(), home).result(HANG_S)
        results: dict[str, Any] = {}

        def loop_body(tag: str) -> None:
            async def main() -> list[Any]:
                return await asyncio.gather(
                    *(store.sessions.create(f"{tag}{i}") for i in range(10)),
                    return_exceptions=True,
                )

            results[tag] = bounded(main)

        threads = [threading.Thread(target=loop_body, args=(t,)) for t in "AB"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for tag in "AB":
            assert [r for r in results[tag] if isinstance(r, BaseException)] == [], tag

        async def count() -> int:
            return await store.sessions.count()

        assert bounded(count) == 20
        home.call_soon_threadsafe(home.stop)
        home_thread.join(HANG_S)
        with pytest.raises(turnkeeper.InterfaceError) as refused:
            bounded(count)
        assert "no longer runs" in str(refused.value)
        home_thread = threading.Thread(target=home.run_forever, daemon=True)
        home_thread.start()  # again, to close the store where its pool lives
        asyncio.run_coroutine_threadsafe(store.close(), home).result(HANG_S)
    finally:
        if home.is_running():
            home.call_soon_threadsafe(home.stop)
            home_thread.join(HANG_S)
        home.close()


def test_a_call_from_another_loop_cancelled_while_it_waits_for_its_turn_never_runs() -> None:
    """The home loop on a thread with one worker, held inside an operation; a
    call from another loop, cancelled while it queues there, raises
    ``CancelledError`` and writes nothing (before: the cancel was not passed
    on, and the call ran once the worker was free)."""
    home = asyncio.new_event_loop()
    home_thread = threading.Thread(target=home.run_forever, daemon=True)
    home_thread.start()
    try:
        store = asyncio.run_coroutine_threadsafe(open_native(workers=1), home).result(HANG_S)
        assert store.native_store is not None
        asyncio.run_coroutine_threadsafe(store.sessions.create("s1"), home).result(HANG_S)
        db = store.native_store.db
        real_write = db.write
        entered = threading.Event()
        gate = asyncio.Event()  # (set on the home loop)

        def write(operation: str, body: Any, **kwargs: Any) -> Any:
            def held(tx: Any) -> Any:
                entered.set()
                bridge.await_only(gate.wait())
                return body(tx)

            return real_write(operation, held, **kwargs)

        db.write = write  # type: ignore[method-assign]
        first = asyncio.run_coroutine_threadsafe(
            store.sessions.append("s1", EntryKind.MESSAGE, MESSAGE, entry_id="first"), home
        )
        assert entered.wait(HANG_S)
        db.write = real_write  # type: ignore[method-assign]

        async def caller() -> str:
            task = asyncio.create_task(
                store.sessions.append("s1", EntryKind.MESSAGE, MESSAGE, entry_id="queued")
            )
            await asyncio.sleep(0.2)  # handed to the home loop, queued there
            task.cancel()
            try:
                await task
            except asyncio.CancelledError as cancelled:
                return type(cancelled).__name__
            return "returned"

        came = bounded(caller)
        home.call_soon_threadsafe(gate.set)
        first.result(HANG_S)

        async def queued() -> bool:
            return await store.sessions.entry("s1", "queued") is None

        assert (came, asyncio.run_coroutine_threadsafe(queued(), home).result(HANG_S)) == (
            "CancelledError",
            True,
        )
        asyncio.run_coroutine_threadsafe(store.close(), home).result(HANG_S)
    finally:
        home.call_soon_threadsafe(home.stop)
        home_thread.join(HANG_S)
        home.close()


def test_a_call_whose_home_loop_stops_under_it_is_refused_typed_never_hangs() -> None:
    """A call from another loop is running on the home loop when that loop
    stops: the caller gets ``InterfaceError`` (outcome unknown), not a hang."""
    home = asyncio.new_event_loop()
    home_thread = threading.Thread(target=home.run_forever, daemon=True)
    home_thread.start()
    try:
        store = asyncio.run_coroutine_threadsafe(open_native(), home).result(HANG_S)
        assert store.native_store is not None
        db = store.native_store.db
        real_write = db.write
        entered = threading.Event()
        gate = asyncio.Event()

        def write(operation: str, body: Any, **kwargs: Any) -> Any:
            def held(tx: Any) -> Any:
                entered.set()
                bridge.await_only(gate.wait())
                return body(tx)

            return real_write(operation, held, **kwargs)

        db.write = write  # type: ignore[method-assign]

        def stop_home() -> None:
            entered.wait(HANG_S)
            home.call_soon_threadsafe(home.stop)

        stopper = threading.Thread(target=stop_home, daemon=True)
        stopper.start()

        async def create() -> Any:
            return await store.sessions.create("x")

        with pytest.raises(turnkeeper.InterfaceError) as refused:
            bounded(create)
        assert "stopped while this call's operation ran" in str(refused.value)
        stopper.join(HANG_S)
        home_thread.join(HANG_S)
        db.write = real_write  # type: ignore[method-assign]
        home_thread = threading.Thread(target=home.run_forever, daemon=True)
        home_thread.start()  # again: the held operation ends, and the store closes there
        home.call_soon_threadsafe(gate.set)
        asyncio.run_coroutine_threadsafe(store.close(), home).result(HANG_S)
    finally:
        if home.is_running():
            home.call_soon_threadsafe(home.stop)
            home_thread.join(HANG_S)
        home.close()


def test_wake_ups_of_a_native_store_come_from_listen_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``LISTEN`` natively: the wake-ups come as an async iterator, from an
    ``AsyncConnection``'s ``notifies()`` read on the loop's thread (behind
    PgBouncer on the direct ``listen_url``), with no listener thread."""
    read_on: list[int] = []
    real_notifies = psycopg.AsyncConnection.notifies

    def notifies(self: Any, *args: Any, **kwargs: Any) -> Any:
        read_on.append(threading.get_ident())
        return real_notifies(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "notifies", notifies)

    async def main() -> tuple[list[Any], list[str], int]:
        async with open_native() as store:
            await store.sessions.create("s1")
            got: list[Any] = []
            async with await store.subscribe("lease_released") as sub:
                lease = await store.leases.acquire("session:s1", "w1", ttl_s=30)
                await store.leases.release(lease)
                async for fired in sub:
                    got.append(fired)
                    break
                listeners = [t.name for t in threading.enumerate() if "listen" in t.name]
            return got, listeners, threading.get_ident()

    got, listeners, loop_thread = bounded(main)
    assert got == [[turnkeeper.Topic.LEASE_RELEASED]]
    assert listeners == []
    assert read_on and set(read_on) == {loop_thread}


def test_lease_tokens_are_shared_with_the_sync_twin() -> None:
    """``store.sync`` (the sync twin) accepts the native store's lease tokens and back."""

    async def main() -> int:
        async with open_native() as store:
            await store.sessions.create("s1")
            lease = await store.leases.acquire("session:s1", "w1", ttl_s=30)
            renewed = await asyncio.to_thread(store.sync.leases.renew, lease, 30)
            await store.leases.release(renewed)
            return renewed.epoch

    assert bounded(main) >= 1


@pytest.fixture(params=["direct", "pgbouncer"])
def lost_url(request: pytest.FixtureRequest) -> str:
    """A fresh schema's URL: on the server itself, or through PgBouncer."""
    if request.param == "direct":
        return direct_for(new_pg_schema())
    return new_pooled_schema()[0]


@pytest.mark.parametrize("moment", ["copy_start", "statement"])
def test_a_connection_lost_in_a_native_operation_is_operational_error_then_calls_succeed(
    lost_url: str, moment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A native operation's server connection terminated mid-transaction (a
    ``COPY`` about to start, or a statement after it; directly and through
    PgBouncer): the error is translated as the sync store's
    (``OperationalError``, nothing written, psycopg's exception as its cause),
    and the next operation gets another connection and succeeds."""
    from turnkeeper.storage.postgres import db as pg_db

    real_insert = pg_db.Tx.insert_rows
    cut: list[bool] = []

    def insert_rows(tx: Any, *args: Any) -> None:
        if not cut:  # the first COPY only
            cut.append(True)
            cut_off(tx.conn)
            if moment == "statement":
                tx.exec("SELECT 1")
        real_insert(tx, *args)

    async def main() -> list[str]:
        async with aio.open_store(lost_url) as store:
            await store.sessions.create("s")
            run = await store.runs.admit("s", {"q": 1}, user_message=USER, start=True)
            before = await store.sessions.entries("s")

            def finish() -> Coroutine[Any, Any, Any]:
                return store.runs.finish(
                    run.id,
                    "succeeded",
                    entries=ENTRIES,
                    assistant_message={"role": "assistant", "content": "ok"},
                )

            monkeypatch.setattr(pg_db.Tx, "insert_rows", insert_rows)
            with pytest.raises(turnkeeper.TurnkeeperError) as err:
                await finish()
            assert_lost(err.value)
            assert await store.sessions.entries("s") == before
            await finish()
            return [r.status for r in await store.runs.list("s")]

    assert bounded(main) == ["succeeded"]


def test_analytics_reads_stream_natively() -> None:
    """``query``, ``snapshot`` and ``query_batches`` (a server-side
    ``AsyncServerCursor``) on the native store: the rows of text with U+0000
    come back exactly, each snapshot read sees one state."""

    async def main() -> tuple[list[str], list[int], int]:
        async with open_native() as store:
            for sid, cwd in (("a", "/a\x00z"), ("b", "/b"), ("c", "/c")):
                await store.sessions.create(sid, cwd=cwd)
            table = await store.query("SELECT cwd FROM sessions ORDER BY id")

            def consume(schema: Any, batches: Any) -> int:
                return sum(batch.num_rows for batch in batches)

            streamed = await store.query_batches("SELECT id FROM sessions", consume)

            def body(snap: Any) -> list[int]:
                return [
                    snap.query("SELECT count(*) AS n FROM sessions").column("n").to_pylist()[0]
                    for _ in range(2)
                ]

            return table.column("cwd").to_pylist(), await store.snapshot(body), streamed

    ids, counts, streamed = bounded(main)
    assert ids == ["/a\x00z", "/b", "/c"]
    assert counts == [3, 3] and streamed == 3


def test_a_server_error_translates_as_on_the_sync_store() -> None:
    """The same bad query on the native store and on its sync twin: the same
    class and words (``faults.translate``, shared)."""

    async def main() -> tuple[BaseException, BaseException]:
        async with open_native() as store:
            with pytest.raises(turnkeeper.TurnkeeperError) as native:
                await store.query("SELECT * FROM no_such_table")
            with pytest.raises(turnkeeper.TurnkeeperError) as sync:
                await asyncio.to_thread(store.sync.query, "SELECT * FROM no_such_table")
            return native.value, sync.value

    native, sync = bounded(main)
    assert type(native) is type(sync) is turnkeeper.ProgrammingError
    assert str(native) == str(sync)


# -- a server killed and started again under async calls ----------------------------------


@pytest.mark.own_servers
def test_a_server_killed_under_async_calls_gives_operational_error_then_calls_succeed() -> None:
    """A private server stopped with ``-m immediate`` while async calls run:
    each call either succeeded or raised ``OperationalError`` (typed, no
    other error, no hang); once it is started again, the next calls succeed."""
    pg_url()  # skip (fail in CI) where the suite has no PostgreSQL
    bin_ = with_postgres.bindir()
    if bin_ is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed")
    folder = Path(tempfile.mkdtemp(prefix="turnkeeper-native-kill-"))
    try:
        url = with_postgres.start(bin_, folder, durable=True)

        async def main() -> tuple[list[Any], int]:
            async with aio.open_store(url, pool_timeout_s=3) as store:
                await store.sessions.create("s1")
                stop = asyncio.Event()

                async def writer(i: int) -> list[Any]:
                    outcomes: list[Any] = []
                    j = 0
                    while not stop.is_set():
                        j += 1
                        try:
                            await store.sessions.append(
                                "s1", EntryKind.MESSAGE, MESSAGE, entry_id=f"w{i}-{j}"
                            )
                            outcomes.append("ok")
                        except Exception as exc:  # judged below
                            outcomes.append(exc)
                    return outcomes

                tasks = [asyncio.create_task(writer(i)) for i in range(6)]
                await asyncio.sleep(0.2)
                await asyncio.to_thread(pg_ctl, bin_, folder, "-m", "immediate", "-w", "stop")
                await asyncio.sleep(1.0)  # calls meet the dead server (nothing is timed)
                stop.set()
                during = [o for t in tasks for o in await t]
                await asyncio.to_thread(pg_ctl, bin_, folder, *restart_options(folder))
                await store.sessions.create("after")
                for _ in range(5):
                    await store.sessions.append("after", EntryKind.MESSAGE, MESSAGE)
                return during, len((await store.sessions.replay("after")).entry_ids)

        during, after = bounded(main)
        failures = [o for o in during if o != "ok"]
        assert failures, "no call met the dead server"
        assert all(isinstance(f, turnkeeper.OperationalError) for f in failures), failures
        assert after == 5
    finally:
        import subprocess

        subprocess.run(
            [str(bin_ / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate", "-w", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=folder,
            **with_postgres.server_user(),
        )
        shutil.rmtree(folder, ignore_errors=True)
