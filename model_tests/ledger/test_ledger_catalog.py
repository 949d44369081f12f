"""``store.ledger.catalog`` (issue 19; sessionstore Catalog, SessionMeta), on
every backend: the fold of each record kind, the best-effort update after an
append (a failure logged, never failing the append), the listing that reads
no ledger, repair, a malformed value as a typed read error, a corrupt ledger
not breaking the listing of the others, the revision compare-and-set (a
control patches it out and sees a lost update), and each seed catalog error:
CatalogConflictError, CatalogDecodeError, CatalogDuplicateFieldError,
CatalogEncodeError, CatalogMetaValidationError, CatalogHustleMetaValidationError,
CatalogOrderingError, CatalogReadError, CatalogWriteError, CatalogUsageError,
CatalogCompactionError, CatalogHustleError (every kind), EmptySessionError.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import forge, stored_ledger_payload

from turnkeeper import (
    CatalogCompactionError,
    CatalogConflictError,
    CatalogDecodeError,
    CatalogDuplicateFieldError,
    CatalogEncodeError,
    CatalogHustleError,
    CatalogHustleMetaValidationError,
    CatalogMetaValidationError,
    CatalogOrderingError,
    CatalogReadError,
    CatalogUsageError,
    CatalogWriteError,
    EmptySessionError,
    InvalidInputError,
    LedgerEntry,
    OperationalError,
    ReplayDecodeError,
)
from turnkeeper.spec import catalog as c
from turnkeeper.spec.ledger import CheckpointSummary
from turnkeeper.storage.ops.ledger import catalog as catalog_mod
from turnkeeper.storage.ops.ledger import catalog_group
from turnkeeper.storage.ops.ledger import writer as writer_mod

TTL = 30.0
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _j(**body: Any) -> bytes:
    return json.dumps(body).encode()


def _writer(store: Any, sid: str = "s") -> Any:
    store.sessions.create(sid)
    return store.ledger.open(sid, store.leases.acquire(f"session:{sid}", "w", TTL))


def _start(w: Any, n: int = 0) -> None:
    w.append("session_started", _j(created_at=T0.isoformat(), agent_kind="coder"), f"ss{n}")


def _unchecked(monkeypatch: Any) -> None:
    """Appends of catalog kinds as before appends checked their usage (a
    ledger written by an older version): the catalog's own errors for such a
    record are what these tests see; ``check_catalog_payload`` is patched out."""
    monkeypatch.setattr(writer_mod, "check_catalog_payload", lambda kind, payload, field: None)


def _failures(store: Any) -> list[Exception]:
    seen: list[Exception] = []
    store.ledger.catalog.configure(on_update_failed=seen.append)
    return seen


def _stored(store: Any, sid: str = "s") -> dict[str, Any]:
    rows = store.query(
        "SELECT meta FROM ledger_catalog WHERE tenant = '' AND session_id = ?", [sid]
    ).to_pylist()
    return dict(json.loads(rows[0]["meta"]))


def _put(store: Any, body: object, sid: str = "s") -> None:
    text = body if isinstance(body, str) else json.dumps(body)
    forge(
        store,
        "UPDATE ledger_catalog SET meta = ? WHERE tenant = '' AND session_id = ?",
        [text, sid],
        rows=1,
    )


def _comparable(meta: Any) -> Any:
    from dataclasses import replace

    return replace(meta, last_active_at=None)


# -- the fold -----------------------------------------------------------------------


def test_the_summary_folds_each_record_kind_and_repair_rebuilds_the_same(store):
    seen = _failures(store)
    ticks = iter(datetime(2026, 2, 1, 0, 0, i, tzinfo=UTC) for i in range(60))
    store.ledger.catalog.configure(clock=lambda: next(ticks))
    w = _writer(store)
    _start(w)
    meta = store.ledger.catalog.read_meta("s")
    assert (meta.status, meta.state, meta.residency, meta.loop_count) == (
        "active",
        "idle",
        "resident",
        1,
    )
    assert meta.created_at == T0 and meta.agent_kind == "coder" and meta.title == ""
    w.append("turn_started", _j(turn_id="t1", user_text="\n  Fix the parser\nmore"), "a1")
    w.append("loop_started", _j(loop_id="L2", runtime="gpt-x"), "a2")
    w.append(
        "step_done",
        _j(
            loop_id="L1",
            turn_id="t1",
            summary="read files",
            usage={"input_tokens": 10, "output_tokens": 3},
            runtime="claude",
            context={"tokens": 50, "window": 100},
        ),
        "a3",
    )
    w.append("step_done", _j(loop_id="L1", usage={"input_tokens": 5}, context=None), "a4")
    w.append("gate_opened", _j(gate_id="g1"), "a5")
    meta = store.ledger.catalog.read_meta("s")
    assert (meta.state, meta.waiting_gate_id, meta.active_turn_id) == (
        "waiting_on_gate",
        "g1",
        "t1",
    )
    w.append("gate_resolved", _j(gate_id="g1"), "a6")
    assert store.ledger.catalog.read_meta("s").state == "running"
    w.append("turn_started", _j(turn_id="t2", user_text="   "), "a7")  # no text: title kept
    w.append("turn_done", _j(turn_id="t2", summary="done"), "a8")
    w.append("hustle_started", _j(run_id="r1", name="lint", model_source="current_loop"), "a9")
    w.append(
        "hustle_done",
        _j(
            run_id="r1",
            name="lint",
            model_source="current_loop",
            status="succeeded",
            usage={"input_tokens": 2, "output_tokens": 1},
        ),
        "a10",
    )
    w.append("residency_released", _j(), "a11")
    meta = store.ledger.catalog.read_meta("s")
    assert meta.title == "Fix the parser" and meta.active_turn_id == ""
    assert meta.state == "idle" and meta.residency == "cold" and meta.loop_count == 2
    assert meta.last_turn == c.EventSummary("turn_done", 10, "t2", "done")
    assert meta.last_step == c.EventSummary("step_done", 6, "", "")
    assert meta.last_journal_seq == 13
    assert meta.loops == (
        c.LoopUsageMeta(
            "L1",
            runtime="claude",
            runtime_seq=6,
            runtime_value_seq=5,
            cumulative_usage=c.Usage(15, 3),
            context_seq=6,
            context_value_seq=0,
            current_context=None,
        ),
        c.LoopUsageMeta("L2", runtime="gpt-x", runtime_seq=4, runtime_value_seq=4),
    )
    assert meta.hustles == (
        c.HustleUsageAggregate("lint", "current_loop", "succeeded", 1, "", "", c.Usage(2, 1)),
    )
    # last active: the injected clock at the last activity-marking update (the
    # turn_started at seq 9: one tick per update, the open's being the first)
    assert meta.last_active_at == datetime(2026, 2, 1, 0, 0, 8, tzinfo=UTC)
    w.append("session_stopped", _j(), "a12")
    w.append("turn_started", _j(turn_id="t3", user_text="after stop"), "a13")
    meta = store.ledger.catalog.read_meta("s")
    assert (meta.status, meta.state, meta.residency) == ("stopped", "stopped", "cold")
    repaired = store.ledger.catalog.repair("s")
    assert _comparable(repaired) == _comparable(meta)
    assert store.ledger.catalog.read_meta("s") == repaired
    assert seen == []


def test_the_listing_reads_the_catalog_alone_and_each_tenant_sees_its_own(store, monkeypatch):
    for sid in ("b", "a"):
        w = _writer(store, sid)
        _start(w)
        w.append("turn_started", _j(turn_id="t", user_text=f"title {sid}"), "t")
    reads: list[str] = []
    real = store.ledger.catalog.db.read

    def spy(operation: str, body: Any, **kw: Any) -> Any:
        reads.append(operation)
        return real(operation, body, **kw)

    monkeypatch.setattr(store.ledger.catalog.db, "read", spy)
    listed = store.ledger.catalog.list_sessions()
    assert [(m.session_id, m.title) for m in listed] == [("a", "title a"), ("b", "title b")]
    assert reads == ["ledger_catalog_list"]
    assert store.ledger.with_tenant("other").catalog.list_sessions() == []


def test_an_offloaded_record_is_folded_as_the_record_it_stands_for(store):
    """The catalog folds the logical record of an offloaded append, not its
    ``blobptr`` pointer: online, and again by ``repair`` through the replay."""
    ledger = store.ledger.with_blobs(offload_threshold=200)
    store.sessions.create("s")
    w = ledger.open("s", store.leases.acquire("session:s", "w", TTL))
    _start(w)
    w.append("turn_started", _j(turn_id="t", user_text="big title\n" + "x" * 500), "t")
    kinds = [
        r["kind"] for r in store.query("SELECT kind FROM ledger_records ORDER BY seq").to_pylist()
    ]
    assert kinds == ["fence", "session_started", "blobptr"], kinds
    [meta] = ledger.catalog.list_sessions()
    assert (meta.title, meta.active_turn_id, meta.last_journal_seq) == ("big title", "t", 3)
    repaired = ledger.catalog.repair("s")
    assert (repaired.title, repaired.active_turn_id) == ("big title", "t")


# -- best effort, and the compare-and-set ---------------------------------------------


def _after_commit(monkeypatch: Any) -> None:
    """Leave every catalog update to the path after the append's COMMIT
    (``Catalog.after_append``), as when the update in the append's
    transaction cannot be made (a record that does not fold, a lost
    compare-and-set, a malformed entry)."""
    monkeypatch.setattr(catalog_group, "fold_in", lambda tx, updates: [False] * len(updates))


def test_the_update_commits_with_the_append_or_not_at_all(store, monkeypatch):
    """The entry is updated in the append's own transaction: an append whose
    transaction fails leaves the entry as it was (and its records unwritten)."""
    w = _writer(store)
    _start(w)
    before = store.ledger.catalog.read_meta("s")
    real = catalog_group.store_metas

    def then_fail(tx: Any, planned: Any) -> Any:
        real(tx, planned)
        raise OperationalError(detail="the commit failed")

    monkeypatch.setattr(catalog_group, "store_metas", then_fail)
    with pytest.raises(OperationalError):
        w.append("turn_started", _j(turn_id="t", user_text="x"), "t")
    monkeypatch.undo()
    assert store.ledger.catalog.read_meta("s") == before and store.ledger.tip("s") == 2


def test_a_failed_update_is_logged_and_never_fails_the_append(store, monkeypatch):
    seen = _failures(store)
    w = _writer(store)

    def broken(*args: Any) -> bool:
        raise OperationalError(detail="disk gone")

    _after_commit(monkeypatch)
    monkeypatch.setattr(catalog_mod, "store_meta", broken)
    assert w.append("session_started", _j(created_at=T0.isoformat()), "x").seq == 2
    assert [type(e) for e in seen] == [CatalogWriteError]
    assert isinstance(seen[0].__cause__, OperationalError) and seen[0].session_id == "s"
    with pytest.raises(CatalogWriteError) as caught:
        store.ledger.catalog.repair("s")
    assert isinstance(caught.value.__cause__, OperationalError)
    monkeypatch.undo()
    # the next append finds the missed record (a gap) and repairs
    store.ledger.catalog.configure(on_update_failed=seen.append)
    w.append("turn_started", _j(turn_id="t", user_text="later"), "y")
    meta = store.ledger.catalog.read_meta("s")
    assert (meta.last_journal_seq, meta.created_at, meta.title) == (3, T0, "later")
    assert len(seen) == 1


def _replays(store: Any, monkeypatch: Any) -> list[int]:
    """The ``from_seq`` of every ledger replay the catalog starts."""
    starts: list[int] = []
    real = store.ledger.catalog._replay

    def counted(sid: str, start: int) -> Any:
        starts.append(start)
        return real(sid, start)

    monkeypatch.setattr(store.ledger.catalog, "_replay", counted)
    return starts


def _lose_one_update(store: Any, monkeypatch: Any, append: Any) -> None:
    """Run ``append`` with its catalog update failing (a crash between the
    append's commit and its update has the same effect)."""

    def broken(*args: Any) -> bool:
        raise OperationalError(detail="disk gone")

    with monkeypatch.context() as m:
        _after_commit(m)
        m.setattr(catalog_mod, "store_meta", broken)
        append()


def test_an_entry_behind_catches_up_from_its_cursor_without_session_started(store, monkeypatch):
    """Failed before (attack on issue 19, F3a): a ledger with no
    ``session_started`` whose entry missed one update (a kill -9 between an
    append's commit and its update) could never be repaired
    (EmptySessionError), so every later append replayed the whole ledger and
    failed again, for good (0.5-1 s an append at 30-60k records). The update
    now folds the records it missed, read from the entry's cursor."""
    seen = _failures(store)
    w = _writer(store)
    for i in range(5):
        w.append("note", b"n", f"n{i}")  # seqs 2-6, folded one by one
    _lose_one_update(
        store, monkeypatch, lambda: w.append("turn_started", _j(turn_id="t", user_text="hi"), "t")
    )
    assert len(seen) == 1 and store.ledger.catalog.read_meta("s").last_journal_seq == 6
    starts = _replays(store, monkeypatch)
    w.append("note", b"n", "after")  # seq 8
    assert starts == [7]  # the record missed and the new one, not the ledger from 1
    meta = store.ledger.catalog.read_meta("s")
    assert (meta.last_journal_seq, meta.title, meta.active_turn_id) == (8, "hi", "t")
    w.append("turn_done", _j(turn_id="t"), "d")
    assert (store.ledger.catalog.read_meta("s").last_journal_seq, starts, len(seen)) == (9, [7], 1)


def test_a_record_that_does_not_fold_is_reported_once_and_later_appends_do_not_replay(
    store, monkeypatch
):
    """Failed before (attack on issue 19, F3c): a catalog-kind record that does
    not fold (written before appends checked catalog payloads) made every
    later append of the session replay its whole ledger and fail again."""
    seen = _failures(store)
    w = _writer(store)
    _start(w)
    _lose_one_update(store, monkeypatch, lambda: w.append("turn_started", _j(turn_id="t"), "t"))
    bad = b"{not json"
    forge(
        store,
        "UPDATE ledger_records SET payload = ?, payload_sha256 = ? "
        "WHERE session_id = 's' AND seq = 3",
        [stored_ledger_payload(store, "s", 3, bad), hashlib.sha256(bad).hexdigest()],
        rows=1,
    )
    starts = _replays(store, monkeypatch)
    w.append("note", b"n", "a")
    assert starts == [3] and [type(e) for e in seen] == [CatalogWriteError, ReplayDecodeError]
    assert store.ledger.catalog.is_stuck("s")
    for i in range(3):
        w.append("note", b"n", f"b{i}")
    assert (starts, len(seen)) == ([3], 2)
    assert store.ledger.catalog.read_meta("s").last_journal_seq == 2  # behind, as reported
    with pytest.raises(ReplayDecodeError):
        store.ledger.catalog.repair("s")  # the explicit repair still says why


def test_an_append_refuses_a_catalog_kind_payload_the_catalog_cannot_fold(store):
    """A catalog kind's payload that does not decode (not a JSON object, a
    required id missing or not text) is refused at the append, typed,
    nothing written: it used to be accepted, and the catalog could then
    never fold the session again."""
    w = _writer(store)
    _start(w)
    for kind, payload in [
        ("turn_started", b"{not json"),
        ("turn_started", b'["x"]'),
        ("turn_done", b"{}"),
        ("session_started", _j(created_at="yesterday")),
        ("step_done", b"\xff"),
    ]:
        with pytest.raises(InvalidInputError) as err:
            w.append(kind, payload, f"bad-{kind}")
        assert err.value.field == "entries[0].payload", kind
        assert isinstance(err.value.__cause__, ReplayDecodeError)
    assert store.ledger.tip("s") == 2
    assert w.append("my_own_kind", b"{not json", "free").seq == 3  # other kinds are the caller's


def test_a_persistently_contended_entry_is_a_conflict_error(store, monkeypatch):
    seen = _failures(store)
    w = _writer(store)
    _start(w)
    monkeypatch.setattr(catalog_group, "store_metas", lambda tx, planned: set())
    monkeypatch.setattr(catalog_mod, "store_meta", lambda *a: False)
    w.append("turn_started", _j(turn_id="t", user_text="x"), "t")
    assert [type(e) for e in seen] == [CatalogConflictError]
    with pytest.raises(CatalogConflictError) as caught:
        store.ledger.catalog.repair("s")
    assert (caught.value.session_id, caught.value.attempts) == ("s", catalog_mod.MAX_CAS_RETRIES)


def _race_repair_with_an_append(store: Any, monkeypatch: Any) -> Any:
    """A repair that replayed through seq 2, while an append of seq 3 and its
    online update land before the repair writes."""
    w = _writer(store)
    _start(w)
    real = catalog_mod.catalog_codec.encode
    state = {"raced": False, "repairing": False}

    def encode(meta: Any) -> str:
        if state["repairing"] and not state["raced"]:
            state["raced"] = True
            w.append("turn_started", _j(turn_id="t", user_text="raced in"), "t")
        return real(meta)

    monkeypatch.setattr(catalog_mod.catalog_codec, "encode", encode)
    state["repairing"] = True
    store.ledger.catalog.repair("s")
    assert state["raced"]
    return store.ledger.catalog.read_meta("s")


def test_the_revision_compare_and_set_keeps_a_racing_update(store, monkeypatch):
    meta = _race_repair_with_an_append(store, monkeypatch)
    assert (meta.last_journal_seq, meta.title) == (3, "raced in")


def test_control_without_the_compare_and_set_an_update_is_lost(store, monkeypatch):
    real = catalog_mod.store_meta

    def unconditional(
        tx: Any, tenant: str, sid: str, revision: int, text: str, now: Any, folded: int
    ) -> bool:
        if revision == 0:
            return real(tx, tenant, sid, revision, text, now, folded)
        tx.exec(
            "UPDATE ledger_catalog SET meta = ?, folded_seq = ?, revision = revision + 1 "
            "WHERE tenant = ? AND session_id = ?",
            [text, folded, tenant, sid],
        )
        return True

    monkeypatch.setattr(catalog_mod, "store_meta", unconditional)
    meta = _race_repair_with_an_append(store, monkeypatch)
    assert (meta.last_journal_seq, meta.title) == (2, "")  # seq 3's fold is lost


def test_control_without_the_repair_staleness_check_an_update_is_lost(store, monkeypatch):
    """The compare-and-set makes the repair retry; on the retry, the repair
    must see that the entry folded records past its replay and replay again."""
    monkeypatch.setattr(catalog_mod, "stored_ahead", lambda stored, replayed: False)
    meta = _race_repair_with_an_append(store, monkeypatch)
    assert (meta.last_journal_seq, meta.title) == (2, "")


# -- reads of malformed values ----------------------------------------------------


def _two_sessions(store: Any) -> dict[str, Any]:
    writers = {sid: _writer(store, sid) for sid in ("s", "t")}
    for w in writers.values():
        _start(w)
    return writers


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        ("{not json", json.JSONDecodeError),
        ('{"session_id": "s", "title": "a", "Title": "b"}', CatalogDuplicateFieldError),
        ({"session_id": "s", "state": "dancing"}, None),
        ({"session_id": "elsewhere"}, None),
        ({"session_id": "s", "loop_count": -1}, None),
    ],
)
def test_a_malformed_value_is_a_typed_read_error_and_the_others_still_list(store, value, cause):
    _two_sessions(store)
    _put(store, value)
    with pytest.raises(CatalogReadError) as caught:
        store.ledger.catalog.read_meta("s")
    assert caught.value.session_id == "s"
    assert isinstance(caught.value.__cause__, CatalogDecodeError)
    if cause is not None:
        assert isinstance(caught.value.__cause__.__cause__, cause)
    if cause is CatalogDuplicateFieldError:
        assert caught.value.__cause__.__cause__.field == "Title"
    with pytest.raises(CatalogReadError):
        store.ledger.catalog.list_sessions()
    skipped: list[CatalogReadError] = []
    listed = store.ledger.catalog.list_sessions(on_unreadable=skipped.append)
    assert [m.session_id for m in listed] == ["t"] and [e.session_id for e in skipped] == ["s"]
    assert store.ledger.catalog.repair("s").session_id == "s"  # repair replaces it
    assert store.ledger.catalog.read_meta("s").created_at == T0


def _loop(**kw: Any) -> dict[str, Any]:
    return {"loop_id": "L1", **kw}


@pytest.mark.parametrize(
    ("loops", "index", "field", "rule"),
    [
        ([_loop(loop_id="")], 0, c.FIELD_LOOP_ID, c.RULE_REQUIRED),
        ([_loop(loop_id="b"), _loop(loop_id="a")], 1, c.FIELD_LOOP_ORDER, c.RULE_SORTED_UNIQUE),
        ([_loop(), _loop()], 1, c.FIELD_LOOP_ORDER, c.RULE_SORTED_UNIQUE),
        (
            [_loop(runtime="r", runtime_seq=2, runtime_value_seq=3)],
            0,
            c.FIELD_RUNTIME_SEQ,
            c.RULE_EXCEEDS_RUNTIME,
        ),
        ([_loop(runtime_seq=3, runtime_value_seq=3)], 0, c.FIELD_RUNTIME_SEQ, c.RULE_LEGACY_VALUE),
        (
            [_loop(context_seq=1, context_value_seq=2, current_context={"tokens": 1, "window": 2})],
            0,
            c.FIELD_CONTEXT_VALUE_SEQ,
            c.RULE_EXCEEDS_CONTEXT,
        ),
        (
            [_loop(context_seq=2, context_value_seq=2)],
            0,
            c.FIELD_CONTEXT_VALUE_SEQ,
            c.RULE_CONTEXT_ABSENT,
        ),
        (
            [_loop(context_seq=3, context_value_seq=2, current_context={"tokens": 1, "window": 2})],
            0,
            c.FIELD_CONTEXT_VALUE_SEQ,
            c.RULE_CONTEXT_CURRENT,
        ),
        (
            [_loop(context_seq=2, context_value_seq=2, current_context={"tokens": 9, "window": 2})],
            0,
            c.FIELD_CURRENT_CONTEXT,
            c.RULE_INVALID,
        ),
    ],
)
def test_a_loop_projection_breaking_a_rule_is_a_meta_validation_error(
    store, loops, index, field, rule
):
    _two_sessions(store)
    _put(store, {"session_id": "s", "loops": loops})
    with pytest.raises(CatalogReadError) as caught:
        store.ledger.catalog.read_meta("s")
    found = caught.value.__cause__.__cause__
    assert isinstance(found, CatalogMetaValidationError)
    assert (found.loop_index, found.field, found.rule) == (index, field, rule)


def _bucket(**kw: Any) -> dict[str, Any]:
    return {"name": "n", "model_source": "named", "status": "failed", "runs": 1, **kw}


@pytest.mark.parametrize(
    ("hustles", "index", "rule"),
    [
        ([_bucket(name="")], 0, c.RULE_REQUIRED),
        ([_bucket(runs=0)], 0, c.RULE_INVALID),
        ([_bucket(model_source="current_loop", named_model_key="k")], 0, c.RULE_INVALID),
        ([_bucket(status="won")], 0, c.RULE_INVALID),
        ([_bucket(name="b"), _bucket(name="a")], 1, c.RULE_SORTED_UNIQUE),
    ],
)
def test_a_hustle_aggregate_breaking_a_rule_is_a_hustle_meta_validation_error(
    store, hustles, index, rule
):
    _two_sessions(store)
    _put(store, {"session_id": "s", "hustles": hustles})
    with pytest.raises(CatalogReadError) as caught:
        store.ledger.catalog.read_meta("s")
    found = caught.value.__cause__.__cause__
    assert isinstance(found, CatalogHustleMetaValidationError)
    assert (found.index, found.rule) == (index, rule)


def test_a_failed_catalog_read_is_a_read_error_with_the_backend_cause(store, monkeypatch):
    _two_sessions(store)

    def broken(*a: Any, **kw: Any) -> Any:
        raise OperationalError(detail="gone")

    monkeypatch.setattr(store.ledger.catalog.db, "read", broken)
    for call in (lambda: store.ledger.catalog.read_meta("s"), store.ledger.catalog.list_sessions):
        with pytest.raises(CatalogReadError) as caught:
            call()
        assert isinstance(caught.value.__cause__, OperationalError)


# -- a corrupt ledger ---------------------------------------------------------------


def test_a_corrupt_ledger_fails_its_repair_and_breaks_no_other_listing(store):
    seen = _failures(store)
    w = _two_sessions(store)["s"]
    forge(
        store,
        "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 2",
        [stored_ledger_payload(store, "s", 2, b"{}")],
        rows=1,
    )
    with pytest.raises(ReplayDecodeError) as caught:
        store.ledger.catalog.repair("s")
    assert caught.value.seq == 2
    assert [m.session_id for m in store.ledger.catalog.list_sessions()] == ["s", "t"]
    # an update needing a repair of the corrupt ledger is logged; the append stands
    assert w.append("turn_started", _j(turn_id="t", user_text="x"), "x").seq == 3
    assert [type(e) for e in seen] == []  # folded online: the ledger is not read
    assert store.ledger.catalog.read_meta("s").title == "x"
    _put(store, {"session_id": "s", "state": "bad"})  # the next update must repair
    assert w.append("turn_done", _j(turn_id="t"), "y").seq == 4
    assert [type(e) for e in seen] == [ReplayDecodeError]
    assert store.ledger.catalog.read_meta("t") is not None


# -- ordering, encoding, usage, hustles, compaction, empty ------------------------------


def test_a_record_behind_the_cursor_is_an_ordering_error_and_the_online_update_repairs(store):
    seen = _failures(store)
    w = _writer(store)
    _start(w)
    with pytest.raises(CatalogOrderingError) as caught:
        store.ledger.catalog.update_on_event("s", [(2, "turn_started", _j(turn_id="t"))])
    assert (caught.value.event_type, caught.value.sequence, caught.value.last) == (
        "turn_started",
        2,
        2,
    )
    with pytest.raises(CatalogOrderingError):  # a gap before the first new record
        store.ledger.catalog.update_on_event("s", [(9, "turn_started", _j(turn_id="t"))])
    store.ledger.catalog.after_append("s", [(2, "session_started", b"")])
    assert seen == [] and store.ledger.catalog.read_meta("s").created_at == T0


def test_a_lone_surrogate_in_a_title_is_replaced_and_the_entry_stays_current(store):
    """Failed before (attack on issue 19, F3b): a ``turn_started`` whose text
    holds a JSON-escaped lone surrogate (a client that cut an emoji in half)
    made the entry unwritable: every later update and every repair failed
    with CatalogWriteError. The catalog's text now holds U+FFFD instead."""
    seen = _failures(store)
    w = _writer(store)
    _start(w)
    w.append("turn_started", b'{"turn_id": "t", "user_text": "\\ud800 lone"}', "t")
    w.append("turn_done", _j(turn_id="t"), "d")
    assert seen == []
    meta = store.ledger.catalog.read_meta("s")
    assert (meta.title, meta.last_journal_seq) == ("\ufffd lone", 4)
    repaired = store.ledger.catalog.repair("s")
    assert (repaired.title, repaired.last_journal_seq) == ("\ufffd lone", 4)
    assert next(r.payload for r in store.ledger.replay("s", 3)) == (
        b'{"turn_id": "t", "user_text": "\\ud800 lone"}'
    )  # the ledger keeps the bytes written


def test_an_entry_that_does_not_encode_stops_online_updates_until_a_repair(store, monkeypatch):
    """A failure that recurs is reported once: the session's later appends
    no longer try (each used to replay the whole ledger and fail again);
    a repair that succeeds resumes them."""
    seen = _failures(store)
    w = _writer(store)
    _start(w)
    real = catalog_mod.catalog_codec.encode
    calls = []

    def refuse(meta: Any) -> str:
        calls.append(meta.last_journal_seq)
        raise CatalogEncodeError(detail="forced")

    monkeypatch.setattr(catalog_mod.catalog_codec, "encode", refuse)
    w.append("turn_started", _j(turn_id="t", user_text="x"), "t")
    assert [type(e) for e in seen] == [CatalogWriteError]
    assert isinstance(seen[0].__cause__, CatalogEncodeError)
    assert store.ledger.catalog.is_stuck("s")
    tried = len(calls)
    for i in range(3):
        w.append("note", b"n", f"n{i}")
    assert (len(calls), len(seen)) == (tried, 1)  # not tried again, not reported again
    with pytest.raises(CatalogWriteError):
        store.ledger.catalog.repair("s")
    monkeypatch.setattr(catalog_mod.catalog_codec, "encode", real)
    assert store.ledger.catalog.repair("s").last_journal_seq == 6
    assert not store.ledger.catalog.is_stuck("s")
    w.append("turn_done", _j(turn_id="t"), "d")
    assert store.ledger.catalog.read_meta("s").last_journal_seq == 7


@pytest.mark.parametrize(
    "usages",
    [
        [{"input_tokens": -1}],
        [{"output_tokens": "3"}],
        [{"input_tokens": c.MAX_COUNT}, {"input_tokens": 1}],
    ],
)
def test_invalid_or_overflowing_usage_is_a_usage_error(store, usages, monkeypatch):
    _unchecked(monkeypatch)  # the append refuses the first two now (test_ledger_entry_check.py)
    seen = _failures(store)
    w = _writer(store)
    _start(w)
    for i, usage in enumerate(usages):
        w.append("step_done", _j(loop_id="L9", usage=usage), f"u{i}")
    assert [type(e) for e in seen] == [CatalogUsageError]
    with pytest.raises(CatalogUsageError) as caught:
        store.ledger.catalog.repair("s")
    assert caught.value.loop_id == "L9"


def _hustle(run_id: str = "r", **kw: Any) -> dict[str, Any]:
    return {"run_id": run_id, "name": "n", "model_source": "named", "named_model_key": "k", **kw}


@pytest.mark.parametrize(
    ("records", "kind"),
    [
        ([("hustle_started", _hustle()), ("hustle_started", _hustle())], c.HUSTLE_DUPLICATE_START),
        ([("hustle_done", _hustle(status="failed"))], c.HUSTLE_TERMINAL_WITHOUT_START),
        (
            [("hustle_started", _hustle()), ("hustle_done", _hustle(status="failed", name="m"))],
            c.HUSTLE_ATTRIBUTION_MISMATCH,
        ),
        (
            [("hustle_started", _hustle()), ("hustle_done", _hustle(status="won"))],
            c.HUSTLE_INVALID_LIFECYCLE,
        ),
        (
            [
                ("hustle_started", _hustle(runtime="a")),
                ("hustle_done", _hustle(status="failed", runtime="b")),
            ],
            c.HUSTLE_RUNTIME_MISMATCH,
        ),
        (
            [
                ("hustle_started", _hustle()),
                ("hustle_done", _hustle(status="failed", usage={"input_tokens": -2})),
            ],
            c.HUSTLE_USAGE_OVERFLOW,
        ),
    ],
)
def test_a_hustle_history_that_does_not_fold_is_a_hustle_error(store, records, kind, monkeypatch):
    _unchecked(monkeypatch)  # invalid_lifecycle, usage_overflow: refused at the append now
    _failures(store)
    w = _writer(store)
    _start(w)
    for i, (k, body) in enumerate(records):
        w.append(k, _j(**body), f"h{i}")
    with pytest.raises(CatalogHustleError) as caught:
        store.ledger.catalog.repair("s")
    assert (caught.value.kind, caught.value.run_id) == (kind, "r")


def test_a_run_count_past_the_bound_is_a_run_count_overflow(store):
    """Reached with a stored aggregate at the bound (a valid value: 2**63 - 1
    runs), then one more terminal run folded online."""
    seen = _failures(store)
    w = _writer(store)
    _start(w)
    body = _stored(store)
    body["hustles"] = [_bucket(runs=c.MAX_COUNT, named_model_key="k")]
    _put(store, body)
    w.append("hustle_done", _j(**_hustle(status="failed")), "h")
    assert [type(e) for e in seen] == [CatalogHustleError]
    assert seen[0].kind == c.HUSTLE_RUN_COUNT_OVERFLOW


def test_a_second_terminal_of_one_compaction_is_a_compaction_error(store):
    w = _writer(store)
    _start(w)
    w.append("compaction_started", _j(attempt_id="c1"), "c0")
    w.append("compaction_done", _j(attempt_id="c1"), "c1")
    assert store.ledger.catalog.repair("s").last_journal_seq == 4
    w.append("compaction_done", _j(attempt_id="c1"), "c2")
    with pytest.raises(CatalogCompactionError) as caught:
        store.ledger.catalog.repair("s")
    assert (caught.value.kind, caught.value.attempt_id) == ("duplicate_terminal", "c1")


def test_repair_of_a_ledger_without_a_session_start_is_an_empty_session_error(store):
    w = _writer(store)
    w.append("note", b"x", "n")
    with pytest.raises(EmptySessionError):
        store.ledger.catalog.repair("s")
    w.append_many([LedgerEntry("note", b"y", "m")])
    assert store.ledger.catalog.read_meta("s").last_journal_seq == 3


def test_deleting_the_session_removes_its_catalog_entry(store):
    w = _two_sessions(store)["s"]
    store.sessions.delete("s", lease=w.lease)
    assert [m.session_id for m in store.ledger.catalog.list_sessions()] == ["t"]


def test_a_first_insert_that_finds_an_entry_loses_the_compare_and_set(store):
    """Two first updates that both read no entry: the second insert changes
    nothing and reports a lost compare-and-set (not a key violation)."""
    w = _writer(store)
    _start(w)
    text = catalog_mod.catalog_codec.encode(c.SessionMeta("s"))
    won = store.ledger.catalog.db.write(
        "t", lambda tx: catalog_mod.store_meta(tx, "", "s", 0, text, None, 0)
    )
    assert won is False
    assert store.ledger.catalog.read_meta("s").created_at == T0


def test_the_entry_holds_the_last_checkpoint_and_the_current_workspace(store):
    """sessionstore SessionMeta.LastCheckpoint and CurrentWorkspace
    (WorkspacePointer, its Source): a checkpoint sets both, a restore moves
    only the current workspace; a repair rebuilds the same; an entry stored
    without them reads as none, a pointer stored without its source as
    SOURCE_UNKNOWN (sessionstore WorkspacePointerSourceUnknown)."""
    w = _writer(store)
    _start(w)
    w.append(
        "workspace_checkpoint", _j(ref="r1", event_id="e1", turn_id="t1", consistency="fs"), "c1"
    )
    meta = store.ledger.catalog.read_meta("s")
    assert meta.last_checkpoint == CheckpointSummary("r1", "e1", 3, "fs", "t1")
    assert meta.current_workspace == c.WorkspacePointer("r1", "e1", 3, c.SOURCE_CHECKPOINT)
    w.append("workspace_restore", _j(ref="r0", event_id="e2"), "r")
    meta = store.ledger.catalog.read_meta("s")
    assert meta.last_checkpoint == CheckpointSummary("r1", "e1", 3, "fs", "t1")
    assert meta.current_workspace == c.WorkspacePointer("r0", "e2", 4, c.SOURCE_RESTORE)
    repaired = store.ledger.catalog.repair("s")
    assert (repaired.last_checkpoint, repaired.current_workspace) == (
        meta.last_checkpoint,
        meta.current_workspace,
    )
    body = _stored(store)
    del body["last_checkpoint"]
    del body["current_workspace"]["source"]
    _put(store, body)
    meta = store.ledger.catalog.read_meta("s")
    assert meta.last_checkpoint is None
    assert meta.current_workspace == c.WorkspacePointer("r0", "e2", 4, c.SOURCE_UNKNOWN)
    body["current_workspace"]["source"] = "elsewhere"
    _put(store, body)
    with pytest.raises(CatalogReadError):
        store.ledger.catalog.read_meta("s")


def test_the_audit_takes_an_append_between_its_reads_for_no_lag(store, monkeypatch):
    """Failed before (CI, an audit while a demo wrote through PgBouncer:
    "demo-7-1 (folded 129 of 127)"): ``ledger_catalog_lists_sessions``
    compared the catalog with tips read before its listing, so an append in
    between was a violation. The entry is judged between the tips read
    before and after the listing; one ahead of both (a tail lost with its
    tip) or behind both is still one."""
    from turnkeeper.storage.audit import Scope
    from turnkeeper.storage.audit import ledger as audit_ledger
    from turnkeeper.storage.ops.ledger.catalog import Catalog

    store.sessions.create("s")
    w = store.ledger.open("s", store.leases.acquire("session:s", "w", 30.0))
    w.append("session_started", _j(created_at="2026-01-01T00:00:00+00:00"), "ss")
    listing = Catalog.list_sessions

    def append_then_list(self: Any, **kw: Any) -> Any:
        w.append("note", b"n", f"n{store.ledger.tip('s')}")
        return listing(self, **kw)

    with monkeypatch.context() as m:
        m.setattr(Catalog, "list_sessions", append_then_list)
        assert audit_ledger.check_catalog(store, Scope(None)).violations == 0
        m.setattr(audit_ledger, "catalog_within", lambda before, folded, after: before == folded)
        assert audit_ledger.check_catalog(store, Scope(None)).violations == 1  # the control
    forge(store, "UPDATE ledger_tips SET seq = seq - 1 WHERE session_id = 's'", rows=1)
    assert audit_ledger.check_catalog(store, Scope(None)).violations == 1
