"""One area's cosmic-ray session, run against a temporary copy of the installed package.

:func:`prepare_copy` copies the installed ``turnkeeper`` (as the fence-mutant
catalog's runner does) and compiles it with checked-hash ``.pyc`` files: a
mutated module's hash differs from its ``.pyc`` and is compiled afresh (never
written: cosmic-ray runs the tests with ``PYTHONDONTWRITEBYTECODE``), the
others load compiled. :func:`run_area` writes the session's configuration
(module paths inside the copy, the test command, the per-mutant timeout),
lets ``cosmic-ray init`` list the mutants, marks every mutant of an operator
not in :data:`areas.OPERATORS` skipped, checks that the area's tests pass on
the unmutated copy, runs ``cosmic-ray exec`` with ``PYTHONPATH`` at the copy
(so the tests import it) from ``model_tests/``, and reads the results back
(``cosmic-ray dump``).
"""

from __future__ import annotations

import compileall
import json
import os
import py_compile
import shlex
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mutants.apply import copy_package, installed_package

from mutation_net.areas import DECORATOR_FLAG, OPERATORS, Area, judging_tests

Keep = Callable[[str, str], bool]
"""Whether to run a mutant, given its operator and its stripped source line."""

MODEL_TESTS = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TIMEOUT_S = 240.0
"""A mutant whose tests run longer than this is stopped and counted ``timeout``
(not a kill: cosmic-ray would count it killed; the report keeps it apart)."""


@dataclass(frozen=True)
class Mutation:
    """One mutant's outcome: ``verdict`` is killed, survived, timeout or incompetent."""

    file: str  # inside turnkeeper/
    line: int
    col: int
    operator: str
    source: str  # the original line, stripped
    verdict: str
    diff: str


def prepare_copy(into: Path) -> Path:
    """Copy the installed package to ``into/turnkeeper`` and compile it
    (checked-hash ``.pyc``); return the copy's folder."""
    copy = copy_package(installed_package(), into)
    compileall.compile_dir(
        str(copy), quiet=1, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH
    )
    return copy


def shard(operator: str, line: str, jobs: int) -> int:
    """Which of ``jobs`` shards runs the mutants of ``operator`` on a line of this
    (stripped) text: a stable hash, the same in every process and run."""
    return zlib.crc32(f"{operator}\n{line}".encode()) % jobs


def test_command(area: Area, folder: Path) -> list[str]:
    """The pytest command that judges ``area``'s mutants (DuckDB only, ``-x``)."""
    return [
        sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
        "--basetemp", str(folder / "pytest-tmp"), *judging_tests(area),
    ]  # fmt: skip


SERVER_ENV = "TURNKEEPER_TEST_PG"
"""The test server's variables (``with_postgres.py`` sets them): kept only for
a run that asks for the server (``server=True``), left out of every other."""


def _env(folder: Path, server: bool = False) -> dict[str, str]:
    # Without the server the suite's CI=true rule (PostgreSQL required) is left
    # out too: it would fail a run for lack of a server, which counts as a kill.
    env = {
        k: v
        for k, v in os.environ.items()
        if (not k.startswith("TURNKEEPER_TEST_") or (server and k.startswith(SERVER_ENV)))
        and (server or k != "CI")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return env


def _cosmic(*args: str | Path, folder: Path, server: bool = False) -> str:
    done = subprocess.run(
        [str(BIN / "cosmic-ray"), *map(str, args)],
        cwd=MODEL_TESTS, env=_env(folder, server), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"cosmic-ray {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _skip_unchosen(session: Path, keep: Keep | None) -> int:
    """Mark skipped every mutant of an operator not chosen, or of ``True``/``False``
    in a decorator's arguments, or (with ``keep``) that ``keep(operator,
    stripped line)`` refuses; return how many mutants remain to run."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    lines: dict[Path, list[str]] = {}
    skip = []
    remaining = 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in db.pending_work_items:
            (m,) = item.mutations
            path = Path(m.module_path)
            text = lines.setdefault(path, path.read_text().splitlines())
            line = text[m.start_pos[0] - 1]
            if (
                m.operator_name not in OPERATORS
                or DECORATOR_FLAG.match(line)
                or (keep is not None and not keep(m.operator_name, line.strip()))
            ):
                skip.append(item.job_id)
            else:
                remaining += 1
        if skip:
            db.set_multiple_results(
                skip, WorkResult(output="not chosen", worker_outcome=WorkerOutcome.SKIPPED)
            )
    return remaining


def selected(tests: Sequence[str], folder: Path, server: bool = False) -> int:
    """How many tests of ``tests`` would run (collected and not deselected): a
    test command that runs none exits non-zero, which cosmic-ray counts a kill."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *tests],
        cwd=MODEL_TESTS, env=_env(folder, server), capture_output=True, text=True, check=False,
    )  # fmt: skip
    return sum(1 for line in done.stdout.splitlines() if "::" in line and " " not in line)


def baseline(area: Area, folder: Path) -> tuple[bool, float, str]:
    """The area's tests on the unmutated copy: ``(passed, seconds, output tail)``."""
    started = time.monotonic()
    done = subprocess.run(
        test_command(area, folder), cwd=MODEL_TESTS, env=_env(folder),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.returncode == 0, time.monotonic() - started, (done.stdout + done.stderr)[-3000:]


def run_area(
    area: Area, folder: Path, copy: Path, *, modules: Sequence[str] | None = None,
    timeout_s: float = TIMEOUT_S, keep: Keep | None = None, server: bool = False,
) -> list[Mutation]:  # fmt: skip
    """Run cosmic-ray over ``area``'s modules (those of ``modules`` alone when
    given) in the copy at ``copy`` (``folder/turnkeeper``); every chosen mutant's
    outcome (``keep``: as :func:`_skip_unchosen` takes it; ``server``: the
    tests see the test server, :data:`SERVER_ENV`).

    Raises:
        RuntimeError: cosmic-ray failed.
    """
    chosen = [m for m in area.modules if not modules or m in modules]
    config = folder / f"{area.name}.toml"
    session = folder / f"{area.name}.sqlite"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps([str(copy / m) for m in chosen])}\n"
        f"timeout = {timeout_s}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(shlex.join(test_command(area, folder)))}\n"
        '[cosmic-ray.distributor]\nname = "local"\n'
    )
    if session.exists():
        session.unlink()
    _cosmic("init", config, session, folder=folder)
    _skip_unchosen(session, keep)
    _cosmic("exec", config, session, folder=folder, server=server)
    return read_session(session, copy)


def run_shards(
    area: Area,
    folders: list[Path],
    copies: list[Path],
    modules: list[str] | None,
    timeout_s: float,
    keep: Keep | None = None,
) -> list[Mutation]:
    """``area``'s mutants (those ``keep`` keeps, when given) split into
    ``len(folders)`` shards by :func:`shard`, each run in its own copy
    (``copies[k]`` in ``folders[k]``) at the same time; every outcome, in the
    order :func:`read_session` gives."""
    jobs = len(folders)

    def one(k: int) -> list[Mutation]:
        def mine(op: str, line: str) -> bool:
            return (keep is None or keep(op, line)) and shard(op, line, jobs) == k

        return run_area(
            area, folders[k], copies[k], modules=modules, timeout_s=timeout_s,
            keep=None if jobs == 1 and keep is None else mine,
        )  # fmt: skip

    with ThreadPoolExecutor(jobs) as pool:
        found = [m for part in pool.map(one, range(jobs)) for m in part]
    return sorted(found, key=lambda x: (x.file, x.line, x.col, x.operator))


def read_session(session: Path, copy: Path) -> list[Mutation]:
    """The outcomes of a finished session's mutants (skipped ones left out)."""
    found = []
    for row in _cosmic("dump", session, folder=copy.parent).splitlines():
        item, result = json.loads(row)
        if result is None or result["worker_outcome"] == "skipped":
            continue
        (m,) = item["mutations"]
        path = Path(m["module_path"])
        line, col = m["start_pos"]
        source = path.read_text().splitlines()[line - 1].strip()
        outcome = result.get("test_outcome")
        if result["worker_outcome"] != "normal":
            verdict = "incompetent"
        elif outcome == "killed" and result.get("output") == "timeout":
            verdict = "timeout"
        else:
            verdict = str(outcome)
        found.append(
            Mutation(
                file=str(path.relative_to(copy)), line=line, col=col,
                operator=m["operator_name"], source=source, verdict=verdict,
                diff=_as_text(result.get("diff")).replace(f"{copy.parent}/", ""),
            )
        )  # fmt: skip
    return sorted(found, key=lambda x: (x.file, x.line, x.col, x.operator))


def _as_text(diff: Any) -> str:
    if isinstance(diff, list):
        return "".join(diff)
    return str(diff or "")
