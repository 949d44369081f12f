"""Which killing test ids exist: pytest's own collection of their files."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

MODEL_TESTS = Path(__file__).resolve().parent.parent


def collected(files: Iterable[str]) -> set[str]:
    """The node ids (relative to ``model_tests/``) pytest collects from ``files``,
    the PostgreSQL cases included without a test server (``--collect-only``
    runs nothing and connects to nothing)."""
    names = sorted(set(files))
    # conftest.py deselects the PostgreSQL cases without a server URL, all but
    # the encrypted ones under TURNKEEPER_TEST_ENCRYPTED=only, and the clear
    # ones through PgBouncer: a URL (never connected to) and neither of those
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TURNKEEPER_TEST_ENCRYPTED", "TURNKEEPER_TEST_PGBOUNCER")
    }
    env["TURNKEEPER_TEST_PG"] = "postgresql://collect-only@/none"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *names],
        cwd=MODEL_TESTS,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    found = set()
    for line in done.stdout.splitlines():
        if "::" in line:
            found.add(line.strip().removeprefix("model_tests/"))
    return found


def missing(tests: Iterable[str]) -> list[str]:
    """The ids of ``tests`` that name no collected test. An id without
    parameters names a function whose every parametrized case counts."""
    wanted = sorted(set(tests))
    found = collected(t.split("::", 1)[0] for t in wanted)
    bare = {f.split("[", 1)[0] for f in found}
    return [t for t in wanted if t not in found and t not in bare]
