"""DuckDB's group commit: writes that queue while another runs commit together.

Each test holds the file's write lock while its threads queue their writes
(so the batch is known, not left to the scheduler), then lets one leader run
them all. Each operation is still checked and fenced on its own; a failing
one gets its own error and keeps nothing, and never fails or rolls back the
others (a control with a naive group commit shows the test can fail).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.spec import errors
from turnkeeper.storage.duck import db as duck_db
from turnkeeper.storage.duck import group as duck_group
from turnkeeper.storage.duck import tx as duck_tx

M = EntryKind.MESSAGE


def user(text: str) -> dict:
    return {"message": {"role": "user", "content": text}}


def wait_until(condition: Callable[[], bool], failure: str) -> None:
    """Poll ``condition`` (every millisecond, up to 100 s); fail with ``failure``."""
    for _ in range(100_000):
        if condition():
            return
        time.sleep(0.001)
    pytest.fail(failure)


def queued_together(store: turnkeeper.BaseStore, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` on threads that all queue behind the held write lock, then
    release it; each call's result or exception, in order."""
    database = store.db
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except BaseException as exc:  # the test inspects it, a cancellation too
            out[i] = exc

    def queued() -> int:
        with database._queue_lock:  # type: ignore[attr-defined]
            return len(database._queue)  # type: ignore[attr-defined]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    with database._write_lock:  # type: ignore[attr-defined]
        for i, t in enumerate(threads):  # one at a time, so the queue keeps this order
            t.start()
            wait_until(lambda i=i: queued() == i + 1, f"write {i} never queued")
    for t in threads:
        t.join()
    return out


def grouped(store: turnkeeper.BaseStore, operation: str) -> int:
    return int(store.statement_stats().get(operation, {}).get("grouped", 0))


def test_queued_appends_commit_in_one_shared_transaction(duck_real_store) -> None:
    store = duck_real_store
    for i in range(8):
        store.sessions.create(f"s{i}")
    got = queued_together(
        store, [lambda i=i: store.sessions.append(f"s{i}", M, user(str(i))) for i in range(8)]
    )
    assert all(isinstance(e, turnkeeper.Entry) for e in got), got
    assert grouped(store, "append") == 8
    assert [len(store.sessions.entries(f"s{i}")) for i in range(8)] == [1] * 8


def scenario(store: turnkeeper.BaseStore, clock) -> tuple[list[Any], dict[str, Any]]:
    """Eight queued writes, three of which fail in different ways (one after it
    wrote its lease row); what each caller got and what is stored."""
    for name in ("a", "b", "held", "stale"):
        store.sessions.create(name)
    held = store.leases.acquire("session:held", "w1", 600)
    stale = store.leases.acquire("session:stale", "w0", 5)
    clock.advance(6)
    store.leases.acquire("session:stale", "w2", 600)
    root = store.sessions.append("a", M, user("root"))
    store.sessions.append("a", M, user("moved on"))
    unpaired = {
        "message": {
            "role": "toolResult",
            "toolCallId": "nobody-called",
            "toolName": "ls",
            "content": [{"type": "text", "text": "x"}],
            "isError": False,
        }
    }
    calls: list[Callable[[], Any]] = [
        lambda: store.sessions.append("b", M, user("1")),
        lambda: store.sessions.append("b", M, user("2")),
        lambda: store.sessions.append("held", M, unpaired, lease=held),  # fences, then is refused
        lambda: store.sessions.append("held", M, user("3"), lease=held),
        lambda: store.sessions.append("b", M, user("4")),
        lambda: store.sessions.append("stale", M, user("late"), lease=stale),  # a lost lease
        lambda: store.sessions.append("a", M, user("stale view"), expected_leaf=root.id),
        lambda: store.sessions.create("c"),
    ]
    got = queued_together(store, calls)
    stored = {
        "b": [e.payload["message"]["content"] for e in store.sessions.entries("b")],
        "held": [e.payload["message"]["content"] for e in store.sessions.entries("held")],
        "stale": store.sessions.entries("stale"),
        "a": len(store.sessions.entries("a")),
        "c": store.sessions.get("c") is not None,
        "fenced_writes": store.query(
            "SELECT fenced_writes FROM leases WHERE target = 'session:held'"
        )
        .column(0)[0]
        .as_py(),
    }
    return got, stored


def check(got: list[Any], stored: dict[str, Any]) -> None:
    kinds = [type(g).__name__ for g in got]
    assert kinds == [
        "Entry",
        "Entry",
        "ToolCallPairingError",
        "Entry",
        "Entry",
        "LeaseLostError",
        "SessionModifiedError",
        "Session",
    ], kinds
    assert stored["b"] == ["1", "2", "4"]
    assert stored["held"] == ["3"]
    assert stored["stale"] == [] and stored["a"] == 2 and stored["c"]
    # DuckDB's fences are reads (under the write serialization and Tx.hold):
    # neither the refused append nor "3" wrote the lease row
    assert stored["fenced_writes"] == 0


def test_a_failing_write_in_a_group_fails_alone_and_keeps_nothing(duck_store, clock) -> None:
    got, stored = scenario(duck_store, clock)
    check(got, stored)
    # [1, 2] committed as a group; the unpaired result (a tool result: never
    # merged) raised and ran alone; [3, 4, stale, stale view] ran merged, the
    # last two getting their errors inside the group, which committed
    assert grouped(duck_store, "append") == 6


def test_control_a_group_commit_that_fails_together_is_caught(
    duck_store, clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control for the test above: a naive group commit that gives the first
    error to the whole group (and keeps nothing) fails the same check."""

    def naive(self: Any, batch: list[Any]) -> None:
        failed = self._shared(batch) if len(batch) > 1 else None
        if failed is None:
            if len(batch) == 1:
                self._alone(batch[0])
            return
        self._alone(batch[failed])
        for item in batch:
            if not item.done:
                item.error, item.done = batch[failed].error, True

    monkeypatch.setattr(duck_db.Database, "_group", naive)
    got, stored = scenario(duck_store, clock)
    with pytest.raises(AssertionError):
        check(got, stored)


def test_a_grouped_lease_takeover_and_a_stale_append_keep_the_fence(duck_store, clock) -> None:
    """In one group: a takeover of an expired lease, then the old holder's append.
    The append sees the takeover (an earlier write of the same transaction) and
    is refused, as it would be run one after the other."""
    store = duck_store
    store.sessions.create("s")
    old = store.leases.acquire("session:s", "w1", 5)
    clock.advance(6)
    got = queued_together(
        store,
        [
            lambda: store.leases.acquire("session:s", "w2", 600),
            lambda: store.sessions.append("s", M, user("stale"), lease=old),
        ],
    )
    assert isinstance(got[0], turnkeeper.Lease) and got[0].epoch == old.epoch + 1
    assert isinstance(got[1], errors.LeaseLostError)
    assert store.sessions.entries("s") == []


def test_a_cancelled_leader_requeues_the_others_and_commits_nothing_twice(duck_real_store) -> None:
    """A cancellation (KeyboardInterrupt) inside a group: the shared transaction is
    rolled back, the writes that did not run go back to the queue for the next
    leader, and every caller ends with its write committed exactly once or with
    the cancellation and nothing committed."""
    store = duck_real_store
    store.sessions.create("s")

    def cancelled(tx: Any) -> None:
        raise KeyboardInterrupt("cancelled inside the group")

    calls: list[Callable[[], Any]] = [
        lambda: store.sessions.append("s", M, user("0")),
        lambda: store.db.write("cancel", cancelled),
        lambda: store.sessions.append("s", M, user("2")),
        lambda: store.sessions.append("s", M, user("3")),
    ]
    got = queued_together(store, calls)
    assert isinstance(got[1], KeyboardInterrupt)
    texts = [e.payload["message"]["content"] for e in store.sessions.entries("s")]
    assert len(texts) == len(set(texts))  # nothing committed twice
    for i in (0, 2, 3):
        if isinstance(got[i], KeyboardInterrupt):  # the leader, cancelled with its write
            assert str(i) not in texts
        else:
            assert isinstance(got[i], turnkeeper.Entry) and str(i) in texts, got
    store.sessions.append("s", M, user("after"))  # the store still writes


def test_a_caller_cancelled_while_queued_never_writes(duck_real_store) -> None:
    """A caller cancelled (KeyboardInterrupt) while its write waits in the queue
    behind a leader: its write is taken out and never runs; the leader's and the
    others' writes commit."""
    import ctypes

    store = duck_real_store
    store.sessions.create("s")
    database = store.db
    out: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            out[name] = store.sessions.append("s", M, user(name))
        except BaseException as exc:  # the test inspects the cancellation
            out[name] = exc

    def queued() -> int:
        with database._queue_lock:
            return len(database._queue)

    def wait_for(n: int) -> None:
        for _ in range(100_000):
            if queued() == n:
                return
            time.sleep(0.001)
        pytest.fail(f"the queue never held {n}")

    with database._write_lock:  # the first caller leads and waits for the lock
        leader = threading.Thread(target=run, args=("leader",))
        leader.start()
        wait_for(1)
        victim = threading.Thread(target=run, args=("victim",))
        victim.start()
        wait_for(2)
        other = threading.Thread(target=run, args=("other",))
        other.start()
        wait_for(3)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(victim.ident), ctypes.py_object(KeyboardInterrupt)
        )
        with database._queue_changed:  # wake the waiters: the victim sees its cancellation
            database._queue_changed.notify_all()
        victim.join(10)
        assert not victim.is_alive()
        assert queued() == 2
    leader.join()
    other.join()
    assert isinstance(out["victim"], KeyboardInterrupt)
    assert isinstance(out["leader"], turnkeeper.Entry) and isinstance(
        out["other"], turnkeeper.Entry
    )
    texts = [e.payload["message"]["content"] for e in store.sessions.entries("s")]
    assert sorted(texts) == ["leader", "other"]


def _interrupt_at_commit(monkeypatch: pytest.MonkeyPatch, *, after: bool, error: BaseException):
    """Make the first COMMIT of a group raise ``error`` in the leading thread,
    right after (``after``) or instead of running it: what a SIGINT during the
    COMMIT call looks like."""
    real, armed = duck_db.Tx.exec, [True]

    def exec_(self: Any, sql: str, params: Any = ()) -> None:
        if sql == "COMMIT" and armed[0]:
            armed[0] = False
            if after:
                real(self, sql, params)
            raise error
        real(self, sql, params)

    monkeypatch.setattr(duck_db.Tx, "exec", exec_)


def test_a_leader_interrupted_after_its_commit_gives_the_others_their_outcomes(
    duck_real_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an attack helper: a KeyboardInterrupt reaching the leader just as
    the group's COMMIT returned put the committed writes back in the queue;
    they ran again and their callers got TransactionConflictError for writes
    that were stored. Now a COMMIT that took effect delivers every outcome."""
    store = duck_real_store
    for s in ("a", "b", "c"):
        store.sessions.create(s)
    _interrupt_at_commit(monkeypatch, after=True, error=KeyboardInterrupt())
    got = queued_together(
        store, [lambda s=s: store.sessions.append(s, M, user(s)) for s in ("a", "b", "c")]
    )
    assert isinstance(got[0], KeyboardInterrupt)  # the leader: cancelled, its write committed
    assert all(isinstance(g, turnkeeper.Entry) for g in got[1:]), got
    assert [len(store.sessions.entries(s)) for s in ("a", "b", "c")] == [1, 1, 1]


def test_a_commit_interrupted_before_it_ran_is_a_keyboard_interrupt_and_keeps_nothing(
    duck_real_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an attack helper: DuckDB's RuntimeError('Query interrupted') from
    the group's COMMIT reached the caller raw. It is a KeyboardInterrupt; the
    group was not committed, so the others' writes run again, once."""
    store = duck_real_store
    for s in ("a", "b", "c"):
        store.sessions.create(s)
    _interrupt_at_commit(monkeypatch, after=False, error=RuntimeError("Query interrupted"))
    got = queued_together(
        store, [lambda s=s: store.sessions.append(s, M, user(s)) for s in ("a", "b", "c")]
    )
    assert isinstance(got[0], KeyboardInterrupt), got
    assert all(isinstance(g, turnkeeper.Entry) for g in got[1:]), got
    assert [len(store.sessions.entries(s)) for s in ("a", "b", "c")] == [0, 1, 1]


class _Waits:
    """A stand-in for the leader's ``_queue_grew`` condition that records its waits
    (and can raise on the first, as a cancellation arriving there would)."""

    def __init__(self, real: threading.Condition, raise_first: BaseException | None = None):
        self.real, self.calls, self.raise_first = real, 0, raise_first

    def wait(self, timeout: float | None = None) -> bool:
        self.calls += 1
        if self.raise_first is not None and self.calls == 1:
            raise self.raise_first
        return self.real.wait(timeout)

    def notify(self, n: int = 1) -> None:
        self.real.notify(n)


def _queue_behind_a_group_of(store: turnkeeper.BaseStore, n: int) -> None:
    """Commit one group of ``n`` appends, so that the next leader expects ``n``."""
    for i in range(n):
        store.sessions.create(f"warm{i}")
    got = queued_together(
        store, [lambda i=i: store.sessions.append(f"warm{i}", M, user("w")) for i in range(n)]
    )
    assert all(isinstance(g, turnkeeper.Entry) for g in got), got
    assert store.db._last_group == n  # type: ignore[attr-defined]


def _three_writers_one_after_another(store: turnkeeper.BaseStore) -> int:
    """Start three appends on threads, each once the one before is done or is
    queued while a leader waits for writers (the commit delay); how many of
    them committed in a shared group."""
    database = store.db
    before = grouped(store, "append")
    out: dict[str, Any] = {}

    def run(s: str) -> None:
        out[s] = store.sessions.append(s, M, user(s))

    def settled(s: str, queued: int) -> bool:
        with database._queue_lock:  # type: ignore[attr-defined]
            waiting = len(database._queue) == queued and database._gathering > 0  # type: ignore[attr-defined]
        return s in out or waiting

    threads = []
    for i, s in enumerate(("a", "b", "c")):
        t = threading.Thread(target=run, args=(s,))
        t.start()
        threads.append(t)
        wait_until(lambda s=s, i=i: settled(s, i + 1), f"write {s} never settled")
    for t in threads:
        t.join()
    assert all(isinstance(out[s], turnkeeper.Entry) for s in ("a", "b", "c")), out
    return grouped(store, "append") - before


def test_after_a_group_the_next_leader_waits_for_as_many_writers(
    duck_real_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit delay: after a group of three, the next leader waits (here with
    no time limit that matters) until three writes are queued, so three writers
    started one after another commit in one group."""
    store = duck_real_store
    for s in ("a", "b", "c"):
        store.sessions.create(s)
    _queue_behind_a_group_of(store, 3)
    monkeypatch.setattr(duck_group, "COMMIT_DELAY_S", 600.0)
    assert _three_writers_one_after_another(store) == 3


def test_control_without_the_commit_delay_each_writer_commits_alone(
    duck_real_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with the wait patched out, the same three writers each commit
    alone, so the test above fails without it."""
    store = duck_real_store
    for s in ("a", "b", "c"):
        store.sessions.create(s)
    _queue_behind_a_group_of(store, 3)
    monkeypatch.setattr(duck_db.Database, "_gather", lambda self: None)
    assert _three_writers_one_after_another(store) == 0


def test_a_lone_writer_after_a_lone_write_never_waits(duck_real_store) -> None:
    store = duck_real_store
    store.sessions.create("s")
    store.sessions.append("s", M, user("first"))
    waits = _Waits(store.db._queue_grew)  # type: ignore[attr-defined]
    store.db._queue_grew = waits  # type: ignore[attr-defined]
    store.sessions.append("s", M, user("second"))
    assert waits.calls == 0


def test_a_leader_cancelled_while_it_waits_for_writers_leaves_theirs_to_the_next(
    duck_real_store,
) -> None:
    """A KeyboardInterrupt reaching the leader in the commit delay: its own write
    never runs (it ends with the cancellation), the others' are led by the
    next leader and commit once."""
    store = duck_real_store
    for s in ("a", "b", "c"):
        store.sessions.create(s)
    _queue_behind_a_group_of(store, 3)
    database = store.db
    waits = _Waits(database._queue_grew, KeyboardInterrupt("cancelled in the wait"))  # type: ignore[attr-defined]
    database._queue_grew = waits  # type: ignore[attr-defined]
    got = queued_together(
        store, [lambda s=s: store.sessions.append(s, M, user(s)) for s in ("a", "b")]
    )  # two queued behind the lock: the leader waits for a third
    assert waits.calls >= 1
    assert isinstance(got[0], KeyboardInterrupt), got
    assert isinstance(got[1], turnkeeper.Entry), got
    assert [len(store.sessions.entries(s)) for s in ("a", "b")] == [0, 1]
    store.sessions.append("c", M, user("after"))  # the store still writes


def _free(lock: Any) -> bool:
    """Whether another thread can take ``lock`` at once (a stripe is reentrant:
    the thread holding it could always take it again)."""

    def take() -> bool:
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    return bool(_in_thread(take))


def _in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a thread; its result or exception (a hang fails the test)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # the test inspects it
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the write never returned"
    return out[0]


def test_a_cancellation_as_a_write_queues_keeps_it_out(
    duck_real_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an attack helper: a KeyboardInterrupt landing in the leader's
    wake-up right after a write was queued escaped with the write still queued,
    and the leader committed the write of a caller that got the cancellation."""
    store = duck_real_store
    for s in ("a", "b", "c"):
        store.sessions.create(s)
    _queue_behind_a_group_of(store, 3)
    monkeypatch.setattr(duck_group, "COMMIT_DELAY_S", 600.0)
    database = store.db
    waits = _Waits(database._queue_grew)  # type: ignore[attr-defined]
    fired: list[bool] = []

    def notify(n: int = 1) -> None:
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt("in the wake-up")
        waits.real.notify(n)

    waits.notify = notify  # type: ignore[method-assign]
    database._queue_grew = waits  # type: ignore[attr-defined]
    out: dict[str, Any] = {}

    def run(s: str) -> None:
        try:
            out[s] = store.sessions.append(s, M, user(s))
        except BaseException as exc:  # the test inspects the cancellation
            out[s] = exc

    lead = threading.Thread(target=run, args=("a",))
    lead.start()
    wait_until(lambda: database._gathering == 3, "the leader never waited")  # type: ignore[attr-defined]
    second = threading.Thread(target=run, args=("b",))
    second.start()
    wait_until(lambda: len(database._queue) == 2, "b never queued")  # type: ignore[attr-defined]
    run("c")  # completes the batch: its wake-up of the leader is cancelled
    assert isinstance(out["c"], KeyboardInterrupt)
    monkeypatch.setattr(duck_group, "COMMIT_DELAY_S", 0.01)
    _in_thread(lambda: store.sessions.append("c", M, user("again")))  # a third write ends the wait
    lead.join(120)
    second.join(120)
    assert isinstance(out["a"], turnkeeper.Entry) and isinstance(out["b"], turnkeeper.Entry)
    assert [e.payload["message"]["content"] for e in store.sessions.entries("c")] == ["again"]


def test_a_cancellation_right_after_a_target_is_held_never_leaks_its_lock(
    duck_real_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an attack helper: a KeyboardInterrupt between taking a target's
    stripe lock and recording it left the lock taken for ever, and every later
    write on that target (and, behind the leader, every write) hung."""
    store = duck_real_store
    store.sessions.create("s")
    store.sessions.create("other")
    lease = store.leases.acquire("session:s", "w", 60)
    real, fired = duck_tx.stale_since, []

    def stale_since(tx: Any, stripe: int) -> bool:
        if not fired:
            fired.append(stripe)
            raise KeyboardInterrupt("right after the hold")
        return real(tx, stripe)

    monkeypatch.setattr(duck_tx, "stale_since", stale_since)
    with pytest.raises(KeyboardInterrupt):
        store.sessions.append("s", M, user("interrupted"), lease=lease)
    assert _free(store.db._file.targets.locks[fired[0]])  # type: ignore[attr-defined]
    assert isinstance(
        _in_thread(lambda: store.sessions.append("s", M, user("b"), lease=lease)), turnkeeper.Entry
    )
    assert isinstance(
        _in_thread(lambda: store.sessions.append("other", M, user("c"))), turnkeeper.Entry
    )


def test_a_leader_cancelled_as_it_hands_over_leaves_no_write_waiting(
    duck_real_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an attack helper: a KeyboardInterrupt landing as a leader handed
    over (its wake-up of the waiters) left the store marked as led for ever, and
    every later write waited for a leader that never came."""
    store = duck_real_store
    store.sessions.create("s")
    database = store.db
    real = database._queue_changed  # type: ignore[attr-defined]
    fired: list[bool] = []

    class Handover(threading.Condition):
        def notify_all(self) -> None:
            caller = sys._getframe(1)
            # the leader's hand-over: _grouped, once it has led
            if not fired and caller.f_code.co_name == "_grouped" and caller.f_locals.get("lead"):
                fired.append(True)
                raise KeyboardInterrupt("as the leader handed over")
            super().notify_all()

    database._queue_changed = Handover(real._lock)  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        store.sessions.append("s", M, user("first"))
    assert fired and database._leading is False  # type: ignore[attr-defined]
    assert _free(database._queue_lock)  # type: ignore[attr-defined]
    assert isinstance(
        _in_thread(lambda: store.sessions.append("s", M, user("second"))), turnkeeper.Entry
    )
