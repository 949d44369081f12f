"""A fenced write judges its lease's expiry after it holds the lease row, never
at a time read before it waited for it.

The scenario (issue 17, item 1): a worker's lease is live when its write starts;
the write then waits for a lock on the lease row (on PostgreSQL another
transaction's row lock; on DuckDB the target's stripe, held by a renewal or a
release in flight) or, in a DuckDB group commit, for the other queued writes
of its group to run; meanwhile the lease expires (and another owner may try to
take it over). The write must be refused with ``LeaseLostError`` and write
nothing, not commit after its lease expired. The same holds for a delivery
claim (``DeliveryLeaseLostError``) and for a re-acquire by the same owner, which
must not revive the expired lease (it is a takeover: a new epoch).

Each test drives the wait deterministically: it takes the lock, starts the
write on a thread, waits until the write is blocked on that lock (PostgreSQL's
``pg_blocking_pids``; a DuckDB stripe wrapped to say when it is contended; a
group's long write that says when it runs), advances the injected clock past
the expiry, and lets go. The one-statement PostgreSQL append, whose condition
on the lease is SQL, is tested on the server's own clock (its expiry is
awaited, not assumed).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import open_backend
from test_group_commit import queued_together

import turnkeeper
from turnkeeper import (
    DeliveryLeaseLostError,
    DeliveryPlan,
    DeliveryStep,
    EntryKind,
    FinalizeRequest,
    LeaseLostError,
    ThreadRecord,
)
from turnkeeper.fuzz import FakeClock
from turnkeeper.storage.duck import db as duck_db

M = EntryKind.MESSAGE
USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}
TTL_S = 5.0
PAST_EXPIRY_S = 10.0


def user(text: str) -> dict[str, Any]:
    return {"message": {"role": "user", "content": text}}


def wait_until(condition: Callable[[], bool], failure: str) -> None:
    """Poll ``condition`` up to 120 s (a hang guard only, no timing assertion)."""
    deadline = time.monotonic() + 120
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(failure)
        time.sleep(0.002)


# -- the fenced writes ------------------------------------------------------------------


@dataclass
class Case:
    """One fenced write: ``arrange(store)`` sets up its lease (and what it
    writes under it) and returns the write to make, the lock it will wait for
    (a ``(table, key column, key)`` row and the lease target), and what the
    store looks like where the write would change it."""

    name: str
    arrange: Callable[[turnkeeper.BaseStore], tuple[Callable[[], Any], Any, Callable[[], Any]]]
    lost: type[Exception] = LeaseLostError
    later: str | None = None
    """A table the write writes after its fence (PostgreSQL: a lock on it,
    held by another transaction, makes the write wait after its judgement)."""


def _session(store: turnkeeper.BaseStore, purpose: str = "execution") -> Any:
    store.sessions.create("s")
    return store.leases.acquire("session:s", "w1", TTL_S, purpose=purpose)


def _lease_row(lease: Any) -> tuple[tuple[str, str, str], str]:
    return ("leases", "target", lease.target), lease.target


def append(store: turnkeeper.BaseStore) -> Any:
    lease = _session(store)
    return (
        lambda: store.sessions.append("s", M, user("late"), lease=lease),
        _lease_row(lease),
        lambda: len(store.sessions.entries("s")),
    )


def append_many(store: turnkeeper.BaseStore) -> Any:
    lease = _session(store)
    return (
        lambda: store.sessions.append_many("s", [(M, user("a")), (M, user("b"))], lease=lease),
        _lease_row(lease),
        lambda: len(store.sessions.entries("s")),
    )


def _running(store: turnkeeper.BaseStore, lease: Any) -> Any:
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease)
    return store.runs.start(run.id, lease=lease)


def finish_run(store: turnkeeper.BaseStore) -> Any:
    lease = _session(store)
    run = _running(store, lease)
    plan = DeliveryPlan("chat", "room", (DeliveryStep("send", "message"),))

    def observe() -> Any:
        ops = store.query("SELECT count(*) AS n FROM delivery_operations").to_pylist()
        return store.runs.get(run.id).status, ops, len(store.sessions.entries("s"))

    return (
        lambda: store.runs.finish(
            run.id, "succeeded", assistant_message=REPLY, lease=lease, delivery_plan=plan
        ),
        _lease_row(lease),
        observe,
    )


def complete_tool_execution(store: turnkeeper.BaseStore) -> Any:
    lease = _session(store)
    store.tools.claim(
        "k", "s", local_turn_id="t", provider_call_id="c1", tool_name="ls",
        side_effecting=False, lease=lease,
    )  # fmt: skip
    return (
        lambda: store.tools.complete("k", {"out": "a.txt"}, lease=lease),
        _lease_row(lease),
        lambda: store.tools.get("k").state,
    )


def renew_lease(store: turnkeeper.BaseStore) -> Any:
    lease = _session(store)

    def observe() -> Any:  # a takeover writes the row: what the renewal alone writes
        return store.query(
            "SELECT count(*) AS n FROM lease_events WHERE edge = 'renew'"
        ).to_pylist()

    return (lambda: store.leases.renew(lease, 60), _lease_row(lease), observe)


def ledger_append(store: turnkeeper.BaseStore) -> Any:
    lease = _session(store)
    writer = store.ledger.open("s", lease)
    return (
        lambda: writer.append("turn", b"late", "late-1"),
        _lease_row(lease),
        lambda: store.ledger.tip("s"),
    )


def validate_lease(store: turnkeeper.BaseStore) -> Any:
    lease = _session(store)
    return (lambda: store.leases.validate(lease), _lease_row(lease), lambda: None)


def finalize(store: turnkeeper.BaseStore) -> Any:
    lease = store.leases.acquire("thread-key:k", "w1", TTL_S)
    request = FinalizeRequest(ThreadRecord(id="r1", key="k"), held_leases=(lease,))
    return (
        lambda: store.threads.finalize(request),
        _lease_row(lease),
        lambda: store.threads.resolve(id="r1"),
    )


def _orphan_and_recovery_lease(store: turnkeeper.BaseStore) -> tuple[Any, Any]:
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    lease = store.leases.acquire("session:s", "rec", TTL_S, purpose="recovery")
    return run, lease


def begin_recovery(store: turnkeeper.BaseStore) -> Any:
    run, lease = _orphan_and_recovery_lease(store)
    return (
        lambda: store.recovery.begin(run.id, lease),
        _lease_row(lease),
        lambda: store.recovery.get(run.id),
    )


def converge_recovery(store: turnkeeper.BaseStore) -> Any:
    run, lease = _orphan_and_recovery_lease(store)
    store.recovery.begin(run.id, lease)
    return (
        lambda: store.recovery.converge(run.id, lease, error="worker lost"),
        _lease_row(lease),
        lambda: (store.runs.get(run.id).status, store.recovery.get(run.id).state),
    )


def _claimed(store: turnkeeper.BaseStore) -> Any:
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    plan = DeliveryPlan("chat", "room", (DeliveryStep("send", "message"),))
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, delivery_plan=plan)
    _, ops = store.outbox.get_plan(f"{run.id}:delivery")
    return store.outbox.claim(ops[0].id, "d1", TTL_S)


def _op_row(op: Any) -> tuple[tuple[str, str, str], None]:
    return ("delivery_operations", "id", op.id), None


def finish_delivery(store: turnkeeper.BaseStore) -> Any:
    op = _claimed(store)
    return (
        lambda: store.outbox.finish(op.id, "d1", op.lease_epoch, "delivered"),
        _op_row(op),
        lambda: store.outbox.get_operation(op.id),
    )


def update_delivery_progress(store: turnkeeper.BaseStore) -> Any:
    op = _claimed(store)
    return (
        lambda: store.outbox.update_progress(op.id, "d1", op.lease_epoch, provider_asset_id="x"),
        _op_row(op),
        lambda: store.outbox.get_operation(op.id),
    )


def requeue_delivery(store: turnkeeper.BaseStore) -> Any:
    op = _claimed(store)
    return (
        lambda: store.outbox.requeue(op.id, "d1", op.lease_epoch, delay_s=1),
        _op_row(op),
        lambda: store.outbox.get_operation(op.id),
    )


LEASED = [
    Case("append", append, later="entries"),
    Case("append_many", append_many, later="entries"),
    Case("finish_run", finish_run, later="delivery_operations"),
    Case("complete_tool_execution", complete_tool_execution, later="tool_execution_events"),
    Case("renew_lease", renew_lease, later="lease_events"),
    Case("validate_lease", validate_lease),
    Case("ledger_append", ledger_append, later="ledger_records"),
    Case("finalize", finalize, later="thread_record_events"),
    Case("begin_recovery", begin_recovery, later="run_recoveries"),
    Case("converge_recovery", converge_recovery, later="run_recoveries"),
]
CLAIMED = [
    Case("finish_delivery", finish_delivery, DeliveryLeaseLostError, "delivery_events"),
    Case(
        "update_delivery_progress",
        update_delivery_progress,
        DeliveryLeaseLostError,
        "delivery_events",
    ),
    Case("requeue_delivery", requeue_delivery, DeliveryLeaseLostError, "delivery_events"),
]


# -- the locks the writes wait for --------------------------------------------------------


class _Contended:
    """A DuckDB stripe lock that says when a thread had to wait for it."""

    def __init__(self, inner: threading.RLock) -> None:
        self.inner = inner
        self.contended = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self.inner.acquire(blocking=False):
            return True
        self.contended.set()
        return self.inner.acquire(blocking, timeout)

    def release(self) -> None:
        self.inner.release()

    def _is_owned(self) -> bool:
        return bool(self.inner._is_owned())  # type: ignore[attr-defined]


class Held:
    """The lock a write will wait for, held by the test until :meth:`release`:
    on PostgreSQL a raw transaction's ``FOR UPDATE`` of the row, on DuckDB the
    lease target's stripe (what a renewal or release in flight holds)."""

    def __init__(
        self,
        store: turnkeeper.BaseStore,
        row: tuple[str, str, str],
        target: Any,
        table: str | None = None,
    ):
        """``table``: on PostgreSQL, lock that whole table against writes
        (``SHARE``) instead of the row."""
        self.store = store
        if store.db.dialect.name == "duckdb":
            targets = store.db._file.targets  # type: ignore[attr-defined]
            stripe = zlib.crc32(target.encode()) % len(targets.locks)
            locks = list(targets.locks)
            self.lock = locks[stripe] = _Contended(locks[stripe])
            targets.locks = tuple(locks)
            self.lock.inner.acquire()
            self.conn = None
            return
        import psycopg

        self.conn = psycopg.connect(store.db.url)  # type: ignore[attr-defined]
        if table is not None:
            self.conn.execute(f"LOCK TABLE {table} IN SHARE MODE")
        else:
            name, column, key = row
            self.conn.execute(f"SELECT 1 FROM {name} WHERE {column} = %s FOR UPDATE", [key])
        # the server's pid, asked inside the transaction: through PgBouncer the
        # connection's own backend_pid is the pooler's, not the server's
        (self.pid,) = self.conn.execute("SELECT pg_backend_pid()").fetchone() or (None,)

    def waited_for(self) -> bool:
        """Whether another thread is blocked on this lock now."""
        if self.conn is None:
            return self.lock.contended.is_set()
        import psycopg

        with psycopg.connect(self.store.db.url, autocommit=True) as probe:  # type: ignore[attr-defined]
            row = probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                [self.pid],
            ).fetchone()
        return row is not None and row[0] > 0

    def release(self) -> None:
        if self.conn is None:
            self.lock.inner.release()
        else:
            self.conn.rollback()
            self.conn.close()


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # the test inspects it
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def expired_while_waiting(
    store: turnkeeper.BaseStore,
    clock: FakeClock,
    case: Case,
    takeover: bool,
    table: str | None = None,
) -> tuple[Any, Any, Any]:
    """Run ``case``'s write so that it waits for its lock until its lease has
    expired (and, with ``takeover``, another owner waits to take the lease
    over); what it returned or raised, what the store held before and after,
    and the takeover's outcome. ``table``: the lock is on that table (see
    :class:`Held`), which the write meets after its fence."""
    write, (row, target), observe = case.arrange(store)
    before = observe()
    # a session whose run the write would end is an orphan once its lease
    # expires: only a recovery lease takes it over
    orphan = (
        target is not None
        and target.startswith("session:")
        and store.runs.active(target.removeprefix("session:")) is not None
    )
    purpose = "recovery" if orphan else "mutation"
    held = Held(store, row, target, table)
    try:
        thread, out = in_thread(write)
        wait_until(held.waited_for, f"{case.name} never waited for the lock")
        clock.advance(PAST_EXPIRY_S)
        successor: tuple[threading.Thread, list[Any]] | None = None
        if takeover and target is not None:
            successor = in_thread(lambda: store.leases.acquire(target, "w2", 60, purpose=purpose))
    finally:
        held.release()
    thread.join(120)
    assert not thread.is_alive()
    taken = None
    if successor is not None:
        successor[0].join(120)
        taken = successor[1][0]
    return out[0], (before, observe()), taken


WAITS = [
    pytest.param(backend, case, takeover, id=f"{backend}-{case.name}-{how}")
    for backend in ("duckdb", "postgres")
    for case in LEASED + CLAIMED
    for takeover, how in ((False, "alone"), (True, "takeover"))
    # DuckDB takes no lock for a delivery operation (the group tests below
    # cover its claims); a claim is taken over by a claim, not a lease
    if not (case in CLAIMED and (backend == "duckdb" or takeover))
]


@pytest.mark.parametrize(("backend", "case", "takeover"), WAITS)
def test_a_write_that_waited_for_its_lock_past_the_expiry_is_refused(
    tmp_path, clock, backend, case, takeover
):
    store = open_backend(backend, tmp_path, clock)
    try:
        if backend == "postgres" and case.name in ("append", "append_many"):
            _without_one_statement_appends(store)
        got, (before, after), taken = expired_while_waiting(store, clock, case, takeover)
        assert isinstance(got, case.lost), f"{case.name} committed after its lease expired: {got!r}"
        assert after == before
        if takeover:
            assert isinstance(taken, turnkeeper.Lease) and taken.owner == "w2", taken
    finally:
        store.close()


LATER = [
    pytest.param(case, takeover, id=f"{case.name}-{how}")
    for case in LEASED + CLAIMED
    if case.later is not None
    for takeover, how in ((False, "alone"), (True, "takeover"))
    if not (case in CLAIMED and takeover)
]


@pytest.mark.postgres
@pytest.mark.parametrize(("case", "takeover"), LATER)
def test_a_write_that_waited_after_its_fence_past_the_expiry_is_refused(
    tmp_path, clock, case, takeover
):
    """PostgreSQL: the lease row is free, so the fence passes at once; then the
    write waits for a lock another transaction holds on a table it writes
    after the fence, until its lease expired. Its COMMIT must not follow: the
    expiry is judged again as it commits (attack helper: append, finish_run,
    complete_tool_execution and some twenty more committed ~2 s after their
    leases expired, and renew and re-acquire revived the lease)."""
    store = open_backend("postgres", tmp_path, clock)
    try:
        if case.name in ("append", "append_many"):
            _without_one_statement_appends(store)
        got, (before, after), taken = expired_while_waiting(
            store, clock, case, takeover, case.later
        )
        assert isinstance(got, case.lost), f"{case.name} committed after its lease expired: {got!r}"
        assert after == before
        if takeover:
            assert isinstance(taken, turnkeeper.Lease) and taken.owner == "w2", taken
    finally:
        store.close()


def _without_one_statement_appends(store: Any) -> None:
    """Appends in a transaction (judged in Python, on the injected clock): the
    one-statement append judges in SQL, on the server's clock (its own test
    below)."""
    import dataclasses

    store.db.dialect = dataclasses.replace(store.db.dialect, one_statement_appends=False)


def test_a_reacquire_that_waited_past_the_expiry_is_a_takeover_not_a_revival(store, clock):
    lease = _session(store)
    held = Held(store, ("leases", "target", lease.target), lease.target)
    try:
        thread, out = in_thread(lambda: store.leases.acquire(lease.target, "w1", 60))
        wait_until(held.waited_for, "the re-acquire never waited for the lock")
        clock.advance(PAST_EXPIRY_S)
    finally:
        held.release()
    thread.join(120)
    again = out[0]
    assert isinstance(again, turnkeeper.Lease), again
    assert again.epoch == lease.epoch + 1 and again.token != lease.token
    with pytest.raises(LeaseLostError):
        store.leases.validate(lease)


# -- DuckDB: a group commit runs other writes between a fence and its COMMIT --------------


def _blocker(store: turnkeeper.BaseStore, started: threading.Event, go: threading.Event):
    """A queued write that stamps the store's now (as any write does), then
    runs until ``go``: the rest of its group commit waits for it."""

    def body(tx: Any) -> str:
        assert tx.now is not None
        started.set()
        if not go.wait(120):
            raise RuntimeError("never let go")
        return "done"

    return lambda: store.db.write("blocker", body)


@pytest.mark.parametrize("fence_first", [True, False], ids=["fence-then-wait", "wait-then-fence"])
@pytest.mark.parametrize(
    "case",
    [c for c in LEASED + CLAIMED if c.name not in ("renew_lease", "validate_lease")],
    ids=lambda c: c.name,
)
def test_a_grouped_write_whose_lease_expired_before_the_commit_is_refused(
    tmp_path, case, fence_first
):
    """In one DuckDB group: the fenced write and a long write beside it. With
    the fence first, the lease expires between the fence and the COMMIT; with
    the long write first, between the group's start and the fence. Either way
    the fenced write is refused and writes nothing, and the long write (whose
    lease nothing limits) commits."""
    clock = FakeClock()
    store = open_backend("duckdb", tmp_path, clock)
    try:
        write, _, observe = case.arrange(store)
        before = observe()
        started, go = threading.Event(), threading.Event()
        blocker = _blocker(store, started, go)

        def release_when_running() -> None:
            started.wait(120)
            clock.advance(PAST_EXPIRY_S)
            go.set()

        helper = threading.Thread(target=release_when_running)
        helper.start()
        calls = [write, blocker] if fence_first else [blocker, write]
        got = queued_together(store, calls)
        helper.join(120)
        fenced, other = (got[0], got[1]) if fence_first else (got[1], got[0])
        assert isinstance(fenced, case.lost), f"{case.name} committed after expiry: {fenced!r}"
        assert other == "done"
        assert observe() == before
    finally:
        store.close()


def test_the_group_test_fails_without_the_check_before_commit(tmp_path, monkeypatch):
    """Control: with the recheck before COMMIT patched out, a grouped append
    whose lease expired after its fence commits (the test above can fail)."""
    monkeypatch.setattr(duck_db.Tx, "lapsed", lambda self: None)
    clock = FakeClock()
    store = open_backend("duckdb", tmp_path, clock)
    try:
        write, _, observe = append(store)
        started, go = threading.Event(), threading.Event()

        def release_when_running() -> None:
            started.wait(120)
            clock.advance(PAST_EXPIRY_S)
            go.set()

        helper = threading.Thread(target=release_when_running)
        helper.start()
        got = queued_together(store, [write, _blocker(store, started, go)])
        helper.join(120)
        assert isinstance(got[0], turnkeeper.Entry) and observe() == 1
    finally:
        store.close()


# -- PostgreSQL: the one-statement append judges on the server's clock ---------------------


@pytest.mark.postgres
@pytest.mark.parametrize("locked", ["leases", "sessions"])
def test_a_one_statement_append_that_waited_past_the_expiry_is_refused(tmp_path, locked):
    """The issue's example: a lease with a short ttl, its row locked by a raw
    transaction, an append waiting for it past the expiry (awaited on the
    server's clock), then the lock let go: the append is refused, nothing is
    written. Short ttls that run out before the append waits are retried with
    longer ones (a loaded machine), never counted as a pass. ``locked``: the
    lease row, or the session row (attack helper: with the session row held,
    the append was judged before it waited for it and committed late)."""
    store = open_backend("postgres", None, None)
    try:
        for attempt in range(6):
            sid = f"p{attempt}"
            store.sessions.create(sid)
            lease = store.leases.acquire(f"session:{sid}", "w1", 0.5 * 2**attempt)
            if _append_waited_while_live(store, sid, lease, locked):
                assert store.sessions.entries(sid) == []
                return
        pytest.fail("the lease always expired before the append waited for it")
    finally:
        store.close()


def _append_waited_while_live(store: Any, sid: str, lease: turnkeeper.Lease, locked: str) -> bool:
    """Append under ``lease`` while the ``locked`` row (the lease's, or the
    session's) is locked, until the lease expired on the server's clock;
    whether the append was waiting while the lease was still live (else the
    case was not exercised). Fails if the append committed."""
    row = ("leases", "target", lease.target) if locked == "leases" else ("sessions", "id", sid)
    held = Held(store, row, lease.target)
    try:
        thread, out = in_thread(lambda: store.sessions.append(sid, M, user("late"), lease=lease))
        wait_until(held.waited_for, "the append never waited for the lock")
        live = _live(store, lease.target)
        wait_until(lambda: not _live(store, lease.target), "the lease never expired")
    finally:
        held.release()
    thread.join(120)
    if live:
        assert isinstance(out[0], LeaseLostError), f"committed after expiry: {out[0]!r}"
    return bool(live)


def _live(store: Any, target: str) -> bool:
    """Whether the lease row of ``target`` is unexpired by the server's clock."""
    import psycopg

    with psycopg.connect(store.db.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT expires_at > clock_timestamp() FROM leases WHERE target = %s", [target]
        ).fetchone()
    return bool(row and row[0])


def test_the_wait_test_fails_with_the_clock_read_before_the_lock(tmp_path, clock, monkeypatch):
    """Control for the DuckDB waits above: with the guard's clock read as the
    write starts to wait for its target (before the lock, as a transaction's
    fixed ``now`` may be), and without the second judgement before COMMIT, a
    write that waited past its lease's expiry commits."""
    monkeypatch.setattr(duck_db.Tx, "lapsed", lambda self: None)
    hold = duck_db.Tx.hold

    def early_hold(self: Any, target: str) -> None:
        if not hasattr(self, "early"):
            self.early = self._clock()
        hold(self, target)

    monkeypatch.setattr(duck_db.Tx, "hold", early_hold)
    monkeypatch.setattr(duck_db.Tx, "clock_after_locks", lambda self, server_now=None: self.early)
    store = open_backend("duckdb", tmp_path, clock)
    try:
        got, _, _ = expired_while_waiting(store, clock, Case("c", complete_tool_execution), False)
        assert isinstance(got, turnkeeper.ToolExecution) and got.state == "completed"
    finally:
        store.close()
