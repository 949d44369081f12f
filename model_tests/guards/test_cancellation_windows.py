"""A Ctrl-C (or an asynchronous exception) landing at the worst moment leaves
no lock taken, no transaction open, no write run twice and no close undone.

Each case was found by an attack helper delivering interrupts at random, and
is replayed here deterministically: an interrupt is delivered where CPython
delivers one (``PyThreadState_SetAsyncExc``: at the next check for pending
calls, as a Ctrl-C's handler runs), or raised by a tracer as a function is
entered (what a Ctrl-C arriving in the few bytecodes before it does).
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from thread_frames import frame_of

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.storage.duck import db as duck_db
from turnkeeper.storage.duck import files as duck_files
from turnkeeper.storage.retry import Gate

MSG = {"message": {"role": "user", "content": "x"}}


def _interrupt(thread: threading.Thread) -> None:
    """Raise KeyboardInterrupt in ``thread`` at its next check for pending calls."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident or 0), ctypes.py_object(KeyboardInterrupt)
    )


def _blocked_in(thread: threading.Thread, function: str) -> None:
    """Wait until ``thread`` runs (blocked) in ``function``."""
    while True:
        frame = frame_of(thread)
        while frame is not None:
            if frame.f_code.co_name == function:
                return
            frame = frame.f_back
        time.sleep(0.005)


@contextlib.contextmanager
def _fails_if_it_hangs(seconds: int = 120) -> Iterator[None]:
    """A hang in the block fails the test (an alarm on the main thread)."""

    def expired(signum: int, frame: Any) -> None:
        raise AssertionError(f"still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _outcome(fn: Callable[[], Any], out: dict[str, Any], name: str) -> Callable[[], None]:
    def run() -> None:
        try:
            out[name] = ("ok", fn())
        except BaseException as exc:  # the test inspects it
            out[name] = ("raised", exc)

    return run


def _free(lock: Any) -> bool:
    """Whether another thread can take ``lock`` now."""
    got: list[bool] = []

    def take() -> None:
        got.append(lock.acquire(blocking=False))
        if got[0]:
            lock.release()

    t = threading.Thread(target=take)
    t.start()
    t.join(60)
    return got == [True]


def test_an_interrupt_as_a_write_takes_the_queue_lock_never_leaks_it(duck_real_store):
    """The group-commit queue's lock was entered through a condition's Python
    ``__enter__``: an interrupt landing as the lock was taken left it taken,
    and every later write and ``close()`` hung."""
    store = duck_real_store
    store.sessions.create("s")
    db = store.db
    out: dict[str, Any] = {}
    db._queue_lock.acquire()  # a leader taking its batch
    t = threading.Thread(
        target=_outcome(lambda: store.sessions.append("s", EntryKind.MESSAGE, MSG), out, "w")
    )
    t.start()
    _blocked_in(t, "_grouped")
    _interrupt(t)
    db._queue_lock.release()
    t.join(60)
    assert out["w"][0] == "raised" and isinstance(out["w"][1], KeyboardInterrupt)
    assert _free(db._queue_lock)
    assert store.sessions.append("s", EntryKind.MESSAGE, MSG).seq in (1, 2)


def test_an_interrupt_as_a_contended_target_is_taken_never_leaks_its_stripe(duck_real_store):
    """``Tx.hold`` noted a stripe as taken only after ``acquire()`` returned: an
    interrupt landing in between (a heartbeat holding the stripe widens it)
    left the stripe locked, and in random runs every write hung (5 of 5)."""
    store = duck_real_store
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w1", 300)
    targets = store.db._file.targets
    stripe = targets.locks[zlib.crc32(b"session:s") % len(targets.locks)]
    out: dict[str, Any] = {}
    stripe.acquire()  # a renewal holds the stripe for a moment
    t = threading.Thread(
        target=_outcome(
            lambda: store.sessions.append("s", EntryKind.MESSAGE, MSG, lease=lease), out, "w"
        )
    )
    t.start()
    _blocked_in(t, "hold")
    _interrupt(t)
    stripe.release()
    t.join(60)
    assert out["w"][0] == "raised" and isinstance(out["w"][1], KeyboardInterrupt)
    assert _free(stripe)
    assert store.sessions.append("s", EntryKind.MESSAGE, MSG, lease=lease).seq in (1, 2)


def test_an_interrupt_as_an_operation_leaves_the_gate_never_hangs_close(real_store):
    """An interrupt landing as an operation leaves the gate (``Gate.leave``
    starting: no Python code can stop that) leaves its thread counted as
    running: ``close()`` from that thread, or from any thread once that one
    ended, no longer waits for it."""
    store = real_store
    store.sessions.create("s")
    fired: list[int] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code is Gate.leave.__code__ and not fired:
            fired.append(1)
            raise KeyboardInterrupt("as the operation left the gate")
        return None

    def read_interrupted() -> None:
        sys.settrace(tracer)
        try:
            with pytest.raises(KeyboardInterrupt):
                store.sessions.get("s")
        finally:
            sys.settrace(None)

    worker = threading.Thread(target=read_interrupted)  # counted, then ends
    worker.start()
    worker.join(60)
    fired.clear()
    read_interrupted()  # this thread counted too
    assert fired
    with _fails_if_it_hangs():
        store.close()
    with pytest.raises(turnkeeper.InterfaceError):
        store.sessions.get("s")


def test_a_write_committed_alone_is_never_run_again_after_an_interrupt(duck_real_store):
    """A queued write run alone (its group split around a failing one) whose
    COMMIT returned, the leader interrupted before marking it done, was queued
    again: run a second time, and its caller told it failed
    (``TransactionConflictError`` on its duplicate entry id) though stored."""
    store = duck_real_store
    store.sessions.create("dup")
    store.sessions.create("t")
    db = store.db
    code = duck_db.Database._alone.__code__
    lines, start = inspect.getsourcelines(duck_db.Database._alone)
    done_line = start + next(i for i, line in enumerate(lines) if "item.done = True" in line)
    fired: list[int] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            return tracer if frame.f_code is code else None
        if (
            event == "line"
            and frame.f_lineno == done_line
            and not fired
            and frame.f_locals["item"].operation == "append"
        ):
            fired.append(1)
            raise KeyboardInterrupt("right after the write committed")
        return tracer

    res: dict[str, Any] = {}
    threading.settrace(tracer)
    try:
        db._write_lock.acquire()  # a write is running: the next ones queue behind it
        calls = [
            ("leader", lambda: store.sessions.create("l")),
            ("failing", lambda: store.sessions.create("dup")),  # the group splits
            ("append", lambda: store.sessions.append("t", EntryKind.MESSAGE, MSG)),
        ]
        threads = []
        for name, fn in calls:
            t = threading.Thread(target=_outcome(fn, res, name))
            t.start()
            threads.append(t)
            _blocked_in(t, "_lead" if name == "leader" else "_grouped")
        db._write_lock.release()
        for t in threads:
            t.join(60)
    finally:
        threading.settrace(None)
    assert fired
    assert isinstance(res["leader"][1], KeyboardInterrupt)
    assert res["append"][0] == "ok", res["append"]
    assert [e.seq for e in store.sessions.entries("t")] == [1]


def test_an_interrupted_rollback_leaves_no_transaction_open(duck_real_store):
    """A Ctrl-C as the rollback of a failed write started left the thread's
    transaction open: a renewal then ran inside it and was acknowledged but
    never committed, and the next write failed ('cannot start a transaction
    within a transaction'). The cursor is replaced before its next use."""
    store = duck_real_store
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 60)
    first = store.sessions.append("s", EntryKind.MESSAGE, MSG, lease=lease)
    store.sessions.append("s", EntryKind.MESSAGE, MSG, lease=lease)

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code is duck_db.Database._rollback.__code__:
            sys.settrace(None)
            raise KeyboardInterrupt("as the rollback started")
        return None

    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            store.sessions.append("s", EntryKind.MESSAGE, MSG, expected_leaf=first.id, lease=lease)
    finally:
        sys.settrace(None)
    renewed = store.leases.renew(lease, 3600)
    third = store.sessions.append("s", EntryKind.MESSAGE, MSG, lease=lease)
    assert third.seq == 3
    stored = store.query("SELECT expires_at FROM leases WHERE target = 'session:s'")
    assert stored.column(0).to_pylist() == [renewed.expires_at]


class _InterruptedRollback:
    """A cursor whose next ROLLBACK is reported as DuckDB reports a SIGINT then."""

    def __init__(self, real: Any) -> None:
        self.real, self.fired = real, False

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "ROLLBACK" and not self.fired:
            self.fired = True
            raise RuntimeError("Query interrupted")
        return self.real.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_rollback_duckdb_reports_interrupted_is_keyboard_interrupt(duck_real_store):
    """DuckDB reports a SIGINT during ``ROLLBACK`` as ``RuntimeError: Query
    interrupted``, which surfaced to the caller as is (a cancellation wrapped)."""
    store = duck_real_store
    store.sessions.create("s")
    first = store.sessions.append("s", EntryKind.MESSAGE, MSG)
    store.sessions.append("s", EntryKind.MESSAGE, MSG)
    holder = store.db._cursors.holder()
    cursor = _InterruptedRollback(holder.box[0])
    holder.box[0] = cursor  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        store.sessions.append("s", EntryKind.MESSAGE, MSG, expected_leaf=first.id)
    assert cursor.fired
    assert store.sessions.append("s", EntryKind.MESSAGE, MSG).seq == 3


def test_a_close_interrupted_while_it_waits_is_finished_by_the_next(tmp_path):
    """A Ctrl-C while ``close()`` waited for running operations left the gate
    shut, so every later ``close()`` returned at once: the file stayed open
    (another process got ``StoreLockedError``) and the log unfolded."""
    path = tmp_path / "c.duckdb"
    store = turnkeeper.open_store(str(path))
    store.sessions.create("s")
    gate = store.db._gate

    def interrupted_wait() -> None:
        gate.closed = True
        raise KeyboardInterrupt("while close() waited")

    gate.shut = interrupted_wait  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        store.close()
    del gate.shut
    store.close()
    opened = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, turnkeeper; "
            "print(turnkeeper.open_store(sys.argv[1]).sessions.get('s') is not None)",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert opened.stdout.strip() == "True", opened.stderr


def test_an_open_interrupted_is_keyboard_interrupt(tmp_path, monkeypatch):
    """DuckDB reports a SIGINT while the connection is set up as ``RuntimeError:
    Query interrupted``; ``open_store`` raised it as is."""
    real = duck_files.configure
    monkeypatch.setattr(
        duck_files,
        "configure",
        lambda con: (_ for _ in ()).throw(RuntimeError("Query interrupted")),
    )
    path = str(tmp_path / "o.duckdb")
    with pytest.raises(KeyboardInterrupt):
        turnkeeper.open_store(path)
    monkeypatch.setattr(duck_files, "configure", real)
    with turnkeeper.open_store(path) as store:
        store.sessions.create("s")


def test_close_never_waits_for_an_idle_thread_that_took_a_counted_threads_id(duck_real_store):
    """Attack helper: the gate counted operations by thread id; a thread left
    counted by an interrupt (as ``Gate.leave`` started) ended, an idle thread
    got the same id (they are reused), and ``close()`` waited for it."""
    store = duck_real_store
    store.sessions.create("s")
    fired: list[int] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code is Gate.leave.__code__ and not fired:
            fired.append(1)
            raise KeyboardInterrupt("as the operation left the gate")
        return None

    def counted() -> None:
        sys.settrace(tracer)
        try:
            store.sessions.get("s")
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)

    first = threading.Thread(target=counted)
    first.start()
    first.join()
    assert fired
    # A thread's id is its pthread handle, which lives in its stack: glibc gives a
    # new thread the stack of the thread that ended last, once that one has fully
    # exited (after join() returned). The threads started before that stay alive
    # (a joined one's stack would be the next taken, never the first's).
    stop = threading.Event()
    started: list[threading.Thread] = []
    try:
        for _ in range(500):
            idle = threading.Thread(target=stop.wait)
            idle.start()
            started.append(idle)
            if idle.ident == first.ident:
                break
            time.sleep(0.001)  # let the first thread's exit finish
        assert idle.ident == first.ident and idle.is_alive()
        with _fails_if_it_hangs():
            store.close()
    finally:
        stop.set()
        for t in started:
            t.join()


def test_an_interrupt_as_a_queued_write_waits_never_releases_the_queue_lock_twice(
    duck_real_store,
):
    """Attack helper: a cancellation landing in a queued write's wait after it
    let go of the queue lock, before it took it back, came out as
    ``RuntimeError('release unlocked lock')``, for a write that was stored,
    and could release the lock while another thread held it. The landing is
    replayed at the wait's taking back (a Python function here)."""
    store = duck_real_store
    store.sessions.create("s")
    db = store.db
    condition = db._queue_changed
    real_restore = condition._acquire_restore
    fired: list[int] = []

    def acquire_restore(saved: Any) -> None:
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name != "_grouped":
            frame = frame.f_back
        item = None if frame is None else frame.f_locals.get("item")
        stored = item is not None and item.done  # B's write is stored; its wait ends here
        if threading.current_thread().name == "B" and stored and not fired:
            fired.append(1)
            raise KeyboardInterrupt("before the wait took the lock back")
        real_restore(saved)

    condition._acquire_restore = acquire_restore
    outcome: dict[str, Any] = {}
    db._write_lock.acquire()  # another write runs: the next ones queue
    writers = [
        threading.Thread(
            target=_outcome(lambda: store.sessions.append("s", EntryKind.MESSAGE, MSG), outcome, n),
            name=n,
        )
        for n in ("L", "B")
    ]
    writers[0].start()
    while not (db._leading and len(db._queue) == 1):  # L leads, waiting for the lock
        time.sleep(0.005)
    writers[1].start()
    while len(db._queue) < 2:  # B queued behind it, waiting for L's group
        time.sleep(0.005)
    db._write_lock.release()
    for t in writers:
        t.join(60)
    condition._acquire_restore = real_restore
    assert fired
    assert outcome["B"][0] == "raised" and isinstance(outcome["B"][1], KeyboardInterrupt)
    assert _free(db._queue_lock)
    assert [e.seq for e in store.sessions.entries("s")] == [1, 2]


def _waiting_in(thread: threading.Thread, function: str) -> bool:
    """Whether ``thread`` waits on a condition called from ``function`` right now."""
    frame = frame_of(thread)
    while frame is not None and frame.f_back is not None:
        if frame.f_code.co_name == "wait" and frame.f_back.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_close_waits_for_an_operation_whose_thread_an_interrupted_join_marked_ended(real_store):
    """CI: a Ctrl-C of ``turnkeeper demo`` landed in the main thread's
    ``join()`` of a worker, and CPython before 3.13 then marks that worker
    ended while it still runs (gh-90882: ``is_alive()`` False, every later
    join returns at once). ``close()`` asked ``is_alive()``, did not wait for
    the worker's running renewal and closed the file under it
    (``OperationalError``: the connection was busy; a crash at exit). The
    close must wait for that operation, and the operation must succeed."""
    store = real_store
    main = threading.current_thread()
    assert main is threading.main_thread()  # a signal is handled on the main thread
    inside, go, done = threading.Event(), threading.Event(), threading.Event()
    out: dict[str, Any] = {}

    def held(tx: Any) -> Any:
        inside.set()
        go.wait(60)
        return tx.one("SELECT 1")

    def operation() -> None:
        try:
            _outcome(lambda: store.db.read("held", held), out, "op")()
        finally:
            done.set()

    worker = threading.Thread(target=operation)
    worker.start()
    assert inside.wait(60)

    def ctrl_c() -> None:
        _blocked_in(main, "join")
        signal.pthread_kill(main.ident or 0, signal.SIGINT)

    sender = threading.Thread(target=ctrl_c)
    sender.start()
    try:
        with _fails_if_it_hangs(), pytest.raises(KeyboardInterrupt):
            worker.join(60)
        sender.join(60)
        closer = threading.Thread(target=_outcome(store.close, out, "close"))
        closer.start()
        with _fails_if_it_hangs():
            while closer.is_alive() and not _waiting_in(closer, "shut"):
                time.sleep(0.005)
        assert closer.is_alive(), "close() went on under a running operation"
    finally:
        go.set()
        done.wait(60)
    closer.join(60)
    assert out["op"] == ("ok", (1,)), out["op"]
    assert out["close"] == ("ok", None), out["close"]
