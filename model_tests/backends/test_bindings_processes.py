"""Writer processes racing on one channel's binding, on PostgreSQL (DuckDB lets
one process write a file): the seed's ``IdentityLocks`` is an in-process lock,
and turnkeeper's database keys and transactions must hold across processes.

Each of :data:`PROCESSES` processes (``binding_process.py``) moves the channel
to sessions of its own, all at once, while this process reads every binding
over and over: at every read and at the end exactly one session holds the
channel, every process ends without an unexpected error, and each session's
row agrees with the bindings.
"""

from __future__ import annotations

import selectors
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import new_pg_schema
from test_bindings import state

import turnkeeper
from turnkeeper.storage.audit import run_audit

pytestmark = pytest.mark.postgres

HERE = Path(__file__).resolve().parents[1]  # model_tests/, where the support modules are
PROCESSES = 4
ROUNDS = 30
HANG_GUARD_S = 300.0
"""Seconds a process gets to be ready or done (a hang guard, never a timing)."""


def _ready(p: subprocess.Popen[bytes]) -> None:
    assert p.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        assert sel.select(HANG_GUARD_S), "a writer process was not ready"
    line = p.stdout.readline()
    assert line == b"ready\n", (line, p.stderr.read() if p.stderr and p.poll() else b"")


def test_writer_processes_racing_on_one_channel_never_share_or_lose_it(tmp_path):
    url = new_pg_schema()
    go = tmp_path / "go"
    with turnkeeper.open_store(url) as store:
        for i in range(PROCESSES):
            store.sessions.create(f"p{i}")
        store.bindings.bind("p0", "chat", "room")
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "binding_process.py"),
                    url,
                    str(i),
                    str(go),
                    str(ROUNDS),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for i in range(PROCESSES)
        ]
        try:
            for p in procs:
                _ready(p)
            go.touch()
            seen: list[int] = []
            while any(p.poll() is None for p in procs):
                seen.append(len([b for b in store.bindings.list() if b.channel_id == "room"]))
            codes = [p.wait(timeout=HANG_GUARD_S) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        errors = [p.stderr.read().decode() for p in procs if p.stderr]
        assert codes == [0] * PROCESSES, errors
        assert seen and set(seen) == {1}, sorted(set(seen))
        final = state(store)
        assert len(final) == 1 and final[0][1:] == ("chat", "room")
        assert [c.name for c in run_audit(store) if not c.passed] == []
