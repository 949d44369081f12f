"""``store.ledger``, the journal core (issue 19; sessionstore OpenJournal,
SessionJournal, OpenInternalRecordReplayer, RuntimeCommandLog), on every
backend.

Conformance for each error the journal raises (NilLeaseError,
OpeningFenceConflictError, LeaseLostError, LedgerIdempotencyConflictError,
ReplayDecodeError, ReplayReadError, EmptySessionError,
CommandApplicationNotFoundError), each fence with a control that patches it
out and sees the failure it prevents (the opening compare-and-set, the lease
fence of an append, the ledger's epoch fence of an append), and a race where a
second writer takes over while the first appends.
"""

from __future__ import annotations

import importlib
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    BACKENDS,
    forge,
    ledger_payload,
    new_pg_schema,
    open_pg,
    stored_ledger_payload,
    through_pooler,
)

import turnkeeper
from turnkeeper import (
    CommandApplication,
    CommandApplicationNotFoundError,
    EmptySessionError,
    EnvelopeError,
    InterfaceError,
    InvalidInputError,
    LeaseLostError,
    LedgerEntry,
    LedgerIdempotencyConflictError,
    LedgerTipDamagedError,
    LedgerWriter,
    NilLeaseError,
    OpeningFenceConflictError,
    OperationalError,
    ReplayDecodeError,
    ReplayReadError,
    SessionNotFoundError,
    TransactionConflictError,
)
from turnkeeper.storage.ops.ledger import journal
from turnkeeper.storage.ops.ledger.blob_files import FsspecBlobs

TTL = 30.0


def _lease(store: Any, sid: str = "s", owner: str = "w") -> Any:
    return store.leases.acquire(f"session:{sid}", owner, TTL)


def _records(store: Any, sid: str = "s", tenant: str = "") -> list[tuple[Any, ...]]:
    """The ledger's rows as stored: (seq, kind, idempotency id, payload, epoch)."""
    rows = store.query(
        "SELECT seq, kind, idempotency_id, payload, epoch FROM ledger_records "
        "WHERE tenant = ? AND session_id = ? ORDER BY seq",
        [tenant, sid],
    ).to_pylist()
    return [
        (
            r["seq"],
            r["kind"],
            r["idempotency_id"],
            ledger_payload(store, r["seq"], sid, tenant, stored=bytes(r["payload"])),
            r["epoch"],
        )
        for r in rows
    ]


def _writer(store: Any, sid: str = "s") -> Any:
    store.sessions.create(sid)
    return store.ledger.open(sid, _lease(store, sid))


# -- the journal ------------------------------------------------------------------


def test_records_round_trip_in_a_gapless_one_based_sequence_after_the_fence(store):
    w = _writer(store)
    assert (w.fence_seq, w.epoch, w.state) == (1, 1, "open")
    raw = bytes(range(256)) + b"\x00tail"
    assert w.append("turn", raw, "t1").seq == 2
    results = w.append_many([LedgerEntry("step", b"a", "t2"), LedgerEntry("step", b"", "t3")])
    assert [r.seq for r in results] == [3, 4] and not any(r.duplicate for r in results)
    got = list(store.ledger.replay("s"))
    assert [(r.seq, r.kind, r.idempotency_id, r.payload, r.epoch) for r in got] == [
        (1, "fence", "fence:1:1", b"", 1),
        (2, "turn", "t1", raw, 1),
        (3, "step", "t2", b"a", 1),
        (4, "step", "t3", b"", 1),
    ]
    assert {r.tenant for r in got} == {""} and store.ledger.tip("s") == 4
    assert [r.seq for r in store.ledger.replay("s", from_seq=3)] == [3, 4]
    assert [r.seq for r in store.ledger.replay("s", from_seq=0)] == [1, 2, 3, 4]
    assert list(store.ledger.replay("s", from_seq=9)) == []


def test_a_duplicate_idempotency_id_returns_the_original_sequence_and_other_content_conflicts(
    store,
):
    w = _writer(store)
    first = w.append("turn", b"hello", "id-1")
    again = w.append("turn", b"hello", "id-1")
    assert (again.seq, again.duplicate) == (first.seq, True)
    before = _records(store)
    for kind, payload in (("turn", b"other"), ("step", b"hello")):
        with pytest.raises(LedgerIdempotencyConflictError) as err:
            w.append(kind, payload, "id-1")
        assert (err.value.session_id, err.value.idempotency_id, err.value.seq) == (
            "s",
            "id-1",
            first.seq,
        )
    # a batch is all or nothing: its conflict writes none of its new records
    with pytest.raises(LedgerIdempotencyConflictError):
        w.append_many([LedgerEntry("turn", b"new", "id-2"), LedgerEntry("turn", b"x", "id-1")])
    assert _records(store) == before
    # a duplicate within one batch takes the earlier entry's sequence
    batch = w.append_many([LedgerEntry("t", b"1", "id-3"), LedgerEntry("t", b"1", "id-3")])
    assert [(r.seq, r.duplicate) for r in batch] == [(3, False), (3, True)]


def test_an_append_takes_the_same_statements_for_one_record_or_a_thousand(store):
    """The budget in ``journal``'s docstring: BEGIN, the lease fence, the tip's
    locked read, the ids' read, the session's key version, one insert, the
    tip's compare-and-set, then
    the catalog entry's cursor compare-and-set (``catalog_group.move_cursors``:
    ``turn`` is a kind the catalog does not fold; a folded kind's update is a
    read and a compare-and-set), COMMIT: one transaction, none after it (the
    catalog's update used to be a read and a write transaction of its own
    after each append)."""
    w = _writer(store)
    before = store.statement_stats()
    w.append("turn", b"x", "one")
    w.append_many([LedgerEntry("turn", b"x", f"t{i}") for i in range(1000)])
    stats = store.statement_stats()
    pinned = store.db.dialect.name == "postgres" and through_pooler()  # SET LOCAL with BEGIN
    # (the session's key version, read to seal: by a clear store object too)
    assert (stats["ledger_append"]["calls"], stats["ledger_append"]["statements_per_call"]) == (
        2,
        9.0 + pinned,
    )
    assert {k: v["calls"] for k, v in stats.items() if v != before.get(k)} == {"ledger_append": 2}
    assert store.ledger.tip("s") == 1002
    assert store.ledger.catalog.read_meta("s").last_journal_seq == 1002


def test_a_missing_lease_is_nil_lease_error_and_bad_input_is_refused_writing_nothing(store):
    store.sessions.create("s")
    store.sessions.create("other")
    with pytest.raises(NilLeaseError) as err:
        store.ledger.open("s", None)
    assert err.value.session_id == "s"
    with pytest.raises(InvalidInputError):
        store.ledger.open("s", _lease(store, "other"))
    assert _records(store) == []
    w = store.ledger.open("s", _lease(store))
    for bad in (
        lambda: w.append("turn", "text, not bytes", "i"),  # type: ignore[arg-type]
        lambda: w.append("fence", b"", "i"),
        lambda: w.append("", b"", "i"),
        lambda: w.append("turn", b"", ""),
        lambda: w.append_many([]),
        lambda: w.append_many([("turn", b"", "i")]),
    ):
        with pytest.raises(InvalidInputError):
            bad()
    assert len(_records(store)) == 1  # the fence alone
    w.close()
    with pytest.raises(InterfaceError):
        w.append("turn", b"", "i")
    assert w.state == "closed" and len(_records(store)) == 1


def test_a_deleted_session_has_no_ledger_to_open_or_append_to(store):
    w = _writer(store)
    w.append("turn", b"x", "t1")
    store.sessions.delete("s", lease=w.lease)
    assert _records(store) == []
    with pytest.raises(SessionNotFoundError):
        w.append("turn", b"y", "t2")
    with pytest.raises(SessionNotFoundError):
        store.ledger.open("s", w.lease)
    with pytest.raises(SessionNotFoundError):
        list(store.ledger.replay("s"))
    assert _records(store) == []


def test_a_writer_made_by_hand_without_an_open_is_refused(store):
    """A writer that planted no fence (made by hand, not by ``open``) appends
    nothing: the ledger's newest fence is not its epoch."""
    store.sessions.create("s")
    lease = _lease(store)
    with pytest.raises(LeaseLostError):
        LedgerWriter(store.ledger, "s", lease, 1).append("turn", b"x", "t1")
    assert _records(store) == []


def test_the_tenant_stamps_the_records_and_another_tenant_sees_none_of_them(store):
    store.sessions.create("s")
    lease = _lease(store)
    mine = store.ledger.with_tenant("acme")
    w = mine.open("s", lease)
    w.append("turn", b"secret", "t1")
    assert [(r.seq, r.tenant) for r in mine.replay("s")] == [(1, "acme"), (2, "acme")]
    with pytest.raises(EmptySessionError):
        list(store.ledger.replay("s"))
    assert store.ledger.tip("s") == 0 and len(_records(store, tenant="acme")) == 2
    with pytest.raises(CommandApplicationNotFoundError):
        store.ledger.read_command_application_at("s", 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_opened_for_a_tenant_files_and_reads_only_its_records(backend, tmp_path: Path):
    """``open_store(..., tenant=…)`` (sessionstore Open with WithTenant): the
    ledger's records carry the store's tenant, and a store of the same
    database opened for another tenant (or none) reads none of them; a
    tenant that is not storable text is refused before the database opens."""
    where = str(tmp_path / "t.duckdb") if backend == "duckdb" else new_pg_schema()

    def opened(**kw: Any) -> Any:
        return turnkeeper.open_store(where, **kw) if backend == "duckdb" else open_pg(where, **kw)

    with opened(tenant="acme") as store:
        assert store.ledger.tenant == "acme"
        store.sessions.create("s")
        with store.ledger.open("s", store.leases.acquire("session:s", "w", TTL)) as w:
            w.append("turn", b"secret", "t1")
        assert [(r.seq, r.tenant) for r in store.ledger.replay("s")] == [(1, "acme"), (2, "acme")]
        assert store.ledger.with_tenant("").tip("s") == 0
    with opened() as store:
        assert store.ledger.tip("s") == 0 and len(_records(store, tenant="acme")) == 2
        with pytest.raises(EmptySessionError):
            list(store.ledger.replay("s"))
        assert store.ledger.with_tenant("acme").tip("s") == 2
    for bad in ["a\ud800b", "a\x00b", "x" * 100_000, "acme\u202e", " ", "a\nb"]:
        with pytest.raises(InvalidInputError) as refused:
            opened(tenant=bad)  # NUL, 100k characters, a bidi override: taken before
        assert refused.value.field == "tenant", repr(bad)
        with opened() as store, pytest.raises(InvalidInputError):
            store.ledger.with_tenant(bad)


def test_the_command_log_refuses_a_writer_of_another_tenant(store):
    """Failed before (attack on issue 19, F8): the application was appended
    to tenant acme's ledger and read back from the default tenant's."""
    store.sessions.create("s")
    acme = store.ledger.with_tenant("acme").open("s", _lease(store))
    with pytest.raises(InvalidInputError) as refused:
        store.ledger.command_log("s", acme)
    assert refused.value.field == "writer" and "acme" in str(refused.value)
    log = store.ledger.with_tenant("acme").command_log("s", acme)
    app = CommandApplication("cmd-1", {"x": 1})
    assert log.read_command_application_at(log.append_command_application(app).seq) == app


# -- the opening fence ------------------------------------------------------------


def _open_racing_a_second_opener(store: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """Open the ledger of ``s`` under one grant while a second open under the
    same grant plants its fence between the first's tip read and its
    compare-and-set. Returns (the first open's outcome, the second's writer)."""
    store.sessions.create("s")
    lease = _lease(store)
    real_read = store.db.read
    other: list[Any] = []

    def read(operation: str, body: Any, **kw: Any) -> Any:
        found = real_read(operation, body, **kw)
        if operation == "ledger_tip" and not other:
            other.append(None)
            other[0] = store.ledger.open("s", lease)  # the tip moves
        return found

    monkeypatch.setattr(store.db, "read", read)
    try:
        outcome: Any = store.ledger.open("s", lease)
    except Exception as failure:  # the outcome is what the test checks
        outcome = failure
    monkeypatch.setattr(store.db, "read", real_read)
    return outcome, other[0]


def test_an_opening_fence_whose_tip_moved_conflicts_and_releases_the_grant(store, monkeypatch):
    outcome, second = _open_racing_a_second_opener(store, monkeypatch)
    assert isinstance(outcome, OpeningFenceConflictError)
    assert (outcome.session_id, outcome.epoch, outcome.expected_tip, outcome.found_tip) == (
        "s",
        1,
        0,
        1,
    )
    assert _records(store) == [(1, "fence", "fence:1:1", b"", 1)]
    # the grant is spent: released, so the other writer under it is fenced out too
    with pytest.raises(LeaseLostError):
        store.leases.validate(second.lease)
    with pytest.raises(LeaseLostError):
        second.append("turn", b"x", "t1")
    # a fresh lease has a strictly higher epoch and opens
    fresh = store.ledger.open("s", _lease(store))
    assert (fresh.epoch, fresh.fence_seq) == (2, 2)
    assert fresh.append("turn", b"x", "t1").seq == 3


def test_an_open_under_an_expired_lease_is_lease_lost_and_plants_no_fence(store, clock):
    store.sessions.create("s")
    lease = _lease(store)
    clock.advance(TTL)
    with pytest.raises(LeaseLostError) as err:
        store.ledger.open("s", lease)
    assert err.value.target == "session:s" and _records(store) == []
    refused = store.query("SELECT operation, epoch FROM fence_events").to_pylist()
    assert refused == [{"operation": "ledger_open", "epoch": 1}]


def test_control_the_opening_compare_and_set_patched_out_lets_the_open_through(store, monkeypatch):
    monkeypatch.setattr(journal, "tip_unmoved", lambda expected, found: True)
    outcome, second = _open_racing_a_second_opener(store, monkeypatch)
    # without the compare-and-set no OpeningFenceConflictError: the open goes on
    # to write at the tip it read (refused only by the sequence's key), and the
    # grant is not released
    assert not isinstance(outcome, OpeningFenceConflictError)
    store.leases.validate(second.lease)


# -- the append fences ------------------------------------------------------------


def _takeover(store: Any, clock: Any, first: Any, *, open_it: bool) -> Any:
    """The first writer's lease expires and another owner takes the session over
    (and opens its writer, with ``open_it``)."""
    first.append("turn", b"a1", "a1")
    clock.advance(TTL + 1)
    lease = _lease(store, owner="w2")
    assert lease.epoch == 2
    return store.ledger.open("s", lease) if open_it else lease


def test_an_append_under_an_overtaken_lease_is_lease_lost_and_writes_nothing(store, clock):
    first = _writer(store)
    _takeover(store, clock, first, open_it=False)
    before = _records(store)
    with pytest.raises(LeaseLostError):
        first.append("turn", b"stale", "a2")
    assert first.state == "fenced" and _records(store) == before
    refused = store.query("SELECT operation, epoch FROM fence_events").to_pylist()
    assert refused == [{"operation": "ledger_append", "epoch": 1}]
    with pytest.raises(LeaseLostError):  # fenced for good
        first.append("turn", b"stale", "a3")


def test_control_the_lease_fence_patched_out_lets_the_stale_append_land(store, clock, monkeypatch):
    first = _writer(store)
    _takeover(store, clock, first, open_it=False)
    monkeypatch.setattr(journal.leases, "fence", lambda tx, lease: tx.clock_after_locks())
    assert first.append("turn", b"stale", "a2").seq == 3
    assert _records(store)[-1] == (3, "turn", "a2", b"stale", 1)


def test_the_ledger_epoch_fence_refuses_a_writer_another_epoch_fenced_out(
    store, clock, monkeypatch
):
    first = _writer(store)
    second = _takeover(store, clock, first, open_it=True)
    # with the lease fence patched out, the ledger's own epoch fence still refuses
    monkeypatch.setattr(journal.leases, "fence", lambda tx, lease: tx.clock_after_locks())
    before = _records(store)
    with pytest.raises(LeaseLostError) as err:
        first.append("turn", b"stale", "a2")
    assert "fenced by epoch 2" in str(err.value) and _records(store) == before
    assert second.append("turn", b"b1", "b1").seq == 4


def test_control_both_append_fences_patched_out_a_stale_append_lands_and_replay_refuses_it(
    store, clock, monkeypatch
):
    first = _writer(store)
    second = _takeover(store, clock, first, open_it=True)
    monkeypatch.setattr(journal.leases, "fence", lambda tx, lease: tx.clock_after_locks())
    monkeypatch.setattr(journal, "check_epoch", lambda session_id, lease, epoch: None)
    assert first.append("turn", b"stale", "a2").seq == 4
    assert _records(store)[-1][-1] == 1  # epoch 1 after epoch 2's fence
    with pytest.raises(ReplayDecodeError) as err:
        list(store.ledger.replay("s"))
    assert (err.value.session_id, err.value.seq) == ("s", 4)
    assert second.state == "open"


def test_replay_refuses_a_fence_below_an_earlier_fences_epoch(store, clock, monkeypatch):
    """A stale writer's open that got past the lease fence (patched out here, as
    in the control above) plants a fence of epoch 1 after epoch 2's: replay
    refuses that fence at its sequence, so the older epoch never governs the
    records after it. (The check patched out: mutant
    ``ledger-replay-fence-order``, ``make mutants``.)"""
    first = _writer(store)
    _takeover(store, clock, first, open_it=True)  # records: fence 1, a1, fence 2
    monkeypatch.setattr(journal.leases, "fence", lambda tx, lease: tx.clock_after_locks())
    stale = store.ledger.open("s", first.lease)
    assert (stale.fence_seq, stale.epoch) == (4, 1)
    assert [r[1] for r in _records(store)][-1] == "fence" and _records(store)[-1][-1] == 1
    with pytest.raises(ReplayDecodeError, match="a fence of epoch 1 after one of 2") as err:
        list(store.ledger.replay("s"))
    assert (err.value.session_id, err.value.seq) == ("s", 4)


def test_a_second_writer_takes_over_while_the_first_appends_and_the_first_is_refused(store, clock):
    first = _writer(store)
    appended = threading.Event()
    acked: list[int] = []
    outcome: list[BaseException] = []

    def run() -> None:
        i = 0
        try:
            while True:
                i += 1
                acked.append(first.append("turn", f"a{i}".encode(), f"a{i}").seq)
                if i == 5:
                    appended.set()
        except BaseException as failure:  # the test checks which
            outcome.append(failure)
            appended.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert appended.wait(120)
    clock.advance(TTL + 1)
    second = store.ledger.open("s", _lease(store, owner="w2"))
    taken = [second.append("turn", f"b{i}".encode(), f"b{i}").seq for i in range(5)]
    thread.join(120)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], LeaseLostError), outcome
    assert first.state == "fenced"
    records = list(store.ledger.replay("s"))  # verified: no stale record after a fence
    by_seq = {r.seq: r for r in records}
    assert all(by_seq[s].epoch == 1 and s < second.fence_seq for s in acked)
    assert all(by_seq[s].epoch == 2 for s in taken)
    assert [r.seq for r in records if r.epoch == 1] == list(range(1, second.fence_seq))
    assert len(acked) >= 5 and [r.seq for r in records] == list(range(1, len(records) + 1))


# -- replay -----------------------------------------------------------------------


def test_replay_reads_bounded_pages_lazily(store, monkeypatch):
    w = _writer(store)
    w.append_many([LedgerEntry("turn", b"x" * 100, f"t{i}") for i in range(40)])
    pages: list[int] = []
    real_read = store.db.read

    def read(operation: str, body: Any, **kw: Any) -> Any:
        found = real_read(operation, body, **kw)
        if operation == "ledger_replay" and isinstance(found, list):
            pages.append(len(found))
        return found

    monkeypatch.setattr(store.db, "read", read)
    it = store.ledger.replay("s", page_rows=7)
    assert next(it).seq == 1 and pages == [7]  # one page held, not the ledger
    assert [r.seq for r in it] == list(range(2, 42))
    assert pages == [7, 7, 7, 7, 7, 6] and max(pages) <= 7


def test_replay_streams_within_its_memory_bound(store):
    """Measured: the Python memory a replay holds (tracemalloc's peak) stays
    within its bound of one page, while the records it streams take 4 MiB."""
    w = _writer(store)
    for batch in range(2):
        w.append_many(
            [LedgerEntry("turn", bytes([i % 251]) * 2048, f"t{batch}-{i}") for i in range(1000)]
        )
    page_rows, record_bytes = 50, 2048

    def peak(rows: int) -> tuple[int, int]:
        tracemalloc.start()
        try:
            total = sum(len(r.payload) for r in store.ledger.replay("s", page_rows=rows))
            return total, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    total, streamed = peak(page_rows)
    assert total == 2000 * record_bytes
    bound = 4 * page_rows * record_bytes + 256 * 1024  # a page twice over, with slack
    assert streamed < bound, f"replay peaked at {streamed} bytes, bound {bound}"
    # the measure can fail: one page of the whole ledger peaks above its size
    assert peak(2001)[1] > total
    assert total > 4 * bound  # the ledger itself is far beyond the bound


def test_replay_of_an_empty_ledger_and_of_a_missing_session_fail_closed(store):
    store.sessions.create("s")
    with pytest.raises(EmptySessionError) as err:
        list(store.ledger.replay("s"))
    assert err.value.session_id == "s"
    with pytest.raises(SessionNotFoundError):
        list(store.ledger.replay("nobody"))


def test_replay_of_a_flipped_or_truncated_payload_is_a_decode_error_at_its_sequence(store):
    w = _writer(store)
    w.append_many([LedgerEntry("turn", b"payload-%d" % i, f"t{i}") for i in range(4)])
    for damage, seq in ((b"payload-X", 3), (b"payl", 5)):  # a flipped byte, a cut tail
        original = b"payload-%d" % (seq - 2)
        damaged = stored_ledger_payload(store, "s", seq, damage)  # sealed: a valid seal
        forge(store, "UPDATE ledger_records SET payload = ? WHERE seq = ?", [damaged, seq], rows=1)
        seen: list[int] = []
        with pytest.raises(ReplayDecodeError) as err:
            for r in store.ledger.replay("s", page_rows=2):
                seen.append(r.seq)
        assert (err.value.seq, seen) == (seq, list(range(1, seq)))  # nothing from it on
        restored = stored_ledger_payload(store, "s", seq, original)
        forge(store, "UPDATE ledger_records SET payload = ? WHERE seq = ?", [restored, seq], rows=1)
    assert len(list(store.ledger.replay("s"))) == 5
    cut = stored_ledger_payload(store, "s", 5, b"payl")
    forge(store, "UPDATE ledger_records SET payload = ? WHERE seq = 5", [cut], rows=1)
    with pytest.raises(ReplayDecodeError) as err:
        list(store.ledger.replay("s", from_seq=4))
    assert err.value.seq == 5


def test_replay_of_a_missing_record_or_a_lost_tail_or_a_failed_read_is_a_read_error(
    store, monkeypatch
):
    w = _writer(store)
    w.append_many([LedgerEntry("turn", b"p", f"t{i}") for i in range(5)])  # tip 6
    forge(store, "DELETE FROM ledger_records WHERE seq = 6", rows=1)
    with pytest.raises(ReplayReadError) as err:
        list(store.ledger.replay("s"))
    assert (err.value.name, err.value.seq) == ("ledger:s", 6)
    forge(store, "DELETE FROM ledger_records WHERE seq = 3", rows=1)
    seen: list[int] = []
    with pytest.raises(ReplayReadError) as err:
        for r in store.ledger.replay("s"):
            seen.append(r.seq)
    assert (err.value.seq, seen) == (3, [1, 2])
    real_read = store.db.read

    def failing(operation: str, body: Any, **kw: Any) -> Any:
        if operation == "ledger_replay":
            raise OperationalError(detail="connection lost")
        return real_read(operation, body, **kw)

    monkeypatch.setattr(store.db, "read", failing)
    with pytest.raises(ReplayReadError) as err:
        list(store.ledger.replay("s"))
    assert isinstance(err.value.__cause__, OperationalError)


def test_a_lowered_or_lost_tip_is_a_read_error_not_a_shorter_replay(store, monkeypatch):
    """Failed before (attack): a lowered tip replayed 3 of 6 records with no
    error, and a deleted tip row made the ledger EmptySessionError. The tip
    fence (``replay.tip_covers``) patched out lets the replay end early."""
    w = _writer(store)
    w.append_many([LedgerEntry("turn", b"p", f"t{i}") for i in range(5)])  # tip 6
    forge(store, "UPDATE ledger_tips SET seq = 3 WHERE session_id = 's'", rows=1)
    with pytest.raises(ReplayReadError) as err:
        list(store.ledger.replay("s"))
    assert (err.value.seq, "reach 6" in str(err.value)) == (4, True)
    replay_mod = importlib.import_module("turnkeeper.storage.ops.ledger.replay")
    with monkeypatch.context() as m:
        m.setattr(replay_mod, "tip_covers", lambda tip, last: True)
        assert [r.seq for r in store.ledger.replay("s")] == [1, 2, 3]  # the control
    forge(store, "DELETE FROM ledger_tips WHERE session_id = 's'", rows=1)
    with pytest.raises(ReplayReadError) as err:
        list(store.ledger.replay("s"))
    assert err.value.seq == 1


def test_a_lost_tail_with_its_tip_lowered_is_a_read_error_the_catalog_exposes(store, monkeypatch):
    """Failed before (attack round 2, F12): records past 4 deleted and the tip
    lowered with them (an older copy of the ledger's tables restored) replayed
    as a whole ledger of 4 records, though the catalog entry, updated in each
    append's transaction, had folded 7. Replay (and so verify, GC's scan and
    repair) now fails closed at the tip + 1; the control patches the fence
    out and the short ledger replays again."""
    w = _writer(store)
    w.append("session_started", b'{"created_at":"2026-01-01T00:00:00+00:00"}', "st")
    w.append_many([LedgerEntry("note", b"n", f"n{i}") for i in range(5)])  # tip 7
    assert store.ledger.catalog.read_meta("s").last_journal_seq == 7
    forge(store, "DELETE FROM ledger_records WHERE session_id = 's' AND seq > 4", rows=3)
    forge(store, "UPDATE ledger_tips SET seq = 4 WHERE session_id = 's'", rows=1)
    for start in (1, 5):
        with pytest.raises(ReplayReadError) as err:
            list(store.ledger.replay("s", start))
        assert (err.value.seq, "folded records up to 7" in str(err.value)) == (5, True)
    # an entry written before schema 27 keeps its cursor in its JSON alone
    codec = importlib.import_module("turnkeeper.storage.ops.ledger.catalog_codec")
    text = codec.encode(store.ledger.catalog.read_meta("s"))
    forge(
        store,
        "UPDATE ledger_catalog SET meta = ?, folded_seq = 0 WHERE session_id = 's'",
        [text],
        rows=1,
    )
    with pytest.raises(ReplayReadError) as err:
        list(store.ledger.replay("s"))
    assert (err.value.seq, "folded records up to 7" in str(err.value)) == (5, True)
    with pytest.raises(ReplayReadError):
        store.ledger.catalog.repair("s")
    replay_mod = importlib.import_module("turnkeeper.storage.ops.ledger.replay")
    with monkeypatch.context() as m:  # the control: without the tip fence
        m.setattr(replay_mod, "tip_covers", lambda tip, last: True)
        assert [r.seq for r in store.ledger.replay("s")] == [1, 2, 3, 4]


def test_a_malformed_catalog_entry_does_not_stop_a_replay(store):
    """The lost-tail fence reads the catalog entry's cursor; an entry that
    does not decode is the catalog's damage (its reads report it), not the
    ledger's: the ledger still replays whole."""
    w = _writer(store)
    w.append("session_started", b'{"created_at":"2026-01-01T00:00:00+00:00"}', "st")
    for bad in ("not json", "[]", '{"last_journal_seq": -3}', "[" * 100_000):
        forge(  # as written before schema 27: the cursor in the JSON alone
            store,
            "UPDATE ledger_catalog SET meta = ?, folded_seq = 0 WHERE session_id = 's'",
            [bad],
            rows=1,
        )
        assert [r.seq for r in store.ledger.replay("s")] == [1, 2]


def test_an_append_committed_while_replay_starts_is_not_taken_for_a_damaged_tip(store, monkeypatch):
    """Failed before (attack round 2, F1): replay read the tip and its last
    record's sequence in two reads, so an append committed between them was
    reported as a damaged tip (``ReplayReadError ... its records reach 3``;
    1 in 10 replays beside a writer). Both are read in one snapshot now: the
    append here, committed from another thread right after the tip's read,
    is not seen by the replay, which yields the tip it read."""
    w = _writer(store)
    w.append("turn", b"p", "t1")  # tip 2
    replay_mod = importlib.import_module("turnkeeper.storage.ops.ledger.replay")
    real = replay_mod.read_tip
    appended: list[int] = []

    def read_tip_then_append(tx: Any, tenant: str, session_id: str, **kw: Any) -> Any:
        tip = real(tx, tenant, session_id, **kw)
        if not appended:
            worker = threading.Thread(
                target=lambda: appended.append(w.append("turn", b"q", "t2").seq)
            )
            worker.start()
            worker.join(timeout=60)
            assert appended == [3]
        return tip

    monkeypatch.setattr(replay_mod, "read_tip", read_tip_then_append)
    assert [r.seq for r in store.ledger.replay("s")] == [1, 2]
    assert [r.seq for r in store.ledger.replay("s")] == [1, 2, 3]


def test_a_write_on_a_lowered_or_lost_tip_is_refused_at_once_typed(store):
    """Failed before (attack): on a lowered tip an append, and on a lost tip
    row an open, collided with the records past the tip, which the write
    path took for a write-write conflict: 40 retries of about a second each
    into TransactionConflictError, holding the write path from every other
    session's writer. The record past the tip is damage, refused typed at
    once, nothing written; the single path and the group commit alike."""
    w = _writer(store)
    w.append_many([LedgerEntry("turn", b"p", f"t{i}") for i in range(5)])  # tip 6
    forge(store, "UPDATE ledger_tips SET seq = 3 WHERE session_id = 's'", rows=1)
    calls = store.statement_stats().get("ledger_append", {}).get("calls", 0)
    for append in (
        lambda: w.append("turn", b"new", "n1"),
        lambda: w.append_many([LedgerEntry("turn", b"a", "n2"), LedgerEntry("turn", b"b", "n3")]),
    ):
        with pytest.raises(LedgerTipDamagedError) as err:
            append()
        assert (err.value.session_id, err.value.tip, err.value.seq) == ("s", 3, 4)
    assert store.statement_stats()["ledger_append"]["retries"] == 0
    assert store.statement_stats()["ledger_append"]["calls"] == calls + 2
    # the group path: two writers' appends merged into one transaction
    other = _writer(store, "o")
    _group_of_two(
        store, lambda: w.append("turn", b"g", "g1"), lambda: other.append("turn", b"h", "h1")
    )
    assert [r.seq for r in store.ledger.replay("o")] == [1, 2]
    assert store.query(
        "SELECT count(*) AS n FROM ledger_records WHERE session_id = 's'"
    ).to_pylist() == [{"n": 6}]
    # a lost tip row: a new writer's open finds the records at 1…
    forge(store, "DELETE FROM ledger_tips WHERE session_id = 's'", rows=1)
    store.leases.release(w.lease)
    lease = store.leases.acquire("session:s", "other", ttl_s=60)
    with pytest.raises(LedgerTipDamagedError) as err:
        store.ledger.open("s", lease)
    assert (err.value.tip, err.value.seq) == (0, 1)
    assert store.query(
        "SELECT count(*) AS n FROM ledger_records WHERE session_id = 's'"
    ).to_pylist() == [{"n": 6}]


def test_control_without_the_write_path_tip_fence_a_damaged_tip_is_retried_as_a_conflict(
    store, monkeypatch
):
    """``journal.refuse_past_tip`` patched out: the append collides with the
    record past the tip and is retried as a write-write conflict until the
    retries run out (2 here, 40 shipped)."""
    w = _writer(store)
    w.append_many([LedgerEntry("turn", b"p", f"t{i}") for i in range(5)])
    forge(store, "UPDATE ledger_tips SET seq = 3 WHERE session_id = 's'", rows=1)
    monkeypatch.setattr(journal, "refuse_past_tip", lambda session_id, tip, seqs: None)
    monkeypatch.setattr(importlib.import_module("turnkeeper.storage.retry"), "MAX_ATTEMPTS", 2)
    with pytest.raises(TransactionConflictError):
        w.append("turn", b"new", "n1")


def _group_of_two(store: Any, damaged: Any, healthy: Any) -> None:
    """Run ``damaged`` and ``healthy`` from two threads at once (whether they
    merge into one transaction or not, the damaged one is refused typed and
    the healthy one commits)."""
    seen: dict[str, Any] = {}
    start = threading.Barrier(2)

    def run(name: str, call: Any) -> None:
        start.wait()
        try:
            seen[name] = call()
        except Exception as failure:
            seen[name] = failure

    threads = [
        threading.Thread(target=run, args=("damaged", damaged)),
        threading.Thread(target=run, args=("healthy", healthy)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert isinstance(seen["damaged"], LedgerTipDamagedError), seen
    assert seen["healthy"].seq == 2, seen


# -- the command log --------------------------------------------------------------


def test_the_command_log_appends_reads_back_and_fails_closed(store):
    w = _writer(store)
    log = store.ledger.command_log("s", w)
    app = CommandApplication("cmd-1", {"turn": 3, "applied": ["a", "b"]})
    first = log.append_command_application(app)
    assert (first.seq, first.duplicate) == (2, False)
    assert log.read_command_application_at(first.seq) == app
    assert store.ledger.read_command_application_at("s", first.seq) == app
    # a redelivery maps to the original, whatever it would apply
    again = log.append_command_application(CommandApplication("cmd-1", {"turn": 4}))
    assert (again.seq, again.duplicate) == (first.seq, True)
    assert log.read_command_application_at(again.seq) == app
    # never "not applied" for a record that is not a readable application
    w.append("command_application", b"{not json", "raw")
    w.append("turn", b"x", "turn-1")
    for seq in (1, 3, 4, 99):
        with pytest.raises(CommandApplicationNotFoundError) as err:
            log.read_command_application_at(seq)
        assert (err.value.session_id, err.value.seq) == ("s", seq)
    with pytest.raises(CommandApplicationNotFoundError) as err:
        log.read_command_application_at(3)  # the body that is not JSON: an EnvelopeError
    assert isinstance(err.value.__cause__, EnvelopeError)
    assert isinstance(err.value.__cause__.__cause__, ValueError)
    bad = stored_ledger_payload(store, "s", 2, b'{"x"}')
    forge(store, "UPDATE ledger_records SET payload = ? WHERE seq = 2", [bad], rows=1)
    with pytest.raises(CommandApplicationNotFoundError) as err:
        log.read_command_application_at(2)
    assert isinstance(err.value.__cause__, ReplayDecodeError)
    with pytest.raises(InvalidInputError):
        log.append_command_application(CommandApplication("cmd-2", {"when": object()}))


# -- the opening append, persistence paths ----------------------------------------


def test_an_opening_append_commits_with_the_fence_or_not_at_all(store):
    """``open(..., opening=[…])`` (sessionstore OpenJournalWithOpeningAppend):
    the entries follow the fence record in its transaction; a refused open
    writes neither, and a malformed or oversized opening entry is refused
    before anything is written."""
    store.sessions.create("s")
    lease = _lease(store)
    started = LedgerEntry("session_started", b'{"created_at": "2026-01-02T03:04:05+00:00"}', "ss")
    w = store.ledger.open("s", lease, opening=[started, LedgerEntry("note", b"n", "n1")])
    assert (w.fence_seq, [(r.seq, r.duplicate) for r in w.opening]) == (1, [(2, False), (3, False)])
    assert [(r.seq, r.kind) for r in store.ledger.replay("s")] == [
        (1, "fence"),
        (2, "session_started"),
        (3, "note"),
    ]
    assert store.ledger.catalog.read_meta("s").last_journal_seq == 3  # folded in the same commit
    for bad, field in [
        ([LedgerEntry("note", b"x" * 300_000, "big")], "opening[0].payload"),
        ([LedgerEntry("turn_started", b"{not json", "t")], "opening[0].payload"),
        ([LedgerEntry("fence", b"", "f")], "opening[0].kind"),
        (["not an entry"], "opening[0]"),
    ]:
        with pytest.raises(InvalidInputError) as err:
            store.ledger.open("s", lease, opening=bad)
        assert err.value.field == field
    # a second writer's opening whose id names other content: nothing written, not even its fence
    store.leases.release(lease)
    other = store.leases.acquire("session:s", "other", ttl_s=TTL)
    with pytest.raises(LedgerIdempotencyConflictError):
        store.ledger.open("s", other, opening=[LedgerEntry("note", b"other", "n1")])
    assert store.ledger.tip("s") == 3
    again = store.ledger.open("s", other, opening=[LedgerEntry("note", b"n", "n1")])
    assert (again.fence_seq, [(r.seq, r.duplicate) for r in again.opening]) == (4, [(3, True)])


def test_persistence_paths_name_the_database_its_log_and_a_local_blob_root(tmp_path):
    """sessionstore PersistencePaths: what a backup must copy."""
    path = tmp_path / "p.duckdb"
    with turnkeeper.open_store(str(path)) as store:
        assert store.ledger.persistence_paths() == [str(path), f"{path}.wal"]
        blobs = FsspecBlobs(str(tmp_path / "blobs"))
        paths = store.ledger.with_blobs(blobs).persistence_paths()
        assert paths == [str(path), f"{path}.wal", str(tmp_path / "blobs")]
    with turnkeeper.open_store(":memory:") as store:
        assert store.ledger.persistence_paths() == []
