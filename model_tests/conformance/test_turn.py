"""A whole turn in three transactions, on every backend: admission that starts
the run, the turn's entries in one batch, and a finish that carries the turn's
last entries, its reply and its delivery plan (issue: a turn in few
transactions). Each is still fenced on its own."""

from __future__ import annotations

import pytest

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.spec import errors

M = EntryKind.MESSAGE
PLAN = turnkeeper.DeliveryPlan("chat", "t", (turnkeeper.DeliveryStep("send", "msg"),))


def calls(store: turnkeeper.BaseStore) -> dict[str, int]:
    return {op: int(s["calls"]) for op, s in store.statement_stats().items()}


def tool_turn(call_id: str) -> list[tuple[str, dict]]:
    call = [{"type": "toolCall", "id": call_id, "name": "ls", "arguments": {}}]
    result = {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": "ls",
        "content": [{"type": "text", "text": "a b"}],
        "isError": False,
    }
    return [
        (M, {"message": {"role": "assistant", "content": call}}),
        (M, {"message": result}),
    ]


def test_a_fenced_turn_is_three_transactions(store: turnkeeper.BaseStore) -> None:
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 60, purpose="execution")
    before = calls(store)
    run = store.runs.admit(
        "s", {"q": 1}, user_message={"role": "user", "content": "hi"}, lease=lease, start=True
    )
    assert run.status == "running"
    store.sessions.append_many("s", tool_turn("c1") + tool_turn("c2"), lease=lease)
    done = store.runs.finish(
        run.id,
        "succeeded",
        entries=tool_turn("c3"),
        assistant_message={"role": "assistant", "content": "done"},
        delivery_plan=PLAN,
        lease=lease,
    )
    after = calls(store)
    spent = {op: n - before.get(op, 0) for op, n in after.items() if n != before.get(op, 0)}
    assert spent == {"admit_run": 1, "append_many": 1, "finish_run": 1}
    assert done.status == "succeeded"
    kinds = [
        (e.kind, e.payload.get("message", {}).get("role")) for e in store.sessions.entries("s")
    ]
    assert kinds == [
        ("turn_start", None),
        (M, "user"),
        *[(M, "assistant"), (M, "toolResult")] * 3,
        (M, "assistant"),
        ("turn_end", None),
    ]
    assert {e.lease_epoch for e in store.sessions.entries("s")} == {lease.epoch}
    edges = [e.edge for e in store.runs.events("s")]
    assert edges == ["admit", "start", "succeed"]
    assert store.outbox.get_plan(f"{run.id}:delivery") is not None


def test_a_finish_whose_entries_are_refused_ends_nothing(store: turnkeeper.BaseStore) -> None:
    """The turn's last entries are part of the termination: an unpaired result
    among them refuses the whole finish, and the run stays running."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, start=True)
    stray = tool_turn("c1")[1]
    with pytest.raises(errors.ToolCallPairingError):
        store.runs.finish(run.id, "succeeded", entries=[stray])
    assert store.runs.get(run.id).status == "running"
    assert [e.kind for e in store.sessions.entries("s")] == ["turn_start"]
    with pytest.raises(errors.InvalidInputError) as caught:
        store.runs.finish(run.id, "succeeded", entries=[(M, "not a mapping")])
    assert caught.value.field == "entries[0].payload"


def test_a_lease_on_another_session_is_refused_inside_the_write(
    store: turnkeeper.BaseStore,
) -> None:
    """start/finish check the lease's target against the run's session in their
    own transaction (no read before it): a lease on another session is refused
    and nothing changes."""
    store.sessions.create("s")
    store.sessions.create("other")
    elsewhere = store.leases.acquire("session:other", "w", 60)
    run = store.runs.admit("s", {"q": 1})
    for call in (
        lambda: store.runs.start(run.id, lease=elsewhere),
        lambda: store.runs.finish(run.id, "failed", lease=elsewhere),
    ):
        with pytest.raises(errors.InvalidInputError) as caught:
            call()
        assert caught.value.field == "lease"
    assert store.runs.get(run.id).status == "admitted"


def test_an_interrupted_result_for_a_call_id_no_id_may_hold_gets_a_valid_id(
    store: turnkeeper.BaseStore,
) -> None:
    """The store derives an interrupted result's entry id from the call's id; a
    provider's call id with control characters is digested into it, so every
    entry the store writes can be read back by its id."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, start=True)
    call = [{"type": "toolCall", "id": "a\x01b\n", "name": "ls", "arguments": {}}]
    store.runs.finish(
        run.id, "succeeded", entries=[(M, {"message": {"role": "assistant", "content": call}})]
    )
    results = [e for e in store.sessions.entries("s") if e.id.endswith(":interrupted")]
    assert len(results) == 1
    assert results[0].payload["message"]["toolCallId"] == "a\x01b\n"
    assert store.sessions.entry("s", results[0].id) == results[0]
