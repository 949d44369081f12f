"""Guards a mutation test broke with every test still green, each pinned by a
fixed test of its behaviour, on both backends (issue 17, item 10).

Each check is a function that raises ``AssertionError`` when the behaviour
breaks; a ``test_…`` runs it on the real store, and a kill test patches the
guard out (monkeypatch, in the test only) and asserts that the same check
then fails:

- recovery's epoch check (``recovery._held``): a worker with a newer
  recovery lease cannot converge, fail or detach a recovery it never began;
- ``recovery.begin`` again under the same lease returns the recovery, it
  does not restart it (the ``superseded`` guard);
- a second store object, or process, under the same owner name does not get
  the live lease (the ``token_matches`` guard of ``reacquire``);
- ``runs.admit(retry_of=…)`` refuses a run of another session;
- a read-only open refuses an older schema (``BaseStore._check_schema``);
- a delivery update carrying an old claim epoch of the same owner is refused
  (``outbox._fence``).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import forge, new_pg_schema

import turnkeeper
from turnkeeper import (
    BusyError,
    DeliveryPlan,
    DeliveryStep,
    LeaseLostError,
    RetryNotAllowedError,
    SchemaVersionError,
)
from turnkeeper.fuzz import FakeClock
from turnkeeper.spec import LEASE, RECOVERY, errors
from turnkeeper.storage.ops import outbox, outbox_plans, recovery, run_admission
from turnkeeper.storage.store import BaseStore

USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}

E = TypeVar("E", bound=BaseException)


def raised(kind: type[E], call: Callable[[], Any]) -> E:
    """The ``kind`` error ``call`` raised; ``AssertionError`` when it was accepted."""
    try:
        got = call()
    except kind as exc:
        return exc
    raise AssertionError(f"expected {kind.__name__}, the call was accepted: {got!r}")


def orphan(store: turnkeeper.BaseStore) -> turnkeeper.Run:
    """A running run of session ``s`` that nobody holds, with a live remote run
    record (so its recovery may be detached)."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER)
    remote = turnkeeper.ResponseRun("s", "bg", "openai", "responses", "queued", run.id)
    store.archives.save_run(dataclasses.replace(remote, response_id="resp-1"))
    return store.runs.start(run.id)


def recovery_events(store: turnkeeper.BaseStore, run_id: str) -> list[str]:
    rows = store.query("SELECT edge FROM recovery_events WHERE run_id = ?", [run_id])
    return sorted(r["edge"] for r in rows.to_pylist())


# -- recovery's epoch: equal, not "not newer" -----------------------------------------------

ENDS: dict[str, Callable[[turnkeeper.BaseStore, str, turnkeeper.Lease], Any]] = {
    "converge": lambda s, run_id, lease: s.recovery.converge(run_id, lease),
    "fail": lambda s, run_id, lease: s.recovery.fail(run_id, lease, "remote down"),
    "detach": lambda s, run_id, lease: s.recovery.detach(run_id, lease),
}
"""Every write on a begun recovery, under the caller's recovery lease."""


def check_a_newer_lease_cannot_end_a_recovery_it_never_began(
    store: turnkeeper.BaseStore, clock: FakeClock, end: str
) -> None:
    run = orphan(store)
    first = store.leases.acquire("session:s", "rec-1", 1, purpose="recovery")
    begun = store.recovery.begin(run.id, first)
    clock.advance(2)  # rec-1 died; rec-2 takes a recovery lease and skips begin_recovery
    newer = store.leases.acquire("session:s", "rec-2", 600, purpose="recovery")
    assert newer.epoch > begun.lease_epoch
    lost = raised(LeaseLostError, lambda: ENDS[end](store, run.id, newer))
    assert lost.target == "session:s"
    assert store.recovery.get(run.id) == begun
    assert store.runs.get(run.id).status == "running"
    assert recovery_events(store, run.id) == ["begin"]
    # begun under its own lease (a takeover: attempt 2), it ends the recovery
    taken = store.recovery.begin(run.id, newer)
    assert (taken.attempt, taken.lease_epoch) == (2, newer.epoch)
    ENDS[end](store, run.id, newer)
    assert store.recovery.get(run.id).state != "recovering"


@pytest.mark.parametrize("end", sorted(ENDS))
def test_a_newer_recovery_lease_cannot_end_a_recovery_it_never_began(store, clock, end) -> None:
    check_a_newer_lease_cannot_end_a_recovery_it_never_began(store, clock, end)


def held_not_newer(tx: Any, run_id: str, lease: turnkeeper.Lease, trigger: str) -> Any:
    """``recovery._held`` with its epoch check loosened from "equal" to "the
    record's is not newer" (test-only copy)."""
    run = recovery._guarded(tx, run_id, lease)
    rec = recovery.get(tx, run_id)
    if rec is None or rec.state != "recovering":
        state = "absent" if rec is None else rec.state
        raise errors.InvalidTransitionError("recovery", trigger, state)
    if rec.lease_epoch > lease.epoch:
        raise errors.LeaseLostError(lease.target, detail="another worker took the recovery over")
    return run, rec


@pytest.mark.parametrize("end", sorted(ENDS))
def test_the_newer_lease_check_fails_with_the_epoch_check_loosened(
    store, clock, end, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recovery, "_held", held_not_newer)
    with pytest.raises(AssertionError, match="expected LeaseLostError, the call was accepted"):
        check_a_newer_lease_cannot_end_a_recovery_it_never_began(store, clock, end)


# -- begin_recovery again under the same lease ----------------------------------------------


def check_begin_again_under_the_same_lease_returns_the_recovery(
    store: turnkeeper.BaseStore, clock: FakeClock
) -> None:
    run = orphan(store)
    lease = store.leases.acquire("session:s", "rec", 600, purpose="recovery")
    first = store.recovery.begin(run.id, lease)
    clock.advance(1)  # a retry after an unknown commit result, a second later
    again = store.recovery.begin(run.id, lease)
    assert again == first, f"begun again: {again}"
    assert store.recovery.get(run.id) == first
    assert recovery_events(store, run.id) == ["begin"]


def test_begin_recovery_again_under_the_same_lease_returns_the_recovery(store, clock) -> None:
    check_begin_again_under_the_same_lease_returns_the_recovery(store, clock)


def test_the_begin_again_check_fails_when_a_same_epoch_lease_counts_as_superseding(
    store, clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "superseded" loosened from "the record's epoch is older" to "not newer"
    monkeypatch.setitem(RECOVERY.guards, "superseded", (lambda facts: True, "patched"))
    with pytest.raises(AssertionError, match="begun again"):
        check_begin_again_under_the_same_lease_returns_the_recovery(store, clock)


# -- one owner name, two store objects or processes -----------------------------------------


def reopen(store: turnkeeper.BaseStore, clock: FakeClock | None) -> turnkeeper.BaseStore:
    """Another store object on ``store``'s database (its own token secret)."""
    return turnkeeper.open_store(getattr(store.db, "url", store.path), clock=clock)


def lease_rows(store: turnkeeper.BaseStore) -> list[dict[str, Any]]:
    return store.query("SELECT * FROM leases ORDER BY target").to_pylist()


def check_another_store_object_with_the_owner_name_is_busy(
    store: turnkeeper.BaseStore, clock: FakeClock
) -> None:
    store.sessions.create("s")
    held = store.leases.acquire("session:s", "w", 600)
    before = lease_rows(store)
    clock.advance(1)
    with reopen(store, clock) as other:
        busy = raised(BusyError, lambda: other.leases.acquire("session:s", "w", 600))
    assert (busy.target, busy.holder) == ("session:s", "w")
    assert lease_rows(store) == before  # not extended either
    store.leases.validate(held)
    again = store.leases.acquire("session:s", "w", 600)  # its own store object re-acquires
    assert (again.token, again.epoch) == (held.token, held.epoch)


def test_another_store_object_under_the_same_owner_name_does_not_get_the_live_lease(
    store, clock
) -> None:
    check_another_store_object_with_the_owner_name_is_busy(store, clock)


def token_matches_always(mp: pytest.MonkeyPatch) -> None:
    """``reacquire``'s ``token_matches`` guard always true (test-only)."""
    mp.setitem(LEASE.guards, "token_matches", (lambda facts: True, "patched"))


def test_the_other_store_object_check_fails_without_the_token_guard(
    store, clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_matches_always(monkeypatch)
    with pytest.raises(AssertionError, match="expected BusyError, the call was accepted"):
        check_another_store_object_with_the_owner_name_is_busy(store, clock)


ACQUIRER = """
import sys, turnkeeper
if sys.argv[2] == "patched":  # the kill test's patch, made in this process only
    from turnkeeper.spec import LEASE
    LEASE.guards["token_matches"] = (lambda facts: True, "patched")
with turnkeeper.open_store(sys.argv[1]) as store:
    try:
        lease = store.leases.acquire("session:s", "w", 600)
    except turnkeeper.BusyError as busy:
        print("busy", busy.holder)
    else:
        print("granted", lease.epoch)
"""


def acquire_in_another_process(url: str, patched: bool) -> str:
    out = subprocess.run(
        [sys.executable, "-c", ACQUIRER, url, "patched" if patched else "real"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.postgres
@pytest.mark.parametrize("patched", [False, True], ids=["real", "token_guard_patched_out"])
def test_another_process_under_the_same_owner_name_does_not_get_the_live_lease(
    patched: bool,
) -> None:
    """The same on PostgreSQL across processes: ``busy w``; with the guard
    patched out in the other process, it is granted the live lease."""
    url = new_pg_schema()
    with turnkeeper.open_store(url) as store:
        store.sessions.create("s")
        held = store.leases.acquire("session:s", "w", 600)
        got = acquire_in_another_process(url, patched)
        assert got == (f"granted {held.epoch}" if patched else "busy w")
        store.leases.validate(held)


# -- a retry of another session's run -------------------------------------------------------


def check_a_retry_of_another_sessions_run_is_refused(store: turnkeeper.BaseStore) -> None:
    for sid in ("s", "t"):
        store.sessions.create(sid)
    first = store.runs.admit("s", {"q": 1}, user_message=USER)
    store.runs.start(first.id)
    store.runs.finish(first.id, "failed", error="provider down")
    refused = raised(
        RetryNotAllowedError,
        lambda: store.runs.admit("t", {"q": 1}, user_message=USER, retry_of=first.id),
    )
    assert refused.run_id == first.id and "another session" in refused.reason
    assert store.runs.list("t") == [] and store.sessions.entries("t") == []
    # in its own session the same retry is admitted: the refusal was the session's
    retry = store.runs.admit("s", {"q": 1}, user_message=USER, retry_of=first.id)
    assert (retry.attempt, retry.intent_id) == (2, first.intent_id)


def test_admit_run_refuses_a_retry_of_another_sessions_run(store) -> None:
    check_a_retry_of_another_sessions_run_is_refused(store)


def test_the_retry_check_fails_when_the_run_seems_to_be_of_the_admitting_session(
    store, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = run_admission.get

    def in_session_t(tx: Any, run_id: str) -> Any:
        """The session comparison defeated: the failed run (what the retry looks
        up; the steps before it load it running) seems to be of ``t``."""
        run = real(tx, run_id)
        if run is None or run.status != "failed":
            return run
        return dataclasses.replace(run, session_id="t")

    monkeypatch.setattr(run_admission, "get", in_session_t)
    with pytest.raises(
        AssertionError, match="expected RetryNotAllowedError, the call was accepted"
    ):
        check_a_retry_of_another_sessions_run_is_refused(store)


# -- a read-only open of an older schema ----------------------------------------------------


def at_version(backend: str, version: int, tmp_path: Path, mp: pytest.MonkeyPatch) -> str:
    """A store of ``backend`` migrated to schema ``version`` only (its
    migrations patched to the first ``version``, then put back); where it is."""
    from turnkeeper.storage.duck import db as duck_db
    from turnkeeper.storage.postgres import db as pg_db

    database = pg_db.Database if backend == "postgres" else duck_db.Database
    where = new_pg_schema() if backend == "postgres" else str(tmp_path / f"v{version}.duckdb")
    with mp.context() as patch:
        real = database.migrations
        patch.setattr(database, "migrations", lambda self: real(self)[:version])
        with turnkeeper.open_store(where) as store:
            assert store.schema_version() == version
            # the session as that version's turnkeeper wrote it: the columns every
            # version has (today's create writes later versions' columns too)
            forge(
                store,
                "INSERT INTO sessions (id, cwd, created_at, updated_at, leaf_id, title, "
                "entry_count, next_seq, header) VALUES ('old', '', now(), now(), NULL, NULL, "
                "0, 1, '{}')",
                rows=1,
            )
    return where


def open_and_close(where: str) -> str:
    """Open ``where`` read-only; what opened (closed again at once)."""
    with turnkeeper.open_store(where, read_only=True) as store:
        return store.path


def check_a_read_only_open_refuses_an_older_schema(
    backend: str, version: int, tmp_path: Path, mp: pytest.MonkeyPatch
) -> None:
    where = at_version(backend, version, tmp_path, mp)
    refused = raised(SchemaVersionError, lambda: open_and_close(where))
    assert (refused.found, refused.supported) == (version, turnkeeper.SCHEMA_VERSION)
    assert "older schema" in str(refused) and "writable" in str(refused)
    with turnkeeper.open_store(where) as store:  # as the message says: migrated writable
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
        assert store.sessions.get("old") is not None
    with turnkeeper.open_store(where, read_only=True) as store:  # then read-only opens
        assert store.sessions.get("old") is not None


OLDER = [1, turnkeeper.SCHEMA_VERSION - 1]


@pytest.mark.parametrize("version", OLDER)
@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_a_read_only_open_refuses_an_older_schema(
    backend: str, version: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_a_read_only_open_refuses_an_older_schema(backend, version, tmp_path, monkeypatch)


def accepts_an_older_schema(self: BaseStore, tx: Any) -> None:
    """``BaseStore._check_schema`` refusing only a database without a schema
    (test-only: the version comparison loosened)."""
    if not self._found_version(tx):
        raise SchemaVersionError(self.path, 0, turnkeeper.SCHEMA_VERSION, detail="no schema")


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_the_read_only_check_fails_when_an_older_schema_is_accepted(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(BaseStore, "_check_schema", accepts_an_older_schema)
    with pytest.raises(AssertionError, match="expected SchemaVersionError, the call was accepted"):
        check_a_read_only_open_refuses_an_older_schema(backend, OLDER[-1], tmp_path, monkeypatch)


# -- a delivery update under an old claim of the same owner ---------------------------------

UPDATES: dict[str, Callable[[turnkeeper.BaseStore, str, int], Any]] = {
    "update_delivery_progress": lambda s, op, epoch: s.outbox.update_progress(
        op, "w", epoch, provider_message_id="p-1"
    ),
    "finish_delivery": lambda s, op, epoch: s.outbox.finish(
        op, "w", epoch, "delivered", provider_message_id="p-1"
    ),
    "requeue_delivery": lambda s, op, epoch: s.outbox.requeue(op, "w", epoch, delay_s=5),
}
"""Every write fenced by a delivery claim, made by owner ``w`` under ``epoch``."""


def check_an_old_claim_epoch_of_the_same_owner_is_refused(
    store: turnkeeper.BaseStore, clock: FakeClock, update: str
) -> None:
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    plan = DeliveryPlan("chat", "room-1", (DeliveryStep("send", "message"),))
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, delivery_plan=plan)
    (op,) = store.outbox.get_plan(f"{run.id}:delivery")[1]
    old = store.outbox.claim(op.id, "w", 10)
    clock.advance(11)  # w stalled past its claim, and claims the operation again
    current = store.outbox.claim(op.id, "w", 10)
    assert (old.lease_owner, current.lease_owner) == ("w", "w")
    assert current.lease_epoch == old.lease_epoch + 1
    lost = raised(
        errors.DeliveryLeaseLostError, lambda: UPDATES[update](store, op.id, old.lease_epoch)
    )
    assert (lost.operation_id, lost.owner, lost.epoch) == (op.id, "w", old.lease_epoch)
    assert store.outbox.get_operation(op.id) == current
    UPDATES[update](store, op.id, current.lease_epoch)  # the current claim's epoch is taken
    assert store.outbox.get_operation(op.id) != current


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_a_delivery_update_under_an_old_claim_epoch_of_the_same_owner_is_refused(
    store, clock, update: str
) -> None:
    check_an_old_claim_epoch_of_the_same_owner_is_refused(store, clock, update)


def fence_any_epoch(tx: Any, operation_id: str, owner: str, epoch: int) -> Any:
    """``outbox._fence`` with the epoch comparison left out (test-only:
    it is given the operation's current epoch, whatever the caller's)."""
    return REAL_FENCE(tx, operation_id, owner, outbox_plans.load(tx, operation_id).lease_epoch)


REAL_FENCE = outbox._fence


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_the_old_claim_epoch_check_fails_with_the_epoch_comparison_left_out(
    store, clock, update: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox, "_fence", fence_any_epoch)
    with pytest.raises(AssertionError, match="expected DeliveryLeaseLostError, the call was"):
        check_an_old_claim_epoch_of_the_same_owner_is_refused(store, clock, update)
