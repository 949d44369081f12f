"""``turnkeeper.langgraph.TurnkeeperSaver`` under real LangGraph graphs: a thread
resumes, ``delete_thread`` deletes its session, ``prune`` keeps what a
``DeltaChannel`` needs (with the control that LangGraph's naive keep-latest
loses state), and a lease fences a stale writer. Both backends."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.graph import END, START, StateGraph
from through_aio import async_store

import turnkeeper
import turnkeeper.aio
import turnkeeper.langgraph._saver as saver_module
from turnkeeper.fuzz import FakeClock
from turnkeeper.langgraph import LEASE_KEY, AsyncTurnkeeperSaver, TurnkeeperSaver
from turnkeeper.langgraph._records import StoredCheckpoint


def _extend(state: list[str], writes: Sequence[list[str]]) -> list[str]:
    return state + [item for w in writes for item in w]


class Delta(TypedDict):
    items: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=3)]


class Plain(TypedDict):
    items: Annotated[list[str], operator.add]


def _graph(state: type[Any], saver: TurnkeeperSaver) -> Any:
    builder = StateGraph(state)
    builder.add_node("echo", lambda s: {"items": [f"echo-{len(s['items'])}"]})
    builder.add_edge(START, "echo")
    builder.add_edge("echo", END)
    return builder.compile(checkpointer=saver)


def _cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def test_a_graph_resumes_its_thread_from_the_store(store: turnkeeper.BaseStore) -> None:
    graph = _graph(Plain, TurnkeeperSaver(store))
    graph.invoke({"items": ["a"]}, _cfg("t1"))
    # another saver object on the same store: the state is the store's
    again = _graph(Plain, TurnkeeperSaver(store))
    out = again.invoke({"items": ["b"]}, _cfg("t1"))
    assert out["items"] == ["a", "echo-1", "b", "echo-3"]
    history = list(again.get_state_history(_cfg("t1")))
    assert [h.metadata["step"] for h in history] == [4, 3, 2, 1, 0, -1]


def test_delete_thread_deletes_its_session_and_the_thread_starts_over(
    store: turnkeeper.BaseStore,
) -> None:
    saver = TurnkeeperSaver(store)
    graph = _graph(Plain, saver)
    graph.invoke({"items": ["a"]}, _cfg("t1"))
    first = saver.session_id("t1")
    assert first is not None
    saver.delete_thread("t1")
    assert store.sessions.get(first) is None  # deleted, not marked
    gone = store.sessions.deleted(first)
    assert gone is not None and gone.entries > 0
    assert store.bindings.find("langgraph", "t1") is None
    assert graph.get_state(_cfg("t1")).values == {}
    out = graph.invoke({"items": ["z"]}, _cfg("t1"))
    assert out["items"] == ["z", "echo-1"]
    assert saver.session_id("t1") not in (None, first)  # a deleted id is never reused


def _run_delta_thread(saver: TurnkeeperSaver, turns: int) -> Any:
    graph = _graph(Delta, saver)
    for i in range(turns):
        graph.invoke({"items": [f"in-{i}"]}, _cfg("d1"))
    return graph


def _checkpoint_count(saver: TurnkeeperSaver, thread_id: str) -> int:
    return len(list(saver.list(_cfg(thread_id))))


def test_prune_keeps_the_chain_a_delta_channel_needs(store: turnkeeper.BaseStore) -> None:
    saver = TurnkeeperSaver(store)
    graph = _run_delta_thread(saver, 4)
    before = graph.get_state(_cfg("d1")).values["items"]
    assert len(before) == 8
    total = _checkpoint_count(saver, "d1")
    saver.prune(["d1"], strategy="keep_latest")
    kept = _checkpoint_count(saver, "d1")
    assert 1 < kept < total  # older than the last snapshot went; the chain to it stayed
    assert graph.get_state(_cfg("d1")).values["items"] == before
    out = graph.invoke({"items": ["more"]}, _cfg("d1"))  # and it resumes from there
    assert out["items"] == [*before, "more", "echo-9"]


def test_control_a_naive_keep_latest_rebuilds_the_delta_channel_empty(
    store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def naive(cps: Sequence[StoredCheckpoint], serde: Any) -> set[str]:
        latest: dict[str, StoredCheckpoint] = {}
        for c in cps:
            if c.ns not in latest or c.checkpoint_id > latest[c.ns].checkpoint_id:
                latest[c.ns] = c
        return {c.entry_id for c in latest.values()}

    monkeypatch.setattr(saver_module, "keep_latest", naive)
    saver = TurnkeeperSaver(store)
    graph = _run_delta_thread(saver, 4)
    before = graph.get_state(_cfg("d1")).values["items"]
    saver.prune(["d1"], strategy="keep_latest")
    assert _checkpoint_count(saver, "d1") == 1
    after = graph.get_state(_cfg("d1")).values.get("items", [])
    assert after != before and len(after) < len(before)  # lost, and no error said so


def test_prune_keep_latest_drops_what_no_kept_checkpoint_needs(
    store: turnkeeper.BaseStore,
) -> None:
    saver = TurnkeeperSaver(store)
    graph = _graph(Plain, saver)
    for i in range(3):
        graph.invoke({"items": [f"in-{i}"]}, _cfg("p1"))
    before = graph.get_state(_cfg("p1")).values
    old = saver.session_id("p1")
    saver.prune(["p1"])
    assert _checkpoint_count(saver, "p1") == 1
    assert graph.get_state(_cfg("p1")).values == before
    assert old is not None and store.sessions.get(old) is None  # rewritten, old one deleted
    try:
        saver.prune(["p1"], strategy="everything")
    except turnkeeper.InvalidInputError as refused:
        assert refused.field == "strategy"
    else:
        raise AssertionError("an unknown strategy was taken")


def _put(saver: TurnkeeperSaver, thread_id: str, parent: Any = None) -> Any:
    config = generate_config(thread_id)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    return saver.put(config, generate_checkpoint(), generate_metadata(), {})


def test_a_stale_writer_is_refused_and_writes_nothing(
    store: turnkeeper.BaseStore, clock: FakeClock
) -> None:
    sid = TurnkeeperSaver(store).session_id("w1", create=True)
    assert sid is not None
    lease_a = store.leases.acquire(f"session:{sid}", "writer-a", ttl_s=10)
    writer_a = TurnkeeperSaver(store, lease=lease_a)
    first = _put(writer_a, "w1")
    unleased = TurnkeeperSaver(store)
    with pytest.raises(turnkeeper.BusyError):  # A holds the thread
        _put(unleased, "w1", first)
    clock.advance(11)  # A stalls past its lease; B takes the thread over
    lease_b = store.leases.acquire(f"session:{sid}", "writer-b", ttl_s=10)
    writer_b = TurnkeeperSaver(store, lease=lease_b)
    second = _put(writer_b, "w1", first)
    with pytest.raises(turnkeeper.LeaseLostError):
        _put(writer_a, "w1", first)
    with pytest.raises(turnkeeper.LeaseLostError):
        writer_a.put_writes(first, [("ch", "late")], "task-a")
    ids = [t.config["configurable"]["checkpoint_id"] for t in writer_b.list(_cfg("w1"))]
    assert ids == [second["configurable"]["checkpoint_id"], first["configurable"]["checkpoint_id"]]
    got = writer_b.get_tuple(first)
    assert got is not None and got.pending_writes == []


def test_a_checkpoint_is_never_rewritten(store: turnkeeper.BaseStore) -> None:
    saver = TurnkeeperSaver(store)
    checkpoint = generate_checkpoint(channel_values={"x": 1}, channel_versions={"x": 1})
    config = generate_config("r1")
    saver.put(config, checkpoint, generate_metadata(), {"x": 1})
    saver.put(config, checkpoint, generate_metadata(), {"x": 1})  # a retry: the same
    assert _checkpoint_count(saver, "r1") == 1
    changed = {**checkpoint, "channel_values": {"x": 2}}
    with pytest.raises(turnkeeper.EntryExistsError):
        saver.put(config, changed, generate_metadata(), {"x": 2})  # type: ignore[arg-type]
    got = saver.get_tuple(_cfg("r1"))
    assert got is not None and got.checkpoint["channel_values"] == {"x": 1}


def test_prune_under_the_savers_lease_moves_the_fence_to_the_new_session(
    store: turnkeeper.BaseStore,
) -> None:
    sid = TurnkeeperSaver(store).session_id("f1", create=True)
    assert sid is not None
    lease = store.leases.acquire(f"session:{sid}", "writer-a", ttl_s=60)
    saver = TurnkeeperSaver(store, lease=lease)
    graph = _graph(Plain, saver)
    for i in range(2):
        graph.invoke({"items": [f"in-{i}"]}, _cfg("f1"))
    with pytest.raises(turnkeeper.BusyError):  # another pruner is refused; nothing changes
        TurnkeeperSaver(store).prune(["f1"])
    assert saver.session_id("f1") == sid
    saver.prune(["f1"])
    moved = saver.session_id("f1")
    assert moved not in (None, sid) and saver.lease is not None
    assert saver.lease.target == f"session:{moved}" and saver.lease.owner == "writer-a"
    graph.invoke({"items": ["after"]}, _cfg("f1"))  # still writing, fenced
    with pytest.raises(turnkeeper.BusyError):
        _put(TurnkeeperSaver(store), "f1", saver.get_tuple(_cfg("f1")).config)  # type: ignore[union-attr]


def test_a_lease_given_per_call_fences_that_write(
    store: turnkeeper.BaseStore, clock: FakeClock
) -> None:
    saver = TurnkeeperSaver(store)
    sid = saver.session_id("c1", create=True)
    lease = store.leases.acquire(f"session:{sid}", "writer-a", ttl_s=10)
    config = generate_config("c1")
    config["configurable"][LEASE_KEY] = lease
    first = saver.put(config, generate_checkpoint(), generate_metadata(), {})
    with pytest.raises(turnkeeper.BusyError):
        _put(saver, "c1", first)  # the same saver without the lease
    clock.advance(11)
    store.leases.acquire(f"session:{sid}", "writer-b", ttl_s=10)
    with pytest.raises(turnkeeper.LeaseLostError):
        saver.put(config, generate_checkpoint(), generate_metadata(), {})
    assert _checkpoint_count(saver, "c1") == 1


def test_the_async_saver_runs_a_graph_and_fences_a_stale_writer(
    store: turnkeeper.BaseStore, clock: FakeClock
) -> None:
    async def body() -> None:
        async with await async_store(store) as astore:  # native on PostgreSQL
            sid = await AsyncTurnkeeperSaver(astore).asession_id("a1", create=True)
            lease_a = await astore.leases.acquire(f"session:{sid}", "writer-a", ttl_s=10)
            saver_a = AsyncTurnkeeperSaver(astore, lease=lease_a)
            graph = _graph(Plain, saver_a)
            out = await graph.ainvoke({"items": ["x"]}, _cfg("a1"))
            assert out["items"] == ["x", "echo-1"]
            clock.advance(11)
            lease_b = await astore.leases.acquire(f"session:{sid}", "writer-b", ttl_s=10)
            before = [t async for t in saver_a.alist(_cfg("a1"))]
            with pytest.raises(turnkeeper.LeaseLostError):
                await graph.ainvoke({"items": ["y"]}, _cfg("a1"))
            assert [t async for t in saver_a.alist(_cfg("a1"))] == before
            saver_b = AsyncTurnkeeperSaver(astore, lease=lease_b)
            out = await _graph(Plain, saver_b).ainvoke({"items": ["y"]}, _cfg("a1"))
            assert out["items"] == ["x", "echo-1", "y", "echo-3"]

    asyncio.run(body())


def test_put_writes_judges_again_after_a_concurrent_writer_won(
    store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    saver = TurnkeeperSaver(store)
    stored = saver.put(generate_config("k1"), generate_checkpoint(), generate_metadata(), {})
    saver.put_writes(stored, [("ch", "first")], "task-1")
    real = saver_module._reads.writes
    calls: list[int] = []

    def stale(*args: Any) -> Any:  # the first read misses the other writer's rows
        calls.append(1)
        return [] if len(calls) == 1 else real(*args)

    monkeypatch.setattr(saver_module._reads, "writes", stale)
    saver.put_writes(stored, [("ch", "second")], "task-1")  # loses the race: kept as it was
    assert len(calls) == 2
    got = saver.get_tuple(stored)
    assert got is not None and got.pending_writes == [("task-1", "ch", "first")]
    calls.clear()
    monkeypatch.setattr(saver_module, "WRITE_ATTEMPTS", 1)  # control: no second judgement
    with pytest.raises(turnkeeper.EntryExistsError):
        saver.put_writes(stored, [("ch", "second")], "task-1")


def test_reads_and_writes_never_read_the_whole_session(
    store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    saver = TurnkeeperSaver(store)
    graph = _graph(Plain, saver)
    graph.invoke({"items": ["a"]}, _cfg("b1"))

    def whole(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("read the whole session")

    for name in ("entries", "replay", "path_after", "messages_with_seq"):
        monkeypatch.setattr(store.sessions, name, whole)
    out = graph.invoke({"items": ["b"]}, _cfg("b1"))  # get_tuple, put, put_writes
    assert out["items"] == ["a", "echo-1", "b", "echo-3"]
    assert len(list(saver.list(_cfg("b1"), limit=2))) == 2
    latest = saver.get_tuple(_cfg("b1"))
    assert latest is not None and saver.get_tuple(latest.config) == latest
    with pytest.raises(AssertionError, match="whole session"):  # control: the patch bites
        saver.copy_thread("b1", "b2")  # a copy reads the whole thread, as it must
