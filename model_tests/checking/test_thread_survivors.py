"""Fixed tests for the survivors of the second mutation net in
``storage/ops/threads.py`` (``mutation_net/survivors.py`` names each one's
mutant): what thread-record finalize and resolve decide that the area's
conformance tests left unread. On both engines; the storage-threads area runs
them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from turnkeeper.spec.errors import InvalidInputError, LeaseLostError
from turnkeeper.spec.records import FinalizeRequest, RecordStatus, ThreadRecord


def _save(store: Any, record_id: str, **request: Any) -> ThreadRecord:
    saved: ThreadRecord = store.threads.finalize(
        FinalizeRequest(ThreadRecord(record_id, "k"), **request)
    )
    return saved


def test_by_key_the_active_record_comes_before_an_archived_one_that_sorts_first(
    store: Any,
) -> None:
    """Resolve by key with ``include_archived`` looks at archived records only
    when none of the key is active: here an archived one sorts first (the same
    instant, the clock standing still, and a greater id) and is not returned."""
    _save(store, "z-old")
    _save(store, "a-new", rebind_active=True)  # archives z-old at the same instant
    old = store.threads.resolve(id="z-old", include_archived=True)
    assert old is not None and old.status is RecordStatus.ARCHIVED
    found = store.threads.resolve(key="k", include_archived=True)
    assert found is not None and found.id == "a-new"


def test_archiving_the_record_being_saved_is_refused_and_naming_it_alone_is_not(
    store: Any,
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        _save(store, "r1", previous_id="r1", archive_old=True)
    assert caught.value.field == "previous_id"
    assert "cannot archive the record being saved" in caught.value.reason
    assert store.threads.resolve(id="r1", include_archived=True) is None  # nothing written
    assert _save(store, "r1", previous_id="r1").status is RecordStatus.ACTIVE


@pytest.mark.parametrize("bad", [7, "\ud800"], ids=["not-text", "lone-surrogate"])
@pytest.mark.parametrize(
    "name", ["driver_type", "fingerprint", "compatibility_fingerprint", "session_codec"]
)
def test_each_text_field_of_a_record_is_checked_before_anything_is_written(
    store: Any, name: str, bad: object
) -> None:
    record = dataclasses.replace(ThreadRecord("r1", "k"), **{name: bad})
    with pytest.raises(InvalidInputError) as caught:
        store.threads.finalize(FinalizeRequest(record))
    assert caught.value.field == f"record.{name}"
    assert store.threads.resolve(id="r1", include_archived=True) is None


def test_archiving_the_keys_active_record_frees_the_key_without_a_rebind(store: Any) -> None:
    """``archive_old`` of the record the key is bound to unbinds it in the same
    finalize: the new record takes the key though ``rebind_active`` is off."""
    _save(store, "p")
    saved = _save(store, "r", previous_id="p", archive_old=True)
    assert saved.status is RecordStatus.ACTIVE
    bound = store.threads.resolve(key="k")
    assert bound is not None and bound.id == "r"
    old = store.threads.resolve(id="p", include_archived=True)
    assert old is not None and old.status is RecordStatus.ARCHIVED


def write_flags(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """The ``(operation, transaction)`` of each ``store.db.write`` from now on."""
    asked: list[tuple[str, bool]] = []
    real = store.db.write

    def write(operation: str, body: Any, **kw: Any) -> Any:
        asked.append((operation, kw.get("transaction", True)))
        return real(operation, body, **kw)

    monkeypatch.setattr(store.db, "write", write)
    return asked


def test_a_finalize_refused_for_a_lost_lease_notes_the_refusal_as_one_statement(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finalize's transaction, then the refusal's ``fence_events`` row as
    one autocommit statement (``transaction=False``, as every lease refusal)."""
    lease = store.leases.acquire("t", "w", 30)
    assert store.leases.release(lease)
    asked = write_flags(store, monkeypatch)
    with pytest.raises(LeaseLostError):
        _save(store, "r1", held_leases=[lease])
    assert asked == [("finalize", True), ("record_fenced", False)]
    assert store.query("SELECT count(*) AS n FROM fence_events").to_pylist() == [{"n": 1}]
