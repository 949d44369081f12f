"""Run the differential ledger machine (``stateful_ledger``) over every backend,
and show it catches a stale writer's append with the append fences patched out,
a stale writer's GC with GC's lease check patched out, and an unverified blob
with replay's hash check patched out."""

from __future__ import annotations

import pytest
from conftest import BACKENDS
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from stateful_ledger import make_machine

from turnkeeper.storage.ops.ledger import blobs, gc, journal


def _fails_with(text: str) -> None:
    """Run the DuckDB machine and require a failure whose message holds
    ``text`` (alone, or among the distinct failures Hypothesis groups)."""
    try:
        run_state_machine_as_test(
            make_machine("duckdb"), settings=settings(max_examples=200, database=None)
        )
    except AssertionError as failure:
        assert text in str(failure), failure
    except ExceptionGroup as failures:
        assert any(text in str(f) for f in failures.exceptions), failures
    else:
        raise AssertionError(f"the machine passed; expected {text!r}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_ledger_agrees_with_its_oracle(backend: str) -> None:
    run_state_machine_as_test(make_machine(backend))


def test_the_machine_fails_with_the_append_fences_patched_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(journal.leases, "fence", lambda tx, lease: tx.clock_after_locks())
    monkeypatch.setattr(journal, "check_epoch", lambda session_id, lease, epoch: None)
    _fails_with("a stale writer's append was taken")


def test_the_machine_fails_with_the_gc_lease_check_patched_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gc, "writer_fence", lambda tx, tenant, session_id, lease: None)
    _fails_with("a stale writer's GC ran")


def test_the_machine_fails_with_the_blob_hash_check_patched_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(blobs, "blob_hash_ok", lambda want, got: True)
    _fails_with("replay yielded a damaged blob")
