"""Ledger blob GC against a writer of a newer epoch (issue 19, attack finding F6):
GC's lease lapses while it deletes, a new writer redelivers the entry whose
blob GC is deleting, and the acknowledged record must stay readable.

The interleavings are fixed: a blob store whose ``delete`` (or ``list``)
blocks on an Event while the main thread lets GC's lease lapse (an injected
clock), opens the ledger under a newer epoch and redelivers. No sleeps. On
both backends, with the blobs in the database's table and in a directory
(``FsspecBlobs``). Each guard of the condemn protocol
(``storage/ops/ledger/condemn.py``) is patched out in a control and the
acknowledged blob is then lost.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import ledger_payload

from turnkeeper import (
    BlobUnavailableError,
    FsspecBlobs,
    GCDeleteError,
    GCLeaseNotHeldError,
    LeaseLostError,
    LedgerIdempotencyConflictError,
)
from turnkeeper.storage.ops.ledger import blobs as blob_ops

TTL = 30.0
THRESHOLD = 64
BIG = bytes(range(256)) * 2  # 512 bytes: offloaded
PREFIX = blob_ops.blob_prefix("", "s")
HANG = 60.0  # seconds: a guard against a hang, never a timing assert


@pytest.fixture(params=["database", "directory"])
def ledger(request: pytest.FixtureRequest, store: Any, tmp_path: Path) -> Any:
    """The store's ledger with offload, the blobs in the database or a directory."""
    blobs = FsspecBlobs(str(tmp_path / "blobs")) if request.param == "directory" else None
    return store.ledger.with_blobs(blobs, offload_threshold=THRESHOLD)


def _open(store: Any, ledger: Any, owner: str) -> Any:
    if store.sessions.get("s") is None:
        store.sessions.create("s")
    return ledger.open("s", store.leases.acquire("session:s", owner, TTL))


class _Gate:
    """A blob store whose first ``delete`` (or ``list``, or ``put`` once its
    body is stored, with ``on=``) announces itself on ``entered`` and blocks
    until ``release`` is set."""

    def __init__(self, inner: Any, on: str = "delete") -> None:
        self.inner, self.on = inner, on
        self.entered, self.release = threading.Event(), threading.Event()
        self.deleted: list[str] = []

    def _gate(self, method: str) -> None:
        if self.on == method and not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(HANG), "the test never released the blob store"

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)
        self._gate("put")

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        return bytes(self.inner.get(key, max_bytes))

    def delete(self, key: str) -> None:
        self._gate("delete")
        self.inner.delete(key)
        self.deleted.append(key)

    def list(self, prefix: str) -> list[str]:
        keys = list(self.inner.list(prefix))
        self._gate("list")
        return keys


def _orphan(store: Any, clock: Any, ledger: Any) -> str:
    """Writer 1 offloads entry ``x`` but its lease lapsed: the pointer append is
    refused, its blob an orphan (the report's step 1). Returns the orphan's key."""
    w1 = _open(store, ledger, "w1")
    clock.advance(TTL + 1)
    with pytest.raises(LeaseLostError):
        w1.append("turn", BIG, "x")
    (orphan,) = ledger.blobs.list(PREFIX)
    return orphan


def _gc_in_thread(ledger: Any, gate: _Gate, lease: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = ledger.with_blobs(gate, offload_threshold=THRESHOLD).gc("s", lease)
        except BaseException as failure:  # handed to the test thread
            outcome["error"] = failure
        finally:
            gate.entered.set()  # a GC that never reached the gate does not hang the test

    thread = threading.Thread(target=run, name="gc")
    thread.start()
    return thread, outcome


def _lapse_mid_delete(store: Any, clock: Any, ledger: Any) -> tuple[str, Any, dict[str, Any], Any]:
    """The report's interleaving: GC under lease 2 blocks in its first delete
    (the orphan's); lease 2 lapses; writer 3 opens (epoch 3) and redelivers
    ``x``, acknowledged; then GC's delete goes on. Returns the orphan's key,
    writer 3's AppendResult, GC's outcome and writer 3."""
    orphan = _orphan(store, clock, ledger)
    w2 = _open(store, ledger, "w2")
    gate = _Gate(ledger.blobs)
    thread, outcome = _gc_in_thread(ledger, gate, w2.lease)
    try:
        assert gate.entered.wait(HANG)
        assert "error" not in outcome, outcome
        clock.advance(TTL + 1)  # lease 2 lapses while GC deletes
        w3 = _open(store, ledger, "w3")
        assert w3.epoch == 3
        ack = w3.append("turn", BIG, "x")  # the redelivery, acknowledged
    finally:
        gate.release.set()
        thread.join(HANG)
    assert not thread.is_alive()
    return orphan, ack, outcome, w3


def _replayed(ledger: Any) -> list[tuple[int, str, bytes]]:
    return [(r.seq, r.kind, r.payload) for r in ledger.replay("s")]


def test_gc_whose_lease_lapses_mid_delete_never_deletes_an_acknowledged_blob(store, clock, ledger):
    orphan, ack, outcome, w3 = _lapse_mid_delete(store, clock, ledger)
    assert (ack.seq, ack.duplicate) == (4, False)
    assert "error" not in outcome, outcome
    assert outcome["result"].deleted_keys == (orphan,)
    # the acknowledged record replays whole: its pointer names a blob GC never condemned
    assert _replayed(ledger)[-1] == (4, "turn", BIG)
    (live,) = ledger.blobs.list(PREFIX)
    assert live != orphan
    # a later GC under writer 3's lease keeps it
    assert ledger.gc("s", w3.lease).deleted_keys == ()
    assert _replayed(ledger)[-1] == (4, "turn", BIG)


@pytest.mark.parametrize("guard", ["refuse_condemned", "mark"])
def test_control_without_the_condemn_fence_the_acknowledged_blob_is_lost(
    store, clock, ledger, monkeypatch, guard
):
    """Control: the writer's check of the marks (``refuse_condemned``), or GC's
    marks themselves (``mark`` writing none), patched out: the report's fault."""
    from turnkeeper.storage.ops.ledger import condemn

    if guard == "refuse_condemned":
        monkeypatch.setattr(condemn, "refuse_condemned", lambda sid, new, marked: None)
    else:
        real = condemn.mark
        monkeypatch.setattr(
            condemn,
            "mark",
            lambda tx, t, sid, ep, gc_id, keys: real(tx, t, sid, ep, gc_id, []),
        )
    orphan, ack, outcome, _ = _lapse_mid_delete(store, clock, ledger)
    assert ack.seq == 4 and outcome["result"].deleted_keys == (orphan,)
    with pytest.raises(BlobUnavailableError) as lost:
        _replayed(ledger)
    assert (lost.value.seq, lost.value.key) == (4, orphan)


def _list_gated_gc(store: Any, ledger: Any, lease: Any, between: Any) -> dict[str, Any]:
    """GC under ``lease`` with ``between()`` run after its scan and listing,
    before its condemn transaction; returns its outcome."""
    gate = _Gate(ledger.blobs, on="list")
    thread, outcome = _gc_in_thread(ledger, gate, lease)
    try:
        assert gate.entered.wait(HANG)
        assert "error" not in outcome, outcome
        between()
    finally:
        gate.release.set()
        thread.join(HANG)
    assert not thread.is_alive()
    return outcome


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control"])
def test_gc_whose_lease_lapses_before_it_condemns_deletes_nothing_and_the_fence_can_fail(
    store, clock, ledger, monkeypatch, fenced
):
    """Writer 3 opens and redelivers between GC's listing and its condemn
    transaction: GC's fence there refuses the pass (epoch 3 fenced the ledger).
    Control: that fence patched out, the stale pass is not refused (the
    pointer appended since the scan still keeps the blob)."""
    from turnkeeper.storage.ops.ledger import gc as gc_ops

    if not fenced:
        real, calls = gc_ops.writer_fence, []

        def first_only(tx: Any, tenant: str, sid: str, lease: Any) -> Any:
            calls.append(lease.epoch)
            return real(tx, tenant, sid, lease) if len(calls) == 1 else None

        monkeypatch.setattr(gc_ops, "writer_fence", first_only)
    orphan = _orphan(store, clock, ledger)
    w2 = _open(store, ledger, "w2")
    acks: list[Any] = []

    def takeover() -> None:
        clock.advance(TTL + 1)
        acks.append(_open(store, ledger, "w3").append("turn", BIG, "x"))

    outcome = _list_gated_gc(store, ledger, w2.lease, takeover)
    if fenced:
        assert isinstance(outcome.get("error"), GCLeaseNotHeldError), outcome
        assert outcome["error"].epoch == 2
    else:
        assert "error" not in outcome, outcome
        assert outcome["result"].deleted == 0 and outcome["result"].referenced == 1
    assert ledger.blobs.list(PREFIX) == [orphan]  # the redelivery's pointer names it
    assert acks[0].seq == 4 and _replayed(ledger)[-1] == (4, "turn", BIG)


@pytest.mark.parametrize("recheck", [True, False], ids=["recheck", "control"])
def test_an_append_beside_gc_keeps_its_blob_and_the_recheck_can_fail(
    store, ledger, monkeypatch, recheck
):
    """GC beside an append of its own epoch: the orphan is listed, then the
    writer's redelivery appends its pointer, then GC condemns. The pointers
    appended since the scan are read in the condemn transaction: the blob is
    kept. Control: that re-check patched out, the acknowledged blob is lost."""
    from turnkeeper.storage.ops.ledger import gc as gc_ops
    from turnkeeper.storage.ops.ledger import journal

    w = _open(store, ledger, "w")
    with monkeypatch.context() as m:
        m.setattr(journal, "append", _crash)
        with pytest.raises(RuntimeError):
            w.append("turn", BIG, "x")
    (orphan,) = ledger.blobs.list(PREFIX)
    if not recheck:
        monkeypatch.setattr(gc_ops, "referenced_since", lambda tx, t, sid, after: set())
    acks: list[Any] = []
    outcome = _list_gated_gc(
        store, ledger, w.lease, lambda: acks.append(w.append("turn", BIG, "x"))
    )
    assert "error" not in outcome, outcome
    assert acks[0].seq == 2
    if recheck:
        assert outcome["result"].deleted == 0
        assert _replayed(ledger)[-1] == (2, "turn", BIG)
    else:
        assert outcome["result"].deleted_keys == (orphan,)
        with pytest.raises(BlobUnavailableError) as lost:
            _replayed(ledger)
        assert (lost.value.seq, lost.value.key) == (2, orphan)


def _crash(*a: Any, **k: Any) -> Any:
    raise RuntimeError("killed between the blob and its pointer")


def _marks(store: Any) -> list[tuple[str, int]]:
    rows = store.query(
        "SELECT key, epoch FROM ledger_blob_condemned ORDER BY key, epoch"
    ).to_pylist()
    return [(r["key"], r["epoch"]) for r in rows]


@pytest.mark.parametrize("matched", [True, False], ids=["generations", "control"])
def test_a_redelivery_is_a_duplicate_whatever_generation_its_blob_took(
    store, clock, ledger, monkeypatch, matched
):
    """After the report's interleaving, ``x``'s pointer names its blob's second
    generation. A redelivery once the mark is gone makes the first
    generation's pointer again: it is recognised as the same record
    (``duplicate=True``, the original's sequence), while other content under
    the id is still a conflict. Control: the generation match patched out,
    the redelivery is refused as a conflict."""
    from turnkeeper.storage.ops.ledger import condemn

    orphan, ack, outcome, w3 = _lapse_mid_delete(store, clock, ledger)
    assert outcome["result"].deleted_keys == (orphan,) and _marks(store) == [(orphan, 2)]
    if not matched:
        monkeypatch.setattr(condemn, "generation_of", lambda entry, kind, payload: None)
        with pytest.raises(LedgerIdempotencyConflictError):
            w3.append("turn", BIG, "x")
        return
    again = w3.append("turn", BIG, "x")
    assert (again.seq, again.duplicate) == (ack.seq, True)
    with pytest.raises(LedgerIdempotencyConflictError) as conflict:
        w3.append("turn", BIG + b"other", "x")
    assert conflict.value.seq == ack.seq
    assert ledger.tip("s") == 4 and _replayed(ledger)[-1] == (4, "turn", BIG)


def test_a_failed_delete_leaves_its_blob_condemned_and_a_writer_avoids_it(store, clock, ledger):
    """GC's delete fails: its mark stays (the delete may yet land), so the
    writer's redelivery names another generation; a later pass reclaims the
    orphan. Nothing acknowledged is lost."""
    w = _open(store, ledger, "w")
    with pytest.MonkeyPatch.context() as m:
        from turnkeeper.storage.ops.ledger import journal

        m.setattr(journal, "append", _crash)
        with pytest.raises(RuntimeError):
            w.append("turn", BIG, "x")
    (orphan,) = ledger.blobs.list(PREFIX)

    class Refusing(_Gate):
        def delete(self, key: str) -> None:
            raise OSError("permission denied")

    with pytest.raises(GCDeleteError) as failed:
        ledger.with_blobs(Refusing(ledger.blobs), offload_threshold=THRESHOLD).gc("s", w.lease)
    assert failed.value.key == orphan
    assert _marks(store) == [(orphan, 1)]
    ack = w.append("turn", BIG, "x")
    assert ack.seq == 2
    (live,) = set(ledger.blobs.list(PREFIX)) - {orphan}
    assert _replayed(ledger)[-1] == (2, "turn", BIG)
    result = ledger.gc("s", w.lease)
    assert result.deleted_keys == (orphan,) and ledger.blobs.list(PREFIX) == [live]
    assert _marks(store) == [(orphan, 1)]  # a mark stays: the key is never pointed at
    assert _replayed(ledger)[-1] == (2, "turn", BIG)
    assert w.append("turn", BIG, "x").duplicate


def test_a_session_delete_removes_its_marks(store, ledger):
    w = _open(store, ledger, "w")
    with pytest.MonkeyPatch.context() as m:
        from turnkeeper.storage.ops.ledger import journal

        m.setattr(journal, "append", _crash)
        with pytest.raises(RuntimeError):
            w.append("turn", BIG, "x")

    class Refusing(_Gate):
        def delete(self, key: str) -> None:
            raise OSError("permission denied")

    with pytest.raises(GCDeleteError):
        ledger.with_blobs(Refusing(ledger.blobs), offload_threshold=THRESHOLD).gc("s", w.lease)
    assert len(_marks(store)) == 1
    store.sessions.delete("s", lease=w.lease)
    assert _marks(store) == []


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "control"])
def test_a_group_member_whose_blob_is_condemned_takes_the_next_generation(
    store, monkeypatch, tmp_path, checked
):
    """In one group commit (``group._round``): a member whose blob a dead GC
    pass condemned is refused alone, then lands under its blob's next
    generation; the other members are written at once. Control: the check
    patched out, its pointer names the condemned blob."""
    import hashlib

    from conftest import forge
    from test_ledger_group import Grouped

    from turnkeeper import LedgerEntry
    from turnkeeper.storage.ops.ledger import condemn

    if not checked:
        monkeypatch.setattr(condemn, "refuse_condemned", lambda sid, new, marked: None)
    # blobs in a directory: a put in the database's table would be a write
    # queued beside the appends, and the group would not be the four appends
    offloading = store.ledger.with_blobs(
        FsspecBlobs(str(tmp_path / "blobs")), offload_threshold=THRESHOLD
    )
    writers = []
    for i in range(4):
        store.sessions.create(f"s{i}")
        writers.append(offloading.open(f"s{i}", store.leases.acquire(f"session:s{i}", "w", TTL)))
    entry = LedgerEntry("turn", BIG, "x")
    first = hashlib.sha256(blob_ops.envelope(entry)).hexdigest()
    forge(
        store,
        "INSERT INTO ledger_blob_condemned VALUES (?, 'a-dead-pass', '', 's1', 1, now())",
        [blob_ops.blob_prefix("", "s1") + first],
        rows=1,
    )
    g = Grouped(store, monkeypatch)
    out = g.run([lambda w=w: w.append("turn", BIG, "x") for w in writers])
    assert g.sizes[0] == 4
    for i in range(4):
        assert (out[i].seq, out[i].duplicate) == (2, False), out[i]
        named = json.loads(ledger_payload(store, 2, f"s{i}"))["key"]
        gen = 1 if (i == 1 and checked) else 0
        want = hashlib.sha256(blob_ops.envelope(entry, gen)).hexdigest()
        assert named == blob_ops.blob_prefix("", f"s{i}") + want
        assert [r.payload for r in offloading.replay(f"s{i}")][-1] == BIG


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "control"])
def test_a_put_before_gc_deletes_and_an_append_after_it_ends_takes_the_next_generation(
    store, clock, ledger, monkeypatch, kept
):
    """The writer redelivers ``x``: its put finds the orphan's key there, then
    the writer stalls before its append. GC (same epoch) condemns and deletes
    that blob and ends. The append then sees the mark and writes the next
    generation. Control: the marks removed once GC ended (as a pass clearing
    its marks would), the append points at the deleted blob."""
    from conftest import forge

    from turnkeeper.storage.ops.ledger import journal

    w = _open(store, ledger, "w")
    with monkeypatch.context() as m:
        m.setattr(journal, "append", _crash)
        with pytest.raises(RuntimeError):
            w.append("turn", BIG, "x")
    (orphan,) = ledger.blobs.list(PREFIX)
    gate = _Gate(ledger.blobs, on="put")
    stalled = ledger.with_blobs(gate, offload_threshold=THRESHOLD)
    w.close()
    writer = stalled.open("s", w.lease)  # the same lease: GC's epoch
    outcome: dict[str, Any] = {}

    def redeliver() -> None:
        try:
            outcome["ack"] = writer.append("turn", BIG, "x")
        except BaseException as failure:
            outcome["error"] = failure
        finally:
            gate.entered.set()

    thread = threading.Thread(target=redeliver, name="writer")
    thread.start()
    try:
        assert gate.entered.wait(HANG)
        assert "error" not in outcome, outcome
        assert ledger.gc("s", w.lease).deleted_keys == (orphan,)
        if not kept:
            forge(store, "DELETE FROM ledger_blob_condemned", rows=1)
    finally:
        gate.release.set()
        thread.join(HANG)
    assert not thread.is_alive() and "error" not in outcome, outcome
    seq = outcome["ack"].seq
    if kept:
        assert _replayed(ledger)[-1] == (seq, "turn", BIG)
        assert orphan not in ledger.blobs.list(PREFIX)
    else:
        with pytest.raises(BlobUnavailableError) as lost:
            _replayed(ledger)
        assert (lost.value.seq, lost.value.key) == (seq, orphan)
