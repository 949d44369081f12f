"""``store.query()`` is one read over the store's tables: it changes nothing and
reaches nothing beyond the database, whatever SQL it is given.

Three defences, each tested on its own: the parse check refuses every
statement kind but a read (and a read holding a write); the query's
transaction is always rolled back; the connection cannot reach files,
extensions, the environment or Python objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.storage.duck import query as query_module

MSG = {"message": {"role": "user", "content": "x"}}

# Examples of every DuckDB statement kind that is not a read. A DuckDB release that
# adds a kind fails test_every_statement_kind_has_an_example until it is covered.
NOT_READS = [
    "INSERT INTO sessions (id, cwd, created_at, updated_at, entry_count, next_seq, header) "
    "VALUES ('z', '', now(), now(), 0, 1, '{}')",
    "UPDATE runs SET status = 'succeeded'",
    "CREATE TABLE t AS SELECT 1 AS a",
    "DELETE FROM sessions",
    "PREPARE p AS DELETE FROM sessions",
    "EXECUTE p",
    "ALTER TABLE sessions RENAME TO gone",
    "COMMIT",
    "BEGIN TRANSACTION",
    "COPY sessions TO '{tmp}/out.csv'",
    "COPY sessions FROM '{tmp}/in.csv'",
    "ANALYZE",
    "SET VARIABLE x = 1",
    "RESET threads",
    "USE memory",
    "CREATE MACRO m(a) AS a + 1",
    "CREATE SECRET s (TYPE s3)",
    "DROP TABLE entries",
    "EXPORT DATABASE '{tmp}/export'",
    "PRAGMA enable_profiling",
    "VACUUM",
    "CALL checkpoint()",
    "CHECKPOINT",
    "SET threads = 1",
    "LOAD icu",
    "INSTALL httpfs",
    "UPDATE EXTENSIONS",
    "ATTACH '{tmp}/other.duckdb' AS other",
    "DETACH other",
    "PIVOT sessions ON cwd",
    "COPY FROM DATABASE memory TO memory",
    "MERGE INTO sessions USING (SELECT 'q' AS id) src ON sessions.id = src.id "
    "WHEN MATCHED THEN DELETE",
    "SELECT 1; DELETE FROM sessions",
    "SELECT 1; SELECT 2",
    "",
    "   -- only a comment",
    "not sql at all",
]
NOT_EXAMPLES = {
    "SELECT",  # a read (tested below)
    "EXPLAIN",  # of a read, a read (tested below)
    "INVALID",  # no SQL spelling: the parser never returns these three
    "RELATION",
    "LOGICAL_PLAN",
    "ANALYZE",  # the parser reports ANALYZE as VACUUM
    "CREATE_FUNC",  # CREATE MACRO / FUNCTION as CREATE
    "EXTENSION",  # INSTALL as LOAD
    "VARIABLE_SET",  # SET VARIABLE as SET
    "COPY_DATABASE",  # COPY FROM DATABASE as PRAGMA
}


def _kinds(sql: str) -> list[str]:
    try:
        return [s.type.name for s in duckdb.extract_statements(sql)]
    except (duckdb.Error, ValueError):  # ValueError: a kind Python's enum lacks
        return []


WRITES_INSIDE_A_READ = [
    "EXPLAIN ANALYZE DELETE FROM sessions",
    "explain analyze update runs set status='succeeded'",
    "EXPLAIN /* a comment */ ANALYZE DELETE FROM sessions",
    "EXPLAIN (FORMAT JSON) ANALYZE DELETE FROM sessions",
    "EXPLAIN ANALYZE INSERT INTO labels_gone SELECT 1",
    "EXPLAIN ANALYZE COPY sessions TO '{tmp}/explained.csv'",
    "EXPLAIN DELETE FROM sessions",
    "WITH d AS (DELETE FROM sessions RETURNING *) SELECT * FROM d",
    "WITH u AS (UPDATE runs SET status = 'succeeded' RETURNING *) SELECT count(*) FROM u",
    "SELECT * FROM sessions WHERE id IN (WITH d AS (DELETE FROM entries RETURNING session_id) "
    "SELECT session_id FROM d)",
    "WITH i AS (INSERT INTO fence_events VALUES ('t', 'o', 1, 'x', now()) RETURNING *) "
    "SELECT * FROM i",
    "SELECT * FROM query('DELETE FROM sessions')",
    "SELECT * FROM query('WITH d AS (DELETE FROM sessions RETURNING *) SELECT * FROM d')",
    "SELECT (SELECT count(*) FROM QUERY('SELECT 1'))",
    "SELECT * FROM checkpoint()",
    "SELECT * FROM force_checkpoint()",
    "SELECT * FROM truncate_duckdb_logs()",
    "SELECT setseed(0.25)",
    "SELECT 1 FROM sessions WHERE random() < (SELECT 2 FROM (SELECT setseed(0.1)))",
]

BEYOND_THE_DATABASE = [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM read_blob('/etc/hostname')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT * FROM read_parquet('{tmp}/absent.parquet')",
    "SELECT getenv('HOME')",
    "SELECT * FROM duckdb_secrets()",
    "SELECT * FROM local_arrow_table",
]


def _state(store: turnkeeper.DuckDBStore) -> dict[str, Any]:
    """Every row of every table, to compare before and after."""
    tables = [
        r["table_name"]
        for r in store.query(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY 1"
        ).to_pylist()
    ]
    return {t: sorted(map(str, store.query(f"SELECT * FROM {t}").to_pylist())) for t in tables}


@pytest.fixture
def busy(duck_store):
    """A DuckDB store with a session, entries, a running run and a lease."""
    store = duck_store
    store.sessions.create("q")
    store.sessions.append("q", EntryKind.MESSAGE, MSG)
    run = store.runs.admit("q", {"text": "go"})
    store.runs.start(run.id)
    store.leases.acquire("thread-key:k", "w", 30)
    return store


def _sql(template: str, tmp: Path) -> str:
    return template.replace("{tmp}", str(tmp))


def test_every_statement_kind_has_an_example():
    covered = {kind for sql in NOT_READS for kind in _kinds(sql)}
    assert set(duckdb.StatementType.__members__) - NOT_EXAMPLES <= covered, "cover the new kinds"


@pytest.mark.parametrize("template", NOT_READS)
def test_every_statement_kind_but_a_read_is_refused(busy, tmp_path, template):
    (tmp_path / "in.csv").write_text("id\nz\n")
    before = _state(busy)
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        busy.query(_sql(template, tmp_path) or " ")
    assert err.value.field == "sql"
    assert _state(busy) == before
    assert {p.name for p in tmp_path.iterdir()} <= {"store.duckdb", "store.duckdb.wal", "in.csv"}


@pytest.mark.parametrize("template", WRITES_INSIDE_A_READ)
def test_a_write_inside_a_read_is_refused(busy, tmp_path, template):
    before = _state(busy)
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        busy.query(_sql(template, tmp_path))
    assert err.value.field == "sql"
    assert _state(busy) == before
    assert not (tmp_path / "explained.csv").exists()


@pytest.mark.parametrize("template", BEYOND_THE_DATABASE)
def test_nothing_beyond_the_database_is_reachable(busy, tmp_path, template):
    local_arrow_table = pa.table({"secret": ["caller memory"]})  # noqa: F841 (scanned by name)
    with pytest.raises((turnkeeper.InvalidInputError, turnkeeper.ProgrammingError)):
        busy.query(_sql(template, tmp_path))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) AS n FROM sessions",
        "WITH x AS (SELECT id FROM sessions) SELECT * FROM x",
        "FROM sessions SELECT id",
        "SELECT id FROM sessions UNION ALL SELECT id FROM runs",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) "
        "SELECT * FROM r",
        "DESCRIBE sessions",
        "SUMMARIZE runs",
        "SHOW TABLES",
        "EXPLAIN SELECT * FROM sessions",
        "EXPLAIN ANALYZE SELECT * FROM sessions",
        "EXPLAIN (FORMAT JSON) SELECT 1",
        "SELECT * FROM sessions WHERE id = ?",
    ],
)
def test_reads_are_answered(busy, sql):
    params = ["q"] if "?" in sql else None
    assert busy.query(sql, params).num_rows >= 1


def test_explain_analyze_delete_leaves_every_session_after_reopening(tmp_path):
    path = tmp_path / "s.duckdb"
    with turnkeeper.open_store(path) as s:
        s.sessions.create("a")
        with pytest.raises(turnkeeper.InvalidInputError):
            s.query("explain analyze delete from sessions")
    with turnkeeper.open_store(path) as s:
        assert s.sessions.get("a") is not None


def test_rollback_alone_undoes_a_write_the_parse_check_let_through(busy, tmp_path, monkeypatch):
    """Defence in depth: with the parse check patched out, the query's writes
    still never persist (its transaction is rolled back)."""
    monkeypatch.setattr(query_module, "check_read", lambda cursor, sql: None)
    monkeypatch.setattr("turnkeeper.storage.duck.db.check_read", lambda cursor, sql: None)
    run = busy.runs.active("q")
    before = _state(busy)
    for sql in [
        "EXPLAIN ANALYZE DELETE FROM sessions",
        "WITH u AS (UPDATE runs SET status = 'succeeded' RETURNING *) SELECT count(*) FROM u",
        "WITH d AS (DELETE FROM entries RETURNING *) SELECT count(*) FROM d",
    ]:
        busy.query(sql)  # runs: only the rollback stands in its way
    assert _state(busy) == before
    assert busy.runs.active("q") == run
    with pytest.raises(turnkeeper.ProgrammingError):
        busy.query(_sql("EXPLAIN ANALYZE COPY sessions TO '{tmp}/x.csv'", tmp_path))
    assert not (tmp_path / "x.csv").exists()


def test_the_configuration_alone_keeps_files_out_of_reach(busy, tmp_path, monkeypatch):
    """Defence in depth: with the parse check patched out, files, the environment
    and Python objects stay unreachable (the connection's configuration)."""
    monkeypatch.setattr("turnkeeper.storage.duck.db.check_read", lambda cursor, sql: None)
    (tmp_path / "data.csv").write_text("a\n1\n")
    local_arrow_table = pa.table({"secret": ["caller memory"]})  # noqa: F841
    for sql in [
        f"SELECT * FROM read_csv('{tmp_path}/data.csv')",
        f"COPY sessions TO '{tmp_path}/out.csv'",
        f"ATTACH '{tmp_path}/other.duckdb' AS other",
        "INSTALL httpfs",
        "SET enable_external_access = true",
        "SELECT * FROM local_arrow_table",
    ]:
        with pytest.raises(turnkeeper.DatabaseError):
            busy.query(sql)
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "other.duckdb").exists()


def test_a_second_store_on_the_same_file_opens(tmp_path):
    """The locked configuration is found already set by a second store object."""
    path = tmp_path / "s.duckdb"
    with turnkeeper.open_store(path) as a, turnkeeper.open_store(path) as b:
        a.sessions.create("x")
        assert b.sessions.get("x") is not None


def test_a_snapshot_reads_one_state_while_another_thread_commits(
    real_store: turnkeeper.BaseStore,
) -> None:
    """Every query of ``store.snapshot`` sees the state of its first: an append
    committed by another thread between two queries is in neither."""
    import threading

    real_store.sessions.create("s")
    real_store.sessions.append("s", EntryKind.MESSAGE, MSG)
    seen: list[tuple[int, int]] = []

    def body(snap: Any) -> None:
        count = snap.query("SELECT entry_count FROM sessions WHERE id = 's'").column(0)[0]
        append = real_store.sessions.append
        writer = threading.Thread(target=append, args=("s", EntryKind.MESSAGE, MSG))
        writer.start()
        writer.join()
        rows = snap.query("SELECT count(*) FROM entries WHERE session_id = ?", ["s"])
        seen.append((count.as_py(), rows.column(0)[0].as_py()))

    real_store.snapshot(body)
    assert seen == [(1, 1)]
    assert real_store.sessions.get("s").entry_count == 2  # the append committed


def test_the_audit_reads_one_snapshot(
    real_store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit of a store being written to sees one state: an append committed
    between its queries is no "counts 1/2 for 2 entries" violation. With each
    query in its own read (the snapshot patched out) the same schedule fails."""
    from turnkeeper.storage import audit
    from turnkeeper.storage.ops.entry_rows import clear_entry_row
    from turnkeeper.storage.store import Snapshot

    real_store.sessions.create("s")
    real_store.sessions.append("s", EntryKind.MESSAGE, MSG)
    original = Snapshot.query
    written: list[int] = []

    def query_then_write(self: Snapshot, sql: str, params: Any = None) -> Any:
        out = original(self, sql, params)
        if "leaf_id, entry_count" in sql and not written:  # between the trees' two queries
            import threading

            append = real_store.sessions.append
            writer = threading.Thread(target=append, args=("s", EntryKind.MESSAGE, MSG))
            writer.start()
            writer.join()
            written.append(1)
        return out

    monkeypatch.setattr(Snapshot, "query", query_then_write)
    assert all(c.passed for c in audit.run_audit(real_store, ["s"]))
    assert written

    written.clear()
    monkeypatch.setattr(
        turnkeeper.BaseStore,
        "snapshot",
        lambda self, body: body(
            Snapshot(
                self.db.query,
                lambda rows: [clear_entry_row(r) for r in rows],
                lambda rows: ([clear_entry_row(r) for r in rows], []),
            )
        ),
    )
    trees = next(
        c for c in audit.run_audit(real_store, ["s"]) if c.name == "session_trees_well_formed"
    )
    assert written and not trees.passed and "counts 2/3 for 3 entries" in trees.detail


def test_a_snapshot_body_may_call_the_store_and_the_snapshot_holds(
    real_store: turnkeeper.BaseStore,
) -> None:
    """Store calls inside a snapshot's body (an append, a replay, another query or
    snapshot) run outside it and leave it intact: its later reads still see the
    state of its first."""
    real_store.sessions.create("s")
    real_store.sessions.append("s", EntryKind.MESSAGE, MSG)

    def body(snap: Any) -> list[int]:
        first = snap.query("SELECT count(*) FROM entries").column(0)[0].as_py()
        real_store.sessions.append("s", EntryKind.MESSAGE, MSG)
        real_store.sessions.replay("s")
        inner = real_store.query("SELECT count(*) FROM entries").column(0)[0].as_py()
        nested = real_store.snapshot(
            lambda s2: s2.query("SELECT count(*) FROM entries").column(0)[0].as_py()
        )
        again = snap.query("SELECT count(*) FROM entries").column(0)[0].as_py()
        return [first, inner, nested, again]

    assert real_store.snapshot(body) == [1, 2, 2, 1]


def test_a_snapshot_is_refused_after_its_call_and_on_other_threads(
    real_store: turnkeeper.BaseStore,
) -> None:
    import threading

    kept: list[Any] = []
    elsewhere: list[BaseException] = []

    def body(snap: Any) -> None:
        kept.append(snap)

        def other() -> None:
            try:
                snap.query("SELECT 1")
            except BaseException as exc:
                elsewhere.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join()

    real_store.snapshot(body)
    assert len(elsewhere) == 1 and isinstance(elsewhere[0], turnkeeper.InterfaceError)
    with pytest.raises(turnkeeper.InterfaceError):
        kept[0].query("SELECT 1")
