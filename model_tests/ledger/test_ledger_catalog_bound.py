"""The catalog entry's cost bound (issue 19, attack round 2 finding F4), on
every backend: an append of records the catalog does not fold moves only the
entry's cursor column (``catalog_group.move_cursors``), never decoding nor
re-encoding the entry, whose size grows with the session's loops and hustle
buckets; the cursor compare-and-set and the revision bump that keep the
online update's ordering semantics (controls patch each out and see the
failure they prevent); an entry stored before the cursor column existed.
The online entry stays what a repair rebuilds."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import forge

from turnkeeper import (
    CatalogHustleError,
    CatalogHustleMetaValidationError,
    CatalogReadError,
    LedgerEntry,
    OperationalError,
)
from turnkeeper.spec import catalog as c
from turnkeeper.storage.ops.ledger import catalog as catalog_mod
from turnkeeper.storage.ops.ledger import catalog_codec, catalog_group

TTL = 30.0
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _j(**body: Any) -> bytes:
    return json.dumps(body).encode()


def _writer(store: Any, sid: str = "s") -> Any:
    store.sessions.create(sid)
    return store.ledger.open(sid, store.leases.acquire(f"session:{sid}", "w", TTL))


def _row(store: Any, sid: str = "s") -> tuple[str, int, int]:
    """The stored ``(meta text, folded_seq, revision)``."""
    rows = store.query(
        "SELECT meta, folded_seq, revision FROM ledger_catalog "
        "WHERE tenant = '' AND session_id = ?",
        [sid],
    ).to_pylist()
    return rows[0]["meta"], rows[0]["folded_seq"], rows[0]["revision"]


def _loops(w: Any, n: int) -> None:
    w.append("session_started", _j(created_at=T0.isoformat()), "ss")
    w.append_many(
        [
            LedgerEntry(
                "step_done",
                _j(loop_id=f"loop-{i:03}", usage={"input_tokens": i, "output_tokens": 1}),
                f"l{i}",
            )
            for i in range(n)
        ]
    )


def _codec_calls(monkeypatch: Any) -> list[str]:
    """Every encode and decode of a catalog entry from now on."""
    calls: list[str] = []
    encode, decode = catalog_codec.encode, catalog_codec.decode

    def counted_encode(meta: Any) -> str:
        calls.append("encode")
        return encode(meta)

    def counted_decode(*args: Any) -> Any:
        calls.append("decode")
        return decode(*args)

    monkeypatch.setattr(catalog_codec, "encode", counted_encode)
    monkeypatch.setattr(catalog_codec, "decode", counted_decode)
    return calls


def _same_as_repair(store: Any, sid: str = "s") -> None:
    online = store.ledger.catalog.read_meta(sid)
    repaired = store.ledger.catalog.repair(sid)
    assert replace(online, last_active_at=None) == replace(repaired, last_active_at=None)


def test_an_append_of_kinds_not_folded_neither_decodes_nor_writes_the_entry(store, monkeypatch):
    """Failed before (attack round 2 on issue 19, F4): every append, even a
    note, decoded, folded and re-encoded the whole entry in its transaction
    (a note 7 ms -> 305 ms at 20,000 loops, a 4.3 MB entry). Now a note, a
    batch of notes and a writer's open (its fence) move the cursor column
    alone: no decode, no encode, the entry's text byte for byte as it was.
    Before, this printed ``['decode', 'encode']`` for the first note."""
    w = _writer(store)
    _loops(w, 40)
    text, folded, revision = _row(store)
    assert folded == store.ledger.tip("s") == 42
    calls = _codec_calls(monkeypatch)
    w.append("note", b"x", "n0")
    assert calls == []
    w.append_many([LedgerEntry("note", b"y", f"n{i}") for i in range(1, 4)])
    w.append_many([LedgerEntry(f"own_kind_{i}", b"z", f"o{i}") for i in range(3)])
    store.leases.release(w.lease)
    w = store.ledger.open("s", store.leases.acquire("session:s", "w2", TTL))  # its fence
    assert calls == []
    # the text untouched, the cursor moved
    assert _row(store) == (text, store.ledger.tip("s"), revision + 4)
    monkeypatch.undo()
    assert store.ledger.catalog.read_meta("s").last_journal_seq == store.ledger.tip("s") == 50
    _same_as_repair(store)
    # a catalog kind after them folds onto the moved cursor, in the same commit
    w.append("turn_started", _j(turn_id="t", user_text="after the notes"), "t")
    meta = store.ledger.catalog.read_meta("s")
    assert (meta.title, meta.last_journal_seq, len(meta.loops)) == ("after the notes", 51, 40)
    assert _row(store)[1] == 51
    _same_as_repair(store)


def test_an_append_mixing_a_folded_kind_writes_the_whole_entry(store, monkeypatch):
    w = _writer(store)
    _loops(w, 3)
    calls = _codec_calls(monkeypatch)
    w.append_many(
        [LedgerEntry("note", b"x", "n"), LedgerEntry("turn_started", _j(turn_id="t"), "t")]
    )
    assert calls == ["decode", "encode"]
    monkeypatch.undo()
    assert store.ledger.catalog.read_meta("s").last_journal_seq == _row(store)[1] == 7
    _same_as_repair(store)


def _lose_a_turn(store: Any, monkeypatch: Any, w: Any) -> None:
    """Append a ``turn_started`` whose catalog update fails (as a crash
    between the append's commit and its update would): the entry misses it."""

    def broken(*args: Any) -> bool:
        raise OperationalError(detail="disk gone")

    seen: list[Exception] = []
    store.ledger.catalog.configure(on_update_failed=seen.append)
    with monkeypatch.context() as m:
        m.setattr(catalog_group, "fold_in", lambda tx, updates: [False] * len(updates))
        m.setattr(catalog_mod, "store_meta", broken)
        w.append("turn_started", _j(turn_id="t", user_text="missed"), "t")
    assert len(seen) == 1
    assert store.ledger.catalog.read_meta("s").last_journal_seq == store.ledger.tip("s") - 1


def test_a_note_after_a_missed_record_catches_it_up(store, monkeypatch):
    """The cursor compare-and-set: a note whose first record is not right
    after the cursor does not move it past a record the entry missed; the
    update after the COMMIT catches the entry up from its cursor."""
    w = _writer(store)
    _loops(w, 2)
    _lose_a_turn(store, monkeypatch, w)
    w.append("note", b"x", "n")
    meta = store.ledger.catalog.read_meta("s")
    assert (meta.title, meta.last_journal_seq) == ("missed", store.ledger.tip("s"))
    _same_as_repair(store)


def test_control_without_the_cursor_compare_and_set_a_missed_record_is_skipped(store, monkeypatch):
    def unconditional(tx: Any, moves: list[Any]) -> set[tuple[str, str]]:
        for u in moves:
            tx.exec(
                "UPDATE ledger_catalog SET folded_seq = ?, revision = revision + 1 "
                "WHERE tenant = ? AND session_id = ?",
                [u.records[-1][0], u.catalog.tenant, u.session_id],
            )
        return {(u.catalog.tenant, u.session_id) for u in moves}

    w = _writer(store)
    _loops(w, 2)
    _lose_a_turn(store, monkeypatch, w)
    monkeypatch.setattr(catalog_group, "move_cursors", unconditional)
    w.append("note", b"x", "n")
    meta = store.ledger.catalog.read_meta("s")
    # "missed" is lost for good
    assert (meta.title, meta.last_journal_seq) == ("", store.ledger.tip("s"))


def _race_repair_with_a_note(store: Any, monkeypatch: Any) -> Any:
    """A repair that replayed through seq 3, while a note (seq 4) moves the
    cursor before the repair writes."""
    w = _writer(store)
    _loops(w, 1)
    real = catalog_mod.catalog_codec.encode
    state = {"raced": False, "repairing": True}

    def encode(meta: Any) -> str:
        if state["repairing"] and not state["raced"]:
            state["raced"] = True
            w.append("note", b"raced in", "n")
        return real(meta)

    monkeypatch.setattr(catalog_mod.catalog_codec, "encode", encode)
    store.ledger.catalog.repair("s")
    assert state["raced"]
    return store.ledger.catalog.read_meta("s")


def test_a_cursor_move_makes_a_racing_repair_replay_again(store, monkeypatch):
    """The cursor move bumps the revision: a whole-entry writer that read
    before it loses its compare-and-set and does not set the cursor back."""
    assert _race_repair_with_a_note(store, monkeypatch).last_journal_seq == 4


def test_control_without_the_revision_bump_a_repair_sets_the_cursor_back(store, monkeypatch):
    def no_bump(tx: Any, moves: list[Any]) -> set[tuple[str, str]]:
        won = set()
        for u in moves:
            if tx.count(
                "UPDATE ledger_catalog SET folded_seq = ? "
                "WHERE tenant = ? AND session_id = ? AND folded_seq = ?",
                [u.records[-1][0], u.catalog.tenant, u.session_id, u.records[0][0] - 1],
            ):
                won.add((u.catalog.tenant, u.session_id))
        return won

    monkeypatch.setattr(catalog_group, "move_cursors", no_bump)
    assert _race_repair_with_a_note(store, monkeypatch).last_journal_seq == 3


def test_an_entry_stored_before_the_cursor_column_reads_its_cursor_from_its_json(store):
    """Schema 27 adds ``folded_seq`` with 0 for the entries already stored:
    their cursor is the JSON's; the first note finds the column behind and
    writes the whole entry, which sets the column; notes after it move the
    column alone."""
    w = _writer(store)
    _loops(w, 2)
    forge(store, "UPDATE ledger_catalog SET folded_seq = 0 WHERE session_id = 's'", rows=1)
    assert store.ledger.catalog.read_meta("s").last_journal_seq == 4
    assert [m.last_journal_seq for m in store.ledger.catalog.list_sessions()] == [4]
    w.append("note", b"x", "n")
    assert _row(store)[1] == 5 == store.ledger.catalog.read_meta("s").last_journal_seq
    text = _row(store)[0]
    w.append("note", b"x", "m")
    assert _row(store)[:2] == (text, 6)
    _same_as_repair(store)


def _run(w: Any, run_id: str, status: str = "succeeded", **kw: Any) -> None:
    body = {"run_id": run_id, "name": "lint", "model_source": "current_loop", **kw}
    w.append("hustle_started", _j(**body), f"{run_id}-start")
    w.append("hustle_done", _j(status=status, **body), f"{run_id}-done")


def test_current_loop_hustles_with_many_runtimes_fold_into_one_bucket(store):
    """Failed before (attack round 2 on issue 19, F4): the hustle bucket was
    keyed by its runtime too, so current-loop work that resolved a new
    runtime per run added a bucket per run (20,000 runs: 20,000 buckets).
    The seed's bucket is (name, model source, named model key, status) and
    current-loop work records no runtime. Before, this printed 30 buckets."""
    w = _writer(store)
    w.append("session_started", _j(created_at=T0.isoformat()), "ss")
    for i in range(30):
        _run(w, f"r{i}", runtime=f"model-{i}", usage={"input_tokens": 1, "output_tokens": 2})
    _run(w, "f", status="failed", runtime="model-x")
    meta = store.ledger.catalog.read_meta("s")
    assert [(h.name, h.status, h.runs, h.runtime, h.cumulative_usage) for h in meta.hustles] == [
        ("lint", "failed", 1, "", c.Usage()),
        ("lint", "succeeded", 30, "", c.Usage(30, 60)),
    ]
    _same_as_repair(store)


def test_named_hustles_keep_the_one_runtime_their_key_resolved_to(store):
    """Named work keeps its resolved runtime on each of its buckets (a run
    that failed before resolving one takes it too); a terminal naming another
    runtime for the same named model key is a runtime_mismatch, online (the
    update is reported, the append stands) and in repair."""
    seen: list[Exception] = []
    store.ledger.catalog.configure(on_update_failed=seen.append)
    w = _writer(store)
    w.append("session_started", _j(created_at=T0.isoformat()), "ss")
    named = {"model_source": "named", "named_model_key": "k"}
    _run(w, "a", status="cancelled", **named)  # no runtime resolved
    _run(w, "b", runtime="m1", **named)
    _run(w, "c", runtime="m1", **named)
    meta = store.ledger.catalog.read_meta("s")
    assert [(h.status, h.runs, h.runtime) for h in meta.hustles] == [
        ("cancelled", 1, "m1"),
        ("succeeded", 2, "m1"),
    ]
    _same_as_repair(store)
    assert seen == []
    _run(w, "d", status="failed", runtime="m2", **named)
    assert [type(e) for e in seen] == [CatalogHustleError]
    assert (seen[0].kind, seen[0].run_id) == (c.HUSTLE_RUNTIME_MISMATCH, "d")
    with pytest.raises(CatalogHustleError) as caught:
        store.ledger.catalog.repair("s")
    assert caught.value.kind == c.HUSTLE_RUNTIME_MISMATCH


@pytest.mark.parametrize(
    "hustles",
    [
        [{"model_source": "current_loop", "runtime": "m"}],
        [
            {"named_model_key": "k", "status": "failed", "runtime": "m1"},
            {"named_model_key": "k", "status": "succeeded", "runtime": "m2"},
        ],
        [
            {"named_model_key": "k", "status": "failed", "runtime": ""},
            {"named_model_key": "k", "status": "succeeded", "runtime": "m2"},
        ],
    ],
)
def test_a_stored_bucket_breaking_the_runtime_rules_is_a_validation_error(store, hustles):
    w = _writer(store)
    w.append("session_started", _j(created_at=T0.isoformat()), "ss")
    body = json.loads(_row(store)[0])
    body["hustles"] = [{"name": "n", "model_source": "named", "runs": 1, **h} for h in hustles]
    body["hustles"] = [{"status": "failed", **h} for h in body["hustles"]]
    forge(
        store,
        "UPDATE ledger_catalog SET meta = ? WHERE session_id = 's'",
        [json.dumps(body)],
        rows=1,
    )
    with pytest.raises(CatalogReadError) as caught:
        store.ledger.catalog.read_meta("s")
    bad = caught.value.__cause__.__cause__
    assert isinstance(bad, CatalogHustleMetaValidationError)
    assert (bad.index, bad.rule) == (len(hustles) - 1, c.RULE_INVALID)


def test_one_round_moves_the_cursors_of_several_sessions_each_by_its_own_check(store, monkeypatch):
    """A group commit's round folds several sessions' updates in one call
    (``fold_in``): the cursor-only ones move in one statement, each under its
    own compare-and-set; one whose cursor is elsewhere is left to the update
    after the COMMIT (``False``), the others are done."""
    writers = {sid: _writer(store, sid) for sid in ("s", "t", "u")}
    for w in writers.values():
        w.append("session_started", _j(created_at=T0.isoformat()), "ss")
    with monkeypatch.context() as m:  # the records land, their catalog updates not yet
        m.setattr(catalog_group, "fold_in", lambda tx, updates: [True] * len(updates))
        for sid, w in writers.items():
            w.append_many([LedgerEntry("note", b"x", f"{sid}{i}") for i in range(2)])
    updates = [
        catalog_group.CatalogUpdate(
            store.ledger.catalog, "s", [(3, "note", b"x"), (4, "note", b"x")]
        ),
        catalog_group.CatalogUpdate(
            store.ledger.catalog, "t", [(3, "note", b"x"), (4, "note", b"x")]
        ),
        catalog_group.CatalogUpdate(store.ledger.catalog, "u", [(4, "note", b"x")]),  # 3 missed
    ]
    calls = _codec_calls(monkeypatch)
    done = store.ledger.db.write("t", lambda tx: catalog_group.fold_in(tx, updates))
    assert done == [True, True, False]
    assert calls == ["decode"]  # u's whole-entry attempt, which finds the gap
    monkeypatch.undo()
    assert [_row(store, sid)[1] for sid in ("s", "t", "u")] == [4, 4, 2]
    for sid in ("s", "t"):
        _same_as_repair(store, sid)


def test_an_entry_stored_before_schema_27_upgrades_its_runtime_keyed_buckets(store, monkeypatch):
    """An entry written before schema 27 keyed hustle buckets by runtime too
    (one current-loop bucket per resolved runtime; a named key's failed run
    without a runtime beside its succeeded run's): read as the seed's buckets
    (``catalog_codec.upgraded_hustles``), not refused, and the next append
    stores them so. A named key that resolved to two runtimes stays refused.
    The control reads without the upgrade: the entry is unreadable."""
    w = _writer(store)
    w.append("session_started", _j(created_at=T0.isoformat()), "ss")
    body = json.loads(_row(store)[0])

    def bucket(source: str, status: str, runtime: str, runs: int, key: str = "") -> Any:
        usage = {"input_tokens": runs, "output_tokens": 2 * runs}
        return {
            "name": "lint",
            "model_source": source,
            "named_model_key": key,
            "runtime": runtime,
        } | {"status": status, "runs": runs, "cumulative_usage": usage}

    body["hustles"] = [
        bucket("current_loop", "succeeded", "m1", 2),
        bucket("current_loop", "succeeded", "m2", 3),
        bucket("named", "failed", "", 1, "k"),
        bucket("named", "succeeded", "m9", 4, "k"),
    ]
    old = json.dumps(body)
    forge(
        store,
        "UPDATE ledger_catalog SET meta = ?, folded_seq = 0 WHERE session_id = 's'",
        [old],
        rows=1,
    )
    want = [
        ("current_loop", "succeeded", "", 5, c.Usage(5, 10)),
        ("named", "failed", "m9", 1, c.Usage(1, 2)),
        ("named", "succeeded", "m9", 4, c.Usage(4, 8)),
    ]

    def seen(meta: Any) -> list[Any]:
        return [
            (h.model_source, h.status, h.runtime, h.runs, h.cumulative_usage) for h in meta.hustles
        ]

    assert seen(store.ledger.catalog.read_meta("s")) == want
    assert [seen(m) for m in store.ledger.catalog.list_sessions()] == [want]
    w.append("note", b"x", "n")
    assert _row(store)[1] == 3
    assert seen(store.ledger.catalog.read_meta("s")) == want
    with monkeypatch.context() as m:  # the control: without the upgrade
        m.setattr(catalog_codec, "upgraded_hustles", lambda hustles: hustles)
        forge(
            store,
            "UPDATE ledger_catalog SET meta = ?, folded_seq = 0 WHERE session_id = 's'",
            [old],
            rows=1,
        )
        with pytest.raises(CatalogReadError):
            store.ledger.catalog.read_meta("s")
    body["hustles"][2]["runtime"] = "m8"  # one named key, two runtimes: refused
    forge(
        store,
        "UPDATE ledger_catalog SET meta = ?, folded_seq = 0 WHERE session_id = 's'",
        [json.dumps(body)],
        rows=1,
    )
    with pytest.raises(CatalogReadError) as caught:
        store.ledger.catalog.read_meta("s")
    assert isinstance(caught.value.__cause__.__cause__, CatalogHustleMetaValidationError)
