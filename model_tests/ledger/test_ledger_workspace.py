"""The ledger's workspace checkpoints (issue 19; sessionstore
WorkspaceCheckpointBySeq, WorkspaceCheckpointByTurn, WorkspaceLiveRefs,
WorkspaceJournalScanError), on every backend.

Checkpoints are ledger records of kind ``workspace_checkpoint`` (restores:
``workspace_restore``), read back through the verified replay. Conformance
for WorkspaceJournalScanError: a flipped payload byte, an undecodable
checkpoint payload, a missing record and an unavailable blob each make all
three lookups raise it (with the session and sequence, the replay's error as
``__cause__``), never a shorter answer; a control shows a replay that stops
quietly at the damage would have given a shorter live set.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import forge, reseal, stored_ledger_payload

from turnkeeper import (
    BlobUnavailableError,
    CheckpointSummary,
    InvalidInputError,
    ReplayDecodeError,
    ReplayReadError,
    SessionNotFoundError,
    WorkspaceJournalScanError,
)

TTL = 30.0


def _open(ledger: Any, store: Any, sid: str = "s", owner: str = "w") -> Any:
    if store.sessions.get(sid) is None:
        store.sessions.create(sid)
    return ledger.open(sid, store.leases.acquire(f"session:{sid}", owner, TTL))


def _checkpoint(w: Any, ref: str, turn: str | None = None, **extra: Any) -> int:
    body: dict[str, Any] = {"ref": ref, "event_id": f"ev-{ref}", **extra}
    if turn is not None:
        body["turn_id"] = turn
    return int(w.append("workspace_checkpoint", json.dumps(body).encode(), f"cp-{ref}").seq)


def _restore(w: Any, ref: str) -> int:
    body = {"ref": ref, "event_id": f"ev-restore-{ref}"}
    return int(w.append("workspace_restore", json.dumps(body).encode(), f"rs-{ref}").seq)


def _session(store: Any, ledger: Any, sid: str = "s") -> tuple[Any, dict[str, int]]:
    """A ledger: fence 1, turn t1 (checkpoints a, b), turn t2 (checkpoint c),
    a restore to a, then turn t3 with no checkpoint."""
    w = _open(ledger, store, sid)
    seqs = {"t1": w.append("turn_started", b'{"turn_id": "t1"}', f"{sid}-t1").seq}
    seqs["a"] = _checkpoint(w, f"{sid}-a", "t1", consistency="crash_consistent")
    seqs["b"] = _checkpoint(w, f"{sid}-b", "t1")
    seqs["t2"] = w.append("turn_started", b'{"turn_id": "t2"}', f"{sid}-t2").seq
    seqs["c"] = _checkpoint(w, f"{sid}-c", "t2")
    seqs["restore"] = _restore(w, f"{sid}-a")
    seqs["t3"] = w.append("turn_started", b'{"turn_id": "t3"}', f"{sid}-t3").seq
    return w, seqs


def test_checkpoints_by_sequence_and_by_turn(store):
    ledger = store.ledger
    _, seqs = _session(store, ledger)
    assert seqs == {"t1": 2, "a": 3, "b": 4, "t2": 5, "c": 6, "restore": 7, "t3": 8}
    by_seq = ledger.workspace_checkpoint_by_seq
    assert by_seq("s", 1) is None and by_seq("s", 2) is None
    assert by_seq("s", 3) == CheckpointSummary("s-a", "ev-s-a", 3, "crash_consistent", "t1")
    assert by_seq("s", 5) == CheckpointSummary("s-b", "ev-s-b", 4, "", "t1")
    # the newest checkpoint, whatever restores followed; past the tip: up to the tip
    assert by_seq("s", 7).ref == by_seq("s", 8).ref == by_seq("s", 10**6).ref == "s-c"
    by_turn = ledger.workspace_checkpoint_by_turn
    assert by_turn("s", "t1") == CheckpointSummary("s-b", "ev-s-b", 4, "", "t1")
    assert by_turn("s", "t2").seq == 6
    assert by_turn("s", "t3") is None and by_turn("s", "nope") is None


def test_an_offloaded_checkpoint_is_found_as_the_record_it_stands_for(store):
    ledger = store.ledger.with_blobs(offload_threshold=16)
    w = _open(ledger, store)
    seq = _checkpoint(w, "r" * 200, "t1")
    assert store.query("SELECT kind FROM ledger_records WHERE seq = ?", [seq]).to_pylist() == [
        {"kind": "blobptr"}
    ]
    assert ledger.workspace_checkpoint_by_turn("s", "t1").ref == "r" * 200
    assert ledger.workspace_live_refs() == frozenset({"r" * 200})


def test_no_ledger_or_no_session(store):
    store.sessions.create("quiet")
    assert store.ledger.workspace_checkpoint_by_seq("quiet", 5) is None
    assert store.ledger.workspace_checkpoint_by_turn("quiet", "t") is None
    assert store.ledger.workspace_live_refs(["quiet", "never-was"]) == frozenset()
    with pytest.raises(SessionNotFoundError):
        store.ledger.workspace_checkpoint_by_seq("never-was", 1)
    with pytest.raises(SessionNotFoundError):
        store.ledger.workspace_checkpoint_by_turn("never-was", "t")
    with pytest.raises(InvalidInputError):
        store.ledger.workspace_checkpoint_by_seq("quiet", 0)
    with pytest.raises(InvalidInputError):
        store.ledger.workspace_live_refs("quiet")


def test_live_refs_across_the_retained_sessions_and_deleted_sessions_drop_out(store):
    ledger = store.ledger
    _session(store, ledger, "s1")
    w2, _ = _session(store, ledger, "s2")
    w3 = _open(ledger, store, "s3")
    _restore(w3, "s3-only-restored")
    every = {"s1-a", "s1-b", "s1-c", "s2-a", "s2-b", "s2-c", "s3-only-restored"}
    assert ledger.workspace_live_refs() == frozenset(every)
    assert ledger.workspace_live_refs(["s1"]) == frozenset({"s1-a", "s1-b", "s1-c"})
    assert ledger.workspace_live_refs([]) == frozenset()
    store.sessions.delete("s2", lease=w2.lease)
    remaining = every - {"s2-a", "s2-b", "s2-c"}
    assert ledger.workspace_live_refs() == frozenset(remaining)
    assert ledger.workspace_live_refs(["s1", "s2", "s3"]) == frozenset(remaining)


def test_tenants_see_only_their_own_checkpoints(store):
    acme = store.ledger.with_tenant("acme")
    _session(store, acme, "s")
    assert acme.workspace_live_refs() == frozenset({"s-a", "s-b", "s-c"})
    assert acme.workspace_checkpoint_by_turn("s", "t2").ref == "s-c"
    other = store.ledger.with_tenant("other")
    assert other.workspace_live_refs() == frozenset()
    assert other.workspace_live_refs(["s"]) == frozenset()
    assert other.workspace_checkpoint_by_seq("s", 10) is None
    assert store.ledger.workspace_checkpoint_by_turn("s", "t2") is None


def _all_three(ledger: Any, sid: str = "s") -> list[WorkspaceJournalScanError]:
    found = []
    for call in (
        lambda: ledger.workspace_checkpoint_by_seq(sid, 100),
        lambda: ledger.workspace_checkpoint_by_turn(sid, "t2"),
        lambda: ledger.workspace_live_refs(),
    ):
        with pytest.raises(WorkspaceJournalScanError) as err:
            call()
        found.append(err.value)
    return found


def _flip(store: Any, seq: int) -> None:
    forge(
        store,
        "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = ?",
        [
            stored_ledger_payload(
                store, "s", seq, b'{"ref": "s-z", "event_id": "ev-s-b", "turn_id": "t1"}'
            ),
            seq,
        ],
        rows=1,
    )


def test_a_damaged_record_fails_each_lookup_closed(store):
    ledger = store.ledger
    _, seqs = _session(store, ledger)
    _flip(store, seqs["b"])
    for err in _all_three(ledger):
        assert (err.session_id, err.seq) == ("s", seqs["b"])
        assert isinstance(err.__cause__, ReplayDecodeError)
    # a lookup that ends before the damage reads none of it
    assert ledger.workspace_checkpoint_by_seq("s", seqs["a"]).ref == "s-a"


def test_an_undecodable_checkpoint_payload_fails_each_lookup_closed(store):
    ledger = store.ledger
    w, _ = _session(store, ledger)
    bad = [
        b"not json",
        b'{"event_id": "e"}',
        b'{"ref": "", "event_id": "e"}',
        b'{"ref": "x", "event_id": "e", "turn_id": 7}',
        b'{"ref": "x", "ref": "y", "event_id": "e"}',
        b'["ref"]',
    ]
    for n, payload in enumerate(bad):
        sid = f"bad{n}"
        wb = _open(ledger, store, sid)
        with pytest.raises(InvalidInputError):  # refused at the append since the catalog folds it
            wb.append("workspace_checkpoint", payload, "bad")
        good = b'{"ref": "r", "event_id": "e"}'
        seq = wb.append("workspace_checkpoint", good, "bad").seq
        reseal(store, seq, payload, sid)  # written before the append checked it
        with pytest.raises(WorkspaceJournalScanError) as err:
            ledger.workspace_checkpoint_by_seq(sid, seq)
        assert (err.value.session_id, err.value.seq) == (sid, seq)
        assert isinstance(err.value.__cause__, ReplayDecodeError), payload
        with pytest.raises(WorkspaceJournalScanError):
            ledger.workspace_live_refs([sid])
    with pytest.raises(WorkspaceJournalScanError) as err:
        ledger.workspace_live_refs()
    assert err.value.session_id == "bad0"  # the first session that fails, in id order
    assert w.append("turn_done", b'{"turn_id": "t"}', "after").seq == 9


def test_a_missing_record_fails_each_lookup_closed(store):
    ledger = store.ledger
    _session(store, ledger)
    forge(store, "DELETE FROM ledger_records WHERE session_id = 's' AND seq = 5", [], rows=1)
    for err in _all_three(ledger):
        assert (err.session_id, err.seq) == ("s", 5)
        assert isinstance(err.__cause__, ReplayReadError)


def test_an_unavailable_checkpoint_blob_fails_each_lookup_closed(store):
    ledger = store.ledger.with_blobs(offload_threshold=100)
    w = _open(ledger, store)
    seq = _checkpoint(w, "big" * 50, "t2")
    forge(store, "DELETE FROM ledger_blobs", [], rows=1)
    for err in _all_three(ledger):
        assert (err.session_id, err.seq) == ("s", seq)
        assert isinstance(err.__cause__, BlobUnavailableError)


def test_control_a_scan_that_stops_quietly_at_damage_gives_a_shorter_live_set(store, monkeypatch):
    """What failing closed prevents: a replay that ends at the first error
    (what a lenient scan does) drops the refs after the damage silently."""
    ledger = store.ledger
    _, seqs = _session(store, ledger)
    _flip(store, seqs["b"])
    real = type(ledger).replay

    def lenient(self: Any, session_id: str, *a: Any, **k: Any) -> Iterator[Any]:
        try:
            yield from real(self, session_id, *a, **k)
        except ReplayDecodeError:
            return

    monkeypatch.setattr(type(ledger), "replay", lenient)
    assert ledger.workspace_live_refs() == frozenset({"s-a"})  # s-b, s-c lost
