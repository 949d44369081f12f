"""Benchmark the store on PostgreSQL against a raw fenced UPDATE on the same server.

``python reports/bench_postgres.py URL`` (``make bench-postgres`` starts a
throwaway server with PostgreSQL's durable defaults and passes its URL).
Prints a table and writes ``reports/bench_postgres.json``:

- each operation's time per call as a ratio to the floor: a raw fenced
  compare-and-set (``UPDATE leases … WHERE target = ? AND epoch = ? AND
  expires_at > now()``, autocommit, on a pooled connection), measured
  interleaved with it in the same run (median and spread over
  :data:`REPS` repetitions), so the ratio compares across machines and load;
- fenced appends per second with 1, 4 and 8 processes, each to its own
  session, and the 4- and 8-process rates as multiples of one process's.

Measured, not asserted: CI runs it at a tiny size to prove that it runs.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind

HERE = Path(__file__).resolve().parent
REPS = int(os.environ.get("TURNKEEPER_BENCH_REPS", "5"))
CALLS = int(os.environ.get("TURNKEEPER_BENCH_CALLS", "200"))
PROCESS_S = float(os.environ.get("TURNKEEPER_BENCH_PROCESS_S", "3"))
OUT = Path(os.environ.get("TURNKEEPER_BENCH_OUT", HERE / "bench_postgres.json"))
"""Where the figures go (a test's tiny run writes elsewhere)."""
MSG = {"message": {"role": "user", "content": "x" * 200}}


def schema_url(url: str) -> str:
    """A fresh schema on the server (the benchmark's own)."""
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


def per_call(fn: Callable[[int], object], calls: int) -> float:
    """Seconds per call of ``fn`` over ``calls`` calls."""
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls


def operations(store: turnkeeper.BaseStore) -> dict[str, Callable[[int], object]]:
    store.create_session("s")
    lease = store.acquire_lease("session:s", "bench", 3600)
    store.create_session("u")  # unleased: an unfenced append is refused on a leased session
    store.create_session("r")
    for _ in range(100):
        store.append("r", EntryKind.MESSAGE, MSG)
    store.create_session("runs")
    reply = {"role": "assistant", "content": "done"}
    plan = DeliveryPlan("chat", "t", (DeliveryStep("send", "msg"),))
    many = tuple(DeliveryStep(str(n), "msg") for n in range(REPS * CALLS * 2 + 50))
    outbox = store.admit_run("runs", {"outbox": True})
    store.finish_run(outbox.id, "failed", delivery_plan=DeliveryPlan("chat", "t", many))
    claimed = iter(range(len(many)))

    def run_cycle(i: int) -> None:
        user = {"role": "user", "content": "go"}
        run = store.admit_run("runs", {"i": uuid.uuid4().hex}, user_message=user)
        store.start_run(run.id)
        store.finish_run(run.id, "succeeded", assistant_message=reply, delivery_plan=plan)

    def delivery_cycle(i: int) -> None:
        op = store.claim_delivery(f"{outbox.id}:delivery:{next(claimed)}", "bench", 60)
        store.finish_delivery(op.id, "bench", op.lease_epoch, "delivered")

    return {
        "acquire (re-acquire)": lambda i: store.acquire_lease("session:s", "bench", 3600),
        "renew": lambda i: store.renew_lease(lease, 3600),
        "acquire + release": lambda i: store.release_lease(
            store.acquire_lease(f"t{uuid.uuid4().hex}", "bench", 60)
        ),
        "append": lambda i: store.append("u", EntryKind.MESSAGE, MSG),
        "append (fenced)": lambda i: store.append("s", EntryKind.MESSAGE, MSG, lease=lease),
        "admit + start + finish": run_cycle,
        "claim + finish delivery": delivery_cycle,
        "replay (100 entries)": lambda i: store.replay("r"),
    }


def floor(store: turnkeeper.BaseStore) -> Callable[[int], object]:
    """The raw fenced compare-and-set on a pooled connection of the same store."""
    lease = store.acquire_lease("floor", "bench", 3600)
    db = store.db

    def cas(i: int) -> None:
        with db.connection() as conn:  # type: ignore[attr-defined]
            conn.execute(
                "UPDATE leases SET fenced_writes = fenced_writes + 1 "
                "WHERE target = %s AND epoch = %s AND expires_at > now()",
                ["floor", lease.epoch],
            )

    return cas


def _appender(url: str, index: int, seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    with turnkeeper.open_store(url) as store:
        sid = f"p{index}-{uuid.uuid4().hex[:6]}"
        store.create_session(sid)
        lease = store.acquire_lease(f"session:{sid}", f"p{index}", 3600)
        for _ in range(5):
            store.append(sid, EntryKind.MESSAGE, MSG, lease=lease)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            store.append(sid, EntryKind.MESSAGE, MSG, lease=lease)
            n += 1
        out.put(n / (time.perf_counter() - start))


def processes(url: str, count: int) -> float:
    """Fenced appends per second of ``count`` processes together, each to its own session."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_appender, args=(url, i, PROCESS_S, out)) for i in range(count)]
    for p in procs:
        p.start()
    rates = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    return sum(rates)


def main(argv: list[str]) -> int:
    url = schema_url(argv[0] if argv else os.environ.get("TURNKEEPER_TEST_PG", "postgresql://"))
    with turnkeeper.open_store(url) as store:
        ops = operations(store)
        cas = floor(store)
        ratios: dict[str, list[float]] = {name: [] for name in ops}
        floors: list[float] = []
        for _ in range(REPS):  # interleaved: the floor is measured beside each operation
            for name, fn in ops.items():
                base = per_call(cas, CALLS)
                floors.append(base)
                ratios[name].append(per_call(fn, CALLS) / base)
        stats = store.statement_stats()
    by_processes = {n: processes(url, n) for n in (1, 4, 8)}
    result = {
        "floor": {
            "name": "raw fenced UPDATE (autocommit, pooled connection)",
            "median_ms": round(statistics.median(floors) * 1000, 3),
        },
        "operations": {
            name: {
                "ratio_median": round(statistics.median(r), 2),
                "ratio_min": round(min(r), 2),
                "ratio_max": round(max(r), 2),
            }
            for name, r in ratios.items()
        },
        "fenced_appends_by_processes": {
            str(n): {"ops_per_s": round(rate, 1), "x_one_process": round(rate / by_processes[1], 2)}
            for n, rate in by_processes.items()
        },
        "statements_per_call": {
            op: round(s["statements_per_call"], 2)
            for op, s in stats.items()
            if op in ("append", "acquire_lease", "renew_lease", "admit_run", "finish_run")
        },
        "machine": {
            "cores": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
        "size": {"reps": REPS, "calls": CALLS, "process_s": PROCESS_S},
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"floor: {result['floor']['median_ms']} ms per raw fenced UPDATE")
    print(f"{'operation':<30}{'x floor (median)':>18}{'min':>8}{'max':>8}")
    for name, row in result["operations"].items():
        print(
            f"{name:<30}{row['ratio_median']:>18.2f}{row['ratio_min']:>8.2f}{row['ratio_max']:>8.2f}"
        )
    for n, row in result["fenced_appends_by_processes"].items():
        print(f"fenced appends, {n} processes: {row['ops_per_s']:.0f}/s ({row['x_one_process']}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
