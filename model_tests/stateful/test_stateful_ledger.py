"""Run the differential ledger machine over every backend: the shipped one
(``turnkeeper.fuzz.ledger``) with the test suite's damage rules
(``ledger_damage``: raw writes, never shipped). Show it catches a stale
writer's append with the append fences patched out, a stale writer's GC with
GC's lease check patched out, an acknowledged blob lost to a GC whose lease
lapsed mid-delete with the writer's check of GC's condemned blobs patched
out, an unverified blob with replay's hash check patched out, and a replay
past a missing record with replay's gap check patched out."""

from __future__ import annotations

import importlib

import pytest
from by_hand import Steps
from conftest import BACKENDS, STORES, machine_settings
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from ledger_damage import make_machine

from turnkeeper import TransactionConflictError
from turnkeeper.storage.ops.ledger import blobs, condemn, gc, journal


def _fails_with(*texts: str) -> None:
    """Run the DuckDB machine and require a failure whose message holds one
    of ``texts`` (alone, or among the distinct failures Hypothesis groups)."""
    try:
        run_state_machine_as_test(
            make_machine("duckdb"),
            # no shrinking: the control needs the failure, not its smallest form
            settings=settings(max_examples=200, database=None, phases=[Phase.generate]),
        )
    except Exception as failure:  # an assertion, a typed error from replay, or a group
        found = failure.exceptions if isinstance(failure, ExceptionGroup) else (failure,)
        assert any(t in str(f) for f in found for t in texts), failure
    else:
        raise AssertionError(f"the machine passed; expected one of {texts!r}")


@pytest.mark.parametrize("backend", STORES)
def test_the_ledger_agrees_with_its_oracle(backend: str) -> None:
    run_state_machine_as_test(make_machine(backend), settings=machine_settings(backend))


def test_the_machine_fails_with_the_append_fences_patched_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(journal.leases, "fence", lambda tx, lease: tx.clock_after_locks())
    monkeypatch.setattr(journal, "check_epoch", lambda session_id, lease, epoch: None)
    # GC judges its lease by the same fence, and replay checks each record's
    # epoch against its fence's: whichever sees the stale write first
    _fails_with(
        "a stale writer's append was taken",
        "a stale writer's GC ran",
        "but the fence before it is epoch",
    )


def test_the_machine_fails_with_the_gc_lease_check_patched_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gc, "writer_fence", lambda tx, tenant, session_id, lease: None)
    _fails_with("a stale writer's GC ran")


def test_the_machine_fails_with_the_condemned_blob_check_patched_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(condemn, "refuse_condemned", lambda session_id, new, marked: None)
    _fails_with("GC deleted an acknowledged record's blob")


def test_the_machine_fails_with_the_blob_hash_check_patched_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(blobs, "blob_hash_ok", lambda want, got: True)
    _fails_with("replay yielded a damaged blob")


def test_the_machine_fails_with_the_replay_gap_check_patched_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the module (the package's ``replay`` attribute is its function)
    replay = importlib.import_module("turnkeeper.storage.ops.ledger.replay")
    monkeypatch.setattr(replay, "in_sequence", lambda seq, expected: True)
    # a missing fence record also leaves its successors under no fence: the
    # epoch check then names the wrong error for the gap
    _fails_with("replay yielded past a truncated record", "a truncated record gave the wrong error")


def append_ambiguously_then_retry(m: Steps) -> None:
    """Appends that commit while the writer sees a lost connection: each
    retry gives the acknowledged sequences back as duplicates (one of a batch
    already stored), a stale writer's retry is refused, and replay yields
    every record once."""
    first = m.first_writer()
    m.append_ambiguously(handle=first, entries=[("turn", b"x", "a")])
    m.append_ambiguously(handle=first, entries=[("turn", b"x", "a"), ("step", b"", "b")])
    second = m.take_over()
    m.append_ambiguously(handle=first, entries=[("turn", b"\x00\xff", "c")])  # stale: refused
    m.append_ambiguously(handle=second, entries=[("turn", b"\x00\xff", "c")])


def drop_the_idempotency_lookup(mp: pytest.MonkeyPatch) -> None:
    """The append's idempotency: no record is found under an entry's id (a
    retry appends the entry again, which the unique index on the id refuses:
    every attempt a conflict, ``TransactionConflictError``)."""
    real = journal.sequence

    def sequence(session_id, tip, entries, known, logical=()):
        return real(session_id, tip, entries, {}, logical)

    mp.setattr(journal, "sequence", sequence)


def _replay_from_scratch(backend: str, script) -> None:
    """``replay`` without the machine's ``@initialize`` (the script opens the
    first writer itself, to hold its handle)."""
    machine = make_machine(backend)()
    try:
        script(Steps(machine))
    finally:
        machine.teardown()


@pytest.mark.parametrize("backend", BACKENDS)
def test_ambiguous_appends_retry_as_the_oracle_says(backend: str) -> None:
    _replay_from_scratch(backend, append_ambiguously_then_retry)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ambiguous_append_fails_with_the_idempotency_lookup_patched_out(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_the_idempotency_lookup(monkeypatch)
    with pytest.raises(TransactionConflictError, match="ledger_append"):
        _replay_from_scratch(backend, append_ambiguously_then_retry)
