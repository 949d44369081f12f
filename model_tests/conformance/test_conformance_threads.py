"""Conformance: thread records (threadstore Resolve / Finalize)."""

from __future__ import annotations

from typing import Any

import pytest

from turnkeeper import (
    AlreadyExistsError,
    FinalizeRequest,
    InvalidInputError,
    InvalidTransitionError,
    LeaseLostError,
    RecordNotActiveError,
    RecordNotFoundError,
    RecordStatus,
    ThreadRecord,
)


@pytest.fixture
def store(any_store: Any) -> Any:
    """Each backend, called directly and through ``turnkeeper.aio`` (conftest's ``any_store``)."""
    return any_store


def rec(rid: str, key: str = "k", **kw) -> ThreadRecord:
    return ThreadRecord(id=rid, key=key, **kw)


def active_counts(store) -> dict[str, int]:
    rows = store.query(
        "SELECT key, count(*) AS n FROM thread_records WHERE status = 'active' GROUP BY key"
    ).to_pylist()
    return {r["key"]: r["n"] for r in rows}


def test_every_record_field_round_trips(store):
    full = ThreadRecord(
        id="r1",
        key="k",
        driver_type="codex",
        agent={"name": "bot", "id": 7},
        fingerprint="fp",
        compatibility_fingerprint="cfp",
        session_codec="pi-v3",
        state={"messages": [1, 2, {"x": None}], "cursor": "abc"},
    )
    saved = store.threads.finalize(FinalizeRequest(full, rebind_active=True))
    for name in (
        "id",
        "key",
        "driver_type",
        "agent",
        "fingerprint",
        "compatibility_fingerprint",
        "session_codec",
        "state",
    ):
        assert getattr(saved, name) == getattr(full, name)
    assert saved.status is RecordStatus.ACTIVE
    assert saved.created_at is not None and saved.created_at.tzinfo is not None
    assert store.threads.resolve(id="r1") == saved == store.threads.resolve(key="k")


def test_missing_record_resolves_to_none(store):
    assert store.threads.resolve(id="nope") is None
    assert store.threads.resolve(key="nope") is None


def test_resolve_needs_exactly_one_of_id_and_key(store):
    with pytest.raises(InvalidInputError):
        store.threads.resolve()
    with pytest.raises(InvalidInputError):
        store.threads.resolve(id="a", key="b")


def test_archived_only_with_include_archived(store):
    store.threads.finalize(FinalizeRequest(rec("r1"), rebind_active=True))
    store.threads.finalize(
        FinalizeRequest(rec("r2"), previous_id="r1", archive_old=True, rebind_active=True)
    )
    assert store.threads.resolve(id="r1") is None
    old = store.threads.resolve(id="r1", include_archived=True)
    assert old is not None and old.status is RecordStatus.ARCHIVED
    assert store.threads.resolve(key="k").id == "r2"
    assert active_counts(store) == {"k": 1}


def test_key_with_every_record_archived_resolves_with_include_archived(store, clock):
    # r1 and r2 hold key "a" in turn; r3 under key "b" archives r2, so "a"
    # has no active record left. The seed's Resolve still finds it by key.
    store.threads.finalize(FinalizeRequest(rec("r1", "a"), rebind_active=True))
    clock.advance(1)
    store.threads.finalize(FinalizeRequest(rec("r2", "a"), rebind_active=True))
    clock.advance(1)
    store.threads.finalize(
        FinalizeRequest(rec("r3", "b"), previous_id="r2", archive_old=True, rebind_active=True)
    )
    assert store.threads.resolve(key="a") is None
    found = store.threads.resolve(key="a", include_archived=True)
    assert found is not None
    assert (found.id, found.key, found.status) == ("r2", "a", RecordStatus.ARCHIVED)
    # An active record of the key still wins over archived ones.
    assert store.threads.resolve(key="b", include_archived=True).id == "r3"
    assert store.threads.resolve(key="zz", include_archived=True) is None


def test_save_is_an_upsert_by_record_id(store):
    store.threads.finalize(FinalizeRequest(rec("r1", state={"turn": 1}), rebind_active=True))
    first = store.threads.resolve(id="r1")
    store.threads.finalize(FinalizeRequest(rec("r1", state={"turn": 2})))
    again = store.threads.resolve(id="r1")
    assert again.state == {"turn": 2} and again.created_at == first.created_at
    assert store.query("SELECT count(*) AS n FROM thread_records").to_pylist() == [{"n": 1}]


def test_require_key_absent_refuses_with_nothing_written(store):
    store.threads.finalize(FinalizeRequest(rec("r1"), rebind_active=True))
    before = store.query("SELECT * FROM thread_records ORDER BY id").to_pylist()
    with pytest.raises(AlreadyExistsError) as err:
        store.threads.finalize(
            FinalizeRequest(rec("r2"), rebind_active=True, require_key_absent=True)
        )
    assert err.value.key == "k"
    assert store.query("SELECT * FROM thread_records ORDER BY id").to_pylist() == before


def test_key_bound_elsewhere_without_rebind_is_refused(store):
    store.threads.finalize(FinalizeRequest(rec("r1"), rebind_active=True))
    with pytest.raises(AlreadyExistsError):
        store.threads.finalize(FinalizeRequest(rec("r2")))
    assert store.threads.resolve(id="r2") is None


def test_rebind_archives_the_record_the_key_pointed_at(store):
    store.threads.finalize(FinalizeRequest(rec("r1"), rebind_active=True))
    store.threads.finalize(FinalizeRequest(rec("r2"), rebind_active=True))
    assert store.threads.resolve(key="k").id == "r2"
    assert store.threads.resolve(id="r1", include_archived=True).status is RecordStatus.ARCHIVED
    assert active_counts(store) == {"k": 1}


@pytest.mark.parametrize("previous", ["missing", "archived"])
def test_archive_old_with_bad_previous_is_typed_and_writes_nothing(store, previous):
    store.threads.finalize(FinalizeRequest(rec("r1"), rebind_active=True))
    store.threads.finalize(
        FinalizeRequest(rec("r2"), previous_id="r1", archive_old=True, rebind_active=True)
    )
    before = store.query("SELECT * FROM thread_records ORDER BY id").to_pylist()
    prev = "nope" if previous == "missing" else "r1"
    expected = RecordNotFoundError if previous == "missing" else RecordNotActiveError
    with pytest.raises(expected) as err:
        store.threads.finalize(
            FinalizeRequest(rec("r3"), previous_id=prev, archive_old=True, rebind_active=True)
        )
    assert err.value.record_id == prev
    assert store.query("SELECT * FROM thread_records ORDER BY id").to_pylist() == before


def test_archived_record_is_never_saved_again(store):
    store.threads.finalize(FinalizeRequest(rec("r1"), rebind_active=True))
    store.threads.finalize(FinalizeRequest(rec("r2"), rebind_active=True))
    with pytest.raises(InvalidTransitionError):
        store.threads.finalize(FinalizeRequest(rec("r1"), rebind_active=True))
    assert store.threads.resolve(key="k").id == "r2"


def test_finalize_validates_every_held_lease_first(store, clock):
    store.sessions.create("s")
    a = store.leases.acquire("thread-key:k", "w", 5)
    b = store.leases.acquire("session:s", "w", 1)
    clock.advance(2)
    with pytest.raises(LeaseLostError) as err:
        store.threads.finalize(FinalizeRequest(rec("r1"), held_leases=[a, b], rebind_active=True))
    assert err.value.target == "session:s"
    assert store.threads.resolve(id="r1") is None
    fenced = store.query("SELECT target, operation FROM fence_events").to_pylist()
    assert fenced == [{"target": "session:s", "operation": "finalize"}]
    store.threads.finalize(FinalizeRequest(rec("r1"), held_leases=[a], rebind_active=True))


def test_finalize_under_taken_over_lease_is_refused(store, clock):
    old = store.leases.acquire("thread-key:k", "w1", 1)
    clock.advance(1)
    store.leases.acquire("thread-key:k", "w2", 10)
    with pytest.raises(LeaseLostError):
        store.threads.finalize(FinalizeRequest(rec("r1"), held_leases=[old], rebind_active=True))
    assert store.threads.resolve(id="r1") is None


@pytest.mark.parametrize(
    "request_kwargs,field",
    [
        ({"record": ThreadRecord("", "k")}, "record.id"),
        ({"record": ThreadRecord("r", "")}, "record.key"),
        ({"record": ThreadRecord("r", "k"), "key": "other"}, "key"),
        ({"record": ThreadRecord("r", "k", status=RecordStatus.ARCHIVED)}, "record.status"),
        ({"record": ThreadRecord("r", "k"), "archive_old": True}, "previous_id"),
        ({"record": ThreadRecord("r", "k", state={"x": "\ud800"})}, "record.state"),
        ({"record": ThreadRecord("r", "k", agent=object())}, "record.agent"),
    ],
)
def test_bad_requests_are_refused_before_writing(store, request_kwargs, field):
    with pytest.raises(InvalidInputError) as err:
        store.threads.finalize(FinalizeRequest(**request_kwargs))
    assert err.value.field == field
    assert store.query("SELECT count(*) AS n FROM thread_records").to_pylist() == [{"n": 0}]


def test_a_records_key_never_changes(store):
    store.threads.finalize(FinalizeRequest(rec("r1", "k1"), rebind_active=True))
    with pytest.raises(InvalidInputError):
        store.threads.finalize(FinalizeRequest(rec("r1", "k2"), rebind_active=True))


def test_resume_fallback_archives_and_rebinds_same_key_in_one_transaction(store):
    """Deleting and re-inserting the key's mapping row inside one DuckDB transaction."""
    store.threads.finalize(FinalizeRequest(rec("r1"), rebind_active=True))
    for i in range(2, 12):
        store.threads.finalize(
            FinalizeRequest(
                rec(f"r{i}"), previous_id=f"r{i - 1}", archive_old=True, rebind_active=True
            )
        )
        assert store.threads.resolve(key="k").id == f"r{i}"
    assert active_counts(store) == {"k": 1}
    rows = store.query("SELECT key, record_id FROM active_thread_keys").to_pylist()
    assert rows == [{"key": "k", "record_id": "r11"}]
