"""``store.guidance`` (session seed SaveESMGuidance, ListESMGuidance,
ConsumeESMGuidance) and ``store.resources`` (SaveInputResourceEvent,
ListInputResourceEvents), on every backend: guidance is queued by anyone, even
while a runtime holds the session, and consumed once by the runtime under the
session-write rule; resource events list in commit order and a deterministic
id makes a retry safe. Each guard has a control that fails with it patched out."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from turnkeeper import (
    BusyError,
    Guidance,
    GuidanceConflictError,
    InputResourceEvent,
    InvalidInputError,
    LeaseLostError,
    ResourceEventConflictError,
    SessionNotFoundError,
)
from turnkeeper.storage.ops import guidance as guidance_ops
from turnkeeper.storage.ops import resources as resources_ops

AT = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def test_guidance_is_queued_listed_by_status_and_consumed_once(store):
    store.sessions.create("s")
    store.sessions.create("t")
    store.leases.acquire("session:s", "runtime", 60)  # a runtime holds the session
    first = store.guidance.save(Guidance("g1", "s", "prefer small diffs", "v1"))
    assert (first.status, first.consumed_at) == ("pending", None) and first.created_at
    store.guidance.save(Guidance("g2", "s", "run the tests"))
    store.guidance.save(Guidance("g3", "t", "other session's"))
    assert [g.id for g in store.guidance.list("s")] == ["g1", "g2"]  # oldest first
    assert [g.id for g in store.guidance.list("s", limit=1)] == ["g1"]
    store.leases.release(store.leases.acquire("session:s", "runtime", 60))
    assert store.guidance.consume("s", ["g1", "g3", "missing"]) == 1  # g3 is t's
    assert store.guidance.consume("s", ["g1"]) == 0  # a retry changes nothing
    consumed = store.guidance.list("s", status="consumed")
    assert [g.id for g in consumed] == ["g1"] and consumed[0].consumed_at is not None
    assert [g.id for g in store.guidance.list("s", status="pending")] == ["g2"]
    assert [g.status for g in store.guidance.list("t")] == ["pending"]


def test_saving_the_same_guidance_again_is_a_retry_and_a_reused_id_is_refused(store):
    store.sessions.create("s")
    saved = store.guidance.save(Guidance("g1", "s", "go", created_at=AT))
    assert saved.created_at == AT  # the caller's time is kept
    assert store.guidance.save(Guidance("g1", "s", "go")) == saved
    for other in (Guidance("g1", "s", "stop"), Guidance("g1", "s", "go", "v2")):
        with pytest.raises(GuidanceConflictError) as err:
            store.guidance.save(other)
        assert (err.value.guidance_id, err.value.session_id) == ("g1", "s")
    assert store.guidance.list("s") == [saved]


def test_resource_events_list_in_commit_order_and_a_retry_is_written_once(store):
    store.sessions.create("s")
    event = InputResourceEvent(
        "s", "file-1", "materialized", id="s:file-1:1", run_id="r1", status="ready",
        timestamp=AT, data={"bytes": 12, "kind": ["text", None]},
    )  # fmt: skip
    assert store.resources.record_event(event) == "s:file-1:1"
    assert store.resources.record_event(event) == "s:file-1:1"  # after an unknown commit
    second = store.resources.record_event(InputResourceEvent("s", "file-1", "released"))
    assert second and second != event.id
    got = store.resources.events("s")
    assert got[0] == event and [e.event_type for e in got] == ["materialized", "released"]
    with pytest.raises(ResourceEventConflictError) as err:
        store.resources.record_event(InputResourceEvent("s", "file-2", "x", id="s:file-1:1"))
    assert (err.value.event_id, err.value.session_id) == ("s:file-1:1", "s")
    assert len(store.resources.events("s")) == 2


def test_concurrent_resource_events_keep_one_order(real_store):
    real_store.sessions.create("s")
    barrier, failures = threading.Barrier(4), []

    def recorder(n: int) -> None:
        barrier.wait()
        try:
            for i in range(8):
                real_store.resources.record_event(
                    InputResourceEvent("s", f"r{n}", "e", id=f"{n}.{i}")
                )
        except BaseException as exc:  # the test reports it
            failures.append(exc)

    threads = [threading.Thread(target=recorder, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    got = real_store.resources.events("s")
    assert sorted(e.id for e in got) == sorted(f"{n}.{i}" for n in range(4) for i in range(8))
    for n in range(4):  # each recorder's own events in the order it committed them
        assert [e.id for e in got if e.resource_id == f"r{n}"] == [f"{n}.{i}" for i in range(8)]
    seqs = real_store.query(
        "SELECT seq FROM input_resource_events WHERE session_id = 's' ORDER BY seq"
    ).column(0)
    assert seqs.to_pylist() == list(range(1, 33))


def test_a_missing_session_and_bad_input_write_nothing(store):
    for call in (
        lambda: store.guidance.save(Guidance("g", "nope", "x")),
        lambda: store.guidance.list("nope"),
        lambda: store.guidance.consume("nope", ["g"]),
        lambda: store.resources.record_event(InputResourceEvent("nope", "r", "e")),
        lambda: store.resources.events("nope"),
    ):
        with pytest.raises(SessionNotFoundError):
            call()
    store.sessions.create("s")
    for call in (
        lambda: store.guidance.save("g"),
        lambda: store.guidance.save(Guidance("", "s", "x")),
        lambda: store.guidance.save(Guidance("g", "s", "")),
        lambda: store.guidance.save(Guidance("g", "s", "x", status="consumed")),
        lambda: store.guidance.save(Guidance("g", "s", "x", created_at=datetime(2026, 1, 1))),
        lambda: store.guidance.list("s", status="done"),
        lambda: store.guidance.list("s", limit=0),
        lambda: store.guidance.consume("s", "g"),
        lambda: store.guidance.consume("s", ["a\nb"]),
        lambda: store.resources.record_event(InputResourceEvent("s", "", "e")),
        lambda: store.resources.record_event(InputResourceEvent("s", "r", "")),
        lambda: store.resources.record_event(InputResourceEvent("s", "r", "e", data={1: 2})),
    ):
        with pytest.raises(InvalidInputError):
            call()
    assert store.guidance.list("s") == [] and store.resources.events("s") == []


# -- the session-write rule, with its controls ------------------------------------------

WRITES = {
    "guidance.consume": lambda store, lease: store.guidance.consume("s", ["g1"], lease=lease),
    "resources.record_event": lambda store, lease: store.resources.record_event(
        InputResourceEvent("s", "r", "materialized"), lease=lease
    ),
}


def _stored(store: Any) -> tuple[Any, Any]:
    return [g.status for g in store.guidance.list("s")], store.resources.events("s")


def check_session_write_rule(store: Any, clock: Any, write: str) -> None:
    """Without a lease beside a live one: BusyError; under a lease taken over
    since: LeaseLostError; nothing written either way; under the holder's lease:
    written. AssertionError when a refusal did not happen."""
    store.sessions.create("s")
    store.guidance.save(Guidance("g1", "s", "go"))
    before = _stored(store)
    held = store.leases.acquire("session:s", "w1", 30)
    for lease, error, how in ((None, BusyError, "without a lease"),):
        try:
            WRITES[write](store, lease)
        except error:
            pass
        else:
            raise AssertionError(f"{write} {how} went through beside a live lease")
    assert _stored(store) == before
    clock.advance(31)
    store.leases.acquire("session:s", "w2", 30)  # takes it over
    try:
        WRITES[write](store, held)
    except LeaseLostError:
        pass
    else:
        raise AssertionError(f"{write} under a lost lease went through")
    assert _stored(store) == before
    clock.advance(31)
    WRITES[write](store, store.leases.acquire("session:s", "w3", 30))
    assert _stored(store) != before


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_guidance_or_resource_write_obeys_the_session_write_rule(store, clock, write):
    check_session_write_rule(store, clock, write)


@pytest.mark.parametrize("write", sorted(WRITES))
def test_the_rule_check_fails_with_the_fence_patched_out(store, clock, write, monkeypatch):
    """Control: with the fence (and the unheld check) patched out the check sees
    the write go through."""
    module = guidance_ops if write.startswith("guidance") else resources_ops
    monkeypatch.setattr(module.leases, "fence_or_unheld", lambda tx, target, lease: None)
    with pytest.raises(AssertionError, match="went through"):
        check_session_write_rule(store, clock, write)
