"""Reopening a DuckDB file in process (``storage/duck/files.py``, ``reopen``).

DuckDB invalidates a database after a fatal error (a checkpoint that met a
full disk: ``test_disk_full.py`` does that for real); the store then closes
the file's connection and connects again, for every store object on the
file. These tests call the reopen directly, on healthy files, to pin what it
must keep: every store object and thread goes on, the file stays locked
against other processes, a read cut by it runs again, a failure to reopen is
typed until it succeeds, and no caller's callback runs twice.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.spec import errors
from turnkeeper.storage.duck import db as duck_db
from turnkeeper.storage.duck import dialect, files

MSG = {"message": {"role": "user", "content": "x"}}

OPEN = "import sys, turnkeeper\ntry:\n    turnkeeper.open_store(sys.argv[1])\n" + (
    "except turnkeeper.StoreLockedError:\n    sys.exit(3)\n"
)


def _reopen(store: turnkeeper.BaseStore) -> None:
    shared = store.db._file  # type: ignore[attr-defined]
    files.reopen(shared, shared.generation)


def test_a_reopen_serves_every_store_object_and_keeps_the_file_locked(tmp_path: Path) -> None:
    path = str(tmp_path / "r.duckdb")
    a, b = turnkeeper.open_store(path), turnkeeper.open_store(path)
    a.sessions.create("s")
    ids = [a.sessions.append("s", EntryKind.MESSAGE, MSG).id]

    def on_a_thread() -> None:  # a thread with a cursor of its own from before the reopen
        ids.append(b.sessions.append("s", EntryKind.MESSAGE, MSG).id)

    worker = threading.Thread(target=on_a_thread)
    worker.start()
    worker.join()
    shared = a.db._file  # type: ignore[attr-defined]
    assert b.db._file is shared  # type: ignore[attr-defined]
    _reopen(a)
    assert shared.generation == 1 and shared.closed_by is None
    files.reopen(shared, 0)  # another call reopened it since generation 0: nothing to do
    assert shared.generation == 1
    worker = threading.Thread(target=on_a_thread)  # its old cursor was closed with the connection
    worker.start()
    worker.join()
    ids.append(a.sessions.append("s", EntryKind.MESSAGE, MSG).id)
    assert [e.id for e in b.sessions.entries("s")] == ids
    # the new connection holds the file's lock: another process is still refused
    done = subprocess.run([sys.executable, "-c", OPEN, path], capture_output=True, timeout=120)
    assert done.returncode == 3, done.stderr
    a.close()
    b.close()
    with turnkeeper.open_store(path) as again:
        assert [e.id for e in again.sessions.entries("s")] == ids


def test_a_read_whose_cursor_a_reopen_closed_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = turnkeeper.open_store(str(tmp_path / "r.duckdb"))
    store.sessions.create("s")
    ids = [store.sessions.append("s", EntryKind.MESSAGE, MSG).id for _ in range(3)]
    original = duck_db.Tx.rows
    cut: list[str] = []

    def rows(self: duck_db.Tx, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        if cut:
            return original(self, sql, params)
        cut.append(sql)
        result = self._execute(sql, params)  # the statement ran …
        _reopen(store)  # … and another thread's call reopened the file before the fetch
        return result.fetchall()

    monkeypatch.setattr(duck_db.Tx, "rows", rows)
    assert [e.id for e in store.sessions.entries("s")] == ids
    assert cut and store.db._file.generation == 1  # type: ignore[attr-defined]
    store.close()


def test_a_file_that_cannot_be_reopened_says_so_until_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "r.duckdb")
    store, other = turnkeeper.open_store(path), turnkeeper.open_store(path)
    store.sessions.create("s")
    ids = [store.sessions.append("s", EntryKind.MESSAGE, MSG).id]
    connect = files._connect

    def taken(*args: Any, **kwargs: Any) -> Any:  # another process took the file meanwhile
        raise errors.StoreLockedError(path, detail="another process has it open")

    monkeypatch.setattr(files, "_connect", taken)
    with pytest.raises(errors.StoreInvalidatedError) as err:
        _reopen(store)
    assert err.value.path == path and "StoreLockedError" in str(err.value)
    assert isinstance(err.value.__cause__, errors.StoreLockedError)
    for call in (
        lambda: store.sessions.entries("s"),
        lambda: other.sessions.append("s", EntryKind.MESSAGE, MSG),
        lambda: store.query("SELECT 1"),
        lambda: other.leases.renew(store.leases.acquire("t", "w", 30), 30),
    ):
        with pytest.raises(errors.StoreInvalidatedError) as err:  # each tries, and says why
            call()
        assert "reopening it failed" in str(err.value)
    monkeypatch.setattr(files, "_connect", connect)  # the file is free again
    ids.append(other.sessions.append("s", EntryKind.MESSAGE, MSG).id)  # this call reopens it
    assert [e.id for e in store.sessions.entries("s")] == ids
    monkeypatch.setattr(files, "_connect", taken)
    with pytest.raises(errors.StoreInvalidatedError):
        _reopen(store)
    other.close()  # not the last: nothing to checkpoint
    with pytest.raises(errors.CheckpointError) as closing:  # the last: the log keeps it all
        store.close()
    assert closing.value.path == path and "reopen" in str(closing.value)
    monkeypatch.setattr(files, "_connect", connect)
    with turnkeeper.open_store(path) as again:
        assert [e.id for e in again.sessions.entries("s")] == ids


def test_a_callback_given_rows_never_runs_twice_after_a_reopen(tmp_path: Path) -> None:
    store = turnkeeper.open_store(str(tmp_path / "r.duckdb"))
    store.sessions.create("s")
    calls: list[str] = []

    def consume(schema: Any, batches: Any) -> int:
        calls.append("consume")
        next(batches)
        # a call it made met an invalidated database (the store reopens it)
        raise errors.StoreInvalidatedError(store.path, detail="invalidated meanwhile")

    def body(snap: Any) -> Any:
        calls.append("body")
        snap.query("SELECT 1")
        raise errors.StoreInvalidatedError(store.path, detail="invalidated meanwhile")

    with pytest.raises(errors.StoreInvalidatedError):
        store.query_batches("SELECT * FROM range(10)", consume)
    with pytest.raises(errors.StoreInvalidatedError):
        store.snapshot(body)
    assert calls == ["consume", "body"]  # each once: what they did is theirs
    assert store.db._file.generation == 2  # type: ignore[attr-defined]
    assert store.sessions.get("s") is not None
    store.close()


@pytest.mark.parametrize(
    ("raised", "expected", "says"),
    [
        (
            duckdb.FatalException(
                "FATAL Error: Failed: database has been invalidated because of a previous "
                'fatal error.\nOriginal error: "Failed to create checkpoint because of error: '
                'Could not write file "x": No space left on device"'
            ),
            errors.StoreInvalidatedError,
            "reopens the file by itself",
        ),
        (
            duckdb.FatalException(
                "FATAL Error: Transaction COMMIT succeeded and is durable, but the "
                "autocheckpoint failed. Reopen the database instance to recover. Failed to "
                'create checkpoint because of error: Could not write file "x": No space left '
                "on device"
            ),
            errors.StoreInvalidatedError,
            "this write committed and is durable",
        ),
        (
            duckdb.FatalException(
                "FATAL Error: Failed to create checkpoint because of error: Could not write "
                'file "x": No space left on device'
            ),
            errors.DiskFullError,
            "this write was not committed",
        ),
        (
            duckdb.TransactionException(
                'TransactionContext Error: Failed to commit: Could not write file "x.wal": '
                "Disk quota exceeded"
            ),
            errors.DiskFullError,
            "a write was not committed",
        ),
        (
            duckdb.ConnectionException("Connection Error: Connection already closed!"),
            errors.StoreInvalidatedError,
            "reopens the file by itself",
        ),
    ],
)
def test_what_duckdb_says_of_a_failed_database_is_translated(
    raised: duckdb.Error, expected: type, says: str
) -> None:
    got = dialect.translate(raised, "/x.duckdb")
    assert type(got) is expected and got.path == "/x.duckdb"  # type: ignore[attr-defined]
    assert says in str(got)


def test_a_reopen_cut_short_by_ctrl_c_leaves_no_lock_and_the_next_call_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "r.duckdb")
    store = turnkeeper.open_store(path)
    store.sessions.create("s")
    ids = [store.sessions.append("s", EntryKind.MESSAGE, MSG).id]
    shared = store.db._file  # type: ignore[attr-defined]
    connect = files._connect

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(files, "_connect", connect)
        raise KeyboardInterrupt  # Ctrl-C between closing the old connection and the new one

    monkeypatch.setattr(files, "_connect", interrupted)
    with pytest.raises(KeyboardInterrupt):  # never wrapped
        _reopen(store)
    assert shared.closed_by is not None and shared.generation == 0
    locks = (shared.write_lock, *shared.targets.locks)
    assert not any(lock._is_owned() for lock in locks)  # type: ignore[attr-defined]
    got: list[Any] = []

    def on_a_thread() -> None:  # another thread: a lock left taken would block it
        got.append(store.sessions.append("s", EntryKind.MESSAGE, MSG).id)

    worker = threading.Thread(target=on_a_thread, daemon=True)
    worker.start()
    worker.join(120)  # a hang's guard only
    assert not worker.is_alive() and got, "the next call never reopened the file"
    assert shared.generation == 1 and shared.closed_by is None
    assert [e.id for e in store.sessions.entries("s")] == [*ids, *got]
    store.close()
