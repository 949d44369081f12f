"""Idempotency does not depend on the offload threshold (attack round 2 on
issue 19, F5), on both backends, blobs in the database's table and in a
directory, on the single path and in a group commit.

A redelivery (same kind, payload and idempotency id) through a ledger whose
offload threshold puts it on the other side from the original (inline vs
blob: a worker restarted with another setting, the CLI's default beside a
runtime's) returns the original's sequence with ``duplicate=True``; before
the fix it was ``LedgerIdempotencyConflictError`` both ways. Other content
under the id is still a conflict. An inline redelivery of an offloaded
original writes no blob; an offloaded redelivery of an inline original puts
its blob before the append finds the original: no pointer names it, and GC
reclaims it. Control: ``condemn.same_record`` cut back to comparing the
stored forms, both redeliveries conflict again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_ledger_group import Grouped

from turnkeeper import FsspecBlobs, LedgerEntry, LedgerIdempotencyConflictError
from turnkeeper.storage.ops.ledger import blobs as blob_ops
from turnkeeper.storage.ops.ledger import condemn

TTL = 30.0
LOW = 1024  # the small threshold: BODY is offloaded
BODY = bytes(range(256)) * 20  # 5120 bytes: inline under the default 262144


@pytest.fixture(params=["database", "directory"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    return None if request.param == "database" else FsspecBlobs(str(tmp_path / "blobs"))


def _handles(store: Any, blobs: Any) -> tuple[Any, Any]:
    """The same store's ledger offloading BODY (threshold LOW) and keeping it inline."""
    return (
        store.ledger.with_blobs(blobs, offload_threshold=LOW),
        store.ledger.with_blobs(blobs),
    )


def _writer(store: Any, ledger: Any, sid: str) -> Any:
    if store.sessions.get(sid) is None:
        store.sessions.create(sid)
    return ledger.open(sid, store.leases.acquire(f"session:{sid}", "w", TTL))


def _stored(store: Any, sid: str) -> list[tuple[int, str]]:
    rows = store.query(
        "SELECT seq, kind FROM ledger_records WHERE session_id = ? ORDER BY seq", [sid]
    ).to_pylist()
    return [(r["seq"], r["kind"]) for r in rows]


def _cut_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the idempotency check compares the stored forms only."""
    monkeypatch.setattr(
        condemn,
        "same_record",
        lambda found, stored, digest, logical: (found[1], found[2]) == (stored.kind, digest),
    )


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "control"])
def test_an_inline_redelivery_of_an_offloaded_original_is_a_duplicate(
    store, blobs, monkeypatch, fixed
):
    low, default = _handles(store, blobs)
    original = _writer(store, low, "s").append("note", BODY, "msg-1")
    assert (original.seq, _stored(store, "s")[-1]) == (2, (2, "blobptr"))
    prefix = blob_ops.blob_prefix("", "s")
    listed = low.blobs.list(prefix)
    w = _writer(store, default, "s")  # a worker restarted with the default threshold
    if not fixed:
        _cut_back(monkeypatch)
        with pytest.raises(LedgerIdempotencyConflictError):
            w.append("note", BODY, "msg-1")
        return
    again = w.append("note", BODY, "msg-1")
    assert (again.seq, again.duplicate) == (original.seq, True)
    for kind, payload in (("note", BODY + b"!"), ("other", BODY), ("note", b"short")):
        with pytest.raises(LedgerIdempotencyConflictError) as conflict:
            w.append(kind, payload, "msg-1")
        assert conflict.value.seq == original.seq
    assert _stored(store, "s") == [(1, "fence"), (2, "blobptr"), (3, "fence")]
    assert low.blobs.list(prefix) == listed  # no blob written
    assert [(r.seq, r.kind, r.payload) for r in default.replay("s")][1] == (2, "note", BODY)


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "control"])
def test_an_offloaded_redelivery_of_an_inline_original_is_a_duplicate_and_gc_takes_its_blob(
    store, blobs, monkeypatch, fixed
):
    low, default = _handles(store, blobs)
    original = _writer(store, default, "s").append("note", BODY, "msg-2")
    assert _stored(store, "s")[-1] == (2, "note")
    w = _writer(store, low, "s")  # a worker restarted with a low threshold
    if not fixed:
        _cut_back(monkeypatch)
        with pytest.raises(LedgerIdempotencyConflictError):
            w.append("note", BODY, "msg-2")
        return
    again = w.append("note", BODY, "msg-2")
    assert (again.seq, again.duplicate) == (original.seq, True)
    for kind, payload in (("note", BODY + b"!"), ("other", BODY)):
        with pytest.raises(LedgerIdempotencyConflictError) as conflict:
            w.append(kind, payload, "msg-2")
        assert conflict.value.seq == original.seq
    assert _stored(store, "s") == [(1, "fence"), (2, "note"), (3, "fence")]
    # the redelivery's blob (and the refused ones') were put before the
    # append found the original: no pointer names them, GC reclaims them
    prefix = blob_ops.blob_prefix("", "s")
    put = low.blobs.list(prefix)
    assert len(put) == 3
    result = low.gc("s", w.lease)
    assert (result.scanned, result.referenced, result.deleted_keys) == (3, 0, tuple(put))
    assert low.blobs.list(prefix) == []
    assert [(r.seq, r.kind, r.payload) for r in low.replay("s")][1] == (2, "note", BODY)


def test_a_group_commit_judges_each_redelivery_by_its_logical_content(store, tmp_path, monkeypatch):
    """Four writers in one group (``group._round``): an inline redelivery of
    an offloaded original, an offloaded redelivery of an inline one (both
    duplicates), and other content under each id (both conflicts). Blobs in
    a directory: a put in the database's table would be a write queued
    beside the appends, and the group would not be the four appends."""
    low, default = _handles(store, FsspecBlobs(str(tmp_path / "blobs")))
    assert _writer(store, low, "a").append("note", BODY, "m").seq == 2  # offloaded
    assert _writer(store, default, "b").append("note", BODY, "m").seq == 2  # inline
    assert _writer(store, low, "c").append("note", BODY, "m").seq == 2
    assert _writer(store, default, "d").append("note", BODY, "m").seq == 2
    a, b = _writer(store, default, "a"), _writer(store, low, "b")
    c, d = _writer(store, default, "c"), _writer(store, low, "d")
    g = Grouped(store, monkeypatch)
    out = g.run(
        [
            lambda: a.append("note", BODY, "m"),
            lambda: b.append("note", BODY, "m"),
            lambda: c.append("note", BODY + b"!", "m"),
            lambda: d.append("other", BODY, "m"),
        ]
    )
    assert g.sizes[0] == 4
    assert [(r.seq, r.duplicate) for r in out[:2]] == [(2, True), (2, True)]
    assert all(isinstance(r, LedgerIdempotencyConflictError) and r.seq == 2 for r in out[2:])
    for sid in "abcd":
        assert len(_stored(store, sid)) == 3  # fence, the original, the fence of the redelivery


def test_a_batch_holding_one_id_twice_across_the_threshold_stays_one_record(store, blobs):
    """Within one append, an id's second entry is compared with the first as
    numbered there (a pointer's logical content included)."""
    low, _ = _handles(store, blobs)
    w = _writer(store, low, "s")
    out = w.append_many([LedgerEntry("note", BODY, "m"), LedgerEntry("note", BODY, "m")])
    assert [(r.seq, r.duplicate) for r in out] == [(2, False), (2, True)]
    with pytest.raises(LedgerIdempotencyConflictError):
        w.append_many([LedgerEntry("note", BODY, "n"), LedgerEntry("note", BODY + b"!", "n")])
