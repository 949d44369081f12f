"""Run the differential lease/thread-record machine over every backend."""

from __future__ import annotations

import pytest
from by_hand import replay
from conftest import BACKENDS, STORES, machine_settings, opener
from hypothesis.stateful import run_state_machine_as_test

from turnkeeper import FinalizeRequest, ThreadRecord
from turnkeeper.fuzz.leases import LeaseAndThreadMachine, machine
from turnkeeper.fuzz.oracle import Oracle
from turnkeeper.storage.ops import leases


def make_machine(backend: str) -> type[LeaseAndThreadMachine]:
    """The machine on the test store configuration ``backend`` (``conftest.opener``)."""
    return machine(opener(backend))


@pytest.mark.parametrize("backend", STORES)
def test_store_agrees_with_oracle_and_invariants_hold(backend: str) -> None:
    run_state_machine_as_test(make_machine(backend), settings=machine_settings(backend))


@pytest.mark.parametrize("tie", [False, True], ids=["archived-apart", "archived-at-once"])
def test_the_oracle_resolves_a_key_with_every_record_archived_as_the_store_does(
    store, clock, tie: bool
) -> None:
    """The oracle's resolve by key with include_archived when no record of
    the key is active: the one archived last (updated_at, then created_at,
    then the greatest id), as the store (the seed's Resolve). The machine
    found the oracle answering ("none",) where the store gave the archived
    record (CI, through PgBouncer: finalize r2 for k1, finalize r1 for k2
    archiving r2, resolve k1 with include_archived)."""
    oracle = Oracle()

    def finalize(rid: str, key: str, previous: str | None = None) -> None:
        req = FinalizeRequest(
            ThreadRecord(rid, key, state={}),
            previous_id=previous,
            archive_old=previous is not None,
            rebind_active=True,
        )
        store.threads.finalize(req)
        oracle.finalize(rid, key, [], previous, previous is not None, True, False, clock())

    def agree(key: str) -> tuple:
        found = store.threads.resolve(key=key, include_archived=True)
        got = ("none",) if found is None else ("record", found.id, found.key, found.status)
        assert got == oracle.resolve(None, key, True)
        return got

    finalize("r2", "k1")
    clock.advance(1)
    finalize("r3", "k1")  # archives r2 (a rebind)
    if not tie:
        clock.advance(1)
    finalize("r1", "k2", previous="r3")  # archives r3: k1 has no active record
    assert agree("k1")[:2] == ("record", "r3")  # created after r2: it wins a tie too
    assert agree("k2")[:2] == ("record", "r1")
    assert agree("k9") == ("none",)


def acquire_renew_release_each_ambiguously(m) -> None:
    """Each lease write commits and its caller sees a lost connection; each
    retry is the oracle's: the acquire's retry re-acquires the epoch it was
    granted, the renewal's renews it again, the release's is a no-op."""
    held = m.acquire_ambiguously(owner="A", tgt="session:s1", ttl=2.0, purpose="execution")
    m.renew_ambiguously(held=held, ttl=5.0)
    m.advance_clock(seconds=3.0)
    m.append_under_lease(held=held, session="s1")  # the retried lease fences as the one granted
    m.release_ambiguously(held=held)
    again = m.acquire_ambiguously(owner="B", tgt="session:s1", ttl=1.0, purpose="mutation")
    assert again.lease.epoch == 2, again  # released, then granted anew: a new epoch
    m.advance_clock(seconds=2.0)
    third = m.acquire_ambiguously(owner="B", tgt="session:s1", ttl=1.0, purpose="mutation")
    assert third.lease.epoch == 3, third  # expired, then taken anew: a new epoch


def drop_the_reacquire(mp: pytest.MonkeyPatch) -> None:
    """The acquire's idempotency: the holder's re-acquire, decided as if by
    another owner (so a retry of a committed grant is refused as busy)."""
    real = leases._MACHINE

    class NoReacquire:
        def decide(self, trigger: str, source: str, facts: dict):
            if trigger == "acquire" and facts.get("same_owner"):
                facts = {**facts, "same_owner": False, "token_matches": False}
            return real.decide(trigger, source, facts)

        def __getattr__(self, name: str):
            return getattr(real, name)

    mp.setattr(leases, "_MACHINE", NoReacquire())


@pytest.mark.parametrize("backend", BACKENDS)
def test_ambiguous_lease_writes_retry_as_the_oracle_says(backend: str) -> None:
    replay(make_machine(backend), acquire_renew_release_each_ambiguously)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ambiguous_acquire_fails_with_the_reacquire_patched_out(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_the_reacquire(monkeypatch)
    with pytest.raises(AssertionError, match="the retry of a committed acquire"):
        replay(make_machine(backend), acquire_renew_release_each_ambiguously)
