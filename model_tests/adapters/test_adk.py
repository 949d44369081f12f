"""turnkeeper.adk: Google ADK's session service on the store (issue 20).

ADK's own contract tests run in ``vendored/adk/``; these cover what is
turnkeeper's: the exact event round trip, the two guards against a stale
writer (each with a control that patches the guard out and shows the stale
write landing), the compare-and-set of app and user state, delete, and the
id encoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
from google.adk.errors import StaleSessionError as AdkStaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError as AdkAlreadyExistsError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session
from google.genai import types
from through_aio import async_store

import turnkeeper
from turnkeeper.adk import (
    SessionExistsError,
    SessionNotFoundError,
    StaleSessionError,
    TurnkeeperSessionService,
    _codec,
    _scoped,
)
from turnkeeper.adk import service as adk_service
from turnkeeper.aio import AsyncStore
from turnkeeper.fuzz import FakeClock
from turnkeeper.spec.records import FinalizeRequest

APP, USER = "app", "user"


@pytest_asyncio.fixture
async def astore(store: turnkeeper.BaseStore) -> AsyncIterator[AsyncStore]:
    wrapped = await async_store(store)  # native on PostgreSQL
    yield wrapped
    await wrapped.close()


def event(invocation: str, **delta: Any) -> Event:
    return Event(
        invocation_id=invocation,
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=invocation)]),
        actions=EventActions(state_delta=delta),
    )


async def stored_events(service: TurnkeeperSessionService, sid: str) -> list[str]:
    got = await service.get_session(app_name=APP, user_id=USER, session_id=sid)
    assert got is not None
    return [e.invocation_id for e in got.events]


# -- the event round trip ------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_event_round_trips_exactly(astore: AsyncStore) -> None:
    service = TurnkeeperSessionService(astore, owner="w1")
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    rich = Event(
        invocation_id="inv",
        author="agent",
        branch="root.child",
        content=types.Content(
            role="model",
            parts=[
                types.Part(text="thinking", thought=True),
                types.Part.from_bytes(data=bytes(range(256)), mime_type="image/png"),
                types.Part(function_call=types.FunctionCall(id="c1", name="f", args={"x": [1]})),
            ],
        ),
        actions=EventActions(state_delta={"k": {"nested": [1, 2.5, None]}}, escalate=True),
        long_running_tool_ids={"c1"},
        usage_metadata=types.GenerateContentResponseUsageMetadata(total_token_count=7),
        custom_metadata={"a": 1},
        timestamp=1700000000.123456,
    )
    await service.append_event(session, rich)
    got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert got is not None and got.events == [rich] and got == session
    entry = (await astore.sessions.entries(_codec.session_key(APP, USER, "s")))[-1]
    assert _codec.event_of(entry.payload) == rich


# -- guard 1: a stale Session object -------------------------------------------------


async def _stale_append(service: TurnkeeperSessionService) -> Session:
    """Two loads of one session; the second appends; returns the first (stale)."""
    await service.create_session(app_name=APP, user_id=USER, session_id="s")
    stale = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    fresh = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stale is not None and fresh is not None
    await service.append_event(fresh, event("fresh", k="fresh"))
    return stale


@pytest.mark.asyncio
async def test_a_stale_session_is_refused_typed_and_writes_nothing(astore: AsyncStore) -> None:
    service = TurnkeeperSessionService(astore, owner="w1")
    stale = await _stale_append(service)
    with pytest.raises(StaleSessionError) as refused:
        await service.append_event(stale, event("late", k="late", **{"user:u": 1}))
    err = refused.value
    assert isinstance(err, turnkeeper.SessionModifiedError)
    assert isinstance(err, AdkStaleSessionError) and "modified in storage" in str(err)
    assert err.session_id == _codec.session_key(APP, USER, "s")
    assert err.expected_leaf is None and err.actual_leaf is not None
    assert await stored_events(service, "s") == ["fresh"]
    assert await service.get_user_state(app_name=APP, user_id=USER) == {}
    assert stale.events == []  # the caller's session is unchanged too
    reloaded = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert reloaded is not None
    await service.append_event(reloaded, event("after reload"))
    assert await stored_events(service, "s") == ["fresh", "after reload"]


@pytest.mark.asyncio
async def test_control_without_the_leaf_fence_the_stale_append_lands(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard patched out (expect whatever leaf is stored, as a service that
    silently reloads would): the stale writer's event lands after one it never saw."""
    service = TurnkeeperSessionService(astore, owner="w1")
    stale = await _stale_append(service)
    monkeypatch.setattr(
        TurnkeeperSessionService,
        "_expected_leaf",
        lambda self, key, session, stored, last: stored.leaf_id,
    )
    await service.append_event(stale, event("late", k="late"))
    assert await stored_events(service, "s") == ["fresh", "late"]


# -- guard 2: the writer's lease -----------------------------------------------------


async def _two_writers(
    astore: AsyncStore, clock: FakeClock
) -> tuple[TurnkeeperSessionService, TurnkeeperSessionService]:
    """w1 appends under its lease; the lease runs out; w2 takes the session over
    and appends; w1 reloads (its Session is current) and appends again."""
    w1 = TurnkeeperSessionService(astore, owner="w1", ttl_s=30)
    w2 = TurnkeeperSessionService(astore, owner="w2", ttl_s=30)
    session = await w1.create_session(app_name=APP, user_id=USER, session_id="s")
    await w1.append_event(session, event("w1 first"))
    clock.advance(60)
    taken = await w2.get_session(app_name=APP, user_id=USER, session_id="s")
    assert taken is not None
    await w2.append_event(taken, event("w2 takes over"))
    return w1, w2


@pytest.mark.asyncio
async def test_a_writer_whose_lease_was_taken_over_is_refused(
    astore: AsyncStore, clock: FakeClock
) -> None:
    w1, w2 = await _two_writers(astore, clock)
    held = w2.lease(app_name=APP, user_id=USER, session_id="s")
    lost = w1.lease(app_name=APP, user_id=USER, session_id="s")
    assert held is not None and lost is not None and held.epoch == lost.epoch + 1
    current = await w1.get_session(app_name=APP, user_id=USER, session_id="s")
    assert current is not None
    with pytest.raises(turnkeeper.LeaseLostError) as refused:
        await w1.append_event(current, event("w1 late", **{"app:a": 1}))
    assert refused.value.target == f"session:{_codec.session_key(APP, USER, 's')}"
    assert await stored_events(w1, "s") == ["w1 first", "w2 takes over"]
    assert await _scoped.read(astore, _codec.app_state_key(APP)) == {}
    # Its next try takes no lease from the live holder: refused again, typed.
    with pytest.raises(turnkeeper.BusyError) as busy:
        await w1.append_event(current, event("w1 again"))
    assert busy.value.holder == "w2"
    assert await stored_events(w1, "s") == ["w1 first", "w2 takes over"]
    # The holder goes on.
    await w2.append_event(current, event("w2 next"))
    assert await stored_events(w2, "s") == ["w1 first", "w2 takes over", "w2 next"]


@pytest.mark.asyncio
async def test_a_lease_that_ran_out_between_appends_is_lost_once(
    astore: AsyncStore, clock: FakeClock
) -> None:
    service = TurnkeeperSessionService(astore, owner="w1", ttl_s=30)
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    await service.append_event(session, event("first"))
    clock.advance(31)  # a pause longer than ttl_s; nobody takes the session
    with pytest.raises(turnkeeper.LeaseLostError):
        await service.append_event(session, event("late"))
    assert await stored_events(service, "s") == ["first"]
    await service.append_event(session, event("retried"))
    assert await stored_events(service, "s") == ["first", "retried"]


@pytest.mark.asyncio
async def test_a_second_writer_is_refused_while_the_first_holds_the_lease(
    astore: AsyncStore,
) -> None:
    w1 = TurnkeeperSessionService(astore, owner="w1")
    w2 = TurnkeeperSessionService(astore, owner="w2")
    session = await w1.create_session(app_name=APP, user_id=USER, session_id="s")
    await w1.append_event(session, event("w1"))
    other = await w2.get_session(app_name=APP, user_id=USER, session_id="s")
    assert other is not None
    with pytest.raises(turnkeeper.BusyError):
        await w2.append_event(other, event("w2"))
    with pytest.raises(turnkeeper.BusyError):
        await w2.delete_session(app_name=APP, user_id=USER, session_id="s")
    assert await stored_events(w1, "s") == ["w1"]
    assert await w1.release_session(app_name=APP, user_id=USER, session_id="s")
    await w2.append_event(other, event("w2"))  # free now
    assert await stored_events(w1, "s") == ["w1", "w2"]


@pytest.mark.asyncio
async def test_control_without_the_lease_both_writers_succeed(
    astore: AsyncStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease patched out (appends without one): the writer w2 took the
    session from writes as well, the two-writers-both-succeed failure."""

    async def no_lease(self: TurnkeeperSessionService, key: str) -> None:
        return None

    monkeypatch.setattr(TurnkeeperSessionService, "_lease", no_lease)
    w1, _ = await _two_writers(astore, clock)
    current = await w1.get_session(app_name=APP, user_id=USER, session_id="s")
    assert current is not None
    await w1.append_event(current, event("w1 late"))
    assert await stored_events(w1, "s") == ["w1 first", "w2 takes over", "w1 late"]


# -- app and user state --------------------------------------------------------------


async def _raced_update(astore: AsyncStore, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Writer A reads the user state, B updates it, then A writes its delta."""
    key = _codec.user_state_key(APP, USER)
    await _scoped.update(astore, key, {"x": 0})
    seen_by_a = await astore.threads.resolve(key=key)
    await _scoped.update(astore, key, {"b": 2})
    real = astore.threads.resolve
    reads = [seen_by_a]

    async def resolve(**kwargs: Any) -> Any:
        return reads.pop() if reads else await real(**kwargs)

    monkeypatch.setattr(astore.threads, "resolve", resolve)
    await _scoped.update(astore, key, {"a": 1})
    monkeypatch.setattr(astore.threads, "resolve", real)
    return await _scoped.read(astore, key)


@pytest.mark.asyncio
async def test_a_scope_update_that_lost_a_race_merges_into_the_winner(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await _raced_update(astore, monkeypatch) == {"x": 0, "a": 1, "b": 2}


@pytest.mark.asyncio
async def test_control_without_the_compare_and_set_an_update_is_lost(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compare-and-set patched out (save over the key, archiving whatever
    is bound): B's update is lost."""

    def blind(record: Any, **_: Any) -> FinalizeRequest:
        return FinalizeRequest(record, rebind_active=True)

    monkeypatch.setattr(_scoped, "FinalizeRequest", blind)
    assert await _raced_update(astore, monkeypatch) == {"x": 0, "a": 1}


@pytest.mark.asyncio
async def test_two_sessions_of_a_user_write_user_state_at_once(astore: AsyncStore) -> None:
    service = TurnkeeperSessionService(astore, owner="w1")
    one = await service.create_session(app_name=APP, user_id=USER, session_id="one")
    two = await service.create_session(app_name=APP, user_id=USER, session_id="two")
    await asyncio.gather(
        service.append_event(one, event("one", **{"user:one": 1})),
        service.append_event(two, event("two", **{"user:two": 2})),
    )
    assert await service.get_user_state(app_name=APP, user_id=USER) == {"one": 1, "two": 2}


@pytest.mark.asyncio
async def test_state_survives_an_entry_of_another_kind_on_the_leaf(astore: AsyncStore) -> None:
    """A title set through the store (a ``session_info`` entry) becomes the leaf:
    the session's state, time and next append still come from its last event."""
    service = TurnkeeperSessionService(astore, owner="w1")
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    first = event("first", k=1)
    await service.append_event(session, first)
    key = _codec.session_key(APP, USER, "s")
    await service.release_session(app_name=APP, user_id=USER, session_id="s")
    await astore.sessions.set_title(key, "named")
    got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert got is not None and got.state == {"k": 1} and got.events == [first]
    assert got.last_update_time == first.timestamp
    listed = (await service.list_sessions(app_name=APP, user_id=USER)).sessions
    assert [(s.state, s.last_update_time) for s in listed] == [({"k": 1}, first.timestamp)]
    with pytest.raises(StaleSessionError):  # loaded before the title
        await service.append_event(session, event("stale"))
    await service.append_event(got, event("second", j=2))
    again = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert again is not None and again.state == {"k": 1, "j": 2}


async def _cancel_while_scopes_write(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """Cancel an append once its event is stored and its ``user:`` change is
    under way; let that change go on; the user state then."""
    service = TurnkeeperSessionService(astore, owner="w1")
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    real = _scoped.update
    started, go = asyncio.Event(), asyncio.Event()
    writers: list[asyncio.Task[Any]] = []

    async def slow(store: AsyncStore, key: str, delta: dict[str, Any]) -> None:
        if delta:
            writers.append(asyncio.current_task())  # type: ignore[arg-type]
            started.set()
            await go.wait()
        await real(store, key, delta)

    monkeypatch.setattr(_scoped, "update", slow)
    append = asyncio.create_task(service.append_event(session, event("e", **{"user:u": 1})))
    await started.wait()
    append.cancel()
    with pytest.raises(asyncio.CancelledError):
        await append
    go.set()
    with contextlib.suppress(asyncio.CancelledError):
        await writers[0]
    assert await stored_events(service, "s") == ["e"]
    return await service.get_user_state(app_name=APP, user_id=USER)


@pytest.mark.asyncio
async def test_a_cancel_after_the_event_is_stored_keeps_its_scope_changes(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await _cancel_while_scopes_write(astore, monkeypatch) == {"u": 1}


@pytest.mark.asyncio
async def test_control_without_the_shield_a_cancel_loses_the_scope_changes(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    unshielded = SimpleNamespace(shield=lambda f: f, ensure_future=asyncio.ensure_future)
    monkeypatch.setattr(adk_service, "asyncio", unshielded)
    assert await _cancel_while_scopes_write(astore, monkeypatch) == {}


# -- delete, ids, typed errors -------------------------------------------------------


@pytest.mark.asyncio
async def test_delete_session_deletes_and_keeps_app_and_user_state(astore: AsyncStore) -> None:
    service = TurnkeeperSessionService(astore, owner="w1")
    session = await service.create_session(
        app_name=APP, user_id=USER, session_id="s", state={"app:a": 1, "user:u": 2, "k": 3}
    )
    await service.append_event(session, event("e", k=4))
    await service.delete_session(app_name=APP, user_id=USER, session_id="s")
    key = _codec.session_key(APP, USER, "s")
    assert await astore.sessions.get(key) is None
    gone = await astore.sessions.deleted(key)
    assert gone is not None and gone.entries == 1 and gone.reason == "delete"
    assert await service.get_session(app_name=APP, user_id=USER, session_id="s") is None
    assert (await service.list_sessions(app_name=APP)).sessions == []
    await service.delete_session(app_name=APP, user_id=USER, session_id="s")  # no error
    assert await service.get_user_state(app_name=APP, user_id=USER) == {"u": 2}
    other = await service.create_session(app_name=APP, user_id="v")
    assert other.state == {"app:a": 1}
    with pytest.raises(SessionExistsError) as taken:  # the tombstone keeps the id
        await service.create_session(app_name=APP, user_id=USER, session_id="s")
    assert isinstance(taken.value, AdkAlreadyExistsError)
    assert isinstance(taken.value, turnkeeper.SessionIDExistsError)
    with pytest.raises(SessionNotFoundError) as missing:
        await service.append_event(session, event("after delete"))
    assert isinstance(missing.value, ValueError) and missing.value.session_id == key


@pytest.mark.asyncio
async def test_addresses_with_separators_stay_apart(astore: AsyncStore) -> None:
    service = TurnkeeperSessionService(astore, owner="w1")
    a = await service.create_session(app_name="x/y", user_id="z", session_id="s", state={"n": 1})
    b = await service.create_session(app_name="x", user_id="y/z", session_id="s", state={"n": 2})
    c = await service.create_session(app_name="x", user_id="y", session_id="z/s", state={"n": 3})
    assert len({_codec.session_key(s.app_name, s.user_id, s.id) for s in (a, b, c)}) == 3
    listed = (await service.list_sessions(app_name="x")).sessions
    assert sorted((s.user_id, s.id, s.state["n"]) for s in listed) == [
        ("y", "z/s", 3),
        ("y/z", "s", 2),
    ]
    assert [s.id for s in (await service.list_sessions(app_name="x/y")).sessions] == ["s"]
    assert [s.id for s in (await service.list_sessions(app_name="X")).sessions] == []


@pytest.mark.asyncio
async def test_recent_events_are_read_without_reading_the_session(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = TurnkeeperSessionService(astore, owner="w1")
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    for i in range(5):
        await service.append_event(session, event(f"e{i}", k=i))
    await service.release_session(app_name=APP, user_id=USER, session_id="s")
    await astore.sessions.set_title(_codec.session_key(APP, USER, "s"), "titled")
    whole = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert whole is not None

    async def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("read the whole session")

    monkeypatch.setattr(astore.sessions, "entries", refuse)
    for n in (0, 2, 9):
        got = await service.get_session(
            app_name=APP, user_id=USER, session_id="s", config=GetSessionConfig(num_recent_events=n)
        )
        assert got is not None
        assert got.events == (whole.events[-n:] if n else [])
        assert (got.state, got.last_update_time) == (whole.state, whole.last_update_time)
        assert got._storage_update_marker == whole._storage_update_marker
    await service.append_event(got, event("after a bounded read"))


@pytest.mark.asyncio
async def test_a_value_with_no_json_form_is_refused_typed(astore: AsyncStore) -> None:
    """ADK's database services store such a value's repr; here it is refused
    before anything is written."""
    service = TurnkeeperSessionService(astore, owner="w1")
    with pytest.raises(turnkeeper.InvalidInputError) as refused:
        await service.create_session(app_name=APP, user_id=USER, session_id="s", state={"f": len})
    assert refused.value.field == "state"
    assert await service.get_session(app_name=APP, user_id=USER, session_id="s") is None
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    with pytest.raises(turnkeeper.InvalidInputError) as refused:
        await service.append_event(session, event("e", k=1, **{"user:f": len}))
    assert refused.value.field == "event.actions.state_delta"
    assert await stored_events(service, "s") == []
    assert await service.get_user_state(app_name=APP, user_id=USER) == {}
    assert service.lease(app_name=APP, user_id=USER, session_id="s") is None


def test_the_errors_are_turnkeepers_and_adks_and_pickle() -> None:
    err = StaleSessionError("adk:a/u/s", "e1", "e2")
    assert isinstance(err, turnkeeper.TurnkeeperError)
    assert isinstance(err, AdkStaleSessionError)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is StaleSessionError
    assert (back.session_id, back.expected_leaf, back.actual_leaf) == ("adk:a/u/s", "e1", "e2")
