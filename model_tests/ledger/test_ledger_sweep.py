"""Reclaiming the blobs of deleted sessions (``store.ledger.sweep_deleted``),
on every backend, with the blobs in the database's table, a local directory
and S3 (moto's server started by the tests).

An object store cannot join a session delete's transaction, so its blobs
outlive the delete; the sweep reclaims them, judging "deleted" by the
database's tombstone (``deleted_sessions``) and the absence of any ledger
record, never by a lease. The guard is shown able to fail: patched to call
every listed session deleted, the sweep takes a live session's blobs.
"""

from __future__ import annotations

import posixpath
from typing import Any

import pytest
from conftest import forge
from test_ledger_blobs import BIG, THRESHOLD, _ledger, _open
from test_ledger_blobs import where as where  # the fixture: database, directory, s3

from turnkeeper import GCDeleteError, GCListError, InvalidInputError
from turnkeeper.storage.ops.ledger import sweep as sweep_ops
from turnkeeper.storage.ops.ledger.blobs import blob_prefix


def _two_sessions(store: Any, ledger: Any, monkeypatch: Any) -> tuple[Any, Any, str]:
    """``gone`` (two blobs, then deleted) and ``keep`` (a blob and an orphan of
    a crashed offload: GC's business, not the sweep's)."""
    gone = _open(store, ledger, sid="gone")
    gone.append("turn", BIG, "g1")
    gone.append("turn", BIG + b"2", "g2")
    keep = _open(store, ledger, sid="keep")
    keep.append("turn", BIG, "k1")
    orphan = _crash_mid_offload_in(ledger, keep, monkeypatch, "keep")
    store.sessions.delete("gone", lease=gone.lease)
    return gone, keep, orphan


def _crash_mid_offload_in(ledger: Any, w: Any, monkeypatch: Any, sid: str) -> str:
    before = set(ledger.blobs.list(blob_prefix("", sid)))
    from turnkeeper.storage.ops.ledger import journal

    def crash(*a: Any, **k: Any) -> Any:
        raise RuntimeError("killed between the blob and its pointer")

    with monkeypatch.context() as m:
        m.setattr(journal, "append", crash)
        with pytest.raises(RuntimeError):
            w.append("turn", BIG + b"lost", "lost")
    (orphan,) = set(ledger.blobs.list(blob_prefix("", sid))) - before
    return str(orphan)


def test_the_sweep_reclaims_a_deleted_sessions_blobs_and_never_a_live_ones(
    store, where, tmp_path, monkeypatch
):
    ledger = _ledger(store, where, tmp_path)
    _, _, orphan = _two_sessions(store, ledger, monkeypatch)
    kept = ledger.blobs.list(blob_prefix("", "keep"))
    assert len(kept) == 2 and orphan in kept
    left = ledger.blobs.list(blob_prefix("", "gone"))
    # the delete's transaction clears the database's table, not an object store
    assert len(left) == (0 if where == "database" else 2)
    result = ledger.sweep_deleted()
    assert (result.scanned, result.referenced, result.deleted) == (len(left), 0, len(left))
    assert result.scanned == result.referenced + result.deleted
    assert result.deleted_keys == tuple(sorted(left)) and result.unreclaimable == 0
    assert ledger.blobs.list(blob_prefix("", "gone")) == []
    assert ledger.blobs.list(blob_prefix("", "keep")) == kept
    assert [r.payload for r in ledger.replay("keep")][1:] == [BIG]
    again = ledger.sweep_deleted()
    assert (again.scanned, again.deleted, again.deleted_keys) == (0, 0, ())


def test_a_sweep_of_named_sessions_lists_only_their_prefixes(store, where, tmp_path, monkeypatch):
    ledger = _ledger(store, where, tmp_path)
    _two_sessions(store, ledger, monkeypatch)
    left = ledger.blobs.list(blob_prefix("", "gone"))
    assert ledger.sweep_deleted(["keep"]).deleted == 0
    assert ledger.sweep_deleted(["keep", "gone", "never-was"]).deleted_keys == tuple(left)
    assert ledger.blobs.list(blob_prefix("", "gone")) == []
    assert len(ledger.blobs.list("blobs/t=/")) == 2
    with pytest.raises(InvalidInputError):
        ledger.sweep_deleted("gone")


def test_the_guard_is_what_keeps_a_live_sessions_blobs(store, where, tmp_path, monkeypatch):
    ledger = _ledger(store, where, tmp_path)
    _two_sessions(store, ledger, monkeypatch)
    # a tombstone while the ledger still has records (forged: a delete removes
    # them in its transaction) is not enough: the blobs stay
    forge(
        store,
        "INSERT INTO deleted_sessions (session_id, reason, created_at, last_updated_at, "
        "deleted_at, entries, runs, run_events, tool_executions, delivery_operations) "
        "SELECT 'keep', 'delete', created_at, last_updated_at, deleted_at, 0, 0, 0, 0, 0 "
        "FROM deleted_sessions WHERE session_id = 'gone'",
        [],
        rows=1,
    )
    ledger.sweep_deleted()
    assert len(ledger.blobs.list(blob_prefix("", "keep"))) == 2
    # control: the guard patched to call every listed session deleted, the
    # sweep takes the live session's blobs
    monkeypatch.setattr(sweep_ops, "deleted_sessions", lambda db, tenant, ids: set(ids))
    assert ledger.sweep_deleted().deleted == 2
    assert ledger.blobs.list(blob_prefix("", "keep")) == []


def test_a_tenants_sweep_stays_under_its_prefix(store, where, tmp_path, monkeypatch):
    base = _ledger(store, where, tmp_path)
    acme = base.with_tenant("acme")
    w = _open(store, acme, sid="gone")
    w.append("turn", BIG, "a1")
    other = _open(store, base, sid="other")
    other.append("turn", BIG, "o1")
    store.sessions.delete("gone", lease=w.lease)
    left = acme.blobs.list(blob_prefix("acme", "gone"))
    assert base.sweep_deleted().deleted == 0  # the default tenant's prefix only
    assert acme.blobs.list(blob_prefix("acme", "gone")) == left
    assert acme.sweep_deleted().deleted_keys == tuple(left)
    assert acme.blobs.list("blobs/t=acme/") == []
    assert len(base.blobs.list(blob_prefix("", "other"))) == 1


@pytest.mark.parametrize("where", ["directory", "s3"], indirect=True)
def test_the_sweep_leaves_keys_of_another_shape(store, where, tmp_path, monkeypatch):
    ledger = _ledger(store, where, tmp_path)
    _two_sessions(store, ledger, monkeypatch)
    notes = posixpath.join(ledger.blobs.root, blob_prefix("", "gone") + "notes.txt")
    ledger.blobs.fs.pipe_file(notes, b"not ours")
    result = ledger.sweep_deleted()
    assert (result.scanned, result.deleted, result.unreclaimable) == (2, 2, 1)
    assert ledger.blobs.fs.cat_file(notes) == b"not ours"


class _Broken:
    def __init__(self, inner: Any, *, list_fails: bool) -> None:
        self.inner, self.list_fails, self.deletes = inner, list_fails, 0

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        return bytes(self.inner.get(key, max_bytes))

    def list(self, prefix: str) -> list[str]:
        if self.list_fails:
            raise OSError("listing cut short")
        return list(self.inner.list(prefix))

    def delete(self, key: str) -> None:
        self.deletes += 1
        raise OSError("permission denied")


@pytest.mark.parametrize("where", ["directory", "s3"], indirect=True)
def test_a_failed_listing_deletes_nothing_and_a_failed_delete_is_surfaced(
    store, where, tmp_path, monkeypatch
):
    ledger = _ledger(store, where, tmp_path)
    _two_sessions(store, ledger, monkeypatch)
    left = ledger.blobs.list(blob_prefix("", "gone"))
    listing = _Broken(ledger.blobs, list_fails=True)
    with pytest.raises(GCListError) as err:
        ledger.with_blobs(listing, offload_threshold=THRESHOLD).sweep_deleted()
    assert err.value.prefix == "blobs/t=/" and listing.deletes == 0
    assert isinstance(err.value.__cause__, OSError)
    deleting = _Broken(ledger.blobs, list_fails=False)
    with pytest.raises(GCDeleteError) as derr:
        ledger.with_blobs(deleting, offload_threshold=THRESHOLD).sweep_deleted()
    assert derr.value.key == sorted(left)[0] and isinstance(derr.value.__cause__, OSError)
    assert ledger.blobs.list(blob_prefix("", "gone")) == left
