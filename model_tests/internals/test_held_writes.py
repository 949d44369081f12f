"""Held writes (``Tx.later``, issue 21 part 2): a write whose outcome nothing
reads before the transaction's next statement is held, and PostgreSQL sends
the writes held so far as one statement of data-modifying ``WITH`` items
(``storage/postgres/chain.py``); DuckDB runs each at once. Either way a held
compare-and-set is judged by its own count, a later read sees the held
writes, and a failing held write leaves nothing of the transaction.

Each guard has its control: with it patched out, the test's assertion fails.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import engine, through_pooler

import turnkeeper
from turnkeeper.storage import backend

TITLE = "SELECT title FROM sessions WHERE id = ?"
USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": "done"}
RETITLE = "UPDATE sessions SET title = ? WHERE id = ?"


def _backend(request: pytest.FixtureRequest) -> str:
    """The ``store`` fixture's engine of the running test (``postgres+enc``: ``postgres``)."""
    return engine(str(request.node.callspec.params["store"]))


def test_held_writes_go_as_one_statement_on_a_server(
    store: turnkeeper.BaseStore, request: pytest.FixtureRequest
) -> None:
    """Three held writes: one statement between BEGIN and COMMIT on
    PostgreSQL, three on DuckDB; all three are stored."""
    for sid in ("a", "b", "c"):
        store.sessions.create(sid)

    def body(tx: Any) -> None:
        for sid in ("a", "b", "c"):
            tx.later(RETITLE, [f"t-{sid}", sid], changes=1)

    store.db.write("held_three", body)
    spent = store.statement_stats()["held_three"]["statements_per_call"]
    pinned = through_pooler()  # behind a pooler BEGIN pins the search_path with it
    assert spent == (3 + pinned if _backend(request) == "postgres" else 5)
    assert [store.sessions.get(s).title for s in ("a", "b", "c")] == ["t-a", "t-b", "t-c"]


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "control"])
def test_a_held_compare_and_set_that_changes_no_row_writes_nothing(
    store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch, guarded: bool
) -> None:
    """A held compare-and-set (``changes=1``) that finds no row is a lost race
    (``Conflict``): retried, then ``TransactionConflictError``, and the write
    held before it is not stored. Control: with the count's judge
    (``check_changes``) patched out, the write before it is stored."""
    from turnkeeper.storage.duck import tx as duck_tx
    from turnkeeper.storage.postgres import chain

    store.sessions.create("a")
    if not guarded:
        for module in (duck_tx, chain):
            monkeypatch.setattr(module, "check_changes", lambda sql, changes, changed: None)

    def body(tx: Any) -> None:
        tx.later(RETITLE, ["moved", "a"], changes=1)
        tx.later(RETITLE, ["never", "no-such-session"], changes=1)

    if guarded:
        with pytest.raises(turnkeeper.TransactionConflictError):
            store.db.write("held_cas", body)
        assert store.sessions.get("a").title is None
    else:
        store.db.write("held_cas", body)
        assert store.sessions.get("a").title == "moved"  # the defect the guard stops


def _retitle_and_read(tx: Any) -> Any:
    tx.later(RETITLE, ["seen", "a"], changes=1)
    return tx.one(TITLE, ["a"])


def test_a_read_after_held_writes_sees_them(store: turnkeeper.BaseStore) -> None:
    """A statement after held writes runs after them (PostgreSQL sends them
    first), so a read sees them, and they commit."""
    store.sessions.create("a")
    seen = store.db.write("held_read", _retitle_and_read)
    assert (seen[0], store.sessions.get("a").title) == ("seen", "seen")


@pytest.fixture
def pg_store(tmp_path: Any) -> Any:
    """A PostgreSQL store (the backend that holds writes)."""
    from conftest import close_backend, open_backend

    s = open_backend("postgres", tmp_path, None)
    yield s
    close_backend(s)


def test_control_unsent_held_writes_are_neither_read_nor_stored(
    pg_store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control of the test above on PostgreSQL, where writes are held:
    with the send (``Tx.flush``) patched out, the read sees the old value
    and nothing is stored."""
    from turnkeeper.storage.postgres import db as pg_db

    pg_store.sessions.create("a")
    monkeypatch.setattr(pg_db.Tx, "flush", lambda tx: setattr(tx, "_held", []))
    seen = pg_store.db.write("held_read", _retitle_and_read)
    assert (seen[0], pg_store.sessions.get("a").title) == (None, None)


def test_a_held_write_that_fails_leaves_nothing(store: turnkeeper.BaseStore) -> None:
    """A held write the database refuses (a duplicate key) fails the whole
    transaction: the held writes before it are not stored either."""
    store.sessions.create("a")

    def body(tx: Any) -> None:
        tx.later(RETITLE, ["moved", "a"], changes=1)
        tx.later("INSERT INTO active_runs VALUES (?, ?)", ["a", "r1"])
        tx.later("INSERT INTO active_runs VALUES (?, ?)", ["a", "r2"])

    with pytest.raises(turnkeeper.TurnkeeperError):
        store.db.write("held_dup", body, retry=False)
    assert store.sessions.get("a").title is None
    assert store.query("SELECT count(*) AS n FROM active_runs").to_pylist() == [{"n": 0}]


def test_check_changes_judges_a_count() -> None:
    backend.check_changes("UPDATE t", None, 0)
    backend.check_changes("UPDATE t", 1, 1)
    with pytest.raises(backend.Conflict):
        backend.check_changes("UPDATE t", 1, 0)


def test_a_fresh_intent_s_model_is_its_run_s(store: turnkeeper.BaseStore) -> None:
    """Admission holds the run's insert with its new intent's: the run's
    model is given as the intent's value (a held write reads no other's
    row), the same as a retry's read of the stored intent."""
    store.sessions.create("a")
    run = store.runs.admit("a", {"q": 1}, model="m1")
    store.runs.finish(run.id, "failed")
    store.runs.admit("a", {"q": 1}, retry_of=run.id)
    models = store.query("SELECT model FROM runs ORDER BY attempt").to_pylist()
    assert models == [{"model": "m1"}, {"model": "m1"}]


def test_held_run_events_follow_a_cursor_left_behind_on_a_server(
    pg_store: turnkeeper.BaseStore,
) -> None:
    """On PostgreSQL a turnkeeper older than schema 10 numbers run events by the
    largest seq and leaves the session's cursor behind. Admission and finish
    hold their events' insert with the session row's update (one statement,
    one snapshot): both number from the larger of the cursor and the largest
    seq, so the events stay gap-free and the cursor ends on the last one."""
    from conftest import forge

    store = pg_store
    store.sessions.create("a")
    lease = store.leases.acquire("session:a", "w", 60, purpose="execution")
    run = store.runs.admit("a", {"q": 1}, user_message=USER, lease=lease, start=True)
    forge(store, "UPDATE sessions SET event_seq = 0 WHERE id = ?", ["a"], rows=1)  # behind
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, lease=lease)
    second = store.runs.admit("a", {"q": 2}, user_message=USER, lease=lease, start=True)
    seqs = [e.seq for e in store.runs.events("a")]
    assert seqs == list(range(1, 6))  # admit, start, succeeded, admit, start
    assert store.runs.latest_event_seq(second.id) == 5


class _Lapsed(Exception):
    """The error a test's lease expiry keeps (``Tx.valid_until``)."""


def _checked_commit(tx: Any, writes: list[tuple[str, list[str]]], expires_in_s: float) -> None:
    """A body whose COMMIT the server checks (an expiry kept by ``valid_until``,
    as a fenced read keeps its lease's), ending in held compare-and-sets."""
    from datetime import UTC, datetime, timedelta

    tx.one(TITLE, ["a"])  # the first statement (BEGIN goes with it)
    tx.valid_until(datetime.now(UTC) + timedelta(seconds=expires_in_s), _Lapsed("expired"))
    for sql, params in writes:
        tx.later(sql, params, changes=1)


def _spy_pipelines(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The SQL of each round trip ``storage/postgres/ahead.py`` sends."""
    from turnkeeper.storage.postgres import ahead

    sent: list[list[str]] = []
    real = ahead.run

    def run(conn: Any, statements: Any, *rest: Any, advisory: Any = None, **kw: Any) -> None:
        assert kw.get("pipeline", True)  # (the tests that spy send pipelines)
        sent.append([sql for sql, _ in statements] + ([advisory[0]] if advisory else []))
        real(conn, statements, *rest, advisory=advisory, **kw)

    monkeypatch.setattr(ahead, "run", run)
    return sent


def test_held_writes_before_a_checked_commit_go_with_it(
    pg_store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a transaction of a read, a kept expiry and two held
    writes is two round trips: BEGIN with the read, then the held writes,
    the check before COMMIT and COMMIT; five statements, both writes stored."""
    pg_store.db.pipelines = True  # (where a round trip is long: see ahead.py)
    for sid in ("a", "b"):
        pg_store.sessions.create(sid)
    sent = _spy_pipelines(monkeypatch)
    writes = [(RETITLE, ["t-a", "a"]), (RETITLE, ["t-b", "b"])]
    pg_store.db.write("checked", lambda tx: _checked_commit(tx, writes, 3600))
    assert [[sql.split()[0] for sql in trip] for trip in sent] == [
        ["BEGIN", "SELECT"],
        ["WITH", "DO", "COMMIT"],
    ]
    pinned = through_pooler()
    assert pg_store.statement_stats()["checked"]["statements_per_call"] == 5 + pinned
    assert [pg_store.sessions.get(s).title for s in ("a", "b")] == ["t-a", "t-b"]


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "control"])
def test_a_held_write_sent_with_the_commit_that_lost_its_race_commits_nothing(
    pg_store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch, guarded: bool
) -> None:
    """A held compare-and-set sent with the COMMIT that finds no row: the
    server's check before COMMIT fails (``chain.HELD``), nothing commits, the
    race is retried and then ``TransactionConflictError``, naming the write.
    Control: with the statement's mark (``chain.mark``) always ``'ok'``, the
    server commits the write before it (the defect the check stops)."""
    pg_store.db.pipelines = True  # (where a round trip is long: see ahead.py)
    from turnkeeper.storage.postgres import chain

    pg_store.sessions.create("a")
    if not guarded:
        monkeypatch.setattr(chain, "mark", lambda held: f"set_config('{chain.MARK}', 'ok', true)")
    writes = [(RETITLE, ["moved", "a"]), (RETITLE, ["never", "no-such-session"])]
    body = lambda tx: _checked_commit(tx, writes, 3600)  # noqa: E731
    if guarded:
        with pytest.raises(turnkeeper.TransactionConflictError) as err:
            pg_store.db.write("held_cas", body)
        assert "a held write changed 0 rows, not 1: UPDATE sessions" in str(err.value)
        assert pg_store.sessions.get("a").title is None
    else:
        pg_store.db.write("held_cas", body)
        assert pg_store.sessions.get("a").title == "moved"


def test_an_expiry_checked_with_held_writes_commits_nothing(
    pg_store: turnkeeper.BaseStore,
) -> None:
    """The expiry kept before held writes sent with the COMMIT has passed:
    the check fails (``LAPSED``), the kept error is raised, and neither the
    held writes nor anything else of the transaction is stored."""
    pg_store.db.pipelines = True  # (where a round trip is long: see ahead.py)
    pg_store.sessions.create("a")
    writes = [(RETITLE, ["moved", "a"])]
    with pytest.raises(_Lapsed):
        pg_store.db.write("lapsed", lambda tx: _checked_commit(tx, writes, -1))
    assert pg_store.sessions.get("a").title is None


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "control"])
@pytest.mark.parametrize("fault", ["server", "driver"])
def test_wake_ups_sent_with_the_commit_never_fail_the_committed_write(
    pg_store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch, guarded: bool, fault: str
) -> None:
    """A fenced finish sends its held writes, the check, COMMIT and its
    wake-ups in one round trip: the wake-ups failing there (on the server,
    or psycopg failing to send them) leaves the finish committed and
    answered as such. Control: with the pipeline's COMMIT taken as not
    committed (``db._committed``), the server's failure reaches the caller
    of the committed finish (the defect the guard stops)."""
    pg_store.db.pipelines = True  # (where a round trip is long: see ahead.py)
    import psycopg

    from turnkeeper.storage.postgres import db as pg_db
    from turnkeeper.storage.postgres import notify

    pg_store.sessions.create("s")
    lease = pg_store.leases.acquire("session:s", "w", 600, purpose="execution")
    run = pg_store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease, start=True)
    if fault == "server":
        monkeypatch.setattr(notify, "statement", lambda name, topics: ("SELECT 1/0", None))
    else:
        real = psycopg.Connection.execute

        def execute(conn: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if query == notify.SQL:
                raise ValueError("a driver fault while notifying")
            return real(conn, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "execute", execute)
    if not guarded:
        monkeypatch.setattr(pg_db, "_committed", lambda cursors: False)
    sent = _spy_pipelines(monkeypatch)

    def finish() -> None:
        pg_store.runs.finish(run.id, "succeeded", assistant_message=REPLY, lease=lease)

    if guarded or fault == "driver":  # (psycopg never sent the driver's: nothing failed)
        finish()
    else:
        with pytest.raises(turnkeeper.TurnkeeperError):
            finish()
    assert sent[-1][2:] == ["COMMIT", notify.SQL if fault == "driver" else "SELECT 1/0"]
    monkeypatch.undo()
    assert pg_store.runs.get(run.id).status == "succeeded"
