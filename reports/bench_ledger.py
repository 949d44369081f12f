"""The ledger's rows of ``make bench`` (issue 19, performance): group commit
and replay's memory bound, as ratios measured in the same run.

- one writer appending single records (one record per commit): the floor
  the other rows are multiples of;
- 16 writers (16 sessions, each its own lease and ``LedgerWriter``, one
  thread each) appending single records: × one writer (target ≥ 8×);
- 16 writers appending batches of :data:`BATCH` small records
  (``append_many``): durable records/s (target ≥ 40,000 on DuckDB here) and
  × the one-record-per-commit rate (target ≥ 20×);
- a replay of :data:`REPLAY_RECORDS` records from sequence 1: its peak
  traced memory (``tracemalloc``) against its stated bound (256 KiB +
  ``page_rows`` × (largest payload + 512 bytes), ``Ledger.replay``), and the
  peak of a replay of the last tenth from its sequence (the same size: the
  bound does not grow with the records replayed).

Every writer is ready (session, lease, writer, a first append) before any is
timed. Measured, never asserted. ``python reports/bench_ledger.py`` runs
this section alone (DuckDB on a durable file, and PostgreSQL when
``TURNKEEPER_TEST_PG`` names a server) and prints it as JSON.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from typing import Any

import turnkeeper
from turnkeeper import LedgerEntry

WRITERS = 16
BATCH = 100
PAYLOAD = b'{"role":"assistant","text":"' + b"x" * 64 + b'"}'
"""A small record: 95 bytes."""
SECONDS = float(os.environ.get("TURNKEEPER_BENCH_WRITERS_S", "2"))
"""How long each writer count appends (every writer at least 3 calls)."""
PROCESSES = 8
"""PostgreSQL: processes appending single records, one writer each."""
REPLAY_RECORDS = int(os.environ.get("TURNKEEPER_BENCH_LEDGER_REPLAY", "100000"))
RECORD_OVERHEAD = 512
"""Bytes a replayed record costs beyond its payload, as ``Ledger.replay`` states."""
REPLAY_FIXED = 256 * 1024
"""Bytes of replay's working set that do not grow with the ledger, as ``Ledger.replay`` states."""


def writers(store: turnkeeper.BaseStore, count: int, batch: int, together: Any = None) -> float:
    """Durable records per second of ``count`` threads, each the writer of its own
    session's ledger, appending ``batch`` records per call (``append`` for 1);
    ``together``: a barrier of other processes' writers, waited for too."""
    ready, go = threading.Barrier(count + 1), threading.Event()
    rates: list[float] = []
    lock = threading.Lock()

    def run() -> None:
        sid = f"l{uuid.uuid4().hex[:10]}"
        store.sessions.create(sid)
        lease = store.leases.acquire(f"session:{sid}", sid, 3600)
        w = store.ledger.open(sid, lease)
        w.append("turn", PAYLOAD, "warm")
        ready.wait()
        go.wait()
        n, calls, start = 0, 0, time.perf_counter()
        while calls < 3 or time.perf_counter() - start < SECONDS:
            if batch == 1:
                w.append("turn", PAYLOAD, f"{calls}")
            else:
                w.append_many([LedgerEntry("turn", PAYLOAD, f"{calls}.{i}") for i in range(batch)])
            n += batch
            calls += 1
        with lock:
            rates.append(n / (time.perf_counter() - start))

    pool = [threading.Thread(target=run) for _ in range(count)]
    for t in pool:
        t.start()
    ready.wait()
    if together is not None:
        together.wait()
    go.set()
    for t in pool:
        t.join()
    return sum(rates)


def _process_writer(url: str, out: Any, together: Any) -> None:
    with turnkeeper.open_store(url) as store:
        out.put(writers(store, 1, 1, together))


def processes(url: str, count: int) -> float:
    """Durable records per second of ``count`` processes (PostgreSQL), each one
    writer appending single records: no batch is shared across processes, so
    this is the server's own commit grouping."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    together = ctx.Barrier(count)
    procs = [ctx.Process(target=_process_writer, args=(url, out, together)) for _ in range(count)]
    for p in procs:
        p.start()
    rates = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    return sum(rates)


def replay_memory(store: turnkeeper.BaseStore, records: int) -> dict[str, Any]:
    """Write ``records`` records to one ledger, then replay them from sequence 1
    under ``tracemalloc``: the peak against the stated bound, and the time."""
    sid = f"r{uuid.uuid4().hex[:10]}"
    store.sessions.create(sid)
    w = store.ledger.open(sid, store.leases.acquire(f"session:{sid}", sid, 3600))
    for start in range(0, records, 1000):
        w.append_many(
            [LedgerEntry("turn", PAYLOAD, f"{i}") for i in range(start, min(records, start + 1000))]
        )
    page_rows = turnkeeper.storage.ops.ledger.PAGE_ROWS
    bound = REPLAY_FIXED + page_rows * (len(PAYLOAD) + RECORD_OVERHEAD)
    sum(1 for _ in store.ledger.replay(sid, records - 10))  # warm: imports, caches
    tracemalloc.start()
    began = time.perf_counter()
    seen = sum(1 for _ in store.ledger.replay(sid, 1))
    seconds = time.perf_counter() - began
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    tenth = records // 10  # the last tenth, from its sequence: the same bound, not a tenth
    tracemalloc.start()
    sum(1 for _ in store.ledger.replay(sid, records + 2 - tenth))
    peak_tenth = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "records": seen - 1,  # the fence record aside
        "seconds": round(seconds, 3),
        "records_per_s": round(seen / seconds),
        "peak_bytes": peak,
        "bound_bytes": bound,
        "peak_x_bound": round(peak / bound, 3),
        "last_tenth_peak_bytes": peak_tenth,
    }


def ledger(store: turnkeeper.BaseStore, url: str | None = None) -> dict[str, Any]:
    """The section: rates (records/s) and their ratios, and replay's memory;
    with ``url`` (PostgreSQL) also :data:`PROCESSES` processes against one."""
    one = writers(store, 1, 1)
    many_single = writers(store, WRITERS, 1)
    many_batched = writers(store, WRITERS, BATCH)
    stats = store.statement_stats()
    across: dict[str, Any] = {}
    if url is not None:
        alone, together = processes(url, 1), processes(url, PROCESSES)
        across = {
            "processes": {
                "one_process_single_records_per_s": round(alone),
                f"{PROCESSES}_processes_single_records_per_s": round(together),
                f"{PROCESSES}_processes_x_one_process": round(together / alone, 2),
            }
        }
    return across | {
        "one_writer_single_records_per_s": round(one),
        f"{WRITERS}_writers_single_records_per_s": round(many_single),
        f"{WRITERS}_writers_single_x_one_writer": round(many_single / one, 2),
        f"{WRITERS}_writers_batches_of_{BATCH}_records_per_s": round(many_batched),
        f"{WRITERS}_writers_batches_x_one_record_per_commit": round(many_batched / one, 2),
        "appends_grouped": {
            op: {"calls": s["calls"], "grouped": s["grouped"]}
            for op, s in stats.items()
            if op.startswith("ledger_append")
        },
        "replay": replay_memory(store, REPLAY_RECORDS),
    }


def rows(section: dict[str, Any]) -> list[tuple[str, str]]:
    """The section's rows of ``reports/BENCH.md``: (row, cell)."""
    r = section["replay"]
    w = WRITERS
    across: list[tuple[str, str]] = []
    if "processes" in section:
        p = section["processes"]
        across = [
            (
                f"ledger: {PROCESSES} processes, single records (server's commit grouping)",
                f"{p[f'{PROCESSES}_processes_x_one_process']}× one process "
                f"({p[f'{PROCESSES}_processes_single_records_per_s']}/s)",
            )
        ]
    return [
        (
            "ledger: 1 writer, single records (one record per commit)",
            f"{section['one_writer_single_records_per_s']}/s",
        ),
        (
            f"ledger: {w} writers, single records",
            f"{section[f'{w}_writers_single_x_one_writer']}× one writer "
            f"({section[f'{w}_writers_single_records_per_s']}/s)",
        ),
        (
            f"ledger: {w} writers, batches of {BATCH}",
            f"{section[f'{w}_writers_batches_x_one_record_per_commit']}× one record per commit "
            f"({section[f'{w}_writers_batches_of_{BATCH}_records_per_s']} records/s)",
        ),
        (
            f"ledger: replay of {r['records']} records from seq 1, peak memory / bound",
            f"{r['peak_x_bound']} ({r['peak_bytes']} / {r['bound_bytes']} bytes, "
            f"{r['seconds']} s; last tenth: {r['last_tenth_peak_bytes']} bytes)",
        ),
        *across,
    ]


def main() -> int:
    out: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        turnkeeper.open_store(f"{tmp}/ledger.duckdb") as store,
    ):
        out["duckdb"] = ledger(store)
    url = os.environ.get("TURNKEEPER_TEST_PG")
    if url:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench import pg_schema

        schema = pg_schema(url)
        with turnkeeper.open_store(schema) as store:
            out["postgres"] = ledger(store, schema)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
