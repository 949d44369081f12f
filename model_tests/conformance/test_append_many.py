"""``sessions.append_many``: a batch of entries in one transaction, on every backend.

One fence, one leaf compare-and-set and one insert for the batch; every rule of
``sessions.append`` holds for each entry (pairing, labels, ids, leases), and a refused
batch writes nothing at all.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from conftest import forge

import turnkeeper
from turnkeeper import EntryKind, NewEntry
from turnkeeper.spec import errors
from turnkeeper.storage.ops import leases, session_rows

M = EntryKind.MESSAGE


def user(text: str) -> dict:
    return {"message": {"role": "user", "content": text}}


def call(call_id: str) -> dict:
    content = [{"type": "toolCall", "id": call_id, "name": "ls", "arguments": {}}]
    return {"message": {"role": "assistant", "content": content}}


def result(call_id: str) -> dict:
    return {
        "message": {
            "role": "toolResult",
            "toolCallId": call_id,
            "toolName": "ls",
            "content": [{"type": "text", "text": "ok"}],
            "isError": False,
        }
    }


def test_a_batch_is_a_chain_under_the_leaf_and_its_last_entry_is_the_leaf(
    store: turnkeeper.BaseStore,
) -> None:
    store.sessions.create("s")
    first = store.sessions.append("s", M, user("a"))
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    got = store.sessions.append_many(
        "s",
        [
            (M, user("b")),
            NewEntry(M, call("c1"), entry_id="mine", timestamp=at),
            (M, result("c1")),  # answers the call earlier in the batch
            (EntryKind.LABEL, {"targetId": "mine", "label": "tool"}),  # targets the batch
            (EntryKind.SESSION_INFO, {"name": "the title"}),
        ],
        expected_leaf=first.id,
    )
    assert [e.seq for e in got] == [2, 3, 4, 5, 6]
    assert [e.parent_id for e in got] == [first.id, *[e.id for e in got[:-1]]]
    assert got[1].id == "mine" and got[1].timestamp == at
    assert store.sessions.entries("s") == [first, *got]
    head = store.sessions.get("s")
    assert (head.leaf_id, head.entry_count, head.next_seq, head.title) == (
        got[-1].id,
        6,
        7,
        "the title",
    )
    assert store.sessions.labels("s") == {"mine": "tool"}
    roles = [m["role"] for m in store.sessions.replay("s").messages]
    assert roles == ["user", "user", "assistant", "toolResult"]


@pytest.mark.parametrize(
    ("batch", "error", "field"),
    [
        ([(M, user("a")), (M, "not a mapping")], errors.InvalidInputError, "entries[1].payload"),
        ([(M, user("a")), ("no-such-kind", {})], errors.InvalidInputError, None),
        (
            [(M, user("a")), NewEntry(M, user("b"), entry_id="x:turn-end")],
            errors.InvalidInputError,
            "entries[1].entry_id",
        ),
        (
            [NewEntry(M, user("a"), entry_id="d"), NewEntry(M, user("b"), entry_id="d")],
            errors.InvalidInputError,
            "entries",
        ),
        (
            [NewEntry(M, user("a"), timestamp=datetime(2026, 1, 1))],
            errors.InvalidInputError,
            "entries[0].timestamp",
        ),
        ([], errors.InvalidInputError, "entries"),
        ([(M, user("a")), NewEntry(M, user("b"), entry_id="taken")], errors.EntryExistsError, None),
        (
            [(M, user("a")), (EntryKind.LABEL, {"targetId": "nowhere"})],
            errors.EntryNotFoundError,
            None,
        ),
        ([(M, user("a")), (M, result("never-called"))], errors.ToolCallPairingError, None),
        (
            [(M, call("c1")), (M, user("between")), (M, result("c1"))],
            errors.ToolCallPairingError,
            None,
        ),
    ],
)
def test_a_refused_batch_writes_nothing(
    store: turnkeeper.BaseStore, batch: list, error: type, field: str | None
) -> None:
    store.sessions.create("s")
    store.sessions.append("s", M, user("kept"), entry_id="taken")
    before = (store.sessions.get("s"), store.sessions.entries("s"))
    with pytest.raises(error) as caught:
        store.sessions.append_many("s", batch)
    if field is not None:
        assert caught.value.field == field
    assert (store.sessions.get("s"), store.sessions.entries("s")) == before


def test_a_batch_compares_and_sets_the_leaf(store: turnkeeper.BaseStore) -> None:
    store.sessions.create("s")
    first = store.sessions.append("s", M, user("a"))
    store.sessions.append("s", M, user("b"))
    with pytest.raises(errors.SessionModifiedError):
        store.sessions.append_many("s", [(M, user("c")), (M, user("d"))], expected_leaf=first.id)
    assert store.sessions.get("s").entry_count == 2


def test_a_batch_is_fenced_once_for_all_its_entries(store: turnkeeper.BaseStore, clock) -> None:
    """Under a held lease every entry carries its epoch; a lapsed lease or another
    holder's lease refuses the whole batch (and records the refusal); without a
    lease a held session is busy."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w1", 5)
    got = store.sessions.append_many("s", [(M, user("a")), (M, user("b"))], lease=lease)
    assert [e.lease_epoch for e in got] == [lease.epoch] * 2
    with pytest.raises(errors.BusyError):
        store.sessions.append_many("s", [(M, user("c"))])
    clock.advance(6)
    store.leases.acquire("session:s", "w2", 5)
    with pytest.raises(errors.LeaseLostError):
        store.sessions.append_many("s", [(M, user("stale")), (M, user("stale 2"))], lease=lease)
    assert store.sessions.get("s").entry_count == 2
    refused = store.query("SELECT operation FROM fence_events").column(0).to_pylist()
    assert refused == ["append_many"]


def test_control_without_the_fence_a_stale_batch_is_stored(
    store: turnkeeper.BaseStore, clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control for the test above: with the fence patched out (here only), the
    stale holder's batch goes through."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w1", 5)
    clock.advance(6)
    store.leases.acquire("session:s", "w2", 5)
    monkeypatch.setattr(leases, "fence", lambda tx, lease: None)
    monkeypatch.setattr(leases, "fenced", lambda tx, lease, part: None)  # read and fence as one
    store.sessions.append_many("s", [(M, user("stale")), (M, user("stale 2"))], lease=lease)
    assert store.sessions.get("s").entry_count == 2


def test_two_batches_racing_on_one_leaf_one_wins_whole(real_store: turnkeeper.BaseStore) -> None:
    """Threads appending batches with the same expected leaf: exactly one batch is
    stored, entirely; the others see SessionModifiedError and wrote nothing."""
    real_store.sessions.create("s")
    leaf = real_store.sessions.append("s", M, user("root")).id
    outcomes: list[str] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        batch = [(M, user(f"{i}-{n}")) for n in range(5)]
        try:
            real_store.sessions.append_many("s", batch, expected_leaf=leaf)
            what = "stored"
        except errors.SessionModifiedError:
            what = "modified"
        with lock:
            outcomes.append(what)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["modified"] * 3 + ["stored"]
    texts = [e.payload["message"]["content"] for e in real_store.sessions.entries("s")]
    assert len(texts) == 6 and len({t.split("-")[0] for t in texts[1:]}) == 1


def test_replay_walks_a_forked_tree_in_memory(store: turnkeeper.BaseStore) -> None:
    """Replay reads the rows flat and walks parent links from the leaf: only the
    current branch, root first, whatever the insertion order; a cycle forged into
    the table ends the walk instead of looping."""
    store.sessions.create("s")
    a = store.sessions.append("s", M, user("a"))
    store.sessions.append_many("s", [(M, user("b1")), (M, user("b2"))])
    store.sessions.branch("s", a.id)
    c = store.sessions.append_many("s", [(M, user("c1")), (M, user("c2"))])
    texts = [m["content"] for m in store.sessions.replay("s").messages]
    assert texts == ["a", "c1", "c2"]
    forge(store, "UPDATE entries SET parent_id = ? WHERE id = ?", [c[-1].id, a.id], rows=1)
    # the rows walked afresh (a replay would come from the cache: entries never change)
    path = store.db.read("walk", lambda tx: session_rows.branch_path(tx, "s"))
    assert [e.payload["message"]["content"] for e in path] == ["a", "c1", "c2"]
