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
