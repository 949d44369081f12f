"""Run the differential lease/thread-record machine over every backend."""

from __future__ import annotations

import pytest
from conftest import STORES, machine_settings
from hypothesis.stateful import run_state_machine_as_test
from oracle import Oracle
from stateful_leases import make_machine

from turnkeeper import FinalizeRequest, ThreadRecord


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
