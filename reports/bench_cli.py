"""Big sessions in the CLI (issue 21, part 3): the rows of ``make bench`` for a
pi session file of :data:`ENTRIES` entries (synthetic, ``model_tests/pi_big.py``:
200,000 entries make 72 MB, the size issue 21 measured at 66 MB).

Each repetition, on a new DuckDB file, each step in a child process of its own
(its peak RSS as it read it at exit, ``VmHWM``; its time measured inside
it, around the call):

- the first import of the file (``turnkeeper.formats.import_file``): seconds,
  and the child's peak RSS over the file's size;
- a re-import of the unchanged file: seconds, and × the first import (goal
  at most 0.1);
- ``turnkeeper sessions show`` of the session, stdout to a pipe: seconds to
  its first entry's line, seconds to the end, peak RSS.

Import memory is also measured for files of :data:`SMALL` and :data:`ENTRIES`
entries (``rss_by_size``), in children that import only, so its growth with
the file's size shows, each beside its floor: a child that only inserts the
file's lines as entries into the same store's ``entries`` table, in chunks
of the import's ``CHUNK`` in one transaction, with the same statements
(``tx.insert_rows``), parsing and judging nothing (``duckdb_floor_mib``):
what DuckDB itself holds for a transaction of that many uncommitted rows,
which an all-or-nothing import cannot go below. The import's own memory is
its peak beyond that floor (``own_mib``): the goal row judges its growth.
Measured, never asserted. ``python reports/bench_cli.py``
runs this section alone and prints it as JSON; ``TURNKEEPER_BENCH_CLI_ENTRIES``
sets the size (CI runs it small), ``TURNKEEPER_BENCH_REPS`` the repetitions.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "model_tests"))
import pi_big  # noqa: E402

ENTRIES = int(os.environ.get("TURNKEEPER_BENCH_CLI_ENTRIES", "200000"))
SMALL = max(ENTRIES // 10, 100)
REPS = int(os.environ.get("TURNKEEPER_BENCH_REPS", "5"))

_HWM = """
import atexit, os
def _hwm():
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    with open(os.environ["TURNKEEPER_BENCH_HWM"], "w") as out:
        out.write(str(kb * 1024))
atexit.register(_hwm)
"""
"""Prepended to each child's script: at exit it writes its own peak RSS
(``VmHWM``, bytes) to the file ``TURNKEEPER_BENCH_HWM`` names. The kernel's
``ru_maxrss`` of a child counts the parent's resident pages it was forked
with (kept across ``exec``), so in ``make bench``, whose process holds a
million runs' history, every child read as 1.8 GB."""

_SHOW = _HWM + "from turnkeeper.cli.main import main\nmain()\n"

_IMPORT = (
    _HWM
    + """
import json, sys, time
import turnkeeper
from turnkeeper.formats import import_file
with turnkeeper.open_store(sys.argv[1]) as store:
    start = time.perf_counter()
    done = import_file(store, sys.argv[2])
    seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "added": done.result.added, "unchanged": done.unchanged}))
"""
)


_FLOOR = (
    _HWM
    + """
import datetime, json, sys
import turnkeeper
from turnkeeper.storage.ops.entry_rows import CLEAR_COLUMNS, ENTRY_COLUMNS
from turnkeeper.storage.ops.import_chunks import CHUNK
now = datetime.datetime.now(datetime.timezone.utc)
def body(tx):
    rows = 0
    with open(sys.argv[2], "rb") as f:
        next(f)  # the header
        chunk = []
        for seq, line in enumerate(f, 1):
            text = line.decode("utf-8").rstrip("\\n")
            no = (None,) * len(CLEAR_COLUMNS)  # unparsed: no clear facts (a few bytes)
            chunk.append(("floor", f"e{seq:07x}", None, "message", seq, now, text, None, now, *no))
            if len(chunk) == CHUNK:
                tx.insert_rows("entries", ENTRY_COLUMNS, chunk)
                rows, chunk = rows + len(chunk), []
        tx.insert_rows("entries", ENTRY_COLUMNS, chunk)
        return rows + len(chunk)
with turnkeeper.open_store(sys.argv[1]) as store:
    rows = store.db.write("floor", body)
print(json.dumps({"rows": rows}))
"""
)
"""The floor of an import's memory (see the module docstring): the file's lines
inserted as entries, in one transaction, nothing parsed or judged."""


def _child(args: list[str], first_line: bool = False) -> dict[str, Any]:
    """Run ``args`` (a script that starts with :data:`_HWM`); its JSON output
    (or, with ``first_line``, the seconds to its first stdout line and to its
    end), its peak RSS (bytes) as it wrote it."""
    fd, hwm_path = tempfile.mkstemp(prefix="turnkeeper-hwm-")
    os.close(fd)
    hwm = Path(hwm_path)
    start = time.perf_counter()
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TURNKEEPER_BENCH_HWM": hwm_path},
    )
    assert proc.stdout is not None
    out: dict[str, Any] = {}
    if first_line:
        lines = 0
        for _line in proc.stdout:
            lines += 1
            if lines == 2:  # the title, then the first entry
                out["first_entry_s"] = time.perf_counter() - start
        out["lines"] = lines
    else:
        out |= json.loads(proc.stdout.read())
    status = proc.wait()
    out["total_s"] = time.perf_counter() - start
    if status != 0:
        raise RuntimeError(f"{args[:3]} failed: {proc.stderr.read()!r}")  # type: ignore[union-attr]
    out["peak_rss"] = int(hwm.read_text())
    hwm.unlink()
    return out


def _import(db: str, path: str) -> dict[str, Any]:
    return _child([sys.executable, "-c", _IMPORT, db, path])


def _spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def big_session(folder: str) -> dict[str, Any]:
    """Every figure of this section (see the module docstring)."""
    path = f"{folder}/big.jsonl"
    size = pi_big.write(path, ENTRIES)
    first, again, ratio, rss_x, show_first, show_total, show_rss = ([] for _ in range(7))
    for rep in range(REPS):
        db = f"{folder}/cli{rep}.duckdb"
        a = _import(db, path)
        b = _import(db, path)
        assert a["added"] == ENTRIES and b["unchanged"], (a, b)
        first.append(a["seconds"])
        again.append(b["seconds"])
        ratio.append(b["seconds"] / a["seconds"])
        rss_x.append(a["peak_rss"] / size)
        s = _child(
            [sys.executable, "-c", _SHOW, "sessions", "--db", db, "show", "big-1"],
            first_line=True,
        )
        show_first.append(s["first_entry_s"])
        show_total.append(s["total_s"])
        show_rss.append(s["peak_rss"] / 2**20)
        for f in (db, f"{db}.wal"):
            Path(f).unlink(missing_ok=True)
    small = f"{folder}/small.jsonl"
    small_size = pi_big.write(small, SMALL)
    by_size = {}
    for name, p, n, b in (("small", small, SMALL, small_size), ("big", path, ENTRIES, size)):
        rss, floor, own = [], [], []
        for k in range(REPS):  # the floor interleaved with the import it bounds
            db = f"{folder}/rss-{name}-{k}"
            got = _import(f"{db}.duckdb", p)["peak_rss"] / 2**20
            base = _child([sys.executable, "-c", _FLOOR, f"{db}-floor.duckdb", p])
            assert base["rows"] == n, base
            rss.append(got)
            floor.append(base["peak_rss"] / 2**20)
            own.append(got - floor[-1])
        by_size[name] = {
            "entries": n,
            "mb": round(b / 1e6, 1),
            "peak_rss_mib": _spread(rss, 1),
            "duckdb_floor_mib": _spread(floor, 1),
            "own_mib": _spread(own, 1),
        }
    return {
        "entries": ENTRIES,
        "file_mb": round(size / 1e6, 1),
        "reps": REPS,
        "first_import_s": _spread(first),
        "noop_reimport_s": _spread(again),
        "noop_over_first": _spread(ratio),
        "import_peak_rss_over_file": _spread(rss_x, 2),
        "show_first_entry_s": _spread(show_first),
        "show_total_s": _spread(show_total),
        "show_peak_rss_mib": _spread(show_rss, 1),
        "rss_by_size": by_size,
    }


def rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The section's rows of ``reports/BENCH.md``: (row, cell)."""

    def cell(r: dict[str, float], unit: str = "") -> str:
        return f"{r['median']}{unit} [{r['min']}–{r['max']}]"

    n, mb = f"{result['entries']:,}", result["file_mb"]
    by = result["rss_by_size"]
    out = [
        (f"pi import, {n} entries ({mb} MB): first import", cell(result["first_import_s"], " s")),
        (f"pi import, {n} entries: no-op re-import", cell(result["noop_reimport_s"], " s")),
        (
            f"pi import, {n} entries: no-op / first import (goal ≤ 0.1)",
            cell(result["noop_over_first"]),
        ),
        (
            f"pi import, {n} entries: peak RSS / file size",
            cell(result["import_peak_rss_over_file"], "×"),
        ),
        (
            f"pi import peak RSS, {by['small']['mb']} MB vs {by['big']['mb']} MB file",
            f"{cell(by['small']['peak_rss_mib'], ' MiB')} vs "
            f"{cell(by['big']['peak_rss_mib'], ' MiB')}",
        ),
    ]
    if "own_mib" in by["big"]:  # measured since the import reads a chunk at a time
        out += [
            (
                f"DuckDB floor (the file's rows inserted in one transaction), "
                f"{by['small']['mb']} MB vs {by['big']['mb']} MB file",
                f"{cell(by['small']['duckdb_floor_mib'], ' MiB')} vs "
                f"{cell(by['big']['duckdb_floor_mib'], ' MiB')}",
            ),
            (
                f"pi import peak RSS beyond the floor, {by['small']['mb']} MB vs "
                f"{by['big']['mb']} MB file",
                f"{cell(by['small']['own_mib'], ' MiB')} vs {cell(by['big']['own_mib'], ' MiB')}",
            ),
        ]
    out += [
        (
            f"sessions show, {n} entries: first entry printed",
            cell(result["show_first_entry_s"], " s"),
        ),
        (f"sessions show, {n} entries: all printed", cell(result["show_total_s"], " s")),
        (f"sessions show, {n} entries: peak RSS", cell(result["show_peak_rss_mib"], " MiB")),
    ]
    return out


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        result = big_session(tmp)
    print(json.dumps(result, indent=2))
    for row, value in rows(result):
        print(f"| {row} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
