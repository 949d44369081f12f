"""The test fixtures' stores start from a schema made before, and that schema is
exactly a new one (``conftest.open_backend`` / ``close_backend``).

A DuckDB store starts as a byte copy of a file migrated once per process; a
PostgreSQL store gets a schema an earlier test emptied, when
it is still made exactly as a new one: no DDL statement ran on the server
since (the suite's DDL watch, an event trigger) and its migration versions are
a new schema's, or else ``schema_fingerprint`` says so. Here: a reused schema
holds no row, any change to what a schema is made of keeps it out of reuse
(each change alone), an unchanged schema is reused without the fingerprint,
the change tests fail without the DDL watch, and the copied DuckDB file has a
new file's catalog.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import conftest
import psycopg
import pytest
from conftest import (
    _OPENED,
    _SPARE,
    _schema_of,
    close_backend,
    direct_for,
    new_pg_schema,
    open_backend,
    open_pg,
)

import turnkeeper


def _tables(conn: psycopg.Connection, schema: str) -> list[str]:
    rows = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", [schema]
    ).fetchall()
    return [r[0] for r in rows]


def _spare_after_use(change: Callable[[psycopg.Connection, str], object] | None) -> str | None:
    """Open a store on a fresh or reused schema, write to it, apply ``change``
    to the schema, close it: the schema's URL when it went back for reuse."""
    store = open_backend("postgres", None, None)
    store.sessions.create("s1")
    store.sessions.append("s1", "message", {"message": {"role": "user", "content": "hi"}})
    url = _OPENED[id(store)]
    if change is not None:
        with psycopg.connect(direct_for(url), autocommit=True) as conn:
            change(conn, _schema_of(url))
    close_backend(store)
    return url if url in _SPARE else None


@pytest.mark.postgres
def test_a_reused_schema_holds_no_row_and_serves_a_new_store() -> None:
    url = _spare_after_use(None)
    assert url is not None, "an unchanged schema was not kept for reuse"
    store = open_backend("postgres", None, None)
    try:
        assert _OPENED[id(store)] == url, "open_backend did not hand out the spare schema"
        assert store.sessions.list().sessions == ()
        with psycopg.connect(direct_for(url), autocommit=True) as conn:
            schema = _schema_of(url)
            for table in _tables(conn, schema):
                if table == "schema_migrations":
                    continue
                count = conn.execute(f"SELECT count(*) FROM {schema}.{table}").fetchone()
                assert count is not None and count[0] == 0, table
    finally:
        close_backend(store)


def _revoke_reader_grant(conn: psycopg.Connection, schema: str) -> None:
    row = conn.execute(
        "SELECT grantee FROM information_schema.role_table_grants "
        "WHERE table_schema = %s AND table_name = 'sessions' "
        "AND grantee LIKE 'turnkeeper_reader%%'",
        [schema],
    ).fetchone()
    assert row is not None, "the schema's reader role has no grant to revoke"
    conn.execute(f"REVOKE SELECT ON {schema}.sessions FROM {row[0]}")


CHANGES: dict[str, Callable[[psycopg.Connection, str], object]] = {
    "index dropped": lambda c, s: c.execute(f"DROP INDEX {s}.sessions_by_cwd"),
    "column added": lambda c, s: c.execute(f"ALTER TABLE {s}.sessions ADD COLUMN x INTEGER"),
    "default changed": lambda c, s: c.execute(
        f"ALTER TABLE {s}.leases ALTER COLUMN fenced_writes SET DEFAULT 1"
    ),
    "check dropped": lambda c, s: c.execute(
        f"ALTER TABLE {s}.leases DROP CONSTRAINT leases_epoch_check"
    ),
    "table added": lambda c, s: c.execute(f"CREATE TABLE {s}.extra (x INTEGER)"),
    "version removed": lambda c, s: c.execute(
        f"DELETE FROM {s}.schema_migrations WHERE version = "
        f"(SELECT max(version) FROM {s}.schema_migrations)"
    ),
    "grant revoked": _revoke_reader_grant,
    "function added": lambda c, s: c.execute(
        f"CREATE FUNCTION {s}.f() RETURNS int LANGUAGE sql AS 'SELECT 1'"
    ),
    # a session in replica mode (where event triggers not enabled ALWAYS stay silent)
    "column added by a replica session": lambda c, s: c.execute(
        f"SET session_replication_role = replica; ALTER TABLE {s}.runs ADD COLUMN x INTEGER"
    ),
}


@pytest.mark.postgres
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_schema_changed_in_any_way_is_not_reused(change: str) -> None:
    assert _spare_after_use(CHANGES[change]) is None, f"{change}: the schema went back for reuse"


@pytest.mark.postgres
def test_an_unchanged_schema_is_reused_without_its_fingerprint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No DDL since its store opened: the DDL watch and the versions decide,
    and the catalog-wide fingerprint is not computed (what it saves per test)."""
    _spare_after_use(None)  # the new-schema fingerprint is computed once, before

    def no_fingerprint(conn: object, schema: str) -> str:
        raise AssertionError(f"the fingerprint of {schema} was computed")

    monkeypatch.setattr(conftest, "schema_fingerprint", no_fingerprint)
    assert _spare_after_use(None) is not None, "an unchanged schema was not kept for reuse"


@pytest.mark.postgres
def test_control_without_the_ddl_watch_a_changed_schema_is_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The change tests above fail when the DDL watch sees nothing (its count
    patched to a constant): the watch is what keeps a changed schema out."""
    _spare_after_use(None)
    monkeypatch.setattr(conftest, "ddl_mark", lambda conn: (1, False))
    spare = _spare_after_use(CHANGES["column added"])
    if spare is not None:
        _SPARE.remove(spare)  # never handed to a later test
    assert spare is not None, "the changed schema was kept out without the DDL watch"


@pytest.mark.postgres
@pytest.mark.parametrize("table", ["schema_migrations", "sessions"])
def test_a_lock_a_test_left_keeps_the_schema_out_without_waiting_on_it(table: str) -> None:
    """A connection still holding an exclusive lock on one of the schema's
    tables (the versions read, the deletes): the close gives up on reuse after
    the admin connection's lock_timeout instead of waiting for it."""
    _spare_after_use(None)
    store = open_backend("postgres", None, None)
    url = _OPENED[id(store)]
    with psycopg.connect(direct_for(url)) as holder:
        holder.execute(f"LOCK TABLE {_schema_of(url)}.{table} IN ACCESS EXCLUSIVE MODE")
        closer = threading.Thread(target=close_backend, args=(store,), daemon=True)
        closer.start()
        closer.join(60)
        hung = closer.is_alive()
        holder.rollback()
    closer.join(60)
    assert not hung, "the close waited on the lock"
    assert url not in _SPARE, "a schema whose emptying failed went back for reuse"


@pytest.mark.postgres
def test_the_changes_name_real_objects() -> None:
    """Each change above succeeds on a new schema (a change that failed would
    prove nothing about the fingerprint)."""
    for name, change in CHANGES.items():
        url = new_pg_schema()
        open_pg(url).close()
        with psycopg.connect(direct_for(url), autocommit=True) as conn:
            change(conn, _schema_of(url))  # raises on a name that does not exist
        assert name


def _catalog(path: Path) -> list[tuple[object, ...]]:
    import duckdb

    with duckdb.connect(str(path), read_only=True) as conn:
        rows = conn.execute(
            "SELECT 'c', table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = 'main' "
            "UNION ALL SELECT 'i', table_name, index_name, sql, NULL, NULL FROM duckdb_indexes() "
            "UNION ALL SELECT 'k', table_name, constraint_type, constraint_text, NULL, NULL "
            "FROM duckdb_constraints() "
            "UNION ALL SELECT 'v', CAST(version AS VARCHAR), NULL, NULL, NULL, NULL "
            "FROM schema_migrations ORDER BY ALL"
        ).fetchall()
    return [tuple(r) for r in rows]


def test_the_copied_duckdb_file_is_a_new_files_catalog(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    copied = open_backend("duckdb", tmp_path / "a", None)
    copied.sessions.create("s1")
    copied.close()
    turnkeeper.open_store(str(tmp_path / "new.duckdb")).close()
    assert _catalog(tmp_path / "a" / "store.duckdb") == _catalog(tmp_path / "new.duckdb")


@pytest.mark.postgres
def test_a_schema_patched_migrations_made_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Migrations patched to leave an index out (every version kept, as
    ``test_fence_kills`` does) make a schema that is never handed out again,
    though no DDL runs after its store opened."""
    from turnkeeper.storage.postgres import db as pg_db

    trimmed = [
        (v, ";".join(s for s in sql.split(";") if "INDEX sessions_by_cwd " not in s))
        for v, sql in pg_db.MIGRATIONS
    ]
    assert trimmed != pg_db.MIGRATIONS
    with monkeypatch.context() as patched:
        patched.setattr(pg_db, "MIGRATIONS", trimmed)
        url = _spare_after_use(None)
    if url is not None:
        _SPARE.remove(url)  # never handed to a later test
    assert url is None, "a schema without sessions_by_cwd went back for reuse"


@pytest.mark.postgres
def test_a_test_patching_the_migrations_gets_a_schema_they_make(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A test that patches the migrations (``test_fence_kills`` leaves an index
    out) gets a new schema, migrated by its patch, and no DuckDB copy."""
    from turnkeeper.storage.duck import db as duck_db
    from turnkeeper.storage.postgres import db as pg_db

    spare = _spare_after_use(None)
    assert spare is not None
    monkeypatch.setattr(pg_db, "MIGRATIONS", list(pg_db.MIGRATIONS[:-1]))
    store = open_backend("postgres", None, None)
    try:
        assert _OPENED[id(store)] != spare, "a patched migration got a reused schema"
        assert store.schema_version() == len(pg_db.MIGRATIONS)
    finally:
        close_backend(store)
    monkeypatch.setattr(duck_db, "MIGRATIONS", list(duck_db.MIGRATIONS[:-1]))
    duck = open_backend("duckdb", tmp_path, None)
    try:
        assert duck.schema_version() == len(duck_db.MIGRATIONS)
    finally:
        duck.close()
