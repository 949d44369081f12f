"""``store.query()`` on PostgreSQL reaches only the store's own tables, as its own
schema's reader role, and leaves nothing behind: the escapes an attack found
(``set_config('role', …)`` undoing the reader role, ``query_to_xml`` running SQL
text, a session advisory lock outliving the query, one store reading another's
schema) are refused, and each control shows the defence is what stops it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from conftest import direct_url, new_pg_schema

import turnkeeper
from turnkeeper.spec import errors
from turnkeeper.storage.postgres import query as pg_query

pytestmark = pytest.mark.postgres

ESCAPES = [
    "SELECT set_config('role', current_setting('is_superuser'), false)",
    "SELECT pg_catalog.set_config('role', 'postgres', false)",
    "SELECT \"set_config\"('role', 'postgres', false)",
    "SELECT E'\\'' AS x, set_config('role', 'postgres', false) -- '",
    "SELECT query_to_xml('select 1', true, false, '')",
    "SELECT pg_advisory_lock(8391086149305214320)",
    "SELECT pg_try_advisory_lock(1)",
    "SELECT pg_read_file('/etc/hostname')",
    "SELECT pg_terminate_backend(0)",
    "SELECT pg_sleep(30)",
    "SELECT U&\"\\0073et_config\"('role', 'postgres', false)",
]


@pytest.fixture
def store() -> Iterator[turnkeeper.BaseStore]:
    s = turnkeeper.open_store(new_pg_schema())
    s.sessions.create("mine")
    yield s
    s.close()


@pytest.mark.parametrize("sql", ESCAPES)
def test_a_query_that_would_escape_is_refused_before_it_runs(
    store: turnkeeper.BaseStore, sql: str
) -> None:
    with pytest.raises(errors.InvalidInputError) as caught:
        store.query(sql)
    assert caught.value.field == "sql"
    row = store.query("SELECT current_user AS u, count(*) AS n FROM sessions").to_pylist()[0]
    assert row["u"].startswith("turnkeeper_reader_") and row["n"] == 1


def test_control_without_the_function_check_set_config_undoes_the_reader_role(
    store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with the function check patched out (here only), a query takes the
    store's login role back, so the role alone is no defence against it."""
    monkeypatch.setattr(pg_query, "check_functions", lambda sql: None)
    row = store.query(
        "SELECT set_config('role', session_user, true) AS r, current_user AS u"
    ).to_pylist()[0]
    assert not row["u"].startswith("turnkeeper_reader_")


def test_one_store_cannot_read_another_stores_schema(store: turnkeeper.BaseStore) -> None:
    other_url = new_pg_schema()
    with turnkeeper.open_store(other_url) as other:
        other.sessions.create("theirs")
    schema = re.search(r"search_path%3D(\w+)", other_url).group(1)  # type: ignore[union-attr]
    with pytest.raises(errors.ProgrammingError):
        store.query(f"SELECT id FROM {schema}.sessions")
    assert store.query("SELECT id FROM sessions").column(0).to_pylist() == ["mine"]


def test_control_without_the_schemas_role_another_schema_is_readable(
    store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: without the schema's own reader role the login (a superuser here)
    reads every schema, which is what the role prevents."""
    other_url = new_pg_schema()
    with turnkeeper.open_store(other_url) as other:
        other.sessions.create("theirs")
    schema = re.search(r"search_path%3D(\w+)", other_url).group(1)  # type: ignore[union-attr]
    monkeypatch.setattr(pg_query, "_reader_role", lambda tx: None)
    assert store.query(f"SELECT id FROM {schema}.sessions").column(0).to_pylist() == ["theirs"]


LOCKING_READS = ["SELECT id FROM sessions FOR UPDATE", "SELECT id FROM sessions FOR SHARE"]
"""Reads that would lock the store's rows while they stream (a worker's write
would wait on them): in a ``READ ONLY`` transaction the server refuses them."""


@pytest.mark.parametrize("sql", LOCKING_READS)
def test_a_locking_read_is_refused_by_the_read_only_transaction(
    store: turnkeeper.BaseStore, sql: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``READ ONLY`` transaction alone refuses a read that locks rows, also
    where the store's login has no reader role (one that may not create roles:
    the role patched away here; the role would refuse it for want of
    ``UPDATE``), and nothing is left locked: a write right after it commits.
    (The transaction left writable: mutant ``query-postgres-read-only``,
    ``make mutants``.)"""
    monkeypatch.setattr(pg_query, "_reader_role", lambda tx: None)
    with pytest.raises(errors.InvalidInputError, match="cannot write") as caught:
        store.query(sql)
    assert caught.value.field == "sql"
    store.sessions.set_title("mine", "after")
    assert store.sessions.get("mine").title == "after"


@pytest.mark.parametrize(
    "change",
    [
        lambda url: url.replace("postgresql://postgres@", "postgresql://nobody_here@"),
        lambda url: url.replace("/postgres?", "/no_such_database?"),
    ],
    ids=["unknown-role", "unknown-database"],
)
def test_a_connection_that_can_never_succeed_fails_with_the_servers_reason(change) -> None:
    import psycopg

    url = change(direct_url())  # the server's own reason (a pooler answers in its words)
    with pytest.raises(errors.OperationalError) as caught:
        turnkeeper.open_store(url)
    assert "does not exist" in str(caught.value)
    assert isinstance(caught.value.__cause__, psycopg.Error)


EXPLAINED_READS = [
    "EXPLAIN SELECT * FROM sessions",
    "EXPLAIN ANALYZE SELECT * FROM sessions",
    "explain (FORMAT JSON) SELECT 1",
    "/* a plan */ EXPLAIN VERBOSE SELECT id FROM sessions WHERE id = ?",
]


@pytest.mark.parametrize("sql", EXPLAINED_READS)
def test_an_explained_read_is_answered_with_its_plan(store: turnkeeper.BaseStore, sql: str) -> None:
    """``EXPLAIN`` of a read is one of the reads ``store.query`` accepts (the
    module's docstring): PostgreSQL refuses it in a server-side cursor
    (``DECLARE … CURSOR FOR`` takes a SELECT or VALUES only), so it runs in a
    client-side one, in the same read-only transaction and role (found by the
    fence-mutant work: it was a ProgrammingError)."""
    table = store.query(sql, ["mine"] if "?" in sql else None)
    assert table.column_names == ["QUERY PLAN"] and table.num_rows >= 1


@pytest.mark.parametrize(
    "sql",
    [
        "EXPLAIN ANALYZE DELETE FROM sessions",
        "EXPLAIN (ANALYZE, FORMAT JSON) UPDATE sessions SET title = 'x'",
        "EXPLAIN ANALYZE WITH d AS (DELETE FROM sessions RETURNING *) SELECT * FROM d",
    ],
)
def test_an_explained_write_is_refused_and_changes_nothing(
    store: turnkeeper.BaseStore, sql: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``EXPLAIN ANALYZE`` runs what it explains: a write is refused by the read-only
    transaction (the reader role patched away: a login that may not create roles),
    and the session is still there, untitled."""
    monkeypatch.setattr(pg_query, "_reader_role", lambda tx: None)
    with pytest.raises(errors.InvalidInputError, match="cannot write") as caught:
        store.query(sql)
    assert caught.value.field == "sql"
    got = store.sessions.get("mine")
    assert got is not None and got.title is None
