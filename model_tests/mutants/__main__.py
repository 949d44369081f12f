"""``python -m mutants [--only ID ...] [--list]`` (from ``model_tests/``; ``make mutants``).

For each mutant of :data:`mutants.catalog.MUTANTS` (or those ``--only``
names): copy the installed package to a temporary folder, apply the
mutant's one replacement there (a stale entry, whose source text is not in
its file exactly once, stops the run before anything runs), and run the
mutant's killing tests with ``PYTHONPATH`` at the copy, on both backends
(the tests' PostgreSQL cases run on the server ``with_postgres.py``
starts; without ``TURNKEEPER_TEST_PG`` this command runs itself again
under it). The killing tests must fail. First, once, the killing tests of
every selected mutant run on an unmutated copy and must pass (a test that
fails anyway kills nothing).

Prints one row per mutant: its id, killed or not, the killing test (the
first that failed; ``+N`` more), seconds; exits 1 if any mutant survived
(its tests passed), errored (pytest could not run them) or timed out, 2 if
the unmutated copy failed its tests. ``--list`` prints the catalog and
runs nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mutants.apply import installed_package, mutated_copy, mutated_text
from mutants.catalog import MUTANTS, Mutant

HERE = Path(__file__).resolve().parent
MODEL_TESTS = HERE.parent
WITH_POSTGRES = MODEL_TESTS / "with_postgres.py"

WRAPPED = "TURNKEEPER_MUTANTS_UNDER_WITH_POSTGRES"
"""Set once this command ran itself again under ``with_postgres.py`` (which,
where no server can start, runs it without one: then it goes on without)."""

TIMEOUT_S = 900.0
"""A mutant's tests that run longer than this are stopped: not a kill (a hang
is not a failing fixed test), reported as ``timeout``."""


@dataclass(frozen=True)
class Outcome:
    """What running a mutant's killing tests on its copy gave."""

    mutant: str
    verdict: str  # "killed", "survived", "error" or "timeout"
    failed: tuple[str, ...]  # the node ids that failed or errored, in report order
    seconds: float
    output: str

    @property
    def killed(self) -> bool:
        return self.verdict == "killed"


def pytest_run(
    tests: Sequence[str], folder: Path, *, timeout_s: float = TIMEOUT_S
) -> tuple[int | None, str]:
    """Run pytest on ``tests`` (node ids relative to ``model_tests/``) with
    ``PYTHONPATH`` at ``folder`` (which holds a ``turnkeeper/`` copy) and its
    temporary files under ``folder``. Returns ``(exit status, output)``;
    the status is ``None`` when it ran past ``timeout_s`` and was stopped."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--basetemp",
        str(folder / "pytest-tmp"),
        *tests,
    ]
    try:
        done = subprocess.run(
            cmd,
            cwd=MODEL_TESTS,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as late:
        out = late.stdout if isinstance(late.stdout, str) else (late.stdout or b"").decode()
        return None, out
    return done.returncode, done.stdout


def failed_ids(output: str) -> tuple[str, ...]:
    """The node ids pytest's short summary (``-ra``) names as failed or errored
    (relative to ``model_tests/``)."""
    found = []
    for line in output.splitlines():
        for word in ("FAILED ", "ERROR "):
            if line.startswith(word):
                node = line[len(word) :].split(" - ", 1)[0].strip()
                found.append(node.removeprefix("model_tests/"))
    return tuple(found)


def imports_copy(folder: Path) -> bool:
    """Whether a process with ``PYTHONPATH`` at ``folder`` imports the copy there."""
    env = dict(os.environ, PYTHONPATH=str(folder))
    got = subprocess.run(
        [sys.executable, "-c", "import turnkeeper; print(turnkeeper.__file__)"],
        env=env,
        cwd=MODEL_TESTS,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(got).resolve().is_relative_to(folder.resolve())


def run_mutant(mutant: Mutant, package: Path, *, timeout_s: float = TIMEOUT_S) -> Outcome:
    """Apply ``mutant`` to a temporary copy of ``package`` and run its killing tests.

    Raises:
        StaleMutantError: the mutant's source text is not in its file exactly once.
    """
    with tempfile.TemporaryDirectory(prefix=f"turnkeeper-mutant-{mutant.id}-") as tmp:
        folder = Path(tmp)
        mutated_copy(mutant, package, folder)
        started = time.monotonic()
        status, output = pytest_run(mutant.tests, folder, timeout_s=timeout_s)
        seconds = time.monotonic() - started
    verdict = {None: "timeout", 0: "survived", 1: "killed"}.get(status, "error")
    return Outcome(mutant.id, verdict, failed_ids(output), seconds, output)


def baseline(selected: Sequence[Mutant], package: Path) -> tuple[bool, float, str]:
    """Run every selected mutant's killing tests once on an unmutated copy;
    ``(all passed, seconds, output)``.

    Raises:
        RuntimeError: the tests would not import the copy.
    """
    tests = list(dict.fromkeys(t for m in selected for t in m.tests))
    with tempfile.TemporaryDirectory(prefix="turnkeeper-unmutated-") as tmp:
        folder = Path(tmp)
        mutated_copy(None, package, folder)
        if not imports_copy(folder):
            raise RuntimeError(f"PYTHONPATH={folder} does not make the tests import its copy")
        started = time.monotonic()
        status, output = pytest_run(tests, folder)
        return status == 0, time.monotonic() - started, output


def table(outcomes: Sequence[Outcome]) -> str:
    """The report: one row per mutant (id, killed, killing test, seconds)."""
    rows = [("mutant", "killed", "killing test", "seconds")]
    for o in outcomes:
        first = o.failed[0] if o.failed else "-"
        more = f" (+{len(o.failed) - 1})" if len(o.failed) > 1 else ""
        killed = "yes" if o.killed else f"NO ({o.verdict})"
        rows.append((o.mutant, killed, first + more, f"{o.seconds:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def select(only: Sequence[str] | None) -> list[Mutant]:
    """The mutants ``--only`` names (all without it), in catalog order.

    Raises:
        SystemExit: an unknown id.
    """
    if not only:
        return list(MUTANTS)
    known = {m.id for m in MUTANTS}
    wanted = {i for arg in only for i in arg.split(",") if i}
    unknown = sorted(wanted - known)
    if unknown:
        raise SystemExit(f"unknown mutant ids: {', '.join(unknown)}")
    return [m for m in MUTANTS if m.id in wanted]


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m mutants")
    parser.add_argument("--only", action="append", metavar="ID", help="run these (repeat or a,b)")
    parser.add_argument("--list", action="store_true", help="print the catalog, run nothing")
    args = parser.parse_args(args_in)
    selected = select(args.only)
    if args.list:
        for m in selected:
            print(f"{m.id}  [{m.kind}]  {m.file}  {m.guards}")
            for t in m.tests:
                print(f"    {t}")
        return 0
    if not os.environ.get("TURNKEEPER_TEST_PG"):  # the PostgreSQL cases need a server
        if not os.environ.get(WRAPPED):
            os.environ[WRAPPED] = "1"
            os.execv(
                sys.executable,
                [sys.executable, str(WITH_POSTGRES), sys.executable, "-m", "mutants", *args_in],
            )
        print("no PostgreSQL server: the killing tests' PostgreSQL cases are skipped", flush=True)
    package = installed_package()
    for m in selected:  # a stale entry stops the run before anything runs
        mutated_text(m, package)
    started = time.monotonic()
    ok, seconds, output = baseline(selected, package)
    print(f"unmutated copy: killing tests {'pass' if ok else 'FAIL'} ({seconds:.1f} s)", flush=True)
    if not ok:
        print(output)
        return 2
    outcomes = []
    for m in selected:
        outcome = run_mutant(m, package)
        outcomes.append(outcome)
        print(f"{m.id}: {outcome.verdict} ({outcome.seconds:.1f} s)", flush=True)
        if outcome.verdict in ("error", "timeout"):
            print(outcome.output[-4000:])
    print()
    print(table(outcomes))
    survived = [o.mutant for o in outcomes if not o.killed]
    total = time.monotonic() - started
    print(
        f"\n{len(outcomes) - len(survived)} of {len(outcomes)} mutants killed "
        f"in {total:.0f} s (unmutated run included)"
        + (f"; not killed: {', '.join(survived)}" if survived else "")
    )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
