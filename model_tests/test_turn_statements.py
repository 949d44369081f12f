"""The statements a turn costs (issue 21, part 2): ``reports/bench.py``'s
three-transaction turn (admit+start with the user message, ``append_many``
of 3, finish with its last entry, the reply and a one-step delivery plan),
counted by the store's own statement counter (``statement_stats``: every
statement sent, BEGIN and COMMIT included), on both backends.

A count, not a timing: the same on a loaded machine. The ceilings are what
the store costs now; a change that adds a statement to the turn fails here.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

import turnkeeper
from turnkeeper import EntryKind

MSG = {"message": {"role": "user", "content": "x" * 200}}
REPLY = {"role": "assistant", "content": "done"}
USER = {"role": "user", "content": "go"}

PHASES = ("admit_run", "append_many", "finish_run")
REPORTS = Path(__file__).resolve().parents[1] / "reports"

CEILINGS = {
    "duckdb": {"admit_run": 10, "append_many": 5, "finish_run": 12},
    "postgres": {"admit_run": 4, "append_many": 1, "finish_run": 4},
}
"""Statements per phase of the turn, at most (BEGIN and COMMIT included).
On PostgreSQL the writes held (``Tx.later``) between two other statements are
one statement (``storage/postgres/chain.py``): admit+start and finish are
BEGIN, the fenced read, the held writes (run events among them) and COMMIT
(sent with the lease's expiry check as one simple query)."""


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
    counted = _bench().turn_statements(store)  # its second turn on a new session
    spent = {op: counted[op] for op in PHASES}
    assert spent == {op: min(spent[op], CEILINGS[backend][op]) for op in PHASES}, spent
    assert counted["total"] == sum(spent.values()) <= sum(CEILINGS[backend].values())
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
