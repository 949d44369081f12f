"""The ledger's blob offload and GC (issue 19; sessionstore WithOffloadThreshold,
ObjectGC, GCResult), on every backend, with the blobs in the database's own
table (the default) and in a local directory through fsspec (``FsspecBlobs``).

Conformance for each error: DurableBodyTooLargeError (write side and replay),
BlobIntegrityError, BlobPointerIDMismatchError, BlobUnavailableError,
GCLeaseNotHeldError, GCScanError, GCListError, GCDeleteError (and
NilLeaseError from GC). A crash mid-offload (blob written, pointer append
failed) leaves an orphan replay never sees and GC reclaims. Each fence is
shown able to fail: GC's lease check patched out lets a stale lease delete,
replay's hash check patched out yields a tampered body.

Each test that takes ``where`` runs with the blobs in the database, in a
local directory and on S3 (moto's server, started by the tests).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from pathlib import Path
from typing import Any

import pytest
from conftest import clear_blob, forge, ledger_payload, reseal, stored_blob, stored_ledger_payload

from turnkeeper import (
    BlobIntegrityError,
    BlobNotFoundError,
    BlobPointerIDMismatchError,
    BlobUnavailableError,
    DurableBodyTooLargeError,
    EnvelopeError,
    FsspecBlobs,
    GCDeleteError,
    GCLeaseNotHeldError,
    GCListError,
    GCScanError,
    InvalidBackendError,
    InvalidInputError,
    LeaseLostError,
    LedgerEntry,
    NilLeaseError,
    PersistencePathError,
    ReplayDecodeError,
)
from turnkeeper.storage.ops.ledger import blobs as blob_ops
from turnkeeper.storage.ops.ledger import gc as gc_ops
from turnkeeper.storage.ops.ledger import journal

TTL = 30.0
THRESHOLD = 64
BIG = bytes(range(256)) * 2  # 512 bytes: offloaded
S = blob_ops.blob_prefix("", "s")  # session s's blob prefix
SMALL = b"inline"


class Where(str):
    """The name of where the blobs live (compares as that text), with the blob
    store itself in ``blobs`` (``None``: the database's table)."""

    blobs: Any = None


@pytest.fixture(params=["database", "directory", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    """Where the blobs live: the store's table, a local directory, or S3 (moto's
    server, started by the tests: ``conftest.s3_endpoint``), a prefix per test."""
    site = Where(request.param)
    if site == "directory":
        site.blobs = FsspecBlobs(str(tmp_path / "blobs"))
    elif site == "s3":
        site.blobs = request.getfixturevalue("s3_blobs")()
    return site


def _ledger(store: Any, where: str, tmp_path: Path, **kw: Any) -> Any:
    if isinstance(where, Where):
        blobs = where.blobs
    else:
        blobs = FsspecBlobs(str(tmp_path / "blobs")) if where == "directory" else None
    return store.ledger.with_blobs(blobs, offload_threshold=THRESHOLD, **kw)


def _open(store: Any, ledger: Any, sid: str = "s", owner: str = "w") -> Any:
    if store.sessions.get(sid) is None:
        store.sessions.create(sid)
    return ledger.open(sid, store.leases.acquire(f"session:{sid}", owner, TTL))


def _pointer(store: Any, seq: int) -> dict[str, Any]:
    rows = store.query(
        "SELECT kind, payload FROM ledger_records WHERE session_id = 's' AND seq = ?", [seq]
    ).to_pylist()
    assert rows[0]["kind"] == "blobptr"
    return dict(json.loads(ledger_payload(store, seq)))


def _clear(store: Any, ledger: Any, key: str) -> bytes:
    """The clear envelope of the blob under ``key`` (opened in a sealed store)."""
    return clear_blob(store, "s", key, ledger.blobs.get(key))


def _damage(store: Any, ledger: Any, key: str, data: bytes) -> None:
    """Store the clear blob ``data`` under ``key`` as the store would hold it
    (sealed for ``key`` in a sealed store: a valid seal of damaged content,
    so the checks past its authentication are reached)."""
    data = stored_blob(store, "s", key, data)
    if isinstance(ledger.blobs, FsspecBlobs):
        path = posixpath.join(ledger.blobs.root, key)
        assert ledger.blobs.fs.exists(path)
        ledger.blobs.fs.pipe_file(path, data)
    else:
        forge(store, "UPDATE ledger_blobs SET data = ? WHERE key = ?", [data, key], rows=1)


def _own_blob(store: Any, ledger: Any, data: bytes) -> str:
    """Put ``data`` among ``s``'s blobs under its content address; its key (a
    pointer to it names its own ledger's blob)."""
    key = blob_ops.blob_prefix("", "s") + hashlib.sha256(data).hexdigest()
    ledger.blobs.put(key, stored_blob(store, "s", key, data))
    return key


def _drop(store: Any, ledger: Any, key: str) -> None:
    if isinstance(ledger.blobs, FsspecBlobs):
        ledger.blobs.fs.rm_file(posixpath.join(ledger.blobs.root, key))
    else:
        forge(store, "DELETE FROM ledger_blobs WHERE key = ?", [key], rows=1)


# -- offload and replay -------------------------------------------------------------


def test_a_payload_over_the_threshold_is_a_sha256_named_blob_and_a_pointer_with_its_id(
    store, where, tmp_path
):
    ledger = _ledger(store, where, tmp_path)
    w = _open(store, ledger)
    assert w.append("turn", BIG, "t1").seq == 2
    assert w.append("turn", SMALL, "t2").seq == 3
    ptr = _pointer(store, 2)
    blob = _clear(store, ledger, ptr["key"])
    assert ptr["key"] == S + hashlib.sha256(blob).hexdigest() == S + ptr["sha256"]
    assert ptr["size"] == len(blob) and blob.endswith(BIG) and b'"id": "t1"' in blob
    ids = store.query(
        "SELECT seq, kind, idempotency_id FROM ledger_records ORDER BY seq", []
    ).to_pylist()
    assert [(r["seq"], r["kind"], r["idempotency_id"]) for r in ids][1:] == [
        (2, "blobptr", "t1"),
        (3, "turn", "t2"),
    ]
    in_table = store.query("SELECT count(*) AS n FROM ledger_blobs", []).to_pylist()[0]["n"]
    assert in_table == (1 if where == "database" else 0)
    got = [(r.seq, r.kind, r.idempotency_id, r.payload) for r in ledger.replay("s")]
    assert got[1:] == [(2, "turn", "t1", BIG), (3, "turn", "t2", SMALL)]
    # a redelivery finds the original; other content under the id is refused
    again = w.append("turn", BIG, "t1")
    assert (again.seq, again.duplicate) == (2, True)
    assert ledger.tip("s") == 3
    # a plain store.ledger (default settings) reads the database's blobs the same way
    if where == "database":
        assert [r.payload for r in store.ledger.replay("s")][1:] == [BIG, SMALL]


def test_the_write_side_refuses_a_body_over_the_ceiling_and_writes_nothing(store, where, tmp_path):
    ledger = _ledger(store, where, tmp_path, max_body_bytes=300)
    w = _open(store, ledger)
    with pytest.raises(DurableBodyTooLargeError) as err:
        w.append_many([LedgerEntry("turn", b"x" * 100, "ok"), LedgerEntry("turn", BIG, "big")])
    assert not isinstance(err.value, BlobIntegrityError)
    assert (err.value.seq, err.value.object_id, err.value.max_bytes) == (0, "big", 300)
    assert err.value.declared_bytes > 300
    assert ledger.tip("s") == 1 and ledger.blobs.list(S) == []
    # inline too: a ceiling below the threshold refuses an inline body
    inline = ledger.with_blobs(ledger.blobs, offload_threshold=1000, max_body_bytes=10)
    w2 = inline.open("s", w.lease)
    with pytest.raises(DurableBodyTooLargeError):
        w2.append("turn", b"x" * 11, "inline-big")
    assert [r.kind for r in inline.replay("s")] == ["fence", "fence"]


class _Counting:
    """A blob store that counts its gets (and can fail them)."""

    def __init__(self, inner: Any, fail: BaseException | None = None) -> None:
        self.inner, self.fail, self.gets = inner, fail, 0

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        self.gets += 1
        if self.fail is not None:
            raise self.fail
        return bytes(self.inner.get(key, max_bytes))

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> list[str]:
        return list(self.inner.list(prefix))


def test_replay_refuses_a_pointer_declaring_a_body_over_the_ceiling_without_fetching_it(
    store, where, tmp_path
):
    ledger = _ledger(store, where, tmp_path)
    _open(store, ledger).append("turn", BIG, "t1")
    key = _pointer(store, 2)["key"]
    counting = _Counting(ledger.blobs)
    small = ledger.with_blobs(counting, offload_threshold=THRESHOLD, max_body_bytes=100)
    with pytest.raises(DurableBodyTooLargeError) as err:
        list(small.replay("s"))
    assert (err.value.seq, err.value.object_id, err.value.max_bytes) == (2, key, 100)
    assert err.value.declared_bytes > len(BIG) and counting.gets == 0
    assert not isinstance(err.value, BlobIntegrityError)


def test_a_flipped_blob_byte_is_an_integrity_error_and_the_hash_fence_can_fail(
    store, where, tmp_path, monkeypatch
):
    ledger = _ledger(store, where, tmp_path)
    _open(store, ledger).append("turn", BIG, "t1")
    ptr = _pointer(store, 2)
    blob = _clear(store, ledger, ptr["key"])
    flipped = blob[:-1] + bytes([blob[-1] ^ 1])
    _damage(store, ledger, ptr["key"], flipped)
    seen: list[int] = []
    with pytest.raises(BlobIntegrityError) as err:
        for r in ledger.replay("s"):
            seen.append(r.seq)
    assert (err.value.seq, err.value.key, err.value.want) == (2, ptr["key"], ptr["sha256"])
    assert err.value.got == hashlib.sha256(flipped).hexdigest() and seen == [1]
    # control: the hash fence patched out, the tampered body is yielded as the record
    monkeypatch.setattr(blob_ops, "blob_hash_ok", lambda want, got: True)
    bodies = [r.payload for r in ledger.replay("s")]
    assert bodies[1] != BIG and bodies[1] == flipped[-len(BIG) :]


def test_a_blob_carrying_another_id_than_its_pointer_is_a_pointer_id_mismatch(
    store, where, tmp_path
):
    ledger = _ledger(store, where, tmp_path)
    _open(store, ledger).append("turn", BIG, "t1")
    other = blob_ops.envelope(LedgerEntry("turn", BIG, "someone-else"))
    key = _own_blob(store, ledger, other)
    pointer = json.dumps(
        {"key": key, "sha256": hashlib.sha256(other).hexdigest(), "size": len(other)},
        sort_keys=True,
    ).encode()
    reseal(store, 2, pointer)
    with pytest.raises(BlobPointerIDMismatchError) as err:
        list(ledger.replay("s"))
    assert (err.value.seq, err.value.key, err.value.outer_id, err.value.inner_id) == (
        2,
        key,
        "t1",
        "someone-else",
    )


def test_a_missing_or_unreadable_blob_is_unavailable(store, where, tmp_path):
    ledger = _ledger(store, where, tmp_path)
    _open(store, ledger).append("turn", BIG, "t1")
    key = _pointer(store, 2)["key"]
    failing = ledger.with_blobs(
        _Counting(ledger.blobs, fail=OSError("disk gone")), offload_threshold=THRESHOLD
    )
    with pytest.raises(BlobUnavailableError) as err:
        list(failing.replay("s"))
    assert (err.value.seq, err.value.key) == (2, key)
    assert isinstance(err.value.__cause__, OSError)
    _drop(store, ledger, key)
    with pytest.raises(BlobUnavailableError) as err:
        list(ledger.replay("s"))
    assert (err.value.seq, err.value.key) == (2, key)
    assert isinstance(err.value.__cause__, BlobNotFoundError)


def test_an_undecodable_blob_is_a_replay_decode_error(store, where, tmp_path):
    ledger = _ledger(store, where, tmp_path)
    _open(store, ledger).append("turn", BIG, "t1")
    junk = b"not an envelope"
    key = _own_blob(store, ledger, junk)
    pointer = json.dumps(
        {"key": key, "sha256": hashlib.sha256(junk).hexdigest(), "size": len(junk)},
        sort_keys=True,
    ).encode()
    reseal(store, 2, pointer)
    with pytest.raises(ReplayDecodeError) as err:
        list(ledger.replay("s"))
    assert err.value.seq == 2
    assert isinstance(err.value.__cause__, EnvelopeError) and "envelope" in str(err.value.__cause__)


def test_an_undecodable_pointer_is_a_replay_decode_error_caused_by_an_envelope_error(
    store, where, tmp_path
):
    ledger = _ledger(store, where, tmp_path)
    _open(store, ledger).append("turn", BIG, "t1")
    for junk in (b'{"key', b'{"key": 1, "sha256": "x", "size": 3}', b"\xff"):
        reseal(store, 2, junk)
        with pytest.raises(ReplayDecodeError) as err:
            list(ledger.replay("s"))
        assert err.value.seq == 2
        cause = err.value.__cause__
        assert isinstance(cause, EnvelopeError) and "pointer" in cause.reason
        assert isinstance(cause.__cause__, ValueError | KeyError | TypeError), cause.__cause__


@pytest.mark.parametrize("missing", ["put", "get", "delete", "list"])
def test_a_blob_store_lacking_a_method_is_an_invalid_backend(store, missing):
    class Partial:
        def put(self, key: str, data: bytes) -> None: ...
        def get(self, key: str) -> bytes: ...
        def delete(self, key: str) -> None: ...
        def list(self, prefix: str) -> list[str]: ...

    setattr(Partial, missing, None)  # present, not callable
    with pytest.raises(InvalidBackendError) as err:
        store.ledger.with_blobs(Partial())
    assert err.value.missing == missing
    with pytest.raises(InvalidBackendError) as err:
        store.ledger.with_blobs(object())  # type: ignore[arg-type]
    assert err.value.missing == "put"


def test_a_blob_root_that_cannot_be_made_canonical_is_a_persistence_path_error(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    for bad in (loop, loop / "blobs", afile, afile / "blobs"):
        with pytest.raises(PersistencePathError) as err:
            FsspecBlobs(str(bad))
        assert err.value.path == str(bad)
    with pytest.raises(PersistencePathError):
        FsspecBlobs(str(tmp_path / "a\x00b"))
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert FsspecBlobs(str(tmp_path / "link")).root == str(real)  # links resolved once
    assert FsspecBlobs(str(tmp_path / "new" / "blobs")).root == str(tmp_path / "new" / "blobs")


def test_a_blob_root_url_names_its_filesystem(tmp_path):
    """Failed before (attack on issue 19, F5): ``s3://bucket/prefix`` and
    ``memory://…`` roots were local folders named ``s3:`` and ``memory:`` in
    the current directory."""
    memory = FsspecBlobs("memory://tk-test/blobs")
    assert type(memory.fs).__name__ == "MemoryFileSystem" and memory.root == "/tk-test/blobs"
    memory.put("sessions/s/k", b"x")
    assert memory.get("sessions/s/k") == b"x" and not Path("memory:").exists()
    local = FsspecBlobs(f"file://{tmp_path}/b")
    assert local.root == str(tmp_path / "b")
    with pytest.raises(InvalidInputError) as refused:
        FsspecBlobs("nosuch://x/y")
    assert refused.value.field == "root"


# -- GC -----------------------------------------------------------------------------


def _crash_mid_offload(ledger: Any, w: Any, monkeypatch: Any, payload: bytes, rid: str) -> str:
    """Append ``payload`` with the pointer's append failing after the blob was
    written; returns the orphan's key."""
    before = set(ledger.blobs.list(S))

    def crash(*a: Any, **k: Any) -> Any:
        raise RuntimeError("killed between the blob and its pointer")

    with monkeypatch.context() as m:
        m.setattr(journal, "append", crash)
        with pytest.raises(RuntimeError):
            w.append("turn", payload, rid)
    (orphan,) = set(ledger.blobs.list(S)) - before
    return orphan


def test_a_crash_mid_offload_leaves_an_orphan_replay_never_sees_and_gc_reclaims(
    store, where, tmp_path, monkeypatch
):
    ledger = _ledger(store, where, tmp_path)
    w = _open(store, ledger)
    w.append("turn", BIG, "kept")
    live = _pointer(store, 2)["key"]
    orphan = _crash_mid_offload(ledger, w, monkeypatch, BIG + b"lost", "lost")
    assert [r.idempotency_id for r in ledger.replay("s")] == ["fence:1:1", "kept"]
    result = ledger.gc("s", w.lease)
    assert (result.scanned, result.referenced, result.deleted) == (2, 1, 1)
    assert result.scanned == result.referenced + result.deleted
    assert result.deleted_keys == (orphan,) and result.unreclaimable == 0
    assert ledger.blobs.list(S) == [live]
    assert [r.payload for r in ledger.replay("s")][1:] == [BIG]
    again = ledger.gc("s", w.lease)
    assert (again.scanned, again.referenced, again.deleted, again.deleted_keys) == (1, 1, 0, ())
    # the writer goes on: a redelivery of the lost record now lands
    assert w.append("turn", BIG + b"lost", "lost").seq == 3


@pytest.mark.parametrize("where", ["directory", "s3"], indirect=True)
def test_gc_leaves_keys_of_another_shape_as_unreclaimable(store, where, tmp_path):
    """(The database's table holds only keys of the offload shape.)"""
    ledger = _ledger(store, where, tmp_path)
    w = _open(store, ledger)
    w.append("turn", BIG, "kept")
    notes = posixpath.join(ledger.blobs.root, S + "notes.txt")
    ledger.blobs.fs.pipe_file(notes, b"not ours")
    result = ledger.gc("s", w.lease)
    assert (result.scanned, result.referenced, result.deleted, result.unreclaimable) == (
        1,
        1,
        0,
        1,
    )
    assert ledger.blobs.fs.cat_file(notes) == b"not ours"


def test_gc_under_a_lost_lease_is_refused_and_deletes_nothing_and_the_fence_can_fail(
    store, clock, where, tmp_path, monkeypatch
):
    ledger = _ledger(store, where, tmp_path)
    first = _open(store, ledger)
    orphan = _crash_mid_offload(ledger, first, monkeypatch, BIG, "lost")
    with pytest.raises(NilLeaseError):
        ledger.gc("s", None)
    clock.advance(TTL + 1)
    second = _open(store, ledger, owner="w2")
    assert second.epoch == 2
    with pytest.raises(GCLeaseNotHeldError) as err:
        ledger.gc("s", first.lease)
    assert (err.value.session_id, err.value.epoch) == ("s", 1)
    assert isinstance(err.value.__cause__, LeaseLostError)
    assert ledger.blobs.list(S) == [orphan]
    # control: GC's lease check patched out, the stale lease deletes
    monkeypatch.setattr(gc_ops, "writer_fence", lambda tx, tenant, sid, lease: None)
    assert ledger.gc("s", first.lease).deleted_keys == (orphan,)
    assert ledger.blobs.list(S) == []


def test_gc_of_a_lease_held_but_fenced_out_of_the_ledger_is_refused(store, where, tmp_path):
    """The lease fence alone passes (the lease is held), the ledger's newest
    fence is another epoch: refused (a grant that never opened the ledger)."""
    ledger = _ledger(store, where, tmp_path)
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", TTL)
    with pytest.raises(GCLeaseNotHeldError):
        ledger.gc("s", lease)


def test_gc_fails_closed_on_an_undecodable_pointer(store, where, tmp_path, monkeypatch):
    ledger = _ledger(store, where, tmp_path)
    w = _open(store, ledger)
    w.append("turn", BIG, "kept")
    orphan = _crash_mid_offload(ledger, w, monkeypatch, BIG + b"x", "lost")
    bad = stored_ledger_payload(store, "s", 2, b'{"key')
    forge(store, "UPDATE ledger_records SET payload = ? WHERE seq = 2", [bad], rows=1)
    with pytest.raises(GCScanError) as err:
        ledger.gc("s", w.lease)
    assert err.value.name == "ledger:s"
    assert isinstance(err.value.__cause__, ReplayDecodeError)
    assert orphan in ledger.blobs.list(S) and len(ledger.blobs.list(S)) == 2


class _Failing(_Counting):
    def __init__(self, inner: Any, *, list_fails: bool = False) -> None:
        super().__init__(inner)
        self.list_fails, self.deleted = list_fails, 0

    def list(self, prefix: str) -> list[str]:
        if self.list_fails:
            raise OSError("listing cut short")
        return super().list(prefix)

    def delete(self, key: str) -> None:
        self.deleted += 1
        raise OSError("permission denied")


def test_gc_fails_closed_on_a_failed_listing_and_surfaces_a_failed_delete(
    store, where, tmp_path, monkeypatch
):
    ledger = _ledger(store, where, tmp_path)
    w = _open(store, ledger)
    orphan = _crash_mid_offload(ledger, w, monkeypatch, BIG, "lost")
    listing = _Failing(ledger.blobs, list_fails=True)
    with pytest.raises(GCListError) as err:
        ledger.with_blobs(listing, offload_threshold=THRESHOLD).gc("s", w.lease)
    assert err.value.prefix == S and isinstance(err.value.__cause__, OSError)
    assert listing.deleted == 0
    deleting = _Failing(ledger.blobs)
    with pytest.raises(GCDeleteError) as derr:
        ledger.with_blobs(deleting, offload_threshold=THRESHOLD).gc("s", w.lease)
    assert derr.value.key == orphan and isinstance(derr.value.__cause__, OSError)
    assert ledger.blobs.list(S) == [orphan]


def test_tenants_have_their_own_blob_prefix(store, where, tmp_path):
    ledger = _ledger(store, where, tmp_path).with_tenant("acme")
    w = _open(store, ledger)
    w.append("turn", BIG, "t1")
    (key,) = ledger.blobs.list(blob_ops.blob_prefix("acme", "s"))
    assert ledger.blobs.list(S) == []
    assert [r.payload for r in ledger.replay("s")][1:] == [BIG]
    assert ledger.gc("s", w.lease).referenced == 1 and ledger.blobs.list("blobs/t=acme/") == [key]


def test_a_session_delete_removes_its_database_blobs(store, tmp_path):
    ledger = store.ledger.with_blobs(offload_threshold=THRESHOLD)
    w = _open(store, ledger)
    w.append("turn", BIG, "t1")
    assert store.query("SELECT count(*) AS n FROM ledger_blobs", []).to_pylist()[0]["n"] == 1
    store.sessions.delete("s", lease=w.lease)
    assert store.query("SELECT count(*) AS n FROM ledger_blobs", []).to_pylist()[0]["n"] == 0


def test_a_listing_takes_its_prefix_literally(store, where, tmp_path):
    """``_`` and ``%`` in a session id are not LIKE wildcards: GC of ``a_%``
    neither counts nor deletes ``abc``'s blob."""
    ledger = _ledger(store, where, tmp_path)
    other = _open(store, ledger, sid="abc")
    other.append("turn", BIG, "t1")
    w = _open(store, ledger, sid="a_%")
    orphan = blob_ops.offload(ledger.blobs, "", "a_%", LedgerEntry("turn", BIG, "x"), 10**6)
    (key,) = ledger.blobs.list(blob_ops.blob_prefix("", "a_%"))
    assert json.loads(orphan.payload)["key"] == key
    result = ledger.gc("a_%", w.lease)
    assert (result.scanned, result.deleted_keys) == (1, (key,))
    assert len(ledger.blobs.list(blob_ops.blob_prefix("", "abc"))) == 1
    assert [r.payload for r in ledger.replay("abc")][1:] == [BIG]


def test_an_offloaded_command_application_reads_back_and_fails_closed_when_damaged(
    store, where, tmp_path
):
    from turnkeeper import CommandApplication, CommandApplicationNotFoundError

    ledger = _ledger(store, where, tmp_path)
    w = _open(store, ledger)
    log = ledger.command_log("s", w)
    app = CommandApplication("cmd-1", {"text": "y" * 500})
    seq = log.append_command_application(app).seq
    assert _pointer(store, seq)["size"] > 500
    assert log.read_command_application_at(seq) == app
    _drop(store, ledger, _pointer(store, seq)["key"])
    with pytest.raises(CommandApplicationNotFoundError) as err:
        log.read_command_application_at(seq)
    assert isinstance(err.value.__cause__, BlobUnavailableError)
