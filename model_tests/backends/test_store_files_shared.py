"""One DuckDB connection per file per process, and files that are not turnkeeper's.

Every store object on a file (under any path that names it: a hard link too)
shares one connection, one write-ahead log and one write lock; only the last
one to close checkpoints. A file in another format, another tool's
``schema_migrations``, a truncated or corrupt file, and an empty file left by
a failed open each get a typed error that says what happened.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import duckdb
import pytest

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.spec import errors
from turnkeeper.storage.duck import files

MSG = {"message": {"role": "user", "content": "x"}}


def _store_file(path: Path, sessions: int = 1) -> None:
    with turnkeeper.open_store(path) as s:
        for i in range(sessions):
            s.sessions.create(f"s{i}")
            s.sessions.append(f"s{i}", EntryKind.MESSAGE, MSG)


def test_a_hard_link_names_the_same_store_and_loses_no_write(tmp_path):
    a_path = tmp_path / "a.duckdb"
    _store_file(a_path)
    b_path = tmp_path / "b.duckdb"
    os.link(a_path, b_path)
    a, b = turnkeeper.open_store(a_path), turnkeeper.open_store(b_path)
    for i in range(50):
        a.sessions.append("s0", EntryKind.MESSAGE, MSG)
        b.sessions.create(f"b{i}")
    assert b.sessions.entries("s0") == a.sessions.entries("s0")  # one database, seen through both
    a.close()
    b.close()
    with turnkeeper.open_store(a_path) as again:
        assert len(again.sessions.entries("s0")) == 51
        assert again.sessions.count() == 51


def test_closing_one_store_object_beside_another_ones_writes_raises_nothing(tmp_path):
    path = tmp_path / "two.duckdb"
    _store_file(path)
    a, b = turnkeeper.open_store(path), turnkeeper.open_store(path)
    stop = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            while not stop.is_set():
                b.sessions.append("s0", EntryKind.MESSAGE, MSG)
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        a.close()  # the file stays open for b: no checkpoint, no CheckpointError
    finally:
        stop.set()
        writer.join(60)
    assert failures == []
    written = len(b.sessions.entries("s0"))
    b.close()  # the last one checkpoints
    assert not os.path.exists(f"{path}.wal") or os.path.getsize(f"{path}.wal") == 0
    with turnkeeper.open_store(path) as again:
        assert len(again.sessions.entries("s0")) == written


def test_a_read_only_store_beside_a_writable_one_reads_and_refuses_writes(tmp_path):
    path = tmp_path / "rw.duckdb"
    _store_file(path)
    with turnkeeper.open_store(path) as rw, turnkeeper.open_store(path, read_only=True) as ro:
        rw.sessions.append("s0", EntryKind.MESSAGE, MSG)
        assert len(ro.sessions.entries("s0")) == 2
        with pytest.raises(errors.ReadOnlyError):
            ro.sessions.append("s0", EntryKind.MESSAGE, MSG)
    with turnkeeper.open_store(path, read_only=True) as ro:
        with pytest.raises(errors.StoreLockedError) as err:
            turnkeeper.open_store(path)
        assert "read-only" in str(err.value)
        assert len(ro.sessions.entries("s0")) == 2


def test_a_sqlite_file_is_foreign_and_untouched(tmp_path):
    path = tmp_path / "app.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    before = path.read_bytes()
    for read_only in (False, True):
        with pytest.raises(errors.ForeignDatabaseError) as err:
            turnkeeper.open_store(path, read_only=read_only)
        assert "not a DuckDB database" in str(err.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "ddl",
    [
        "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, dirty BOOLEAN)",
        "CREATE TABLE schema_migrations (version VARCHAR PRIMARY KEY)",
        "CREATE TABLE schema_migrations (version INTEGER)",
    ],
    ids=["golang-migrate", "rails", "one-column"],
)
def test_another_tools_schema_migrations_is_foreign(tmp_path, ddl):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute(ddl)
    if "dirty" in ddl:
        con.execute("INSERT INTO schema_migrations VALUES (20240101, false)")
    con.close()
    for read_only in (False, True):
        with pytest.raises(errors.ForeignDatabaseError) as err:
            turnkeeper.open_store(path, read_only=read_only)
        assert "another tool" in str(err.value)
    con = duckdb.connect(str(path))
    assert [r[0] for r in con.execute("SHOW TABLES").fetchall()] == ["schema_migrations"]
    con.close()


def test_a_truncated_store_file_is_corrupt(tmp_path):
    path = tmp_path / "cut.duckdb"
    _store_file(path, sessions=200)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(errors.CorruptDatabaseError) as err, turnkeeper.open_store(path) as s:
        s.sessions.list(limit=1000)
        s.sessions.entries("s199")
    assert "backup" in str(err.value)


def test_an_empty_file_left_behind_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "empty.duckdb"
    path.write_bytes(b"")
    with pytest.raises(errors.ForeignDatabaseError) as err:
        turnkeeper.open_store(path)
    assert "empty" in str(err.value) and "delete" in str(err.value)


def test_a_failed_first_open_leaves_no_empty_file(tmp_path, monkeypatch):
    """A full disk: DuckDB created the file and failed; the next open must not
    find an empty file that blocks it."""
    path = tmp_path / "new.duckdb"

    def full_disk(where, read_only=False):
        Path(where).write_bytes(b"")
        raise duckdb.IOException("No space left on device")

    monkeypatch.setattr(files.duckdb, "connect", full_disk)
    with pytest.raises(errors.OperationalError):
        turnkeeper.open_store(path)
    assert not path.exists()
    monkeypatch.undo()
    with turnkeeper.open_store(path) as s:
        assert s.schema_version() == turnkeeper.SCHEMA_VERSION


def test_a_heartbeat_renewal_never_waits_behind_a_long_write(tmp_path):
    """A lease renewal (one statement on its own lease row) skips the write lock:
    it completes while another thread's write transaction is still open."""
    with turnkeeper.open_store(tmp_path / "hb.duckdb") as store:
        store.sessions.create("hb")
        lease = store.leases.acquire("session:hb", "w", 30)
        inside, release = threading.Event(), threading.Event()

        def long_write(tx):
            tx.exec("SELECT 1")
            inside.set()
            assert release.wait(60)

        writer = threading.Thread(target=lambda: store.db.write("long", long_write))
        writer.start()
        try:
            assert inside.wait(60)
            renewed = store.leases.renew(lease, 30)  # would block on the lock
            assert renewed.epoch == lease.epoch
            store.leases.validate(renewed)
        finally:
            release.set()
            writer.join(60)


def test_psycopg_is_imported_only_for_postgres():
    """The embedded default needs no PostgreSQL driver (the extra is optional)."""
    import subprocess
    import sys

    code = (
        "import sys, turnkeeper\n"
        "turnkeeper.open_store(':memory:').close()\n"
        "print('psycopg' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


_OTHER_PROCESS = (
    "import sys, turnkeeper\n"
    "try:\n"
    "    s = turnkeeper.open_store(sys.argv[1]); s.sessions.create('other'); s.close()\n"
    "    print('acknowledged')\n"
    "except turnkeeper.StoreLockedError:\n"
    "    print('locked')\n"
)


def _other_process_opens(path: Path) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def test_a_second_store_object_on_a_file_keeps_other_processes_out(tmp_path):
    """Attack helper: opening a second store object on a file read its header
    (check_file) with open() and close(), and closing any descriptor of a file
    drops every POSIX lock the process holds on it, DuckDB's too: another
    process then opened the file, wrote, was acknowledged, and its write was
    lost. The header is read only when this process does not have the file."""
    path = tmp_path / "l.duckdb"
    turnkeeper.open_store(str(path)).close()
    with turnkeeper.open_store(str(path)) as a, turnkeeper.open_store(str(path)):
        assert _other_process_opens(path) == "locked"
        a.sessions.create("mine")
    with turnkeeper.open_store(str(path)) as c:
        assert [s.id for s in c.sessions.list().sessions] == ["mine"]


def test_an_open_cancelled_once_the_file_is_open_leaves_it_to_the_next_close(tmp_path, monkeypatch):
    """Attack helper: a Ctrl-C landing after the file was opened and its store
    object counted, before the object was whole, left the file open in this
    process for good (later store objects' close() neither checkpointed nor
    closed it)."""
    from turnkeeper.storage import retry

    path = tmp_path / "o.duckdb"
    turnkeeper.open_store(str(path)).close()

    def landing(self: object) -> None:
        raise KeyboardInterrupt("as the store object was built")

    monkeypatch.setattr(retry.Gate, "__init__", landing)
    with pytest.raises(KeyboardInterrupt):
        turnkeeper.open_store(str(path))
    monkeypatch.undo()
    assert not files._FILES  # let go of at once
    with turnkeeper.open_store(str(path)) as s:
        s.sessions.create("x")
    assert not files._FILES
    assert _other_process_opens(path) == "acknowledged"
