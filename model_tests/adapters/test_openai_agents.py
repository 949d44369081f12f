"""``turnkeeper.openai_agents.TurnkeeperSession``: the SDK's Session protocol, exact
round trips of every input item type, atomic ``pop_item``, clear as a delete, bounded
reads, fencing, and compaction through the SDK's compaction session; on both backends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from agents.memory import OpenAIResponsesCompactionSession, Session
from openai_agents_fakes import COMPACTED, FakeClient
from openai_agents_items import every_item, item_types
from through_aio import async_store

import turnkeeper
from turnkeeper.aio import AsyncStore
from turnkeeper.fuzz import FakeClock
from turnkeeper.openai_agents import REPLACED_TYPE, TurnkeeperSession

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def astore(store: turnkeeper.BaseStore) -> AsyncIterator[AsyncStore]:
    # native on PostgreSQL; closing it closes its workers or pool, not the store
    async with await async_store(store) as wrapped:
        yield wrapped


def _text(n: int) -> dict[str, Any]:
    return {"role": "user", "content": f"message {n}"}


def _dumps(items: list[Any]) -> str:
    return json.dumps(items, ensure_ascii=False)  # key order counts


async def test_is_the_sdks_session_protocol(astore: AsyncStore) -> None:
    assert isinstance(TurnkeeperSession("chat", astore), Session)


async def test_every_input_item_type_round_trips_exactly(astore: AsyncStore) -> None:
    items = every_item()
    assert len(item_types()) >= 30  # the union the SDK imports, not a hand-picked few
    session = TurnkeeperSession("chat", astore)
    await session.add_items(items[:5])
    await session.add_items(items[5:])
    again = await TurnkeeperSession("chat", astore).get_items()
    assert _dumps(again) == _dumps(items)
    assert [list(i) for i in again] == [list(i) for i in items]
    assert _dumps(await session.get_items(limit=3)) == _dumps(items[-3:])
    assert _dumps([await session.pop_item()]) == _dumps(items[-1:])


async def test_limits_follow_sqlite_session(astore: AsyncStore) -> None:
    session = TurnkeeperSession("chat", astore, session_settings={"limit": 2})
    assert await session.get_items() == [] and await session.pop_item() is None
    await session.add_items([_text(i) for i in range(5)])
    assert await session.get_items() == [_text(3), _text(4)]
    assert await session.get_items(limit=0) == []
    assert await session.get_items(limit=-1) == [_text(i) for i in range(5)]
    assert await session.get_items(limit=10) == [_text(i) for i in range(5)]
    await session.add_items([_text(i) for i in range(5, 300)])  # several windows of reads
    every = [_text(i) for i in range(300)]
    assert await session.get_items(limit=2**31 - 1) == every  # the SDK's "all" limit
    assert await session.get_items(limit=-1) == every
    assert await session.get_items(limit=299) == every[1:]


async def test_reads_never_read_the_whole_session(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = TurnkeeperSession("chat", astore)
    await session.add_items([_text(i) for i in range(300)])
    asked: list[int] = []
    real = astore.sessions.path_latest

    async def spy(session_id: str, limit: int, **kwargs: Any) -> Any:
        asked.append(limit)
        return await real(session_id, limit, **kwargs)

    monkeypatch.setattr(astore.sessions, "path_latest", spy)
    assert await session.get_items(limit=3) == [_text(297), _text(298), _text(299)]
    assert asked == [4]  # one more than asked: to know whether any item precedes
    await session.replace_items([_text(1000), _text(1001)])
    asked.clear()
    assert await session.get_items() == [_text(1000), _text(1001)]
    assert asked == [64]  # stopped at the replacement, 300 entries before it unread
    assert await session.pop_item() == _text(1001)
    assert await session.pop_item() == _text(1000)
    assert await session.pop_item() is None  # never pops past a replacement
    assert await session.get_items() == []


async def test_clear_session_deletes_and_a_fresh_session_follows(
    astore: AsyncStore,
) -> None:
    session = TurnkeeperSession("chat", astore)
    await session.add_items([_text(1), _text(2)])
    first = session.bound_session_id
    assert first is not None
    other_view = TurnkeeperSession("chat", astore)
    assert await other_view.get_items() == [_text(1), _text(2)]
    await session.clear_session()
    assert await astore.sessions.get(first) is None
    gone = await astore.sessions.deleted(first)
    assert gone is not None and gone.entries == 2
    assert await session.get_items() == []
    assert await other_view.get_items() == []  # its cached binding found deleted
    await other_view.add_items([_text(3)])
    assert await session.get_items() == [_text(3)]
    assert session.bound_session_id not in (None, first)
    await session.clear_session()
    await session.clear_session()  # nothing bound: a no-op


async def _race_on_leaf(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch, poppers: int
) -> list[Any]:
    """``poppers`` sessions each read the leaf, and only then does any of them move it."""
    real = astore.sessions.path_latest
    barrier = asyncio.Barrier(poppers)
    first_reads = {"left": poppers}

    async def read_together(session_id: str, limit: int, **kwargs: Any) -> Any:
        found = await real(session_id, limit, **kwargs)
        if first_reads["left"] > 0:
            first_reads["left"] -= 1
            await barrier.wait()
        return found

    monkeypatch.setattr(astore.sessions, "path_latest", read_together)
    sessions = [TurnkeeperSession("chat", astore) for _ in range(poppers)]
    return list(await asyncio.gather(*(s.pop_item() for s in sessions)))


async def test_pop_item_is_a_compare_and_set_on_the_leaf(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await TurnkeeperSession("chat", astore).add_items([_text(i) for i in range(5)])
    popped = await _race_on_leaf(astore, monkeypatch, 3)
    assert sorted(p["content"] for p in popped) == ["message 2", "message 3", "message 4"]
    assert await TurnkeeperSession("chat", astore).get_items() == [_text(0), _text(1)]


async def test_control_without_the_expected_leaf_two_callers_pop_one_item(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await TurnkeeperSession("chat", astore).add_items([_text(i) for i in range(5)])
    real_branch = astore.sessions.branch

    async def unguarded(session_id: str, entry_id: str | None, **kwargs: Any) -> None:
        kwargs.pop("expected_leaf")
        await real_branch(session_id, entry_id, **kwargs)

    monkeypatch.setattr(astore.sessions, "branch", unguarded)
    popped = await _race_on_leaf(astore, monkeypatch, 3)
    assert popped == [_text(4)] * 3  # the guard is what keeps pops apart


async def test_many_concurrent_pops_pop_each_item_exactly_once(astore: AsyncStore) -> None:
    await TurnkeeperSession("chat", astore).add_items([_text(i) for i in range(40)])

    async def drain(session: TurnkeeperSession) -> list[Any]:
        got = []
        while (item := await session.pop_item()) is not None:
            got.append(item["content"])
        return got

    results = await asyncio.gather(*(drain(TurnkeeperSession("chat", astore)) for _ in range(8)))
    popped = [c for r in results for c in r]
    assert sorted(popped) == sorted(f"message {i}" for i in range(40))
    for got in results:  # each caller saw them newest first
        assert got == sorted(got, key=lambda c: -int(c.split()[1]))


async def test_a_fenced_session_refuses_a_stale_writer(
    astore: AsyncStore, clock: FakeClock
) -> None:
    a = await TurnkeeperSession.acquire("chat", astore, "worker-a", ttl_s=10)
    await a.add_items([_text(1)])
    clock.advance(11)  # a's lease expired: b takes over
    b = await TurnkeeperSession.acquire("chat", astore, "worker-b", ttl_s=10)
    assert b.lease is not None and a.lease is not None and b.lease.epoch > a.lease.epoch
    with pytest.raises(turnkeeper.LeaseLostError):
        await a.add_items([_text(2)])
    with pytest.raises(turnkeeper.LeaseLostError):
        await a.pop_item()
    with pytest.raises(turnkeeper.BusyError):  # unfenced, while b holds it
        await TurnkeeperSession("chat", astore).add_items([_text(3)])
    await b.add_items([_text(4)])
    assert await b.get_items() == [_text(1), _text(4)]
    await b.clear_session()  # b deletes under its lease and holds the fresh session
    assert b.lease is not None and b.lease.target == f"session:{b.bound_session_id}"
    with pytest.raises(turnkeeper.LeaseLostError):
        await a.add_items([_text(5)])
    with pytest.raises(turnkeeper.LeaseLostError):
        await a.clear_session()
    await b.add_items([_text(6)])
    assert await TurnkeeperSession("chat", astore).get_items() == [_text(6)]


async def test_control_a_stale_writer_that_rebinds_writes_into_the_new_session(
    astore: AsyncStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await TurnkeeperSession.acquire("chat", astore, "worker-a", ttl_s=10)
    clock.advance(11)
    b = await TurnkeeperSession.acquire("chat", astore, "worker-b", ttl_s=10)
    await b.clear_session()
    assert b.lease is not None
    await astore.leases.release(b.lease)

    def rebind(self: TurnkeeperSession) -> None:  # the guard patched out: rebind, unfenced
        self._bound, self._lease = None, None

    monkeypatch.setattr(TurnkeeperSession, "_gone", rebind)
    await a.add_items([_text(99)])  # a stale writer's item lands in b's fresh session
    assert await TurnkeeperSession("chat", astore).get_items() == [_text(99)]


async def test_compaction_through_the_sdk_replaces_in_one_write(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = TurnkeeperSession("chat", astore)
    await session.add_items([_text(i) for i in range(10)])
    client = FakeClient(COMPACTED)
    compacting = OpenAIResponsesCompactionSession(
        "chat",
        session,
        client=client,
        compaction_mode="input",  # type: ignore[arg-type]
    )
    calls: list[str] = []
    for name in ("clear_session", "add_items", "replace_items"):
        real = getattr(session, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(session, name, spy)
    await compacting.run_compaction({"force": True})
    assert calls == ["replace_items"]
    assert client.responses.calls[0]["input"][0] == _text(0)
    assert await session.get_items() == COMPACTED
    bound = session.bound_session_id
    assert bound is not None
    path = await astore.sessions.path_latest(bound, 3)
    assert path[0].payload == {"customType": REPLACED_TYPE, "data": {"keep": None}}


async def test_a_suffix_replacement_keeps_the_history_before_it(astore: AsyncStore) -> None:
    session = TurnkeeperSession("chat", astore)
    await session.add_items([_text(i) for i in range(6)])
    snapshot = await session._get_compaction_snapshot(4)
    assert snapshot is not None and not snapshot.complete
    assert snapshot.items == [_text(i) for i in range(2, 6)]
    assert await snapshot.replace_suffix(1, [_text(100)])  # items 3..5 become 100
    assert await session.get_items() == [_text(0), _text(1), _text(2), _text(100)]
    assert await session.get_items(limit=2) == [_text(2), _text(100)]
    again = await session._get_compaction_snapshot(10)
    assert again is not None and again.complete and len(again.items) == 4
    assert await again.replace_suffix(0, [_text(200)])  # the whole history
    assert await session.get_items() == [_text(200)]
    # pops walk back through what a replacement kept, one compare-and-set each
    await session.add_items([_text(300)])
    snap = await session._get_compaction_snapshot(1)
    assert snap is not None and await snap.replace_suffix(0, [])  # keeps [200]
    assert await session.pop_item() == _text(200)
    assert await session.pop_item() is None


async def test_a_suffix_replacement_of_a_changed_session_writes_nothing(
    astore: AsyncStore,
) -> None:
    session = TurnkeeperSession("chat", astore)
    await session.add_items([_text(i) for i in range(3)])
    snapshot = await session._get_compaction_snapshot(2)
    assert snapshot is not None
    await TurnkeeperSession("chat", astore).add_items([_text(3)])
    assert not await snapshot.replace_suffix(0, [_text(100)])
    assert await session.get_items() == [_text(i) for i in range(4)]
    late = await session._get_compaction_snapshot(2)
    assert late is not None
    assert await session.pop_item() == _text(3)
    assert not await late.replace_suffix(0, [_text(100)])  # a pop changed it too
    assert await session.get_items() == [_text(i) for i in range(3)]


async def test_pops_after_a_suffix_replacement_race_like_any_pop(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = TurnkeeperSession("chat", astore)
    await session.add_items([_text(i) for i in range(5)])
    snapshot = await session._get_compaction_snapshot(2)
    assert snapshot is not None and await snapshot.replace_suffix(0, [])  # keeps 0..2
    popped = await _race_on_leaf(astore, monkeypatch, 3)
    assert sorted(p["content"] for p in popped) == ["message 0", "message 1", "message 2"]
    assert await session.get_items() == []


async def test_control_without_the_expected_leaf_a_stale_replacement_drops_an_item(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = TurnkeeperSession("chat", astore)
    await session.add_items([_text(i) for i in range(3)])
    snapshot = await session._get_compaction_snapshot(2)
    assert snapshot is not None
    await TurnkeeperSession("chat", astore).add_items([_text(3)])
    real = astore.sessions.append_many

    async def unguarded(session_id: str, entries: Any, **kwargs: Any) -> Any:
        kwargs.pop("expected_leaf", None)
        return await real(session_id, entries, **kwargs)

    monkeypatch.setattr(astore.sessions, "append_many", unguarded)
    assert await snapshot.replace_suffix(0, [_text(100)])
    assert _text(3) not in await session.get_items()  # the guard is what keeps it
