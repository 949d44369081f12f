"""``examples/langgraph_resume.py`` runs: killed with SIGKILL inside a step, it
resumes from its last checkpoint in the turnkeeper DuckDB file on the next run,
without running the finished steps again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "langgraph_resume.py"


def _wait_for(path: Path, proc: subprocess.Popen[str], limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the example never reached the step"
        time.sleep(0.05)


def test_the_example_resumes_after_a_kill(tmp_path: Path) -> None:
    db = tmp_path / "pipeline.duckdb"
    marker = tmp_path / "inside"
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), str(db), "--hang-in", "summarize", str(marker)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(marker, proc)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        first, _ = proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert first.splitlines() == ["running fetch", "running parse", "running summarize"]
    again = subprocess.run(
        [sys.executable, str(EXAMPLE), str(db)], capture_output=True, text=True, check=True
    )
    assert again.stdout.splitlines() == [
        "resuming at summarize",
        "running summarize",
        "running publish",
        "done: fetch, parse, summarize, publish",
    ]
    finished = subprocess.run(
        [sys.executable, str(EXAMPLE), str(db)], capture_output=True, text=True, check=True
    )
    assert finished.stdout.splitlines() == ["done: fetch, parse, summarize, publish"]
