"""``python -m mutation_net [--area NAME ...] [--module FILE ...] [--jobs N] [--report-only]``
(from ``model_tests/``; ``make mutation-net``).

For each area (all without ``--area``; only the modules ``--module`` names,
paths inside ``turnkeeper/``, when given): copy the installed package to a
temporary folder, check the area's tests pass on the copy unmutated, run
cosmic-ray over its modules there, and fold the outcome into
``reports/MUTATION_NET.json`` and ``.md`` (other modules' earlier figures
kept). Prints one line per area: mutants, killed, survived, timed out,
seconds. ``--jobs N`` splits each area's mutants into N shards (by operator
and line: :func:`run.shard`), each run in its own copy at the same time (one
per core: the tests are single-threaded). Exits 1 when a survivor has no
entry in ``survivors.SURVIVORS``, 2 when an area's tests fail unmutated.
``--report-only`` rewrites the report from the JSON (after a classification
changed) and runs nothing. ``--check-kills`` runs, for every survivor
classified ``killed``, that mutant alone against its killing tests and
requires them to fail (exit 1 when one does not).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from mutation_net import report
from mutation_net.areas import Area, by_name
from mutation_net.run import (
    SERVER_ENV,
    TIMEOUT_S,
    baseline,
    prepare_copy,
    run_area,
    run_shards,
    selected,
)
from mutation_net.survivors import SURVIVORS


def check_kills(timeout_s: float) -> int:
    """Each ``killed`` survivor's mutant alone against its killing tests: 0 when
    every one fails them, else 1 (the survivors not killed printed). Run it
    under ``with_postgres.py``: the tests then see the test server, so a kill
    only a PostgreSQL case makes (a server-only path: ``SKIP LOCKED``, row
    locks) is checked too; a survivor none of whose tests runs here (no
    server) is reported unchecked and fails the check."""
    bad = 0
    server = SERVER_ENV in os.environ
    for site, verdict in SURVIVORS.items():
        if verdict.kind != "killed":
            continue
        area = Area("kill", (site.file,), verdict.tests)
        with tempfile.TemporaryDirectory(prefix="turnkeeper-net-kill-") as tmp:
            folder = Path(tmp)
            copy = prepare_copy(folder)
            if not selected(verdict.tests, folder, server):
                bad += 1
                why = "no test of it runs here: a PostgreSQL case needs the test server"
                print(f"{site.file} {site.operator} {site.line!r}: unchecked ({why})", flush=True)
                continue
            found = run_area(
                area, folder, copy, timeout_s=timeout_s, server=server,
                keep=lambda op, line, s=site: (op, line) == (s.operator, s.line),
            )  # fmt: skip
        verdicts = sorted({m.verdict for m in found})
        ok = bool(found) and verdicts == ["killed"]
        bad += not ok
        print(f"{site.file} {site.operator} {site.line!r}: {verdicts} ({len(found)})", flush=True)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutation_net")
    parser.add_argument("--area", action="append", help="run this area (repeat)")
    parser.add_argument("--module", action="append", help="only this module (repeat)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per mutant")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (one per core)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--check-kills", action="store_true")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.check_kills:
        return check_kills(args.timeout)
    areas = [] if args.report_only else by_name(args.area)
    if args.module:
        areas = [a for a in areas if set(a.modules) & set(args.module)]
    data = report.load()
    for area in areas:
        modules = [m for m in area.modules if not args.module or m in args.module]
        with tempfile.TemporaryDirectory(prefix=f"turnkeeper-net-{area.name}-") as tmp:
            folders = [Path(tmp) / f"shard-{k}" for k in range(args.jobs)]
            copies = [prepare_copy(folder) for folder in folders]
            ok, seconds, tail = baseline(area, folders[0])
            print(f"{area.name}: unmutated tests {'pass' if ok else 'FAIL'} ({seconds:.0f} s)",
                  flush=True)  # fmt: skip
            if not ok:
                print(tail)
                return 2
            started = time.monotonic()
            found = run_shards(area, folders, copies, modules, args.timeout)
            took = time.monotonic() - started
        counts = {v: sum(1 for m in found if m.verdict == v) for v in report.VERDICTS}
        print(f"{area.name}: {len(found)} mutants, " + ", ".join(
            f"{k} {n}" for k, n in counts.items()) + f" ({took:.0f} s)", flush=True)  # fmt: skip
        data = report.merge(data, area, modules, found, took, args.timeout)
        report.write(report.finish(data))
    data = report.finish(data)
    report.write(data)
    for s in data["survivors"]:
        if s["classification"] is None:
            print(f"UNCLASSIFIED {s['file']}:{s['line']} {s['operator']}\n{s['diff']}")
    return 1 if data["unclassified"] else 0


if __name__ == "__main__":
    sys.exit(main())
