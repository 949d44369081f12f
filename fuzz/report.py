"""The ``turnkeeper fuzz`` report: Markdown for a reader, and the same as
JSON beside it for a CI script (``turnkeeper-fuzz.md`` and
``turnkeeper-fuzz.json``)."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .runner import COVERS, FuzzResult

FORMAT = 1
"""The JSON report's ``format`` (raised when a field changes meaning)."""


def as_data(
    result: FuzzResult,
    *,
    backend: str,
    target: str,
    seed: int | None,
    minutes: float,
    examples: int,
    steps: int,
) -> dict[str, Any]:
    """The report as JSON-able data: ``format``, ``turnkeeper`` (the version),
    ``backend`` (``duckdb``, ``postgres``, ``+enc`` when encrypted),
    ``target`` (password removed), ``seed`` (``None``: random), ``minutes``
    asked, ``seconds`` taken, ``examples_per_batch``, ``steps_per_example``,
    ``interrupted``, ``failed`` and ``machines``: per machine ``name``,
    ``covers``, ``batches``, ``examples``, ``steps``, ``invariant_checks``
    and ``failure`` (``None`` or ``steps``, ``error``, ``traceback``)."""
    return {
        "format": FORMAT,
        "turnkeeper": version("turnkeeper"),
        "backend": backend,
        "target": target,
        "seed": seed,
        "minutes": minutes,
        "seconds": round(result.seconds, 1),
        "examples_per_batch": examples,
        "steps_per_example": steps,
        "interrupted": result.interrupted,
        "failed": result.failed,
        "machines": [
            {
                "name": m.name,
                "covers": COVERS[m.name],
                "batches": m.batches,
                "examples": m.examples,
                "steps": m.steps,
                "invariant_checks": m.invariants,
                "failure": None
                if m.failure is None
                else {
                    "steps": m.failure.steps,
                    "error": m.failure.error,
                    "traceback": m.failure.traceback,
                },
            }
            for m in result.machines
        ],
    }


def markdown(data: dict[str, Any]) -> str:
    """The Markdown report of :func:`as_data`'s ``data``."""
    verdict = "FAILED" if data["failed"] else "passed"
    if data["interrupted"]:
        verdict += " (interrupted)"
    seed = "random" if data["seed"] is None else str(data["seed"])
    lines = [
        "# turnkeeper fuzz report",
        "",
        f"- result: **{verdict}**",
        f"- turnkeeper: {data['turnkeeper']}",
        f"- backend: {data['backend']}",
        f"- configuration: `{data['target']}` (scratch stores beside it; its data untouched)",
        f"- seed: {seed}",
        f"- minutes: {data['minutes']} asked, {data['seconds']} s taken",
        f"- batches of {data['examples_per_batch']} examples, "
        f"at most {data['steps_per_example']} steps each",
        "",
        "| machine | covers | batches | examples | steps | invariant checks | result |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for m in data["machines"]:
        outcome = "passed" if m["failure"] is None else "FAILED"
        lines.append(
            f"| {m['name']} | {m['covers']} | {m['batches']} | {m['examples']} | "
            f"{m['steps']} | {m['invariant_checks']} | {outcome} |"
        )
    for m in data["machines"]:
        if m["failure"] is None:
            continue
        lines += [
            "",
            f"## {m['name']} failed",
            "",
            "The shrunk example, as Hypothesis prints it (each step a call on the machine):",
            "",
            "```python",
            m["failure"]["steps"],
            "```",
            "",
            "The error:",
            "",
            "```",
            m["failure"]["traceback"].rstrip(),
            "```",
        ]
    return "\n".join(lines) + "\n"


def write(data: dict[str, Any], path: Path) -> tuple[Path, Path]:
    """Write the Markdown report to ``path`` and the JSON beside it (``path``
    with the suffix ``.json``); returns both paths.

    Raises:
        OSError: a file cannot be written.
    """
    json_path = path.with_suffix(".json")
    if json_path == path:
        json_path = path.with_name(path.name + ".json")
    path.write_text(markdown(data), encoding="utf-8")
    json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path, json_path
