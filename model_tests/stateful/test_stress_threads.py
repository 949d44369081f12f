"""Real threads on top of the deterministic tests: fencing under contention.

The threads run until they have done a set amount of work (writes accepted and
refused, epochs granted), however long a loaded machine takes; the time limits
are hang guards that fail the test, never what ends a run."""

from __future__ import annotations

import random
import threading
import time

import turnkeeper
from turnkeeper import BusyError, EntryKind, LeaseLostError

HANG_GUARD_S = 300.0

MIN_ACCEPTED = 12
MIN_REFUSED = 6
"""Writes the racing writers must have had accepted and refused before they stop."""

MIN_EPOCHS = 20
"""Grants of the hot target before its racing threads stop."""


def test_entries_epochs_never_go_backwards_under_racing_stalled_writers(real_store):
    store = real_store
    sessions = [f"s{i}" for i in range(3)]
    for sid in sessions:
        store.sessions.create(sid)
    give_up = time.monotonic() + HANG_GUARD_S
    refused: list[str] = []
    accepted: list[str] = []
    lock = threading.Lock()

    def running() -> bool:  # until enough of both (a 3 s run saw none accepted on a loaded machine)
        with lock:
            enough = len(accepted) >= MIN_ACCEPTED and len(refused) >= MIN_REFUSED
        return not enough and time.monotonic() < give_up

    def worker(n: int) -> None:
        rng = random.Random(n)
        i = 0
        while running():
            sid = rng.choice(sessions)
            try:
                lease = store.leases.acquire(f"session:{sid}", f"w{n}", 0.15)
            except BusyError:
                time.sleep(0.002)
                continue
            tag = f"w{n}-{i}"
            i += 1
            if rng.random() < 0.25:
                time.sleep(0.2)  # stall past the TTL, then try to write anyway
            try:
                store.sessions.append(
                    sid,
                    EntryKind.MESSAGE,
                    {"message": {"role": "user", "content": tag}},
                    lease=lease,
                )
                with lock:
                    accepted.append(tag)
            except LeaseLostError:
                with lock:
                    refused.append(tag)
            store.leases.release(lease)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(accepted) >= MIN_ACCEPTED and len(refused) >= MIN_REFUSED, (
        f"hang guard: {len(accepted)} accepted, {len(refused)} refused after {HANG_GUARD_S} s"
    )
    stored: list[str] = []
    for sid in sessions:
        entries = store.sessions.entries(sid)
        epochs = [e.lease_epoch for e in entries]
        assert epochs == sorted(epochs), f"{sid}: a stale epoch wrote after a newer one"
        stored += [e.payload["message"]["content"] for e in entries]
    assert sorted(stored) == sorted(accepted)
    assert not set(refused) & set(stored)
    fenced = store.query("SELECT count(*) AS n FROM fence_events").to_pylist()[0]["n"]
    assert fenced == len(refused)


def test_many_threads_one_target_never_two_valid_holders(real_store):
    """Every lease any thread was granted: no lease validates after a lease of a
    newer epoch has (the checker validates the newest first: a lease validated
    earlier may have expired since, so only that order proves two holders)."""
    store = real_store
    granted: list[turnkeeper.Lease] = []
    lock = threading.Lock()
    give_up = time.monotonic() + HANG_GUARD_S
    violations: list[tuple[int, int]] = []

    def running() -> bool:  # until MIN_EPOCHS grants (the guard only catches a hang)
        with lock:
            return len({g.epoch for g in granted}) < MIN_EPOCHS and time.monotonic() < give_up

    def worker(n: int) -> None:
        while running():
            try:
                lease = store.leases.acquire("hot", f"w{n}", 0.05)
            except BusyError:
                continue
            with lock:
                granted.append(lease)
            # Re-acquire once (the same epoch), then let the lease lapse so that
            # another worker takes it over: a holder that kept re-acquiring would
            # keep it for the whole test on an idle machine.
            time.sleep(0.01)
            try:
                again = store.leases.acquire("hot", f"w{n}", 0.05)
            except BusyError:
                continue
            with lock:
                granted.append(again)
            time.sleep(0.06)

    def checker() -> None:
        while running():
            with lock:
                recent = granted[-5:]
            violations.extend(older_valid_after_newer(store, recent))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=checker))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    owners: dict[int, set[str]] = {}
    for lease in granted:  # a re-acquire by the holder returns the same epoch
        owners.setdefault(lease.epoch, set()).add(lease.owner)
    assert len(owners) >= MIN_EPOCHS, f"hang guard: {len(owners)} epochs in {HANG_GUARD_S} s"
    assert all(len(o) == 1 for o in owners.values()), owners
    assert sorted(owners) == list(range(1, max(owners) + 1))
    assert violations == []


def older_valid_after_newer(
    store: turnkeeper.BaseStore, leases: list[turnkeeper.Lease]
) -> list[tuple[int, int]]:
    """Validate one of ``leases`` per epoch, the newest epoch first; each
    ``(older, newer)`` epoch pair where the older validated after the newer
    did. Once a newer epoch was granted an older one never validates again,
    so any pair is two holders at once. (Validated the other way round, an
    older lease that was valid and lapsed before the newer was granted would
    look like one: a loaded machine pauses the checker between two checks.)"""
    newest = {lease.epoch: lease for lease in leases}
    found: list[tuple[int, int]] = []
    valid: list[int] = []
    for epoch in sorted(newest, reverse=True):
        try:
            store.leases.validate(newest[epoch])
        except LeaseLostError:
            continue
        found += [(epoch, newer) for newer in valid]
        valid.append(epoch)
    return found


def test_the_check_finds_an_older_lease_valid_after_a_newer_one(store, clock, monkeypatch):
    """Control for the checker: with the fence patched to pass any lease, the
    lost epoch validates after the newer one, and the check reports the pair."""
    from turnkeeper.storage.ops import leases

    old = store.leases.acquire("hot", "w0", 5)
    clock.advance(6)
    new = store.leases.acquire("hot", "w1", 5)
    assert older_valid_after_newer(store, [old, new]) == []
    monkeypatch.setattr(leases, "fence", lambda tx, lease: None)
    assert older_valid_after_newer(store, [old, new]) == [(old.epoch, new.epoch)]
