"""DuckDB's writes are serialized in process: contention between the store's own
threads never escapes as ``TransactionConflictError``, and never even costs a
retry. (PostgreSQL's writers are other processes too: their lost races are
retried, ``test_postgres.py``.)

Only one process can write a DuckDB file, so every writer is a thread of this
process; the store holds one write lock per file around each write.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import turnkeeper
from turnkeeper import EntryKind

MSG = {"message": {"role": "user", "content": "x"}}


def _run_threads(n: int, work) -> list[BaseException]:
    failures: list[BaseException] = []
    start = threading.Barrier(n)

    def one(i: int) -> None:
        start.wait()
        try:
            work(i)
        except BaseException as exc:
            failures.append(exc)

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(one, range(n)))
    return failures


def test_unconditional_appends_from_16_threads_all_land_in_one_chain(duck_real_store):
    store = duck_real_store
    store.sessions.create("s")
    per_thread = 10

    def work(i: int) -> None:
        for _ in range(per_thread):
            store.sessions.append(
                "s", EntryKind.MESSAGE, {"message": {"role": "user", "content": f"{i}"}}
            )

    assert _run_threads(16, work) == []
    entries = store.sessions.entries("s")
    assert len(entries) == 16 * per_thread
    assert [e.parent_id for e in entries] == [None] + [e.id for e in entries[:-1]]
    assert store.statement_stats()["append"]["retries"] == 0


def test_48_tool_completions_under_one_session_lease_need_no_retry(duck_real_store):
    store = duck_real_store
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 600, purpose="execution")
    run = store.runs.admit("s", {"text": "go"}, lease=lease)
    store.runs.start(run.id, lease=lease)
    for i in range(48):
        store.tools.claim(
            f"k{i}",
            "s",
            local_turn_id=run.turn_id,
            provider_call_id=f"c{i}",
            tool_name="t",
            side_effecting=False,
            run_id=run.id,
            lease=lease,
        )

    def work(i: int) -> None:
        store.tools.complete(f"k{i}", {"ok": i}, lease=lease)

    assert _run_threads(48, work) == []
    states = {r.state for r in store.tools.list("s")}
    assert states == {"completed"}
    assert store.statement_stats()["complete_tool_execution"]["retries"] == 0


@pytest.mark.parametrize("same_object", [True, False])
def test_a_write_waits_for_the_running_one(tmp_path, same_object):
    """While one write's transaction is open, another store write on the same
    file (same store object or another one in this process) does not start."""
    path = tmp_path / "w.duckdb"
    a = turnkeeper.open_store(path)
    b = a if same_object else turnkeeper.open_store(path)
    try:
        inside = threading.Event()
        release = threading.Event()
        order: list[str] = []

        def slow(tx):
            order.append("a:begin")
            inside.set()
            release.wait(timeout=60)
            order.append("a:end")

        t = threading.Thread(target=lambda: a.db.write("slow", slow))
        t.start()
        assert inside.wait(timeout=60)
        u = threading.Thread(target=lambda: b.db.write("next", lambda tx: order.append("b")))
        u.start()
        u.join(timeout=0.5)  # it must be waiting: it cannot run while "slow" is open
        assert order == ["a:begin"]
        release.set()
        t.join(timeout=60)
        u.join(timeout=60)
        assert order == ["a:begin", "a:end", "b"]
    finally:
        a.close()
        if b is not a:
            b.close()
