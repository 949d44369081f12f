"""A database other software shares: extensions, views, other schemas (issue 24).

``open_store`` judged a PostgreSQL database foreign by every relation
``information_schema.tables`` lists in its schema: ``CREATE EXTENSION
pg_stat_statements`` (which ``pg_auto_failover`` and many managed services
install) made it refuse with ``ForeignDatabaseError: … holds tables
(pg_stat_statements, pg_stat_statements_info)``, which are the extension's
views. Ownership is judged by the tables of the schema the store uses only:
an extension's objects, views, sequences, functions and other schemas'
tables are not another application's. A real table in that schema still is.

The way around it, a schema of its own through ``search_path``, failed with
``ProgrammingError: no schema has been selected to create in`` unless the
schema existed: the store now creates it, or, when its role may not, raises
``SchemaNotFoundError`` saying what to run. Through PgBouncer
(``--through-pgbouncer``) the role's default ``search_path`` names the
schema, and the same holds.

DuckDB: a file holding only views, or tables of another schema, is not
another application's either.
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
from conftest import direct_url, pg_url, pooler_url, through_pooler

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.storage.postgres import connect

MSG = {"message": {"role": "user", "content": "x"}}


def in_database(url: str, name: str) -> str:
    """``url`` (``postgresql://user@/postgres?…``) on database ``name``."""
    head, _, tail = url.partition("?")
    return f"{head.rsplit('/', 1)[0]}/{name}?{tail}"


def store_url(database: str, user: str = "postgres") -> str:
    """The URL a store opens database ``database`` by, as ``user``: through
    PgBouncer when the suite runs through it, else on the server."""
    base = pooler_url() if through_pooler() else pg_url()
    return in_database(base, database).replace("postgresql://postgres@", f"postgresql://{user}@")


@pytest.fixture
def database() -> Iterator[tuple[str, psycopg.Connection[Any]]]:
    """A fresh database: its name, and an admin connection to it (on the server)."""
    pg_url()
    name = f"tk_db_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(direct_url(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(in_database(direct_url(), name), autocommit=True) as conn:
            yield name, conn
    finally:
        with psycopg.connect(direct_url(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def use(url: str) -> None:
    """Open the store at ``url``, write, and read it back after a reopen."""
    with turnkeeper.open_store(url) as store:
        store.sessions.create("s")
        store.sessions.append("s", EntryKind.MESSAGE, MSG)
    with turnkeeper.open_store(url) as store:
        assert [e.payload for e in store.sessions.entries("s")] == [MSG]


def relations(conn: psycopg.Connection[Any], schema: str = "public") -> list[tuple[str, str]]:
    """The (name, relkind) of ``schema``'s relations."""
    rows = conn.execute(
        "SELECT c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r','p','v','m','f')",
        [schema],
    ).fetchall()
    return sorted((name, kind) for name, kind in rows)


EXTENSIONS = [
    "CREATE EXTENSION pg_stat_statements",  # views, functions (pg_auto_failover's)
    "CREATE EXTENSION citext",  # a type, functions, operators
    "CREATE EXTENSION hstore",
    # a table an extension owns (as PostGIS owns spatial_ref_sys)
    "CREATE TABLE spatial_ref_sys (srid int PRIMARY KEY); "
    "ALTER EXTENSION hstore ADD TABLE spatial_ref_sys",
]

OTHER_SOFTWARE = [
    "CREATE VIEW dashboard AS SELECT 1 AS x",
    "CREATE MATERIALIZED VIEW rollup AS SELECT 1 AS x",
    "CREATE SEQUENCE ticket_numbers",
    "CREATE FUNCTION answer() RETURNS int LANGUAGE sql AS 'SELECT 42'",
    "CREATE SCHEMA billing; CREATE TABLE billing.invoices (id int)",
]


@pytest.mark.postgres
def test_a_database_holding_extensions_is_opened(database):
    """Failed before: ``ForeignDatabaseError: … holds tables (pg_stat_statements,
    pg_stat_statements_info) but no turnkeeper schema_migrations``."""
    name, conn = database
    for ddl in EXTENSIONS:
        conn.execute(ddl)
    before = relations(conn)
    use(store_url(name))
    assert set(before) < set(relations(conn))  # the extensions' objects are left as they were


@pytest.mark.postgres
def test_views_sequences_functions_and_other_schemas_tables_are_not_foreign(database):
    name, conn = database
    for ddl in OTHER_SOFTWARE:
        conn.execute(ddl)
    before = relations(conn), relations(conn, "billing")
    use(store_url(name))
    assert set(before[0]) < set(relations(conn)) and relations(conn, "billing") == before[1]


@pytest.mark.postgres
@pytest.mark.parametrize(
    "table",
    [
        "CREATE TABLE invoices (id int)",
        "CREATE TABLE invoices (id int) PARTITION BY RANGE (id)",
        "CREATE UNLOGGED TABLE invoices (id int)",
    ],
    ids=["table", "partitioned", "unlogged"],
)
@pytest.mark.parametrize("read_only", [False, True])
def test_a_table_of_another_application_in_the_schema_is_still_foreign(database, table, read_only):
    """Beside an extension and a view, which the error does not name."""
    name, conn = database
    conn.execute(EXTENSIONS[0])
    conn.execute(OTHER_SOFTWARE[0])
    conn.execute(table)
    before = relations(conn)
    with pytest.raises(turnkeeper.ForeignDatabaseError) as err:
        turnkeeper.open_store(store_url(name), read_only=read_only)
    assert "holds tables (invoices)" in str(err.value)
    assert relations(conn) == before  # untouched


def new_role(conn: psycopg.Connection[Any], schema: str, *, superuser: bool) -> str:
    """A login role whose default ``search_path`` is ``schema`` (which does not
    exist), as PgBouncer needs it (it drops the URL's ``options``)."""
    role = f"tk_role_{uuid.uuid4().hex[:12]}"
    conn.execute(f"CREATE ROLE {role} LOGIN {'SUPERUSER' if superuser else ''}")
    conn.execute(f"ALTER ROLE {role} SET search_path = {schema}")
    return role


def schema_url(database: str, role: str, schema: str) -> str:
    url = store_url(database, role)
    return f"{url}&options=-csearch_path%3D{schema}"


def schemas(conn: psycopg.Connection[Any], like: str) -> list[str]:
    rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", [like])
    return [r[0] for r in rows.fetchall()]


@pytest.mark.postgres
def test_a_missing_schema_named_by_the_search_path_is_created(database):
    """Failed before: ``ProgrammingError: no schema has been selected to create in``."""
    name, conn = database
    schema = f"agents_{uuid.uuid4().hex[:8]}"
    role = new_role(conn, schema, superuser=True)
    try:
        url = schema_url(name, role, schema)
        use(url)
        assert schemas(conn, schema) == [schema]
        assert ("sessions", "r") in relations(conn, schema)
        assert relations(conn) == []  # nothing went to public
    finally:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


@pytest.mark.postgres
def test_a_role_that_may_not_create_the_missing_schema_is_told_what_to_run(database):
    name, conn = database
    schema = f"agents_{uuid.uuid4().hex[:8]}"
    role = new_role(conn, schema, superuser=False)
    try:
        with pytest.raises(turnkeeper.SchemaNotFoundError) as err:
            turnkeeper.open_store(schema_url(name, role, schema))
        assert err.value.schema == schema
        assert f'CREATE SCHEMA "{schema}" AUTHORIZATION "{role}"' in str(err.value)
        assert isinstance(err.value.__cause__, psycopg.errors.InsufficientPrivilege)
        assert pickle.loads(pickle.dumps(err.value)).schema == schema
        assert schemas(conn, schema) == []
        conn.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {role}")  # what it said to run
        use(schema_url(name, role, schema))
    finally:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


# -- DuckDB: the same judgment -----------------------------------------------------------


@pytest.mark.parametrize(
    "ddl",
    [
        ["CREATE VIEW dashboard AS SELECT 1 AS x"],
        ["CREATE SCHEMA billing", "CREATE TABLE billing.invoices (id INTEGER)"],
        ["CREATE SEQUENCE ticket_numbers", "CREATE MACRO answer() AS 42"],
    ],
    ids=["view", "other-schema", "sequence-macro"],
)
def test_a_duckdb_file_with_no_table_of_its_main_schema_is_opened(tmp_path: Path, ddl):
    path = tmp_path / "shared.duckdb"
    con = duckdb.connect(str(path))
    for statement in ddl:
        con.execute(statement)
    con.close()
    use(str(path))


def test_a_duckdb_table_in_main_beside_another_schema_is_still_foreign(tmp_path: Path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE SCHEMA billing")
    con.execute("CREATE TABLE billing.invoices (id INTEGER)")
    con.execute("CREATE TABLE notes (id INTEGER)")
    con.close()
    with pytest.raises(turnkeeper.ForeignDatabaseError) as err:
        turnkeeper.open_store(str(path))
    assert "holds tables (notes)" in str(err.value)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("agents, public", ["agents", "public"]),
        ("AbC,Public", ["abc", "public"]),
        ("Ägents, public", ["Ägents", "public"]),  # only ASCII letters fold
        ("ÉTÉ", ["ÉtÉ"]),  # the T is ASCII
        ('"Ägents", X', ["Ägents", "x"]),
        ('"we""ird" , "$user", pg_temp', ['we"ird', "$user", "pg_temp"]),
        ('"a,b", c', ["a,b", "c"]),
        ("", []),
    ],
)
def test_a_search_path_is_read_as_the_server_reads_it(text, names):
    """Failed before for ``Ägents`` (``str.lower`` gave ``ägents``, a schema
    PostgreSQL never looks in, so the open failed with "no schema has been
    selected to create in") and for every name after the first."""
    assert connect.path_names(text) == names
    assert connect.first_in_path(text) == (names[0] if names else None)


@pytest.mark.postgres
def test_a_missing_schema_with_a_non_ascii_capital_is_created_as_the_server_names_it(database):
    name, conn = database
    schema = f"Ägents_{uuid.uuid4().hex[:8]}"  # unquoted: PostgreSQL keeps the Ä
    role = new_role(conn, schema, superuser=True)
    try:
        use(schema_url(name, role, schema))
        assert schemas(conn, schema) == [schema]
        assert ("sessions", "r") in relations(conn, schema)
    finally:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


@pytest.mark.postgres
@pytest.mark.parametrize("path", ["pg_temp", "pg_temp, public", "nowhere_q, pg_temp, public"])
def test_a_search_path_into_the_temporary_schema_is_refused(database, path):
    """Failed before: the store migrated into ``pg_temp_N`` and every
    acknowledged write was gone once its connection closed."""
    name, conn = database
    role = new_role(conn, path, superuser=True)
    try:
        url = f"{store_url(name, role)}&options=-csearch_path%3D{path.replace(' ', '')}"
        with pytest.raises(turnkeeper.TemporarySchemaError) as refused:
            turnkeeper.open_store(url)
        assert refused.value.schema == connect.first_in_path(path)
        assert "temporary schema" in str(refused.value)
        rows = conn.execute("SELECT count(*) FROM pg_class WHERE relname = 'sessions'")
        assert rows.fetchone() == (0,)
    finally:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


@pytest.mark.postgres
def test_a_temporary_schema_after_one_that_exists_is_not_used(database):
    name, conn = database
    role = new_role(conn, "public, pg_temp", superuser=True)
    try:
        use(f"{store_url(name, role)}&options=-csearch_path%3Dpublic,pg_temp")
        assert ("sessions", "r") in relations(conn)
    finally:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


CLASHES = [
    ("CREATE VIEW sessions AS SELECT 1 AS x", "sessions"),
    ("CREATE MATERIALIZED VIEW runs AS SELECT 1 AS x", "runs"),
    ("CREATE SEQUENCE leases", "leases"),
    ("CREATE TYPE entries AS (x int)", "entries"),
    (
        "CREATE EXTENSION IF NOT EXISTS hstore; CREATE TABLE projects (id int); "
        "ALTER EXTENSION hstore ADD TABLE projects",
        "projects",
    ),
]


@pytest.mark.postgres
@pytest.mark.parametrize(("ddl", "clash"), CLASHES, ids=[c for _, c in CLASHES])
def test_an_object_named_as_a_turnkeeper_table_is_foreign_and_named(database, ddl, clash):
    """Failed before (attack F3): the open failed mid-migration with
    ``ProgrammingError: relation "sessions" already exists``, naming neither
    the object nor what to do."""
    name, conn = database
    conn.execute(ddl)
    with pytest.raises(turnkeeper.ForeignDatabaseError) as refused:
        turnkeeper.open_store(store_url(name))
    assert clash in str(refused.value) and "named as turnkeeper's" in str(refused.value)
    assert ("schema_migrations", "r") not in relations(conn)


@pytest.mark.parametrize(
    ("ddl", "clash"),
    [
        ("CREATE VIEW sessions AS SELECT 1 AS x", "sessions"),
        ("CREATE SEQUENCE leases", "leases"),
        ("CREATE TYPE entries AS STRUCT(x INTEGER)", "entries"),
    ],
)
def test_a_duckdb_object_named_as_a_turnkeeper_table_is_foreign_and_named(
    tmp_path: Path, ddl, clash
):
    path = tmp_path / "clash.duckdb"
    con = duckdb.connect(str(path))
    con.execute(ddl)
    con.close()
    with pytest.raises(turnkeeper.ForeignDatabaseError) as refused:
        turnkeeper.open_store(str(path))
    assert clash in str(refused.value) and "named as turnkeeper's" in str(refused.value)
