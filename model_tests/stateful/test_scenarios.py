"""The issue's named scenarios, each a test, on real threads and real files."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from datetime import UTC, datetime

import pytest
from conftest import BACKENDS, forge, new_pg_schema

import turnkeeper
from turnkeeper import EntryKind, InvalidInputError, LeaseLostError, SessionModifiedError


def user(text: str) -> dict:
    return {"message": {"role": "user", "content": text}}


def test_two_writers_same_stale_leaf_exactly_one_wins(real_store):
    real_store.sessions.create("s")
    root = real_store.sessions.append("s", EntryKind.MESSAGE, user("root"))
    for round_ in range(5):
        leaf = real_store.sessions.get("s").leaf_id
        barrier = threading.Barrier(2)
        results: list[object] = []

        def writer(
            name: str,
            leaf: str = leaf,
            barrier: threading.Barrier = barrier,
            results: list = results,
        ) -> None:
            barrier.wait()
            try:
                results.append(
                    real_store.sessions.append(
                        "s", EntryKind.MESSAGE, user(name), expected_leaf=leaf
                    )
                )
            except SessionModifiedError as exc:
                results.append(exc)

        threads = [threading.Thread(target=writer, args=(f"w{i}-{round_}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wins = [r for r in results if not isinstance(r, Exception)]
        losses = [r for r in results if isinstance(r, SessionModifiedError)]
        assert len(wins) == 1 and len(losses) == 1
        children = [e for e in real_store.sessions.entries("s") if e.parent_id == leaf]
        assert [c.id for c in children] == [wins[0].id]
    assert root.parent_id is None


def test_lost_lease_writer_reaching_the_database_first_is_still_refused(store, clock):
    store.sessions.create("s")
    stale = store.leases.acquire("session:s", "slow", 1)
    clock.advance(1)  # expired, and nobody has taken it over yet
    with pytest.raises(LeaseLostError):
        store.sessions.append("s", EntryKind.MESSAGE, user("stale first"), lease=stale)
    fresh = store.leases.acquire("session:s", "fast", 5)
    store.sessions.append("s", EntryKind.MESSAGE, user("fresh"), lease=fresh)
    with pytest.raises(LeaseLostError):
        store.sessions.append("s", EntryKind.MESSAGE, user("stale again"), lease=stale)
    assert [e.payload["message"]["content"] for e in store.sessions.entries("s")] == ["fresh"]
    assert [e.lease_epoch for e in store.sessions.entries("s")] == [2]


def test_25_threads_create_if_absent_then_append_on_a_new_file(tmp_path):
    store = turnkeeper.open_store(str(tmp_path / "fresh.duckdb"))
    errors: list[BaseException] = []
    barrier = threading.Barrier(25)

    def worker(i: int) -> None:
        try:
            barrier.wait()
            with contextlib.suppress(turnkeeper.SessionIDExistsError):
                store.sessions.create("shared")
            store.sessions.append("shared", EntryKind.MESSAGE, user(f"t{i}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(25)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        entries = store.sessions.entries("shared")
        assert len(entries) == 25
        assert sorted(e.payload["message"]["content"] for e in entries) == sorted(
            f"t{i}" for i in range(25)
        )
        # one chain: every append went under the previous leaf
        assert [e.parent_id for e in entries[1:]] == [e.id for e in entries[:-1]]
    finally:
        store.close()


def test_create_then_append_at_once_keeps_microseconds_and_zones(real_store):
    for i in range(20):
        sid = f"s{i}"
        real_store.sessions.create(sid)
        ts = datetime.now(UTC)
        e = real_store.sessions.append(sid, EntryKind.MESSAGE, user("x"), timestamp=ts)
        assert e.timestamp == ts and e.timestamp.microsecond == ts.microsecond
        auto = real_store.sessions.append(sid, EntryKind.MESSAGE, user("y"))
        assert auto.timestamp.tzinfo is not None
        assert real_store.sessions.entries(sid)[1].timestamp == auto.timestamp


def test_release_by_a_non_holder_changes_nothing(store):
    mine = store.leases.acquire("t", "a", 10)
    before = store.query("SELECT * FROM leases").to_pylist()
    other = turnkeeper.Lease("t", "b", "guess", mine.epoch, mine.purpose, mine.expires_at)
    assert store.leases.release(other) is False
    assert store.query("SELECT * FROM leases").to_pylist() == before


def test_nul_is_stored_intact_and_lone_surrogate_refused(store):
    store.sessions.create("s")
    e = store.sessions.append("s", EntryKind.MESSAGE, user("a\x00b"))
    assert (
        store.sessions.entries("s")[0].payload["message"]["content"]
        == "a\x00b"
        == e.payload["message"]["content"]
    )
    store.sessions.set_title("s", "t\x00itle")
    assert store.sessions.get("s").title == "t\x00itle"
    with pytest.raises(InvalidInputError):
        store.sessions.append("s", EntryKind.MESSAGE, user("bad \ud800"))
    with pytest.raises(InvalidInputError):
        store.sessions.create("x\udfff")
    assert (
        len(store.sessions.entries("s")) == 2
        and store.sessions.get("x\udfff".encode("utf-8", "replace").decode()) is None
    )


def test_identical_timestamps_replay_in_append_order(store):
    store.sessions.create("s")
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    ids = [
        store.sessions.append("s", EntryKind.MESSAGE, user(f"m{i}"), timestamp=ts).id
        for i in range(30)
    ]
    assert list(store.sessions.replay("s").entry_ids) == ids
    assert [e.id for e in store.sessions.entries("s")] == ids


def test_second_process_gets_a_clear_error_naming_the_file(tmp_path):
    path = tmp_path / "held.duckdb"
    store = turnkeeper.open_store(str(path))
    try:
        code = (
            "import sys, turnkeeper\n"
            "try:\n"
            f"    turnkeeper.open_store({str(path)!r})\n"
            "except turnkeeper.StoreLockedError as e:\n"
            "    print(e.path); sys.exit(3)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 3, out.stderr
        assert out.stdout.strip() == str(path)
    finally:
        store.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_newer_schema_is_refused_naming_both_versions(backend, tmp_path):
    """A store a newer turnkeeper migrated is refused on either backend, and the
    refusal changes nothing: the data and the newer version stay."""
    where = str(tmp_path / "future.duckdb") if backend == "duckdb" else new_pg_schema()
    store = turnkeeper.open_store(where)
    store.sessions.create("kept")
    forge(store, "INSERT INTO schema_migrations VALUES (999, now())", rows=1)
    store.close()
    with pytest.raises(turnkeeper.SchemaVersionError) as err:
        turnkeeper.open_store(where)
    assert (err.value.found, err.value.supported) == (999, turnkeeper.SCHEMA_VERSION)
    forge_back = "DELETE FROM schema_migrations WHERE version = 999"
    if backend == "duckdb":
        import duckdb

        con = duckdb.connect(where)
        assert con.execute("SELECT count(*) FROM sessions").fetchone() == (1,)
        assert con.execute(forge_back).fetchone() == (1,)
        con.close()
    else:
        import psycopg

        with psycopg.connect(where, autocommit=True) as con:
            assert con.execute("SELECT count(*) FROM sessions").fetchone() == (1,)
            assert con.execute(forge_back).rowcount == 1
    with turnkeeper.open_store(where) as again:
        assert again.sessions.get("kept") is not None


CHILD = """
import sys, turnkeeper
store = turnkeeper.open_store(sys.argv[1])
try:
    store.sessions.create("crash")
except turnkeeper.SessionIDExistsError:
    pass
lease = store.leases.acquire("session:crash", "child", 60)
i = 0
while True:
    msg = {"message": {"role": "user", "content": f"m{i}"}}
    e = store.sessions.append("crash", "message", msg, lease=lease)
    print(e.id, flush=True)  # acknowledged only after commit returned
    i += 1
"""


def test_acknowledged_appends_survive_kill_9(tmp_path):
    path = tmp_path / "crash.duckdb"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    acked: list[str] = []
    assert proc.stdout is not None
    while len(acked) < 40:
        line = proc.stdout.readline()
        assert line, "child died early"
        acked.append(line.strip())
    proc.kill()  # SIGKILL: no rollback, no release, no checkpoint
    proc.wait()
    store = turnkeeper.open_store(str(path))
    try:
        stored = [e.id for e in store.sessions.entries("crash")]
        assert stored[: len(acked)] == acked  # every acknowledged write survived, in order
        # the dead child's lease is still held until it expires: nobody else may write
        with pytest.raises(turnkeeper.BusyError):
            store.leases.acquire("session:crash", "survivor", 5)
        chain = store.sessions.entries("crash")
        assert [e.parent_id for e in chain[1:]] == [e.id for e in chain[:-1]]
    finally:
        store.close()
