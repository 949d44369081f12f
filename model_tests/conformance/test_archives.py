"""``store.archives`` (session seed SaveResponseRun, SaveResponseTurn,
SaveResponseItem, GetResponseRun, GetResponseTurn, ListResponseRuns,
ListResponseItems, ListResponseReplayItems, ListResponseReplayTurns), on every
backend: records round-trip, a save is an upsert keyed by the caller's local
ids (so a retry after an unknown commit writes the same row again and keeps
its number), the replay reads take only completed and incomplete turns in
order, bad input and a missing session write nothing, and every save obeys
the one session-write rule (each guard with a control that fails with the
guard patched out)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from turnkeeper import (
    BusyError,
    InvalidInputError,
    LeaseLostError,
    ResponseItem,
    ResponseReplayTurn,
    ResponseRun,
    ResponseTurn,
    SessionNotFoundError,
)
from turnkeeper.storage.ops import archive_checks
from turnkeeper.storage.ops import archives as archives_ops

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
API = "openai-responses"


def _run(sid: str = "s", local: str = "bg-1", **kw: Any) -> ResponseRun:
    return ResponseRun(
        sid, local, kw.pop("provider", "openai"), API, kw.pop("state", "queued"), **kw
    )


def _turn(turn_id: str, status: str = "completed", sid: str = "s", **kw: Any) -> ResponseTurn:
    return ResponseTurn(sid, turn_id, "openai", API, "gpt-x", "replay", status, **kw)


def _item(turn_id: str, index: int, body: Any, sid: str = "s", **kw: Any) -> ResponseItem:
    return ResponseItem(
        sid, turn_id, kw.pop("item_type", "message"), body, output_index=index, **kw
    )


def _stored(store: Any, sid: str = "s") -> tuple[Any, ...]:
    """Everything the area stores for session ``sid``; a sealed value (an
    encrypted store's: each seal of a value differs) as ``"sealed"``."""
    return tuple(
        [
            {k: "sealed" if str(v).startswith("enc1:") else v for k, v in row.items()}
            for row in store.query(
                f"SELECT * FROM {t} WHERE session_id = ? ORDER BY id", [sid]
            ).to_pylist()
        ]
        for t in ("response_runs", "response_turns", "response_items")
    )


NOTHING = ([], [], [])


def test_a_run_round_trips_and_a_save_again_replaces_it_keeping_its_number(store):
    store.sessions.create("s")
    assert store.archives.get_run("s", "bg-1") is None and store.archives.runs("s") == []
    first = store.archives.save_run(
        _run(
            local_turn_id="r1:turn", message_id=7, response_id="resp_1", polling_url="https://p/1",
            last_event_sequence=3, created_at=T0,
        )
    )  # fmt: skip
    assert (first.id, first.created_at, first.updated_at) == (1, T0, T0)
    assert store.archives.get_run("s", "bg-1") == first
    assert (first.message_id, first.last_event_sequence, first.cancel_requested) == (7, 3, False)
    later = T0 + timedelta(minutes=5)
    second = store.archives.save_run(
        _run(state="in_progress", response_id="resp_1", cancel_requested=True, updated_at=later)
    )
    # the key's record replaced whole, its number and creation kept
    assert (second.id, second.created_at, second.updated_at) == (1, T0, later)
    assert (second.state, second.local_turn_id, second.message_id) == ("in_progress", "", None)
    assert second.cancel_requested is True
    assert store.archives.get_run("s", "bg-1") == second
    other = store.archives.save_run(_run(local="bg-2", created_at=T0 - timedelta(hours=1)))
    assert other.id == 2
    assert [r.local_run_id for r in store.archives.runs("s")] == ["bg-2", "bg-1"]  # oldest first
    assert [r.local_run_id for r in store.archives.runs("s", limit=1)] == ["bg-2"]
    stamped = store.archives.save_run(_run(local="bg-3"))  # times default to the store's now
    assert stamped.created_at == stamped.updated_at and stamped.created_at.tzinfo is not None


def test_a_retried_save_writes_the_same_rows_again(store):
    store.sessions.create("s")
    run = _run(created_at=T0, updated_at=T0, response_id="resp_1")
    turn = _turn("t1", created_at=T0, request_summary={"input": 2})
    item = _item("t1", 0, {"type": "message", "id": "m1"}, item_id="m1", created_at=T0)
    once = (store.archives.save_run(run), store.archives.save_turn(turn))
    once += (store.archives.save_item(item),)
    rows = _stored(store)
    again = (store.archives.save_run(run), store.archives.save_turn(turn))
    again += (store.archives.save_item(item),)
    assert again == once and _stored(store) == rows  # a retry after an unknown commit
    assert [len(t) for t in rows] == [1, 1, 1]


def test_a_turn_round_trips_with_its_summaries(store):
    store.sessions.create("s")
    assert store.archives.get_turn("s", "t1") is None
    done = T0 + timedelta(seconds=9)
    saved = store.archives.save_turn(
        _turn(
            "t1", message_id=4, request_id="req_1", response_id="resp_1",
            previous_response_id="resp_0", conversation_id="conv_1", incomplete_reason="",
            request_summary={"tools": ["bash"], "n": 1.5}, response_summary=[1, "two", None],
            created_at=T0, completed_at=done,
        )
    )  # fmt: skip
    assert saved.id == 1 and store.archives.get_turn("s", "t1") == saved
    assert saved.request_summary == {"tools": ["bash"], "n": 1.5}
    assert saved.response_summary == [1, "two", None]
    assert (saved.created_at, saved.completed_at) == (T0, done)
    moved = store.archives.save_turn(_turn("t1", status="incomplete", incomplete_reason="max"))
    assert (moved.id, moved.created_at, moved.status) == (1, T0, "incomplete")
    assert moved.request_summary is None and moved.completed_at is None


def test_items_are_keyed_by_item_key_and_listed_in_the_order_first_saved(store):
    store.sessions.create("s")
    a = store.archives.save_item(_item("t1", 1, {"type": "message"}, item_id="msg_1"))
    b = store.archives.save_item(_item("t1", 0, {"type": "reasoning"}))
    c = store.archives.save_item(_item("t1", 2, {"k": 1}, item_key="custom"))
    store.archives.save_item(_item("t2", 0, {"other": True}))
    assert (a.item_key, b.item_key, c.item_key) == ("msg_1:1", "output:0", "custom")
    # the same key again replaces the item and keeps its place
    a2 = store.archives.save_item(
        _item("t1", 1, {"type": "message", "v": 2}, item_id="msg_1", item_status="completed")
    )
    assert (a2.id, a2.sanitized, a2.item_status) == (a.id, {"type": "message", "v": 2}, "completed")
    listed = store.archives.items("s", "t1")
    assert [i.item_key for i in listed] == ["msg_1:1", "output:0", "custom"]
    assert listed[0] == a2 and [i.id for i in listed] == [1, 2, 3]
    assert store.archives.items("s", "t9") == []


def test_replay_reads_completed_and_incomplete_turns_in_order(store):
    store.sessions.create("s")
    store.archives.save_turn(_turn("t2", created_at=T0 + timedelta(seconds=2)))
    store.archives.save_turn(_turn("t1", "incomplete", created_at=T0 + timedelta(seconds=1)))
    store.archives.save_turn(_turn("t3", "in_progress", created_at=T0))
    store.archives.save_turn(_turn("t4", "failed", created_at=T0))
    for turn in ("t1", "t2", "t3", "t4"):
        store.archives.save_item(_item(turn, 1, {"turn": turn, "i": 1}))
        store.archives.save_item(_item(turn, 0, {"turn": turn, "i": 0}))
    store.archives.save_item(_item("t-none", 0, {"turn": "no turn record"}))
    want = [{"turn": t, "i": i} for t in ("t1", "t2") for i in (0, 1)]
    assert store.archives.replay_items("s") == want
    assert store.archives.replay_items("s", limit=3) == want[:3]
    assert store.archives.replay_turns("s") == [
        ResponseReplayTurn("t1", tuple(want[:2])),
        ResponseReplayTurn("t2", tuple(want[2:])),
    ]
    assert store.archives.replay_turns("s", limit=1) == [ResponseReplayTurn("t1", tuple(want[:2]))]


def test_replay_turns_sends_a_call_archived_twice_once(store):
    store.sessions.create("s")
    store.archives.save_turn(_turn("t1"))
    call = {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"}
    custom = {"type": "custom_tool_call", "id": "ct1", "input": "x"}
    store.archives.save_item(_item("t1", 0, call, item_key="streamed"))
    store.archives.save_item(_item("t1", 0, call, item_key="snapshot"))  # completed copy
    store.archives.save_item(_item("t1", 1, custom, item_key="a"))
    store.archives.save_item(_item("t1", 1, custom, item_key="b"))
    store.archives.save_item(_item("t1", 2, {"type": "message", "id": "m"}, item_key="m1"))
    store.archives.save_item(_item("t1", 2, {"type": "message", "id": "m"}, item_key="m2"))
    replayed = store.archives.replay_turns("s")
    assert replayed == [
        ResponseReplayTurn("t1", (call, custom, {"type": "message", "id": "m"}, {"type": "message", "id": "m"}))  # noqa: E501
    ]  # fmt: skip
    assert len(store.archives.replay_items("s")) == 6  # the items read keeps every row


def test_a_missing_session_is_refused_for_every_read_and_write(store):
    calls = (
        lambda: store.archives.save_run(_run("nope")),
        lambda: store.archives.save_turn(_turn("t", sid="nope")),
        lambda: store.archives.save_item(_item("t", 0, {}, sid="nope")),
        lambda: store.archives.get_run("nope", "bg"),
        lambda: store.archives.get_turn("nope", "t"),
        lambda: store.archives.runs("nope"),
        lambda: store.archives.items("nope", "t"),
        lambda: store.archives.replay_items("nope"),
        lambda: store.archives.replay_turns("nope"),
    )
    for call in calls:
        with pytest.raises(SessionNotFoundError):
            call()
    assert _stored(store, "nope") == NOTHING


def test_the_existence_check_fails_with_it_patched_out(store, monkeypatch):
    """Control: with the session check patched out, a save to no session is written."""
    # (a write reads the session's key version, which is its existence check)
    monkeypatch.setattr(archives_ops.sealed_json, "session_version", lambda tx, session_id: None)
    store.archives.save_run(_run("nope"))
    assert len(_stored(store, "nope")[0]) == 1


def test_bad_input_is_refused_and_writes_nothing(store):
    store.sessions.create("s")
    big = {"x": "y" * (archive_checks.MAX_ARCHIVE_JSON_BYTES)}
    bad = [
        lambda: store.archives.save_run("s"),
        lambda: store.archives.save_run(_run(provider="")),
        lambda: store.archives.save_run(_run(state="")),
        lambda: store.archives.save_run(ResponseRun("s", "bg", "openai", "", "queued")),
        lambda: store.archives.save_run(_run(local="")),
        lambda: store.archives.save_run(_run(message_id=-1)),
        lambda: store.archives.save_run(_run(last_event_sequence=True)),
        lambda: store.archives.save_run(_run(cancel_requested=1)),
        lambda: store.archives.save_run(_run(created_at=datetime(2026, 1, 1))),  # naive
        lambda: store.archives.save_run(_run(response_id=5)),
        lambda: store.archives.save_turn(_turn("")),
        lambda: store.archives.save_turn(ResponseTurn("s", "t", "openai", API, "", "r", "done")),
        lambda: store.archives.save_turn(ResponseTurn("s", "t", "openai", API, "m", "", "done")),
        lambda: store.archives.save_turn(_turn("t", status="")),
        lambda: store.archives.save_turn(_turn("t", request_summary=float("nan"))),
        lambda: store.archives.save_turn(_turn("t", response_summary=big)),
        lambda: store.archives.save_turn(_turn("t", completed_at=datetime(2026, 1, 1))),
        lambda: store.archives.save_item(_item("t", 0, None)),
        lambda: store.archives.save_item(_item("t", 0, {}, item_type="")),
        lambda: store.archives.save_item(_item("t", -1, {})),
        lambda: store.archives.save_item(_item("t", 0, big)),
        lambda: store.archives.save_item(_item("t", 0, (1, 2))),
        lambda: store.archives.save_item(_item("t", 0, {}, item_key="a\nb")),
        lambda: store.archives.save_item(_item("", 0, {})),
        lambda: store.archives.save_item("s"),
        lambda: store.archives.runs("s", limit=0),
        lambda: store.archives.replay_items("s", limit=0),
        lambda: store.archives.replay_turns("s", limit=-1),
        lambda: store.archives.get_run("s", ""),
        lambda: store.archives.items("s", ""),
    ]
    for i, call in enumerate(bad):
        with pytest.raises(InvalidInputError):
            call()
        assert _stored(store) == NOTHING, i
    # just under the bound is archived
    fits = {"x": "y" * (archive_checks.MAX_ARCHIVE_JSON_BYTES - len('{"x":""}'))}
    assert store.archives.save_item(_item("t", 0, fits)).sanitized == fits


def test_concurrent_saves_number_one_sessions_items_without_a_gap_or_a_repeat(real_store):
    real_store.sessions.create("s")
    barrier = threading.Barrier(3)
    failures: list[BaseException] = []

    def saver(n: int) -> None:
        barrier.wait()
        try:
            for i in range(8):
                real_store.archives.save_item(_item("t1", i, {"n": n}, item_key=f"{n}-{i}"))
                real_store.archives.save_item(
                    _item("t1", i, {"n": n, "again": 1}, item_key=f"{n}-{i}")
                )
        except BaseException as exc:  # the test reports it
            failures.append(exc)

    threads = [threading.Thread(target=saver, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    items = real_store.archives.items("s", "t1")
    assert sorted(i.id for i in items) == list(range(1, 25))
    assert all(i.sanitized["again"] == 1 for i in items)


# -- the session-write rule, with its controls ------------------------------------------

WRITES = {
    "save_run": lambda store, lease: store.archives.save_run(_run(), lease=lease),
    "save_turn": lambda store, lease: store.archives.save_turn(_turn("t1"), lease=lease),
    "save_item": lambda store, lease: store.archives.save_item(_item("t1", 0, {}), lease=lease),
}


def check_session_write_rule(store: Any, clock: Any, write: str) -> None:
    """Without a lease while another owner holds the session: BusyError; under a
    lease taken over since: LeaseLostError; nothing written either way; under the
    holder's lease: written. AssertionError when a refusal did not happen."""
    store.sessions.create("s")
    held = store.leases.acquire("session:s", "w1", 30)
    try:
        WRITES[write](store, None)
    except BusyError:
        pass
    else:
        raise AssertionError(f"{write} without a lease went through beside a live lease")
    assert _stored(store) == NOTHING
    clock.advance(31)
    store.leases.acquire("session:s", "w2", 30)  # takes it over
    try:
        WRITES[write](store, held)
    except LeaseLostError:
        pass
    else:
        raise AssertionError(f"{write} under a lost lease went through")
    assert _stored(store) == NOTHING
    clock.advance(31)
    mine = store.leases.acquire("session:s", "w3", 30)
    WRITES[write](store, mine)
    assert _stored(store) != NOTHING
    store.leases.release(mine)
    WRITES[write](store, None)  # nobody holds it: a write without a lease


@pytest.mark.parametrize("write", sorted(WRITES))
def test_an_archive_write_obeys_the_session_write_rule(store, clock, write):
    check_session_write_rule(store, clock, write)


@pytest.mark.parametrize("write", sorted(WRITES))
def test_the_rule_check_fails_with_the_fence_patched_out(store, clock, write, monkeypatch):
    """Control: with the fence (and the unheld check) patched out, the check sees
    the write go through."""
    monkeypatch.setattr(archives_ops.leases, "fence_or_unheld", lambda tx, target, lease: None)
    with pytest.raises(AssertionError, match="went through"):
        check_session_write_rule(store, clock, write)


def test_a_lease_on_another_session_is_refused(store):
    store.sessions.create("s")
    store.sessions.create("t")
    other = store.leases.acquire("session:t", "w", 30)
    with pytest.raises(InvalidInputError):
        store.archives.save_run(_run(), lease=other)
    assert _stored(store) == NOTHING
