"""Real threads on top of the deterministic tests: fencing under contention."""

from __future__ import annotations

import random
import threading
import time

import turnkeeper
from turnkeeper import BusyError, EntryKind, LeaseLostError


def test_entries_epochs_never_go_backwards_under_racing_stalled_writers(real_store):
    store = real_store
    sessions = [f"s{i}" for i in range(3)]
    for sid in sessions:
        store.create_session(sid)
    stop = time.monotonic() + 3.0
    refused: list[str] = []
    accepted: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        rng = random.Random(n)
        i = 0
        while time.monotonic() < stop:
            sid = rng.choice(sessions)
            try:
                lease = store.acquire_lease(f"session:{sid}", f"w{n}", 0.15)
            except BusyError:
                time.sleep(0.002)
                continue
            tag = f"w{n}-{i}"
            i += 1
            if rng.random() < 0.25:
                time.sleep(0.2)  # stall past the TTL, then try to write anyway
            try:
                store.append(
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
            store.release_lease(lease)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert accepted and refused, (len(accepted), len(refused))
    stored: list[str] = []
    for sid in sessions:
        entries = store.entries(sid)
        epochs = [e.lease_epoch for e in entries]
        assert epochs == sorted(epochs), f"{sid}: a stale epoch wrote after a newer one"
        stored += [e.payload["message"]["content"] for e in entries]
    assert sorted(stored) == sorted(accepted)
    assert not set(refused) & set(stored)
    fenced = store.query("SELECT count(*) AS n FROM fence_events").to_pylist()[0]["n"]
    assert fenced == len(refused)


def test_many_threads_one_target_never_two_valid_holders(real_store):
    """Every lease any thread was granted: at no check do two different epochs validate."""
    store = real_store
    granted: list[turnkeeper.Lease] = []
    lock = threading.Lock()
    deadline = time.monotonic() + 30.0
    violations: list[tuple[int, int]] = []

    def running() -> bool:  # until 20 grants (or a generous deadline on a slow machine)
        with lock:
            return len({g.epoch for g in granted}) < 20 and time.monotonic() < deadline

    def worker(n: int) -> None:
        while running():
            try:
                lease = store.acquire_lease("hot", f"w{n}", 0.05)
            except BusyError:
                continue
            with lock:
                granted.append(lease)
            # Re-acquire once (the same epoch), then let the lease lapse so that
            # another worker takes it over: a holder that kept re-acquiring would
            # keep it for the whole test on an idle machine.
            time.sleep(0.01)
            try:
                again = store.acquire_lease("hot", f"w{n}", 0.05)
            except BusyError:
                continue
            with lock:
                granted.append(again)
            time.sleep(0.06)

    def checker() -> None:
        while running():
            with lock:
                recent = granted[-5:]
            valid = set()
            for lease in recent:
                try:
                    store.validate_lease(lease)
                    valid.add(lease.epoch)
                except LeaseLostError:
                    pass
            if len(valid) > 1:
                violations.append(tuple(sorted(valid)))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=checker))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    owners: dict[int, set[str]] = {}
    for lease in granted:  # a re-acquire by the holder returns the same epoch
        owners.setdefault(lease.epoch, set()).add(lease.owner)
    assert len(owners) >= 5
    assert all(len(o) == 1 for o in owners.values()), owners
    assert sorted(owners) == list(range(1, max(owners) + 1))
    assert violations == []
