"""``store.capabilities`` (session seed SaveSessionCapabilities, LoadSessionCapabilities,
SaveSessionCapabilityEvent, ListSessionCapabilityEvents[After|WithSeq]), on every
backend: the state round-trips and is replaced whole, events are numbered per
session in commit order, a caller's event id makes a retry idempotent, and both
writes obey the one session-write rule (each guard with a control that fails
with the guard patched out)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from turnkeeper import (
    BusyError,
    CapabilityEvent,
    CapabilityEventConflictError,
    InvalidInputError,
    LeaseLostError,
    SessionCapabilities,
    SessionNotFoundError,
)
from turnkeeper.storage.ops import capabilities as capabilities_ops


def _stored(store: Any) -> tuple[Any, Any]:
    """Everything the area stores for session ``s``."""
    return store.capabilities.load("s"), store.capabilities.events("s")


def test_the_state_round_trips_and_a_save_replaces_it_whole(store):
    store.sessions.create("s")
    assert store.capabilities.load("s") is None
    first = SessionCapabilities("s", mode="plan", display_mode="full", web_search=True)
    saved = store.capabilities.save(first)
    assert saved.updated_at is not None and saved.updated_at.tzinfo is not None
    assert store.capabilities.load("s") == saved
    assert (saved.mode, saved.web_search, saved.browser) == ("plan", True, False)
    second = SessionCapabilities("s", mode="act", browser=True, a2a_master=True)
    store.capabilities.save(second)
    got = store.capabilities.load("s")
    assert (got.mode, got.display_mode, got.web_search, got.browser, got.a2a_master) == (
        "act",
        "",
        False,
        True,
        True,
    )
    assert store.capabilities.load("other") is None  # no such session: nothing saved


def test_events_are_numbered_per_session_and_read_after_a_cursor(store):
    store.sessions.create("s")
    store.sessions.create("t")
    at = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    ids = [
        store.capabilities.record_event(
            CapabilityEvent("s", "web_search", "toggled", old_value=str(i), new_value=str(i + 1))
        )
        for i in range(3)
    ]
    store.capabilities.record_event(CapabilityEvent("t", "browser", timestamp=at))
    own = CapabilityEvent(
        "s", "mode", "changed", id="ev-4", run_id="r1", source="ui", actor="alice",
        old_value="plan", new_value="act", timestamp=at, data={"why": ["user", 1, None]},
    )  # fmt: skip
    assert store.capabilities.record_event(own) == "ev-4"
    events = store.capabilities.events("s")
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert [e.event.id for e in events] == [*ids, "ev-4"]
    assert len(set(ids)) == 3 and all(ids)
    assert events[3].event == own
    assert events[0].event.timestamp is not None and events[0].event.data is None
    assert [e.seq for e in store.capabilities.events("t")] == [1]  # its own numbering
    assert [e.seq for e in store.capabilities.events("s", after_seq=2)] == [3, 4]
    assert [e.seq for e in store.capabilities.events("s", after_seq=1, limit=2)] == [2, 3]
    assert store.capabilities.events("s", after_seq=4) == []


def test_a_retried_event_is_recorded_once_and_a_reused_id_is_refused(store):
    store.sessions.create("s")
    event = CapabilityEvent("s", "browser", "enabled", id="ev-1", new_value="on")
    assert store.capabilities.record_event(event) == "ev-1"
    assert store.capabilities.record_event(event) == "ev-1"  # a retry after an unknown commit
    stamped = store.capabilities.events("s")[0].event
    assert store.capabilities.record_event(stamped) == "ev-1"  # with the stored timestamp
    with pytest.raises(CapabilityEventConflictError) as err:
        store.capabilities.record_event(CapabilityEvent("s", "browser", id="ev-1", new_value="off"))
    assert (err.value.event_id, err.value.session_id) == ("ev-1", "s")
    assert [e.event.new_value for e in store.capabilities.events("s")] == ["on"]


def test_a_missing_session_is_refused_and_bad_input_writes_nothing(store):
    for write in (
        lambda: store.capabilities.save(SessionCapabilities("nope")),
        lambda: store.capabilities.record_event(CapabilityEvent("nope", "browser")),
        lambda: store.capabilities.events("nope"),
    ):
        with pytest.raises(SessionNotFoundError):
            write()
    store.sessions.create("s")
    bad = [
        lambda: store.capabilities.save("s"),
        lambda: store.capabilities.save(SessionCapabilities("s", browser=1)),
        lambda: store.capabilities.save(SessionCapabilities("s", mode=5)),
        lambda: store.capabilities.record_event(CapabilityEvent("s", "")),
        lambda: store.capabilities.record_event(CapabilityEvent("s", "x", data=float("nan"))),
        lambda: store.capabilities.record_event(CapabilityEvent("s", "x", data=(1, 2))),
        lambda: store.capabilities.record_event(
            CapabilityEvent("s", "x", timestamp=datetime(2026, 1, 1))  # naive
        ),
        lambda: store.capabilities.record_event(CapabilityEvent("s", "x", id="a\nb")),
        lambda: store.capabilities.events("s", after_seq=-1),
        lambda: store.capabilities.events("s", limit=0),
    ]
    for write in bad:
        with pytest.raises(InvalidInputError):
            write()
    assert _stored(store) == (None, [])


def test_concurrent_recorders_number_one_sessions_events_without_a_gap_or_a_repeat(real_store):
    real_store.sessions.create("s")
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def recorder(n: int) -> None:
        barrier.wait()
        try:
            for i in range(10):
                real_store.capabilities.record_event(CapabilityEvent("s", "c", id=f"{n}-{i}"))
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=recorder, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [e.seq for e in real_store.capabilities.events("s")] == list(range(1, 41))


# -- the session-write rule, with its controls ------------------------------------------

WRITES = {
    "save": lambda store, lease: store.capabilities.save(
        SessionCapabilities("s", mode="act"), lease=lease
    ),
    "record_event": lambda store, lease: store.capabilities.record_event(
        CapabilityEvent("s", "browser"), lease=lease
    ),
}


def check_session_write_rule(store: Any, clock: Any, write: str) -> None:
    """Without a lease while another owner holds the session: BusyError; under a
    lease taken over since: LeaseLostError; nothing written either way; under the
    holder's lease: written. AssertionError when a refusal did not happen."""
    store.sessions.create("s")
    held = store.leases.acquire("session:s", "w1", 30)
    for lease, error in ((None, BusyError),):
        try:
            WRITES[write](store, lease)
        except error:
            pass
        else:
            raise AssertionError(f"{write} without a lease went through beside a live lease")
    assert _stored(store) == (None, [])
    clock.advance(31)
    store.leases.acquire("session:s", "w2", 30)  # takes it over
    try:
        WRITES[write](store, held)
    except LeaseLostError:
        pass
    else:
        raise AssertionError(f"{write} under a lost lease went through")
    assert _stored(store) == (None, [])
    clock.advance(31)
    mine = store.leases.acquire("session:s", "w3", 30)
    WRITES[write](store, mine)
    assert _stored(store) != (None, [])


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_capability_write_obeys_the_session_write_rule(store, clock, write):
    check_session_write_rule(store, clock, write)


@pytest.mark.parametrize("write", sorted(WRITES))
def test_the_rule_check_fails_with_the_fence_patched_out(store, clock, write, monkeypatch):
    """Control: with the fence (and the unheld check) patched out, the check sees
    the write go through."""
    monkeypatch.setattr(capabilities_ops.leases, "fence_or_unheld", lambda tx, target, lease: None)
    with pytest.raises(AssertionError, match="went through"):
        check_session_write_rule(store, clock, write)
