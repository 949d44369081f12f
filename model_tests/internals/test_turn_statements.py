"""A turn's statements, pinned per call on each engine (issue 21 part 2: a
turn's cost is its statements, not Python).

A turn here is what a runtime does under its execution lease: admit and start
the run with the user message, append a tool call and its result
(``append_many``), finish with the reply and a delivery plan for it. Each is
one transaction; a server gets the writes held (``Tx.later``) as one statement
with the statement after them, DuckDB runs each at once. The store object
remembers the calls open at the head each write left (the opening), so the
next write of the session judges its entries by the pairing rule without
reading them: a call that forgets it (an admission returning an existing run,
too) costs statements.

A change of these figures is a change of the turn's cost: make it on purpose,
and say why in ``reports/BENCH.md``.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import engine, through_pooler

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep

OPS = ("admit_run", "append_many", "finish_run")
USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": "done"}

STEADY = {
    "duckdb": {"admit_run": 10, "append_many": 5, "finish_run": 12},
    "postgres": {"admit_run": 4, "append_many": 5, "finish_run": 5},
}
"""A turn's statements per call, BEGIN and COMMIT included, once the session's
data key is read (an encrypted store's first admission reads it: one more)."""

RETURNING = {"duckdb": 23, "postgres": 17}
"""The admissions of a turn whose run is returned twice, in three
transactions: the admission with a submission key, its repeat (the key's
run, as stored) and one that meets the active run and returns it
(``on_active="use_existing"``)."""


WITH_ENTRIES = {"duckdb": 9, "postgres": 5}
"""A finish that is given the turn's call and result as ``entries`` (no
delivery plan): they are judged at the head read with the fence and go with
the reply in one write."""


AGAIN = {"duckdb": 6, "postgres": 6}
"""A finish repeated with the same plan after its commit was unknown: it
reads the run and the plan (both stored) and writes nothing."""


def _spent(store: turnkeeper.BaseStore, op: str) -> int:
    stats = store.statement_stats().get(op)
    return round(stats["calls"] * stats["statements_per_call"]) if stats else 0


def _call_and_result(i: int) -> list[tuple[str, dict[str, Any]]]:
    call = {"type": "toolCall", "id": f"c{i}", "name": "bash", "arguments": {}}
    result = {
        "role": "toolResult",
        "toolCallId": f"c{i}",
        "toolName": "bash",
        "content": [{"type": "text", "text": "ok"}],
        "isError": False,
    }
    return [
        ("message", {"message": {"role": "assistant", "content": [call]}}),
        ("message", {"message": result}),
    ]


def test_a_turn_costs_the_pinned_statements(
    store: turnkeeper.BaseStore, request: pytest.FixtureRequest
) -> None:
    """Three turns, then one whose run two more admissions return: from the
    second turn on each call costs :data:`STEADY`; the fourth turn's
    admissions cost :data:`RETURNING`, its append and finish the same as
    before (the opening is remembered through the admissions that return a
    run). The fourth turn's finish, repeated (its commit unknown), costs
    :data:`AGAIN` and keeps the opening too; a fifth turn's finish takes its
    call and result as ``entries``: :data:`WITH_ENTRIES`."""
    name = engine(str(request.node.callspec.params["store"]))
    pinned = through_pooler()  # behind a pooler BEGIN pins the search_path with it
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 600, purpose="execution")

    plan = DeliveryPlan("chat", "room", (DeliveryStep("send", "message"),))
    ended: list[turnkeeper.Run] = []

    def turn(i: int, *, existing: bool = False) -> dict[str, int]:
        before = {op: _spent(store, op) for op in OPS}
        key = f"k{i}" if existing else None
        args: dict[str, Any] = {"user_message": USER, "start": True, "lease": lease}
        run = store.runs.admit("s", {"n": i}, submission_key=key, **args)
        if existing:
            assert store.runs.admit("s", {"n": i}, submission_key=key, **args) == run
            again = store.runs.admit("s", {"n": 0}, on_active="use_existing", lease=lease)
            assert again == run
        store.sessions.append_many("s", _call_and_result(i), lease=lease)
        ended.append(
            store.runs.finish(
                run.id, "succeeded", assistant_message=REPLY, lease=lease, delivery_plan=plan
            )
        )
        return {op: _spent(store, op) - before[op] for op in OPS}

    turns = [turn(i) for i in range(3)] + [turn(3, existing=True)]
    before = _spent(store, "finish_run")  # the last finish again (its commit unknown)
    again = store.runs.finish(
        ended[-1].id, "succeeded", assistant_message=REPLY, lease=lease, delivery_plan=plan
    )
    assert again == ended[-1]
    repeated = _spent(store, "finish_run") - before
    before = {op: _spent(store, op) for op in OPS}
    run = store.runs.admit("s", {"n": 4}, user_message=USER, start=True, lease=lease)
    entries = _call_and_result(4)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, entries=entries, lease=lease)
    fifth = {op: _spent(store, op) - before[op] for op in OPS}
    steady = {op: n + pinned for op, n in STEADY[name].items()}
    assert turns[1:3] == [steady, steady]
    returning = steady | {"admit_run": RETURNING[name] + 3 * pinned}
    assert turns[3] == returning
    assert repeated == AGAIN[name] + pinned
    assert fifth == steady | {"append_many": 0, "finish_run": WITH_ENTRIES[name] + pinned}
    assert [r.status for r in store.runs.list("s")] == ["succeeded"] * 5
