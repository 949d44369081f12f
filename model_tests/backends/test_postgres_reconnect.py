"""Resuming after an outage: the pool's reconnection schedule (issue 24).

psycopg_pool waits 1, 2, 4, 8, 16 s … between the attempts of a connection
it makes again, and that schedule is not a public setting: a server down for
20 s was tried again at +15.7 s and +31 s, so writes resumed 12 s after it
took connections again and a call waiting meanwhile failed with the pool's
timeout. The store's pool (``storage/postgres/pool.py``) attempts on a
short, capped schedule (``reconnect_delay_s`` doubling up to
``reconnect_max_delay_s``) through a private seam of psycopg_pool
(``ConnectionPool._add_connection``); the seam test here fails loudly if a
psycopg_pool release moves it.

No test asserts an elapsed time: the schedule is checked as the delays the
pool asks its scheduler for, and the server restart as facts (the waiting
write succeeded, every wait between attempts was within the cap); the resume
time is printed.
"""

from __future__ import annotations

import asyncio
import inspect
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg_pool
import pytest
import with_postgres
from conftest import pg_url
from psycopg_pool.pool import AddConnection

import turnkeeper
from turnkeeper.storage.postgres import pool as pg_pool

TIMEOUT_S = 120
"""A guard against hangs only (a loaded 2-core machine)."""

OUTAGE_S = 8.0
"""How long the server stays down: past psycopg_pool's attempts at +0, +1, +3
and +7 s, so its next would come at +15 s."""

NOWHERE = "host=/nonexistent/turnkeeper-reconnect port=5432 dbname=x user=x"
"""A server that refuses every attempt at once (its socket folder does not exist)."""


def schedule(first_s: float, max_s: float, failures: int) -> list[float]:
    """The waits a :class:`~pg_pool.Backoff` sets after ``failures`` failed
    attempts at one instant."""
    backoff = pg_pool.Backoff(timeout=300.0, first_s=first_s, max_s=max_s)
    waits = []
    for _ in range(failures):
        backoff.update_delay(1000.0)
        waits.append(backoff.delay)
    return waits


def test_the_waits_double_from_the_first_up_to_the_cap() -> None:
    waits = schedule(0.1, 0.5, 8)
    assert 0.09 <= waits[0] <= 0.11  # the first, with psycopg_pool's ±10 % jitter
    assert waits[1:3] == pytest.approx([2 * waits[0], 4 * waits[0]])
    assert waits[3:] == [0.5] * 5  # capped from the fourth on
    fixed = schedule(2.0, 2.0, 3)  # first and cap alike: a fixed wait (the first jittered)
    assert 1.8 <= fixed[0] <= 2.0 and fixed[1:] == [2.0, 2.0]


def test_the_waits_stop_at_the_reconnect_timeout() -> None:
    """The schedule never runs past psycopg_pool's ``reconnect_timeout``: the
    last wait is what is left of it, and then the attempt gives up."""
    backoff = pg_pool.Backoff(timeout=1.0, first_s=0.4, max_s=0.5)
    backoff.update_delay(0.0)
    backoff.update_delay(0.5)
    assert backoff.delay == pytest.approx(0.5)  # 0.8 capped
    backoff.update_delay(0.9)
    assert backoff.delay == pytest.approx(0.1)  # 1.0 s after the first failure
    assert not backoff.time_to_give_up(0.9) and backoff.time_to_give_up(1.0)


def test_the_pool_attempts_on_the_capped_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seam: the store's pool gives every new connection's attempts the
    capped schedule. A psycopg_pool that no longer makes connections through
    ``_add_connection(attempt, growing)`` fails this test (pin
    ``psycopg-pool`` in pyproject.toml below it, or move the override)."""
    seam = inspect.signature(psycopg_pool.ConnectionPool._add_connection)
    assert list(seam.parameters) == ["self", "attempt", "growing"], (
        f"psycopg_pool {psycopg_pool.__version__} changed ConnectionPool._add_connection "
        f"{seam}: the store's pool (storage/postgres/pool.py) overrides it"
    )
    waits: list[float] = []
    enough = threading.Event()
    pool = pg_pool.Pool(NOWHERE, 1, None).pool
    real = pool.schedule_task

    def scheduled(task: Any, delay: float) -> None:
        if not isinstance(task, AddConnection):  # the pool's other chores (ShrinkPool)
            return real(task, delay)
        waits.append(delay)
        if len(waits) >= 6:
            enough.set()
            return  # no more attempts
        real(task, 0.0)  # attempt again at once: the test waits for no clock

    monkeypatch.setattr(pool, "schedule_task", scheduled)
    pool.open(wait=False)
    try:
        assert enough.wait(TIMEOUT_S), f"the pool scheduled {waits} only"
    finally:
        pool.close()
    cap = pg_pool.RECONNECT_MAX_DELAY_S
    assert all(wait <= cap for wait in waits), (
        f"the pool waited {waits} s between attempts, not at most {cap} s"
    )
    first = pg_pool.RECONNECT_DELAY_S
    assert first * 0.9 <= waits[0] <= first * 1.1, waits


def test_the_native_pool_attempts_on_the_capped_schedule() -> None:
    """The same seam of ``psycopg_pool.AsyncConnectionPool``, which the native
    async store's pool (``pool.AsyncPool``) overrides the same way."""
    from psycopg_pool.pool_async import AddConnection as AsyncAddConnection

    seam = inspect.signature(psycopg_pool.AsyncConnectionPool._add_connection)
    assert list(seam.parameters) == ["self", "attempt", "growing"], (
        f"psycopg_pool {psycopg_pool.__version__} changed AsyncConnectionPool._add_connection "
        f"{seam}: the native store's pool (storage/postgres/pool.py) overrides it"
    )

    async def main() -> list[float]:
        waits: list[float] = []
        enough = asyncio.Event()
        pool = pg_pool.AsyncPool(NOWHERE, 1, None).pool
        real = pool.schedule_task

        async def scheduled(task: Any, delay: float) -> None:
            if not isinstance(task, AsyncAddConnection):  # the pool's other chores
                return await real(task, delay)
            waits.append(delay)
            if len(waits) >= 6:
                enough.set()
                return None  # no more attempts
            return await real(task, 0.0)  # attempt again at once: no clock is waited for

        pool.schedule_task = scheduled  # type: ignore[method-assign]
        await pool.open(wait=False)
        try:
            async with asyncio.timeout(TIMEOUT_S):
                await enough.wait()
        finally:
            await pool.close()
        return waits

    waits = asyncio.run(main())
    cap = pg_pool.RECONNECT_MAX_DELAY_S
    assert all(wait <= cap for wait in waits), (
        f"the pool waited {waits} s between attempts, not at most {cap} s"
    )
    first = pg_pool.RECONNECT_DELAY_S
    assert first * 0.9 <= waits[0] <= first * 1.1, waits


def test_the_settings_are_checked() -> None:
    for bad in (
        {"pool_timeout_s": 0},
        {"reconnect_delay_s": -1.0},
        {"reconnect_max_delay_s": float("inf")},
        {"reconnect_delay_s": 2.0, "reconnect_max_delay_s": 1.0},
    ):
        with pytest.raises(turnkeeper.InvalidInputError) as err:
            turnkeeper.open_store(NOWHERE, **bad)
        assert err.value.field in bad
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        turnkeeper.open_store(":memory:", reconnect_delay_s=0.1)
    assert err.value.field == "reconnect_delay_s"


# -- a real outage: a private server stopped and started again -------------------


def pg_ctl(bin_: Path, folder: Path, *args: str) -> None:
    """Run ``pg_ctl`` on the private server of ``folder`` (as its user)."""
    subprocess.run(
        [str(bin_ / "pg_ctl"), "-D", str(folder / "data"), *args],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=folder,
        timeout=TIMEOUT_S,
        **with_postgres.server_user(),
    )


def restart_options(folder: Path) -> list[str]:
    """``pg_ctl start``'s arguments that start the server as with_postgres.py did
    (``--durable``: with ``fsync`` or ``synchronous_commit`` off, a stop with
    ``-m immediate`` just after the store's migrations can lose them, and the
    write after the restart finds no ``sessions`` table)."""
    options = with_postgres.settings_for(folder, durable=True)
    settings = " ".join(f"-c {o}" for o in options)
    return ["-l", str(folder / "server.log"), "-w", "-t", str(TIMEOUT_S), "-o", settings, "start"]


@pytest.mark.postgres
def test_a_write_waiting_through_an_outage_succeeds_soon_after_the_server_is_back() -> None:
    """A store writes; its server is stopped with ``-m immediate`` and kept
    down past psycopg_pool's first four attempts (+0, +1, +3, +7 s) while a write
    waits for a connection; then it starts. The waiting write succeeds, and
    every wait between the pool's attempts was within the cap (psycopg_pool's
    own schedule waited 1, 2, 4 s). A private server: the suite's shared one
    is never stopped."""
    pg_url()  # skip (fail in CI) where the suite has no PostgreSQL
    bin_ = with_postgres.bindir()
    if bin_ is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed")
    folder = Path(tempfile.mkdtemp(prefix="turnkeeper-reconnect-"))
    try:
        url = with_postgres.start(bin_, folder, durable=True)
        with turnkeeper.open_store(url) as store:
            pool = store.db._pool  # type: ignore[attr-defined]
            waits: list[float] = []
            real = pool.schedule_task

            def scheduled(task: Any, delay: float) -> None:
                if isinstance(task, AddConnection):
                    waits.append(delay)
                real(task, delay)

            pool.schedule_task = scheduled
            store.sessions.create("before")
            pg_ctl(bin_, folder, "-m", "immediate", "-w", "stop")
            outcome: list[Any] = []
            done = threading.Event()

            def write() -> None:
                try:
                    outcome.append(store.sessions.create("during"))
                except BaseException as exc:  # reported below
                    outcome.append(exc)
                finally:
                    done.set()

            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            deadline = time.monotonic() + TIMEOUT_S
            while pool.get_stats().get("requests_waiting", 0) < 1 and not done.is_set():
                assert time.monotonic() < deadline, "the write never waited for a connection"
                time.sleep(0.01)
            time.sleep(OUTAGE_S)  # the outage (nothing is judged by it)
            assert not done.is_set(), f"the write ended while the server was down: {outcome}"
            pg_ctl(bin_, folder, *restart_options(folder))
            back = time.monotonic()  # pg_ctl -w returns once the server takes connections
            assert done.wait(TIMEOUT_S), "the waiting write never ended"
            resumed = time.monotonic() - back
            assert not isinstance(outcome[0], BaseException), f"the waiting write raised {outcome}"
            assert store.sessions.get("during") is not None
            stats = pool.get_stats()
        print(
            f"\nreconnect: the waiting write succeeded {resumed:.2f} s after pg_ctl saw the "
            f"server back; {stats.get('connections_errors', 0)} failed attempts, "
            f"waits {[round(w, 2) for w in waits]}"
        )
        assert waits, "the pool never had to attempt again"
        cap = pg_pool.RECONNECT_MAX_DELAY_S
        assert all(w <= cap for w in waits), f"waits {waits} s between attempts, cap {cap} s"
    finally:
        subprocess.run(
            [str(bin_ / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate", "-w", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=folder,
            **with_postgres.server_user(),
        )
        shutil.rmtree(folder, ignore_errors=True)
