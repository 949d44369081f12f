"""A result the database always gives, missing, is a typed error on every path.

Behind a transaction-mode pooler that the store was not told of, a
statement may run another statement's prepared plan and come back with no
row where its SQL always has one (four bare ``AssertionError``\\ s at
``storage/postgres/db.py:182`` in one run). Every such check in ``storage/``
now raises ``UnexpectedResultError`` naming what was missing, and the
operation's transaction is rolled back. Each case here makes the checked
statement come back empty (the last statement of its kind in the operation;
a first run on another key counts them) and asserts the typed error, and
that nothing of the operation was written; before, each raised a bare
``AssertionError`` (or wrote and then failed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from conftest import new_pg_schema, open_pg

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, FinalizeRequest, ThreadRecord
from turnkeeper.storage.duck import db as duck_db

PLAN = DeliveryPlan("chat", "room", steps=(DeliveryStep("reply", "message"),))
USER = {"role": "user", "content": "go"}


def tx_class(store: turnkeeper.BaseStore) -> type:
    if isinstance(store, turnkeeper.DuckDBStore):
        return duck_db.Tx
    from turnkeeper.storage.postgres import db as pg_db

    return pg_db.Tx


def matches(
    store: turnkeeper.BaseStore, monkeypatch: Any, pattern: str, vanish_at: int | None = None
) -> list[int]:
    """Count the statements matching ``pattern`` that ``Tx.one`` runs from now
    on; the ``vanish_at``-th (1-based) comes back empty."""
    cls = tx_class(store)
    real = cls.one
    seen = [0]

    def one(self: Any, sql: str, params: Any = ()) -> Any:
        row = real(self, sql, params)
        if re.search(pattern, sql):
            seen[0] += 1
            if seen[0] == vanish_at:
                return None
        return row

    monkeypatch.setattr(cls, "one", one)
    return seen


def finished_run(store: turnkeeper.BaseStore, sid: str, **finish: Any) -> turnkeeper.Run:
    store.sessions.create(sid)
    run = store.runs.admit(sid, {"k": sid}, user_message=USER, start=True)
    return store.runs.finish(run.id, "succeeded", **finish)


def delivered_claim(store: turnkeeper.BaseStore, sid: str) -> tuple[str, int]:
    run = finished_run(store, sid, delivery_plan=PLAN)
    found = store.outbox.get_plan(f"{run.id}:delivery")
    assert found is not None
    op = found[1][0]
    return op.id, store.outbox.claim(op.id, "w", 60).lease_epoch


def recovery_lease(store: turnkeeper.BaseStore, sid: str) -> tuple[str, turnkeeper.Lease]:
    store.sessions.create(sid)
    worker = store.leases.acquire(f"session:{sid}", "w", 60, purpose="execution")
    run = store.runs.admit(sid, {"k": sid}, user_message=USER, lease=worker, start=True)
    store.leases.release(worker)
    return run.id, store.leases.acquire(f"session:{sid}", "r", 60, purpose="recovery")


Case = tuple[
    str,  # the statement pattern
    Callable[[turnkeeper.BaseStore, str], Any],  # setup(store, key) -> state
    Callable[[turnkeeper.BaseStore, Any], Any],  # the operation
    Callable[[turnkeeper.BaseStore, Any], bool],  # wrote nothing?
    str,  # UnexpectedResultError.expected
]

CASES: dict[str, Case] = {
    "create_session": (
        r"^INSERT INTO sessions",
        lambda s, k: k,
        lambda s, k: s.sessions.create(k),
        lambda s, k: s.sessions.get(k) is None,
        "the session row its INSERT returns",
    ),
    "count_sessions": (
        r"^SELECT count\(\*\) FROM sessions",
        lambda s, k: None,
        lambda s, _: s.sessions.count(),
        lambda s, _: True,
        "count(*)'s one row",
    ),
    "finalize": (
        r"FROM thread_records WHERE id = \?",
        lambda s, k: k,
        lambda s, k: s.threads.finalize(FinalizeRequest(ThreadRecord(k, key=k, state={"n": 1}))),
        lambda s, k: s.threads.resolve(id=k) is None,
        "the thread record finalize wrote",
    ),
    "admit_run retried": (
        r"FROM runs WHERE id = \?",
        lambda s, k: (
            s.sessions.create(k),
            s.runs.admit(k, {"k": k}, user_message=USER, submission_key="key"),
        )[1],
        lambda s, run: s.runs.admit(
            run.session_id, {"k": run.session_id}, user_message=USER, submission_key="key"
        ),
        lambda s, run: len(s.runs.list(run.session_id)) == 1,
        "the run its submission names",
    ),
    "begin_recovery": (
        r"^INSERT INTO run_recoveries",
        recovery_lease,
        lambda s, state: s.recovery.begin(*state),
        lambda s, state: s.recovery.get(state[0]) is None,
        "the recovery row its upsert returns",
    ),
    "fork_session (its source)": (
        r"^SELECT cwd, header FROM sessions WHERE id = \?",
        lambda s, k: finished_run(s, k).session_id,
        lambda s, k: s.forks.fork(k, request_id=f"f-{k}", fork_session_id=f"{k}-fork"),
        lambda s, k: s.sessions.get(f"{k}-fork") is None,
        "the source session's row, read before in this transaction",
    ),
    "fork_session (its row)": (
        r"^INSERT INTO session_forks",
        lambda s, k: finished_run(s, k).session_id,
        lambda s, k: s.forks.fork(k, request_id=f"f-{k}", fork_session_id=f"{k}-fork"),
        lambda s, k: s.sessions.get(f"{k}-fork") is None,
        "the fork row its INSERT returns",
    ),
    "create_delivery_plan again": (
        r"^SELECT id, .* FROM delivery_intents WHERE id = \?",
        lambda s, k: finished_run(s, k, delivery_plan=PLAN),
        lambda s, run: s.outbox.create_plan(run.id, PLAN),
        lambda s, run: s.outbox.get_plan(f"{run.id}:delivery") is not None,
        "the delivery intent whose digest it read",
    ),
    "finish_delivery": (
        r"^SELECT id, .* FROM delivery_intents WHERE id = \?",
        delivered_claim,
        lambda s, claim: s.outbox.finish(claim[0], "w", claim[1], "delivered"),
        lambda s, claim: s.outbox.get_operation(claim[0]).status == "claimed",
        "the delivery intent it updated",
    ),
    "update_delivery_progress": (
        r"^SELECT lease_ttl_s FROM delivery_operations",
        delivered_claim,
        lambda s, claim: s.outbox.update_progress(claim[0], "w", claim[1], failure_code="x"),
        lambda s, claim: s.outbox.get_operation(claim[0]).failure_code == "",
        "the claimed operation's lease_ttl_s",
    ),
    "claim_tool_execution": (
        r"^INSERT INTO tool_executions",
        lambda s, k: (s.sessions.create(k), s.runs.admit(k, {}, user_message=USER, start=True))[1],
        lambda s, run: s.tools.claim(
            f"{run.id}:c",
            run.session_id,
            local_turn_id=run.turn_id,
            provider_call_id="c",
            tool_name="ls",
            side_effecting=False,
            run_id=run.id,
        ),
        lambda s, run: s.tools.list(run.session_id) == [],
        "the tool record its INSERT returns",
    ),
}


def failure(operation: Callable[..., Any], *args: Any) -> BaseException | None:
    """What ``operation(*args)`` raised (``None``: nothing)."""
    try:
        operation(*args)
    except Exception as exc:
        return exc
    return None


@pytest.mark.parametrize("case", list(CASES))
def test_a_missing_result_is_a_typed_error_and_writes_nothing(store, monkeypatch, case):
    pattern, setup, operation, wrote_nothing, expected = CASES[case]
    with monkeypatch.context() as counting:  # how many such statements the operation runs
        state = setup(store, "a")
        seen = matches(store, counting, pattern)
        operation(store, state)
    assert seen[0] >= 1, f"{case}: no statement matched {pattern!r}"
    state = setup(store, "b")
    matches(store, monkeypatch, pattern, vanish_at=seen[0])
    raised = failure(operation, store, state)
    assert type(raised).__name__ == "UnexpectedResultError", repr(raised)
    assert raised.expected == expected  # type: ignore[union-attr]
    monkeypatch.undo()
    assert wrote_nothing(store, state)


@pytest.mark.postgres
def test_the_servers_clock_missing_is_a_typed_error(monkeypatch):
    """PostgreSQL reads the store's now (``clock_timestamp()``) once per
    transaction: the read a pooler answered with another plan's empty result
    (the bare AssertionError at db.py:182)."""
    url = new_pg_schema()
    with open_pg(url) as store:
        matches(store, monkeypatch, r"^SELECT clock_timestamp\(\)", vanish_at=1)
        raised = failure(store.sessions.create, "s")
        assert type(raised).__name__ == "UnexpectedResultError", repr(raised)
        assert raised.expected == "clock_timestamp()'s one row"  # type: ignore[union-attr]
        monkeypatch.undo()
        assert store.sessions.get("s") is None


def test_a_duckdb_read_without_a_result_is_a_typed_error(duck_store, monkeypatch):
    """DuckDB's analytics read checks its relation's reader the same way."""

    class NoReader:
        def __init__(self, relation: Any) -> None:
            self._relation = relation

        def to_arrow_reader(self, batch_rows: int) -> None:
            return None

    class Cursor:
        def __init__(self, cursor: Any) -> None:
            self._cursor = cursor

        def sql(self, *args: Any, **kwargs: Any) -> NoReader:
            return NoReader(self._cursor.sql(*args, **kwargs))

        def __getattr__(self, name: str) -> Any:
            return getattr(self._cursor, name)

    real = duck_db.Tx.cursor
    monkeypatch.setattr(duck_db.Tx, "cursor", property(lambda tx: Cursor(real.fget(tx))))
    raised = failure(duck_store.query_batches, "SELECT 1", lambda schema, found: list(found))
    assert type(raised).__name__ == "UnexpectedResultError", repr(raised)
    assert raised.expected == "a SELECT's result"  # type: ignore[union-attr]


def test_the_error_names_what_was_missing_and_pickles():
    import pickle

    err = turnkeeper.UnexpectedResultError("the row", detail="why")
    assert isinstance(err, turnkeeper.InternalError)
    again = pickle.loads(pickle.dumps(err))
    assert (again.expected, again.detail, str(again)) == ("the row", "why", str(err))
    assert "expected='the row'" in str(err)
