"""Cancellation is never wrapped, and a failed transaction leaves nothing behind."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from typing import Any

import pytest
from thread_frames import frame_of

import turnkeeper
from turnkeeper import EntryKind


def _running_in(thread: threading.Thread, function: str) -> bool:
    """Whether ``thread`` runs inside ``function`` right now (a frame of its stack)."""
    frame = frame_of(thread)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_sigint_during_a_query_is_keyboard_interrupt_not_a_store_error(duck_real_store):
    """The interrupt is sent once the query runs in DuckDB (the main thread is in
    DuckDB's ``to_arrow_table``, which the transaction's ``arrow`` calls), not
    after a fixed 0.3 s, which on a loaded machine could come before the query,
    or before ``raises``."""
    real_store = duck_real_store
    main, done = threading.current_thread(), threading.Event()

    def interrupt_the_query() -> None:
        give_up = time.monotonic() + 60  # a hang guard
        while not done.is_set() and time.monotonic() < give_up:
            if _running_in(main, "to_arrow_table"):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.001)

    sender = threading.Thread(target=interrupt_the_query)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            real_store.query("SELECT count(*) FROM range(100000000000) a")
    finally:
        done.set()
        sender.join(60)
    # the store still works afterwards
    real_store.sessions.create("after")
    assert real_store.sessions.get("after") is not None


def test_interrupt_inside_a_transaction_rolls_back(duck_store, monkeypatch):
    store = duck_store
    store.sessions.create("s")
    from turnkeeper.storage.duck.db import Tx

    real_insert = Tx.exec

    def interrupted(self, sql, params=()):
        if sql.startswith("INSERT INTO entries"):
            raise KeyboardInterrupt
        return real_insert(self, sql, params)

    monkeypatch.setattr(Tx, "exec", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.sessions.append("s", EntryKind.MESSAGE, {"message": {"role": "user", "content": "x"}})
    monkeypatch.undo()
    s = store.sessions.get("s")
    assert (s.leaf_id, s.entry_count, s.next_seq) == (None, 0, 1)
    assert store.sessions.entries("s") == []


def test_backend_failure_is_translated_with_cause_and_never_busy(store):
    with pytest.raises(turnkeeper.ProgrammingError) as err:
        store.query("SELECT * FROM no_such_table")
    assert err.value.__cause__ is not None
    assert not isinstance(err.value, turnkeeper.BusyError | turnkeeper.LeaseLostError)


def test_closed_store_is_an_interface_error(tmp_path):
    s = turnkeeper.open_store(str(tmp_path / "c.duckdb"))
    s.close()
    with pytest.raises(turnkeeper.InterfaceError):
        s.sessions.create("x")


_BOUNDARIES = {
    "write": lambda s: s.sessions.create(f"w-{id(s)}"),
    "read": lambda s: s.sessions.get("absent"),
    "snapshot": lambda s: s.query("SELECT 1"),
}


class _InterruptOnRelease:
    """A gate's lock that, letting go of the gate's lock with an operation
    counted (once), asks CPython to raise ``KeyboardInterrupt`` in this thread
    where a Ctrl-C's handler runs: at the interpreter's next check for pending
    calls (after a call returns), not at an arbitrary line."""

    def __init__(self, gate: Any) -> None:
        self.gate, self.real, self.fired = gate, gate.lock, False

    def __enter__(self) -> bool:
        return bool(self.real.__enter__())

    def __exit__(self, *exc: object) -> None:
        self.real.__exit__(*exc)
        if not self.fired and self.gate._inflight:
            self.fired = True
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(threading.get_ident()), ctypes.py_object(KeyboardInterrupt)
            )


@pytest.mark.parametrize("boundary", sorted(_BOUNDARIES))
def test_an_interrupt_as_an_operation_is_admitted_never_leaves_close_waiting(real_store, boundary):
    """Found reviewing the group-commit cancellation fixes: a KeyboardInterrupt
    landing as the store's gate admitted an operation (as ``enter()`` let go
    of its lock or returned, before the operation's ``try``) left it counted
    as running, and ``close()`` waited for it for ever."""
    store = real_store
    gate = store.db._gate  # type: ignore[attr-defined]
    gate.lock = interrupting = _InterruptOnRelease(gate)
    try:
        with pytest.raises(KeyboardInterrupt):
            _BOUNDARIES[boundary](store)
    finally:
        gate.lock = interrupting.real
    assert interrupting.fired
    left = sum(gate._inflight.values())
    gate._inflight.clear()  # a failure here must not hang the fixture's close
    assert left == 0, "an interrupted operation is still counted as running"
    assert _BOUNDARIES["read"](store) is None  # the store goes on working
