"""A blob's key is an injective function of (tenant, session, blob id) on
every blob store (attack on issue 19, F4): GC, ``sweep_deleted`` and a
session delete find exactly one session's blobs, never another tenant's or
session's (a tenant holding ``sessions/``, tenant and session pairs whose
joined text is the same, ``a//b`` and ``m/./n`` that a directory store
normalizes, a child session ``a/b`` under ``a``). On every backend, with the
blobs in the database's table, a local directory and S3 (moto's server).

Also: a NUL or a segment over 255 bytes in a tenant or session id works on a
directory store, and a blob longer than its pointer declares is read only to
its declared size plus one byte before ``BlobIntegrityError``.
"""

from __future__ import annotations

import itertools
import json
import posixpath
import urllib.parse
from typing import Any

import pytest
from conftest import ledger_payload
from test_ledger_blobs import BIG, THRESHOLD, _clear, _damage, _ledger, _open
from test_ledger_blobs import where as where  # the fixture: database, directory, s3

from turnkeeper import (
    BlobIntegrityError,
    BlobNotFoundError,
    InvalidInputError,
    LedgerEntry,
    PayloadAuthenticationError,
)
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.crypto.seal import OVERHEAD
from turnkeeper.storage.ops.ledger import blobs as blob_ops
from turnkeeper.storage.ops.ledger import journal
from turnkeeper.storage.ops.ledger import sweep as sweep_ops

SAME_SEGMENT = [
    # (tenant, session) pairs whose blob keys were one key, or one folder, on main
    (("x/sessions/y", "z"), ("x", "y/sessions/z")),  # the same joined text
    (("acme/", "s"), ("acme", "s")),  # a directory store reads acme//… as acme/…
    (("", "p//q"), ("", "p/q")),
    (("", "m/./n"), ("", "m/n")),
    (("", "a/b"), ("", "a")),  # a child session's folder under its parent's
    (("user-sessions", "s1"), ("", "sessions/s1")),
]
IDS = ["joined-text", "trailing-slash", "double-slash", "dot-segment", "child", "tenant-sessions"]


def _pointer_key(store: Any, tenant: str, sid: str, rid: str) -> str:
    rows = store.query(
        "SELECT seq, blob_key FROM ledger_records WHERE tenant = ? AND session_id = ? "
        "AND idempotency_id = ? AND kind = 'blobptr'",
        [tenant, sid, rid],
    ).to_pylist()
    assert len(rows) == 1, (tenant, sid, rid)
    key = str(json.loads(ledger_payload(store, rows[0]["seq"], sid, tenant))["key"])
    assert rows[0]["blob_key"] == key  # the clear column names the pointer's key
    return key


def _orphan(ledger: Any, w: Any, monkeypatch: Any, payload: bytes, rid: str) -> str:
    """Offload ``payload`` with its pointer append failing (a crash between
    the blob and its pointer); the orphan's key, from the key function."""

    def crash(*a: Any, **k: Any) -> Any:
        raise RuntimeError("killed between the blob and its pointer")

    with monkeypatch.context() as m:
        m.setattr(journal, "append", crash)
        with pytest.raises(RuntimeError):
            w.append("turn", payload, rid)
    pointer = blob_ops.offload(
        _Null(), ledger.tenant, w.session_id, LedgerEntry("turn", payload, rid), 10**9
    )
    return str(json.loads(pointer.payload)["key"])


class _Null:
    def put(self, key: str, data: bytes) -> None:
        pass


def _replayed(ledger: Any, sid: str) -> list[bytes]:
    return [r.payload for r in ledger.replay(sid)][1:]


@pytest.mark.parametrize("one, two", SAME_SEGMENT, ids=IDS)
def test_gc_of_one_session_never_counts_or_deletes_anothers_blobs(
    store, where, tmp_path, monkeypatch, one, two
):
    """Before the fix: GC of ``x`` / ``y/sessions/z`` deleted ``x/sessions/y`` /
    ``z``'s referenced blob (replay: BlobUnavailableError); on a directory GC
    of ``acme`` deleted ``acme/``'s, ``p/q``'s deleted ``p//q``'s, ``m/n``'s
    deleted ``m/./n``'s; GC of ``a`` counted ``a/b``'s blobs unreclaimable."""
    base = _ledger(store, where, tmp_path)
    sides = []
    for n, (tenant, sid) in enumerate((one, two)):
        ledger = base.with_tenant(tenant)
        if store.sessions.get(sid) is None:
            store.sessions.create(sid)
        lease = sides[0][1].lease if sides and sides[0][2] == sid else None
        if lease is None:
            lease = store.leases.acquire(f"session:{sid}", "w", 30.0)
        w = ledger.open(sid, lease)
        payload = BIG + f"side {n}".encode()
        w.append("turn", payload, f"kept-{n}")
        sides.append((ledger, w, sid, payload))
    orphans = [
        _orphan(ledger, w, monkeypatch, BIG + f"lost {n}".encode(), f"lost-{n}")
        for n, (ledger, w, _, _) in enumerate(sides)
    ]
    for n, (ledger, w, sid, _) in enumerate(sides):
        result = ledger.gc(sid, w.lease)
        assert (result.scanned, result.referenced, result.unreclaimable) == (2, 1, 0), (n, result)
        assert result.deleted_keys == (orphans[n],)
        for other, (o_ledger, _, o_sid, o_payload) in enumerate(sides):
            assert _replayed(o_ledger, o_sid) == [o_payload], (n, other)
    assert len(set(orphans)) == 2


SWEPT = [
    # (deleted tenant, session), (live tenant, session)
    (("", "m/n"), ("", "m/./n")),
    (("", "p/q"), ("", "p//q")),
    (("", "a"), ("", "a/b")),
    (("", "a/b"), ("", "a")),
    (("", "sessions/c1"), ("prod-sessions", "c1")),
    (("user-sessions", "s1"), ("", "sessions/s1")),
    (("x", "y/sessions/z"), ("x/sessions/y", "z")),
]
SWEPT_IDS = ["dot", "double-slash", "parent", "child", "sessions-id", "sessions-tenant", "joined"]


@pytest.mark.parametrize("gone, live", SWEPT, ids=SWEPT_IDS)
def test_a_session_delete_and_the_sweep_take_its_blobs_and_no_others(
    store, where, tmp_path, gone, live
):
    """Before the fix, with the blobs in the database: deleting ``s1`` of
    tenant ``user-sessions`` left its blob (filed under session
    ``sessions/s1``), and the audit failed no_orphan_rows; deleting
    ``sessions/c1`` took tenant ``prod-sessions``' blob of ``c1``. On a
    directory, the sweep after deleting ``m/n`` took ``m/./n``'s blob."""
    base = _ledger(store, where, tmp_path)
    keys = {}
    writers = {}
    for side, (tenant, sid) in (("gone", gone), ("live", live)):
        ledger = base.with_tenant(tenant)
        w = _open(store, ledger, sid=sid)
        w.append("turn", BIG + side.encode(), side)
        keys[side] = _pointer_key(store, tenant, sid, side)
        writers[side] = w
    store.sessions.delete(gone[1], lease=writers["gone"].lease)
    if where == "database":  # the delete itself clears the database's blobs
        with pytest.raises(BlobNotFoundError):
            base.blobs.get(keys["gone"])
        assert [(c.name, c.detail) for c in run_audit(store) if not c.passed] == []
    for tenant in {gone[0], live[0]}:
        base.with_tenant(tenant).sweep_deleted()
        base.with_tenant(tenant).sweep_deleted([gone[1], live[1]])
    with pytest.raises(BlobNotFoundError):
        base.blobs.get(keys["gone"])
    live_ledger = base.with_tenant(live[0])
    assert _replayed(live_ledger, live[1]) == [BIG + b"live"]
    if where == "database":  # (the audit verifies ledgers against the database's blobs)
        assert [(c.name, c.detail) for c in run_audit(store) if not c.passed] == []


HOSTILE = [
    "",
    "s",
    "a",
    "a/b",
    "a//b",
    "a/./b",
    "a/../b",
    ".",
    "..",
    "/",
    "a/",
    "/a",
    "sessions/a",
    "tenants/a/sessions/b",
    "x/sessions/y",
    "y/sessions/z",
    "a%2Fb",
    "a%b",
    "nul\x00here",
    "é",
    "A",
    "a+",
    "~",
    "x" * 300,
    "x" * 299,
    "é" * 200,
    "%" * 120,
]


def test_blob_keys_are_injective_prefix_free_and_never_normalized():
    """Every (tenant, session) pair of hostile ids has its own prefix, none a
    prefix of another's, made of segments a directory store keeps as they are:
    never empty, ``.`` or ``..``, no NUL, at most 255 bytes. Before the fix
    ``a//b`` had the prefix ``sessions/a//b/``, which a directory reads as
    ``sessions/a/b/``."""
    pairs = [(t, s) for t in HOSTILE for s in HOSTILE if s]
    prefixes = {blob_ops.blob_prefix(t, s): (t, s) for t, s in pairs}
    assert len(prefixes) == len(pairs)
    ordered = sorted(prefixes)
    for a, b in itertools.pairwise(ordered):
        assert not b.startswith(a), (prefixes[a], prefixes[b])
    digest = "0" * 64
    for prefix, (tenant, sid) in prefixes.items():
        key = prefix + digest
        assert posixpath.normpath(key) == key and not key.startswith("/")
        for segment in key.split("/"):
            assert segment not in ("", ".", "..") and "\x00" not in segment
            assert len(segment.encode()) <= 255, (tenant, sid)
        assert blob_ops.parse_key(key) == (tenant, sid, digest)


@pytest.mark.parametrize("where", ["directory", "s3"], indirect=True)
@pytest.mark.parametrize(
    "tenant, sid",
    [("t" * 300, "s"), ("", "s" * 300), ("é/" * 40, "é" * 60)],
    ids=["long-tenant", "long-session", "both"],
)
def test_a_nul_or_an_overlong_segment_works_on_a_blob_directory(
    store, where, tmp_path, tenant, sid
):
    """Before the fix: ValueError (embedded null byte) or OSError (file name
    too long) from the append; nothing written. (A session id and a tenant
    hold no control character: the session store and ``with_tenant``
    refuse NUL, typed.)"""
    with pytest.raises(InvalidInputError) as refused:
        store.ledger.with_tenant("nul\x00tenant")
    assert refused.value.field == "tenant"
    ledger = _ledger(store, where, tmp_path).with_tenant(tenant)
    w = _open(store, ledger, sid=sid)
    w.append("turn", BIG, "t1")
    assert _replayed(ledger, sid) == [BIG]
    assert ledger.gc(sid, w.lease).referenced == 1
    assert _replayed(ledger, sid) == [BIG]


@pytest.mark.parametrize(
    "where, field",
    [("s3", "tenant"), ("s3", "session_id")],
    indirect=["where"],
)
def test_an_id_too_long_for_any_path_is_an_invalid_input_naming_it(store, where, tmp_path, field):
    """Before the fix: OSError (file name too long) from the append. (A
    session id and a tenant are at most 512 bytes: escaped, too long only for
    S3's 1024-byte keys.)"""
    tenant, sid = ("é" * 250, "s") if field == "tenant" else ("", "é" * 170)
    ledger = _ledger(store, where, tmp_path).with_tenant(tenant)
    w = _open(store, ledger, sid=sid)
    with pytest.raises(InvalidInputError) as refused:
        w.append("turn", BIG, "t1")
    assert refused.value.field == field
    assert _replayed(ledger, sid) == [] and ledger.blobs.list("blobs/") == []
    w.append("turn", b"small", "t2")  # nothing written, the ledger goes on
    assert _replayed(ledger, sid) == [b"small"]


class _Reads:
    """A blob store that records how many bytes each get returned."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.read = inner, []

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        data = bytes(self.inner.get(key) if max_bytes is None else self.inner.get(key, max_bytes))
        self.read.append(len(data))
        return data

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> list[str]:
        return list(self.inner.list(prefix))


def test_a_blob_longer_than_its_pointer_says_is_read_only_to_its_size_plus_one(
    store, where, tmp_path
):
    """Before the fix the whole 1 MB blob was read, then BlobIntegrityError
    (a sealed blob: PayloadAuthenticationError naming its key). The read is
    the pointer's size (the clear envelope's) plus a seal's overhead, plus one."""
    ledger = _ledger(store, where, tmp_path)
    _open(store, ledger).append("turn", BIG, "t1")
    key = _pointer_key(store, "", "s", "t1")
    seq = store.query("SELECT seq FROM ledger_records WHERE blob_key = ?", [key]).to_pylist()
    size = json.loads(ledger_payload(store, seq[0]["seq"]))["size"]
    _damage(store, ledger, key, _clear(store, ledger, key) + b"x" * 2**20)
    reads = _Reads(ledger.blobs)
    with pytest.raises((BlobIntegrityError, PayloadAuthenticationError)) as err:
        list(ledger.with_blobs(reads, offload_threshold=THRESHOLD).replay("s"))
    if isinstance(err.value, PayloadAuthenticationError):
        assert store.db.keyring.encrypted and (err.value.record_id, err.value.field) == (
            key,
            "data",
        )
    else:
        assert (err.value.seq, err.value.key) == (2, key)
    assert reads.read == [size + OVERHEAD + 1]


def _lenient_split(key: str) -> tuple[str, str, str] | None:
    """split_key without its last check (the prefix is the one blob_prefix
    makes of the decoded pair): any decodable key counts."""
    parts = key[len(blob_ops.ROOT) :].split("/")
    if not key.startswith(blob_ops.ROOT) or len(parts) != 3:
        return None
    tenant, sid = (urllib.parse.unquote(p[2:]) for p in parts[:2])
    return tenant, sid, parts[2]


@pytest.mark.parametrize("where", ["directory", "s3"], indirect=True)
def test_the_sweep_takes_only_keys_in_the_exact_shape_of_a_deleted_sessions_prefix(
    store, where, tmp_path, monkeypatch
):
    """A key that decodes to session ``gone`` but is not the key this
    turnkeeper makes of it (``%67one``: an escaped ``g``) is another's file:
    the sweep after deleting ``gone`` leaves it. Control: without the exact
    check, the sweep deletes it."""
    ledger = _ledger(store, where, tmp_path)
    w = _open(store, ledger, sid="gone")
    w.append("turn", BIG, "g1")
    foreign = "blobs/t=/s=%67one/" + "0" * 64
    ledger.blobs.put(foreign, b"not the ledger's")
    store.sessions.delete("gone", lease=w.lease)
    result = ledger.sweep_deleted()
    assert result.deleted == 1 and foreign not in result.deleted_keys
    assert ledger.blobs.get(foreign) == b"not the ledger's"
    monkeypatch.setattr(sweep_ops, "split_key", _lenient_split)
    assert ledger.sweep_deleted().deleted_keys == (foreign,)


class _ListsEverything:
    """A blob store whose listing ignores the prefix (a careless one)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        return bytes(self.inner.get(key, max_bytes))

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> list[str]:
        return list(self.inner.list(blob_ops.ROOT))


@pytest.mark.parametrize("where", ["directory", "s3"], indirect=True)
def test_a_tenants_sweep_takes_no_other_tenants_key_whatever_the_store_lists(
    store, where, tmp_path, monkeypatch
):
    """Control: with the tenant check defeated (every key read as acme's),
    tenant acme's sweep takes the default tenant's blob of the deleted
    session too."""
    base = _ledger(store, where, tmp_path)
    everything = base.with_blobs(_ListsEverything(base.blobs), offload_threshold=THRESHOLD)
    w = _open(store, base, sid="gone")
    w.append("turn", BIG, "default")
    acme = everything.with_tenant("acme")
    acme.open("gone", w.lease).append("turn", BIG, "acme")
    store.sessions.delete("gone", lease=w.lease)
    taken = acme.sweep_deleted().deleted_keys
    assert len(taken) == 1 and taken[0].startswith("blobs/t=acme/")
    left = base.blobs.list(blob_ops.blob_prefix("", "gone"))
    assert len(left) == 1
    real = sweep_ops.split_key

    def all_acme(key: str) -> tuple[str, str, str] | None:
        found = real(key)
        return None if found is None else ("acme", found[1], found[2])

    monkeypatch.setattr(sweep_ops, "split_key", all_acme)
    assert everything.with_tenant("acme").sweep_deleted().deleted_keys == tuple(left)
