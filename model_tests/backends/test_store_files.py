"""Opening and closing a store file: each way it can fail is a typed error that says
what happened and what the user can do, with DuckDB's exception as ``__cause__``."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import forge

import turnkeeper
from turnkeeper import EntryKind, FinalizeRequest, ThreadRecord
from turnkeeper.spec import errors

MSG = {"message": {"role": "user", "content": "x"}}


def roundtrip(exc: errors.TurnkeeperError) -> None:
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc) and str(copy) == str(exc)


# -- paths that hold no database ---------------------------------------------------------


def test_a_read_only_open_of_a_missing_file_says_it_is_not_there(tmp_path: Path) -> None:
    missing = tmp_path / "missing.duckdb"
    with pytest.raises(errors.StoreNotFoundError) as err:
        turnkeeper.open_store(str(missing), read_only=True)
    assert not isinstance(err.value, errors.ReadOnlyError)
    assert isinstance(err.value, errors.OperationalError)
    assert err.value.path == str(missing)
    assert "writes" not in str(err.value)
    assert not missing.exists()
    roundtrip(err.value)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_directory_is_not_a_usable_path(tmp_path: Path, read_only: bool) -> None:
    with pytest.raises(errors.InvalidInputError) as err:
        turnkeeper.open_store(str(tmp_path), read_only=read_only)
    assert err.value.field == "path" and "directory" in err.value.reason


def test_a_path_in_a_missing_folder_is_not_a_usable_path(tmp_path: Path) -> None:
    target = tmp_path / "no-such-folder" / "x.duckdb"
    with pytest.raises(errors.InvalidInputError) as err:
        turnkeeper.open_store(str(target))
    assert err.value.field == "path" and "folder" in err.value.reason
    assert str(target.parent) in err.value.reason
    with pytest.raises(errors.StoreNotFoundError):
        turnkeeper.open_store(str(target), read_only=True)
    assert not target.parent.exists()


# -- files that are not (this) turnkeeper's --------------------------------------------------


@pytest.mark.parametrize("read_only", [False, True])
def test_a_foreign_duckdb_file_is_not_a_turnkeeper_database(
    tmp_path: Path, read_only: bool
) -> None:
    path = tmp_path / "other-app.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE invoices (id INTEGER)")
    con.close()
    with pytest.raises(errors.ForeignDatabaseError) as err:
        turnkeeper.open_store(str(path), read_only=read_only)
    text = str(err.value)
    assert "not a turnkeeper database" in text
    assert "newer" not in text and "found=" not in text
    assert err.value.path == str(path)
    roundtrip(err.value)
    con = duckdb.connect(str(path), read_only=True)  # untouched
    try:
        assert con.execute("SELECT table_name FROM duckdb_tables()").fetchall() == [("invoices",)]
    finally:
        con.close()


@pytest.mark.parametrize("read_only", [False, True])
def test_a_file_that_is_not_a_duckdb_database_is_refused_as_such(
    tmp_path: Path, read_only: bool
) -> None:
    path = tmp_path / "notes.duckdb"
    path.write_text("these are my notes\n" * 300)
    with pytest.raises(errors.ForeignDatabaseError) as err:
        turnkeeper.open_store(str(path), read_only=read_only)
    assert "not a DuckDB database" in str(err.value)
    assert err.value.__cause__ is None  # refused by its header, before DuckDB read it
    assert path.read_text() == "these are my notes\n" * 300


def test_schema_version_errors_say_which_way_the_versions_differ(tmp_path: Path) -> None:
    path = str(tmp_path / "future.duckdb")
    store = turnkeeper.open_store(path)
    forge(store, "INSERT INTO schema_migrations VALUES (999, now())", rows=1)
    store.close()
    for read_only in (False, True):
        with pytest.raises(errors.SchemaVersionError) as err:
            turnkeeper.open_store(path, read_only=read_only)
        assert "newer" in str(err.value) and "upgrade turnkeeper" in str(err.value)
    blank = str(tmp_path / "blank.duckdb")
    duckdb.connect(blank).close()
    with pytest.raises(errors.SchemaVersionError) as err:
        turnkeeper.open_store(blank, read_only=True)
    assert err.value.found == 0 and "newer" not in str(err.value)
    assert "writable" in str(err.value)


# -- lease epochs a BIGINT cannot hold ---------------------------------------------------------


def _lease_calls() -> dict[str, Any]:
    def finalize(s: Any, lease: Any) -> Any:
        return s.threads.finalize(FinalizeRequest(ThreadRecord("r", key="k"), held_leases=[lease]))

    return {
        "renew_lease": lambda s, lease: s.leases.renew(lease, 5),
        "release_lease": lambda s, lease: s.leases.release(lease),
        "validate_lease": lambda s, lease: s.leases.validate(lease),
        "append": lambda s, lease: s.sessions.append("e", EntryKind.MESSAGE, MSG, lease=lease),
        "branch": lambda s, lease: s.sessions.branch("e", None, lease=lease),
        "finalize": finalize,
        "admit_run": lambda s, lease: s.runs.admit("e", {"q": 1}, lease=lease),
        "begin_recovery": lambda s, lease: s.recovery.begin("some-run", lease),
    }


LEASE_CALLS = _lease_calls()


@pytest.mark.parametrize("call", sorted(LEASE_CALLS))
@pytest.mark.parametrize("epoch", [2**63, 2**70])
def test_a_lease_epoch_past_a_bigint_is_refused_in_validation(store, call, epoch) -> None:
    store.sessions.create("e")
    held = store.leases.acquire("session:e", "w", 30, purpose="execution")
    huge = replace(held, epoch=epoch)
    with pytest.raises(errors.InvalidInputError) as err:
        LEASE_CALLS[call](store, huge)
    assert err.value.field.endswith("epoch"), err.value
    assert store.sessions.entries("e") == []
    store.leases.validate(held)  # the real lease is untouched


def test_an_expected_version_past_a_bigint_is_refused_in_validation(store) -> None:
    store.sessions.create("v")
    state = turnkeeper.ResponseState("v", previous_response_id="r1")
    with pytest.raises(errors.InvalidInputError) as err:
        store.lineage.compare_and_swap(state, 2**70)
    assert err.value.field == "expected_version"


# -- close ------------------------------------------------------------------------------------


class _CheckpointFails:
    """Wraps a DuckDB connection: ``CHECKPOINT`` fails as on a full disk, the rest
    goes to the real connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.strip().upper().endswith("CHECKPOINT"):
            raise duckdb.IOException('Could not write file "x": No space left on device')
        return self._con.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


def test_close_raises_when_its_checkpoint_fails_and_loses_no_write(tmp_path: Path) -> None:
    path = str(tmp_path / "full.duckdb")
    store = turnkeeper.open_store(path)
    store.sessions.create("c")
    entry = store.sessions.append("c", EntryKind.MESSAGE, MSG)
    store.db._con = _CheckpointFails(store.db._con)  # type: ignore[assignment]
    with pytest.raises(errors.CheckpointError) as err:
        store.close()
    assert err.value.path == path
    assert isinstance(err.value.__cause__, duckdb.IOException)
    assert ".wal" in str(err.value)
    roundtrip(err.value)
    with pytest.raises(errors.InterfaceError):  # closed all the same
        store.sessions.entries("c")
    store.close()  # idempotent, and raises nothing the second time
    with turnkeeper.open_store(path) as again:  # the file lock is released; the WAL replays
        assert [e.id for e in again.sessions.entries("c")] == [entry.id]


def test_a_clean_close_checkpoints_the_wal_into_the_file(tmp_path: Path) -> None:
    path = tmp_path / "clean.duckdb"
    with turnkeeper.open_store(str(path)) as store:
        store.sessions.create("c")
        store.sessions.append("c", EntryKind.MESSAGE, MSG)
    assert not Path(f"{path}.wal").exists()


def test_a_failed_checkpoint_on_exit_does_not_hide_the_error_that_ended_the_block(
    tmp_path: Path,
) -> None:
    with pytest.raises(KeyError) as err, turnkeeper.open_store(str(tmp_path / "x.duckdb")) as s:
        s.sessions.create("c")
        s.db._con = _CheckpointFails(s.db._con)  # type: ignore[assignment]
        raise KeyError("the caller's own error")
    assert any("CheckpointError" in note for note in err.value.__notes__)


# -- a corrupt write-ahead log -------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, sys, turnkeeper
    turnkeeper.open_store(sys.argv[1]).close()  # the schema, checkpointed into the file
    store = turnkeeper.open_store(sys.argv[1])
    store.sessions.create("w")
    for i in range(20):
        store.sessions.append("w", "message", {"message": {"role": "user", "content": f"m{i}"}})
    os._exit(0)  # no close, no checkpoint: the writes are in the .wal only
""")


def test_a_corrupt_wal_says_what_happened_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "crashed.duckdb"
    subprocess.run([sys.executable, "-c", CHILD, str(path)], check=True, timeout=120)
    wal = Path(f"{path}.wal")
    assert wal.stat().st_size > 0
    data = bytearray(wal.read_bytes())
    data[-1] ^= 0x01  # one flipped bit in the last entry's checksum
    wal.write_bytes(bytes(data))
    for read_only in (False, True):
        with pytest.raises(errors.CorruptDatabaseError) as err:
            turnkeeper.open_store(str(path), read_only=read_only)
        text = str(err.value)
        assert err.value.path == str(path) and err.value.file == str(wal)
        assert "write-ahead log" in text and "corrupt" in text
        assert "backup" in text and "move" in text and "lost" in text
        assert isinstance(err.value.__cause__, duckdb.Error)
        roundtrip(err.value)
    assert wal.read_bytes() == bytes(data)  # nothing was changed or moved for the user
    os.rename(wal, f"{wal}.corrupt")  # what the message suggests: the last checkpoint opens
    with turnkeeper.open_store(str(path), read_only=True) as store:
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
        assert store.sessions.get("w") is None  # written after the last checkpoint: lost


def _held_at_version(
    backend: str, version: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Where a store of ``backend`` opened now stops at schema ``version``
    (its migrations patched to the first ``version``; ``monkeypatch.undo()``
    lets the next open run the rest)."""
    from conftest import new_pg_schema
    from older_stores import written_by_now

    from turnkeeper.storage.duck import db as duck_db
    from turnkeeper.storage.ops import replay_snapshots, session_rows

    # what that version's turnkeeper wrote: no deleted ids (version 16) to consult
    # when it took a session id (the API writes the old store's rows here)
    monkeypatch.setattr(session_rows, "TAKEN", "SELECT 1 FROM sessions WHERE id = ? AND id = ?")
    # and no stored replays (version 29) to read or keep
    monkeypatch.setattr(
        replay_snapshots,
        "head",
        lambda tx, session_id, with_first: (
            None
            if (row := tx.one("SELECT leaf_id, next_seq FROM sessions WHERE id = ?", [session_id]))
            is None
            else (row[0], row[1], None)
        ),
    )
    monkeypatch.setattr(replay_snapshots, "store", lambda db, session_id, pending: None)

    def held(migrations: list[tuple[int, str]]) -> list[tuple[int, str]]:
        # and entries with the clear facts (version 33) every entry insert names
        return written_by_now(migrations, version)

    if backend == "postgres":
        from turnkeeper.storage.postgres import db as pg_db

        old = pg_db.Database.migrations
        monkeypatch.setattr(pg_db.Database, "migrations", lambda self: held(old(self)))
        return new_pg_schema()
    monkeypatch.setattr(duck_db.Database, "migrations", lambda self: held(duck_db.MIGRATIONS))
    return str(tmp_path / f"v{version}.duckdb")


_INDEX = re.compile(r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:IF NOT EXISTS\s+)?(\w+)", re.I)


def _indexes_after(version: int, backend: str) -> set[str]:
    """The indexes ``backend``'s later schema versions create, which a test of
    ``version``'s indexes leaves aside."""
    from turnkeeper.storage.migrations import load

    sqls = load(f"turnkeeper.storage.{'duck' if backend == 'duckdb' else 'postgres'}")
    return {name for v, sql in sqls if v > version for name in _INDEX.findall(sql)}


def _old_session(store: turnkeeper.BaseStore, sid: str) -> None:
    """Session ``sid`` as an older turnkeeper created it: its row in the columns
    every version has (today's create writes later versions' columns too)."""
    forge(
        store,
        "INSERT INTO sessions (id, cwd, created_at, updated_at, leaf_id, title, "
        "entry_count, next_seq, header) VALUES (?, '', now(), now(), NULL, NULL, 0, 1, '{}')",
        [sid],
        rows=1,
    )


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_migration_9_stores_each_runs_model_on_the_run(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store at schema version 8 (runs without ``model``) opened by this
    turnkeeper: version 9 adds the column and fills it from each run's intent."""
    where = _held_at_version(backend, 8, tmp_path, monkeypatch)
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == 8
        _old_session(store, "s")
        forge(
            store,
            "INSERT INTO execution_intents VALUES "
            "('i1', 's', '', 'model-a', '', '', 'f', '{}', '{}', now())",
            rows=1,
        )
        forge(
            store,
            "INSERT INTO runs (id, session_id, intent_id, retry_of, attempt, status, "
            "cancel_requested, error, lease_epoch, started_at, updated_at, finished_at) "
            "VALUES ('r1', 's', 'i1', NULL, 1, 'failed', FALSE, 'x', NULL, now(), now(), now())",
            rows=1,
        )
    monkeypatch.undo()
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
        assert store.query("SELECT model FROM runs").column(0).to_pylist() == ["model-a"]
        run = store.runs.admit("s", {"q": 2}, model="model-b")
        found = store.query("SELECT model FROM runs WHERE id = ?", [run.id])
        assert found.column(0).to_pylist() == ["model-b"]


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_migration_10_keeps_each_sessions_event_cursor(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store at schema version 9 (no per-session event cursor) opened by this
    turnkeeper: version 10 sets each session's cursor to its last run event, so
    the session's next events continue its numbering, without gaps or a seq
    taken twice, and another session's longer history changes nothing."""
    where = _held_at_version(backend, 9, tmp_path, monkeypatch)
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == 9
        for sid, count in (("s", 3), ("t", 7)):
            _old_session(store, sid)
            for seq in range(1, count + 1):
                forge(
                    store,
                    "INSERT INTO run_events VALUES (?, ?, ?, 'r-old', 'admit', 'admit', "
                    "'none', 'admitted', '{}', now())",
                    [sid, seq, f"{sid}-old-{seq}"],
                    rows=1,
                )
    monkeypatch.undo()
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
        run = store.runs.admit("s", {"q": 1}, start=True)
        store.runs.finish(run.id, "succeeded")
        seqs = store.query("SELECT seq FROM run_events WHERE session_id = 's' ORDER BY seq").column(
            0
        )
        assert seqs.to_pylist() == [1, 2, 3, 4, 5, 6]  # admitted, started, succeeded
        events = store.runs.events("s")
        assert [e.run_id for e in events][3:] == [run.id] * 3
        store.sessions.create("u")  # a new session starts at 1
        other = store.runs.admit("u", {"q": 2})
        assert [e.seq for e in store.runs.events("u")] == [1]
        assert other.session_id == "u"


def _an_entry_and_a_keyed_run(store: turnkeeper.BaseStore) -> tuple[Any, Any, Any]:
    """Session ``s`` with an entry appended under a lease and a run admitted with
    submission key ``k``: the entry, the run and the session's replay."""
    _old_session(store, "s")
    lease = store.leases.acquire("session:s", "w", 60)
    msg = {"message": {"role": "user", "content": "x"}}
    entry = store.sessions.append("s", EntryKind.MESSAGE, msg, lease=lease)
    store.leases.release(lease)
    run = store.runs.admit("s", {"q": 1}, submission_key="k", start=True)
    return entry, run, store.sessions.replay("s")


def _still_found(store: turnkeeper.BaseStore, entry: Any, run: Any, replay: Any) -> None:
    """What :func:`_an_entry_and_a_keyed_run` wrote is found by its keys as it was."""
    assert store.sessions.replay("s") == replay and store.sessions.entry("s", entry.id) == entry
    assert store.runs.admit("s", {"q": 1}, submission_key="k", start=True) == run


def test_migration_11_indexes_what_duckdb_looked_up_by_reading_whole_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DuckDB store at schema version 10 opened by this turnkeeper: version 11
    adds DuckDB's single-column lookup indexes over the rows already stored,
    which stay as they were and are found through them (PostgreSQL gets its
    share in version 12)."""
    where = _held_at_version("duckdb", 10, tmp_path, monkeypatch)
    with turnkeeper.open_store(where) as store:
        entry, run, before = _an_entry_and_a_keyed_run(store)
        assert store.query("SELECT count(*) AS n FROM duckdb_indexes()").column(0)[0].as_py() == 0
        tables = store.query("SELECT table_name FROM duckdb_tables()").column(0).to_pylist()
    monkeypatch.undo()
    known = ", ".join(f"'{t}'" for t in tables)  # later versions' new tables have their own
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
        names = store.query(
            f"SELECT index_name FROM duckdb_indexes() WHERE table_name IN ({known}) ORDER BY 1"
        ).column(0)
        names = [n for n in names.to_pylist() if n not in _indexes_after(11, "duckdb")]
        assert "entries_by_id" in names and len(names) == 6, names
        _still_found(store, entry, run, before)


def test_migration_12_indexes_what_postgresql_looked_up_by_reading_whole_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PostgreSQL store at schema version 11 opened by this turnkeeper:
    version 12 adds an index led by each column version 11's lookups name
    first (an entry by id, a submission by key digest, a tool record by run
    and by turn) over the rows already stored, which stay as they were and
    are found through them; DuckDB's version 12 adds nothing."""
    where = _held_at_version("postgres", 11, tmp_path, monkeypatch)
    with turnkeeper.open_store(where) as store:
        entry, run, before = _an_entry_and_a_keyed_run(store)
        tables = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        known = ", ".join(f"'{t}'" for t in store.query(tables).column(0).to_pylist())
        # the indexes of version 11's tables (later versions' new tables have their own)
        indexes = (
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            f"AND tablename IN ({known})"
        )
        old = set(store.query(indexes).column(0).to_pylist())
    monkeypatch.undo()
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
        added = (
            set(store.query(indexes).column(0).to_pylist()) - old - _indexes_after(12, "postgres")
        )
        assert added == {
            "entries_by_id",
            "submissions_by_key",
            "tool_executions_by_run",
            "tool_executions_by_turn",
        }
        _still_found(store, entry, run, before)
    duck = str(tmp_path / "v12.duckdb")
    with turnkeeper.open_store(duck) as store:
        names = store.query(
            f"SELECT index_name FROM duckdb_indexes() WHERE table_name IN ({known}) ORDER BY 1"
        ).column(0)
        names = [n for n in names.to_pylist() if n not in _indexes_after(12, "duckdb")]
        assert len(names) == 6, names  # version 11's, none more


def test_events_an_older_turnkeeper_wrote_beside_a_migrated_server_are_counted() -> None:
    """Found by an attack helper: on PostgreSQL a fleet upgrades one process at a
    time, and a process of schema 9 still running beside a migrated database
    numbers run events by the largest seq and leaves the cursor behind; every
    later event of that session then collided with its events for ever. The
    next event counts them (here forged as that process writes them)."""
    from conftest import new_pg_schema

    with turnkeeper.open_store(new_pg_schema()) as store:
        store.sessions.create("x")
        run = store.runs.admit("x", {"q": 1})  # event 1, the cursor at 1
        for seq in (2, 3):  # what the older process writes, without the cursor
            forge(
                store,
                "INSERT INTO run_events VALUES (?, ?, ?, ?, 'start', 'start', 'admitted', "
                "'running', '{}', now())",
                ["x", seq, f"old-{seq}", run.id],
                rows=1,
            )
        store.runs.request_cancel(run.id)
        store.runs.finish(run.id, "cancelled")
        assert [e.seq for e in store.runs.events("x")] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "url", ["mysql://root@localhost/x", "postgresql+psycopg://u@h/db", "sqlite:///x.db"]
)
def test_a_url_of_another_scheme_is_refused_not_made_a_duckdb_file(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(errors.InvalidInputError) as caught:
        turnkeeper.open_store(url)
    assert caught.value.field == "path"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("writer", ["tool records, then entries", "entries, then tool records"])
def test_migration_12_beside_a_writer_of_the_previous_version_never_deadlocks(
    writer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an attack helper: in a rolling upgrade a process of schema 11
    keeps writing while a new one migrates. The migration's CREATE INDEXes
    each took their table's lock in turn, entries first; a writer ending a
    run with a running tool call holds tool_executions and then inserts into
    entries, and the two deadlocked (the server aborted one). The migration
    now takes all its locks at once, waiting at most 500 ms, less than the
    server's deadlock_timeout, and is retried from the start when it gives up:
    a writer in either order only waits. Here the writer is a raw transaction
    that takes the two tables' write locks in ``writer``'s order, the
    migration starting in between. In the order that deadlocked the writer's
    own deadlock_timeout is 50 ms, so a deadlock would abort it; in the other it
    keeps the server's 1 s, which the migration's 500 ms wait stays below."""
    import psycopg
    from test_group_commit import wait_until

    where = _held_at_version("postgres", 11, tmp_path, monkeypatch)
    with turnkeeper.open_store(where):
        pass
    monkeypatch.undo()
    first, then = ("tool_executions", "entries")
    if writer.startswith("entries"):
        first, then = then, first
    opened: list[Any] = []
    with psycopg.connect(where) as old:
        if first == "tool_executions":  # the order that deadlocked: the writer its victim
            old.execute("SET deadlock_timeout = '50ms'")
        old.execute(f"LOCK TABLE {first} IN ROW EXCLUSIVE MODE")

        def migrate() -> None:
            try:
                with turnkeeper.open_store(where) as store:
                    opened.append(store.schema_version())
            except BaseException as exc:  # the test reports it
                opened.append(exc)

        thread = threading.Thread(target=migrate)
        thread.start()
        (mine,) = old.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid <> %s"
        with psycopg.connect(where, autocommit=True) as watch:
            wait_until(
                lambda: watch.execute(waiting, [mine]).fetchone()[0] > 0,  # type: ignore[index]
                "the migration never waited for the writer",
            )
        old.execute(f"LOCK TABLE {then} IN ROW EXCLUSIVE MODE")  # no deadlock: it only waits
        old.commit()
    thread.join()
    assert opened == [turnkeeper.SCHEMA_VERSION]
