"""Group commit of ledger appends (issue 19), on every backend: concurrent
writers' appends commit in one transaction (``storage/ops/ledger/group.py``),
each caller answered after the commit that holds its records, each member
judged by its own fences, one member's failure its own.

Every test forms a group the same way, with no timing: a blocker's append
is held inside its transaction (``journal.append`` waits on an event) while
the other writers' appends queue behind it (DuckDB: the backend's group
commit queue; PostgreSQL: the store object's ``Batcher``); once they are all
queued (polled, with a hang guard) the blocker is let go and the queued
appends run as one group. A spy on ``group.append_group`` records each
group's size.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import duckdb
import pytest

from turnkeeper import (
    DatabaseError,
    LeaseLostError,
    LedgerEntry,
    LedgerIdempotencyConflictError,
)
from turnkeeper.storage.ops import leases
from turnkeeper.storage.ops.ledger import group, journal

TTL = 30.0
HANG_S = 60.0


def _writer(store: Any, sid: str, owner: str | None = None) -> Any:
    store.sessions.create(sid)
    return store.ledger.open(sid, store.leases.acquire(f"session:{sid}", owner or sid, TTL))


def _queued(store: Any) -> int:
    """How many writes wait behind the running one."""
    db = store.ledger.db
    if db.dialect.serialized_writes:
        return len(db._queue)
    return len(group.batcher(db, "append")._queue)


def _records(store: Any, sid: str) -> list[tuple[int, str, int]]:
    rows = store.query(
        "SELECT seq, idempotency_id, epoch FROM ledger_records WHERE session_id = ? ORDER BY seq",
        [sid],
    ).to_pylist()
    return [(r["seq"], r["idempotency_id"], r["epoch"]) for r in rows]


class Grouped:
    """Runs ``calls`` (one per thread) as one group behind a held blocker;
    ``sizes``: the size of each ``append_group`` call."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store = store
        self.sizes: list[int] = []
        self.blocker = _writer(store, "blocker")
        self._held = threading.Event()
        self._go = threading.Event()
        alone, together = journal.append, group.append_group

        def held_append(tx: Any, tenant: str, sid: str, lease: Any, *entries: Any) -> Any:
            if sid == "blocker":
                self._held.set()
                assert self._go.wait(HANG_S)
            return alone(tx, tenant, sid, lease, *entries)

        def spy(tx: Any, requests: list[Any]) -> list[Any]:
            self.sizes.append(len(requests))
            return together(tx, requests)

        monkeypatch.setattr(journal, "append", held_append)
        monkeypatch.setattr(group, "append_group", spy)

    def run(self, calls: list[Callable[[], Any]]) -> list[Any]:
        """Each call's result or exception, in order, once all returned."""
        out: list[Any] = [None] * len(calls)
        blocked: list[Any] = []

        def block() -> None:
            try:
                self.blocker.append("turn", b"b", f"b{time.monotonic_ns()}")
            except Exception as exc:
                blocked.append(exc)

        def call(i: int) -> None:
            try:
                out[i] = calls[i]()
            except Exception as exc:
                out[i] = exc

        first = threading.Thread(target=block)
        first.start()
        assert self._held.wait(HANG_S)
        pool = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
        for t in pool:
            t.start()
        deadline = time.monotonic() + HANG_S
        while _queued(self.store) < len(calls):
            assert time.monotonic() < deadline, "the appends never queued"
            time.sleep(0.005)
        self._go.set()
        for t in [first, *pool]:
            t.join(HANG_S)
        self.blocked = blocked
        return out


def test_concurrent_writers_commit_in_one_group_with_one_insert(store, monkeypatch):
    """Seven writers' appends (one record, and batches of three) queued
    together run as one ``append_group``: one transaction, every caller
    answered its own sequences, every record stored under its writer's epoch."""
    writers = [_writer(store, f"s{i}") for i in range(7)]
    g = Grouped(store, monkeypatch)
    before = store.statement_stats().get("ledger_append", {}).get("calls", 0)
    out = g.run(
        [
            (lambda w=w: w.append("turn", b"one", "a"))
            if i % 2
            else (lambda w=w: w.append_many([LedgerEntry("turn", b"x", f"m{k}") for k in range(3)]))
            for i, w in enumerate(writers)
        ]
    )
    assert g.sizes == [7]
    for i, (w, got) in enumerate(zip(writers, out, strict=True)):
        want = [2] if i % 2 else [2, 3, 4]
        assert not isinstance(got, Exception), got
        assert [r.seq for r in (got if isinstance(got, list) else [got])] == want
        assert [r[0] for r in _records(store, w.session_id)] == [1, *want]
        assert {r[2] for r in _records(store, w.session_id)} == {w.epoch}
        assert store.ledger.tip(w.session_id) == want[-1]
    stats = store.statement_stats()
    if store.ledger.db.dialect.serialized_writes:  # merged into the backend's group commit
        assert stats["ledger_append"]["calls"] - before == 8
        assert stats["ledger_append"]["grouped"] >= 7
    else:  # one group transaction beside the blocker's own
        assert stats["ledger_append_group"]["calls"] == 1
    for i, w in enumerate(writers):  # the catalog folded each member's records
        assert store.ledger.catalog.read_meta(w.session_id).last_journal_seq == (2 if i % 2 else 4)


def test_a_failing_commit_fails_every_member_and_acknowledges_none(store, monkeypatch):
    """Every COMMIT fails while the group is queued: each member (run as a
    group, then alone) gets the error, none is acknowledged, nothing of theirs
    is stored: a caller is answered only after the commit that holds its
    records."""
    writers = [_writer(store, f"s{i}") for i in range(5)]
    g = Grouped(store, monkeypatch)
    if store.ledger.db.dialect.serialized_writes:
        from turnkeeper.storage.duck import tx as duck_tx

        def failing(cursor: Any) -> Any:
            raise duckdb.IOException("injected: the COMMIT's write failed")

        monkeypatch.setattr(duck_tx, "commit", failing)
    else:
        from turnkeeper.storage.postgres import db as pg_db

        monkeypatch.setattr(pg_db.Tx, "commit_statement", lambda self: "SELECT 1/0")
    out = g.run([lambda w=w: w.append("turn", b"x", "a") for w in writers])
    assert g.sizes[0] == 5  # then smaller groups (DuckDB splits a failed group) or each alone
    for w, got in zip(writers, out, strict=True):
        assert isinstance(got, DatabaseError), got
        assert _records(store, w.session_id) == [(1, f"fence:{w.epoch}:1", w.epoch)]
    monkeypatch.undo()
    for w in writers:  # the writers are still usable and start where they were
        assert w.append("turn", b"x", "a").seq == 2


def test_one_members_lost_lease_or_bad_input_fails_only_that_member(store, monkeypatch):
    """In one group: a writer whose lease was released (``LeaseLostError``,
    recorded in ``fence_events``) and one reusing an id for other content
    (``LedgerIdempotencyConflictError``) get their own errors and write
    nothing; the other members are written."""
    writers = [_writer(store, f"s{i}") for i in range(6)]
    writers[4].append("turn", b"first", "dup")
    store.leases.release(writers[1].lease)
    g = Grouped(store, monkeypatch)
    out = g.run(
        [
            (lambda w=w: w.append("turn", b"other", "dup"))
            if i == 4
            else (lambda w=w: w.append("turn", b"x", "a"))
            for i, w in enumerate(writers)
        ]
    )
    assert g.sizes == [6]
    assert isinstance(out[1], LeaseLostError)
    assert isinstance(out[4], LedgerIdempotencyConflictError) and out[4].seq == 2
    assert writers[1].state == "fenced"
    assert [r[0] for r in _records(store, "s1")] == [1]
    assert [r[0] for r in _records(store, "s4")] == [1, 2]
    for i in (0, 2, 3, 5):
        assert out[i].seq == 2 and not out[i].duplicate
        assert [r[1] for r in _records(store, f"s{i}")][1:] == ["a"]
    events = store.query(
        "SELECT target, operation FROM fence_events WHERE target = 'session:s1'", []
    ).to_pylist()
    assert events == [{"target": "session:s1", "operation": "ledger_append"}]


def _stale_in_a_group(store: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], Any]:
    """A group of three fresh writers and one stale writer of ``stale``
    (its lease released, a new owner's writer opened since: epoch 2 fenced)."""
    old = _writer(store, "stale", "old")
    store.leases.release(old.lease)
    new = store.ledger.open("stale", store.leases.acquire("session:stale", "new", TTL))
    assert new.epoch > old.epoch
    fresh = [_writer(store, f"s{i}") for i in range(3)]
    g = Grouped(store, monkeypatch)
    out = g.run(
        [lambda: old.append("turn", b"stale", "late")]
        + [lambda w=w: w.append("turn", b"x", "a") for w in fresh]
    )
    assert g.sizes == [4]
    for got in out[1:]:
        assert got.seq == 2
    return out, new


def test_a_stale_writer_in_a_group_is_refused_by_its_lease_fence(store, monkeypatch):
    out, _ = _stale_in_a_group(store, monkeypatch)
    assert isinstance(out[0], LeaseLostError)
    assert [r[1] for r in _records(store, "stale")] == ["fence:1:1", "fence:2:2"]


def _pass_every_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        leases, "fence_many", lambda tx, held: [tx.clock_after_locks() for _ in held]
    )


def test_control_without_the_lease_fence_the_ledger_epoch_fence_still_refuses(store, monkeypatch):
    """The group's lease fence patched out: the ledger's own epoch fence
    (``journal.check_epoch``, judged with the tip row locked) still refuses."""
    _pass_every_lease(monkeypatch)
    out, _ = _stale_in_a_group(store, monkeypatch)
    assert isinstance(out[0], LeaseLostError)
    assert "fenced by epoch 2" in str(out[0])
    assert [r[1] for r in _records(store, "stale")] == ["fence:1:1", "fence:2:2"]


def test_control_without_both_fences_a_stale_writers_record_lands(store, monkeypatch):
    """Both of the group's fences patched out: the stale writer's record lands
    after the new epoch's fence (seq 3, epoch 1): the fences are what refuse it."""
    _pass_every_lease(monkeypatch)
    monkeypatch.setattr(journal, "check_epoch", lambda sid, lease, epoch: None)
    out, _ = _stale_in_a_group(store, monkeypatch)
    assert out[0].seq == 3
    assert _records(store, "stale")[-1] == (3, "late", 1)
