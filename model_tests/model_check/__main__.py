"""``python -m model_check [--bound ci|large] [--write]`` (from ``model_tests/``).

Explores every model at the bound (``ci``: the test suite's; ``large``:
``make modelcheck``'s, at least 3 actors x 2 targets x expiry per model; the
ledger's cut at a depth, ``steps``) and
prints states, transitions, depth and time per model; exits 1 if an
invariant breaks (printing the counterexample as a replay script). With
``--write``, regenerates ``counterexamples/`` from :data:`catalog.FOUND`;
with ``--mutate lease.takeover.expired`` (a pair of ``catalog.FOUND``),
explores with that guard removed and prints the counterexample's script
(exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from model_check.catalog import FOUND, KEYWORD, LIFECYCLES
from model_check.explorer import Result, explore
from model_check.mutations import without
from model_check.replay import build, script

HERE = Path(__file__).parent
COUNTEREXAMPLES = HERE / "counterexamples"

BOUNDS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "ci": [
        ("leases", {"workers": ["A", "B"], "targets": ["s1", "s2"], "ticks": 4, "grants": 2}),
        ("runs", {"actors": ["W1", "R1"], "sessions": ["s1"], "ticks": 3, "max_runs": 2}),
        ("delivery", {"workers": ["O1", "O2"], "ticks": 4}),
        (
            "ledger",
            {
                "workers": ["A", "B"],
                "sessions": ["s1"],
                "ticks": 2,
                "grants": 2,
                "length": 3,
                "gc": 0,
            },
        ),
        (
            "ledger_gc",
            {
                "workers": ["A"],
                "sessions": ["s1"],
                "ticks": 2,
                "grants": 2,
                "length": 2,
                "gc": 1,
                "deleter": False,
            },
        ),
    ],
    "large": [
        (
            "leases",
            {"workers": ["A", "B", "C"], "targets": ["s1", "s2"], "ticks": 4, "grants": 3},
        ),
        (
            "runs",
            {
                "actors": ["W1", "W2", "R1"],
                "sessions": ["s1", "s2"],
                "ticks": 2,
                "max_runs": 2,
                "grants": 2,
            },
        ),
        ("delivery", {"workers": ["O1", "O2", "O3"], "ticks": 5, "grants": 4}),
        (
            "ledger",
            {
                "workers": ["A", "B", "C"],
                "sessions": ["s1", "s2"],
                "ticks": 2,
                "grants": 2,
                "length": 2,
                "gc": 0,
                "steps": 10,
            },
        ),
        (
            "ledger_gc",
            {
                "workers": ["A", "B"],
                "sessions": ["s1", "s2"],
                "ticks": 2,
                "grants": 2,
                "length": 2,
                "gc": 2,
                "steps": 10,
            },
        ),
    ],
}
"""The bounds per model: each model's keyword arguments, and ``steps``: every
interleaving of at most that many steps (``explore``'s ``max_depth``; none:
every reachable state). The ledger's two sessions multiply its state space, so
its large bounds cut the depth."""


def explore_at(name: str, bound: dict[str, Any], **lifecycles: Any) -> Result:
    """Explore model ``name`` at ``bound`` (its ``steps``, if any, as the depth cut)."""
    kwargs = {k: v for k, v in bound.items() if k != "steps"}
    return explore(build(name, kwargs, **lifecycles), max_depth=bound.get("steps"))


def check(bound: str) -> list[tuple[dict[str, Any], Result]]:
    """Explore every model at ``bound``; print one summary line each."""
    results = []
    for name, kwargs in BOUNDS[bound]:
        result = explore_at(name, kwargs)
        cut = (
            f" (every interleaving of at most {kwargs['steps']} steps)" if "steps" in kwargs else ""
        )
        print(result.summary() + cut, flush=True)
        if result.violation is not None:
            cx = {
                "model": name,
                "bound": kwargs,
                "mutation": None,
                "invariant": result.violation.invariant,
                "steps": [list(s) for s in result.violation.steps],
            }
            print(script(cx))
        results.append((kwargs, result))
    return results


def counterexample(pair: tuple[str, str, str]) -> dict[str, Any]:
    """The shortest counterexample with ``pair``'s guard removed, as stored."""
    lifecycle, edge, guard = pair
    name, bound = FOUND[pair]
    mutant = without(LIFECYCLES[lifecycle], edge, guard)
    result = explore(build(name, bound, **{KEYWORD[lifecycle]: mutant}))
    if result.violation is None:
        raise AssertionError(f"{lifecycle}.{edge} without {guard}: no counterexample")
    return {
        "model": name,
        "bound": bound,
        "mutation": f"{lifecycle}.{edge}.{guard}",
        "invariant": result.violation.invariant,
        "states": result.states,
        "steps": [list(s) for s in result.violation.steps],
    }


def path_of(pair: tuple[str, str, str]) -> Path:
    """Where ``pair``'s counterexample is stored."""
    return COUNTEREXAMPLES / f"{'.'.join(pair)}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_check")
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="ci")
    parser.add_argument("--write", action="store_true", help="regenerate counterexamples/")
    parser.add_argument(
        "--mutate",
        metavar="LIFECYCLE.EDGE.GUARD",
        help="explore with that guard removed; print the counterexample as a script",
    )
    args = parser.parse_args(argv)
    if args.mutate:
        lifecycle, edge, guard = args.mutate.split(".")
        cx = counterexample((lifecycle, edge, guard))
        print(f"{cx['mutation']}: {cx['states']} states explored")
        print(script(cx))
        return 1
    if args.write:
        for pair in FOUND:
            cx = counterexample(pair)
            path_of(pair).write_text(json.dumps(cx, indent=1) + "\n")
            print(f"{path_of(pair).name}: {len(cx['steps'])} steps, breaks {cx['invariant']!r}")
            print(script(cx))
        return 0
    results = check(args.bound)
    return 1 if any(r.violation is not None for _, r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
