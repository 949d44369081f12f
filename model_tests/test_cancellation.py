"""Cancellation is never wrapped, and a failed transaction leaves nothing behind."""

from __future__ import annotations

import os
import signal
import threading

import pytest

import turnkeeper
from turnkeeper import EntryKind


def test_sigint_during_a_query_is_keyboard_interrupt_not_a_store_error(duck_real_store):
    real_store = duck_real_store
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            real_store.query("SELECT count(*) FROM range(100000000000) a")
    finally:
        timer.cancel()
    # the store still works afterwards
    real_store.create_session("after")
    assert real_store.get_session("after") is not None


def test_interrupt_inside_a_transaction_rolls_back(duck_store, monkeypatch):
    store = duck_store
    store.create_session("s")
    from turnkeeper.storage.duck.db import Tx

    real_insert = Tx.exec

    def interrupted(self, sql, params=()):
        if sql.startswith("INSERT INTO entries"):
            raise KeyboardInterrupt
        return real_insert(self, sql, params)

    monkeypatch.setattr(Tx, "exec", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.append("s", EntryKind.MESSAGE, {"message": {"role": "user", "content": "x"}})
    monkeypatch.undo()
    s = store.get_session("s")
    assert (s.leaf_id, s.entry_count, s.next_seq) == (None, 0, 1)
    assert store.entries("s") == []


def test_backend_failure_is_translated_with_cause_and_never_busy(store):
    with pytest.raises(turnkeeper.ProgrammingError) as err:
        store.query("SELECT * FROM no_such_table")
    assert err.value.__cause__ is not None
    assert not isinstance(err.value, turnkeeper.BusyError | turnkeeper.LeaseLostError)


def test_closed_store_is_an_interface_error(tmp_path):
    s = turnkeeper.open_store(str(tmp_path / "c.duckdb"))
    s.close()
    with pytest.raises(turnkeeper.InterfaceError):
        s.create_session("x")
