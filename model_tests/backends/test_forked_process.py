"""A process forked from one that opened a store (``os.fork``, multiprocessing's
default start method on Linux, a pre-forking server with the app loaded first)
must not use the parent's store object: its copy of the DuckDB file's
connection or of the pool's sockets is not its own, and neither is the
store object's lease secret (attack helper: the child's ``leases.acquire``
under the parent's owner name got the parent's live lease, same token and
epoch; on DuckDB the child's fenced append was acknowledged and then lost,
on PostgreSQL both processes wrote under one lease). Every operation in the
child raises ``InterfaceError`` saying to open the store again, and the
child's ``close()`` leaves the parent's connections alone."""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path

import pytest
from conftest import BACKENDS, open_backend

import turnkeeper
from turnkeeper import EntryKind, InterfaceError
from turnkeeper.storage import retry

M = EntryKind.MESSAGE
USER = {"message": {"role": "user", "content": "hi"}}


def in_child(store: turnkeeper.BaseStore, lease: turnkeeper.Lease) -> int:
    """Fork; in the child, try the parent's store object: exit 0 when every
    use was refused with InterfaceError, 1 when any went through, 2 on
    anything else. The child's own close comes last."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 2
        faulthandler.disable()  # the control's child may crash: its exit code says so
        try:
            calls = [
                lambda: store.leases.acquire(lease.target, lease.owner, 60),
                lambda: store.sessions.append("s", M, USER, lease=lease),
                lambda: store.sessions.entries("s"),
                lambda: store.query("SELECT 1 AS one"),
            ]
            refused = 0
            for call in calls:
                try:
                    call()
                except InterfaceError as err:
                    refused += "open the store again" in str(err)
            code = 0 if refused == len(calls) else 1
            store.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forked_child_cannot_use_the_parents_store_object(backend: str, tmp_path: Path):
    store = open_backend(backend, tmp_path, None)
    try:
        store.sessions.create("s")
        lease = store.leases.acquire("session:s", "w", 60)
        assert in_child(store, lease) == 0
        # the parent's store object still works, its lease is its own
        store.sessions.append("s", M, USER, lease=lease)
        assert len(store.sessions.entries("s")) == 1
        assert store.leases.acquire("session:s", "w", 60).token == lease.token
    finally:
        store.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_fork_test_fails_without_the_check(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Control: with the check patched out the child uses the parent's store
    object (its lease went through, or on DuckDB the inherited connection
    crashes the child outright)."""
    monkeypatch.setattr(retry.Gate, "forked", lambda self: False)
    store = open_backend(backend, tmp_path, None)
    try:
        store.sessions.create("s")
        lease = store.leases.acquire("session:s", "w", 60)
        assert in_child(store, lease) != 0
    finally:
        store.close()
