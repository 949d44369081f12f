"""The store's schema behind PgBouncer when another client of the pool changes it.

In transaction mode PgBouncer 1.18 neither tracks nor resets ``search_path``:
a client of the same pool (the same role and database: an operator's
``psql``, another program) that runs ``SET search_path = …`` leaves it on
the server connection, and the next client lent that connection runs there.
The store checked its schema only at open; its later transactions, and the
open itself, landed wherever the last client left the search_path: in another
turnkeeper store's schema, its writes went there without a word. Now every
transaction pins the store's search_path (``SET LOCAL`` in its ``BEGIN``'s
round trip), every autocommit statement too (``set_config(…, true)`` in the
same pipeline), and the open reads the session's default search_path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import as_user, direct_url, new_pooled_schema, pooler_url

import turnkeeper
from turnkeeper import EntryKind

pytestmark = pytest.mark.postgres

LEAKED = 4
"""Server connections a leaking client leaves its search_path on (at least)."""

MSG = {"message": {"role": "user", "content": "hi"}}


def role_of(url: str) -> str:
    """The login role of a URL :func:`conftest.new_pooled_schema` made (its schema too)."""
    return url.split("postgresql://", 1)[1].split("@", 1)[0]


@pytest.fixture
def schemas() -> tuple[str, str]:
    """The store's URL through PgBouncer, and another turnkeeper store's schema
    (migrated: a write that lands there succeeds)."""
    pooled, _ = new_pooled_schema()
    _, other_direct = new_pooled_schema()
    turnkeeper.open_store(other_direct).close()
    return pooled, role_of(other_direct)


def leak_search_path(role: str, schema: str) -> None:
    """Another client of ``role``'s pool leaves ``SET search_path = schema`` on
    every server connection the pool holds (at least :data:`LEAKED`): it holds
    them all at once (each in a transaction, so each is another server
    connection), sets the search_path for its session, commits and leaves."""
    with psycopg.connect(direct_url(), autocommit=True) as admin:
        pids = {
            pid
            for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE usename = %s "
                "AND backend_type = 'client backend'",
                [role],
            ).fetchall()
        }
    url = as_user(pooler_url(), role)
    held: list[psycopg.Connection[Any]] = []
    try:
        while len(held) < LEAKED or pids:
            assert len(held) < 100, f"the pool never lent server processes {pids}"
            conn = psycopg.connect(url, prepare_threshold=None)  # each call its transaction
            held.append(conn)
            conn.execute(f'SET search_path = "{schema}"')
            pids.discard(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        for conn in held:
            conn.commit()
    finally:
        for conn in held:
            conn.close()


def pooled_client_schema(role: str) -> str:
    """The schema a plain client of ``role``'s pool lands in (the leak is still
    there when it is not the role's own)."""
    with psycopg.connect(as_user(pooler_url(), role), autocommit=True) as conn:
        return str(conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]


def counts(store_schema: str, other: str) -> tuple[int, int]:
    """Sessions in the store's schema and in the other one (asked of the server itself)."""
    with psycopg.connect(direct_url(), autocommit=True) as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(f'SELECT count(*) FROM "{name}".sessions').fetchone()[0]  # type: ignore[index]
            for name in (store_schema, other)
        )


@pytest.fixture(params=["pipeline", "no pipeline"])
def pipeline(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """With libpq's pipeline mode, and as where libpq has none (before 14): an
    autocommit statement then runs in a transaction of its own."""
    if request.param == "no pipeline":
        monkeypatch.setattr(psycopg.Pipeline, "is_supported", classmethod(lambda cls: False))
    yield request.param


def test_a_search_path_another_client_left_does_not_move_the_stores_operations(schemas, pipeline):
    """Every kind of operation, after another client of the pool left its
    search_path on every server connection: transactions (create_session,
    admit and finish with a COPY, a snapshot query), autocommit writes (the
    one-statement append, the lease release) and reads run in the store's
    schema. Before, all of them ran in the other store's: 12 of 12 sessions
    landed there."""
    pooled, other = schemas
    role = role_of(pooled)
    with turnkeeper.open_store(pooled) as store:
        assert store.pooler == "transaction"
        store.sessions.create("warm")
        leak_search_path(role, other)
        for i in range(10):
            store.sessions.create(f"s{i}")
        store.sessions.append("s0", EntryKind.MESSAGE, MSG)  # one autocommit statement
        assert [e.payload for e in store.sessions.entries("s0")] == [MSG]  # an autocommit read
        lease = store.leases.acquire("session:s1", "w", 60, purpose="execution")
        store.leases.release(lease)  # autocommit
        user = {"role": "user", "content": "go"}
        run = store.runs.admit("s2", {"q": 1}, user_message=user, start=True)
        entries = [(EntryKind.CUSTOM, {"customType": "n", "data": {"i": i}}) for i in range(3)]
        store.runs.finish(run.id, "succeeded", entries=entries)  # a COPY in a transaction
        store.sessions.create("last")
        seen = store.query("SELECT current_schema() AS s, count(*) AS n FROM sessions")
        assert seen.to_pylist() == [{"s": role, "n": 12}]
        in_autocommit = store.db.read("schema", lambda tx: tx.one("SELECT current_schema()"))
        in_transaction = store.db.write("schema", lambda tx: tx.one("SELECT current_schema()"))
        assert (in_autocommit, in_transaction) == ((role,), (role,))
        assert store.sessions.get("s9") is not None
    assert counts(role, other) == (12, 0)
    assert pooled_client_schema(role) == other  # the leak was there all along


@pytest.mark.parametrize("options", [True, False])
def test_a_store_opened_after_another_client_left_its_search_path_lands_in_its_own(
    schemas, options
):
    """The open read the schema a server connection was in: with the URL
    naming its schema it refused to open (PoolerError: the pooler dropped the
    options), without it the store opened, and migrated, in the other
    store's schema. The open now reads the session's default search_path."""
    pooled, other = schemas
    role = role_of(pooled)
    leak_search_path(role, other)
    url = pooled if options else as_user(pooler_url(), role)
    with turnkeeper.open_store(url) as store:
        store.sessions.create("s")
        assert store.query("SELECT current_schema() AS s").column("s").to_pylist() == [role]
        assert store.db.channel == f"turnkeeper:{role}"  # type: ignore[attr-defined]
    assert counts(role, other) == (1, 0)
    assert pooled_client_schema(role) == other


def test_a_bulk_insert_outside_a_transaction_is_refused_behind_a_transaction_pooler(schemas):
    """A COPY cannot carry the pinned search_path: the store runs every bulk
    insert in a transaction, and one outside a transaction is refused
    (typed) rather than run wherever the server connection points."""
    pooled, other = schemas
    role = role_of(pooled)
    with turnkeeper.open_store(pooled) as store:

        def body(tx: Any) -> None:
            tx.insert_rows("sessions", ["id"], [("x",)])

        with pytest.raises(turnkeeper.InternalError) as err:
            store.db.write("bulk", body, transaction=False)
        assert "inside a transaction" in str(err.value)
        assert store.sessions.get("x") is None
    assert counts(role, other) == (0, 0)
