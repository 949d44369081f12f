"""DuckDB: a renewal or a release (which skip the write lock) that commits after
a write's snapshot was taken, but before that write holds the lease's target.

The write must not act on the lease row as its snapshot shows it. DuckDB 2.0.1
also loses the other transaction's update when a transaction updates a row
with ``RETURNING`` (on a table with a primary key): a fence written over such
a renewal put the old expiry back (the owner's lease silently shortened), one
written over a release made the lease held again, and the write committed
after the release had returned. The fences on DuckDB are reads, which lose
nothing but would pass on the stale row. The store answers with a conflict
(the write runs again on a fresh snapshot), so each test here must see the
renewal kept, or the release win and the write refused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKENDS, open_backend, through_pooler

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.storage.duck import db as duck_db
from turnkeeper.storage.duck import tx as duck_tx

MSG = {"message": {"role": "user", "content": "hi"}}


def _between_snapshot_and_hold(
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    action: Callable[[], Any],
    snapshots: list[bool] | None = None,
) -> list[Any]:
    """Run ``action`` in another thread, once: the first time a transaction that
    has taken its snapshot goes to hold ``target`` (with ``snapshots`` given:
    the first time any transaction does, noting there whether it had taken
    its snapshot). Returns what ``action`` returned."""
    done: list[Any] = []
    hold = duck_db.Tx.hold

    def hold_after(self: duck_db.Tx, held: str) -> None:
        if held == target and not done and (self._snapshot or snapshots is not None):
            if snapshots is not None:
                snapshots.append(self._snapshot)
            done.append(None)
            worker = threading.Thread(target=lambda: done.__setitem__(0, action()))
            worker.start()
            worker.join()
        hold(self, held)

    monkeypatch.setattr(duck_db.Tx, "hold", hold_after)
    return done


def _fenced_writes(
    store: turnkeeper.BaseStore, sid: str, lease: turnkeeper.Lease
) -> dict[str, Callable[[], Any]]:
    """Writes under ``lease`` whose transaction reads before it holds the target."""
    return {
        "append with its own id": lambda: store.sessions.append(
            sid, EntryKind.MESSAGE, MSG, lease=lease, entry_id="chosen"
        ),
        "append": lambda: store.sessions.append(sid, EntryKind.MESSAGE, MSG, lease=lease),
        "append_many": lambda: store.sessions.append_many(
            sid, [(EntryKind.MESSAGE, MSG), (EntryKind.MESSAGE, MSG)], lease=lease
        ),
        "admit_run": lambda: store.runs.admit(sid, {"input": "x"}, lease=lease),
        "branch": lambda: store.sessions.branch(sid, store.sessions.get(sid).leaf_id, lease=lease),
    }


WRITES = ["append with its own id", "append", "append_many", "admit_run", "branch"]
AFTER_SNAPSHOT = {"branch"}
"""The writes that hold the target after their first statement (the snapshot):
the held target's check (``stale_since``) is what sees a renewal or release
committed in between. The others hold it before any statement (their first
read carries the fence, ``leases.fenced_read``), so nothing can commit between."""


def _lease_row(store: turnkeeper.BaseStore, target: str) -> dict[str, Any]:
    row = store.query(
        "SELECT state, expires_at, epoch FROM leases WHERE target = ?", [target]
    ).to_pylist()
    return dict(row[0])


@pytest.fixture
def leased(duck_store: turnkeeper.DuckDBStore, clock: Any) -> tuple[str, turnkeeper.Lease]:
    sid = duck_store.sessions.create().id
    duck_store.sessions.append(sid, EntryKind.MESSAGE, MSG)
    lease = duck_store.leases.acquire(f"session:{sid}", "worker", 30, purpose="execution")
    clock.advance(5)  # a renewal now moves the expiry
    return sid, lease


@pytest.mark.parametrize("write", WRITES)
@pytest.mark.parametrize("between", ["renewal", "release"])
def test_a_lease_write_committed_after_the_snapshot_is_seen(
    duck_store: turnkeeper.DuckDBStore,
    leased: tuple[str, turnkeeper.Lease],
    monkeypatch: pytest.MonkeyPatch,
    between: str,
    write: str,
) -> None:
    """A renewal in between is kept (the write commits, the expiry is the
    renewed one); a release in between wins (the write is refused, nothing of
    it is stored, the lease stays released)."""
    sid, lease = leased
    before = duck_store.sessions.get(sid)
    renew = between == "renewal"
    snapshots: list[bool] = []
    done = _between_snapshot_and_hold(
        monkeypatch,
        lease.target,
        (lambda: duck_store.leases.renew(lease, 30))
        if renew
        else (lambda: duck_store.leases.release(lease)),
        snapshots,
    )
    if renew:
        _fenced_writes(duck_store, sid, lease)[write]()
        assert snapshots == [write in AFTER_SNAPSHOT]
        assert done and done[0].expires_at > lease.expires_at
        row = _lease_row(duck_store, lease.target)
        assert (row["state"], row["expires_at"]) == ("held", done[0].expires_at)
        return
    with pytest.raises(turnkeeper.LeaseLostError):
        _fenced_writes(duck_store, sid, lease)[write]()
    assert snapshots == [write in AFTER_SNAPSHOT]
    assert done == [True]
    assert _lease_row(duck_store, lease.target)["state"] == "released"
    assert duck_store.sessions.get(sid) == before


def test_control_without_the_check_a_write_commits_after_the_release(
    duck_store: turnkeeper.DuckDBStore,
    leased: tuple[str, turnkeeper.Lease],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tests above can fail: with the check that a held target was not
    written after the snapshot patched out, the fence reads the lease as its
    snapshot shows it, held, and the write commits after the release returned."""
    sid, lease = leased
    first = duck_store.sessions.get(sid).leaf_id
    duck_store.sessions.append(sid, EntryKind.MESSAGE, MSG, lease=lease)
    monkeypatch.setattr(duck_tx, "stale_since", lambda tx, stripe: False)
    released = _between_snapshot_and_hold(
        monkeypatch, lease.target, lambda: duck_store.leases.release(lease)
    )
    duck_store.sessions.branch(sid, first, lease=lease)
    assert released == [True]
    assert duck_store.sessions.get(sid).leaf_id == first


def test_a_renewal_at_the_worst_moment_of_every_attempt_costs_one_retry(
    duck_store: turnkeeper.DuckDBStore,
    leased: tuple[str, turnkeeper.Lease],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A heartbeat that renews between the snapshot and the hold of every
    attempt (attack helper: renewals at millisecond rates starved fenced
    writes into TransactionConflictError after 40 attempts): the retry holds
    the target before its snapshot, so the write commits on its second."""
    sid, lease = leased
    renewals: list[turnkeeper.Lease] = []
    holding: list[duck_db.Tx] = []  # transactions that hold the target already
    hold = duck_db.Tx.hold

    def hold_after(self: duck_db.Tx, held: str) -> None:
        if held != lease.target or any(t is self for t in holding):
            hold(self, held)
            return
        if self._snapshot:
            worker = threading.Thread(
                target=lambda: renewals.append(duck_store.leases.renew(lease, 30))
            )
            worker.start()
            worker.join()
        hold(self, held)
        holding.append(self)

    first = duck_store.sessions.get(sid).leaf_id
    duck_store.sessions.append(sid, EntryKind.MESSAGE, MSG, lease=lease)
    monkeypatch.setattr(duck_db.Tx, "hold", hold_after)
    duck_store.sessions.branch(sid, first, lease=lease)
    assert len(renewals) == 1
    assert duck_store.statement_stats()["branch"]["retries"] == 1
    assert _lease_row(duck_store, lease.target)["expires_at"] == renewals[0].expires_at


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_injected_clock_is_read_after_the_transaction_snapshot(
    backend: str, tmp_path: Path
) -> None:
    """Both backends. Read before the snapshot, an injected clock's now could
    predate a commit the transaction then sees (attack helper: a grant queued
    in a group was stamped before the release it followed, and the audit
    failed on a correct history). A transaction whose first need is its now
    runs a statement first: BEGIN and that one have run when the clock is read."""
    statements_at_read: list[int] = []
    current: list[Any] = []

    def clock() -> datetime:
        if current:
            statements_at_read.append(current[0].statements)
        return datetime(2026, 1, 1, tzinfo=UTC)

    store = open_backend(backend, tmp_path, clock)
    try:
        store.db.write("clock_read", lambda tx: current.append(tx) or tx.now)
    finally:
        store.close()
    pinned = backend == "postgres" and through_pooler()  # BEGIN's search_path pin
    assert statements_at_read == [2 + pinned]


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "control-unchecked"])
def test_a_release_before_a_merged_groups_hold_refuses_its_append(
    duck_store: turnkeeper.DuckDBStore,
    leased: tuple[str, turnkeeper.Lease],
    monkeypatch: pytest.MonkeyPatch,
    checked: bool,
) -> None:
    """Group commit: a write queued first takes the group's snapshot, then two
    plain appends run merged and hold their targets; a release of the first
    one's lease in between is seen (the group splits, and that append alone is
    refused). The control, with the check patched out, shows the merged fence
    reading the stale row and the append committing after the release."""
    from test_group_commit import queued_together

    sid, lease = leased
    other = duck_store.sessions.create().id
    other_lease = duck_store.leases.acquire(f"session:{other}", "worker", 30, purpose="execution")
    if not checked:
        monkeypatch.setattr(duck_tx, "stale_since", lambda tx, stripe: False)
    released = _between_snapshot_and_hold(
        monkeypatch, lease.target, lambda: duck_store.leases.release(lease)
    )
    got = queued_together(
        duck_store,
        [
            lambda: duck_store.sessions.create(),
            lambda: duck_store.sessions.append(sid, EntryKind.MESSAGE, MSG, lease=lease),
            lambda: duck_store.sessions.append(other, EntryKind.MESSAGE, MSG, lease=other_lease),
        ],
    )
    assert released == [True]
    kinds = [type(g).__name__ for g in got]
    assert kinds == ["Session", "LeaseLostError" if checked else "Entry", "Entry"], got
