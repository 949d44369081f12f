"""Benchmark the store's hot operations against a bare DuckDB write, same run.

Prints a table and writes ``reports/bench.json``. Each figure is operations
per second on this machine plus its ratio to the baseline (a bare
single-row autocommit ``UPDATE`` on the same kind of file), so the numbers
compare across machines. Measured, so CI checks the file's presence and
format only, and runs it at a tiny size (``TURNKEEPER_BENCH_SECONDS``) to prove
that it runs. Run: ``make reports`` (or ``python reports/bench.py``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

import turnkeeper
from turnkeeper import EntryKind

HERE = Path(__file__).resolve().parent
SECONDS = float(os.environ.get("TURNKEEPER_BENCH_SECONDS", "1.5"))
OUT = Path(os.environ.get("TURNKEEPER_BENCH_OUT", HERE / "bench.json"))
"""Where the figures go (a test's tiny run writes elsewhere)."""
DELIVERY_OPS = 3000
"""Outbox operations planned for the claim/finish figure (more than it can claim in
``SECONDS``)."""


def rate(fn: Callable[[int], object]) -> float:
    """Calls of ``fn`` per second over about ``SECONDS`` (after a short warm-up)."""
    for i in range(20):
        fn(-i - 1)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < SECONDS:
        fn(n)
        n += 1
    return n / (time.perf_counter() - start)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect(f"{tmp}/baseline.duckdb")
        con.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BIGINT)")
        con.execute("INSERT INTO t VALUES (1, 0)")
        baseline = rate(lambda i: con.execute("UPDATE t SET v = v + 1 WHERE k = 1"))
        con.close()

        store = turnkeeper.open_store(f"{tmp}/store.duckdb")
        store.create_session("s")
        lease = store.acquire_lease("session:s", "bench", 3600)
        store.create_session("u")  # unleased: an unfenced append is refused on a leased session
        msg = {"message": {"role": "user", "content": "x" * 200}}
        figures = {
            "acquire_reacquire": rate(lambda i: store.acquire_lease("session:s", "bench", 3600)),
            "renew": rate(lambda i: store.renew_lease(lease, 3600)),
            "acquire_release_cycle": rate(
                lambda i: store.release_lease(store.acquire_lease(f"t{i}", "bench", 60))
            ),
            "append": rate(lambda i: store.append("u", EntryKind.MESSAGE, msg)),
            "append_fenced": rate(lambda i: store.append("s", EntryKind.MESSAGE, msg, lease=lease)),
            "replay_100": 0.0,
        }
        store.create_session("runs")
        reply = {"role": "assistant", "content": "done"}
        one_step = turnkeeper.DeliveryPlan("chat", "t", (turnkeeper.DeliveryStep("send", "msg"),))

        def run_cycle(i: int) -> None:
            run = store.admit_run("runs", {"i": i}, user_message={"role": "user", "content": "x"})
            store.start_run(run.id)
            store.finish_run(run.id, "succeeded", assistant_message=reply, delivery_plan=one_step)

        figures["run_admit_start_finish"] = rate(run_cycle)
        many = tuple(turnkeeper.DeliveryStep(str(n), "msg") for n in range(DELIVERY_OPS))
        outbox = store.admit_run("runs", {"outbox": True})
        store.finish_run(
            outbox.id, "failed", delivery_plan=turnkeeper.DeliveryPlan("chat", "t", many)
        )

        def delivery_cycle(i: int) -> None:
            op = store.claim_delivery(f"{outbox.id}:delivery:{i + 20}", "bench", 60)
            store.finish_delivery(op.id, "bench", op.lease_epoch, "delivered")

        figures["delivery_claim_finish"] = rate(delivery_cycle)
        store.create_session("r")
        for _ in range(100):
            store.append("r", EntryKind.MESSAGE, msg)
        figures["replay_100"] = rate(lambda i: store.replay("r"))
        stats = store.statement_stats()
        store.close()

    result = {
        "baseline": {"name": "bare DuckDB autocommit UPDATE", "ops_per_s": round(baseline, 1)},
        "operations": {
            name: {"ops_per_s": round(ops, 1), "ratio_to_baseline": round(ops / baseline, 3)}
            for name, ops in figures.items()
        },
        "statements_per_call": {
            op: round(s["statements_per_call"], 2)
            for op, s in stats.items()
            if op
            in (
                "acquire_lease",
                "renew_lease",
                "release_lease",
                "append",
                "replay",
                "admit_run",
                "finish_run",
                "claim_delivery",
                "finish_delivery",
            )
        },
        "machine": {"python": platform.python_version(), "duckdb": duckdb.__version__},
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{'operation':<24}{'ops/s':>10}{'x baseline':>12}")
    print(f"{'baseline UPDATE':<24}{baseline:>10.0f}{1.0:>12.2f}")
    for name, row in result["operations"].items():
        print(f"{name:<24}{row['ops_per_s']:>10.0f}{row['ratio_to_baseline']:>12.2f}")
    print("statements per call:", result["statements_per_call"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
