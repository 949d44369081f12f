"""A ledger blob and a change of its session's key between the blob's put and
its pointer's append (attack findings on issue 23, part 2).

A writer seals an offloaded payload's blob and puts it before the fenced
transaction that appends its pointer (``condemn.write_offloaded``). A
``sessions.rotate_key`` committed after the seal, its walk not seeing the
blob, used to leave the blob under a
version whose key row it had deleted (the replay then failed, and so did
every later rotation), and a ``sessions.encrypt`` left a clear blob in a
sealed session. The append now checks each new pointer's blob against the
version it seals under (``sealing.current_blobs``): one in the database's
table is sealed again in place in the append's transaction, one outside it
is put again under the current version. Each case runs the racing call
deterministically, from a blob store that makes it right after the put,
on both engines and both kinds of blob store; each control patches the
check out and sees the failure. A store object opened before the store was
marked encrypted (it takes every session for clear) is refused a ledger
write into a sealed session: the ledger compares no session row, so its
writes read the session's key version themselves (``sealing.session_key``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_KEYS, close_backend, open_backend, reopen

import turnkeeper
from turnkeeper import (
    FsspecBlobs,
    KeyUnavailableError,
    PayloadAuthenticationError,
    TransactionConflictError,
)
from turnkeeper.fuzz import FakeClock
from turnkeeper.storage.crypto.seal import MAGIC
from turnkeeper.storage.ops.ledger import DatabaseBlobs, sealing
from turnkeeper.storage.ops.ledger.blobs import BlobStore

TTL = 60.0
THRESHOLD = 64
SECRET = b"the launch code is 0000"
BIG = SECRET * 8  # over the threshold: offloaded


class Between:
    """A blob store that runs ``then()`` at each of its first ``times``
    puts, before storing the bytes the writer sealed: a rotation or an
    encrypt committed by another worker after the writer sealed its blob
    and before the put landed (so before its append)."""

    def __init__(self, inner: BlobStore, then: Callable[[], object], times: int = 1) -> None:
        self.inner, self.then, self.times = inner, then, times

    def put(self, key: str, data: bytes) -> None:
        if self.times > 0:
            self.times -= 1
            self.then()
        self.inner.put(key, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        return self.inner.get(key, max_bytes)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)


@pytest.fixture(params=["database", "directory"])
def where(request: pytest.FixtureRequest) -> str:
    """Where the ledger's blobs live: the store's table or a directory."""
    return str(request.param)


def _inner(store: Any, where: str, tmp_path: Path) -> BlobStore:
    return DatabaseBlobs(store.db) if where == "database" else FsspecBlobs(str(tmp_path / "blobs"))


def _stored_blobs(store: Any, blobs: BlobStore) -> list[bytes]:
    """Every blob of session ``s`` as stored."""
    inner = blobs.inner if isinstance(blobs, Between) else blobs
    keys = inner.list("blobs/")
    if isinstance(inner, FsspecBlobs):
        return [bytes(inner.fs.cat_file(posixpath.join(inner.root, k))) for k in keys]
    rows = store.query("SELECT data FROM ledger_blobs ORDER BY key").to_pylist()
    return [bytes(r["data"]) for r in rows]


def _key_versions(store: Any) -> list[int]:
    rows = store.query("SELECT version FROM session_keys WHERE session_id = 's' ORDER BY 1")
    return [int(r["version"]) for r in rows.to_pylist()]


def _replayed(store: Any, blobs: BlobStore) -> list[bytes]:
    ledger = store.ledger.with_blobs(blobs, offload_threshold=THRESHOLD)
    return [r.payload for r in ledger.replay("s") if r.kind == "note"]


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "control"])
def test_a_rotation_between_a_blobs_put_and_its_append_leaves_it_readable(
    enc: Any, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checked: bool
) -> None:
    enc.sessions.create("s")
    lease = enc.leases.acquire("session:s", "w", ttl_s=TTL)
    inner = _inner(enc, where, tmp_path)
    blobs = Between(inner, lambda: enc.sessions.rotate_key("s", lease=lease))
    if not checked:
        monkeypatch.setattr(sealing, "current_blobs", lambda *a, **k: None)
    with enc.ledger.with_blobs(blobs, offload_threshold=THRESHOLD).open("s", lease) as writer:
        writer.append("note", BIG, "n1")
    # the rotation deleted version 1's key row: no pointer named a blob outside the database yet
    assert _key_versions(enc) == [2]
    with reopen(enc, encryption=TEST_KEYS) as cold:  # no key cached
        if not checked:  # the blob is under version 1, whose key row the rotation deleted
            with pytest.raises(PayloadAuthenticationError):
                _replayed(cold, inner)
            return
        assert _replayed(cold, inner) == [BIG]
    assert all(b.startswith(MAGIC) and SECRET not in b for b in _stored_blobs(enc, blobs))


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "control"])
def test_an_encrypt_between_a_blobs_put_and_its_append_leaves_no_clear_blob(
    where: str,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    engine: str,
    checked: bool,
) -> None:
    clear = open_backend(engine, tmp_path, clock)
    try:
        clear.sessions.create("s")  # a clear session of a store not yet encrypted
        with reopen(clear, encryption=TEST_KEYS) as keyed:
            lease = keyed.leases.acquire("session:s", "w", ttl_s=TTL)
            inner = _inner(keyed, where, tmp_path)
            blobs = Between(inner, lambda: keyed.sessions.encrypt("s", lease=lease))
            if not checked:
                monkeypatch.setattr(sealing, "current_blobs", lambda *a, **k: None)
            ledger = keyed.ledger.with_blobs(blobs, offload_threshold=THRESHOLD)
            with ledger.open("s", lease) as writer:
                writer.append("note", BIG, "n1")
            stored = _stored_blobs(keyed, blobs)
            assert stored
            if not checked:
                assert any(SECRET in b for b in stored)  # the clear blob the check prevents
                return
            assert all(b.startswith(MAGIC) and SECRET not in b for b in stored)
            with reopen(clear, encryption=TEST_KEYS) as cold:
                assert _replayed(cold, inner) == [BIG]
    finally:
        close_backend(clear)


@pytest.fixture(params=["duckdb", "postgres"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_key_moving_under_every_put_ends_in_a_typed_conflict_and_writes_nothing(
    enc: Any, tmp_path: Path
) -> None:
    enc.sessions.create("s")
    lease = enc.leases.acquire("session:s", "w", ttl_s=TTL)
    inner = FsspecBlobs(str(tmp_path / "blobs"))
    blobs = Between(inner, lambda: enc.sessions.rotate_key("s", lease=lease), times=100)
    with enc.ledger.with_blobs(blobs, offload_threshold=THRESHOLD).open("s", lease) as writer:
        with pytest.raises(TransactionConflictError) as refused:
            writer.append("note", BIG, "n1")
        assert refused.value.operation == "ledger_append" and refused.value.attempts == 8
        assert enc.ledger.tip("s") == 1  # the writer's fence alone
        writer.append("note", SECRET, "n2")  # the writer is still usable
    assert _replayed(enc, inner) == [SECRET]


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "control"])
def test_a_store_object_that_took_the_store_for_clear_is_refused_a_sealed_ledger(
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    engine: str,
    where: str,
    checked: bool,
) -> None:
    stale = open_backend(engine, tmp_path, clock)  # opened before the store was marked
    try:
        stale.sessions.create("s")
        with reopen(stale, encryption=TEST_KEYS) as keyed:
            assert keyed.sessions.encrypt("s") is True
        if not checked:
            monkeypatch.setattr(
                sealing, "session_key", lambda tx, sid: tx.keys.sealing(tx, sid)
            )  # the object's own view of the store (clear), as before the fix
        lease = stale.leases.acquire("session:s", "w", ttl_s=TTL)
        inner = _inner(stale, where, tmp_path)
        ledger = stale.ledger.with_blobs(inner, offload_threshold=THRESHOLD)
        if not checked:
            with ledger.open("s", lease) as writer:
                writer.append("note", BIG, "n1")
            assert any(SECRET in b for b in _stored_blobs(stale, inner))
            return
        with pytest.raises(KeyUnavailableError):
            ledger.open("s", lease)
        assert stale.query("SELECT count(*) AS n FROM ledger_records").to_pylist() == [{"n": 0}]
        assert _stored_blobs(stale, inner) == []
        with reopen(stale, encryption=TEST_KEYS, clock=clock) as keyed:  # the key holder writes
            keyed_ledger = keyed.ledger.with_blobs(inner, offload_threshold=THRESHOLD)
            with keyed_ledger.open("s", lease) as writer:
                writer.append("note", BIG, "n1")
            assert _replayed(keyed, inner) == [BIG]
    finally:
        close_backend(stale)


def test_a_store_writes_its_ledger_blobs_as_its_sessions_are(store: turnkeeper.BaseStore) -> None:
    """The session's key version read by every store object (one point read
    per append) changes nothing of a clear ledger: its blobs stay as given
    (an encrypted store's, in the suite's encrypted pass, sealed)."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", ttl_s=TTL)
    ledger = store.ledger.with_blobs(offload_threshold=THRESHOLD)
    with ledger.open("s", lease) as writer:
        writer.append("note", BIG, "n1")
    assert _replayed(store, ledger.blobs) == [BIG]
    (stored,) = _stored_blobs(store, ledger.blobs)
    if store.db.keyring.encrypted:
        assert stored.startswith(MAGIC) and SECRET not in stored
    else:
        assert stored.endswith(BIG)
