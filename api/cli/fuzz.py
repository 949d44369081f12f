"""``turnkeeper fuzz``: the differential stateful machines against scratch
stores built with the user's configuration (``turnkeeper.fuzz``), for a
deployment's own CI.

Exit status: 0 when no machine failed, 1 when one did (the report shows its
shrunk steps), 2 when refused (a usage error; a target it cannot make
scratch stores beside: ``InvalidInputError``, ``OperationalError``, a role
without ``CREATE``: ``ProgrammingError``; Hypothesis not installed:
``NotSupportedError``), 130 on Ctrl-C and 143 on ``SIGTERM`` (a cancelled
CI job; either way the scratch stores removed and the report of what ran
written first).
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from turnkeeper.spec.errors import NotSupportedError

from .common import EXIT_FAILED, EXIT_INTERRUPTED, stderr_console

if TYPE_CHECKING:
    from turnkeeper.fuzz.runner import FuzzResult

MACHINE_NAMES = ("leases", "runs", "outbox", "bindings", "tools", "sessions", "ledger", "deletes")
"""``--machine``'s choices (``turnkeeper.fuzz.runner.MACHINES``' keys, kept
here so ``--help`` works without Hypothesis installed)."""

DEFAULT_REPORT = "turnkeeper-fuzz.md"
"""The report's default path (the JSON beside it: ``turnkeeper-fuzz.json``)."""


def _fuzz_modules() -> tuple[Any, Any, Any]:
    """``turnkeeper.fuzz``'s runner, report and scratch modules.

    Raises:
        NotSupportedError: Hypothesis is not installed.
    """
    try:
        from turnkeeper.fuzz import report, runner, scratch
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "hypothesis":
            raise NotSupportedError(
                detail="turnkeeper fuzz needs Hypothesis: pip install 'turnkeeper[fuzz]'"
            ) from exc
        raise
    return runner, report, scratch


EXIT_TERMINATED = 128 + signal.SIGTERM
"""Exit status after ``SIGTERM`` (a CI job cancelled), as shells report it."""


@contextmanager
def _terminate_as_interrupt() -> Iterator[list[int]]:
    """Within the block, ``SIGTERM`` (a cancelled CI job) ends the run as
    Ctrl-C does (a ``KeyboardInterrupt``: the scratch removed, the report
    written); yields a list that holds the signal's number once one came.
    Outside the main thread (where no handler can be set) it does nothing."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        came.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield came
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.command("fuzz")
@click.option(
    "--db",
    "db",
    type=str,
    default="turnkeeper.duckdb",
    envvar="TURNKEEPER_DB",
    show_default=True,
    help="The configuration to fuzz beside: a DuckDB file (never opened: scratch stores "
    "go in a new folder beside it) or a postgresql:// URL (a scratch schema in it).",
)
@click.option(
    "--minutes",
    type=click.FloatRange(min=0),
    required=True,
    help="How long to run (checked between batches; every machine runs at least one).",
)
@click.option(
    "--machine",
    "machines",
    type=click.Choice(MACHINE_NAMES),
    multiple=True,
    help="Run only this machine (repeatable); default: all of them.",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_REPORT,
    show_default=True,
    help="The Markdown report (the same as JSON beside it, suffix .json).",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Repeat a run: the same seed, the same run (default: a random one, in the report).",
)
@click.option("--encrypted", is_flag=True, help="Encrypt the scratch stores (a throwaway key).")
@click.option(
    "--examples",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Examples per batch.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=30,
    show_default=True,
    help="Steps per example at most.",
)
@click.pass_context
def fuzz_command(
    ctx: click.Context,
    db: str,
    minutes: float,
    machines: tuple[str, ...],
    report_path: Path,
    seed: int | None,
    encrypted: bool,
    examples: int,
    steps: int,
) -> None:
    """Race simulated writers against an oracle on scratch stores made with
    your configuration (leases, runs and recovery, the outbox, channel
    bindings, tool records, sessions and forks, the ledger), with ambiguous
    commits and an injected clock, for MINUTES; write the report. Exits 0 when
    nothing failed, 1 when a machine failed, 2 when refused."""
    runner, report, scratch = _fuzz_modules()
    if seed is None:  # a random run, its seed in the report: `--seed` repeats it
        seed = random.SystemRandom().randrange(2**32)
    names = list(dict.fromkeys(machines)) or list(MACHINE_NAMES)
    console = stderr_console()
    target = scratch.redacted(db)

    def progress(result: FuzzResult, elapsed_s: float) -> None:
        done = ", ".join(
            f"{m.name} {m.examples} ex/{m.steps} steps" + (" FAILED" if m.failure else "")
            for m in result.machines
        )
        console.print(
            f"  {elapsed_s:6.0f} s  {done}", markup=False, highlight=False, soft_wrap=True
        )

    with (
        _terminate_as_interrupt() as terminated,
        scratch.scratch(db, encrypted=encrypted) as opener,
    ):
        backend = opener.name
        console.print(
            f"turnkeeper fuzz: {', '.join(names)} on scratch stores ({backend}) "
            f"beside {target}, {minutes:g} min",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        result = runner.run(
            opener,
            names,
            minutes=minutes,
            examples=examples,
            steps=steps,
            seed=seed,
            progress=progress,
        )
    data = report.as_data(
        result,
        backend=backend,
        target=target,
        seed=seed,
        minutes=minutes,
        examples=examples,
        steps=steps,
    )
    md, js = report.write(data, report_path)
    failed = [m.name for m in result.machines if m.failure is not None]
    verdict = f"FAILED: {', '.join(failed)}" if failed else "passed"
    console.print(
        f"turnkeeper fuzz: {verdict}; report {md} (and {js.name})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    if result.interrupted:
        ctx.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    if failed:
        ctx.exit(EXIT_FAILED)
