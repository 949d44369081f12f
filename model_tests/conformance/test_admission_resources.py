"""Conformance: input resource events written in the admission's own
transaction (session seed AppendInputResourceEventTx, ``runs.admit(
resource_events=…)``), on both backends: a run is never admitted without its
resources' events, nor are they written for a run that was not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from turnkeeper import (
    InputResourceEvent,
    InvalidInputError,
    ResourceEventConflictError,
    SessionRunActiveError,
)
from turnkeeper.storage.ops import run_admission

USER = {"role": "user", "content": "look at this"}


def prepared(resource_id: str, event_id: str = "") -> InputResourceEvent:
    return InputResourceEvent(
        "s", resource_id, "prepared", id=event_id, status="ready", data={"bytes": 12}
    )


@pytest.fixture
def sid(store) -> str:
    store.sessions.create("s")
    return "s"


def test_the_events_are_written_for_the_admitted_run(store, sid):
    run = store.runs.admit(
        sid,
        {"q": 1},
        user_message=USER,
        resource_events=[prepared("img-1", "ev-1"), prepared("img-2")],
    )
    first, second = store.resources.events(sid)
    assert first == replace(prepared("img-1", "ev-1"), run_id=run.id, timestamp=first.timestamp)
    assert (second.resource_id, second.run_id, second.data) == ("img-2", run.id, {"bytes": 12})
    assert second.id  # a new UUIDv7
    assert first.timestamp is not None


def test_a_conflicting_event_refuses_the_whole_admission(store, sid):
    store.resources.record_event(prepared("img-0", "ev-1"))
    before = store.resources.events(sid)
    with pytest.raises(ResourceEventConflictError) as err:
        store.runs.admit(
            sid, {"q": 1}, user_message=USER, resource_events=[prepared("img-1", "ev-1")]
        )
    assert (err.value.event_id, err.value.session_id) == ("ev-1", sid)
    assert store.runs.list(sid) == []
    assert store.resources.events(sid) == before
    assert store.sessions.entries(sid) == []


def test_a_refused_admission_writes_no_event(store, sid):
    store.runs.admit(sid, {"q": 1})
    with pytest.raises(SessionRunActiveError):
        store.runs.admit(sid, {"q": 2}, resource_events=[prepared("img-1", "ev-1")])
    assert store.resources.events(sid) == []


def test_a_submission_replay_writes_no_events_again(store, sid):
    run = store.runs.admit(
        sid, {"q": 1}, submission_key="k", resource_events=[prepared("img-1", "ev-1")]
    )
    events = store.resources.events(sid)
    again = store.runs.admit(
        sid, {"q": 1}, submission_key="k", resource_events=[prepared("img-9", "ev-9")]
    )
    assert again.id == run.id
    assert store.resources.events(sid) == events


def test_the_admission_is_one_transaction_with_its_events(store, sid, monkeypatch):
    """With the events' write failing, nothing of the admission stays; and the
    check fails with the write taken out of admission (the run is then
    admitted without its resources' events)."""

    def fails(tx, event, data, version=None):
        raise ResourceEventConflictError(event.id, event.session_id)

    monkeypatch.setattr(run_admission.resources, "write", fails)
    with pytest.raises(ResourceEventConflictError):
        store.runs.admit(sid, {"q": 1}, resource_events=[prepared("img-1", "ev-1")])
    assert store.runs.list(sid) == []
    monkeypatch.setattr(
        run_admission.resources, "write", lambda tx, event, data, version=None: event.id
    )
    run = store.runs.admit(sid, {"q": 1}, resource_events=[prepared("img-1", "ev-1")])
    assert store.resources.events(sid) == []  # a defect: run.id has no resource events
    assert run.status == "admitted"


@pytest.mark.parametrize(
    "events",
    [
        prepared("img-1"),  # one event, not a sequence of them
        [replace(prepared("img-1"), session_id="t")],
        [replace(prepared("img-1"), run_id="r")],
        [replace(prepared("img-1"), resource_id="")],
        [{"resource_id": "img-1"}],
    ],
)
def test_bad_events_are_refused_before_anything_is_written(store, sid, events):
    with pytest.raises(InvalidInputError):
        store.runs.admit(sid, {"q": 1}, resource_events=events)
    assert store.runs.list(sid) == []
    assert store.resources.events(sid) == []


def test_under_a_lease_the_events_are_fenced_with_the_admission(store, sid):
    lease = store.leases.acquire("session:s", "w1", 30, purpose="admission")
    run = store.runs.admit(sid, {"q": 1}, lease=lease, resource_events=[prepared("img-1", "ev-1")])
    assert [e.run_id for e in store.resources.events(sid)] == [run.id]
