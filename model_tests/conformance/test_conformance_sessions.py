"""Conformance: sessions, entries, branches, replay, labels, titles, listing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from turnkeeper import (
    EntryExistsError,
    EntryKind,
    EntryNotFoundError,
    InvalidInputError,
    LeaseLostError,
    SessionIDExistsError,
    SessionModifiedError,
    SessionNotFoundError,
)


@pytest.fixture
def store(any_store: Any) -> Any:
    """Each backend, called directly and through ``turnkeeper.aio`` (conftest's ``any_store``)."""
    return any_store


def user(text: str) -> dict:
    return {"message": {"role": "user", "content": [{"type": "text", "text": text}]}}


def assistant(text: str, model: str = "m1") -> dict:
    return {
        "message": {
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "provider": "p",
            "model": model,
        }
    }


SEED_KINDS = {
    EntryKind.MESSAGE: user("hi"),
    EntryKind.MODEL_CHANGE: {"provider": "p", "modelId": "m2"},
    EntryKind.MODE_CHANGE: {"mode": "plan"},
    EntryKind.THINKING_LEVEL_CHANGE: {"thinkingLevel": "high"},
    EntryKind.ADDITIONAL_DIRECTORIES: {"directories": ["/a", "/b"]},
    EntryKind.CUSTOM: {"customType": "ext", "data": {"k": 1}},
    EntryKind.CUSTOM_MESSAGE: {"customType": "note", "content": "c", "display": True},
    EntryKind.SESSION_INFO: {"name": "Title", "source": "manual"},
    EntryKind.TURN_START: {"turnId": "t1", "runId": "r1", "attempt": 1},
    EntryKind.TURN_END: {"turnId": "t1", "status": "completed"},
}


def test_create_and_reuse_of_an_id(store):
    s = store.sessions.create("s1", cwd="/w", header={"version": 3, "x": [1]})
    assert (s.id, s.cwd, s.leaf_id, s.entry_count, s.next_seq) == ("s1", "/w", None, 0, 1)
    assert s.header == {"version": 3, "x": [1]}
    with pytest.raises(SessionIDExistsError) as err:
        store.sessions.create("s1", cwd="/other")
    assert err.value.session_id == "s1"
    assert store.sessions.get("s1").cwd == "/w"


def test_generated_session_ids_are_uuid7(store):
    s = store.sessions.create()
    assert len(s.id) == 36 and s.id[14] == "7"


def test_append_every_seed_kind_builds_a_chain(store):
    store.sessions.create("s")
    ids = []
    for kind, payload in SEED_KINDS.items():
        e = store.sessions.append("s", kind, payload)
        assert e.parent_id == (ids[-1] if ids else None)
        assert e.kind == kind and e.payload == payload
        ids.append(e.id)
    lab = store.sessions.append("s", EntryKind.LABEL, {"targetId": ids[0], "label": "start"})
    comp = store.sessions.append(
        "s",
        EntryKind.COMPACTION,
        {"summary": "sum", "firstKeptEntryId": ids[0], "tokensBefore": 10},
    )
    got = store.sessions.entries("s")
    assert [e.id for e in got] == [*ids, lab.id, comp.id]
    assert [e.seq for e in got] == list(range(1, len(got) + 1))
    s = store.sessions.get("s")
    assert s.leaf_id == comp.id and s.entry_count == len(got) and s.title == "Title"


def test_unknown_kind_and_bad_payload_are_refused_with_nothing_written(store):
    store.sessions.create("s")
    for kind, payload, field in [
        ("nope", {}, "kind"),
        ("session", {}, "kind"),
        (EntryKind.MESSAGE, {"message": {"content": "x"}}, "message.role"),
        (EntryKind.LABEL, {"label": "x"}, "targetId"),
        (EntryKind.MESSAGE, {"id": "x", "message": {"role": "user"}}, "id"),
        (EntryKind.MESSAGE, {"message": {"role": "user", "content": "\ud800"}}, "payload"),
    ]:
        with pytest.raises(InvalidInputError) as err:
            store.sessions.append("s", kind, payload)
        assert err.value.field == field
    assert store.sessions.entries("s") == [] and store.sessions.get("s").leaf_id is None


def test_append_to_missing_session(store):
    with pytest.raises(SessionNotFoundError):
        store.sessions.append("nope", EntryKind.MESSAGE, user("x"))


def test_stale_expected_leaf_is_session_modified_and_adds_no_child(store):
    store.sessions.create("s")
    a = store.sessions.append("s", EntryKind.MESSAGE, user("a"), expected_leaf=None)
    b = store.sessions.append("s", EntryKind.MESSAGE, assistant("b"), expected_leaf=a.id)
    with pytest.raises(SessionModifiedError) as err:
        store.sessions.append("s", EntryKind.MESSAGE, user("c"), expected_leaf=a.id)
    assert (err.value.expected_leaf, err.value.actual_leaf) == (a.id, b.id)
    assert [e.id for e in store.sessions.entries("s")] == [a.id, b.id]
    with pytest.raises(SessionModifiedError):
        store.sessions.append("s", EntryKind.MESSAGE, user("c"), expected_leaf=None)


def test_caller_chosen_entry_id_must_be_new(store):
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, user("a"), entry_id="e1")
    with pytest.raises(EntryExistsError):
        store.sessions.append("s", EntryKind.MESSAGE, user("b"), entry_id="e1")
    store.sessions.create("t")
    assert store.sessions.append("t", EntryKind.MESSAGE, user("a"), entry_id="e1").id == "e1"


def test_label_needs_an_existing_target_and_latest_wins(store):
    store.sessions.create("s")
    a = store.sessions.append("s", EntryKind.MESSAGE, user("a"))
    with pytest.raises(EntryNotFoundError):
        store.sessions.set_label("s", "missing", "x")
    store.sessions.set_label("s", a.id, "one")
    store.sessions.set_label("s", a.id, "two")
    assert store.sessions.labels("s") == {a.id: "two"}
    store.sessions.set_label("s", a.id, None)
    assert store.sessions.labels("s") == {}


def test_title_latest_session_info_wins(store):
    store.sessions.create("s")
    store.sessions.set_title("s", "first")
    store.sessions.set_title("s", "second", source="auto")
    assert store.sessions.get("s").title == "second"


def test_branch_moves_leaf_and_next_append_forks(store):
    store.sessions.create("s")
    a = store.sessions.append("s", EntryKind.MESSAGE, user("a"))
    b = store.sessions.append("s", EntryKind.MESSAGE, assistant("b"))
    store.sessions.branch("s", a.id)
    c = store.sessions.append("s", EntryKind.MESSAGE, assistant("c"))
    assert c.parent_id == a.id
    assert [m["content"][0]["text"] for m in store.sessions.replay("s").messages] == ["a", "c"]
    store.sessions.branch("s", b.id, expected_leaf=c.id)
    assert store.sessions.replay("s").entry_ids == (a.id, b.id)
    with pytest.raises(SessionModifiedError):
        store.sessions.branch("s", a.id, expected_leaf=c.id)
    with pytest.raises(EntryNotFoundError):
        store.sessions.branch("s", "missing")
    store.sessions.branch("s", None)
    root2 = store.sessions.append("s", EntryKind.MESSAGE, user("new root"))
    assert root2.parent_id is None


def test_branch_with_summary_records_the_abandoned_leaf(store):
    store.sessions.create("s")
    a = store.sessions.append("s", EntryKind.MESSAGE, user("a"))
    b = store.sessions.append("s", EntryKind.MESSAGE, assistant("b"))
    summ = store.sessions.branch_with_summary("s", a.id, "tried b", expected_leaf=b.id)
    assert summ.parent_id == a.id and summ.payload["fromId"] == b.id
    r = store.sessions.replay("s")
    assert r.entry_ids == (a.id, summ.id)
    assert r.messages[1]["role"] == "branchSummary" and r.messages[1]["summary"] == "tried b"


def test_replay_applies_the_last_compaction(store):
    store.sessions.create("s")
    e = [
        store.sessions.append("s", EntryKind.MESSAGE, (user if i % 2 == 0 else assistant)(f"m{i}"))
        for i in range(6)
    ]
    store.sessions.append(
        "s",
        EntryKind.COMPACTION,
        {"summary": "old", "firstKeptEntryId": e[1].id, "tokensBefore": 5},
    )
    after = store.sessions.append("s", EntryKind.MESSAGE, user("m6"))
    comp = store.sessions.append(
        "s",
        EntryKind.COMPACTION,
        {"summary": "new", "firstKeptEntryId": e[4].id, "tokensBefore": 9},
    )
    last = store.sessions.append("s", EntryKind.MESSAGE, assistant("m7", model="m9"))
    store.sessions.append("s", EntryKind.TURN_END, {"turnId": "t", "status": "completed"})
    r = store.sessions.replay("s")
    assert r.messages[0] == {
        "role": "compactionSummary",
        "summary": "new",
        "tokensBefore": 9,
        "timestamp": r.messages[0]["timestamp"],
    }
    assert r.entry_ids == (comp.id, e[4].id, e[5].id, after.id, last.id)
    assert r.model == {"provider": "p", "modelId": "m9"}


def test_replay_compaction_first_kept_off_path_keeps_nothing_before(store):
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, user("a"))
    comp = store.sessions.append(
        "s", EntryKind.COMPACTION, {"summary": "s", "firstKeptEntryId": "gone"}
    )
    assert store.sessions.replay("s").entry_ids == (comp.id,)


def test_lease_fenced_append_stores_the_epoch_and_refuses_lost_leases(store, clock):
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 1, purpose="execution")
    e = store.sessions.append("s", EntryKind.MESSAGE, user("a"), lease=lease)
    assert e.lease_epoch == 1 and store.sessions.entries("s")[0].lease_epoch == 1
    clock.advance(1)
    with pytest.raises(LeaseLostError):
        store.sessions.append("s", EntryKind.MESSAGE, user("late"), lease=lease)
    assert len(store.sessions.entries("s")) == 1
    assert store.query("SELECT operation FROM fence_events").to_pylist() == [
        {"operation": "append"}
    ]


def test_timestamps_keep_microseconds_and_zones(store):
    store.sessions.create("s")
    ts = datetime(2026, 3, 1, 10, 0, 0, 123457, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    e = store.sessions.append("s", EntryKind.MESSAGE, user("a"), timestamp=ts)
    assert store.sessions.entries("s")[0].timestamp == ts == e.timestamp
    with pytest.raises(InvalidInputError):
        store.sessions.append("s", EntryKind.MESSAGE, user("b"), timestamp=datetime(2026, 1, 1))


def test_list_search_count_and_stable_cursor_pages(store):
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(7):
        store.sessions.create(
            f"s{i}", cwd=f"/w{i % 2}", created_at=base + timedelta(seconds=i // 2)
        )
    store.sessions.append("s3", EntryKind.MESSAGE, user("needle in text"))
    seen, cursor = [], None
    while True:
        page = store.sessions.list(limit=3, cursor=cursor)
        seen += [s.id for s in page.sessions]
        # appends between pages must not shift the pagination
        store.sessions.append("s0", EntryKind.MESSAGE, user("noise"))
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ["s6", "s5", "s4", "s3", "s2", "s1", "s0"]
    assert store.sessions.count() == 7
    # only the message's text holds "needle": a sealed one SQL cannot search
    assert store.sessions.count(search="needle") == (0 if store.db.keyring.encrypted else 1)
    assert [s.id for s in store.sessions.list(search="/w1").sessions] == ["s5", "s3", "s1"]
    with pytest.raises(InvalidInputError):
        store.sessions.list(cursor="garbage!")
    with pytest.raises(InvalidInputError):
        store.sessions.list(limit=0)
