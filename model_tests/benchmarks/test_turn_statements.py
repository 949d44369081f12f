"""The statements a turn costs (issue 21, part 2): ``reports/bench.py``'s
three-transaction turn (admit+start with the user message, ``append_many``
of 3, finish with its last entry, the reply and a one-step delivery plan),
counted by the store's own statement counter (``statement_stats``: every
statement sent, BEGIN and COMMIT included), on both backends.

A count, not a timing: the same on a loaded machine. The ceilings are what
the store costs now; a change that adds a statement to the turn fails here.

:func:`test_a_turn_costs_the_pinned_statements` pins each call's statements
exactly (a statement fewer is a change to look at too), over the ways a
runtime's turn goes: the store object remembers the calls open at the head
each write left (the opening), so the next write of the session judges its
entries by the pairing rule without reading them; an admission or finish
that returns a stored run keeps that memory, and a run that ends with a
plan has none to look up. The second mutation net judges the runs area by
it: each of those, broken, costs statements.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import engine, new_pg_schema, open_pg, through_pooler

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind

MSG = {"message": {"role": "user", "content": "x" * 200}}
REPLY = {"role": "assistant", "content": "done"}
USER = {"role": "user", "content": "go"}

PHASES = ("admit_run", "append_many", "finish_run")
REPORTS = Path(__file__).resolve().parents[2] / "reports"

CEILINGS = {
    "duckdb": {"admit_run": 10, "append_many": 5, "finish_run": 12},
    "postgres": {"admit_run": 5, "append_many": 1, "finish_run": 6},
}
"""Statements per phase of the turn, at most (BEGIN and COMMIT included).
On PostgreSQL the writes held (``Tx.later``) between two other statements are
one statement (``storage/postgres/chain.py``): admit+start and finish are
BEGIN, the fenced read, the held writes (run events among them), the lease's
expiry check (a ``DO`` block) and COMMIT, the last two sent as one simple
query and counted as two; finish then sends its wake-ups (run ended, delivery
due: one ``pg_notify`` statement after the COMMIT, ``storage/postgres/notify.py``).
Behind a transaction pooler each phase also pins its search_path
(:data:`PINNED`)."""

PINNED = 1
"""Statements a phase adds behind a transaction pooler: the ``SET LOCAL
search_path`` sent with its BEGIN (or, for an autocommit write, before it in
one pipeline)."""


def _bench() -> Any:
    """``reports/bench.py``: the turn and its count are the bench's own."""
    sys.path.insert(0, str(REPORTS))
    try:
        import bench
    finally:
        sys.path.remove(str(REPORTS))
    return bench


def test_a_turn_costs_at_most_its_ceiling_of_statements(
    real_store: turnkeeper.BaseStore, request: pytest.FixtureRequest
) -> None:
    backend = request.node.callspec.params["real_store"]
    store = real_store
    pinned = PINNED if backend == "postgres" and through_pooler() else 0
    ceilings = {op: n + pinned for op, n in CEILINGS[backend].items()}
    counted = _bench().turn_statements(store)  # its second turn on a new session
    spent = {op: counted[op] for op in PHASES}
    assert spent == {op: min(spent[op], ceilings[op]) for op in PHASES}, spent
    assert (
        counted["total"]
        == sum(spent.values())
        <= sum(ceilings.values())
        <= 15 + 12 * (backend == "duckdb")
    )
    (session,) = store.sessions.list().sessions
    # both turns wrote everything: start, user, 3 messages, the last entry, reply, end
    assert len(store.sessions.entries(session.id)) == 2 * 8


def test_a_stale_finish_is_refused_by_the_fence_in_its_first_read(
    store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runs.finish`` reads the run and fences the lease in one statement
    (``leases.fenced_read``): a stale holder's finish is refused and writes
    nothing; with the judge of that fence (``leases.fenced``) patched out
    (the control), the stale finish is stored."""
    from turnkeeper.storage.ops import leases

    store.sessions.create("s")
    stale = store.leases.acquire("session:s", "w1", 60, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=stale, start=True)
    assert store.leases.release(stale)
    count = store.sessions.get("s").entry_count
    with pytest.raises(turnkeeper.LeaseLostError):
        store.runs.finish(run.id, "succeeded", assistant_message=REPLY, lease=stale)
    assert store.runs.get(run.id).status == "running"
    assert store.sessions.get("s").entry_count == count
    monkeypatch.setattr(leases, "fenced", lambda tx, lease, part: None)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, lease=stale)  # a defect
    assert store.runs.get(run.id).status == "succeeded"


def _call(call_id: str) -> dict[str, object]:
    content = [{"type": "toolCall", "id": call_id, "name": "ls", "arguments": {}}]
    return {"message": {"role": "assistant", "content": content}}


@pytest.mark.parametrize("open_call", [False, True], ids=["closed", "open"])
def test_finish_entries_are_stored_before_the_closing_results_reply_and_turn_end(
    store: turnkeeper.BaseStore, open_call: bool
) -> None:
    """``runs.finish`` writes its ``entries`` with the reply and the turn end
    as one chain when no call is open after them, else first, with the
    interrupted result of the open call between: the stored order is the
    same either way (entries, closing results, reply, turn end)."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 60, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease, start=True)
    last = _call("c1") if open_call else MSG
    store.runs.finish(
        run.id,
        "succeeded",
        entries=[(EntryKind.MESSAGE, last)],
        lease=lease,
        assistant_message=REPLY,
    )
    path = store.sessions.entries("s")
    kinds = [e.kind for e in path]
    closing = ["message"] if open_call else []  # the interrupted result of c1
    assert kinds == ["turn_start", "message", "message", *closing, "message", "turn_end"]
    assert [e.seq for e in path] == list(range(path[0].seq, path[0].seq + len(path)))
    assert all(b.parent_id == a.id for a, b in itertools.pairwise(path))
    assert path[-2].payload["message"] == REPLY
    if open_call:
        assert path[3].payload["message"]["role"] == "toolResult"
    events = store.runs.events("s")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_a_refused_finish_entry_writes_nothing(store: turnkeeper.BaseStore) -> None:
    """A finish whose entries break the pairing rule (a result of no call) is
    refused whole: the run stays running, no entry, no event is written."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 60, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease, start=True)
    before = (len(store.sessions.entries("s")), len(store.runs.events("s")))
    stray = {
        "message": {
            "role": "toolResult",
            "toolCallId": "nope",
            "toolName": "ls",
            "content": [{"type": "text", "text": "x"}],
            "isError": False,
        }
    }
    with pytest.raises(turnkeeper.ToolCallPairingError):
        store.runs.finish(
            run.id,
            "succeeded",
            entries=[(EntryKind.MESSAGE, stray)],
            lease=lease,
            assistant_message=REPLY,
        )
    assert store.runs.get(run.id).status == "running"
    assert (len(store.sessions.entries("s")), len(store.runs.events("s"))) == before


def _finish_statements(store: turnkeeper.BaseStore) -> float:
    """Every statement ``runs.finish`` sent so far (the store's own counter)."""
    stats = store.statement_stats().get("finish_run", {"statements_per_call": 0, "calls": 0})
    return stats["statements_per_call"] * stats["calls"]


def test_a_plan_costs_the_same_statements_however_many_steps(
    store: turnkeeper.BaseStore,
) -> None:
    """A finish's delivery plan is three inserts (intent, operations, their
    ``plan`` events) with one step or fifty: each operation and event is a
    row of one insert, not a statement of its own; every row is stored."""
    from turnkeeper import DeliveryPlan, DeliveryStep

    spent = []
    for steps in (1, 50):
        sid = f"s{steps}"
        store.sessions.create(sid)
        lease = store.leases.acquire(f"session:{sid}", "w", 60, purpose="execution")
        run = store.runs.admit(sid, {"q": 1}, user_message=USER, lease=lease, start=True)
        plan = DeliveryPlan("chat", "t", tuple(DeliveryStep(str(n), "msg") for n in range(steps)))
        before = _finish_statements(store)
        store.runs.finish(run.id, "succeeded", lease=lease, delivery_plan=plan)
        spent.append(round(_finish_statements(store) - before))
        found = store.outbox.get_plan(f"{run.id}:delivery")
        assert found is not None and len(found[1]) == steps
        assert [op.sequence for op in found[1]] == list(range(1, steps + 1))
    assert spent[0] == spent[1], spent


def _tool_turn(store: turnkeeper.BaseStore, session_id: str, lease: turnkeeper.Lease) -> None:
    """A turn shaped like the README's example: a tool call and its result in
    one ``append_many``, a plan step naming the reply entry."""
    run = store.runs.admit(session_id, {"q": 2}, user_message=USER, lease=lease, start=True)
    result = {"role": "toolResult", "toolCallId": "c9", "toolName": "ls", "content": []}
    store.sessions.append_many(
        session_id,
        [(EntryKind.MESSAGE, _call("c9")), (EntryKind.MESSAGE, {"message": result})],
        lease=lease,
    )
    step = turnkeeper.DeliveryStep("send", "message", entry_id=run.assistant_entry_id)
    store.runs.finish(
        run.id,
        "succeeded",
        assistant_message=REPLY,
        delivery_plan=turnkeeper.DeliveryPlan("chat", "t", (step,)),
        lease=lease,
    )


@pytest.mark.postgres
@pytest.mark.parametrize("counted", [True, False], ids=["counter", "control"])
def test_the_counter_counts_every_statement_the_driver_sends(
    monkeypatch: pytest.MonkeyPatch, counted: bool
) -> None:
    """On PostgreSQL the store's statement counter equals what psycopg sends
    for a turn (each driver call, plus the second statement of the two
    simple queries that carry two: the lease's expiry check before COMMIT and
    the pooler's search_path pin after BEGIN), the finish's wake-ups after
    its COMMIT included, for the bench's turn and one with a tool call.
    Control: the wake-ups left uncounted (as they were), the counts differ."""
    import psycopg

    from turnkeeper.storage.postgres import notify

    if not counted:  # (both ways of sending them: after the COMMIT, or with it)
        monkeypatch.setattr(notify, "counted", lambda topics: 0)
    sent: list[str] = []
    for name in ("execute", "executemany", "copy"):
        real = getattr(psycopg.Cursor, name)

        def spy(cur: Any, query: Any, *a: Any, __real: Any = real, **k: Any) -> Any:
            sent.append(query if isinstance(query, str) else str(query))
            return __real(cur, query, *a, **k)

        monkeypatch.setattr(psycopg.Cursor, name, spy)
    store = open_pg(new_pg_schema())
    bench = _bench()

    def own() -> float:
        stats = store.statement_stats()
        return sum(
            stats[op]["statements_per_call"] * stats[op]["calls"] for op in PHASES if op in stats
        )

    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 600, purpose="execution")
    for turn in (
        lambda: bench.three_transaction_turn(store, "s", lease, USER),
        lambda: _tool_turn(store, "s", lease),
    ):
        before, sent[:] = own(), []
        turn()
        honest = len(sent) + sum(
            ("$lapse$; COMMIT" in q) + (q.startswith("BEGIN") and "; " in q) for q in sent
        )
        assert sum("pg_notify" in q for q in sent) >= 1  # the finish's wake-ups were sent
        assert (round(own() - before) == honest) is counted, (own() - before, honest, sent)
    store.close()


ROUND_TRIPS = {"admit_run": 2, "append_many": 1, "finish_run": 2}
"""Round trips per phase of the turn on PostgreSQL with pipelines (a server
whose round trip is long: ``storage/postgres/ahead.py``), at most (through a
transaction pooler too: the pin goes in the same pipelines). admit+start and
finish: BEGIN with the fenced read (``storage/postgres/ahead.py``), then the
held writes with the expiry check, COMMIT and (finish) the wake-ups;
``append_many``: one autocommit statement. (Before the pipelines: 4, 1 and 6.)"""


@pytest.mark.postgres
def test_a_turn_costs_at_most_its_round_trips() -> None:
    """The round trips of the bench's turn (its second, on a new session),
    as ``reports/bench.py`` counts them from libpq's protocol trace of each
    connection the store lends: each simple ``Query`` and each ``Sync`` (a
    pipeline's end) the client sends is one wait for the server."""
    store = open_pg(new_pg_schema())
    store.db.pipelines = True  # (as a store does where a round trip is long: see ahead.py)
    counted = _bench().turn_round_trips(store)
    spent = {op: counted[op] for op in PHASES}
    assert spent == {op: min(spent[op], n) for op, n in ROUND_TRIPS.items()}, spent
    assert counted["total"] == sum(spent.values()) <= 5
    store.close()


@pytest.mark.postgres
def test_a_store_sends_pipelines_only_where_a_round_trip_is_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store measures its server's round trip at open and sends pipelines
    only when it is at least ``ahead.PIPELINE_RTT_S`` (where they pay);
    without them a turn is one round trip per statement sent (BEGIN its own:
    more than the pipelined ceilings), with them within the ceilings."""
    from turnkeeper.storage.postgres import ahead

    for shortest, expected in ((3600.0, False), (0.0, ahead.supported())):
        monkeypatch.setattr(ahead, "PIPELINE_RTT_S", shortest)
        store = open_pg(new_pg_schema())
        try:
            assert store.db.pipelines is expected
            trips = _bench().turn_round_trips(store)
            within = all(trips[op] <= n for op, n in ROUND_TRIPS.items())
            assert within is expected, trips
        finally:
            store.close()


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
        before = {op: _spent(store, op) for op in PHASES}
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
        return {op: _spent(store, op) - before[op] for op in PHASES}

    turns = [turn(i) for i in range(3)] + [turn(3, existing=True)]
    before = _spent(store, "finish_run")  # the last finish again (its commit unknown)
    again = store.runs.finish(
        ended[-1].id, "succeeded", assistant_message=REPLY, lease=lease, delivery_plan=plan
    )
    assert again == ended[-1]
    repeated = _spent(store, "finish_run") - before
    before = {op: _spent(store, op) for op in PHASES}
    run = store.runs.admit("s", {"n": 4}, user_message=USER, start=True, lease=lease)
    entries = _call_and_result(4)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, entries=entries, lease=lease)
    fifth = {op: _spent(store, op) - before[op] for op in PHASES}
    steady = {op: n + pinned for op, n in STEADY[name].items()}
    assert turns[1:3] == [steady, steady]
    returning = steady | {"admit_run": RETURNING[name] + 3 * pinned}
    assert turns[3] == returning
    assert repeated == AGAIN[name] + pinned
    assert fifth == steady | {"append_many": 0, "finish_run": WITH_ENTRIES[name] + pinned}
    assert [r.status for r in store.runs.list("s")] == ["succeeded"] * 5
