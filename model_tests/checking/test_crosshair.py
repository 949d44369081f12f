"""CrossHair over the pure guard and decision functions of ``spec/`` (issue 22).

Each function in :data:`CONTRACTED` carries PEP 316 contracts in its docstring
(``pre:``, ``post:``, ``raises:``); ``crosshair check`` searches for inputs that
break a postcondition, with a bounded time per condition and per path. Three
kinds of test:

- no counterexample in the installed package's contracted modules;
- every ``post:`` line of the source was checked (its line is in CrossHair's
  ``--report_all`` answer), and the functions carrying contracts are exactly
  :data:`CONTRACTED`: a contract removed, or one CrossHair no longer reaches,
  fails here;
- one control per module: a copy with one rule broken (:data:`CONTROLS`),
  where CrossHair must report a counterexample to that function's contract.

The CI bound is small (CI's time budget): ``TURNKEEPER_CROSSHAIR_CONDITION_S``
and ``TURNKEEPER_CROSSHAIR_PATH_S`` (CPU seconds per condition and per path)
raise it; ``make crosshair`` runs this file with a bound of minutes. One
CrossHair run answers every test: two processes at once (one per core), each
over about half the modules and their controls.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import turnkeeper.spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = Path(turnkeeper.spec.__file__).resolve().parent
"""The installed ``spec`` package: CrossHair checks what the tests import."""

CONDITION_S = os.environ.get("TURNKEEPER_CROSSHAIR_CONDITION_S", "0.5")
PATH_S = os.environ.get("TURNKEEPER_CROSSHAIR_PATH_S", "0.25")

CROSSHAIR = [
    sys.executable,
    "-m",
    "crosshair",
    "check",
    "--analysis_kind=PEP316",
    f"--per_condition_timeout={CONDITION_S}",
    f"--per_path_timeout={PATH_S}",
]

CONTRACTED = {
    "lease": ("acquire_decision",),
    "thread_record": ("save_decision",),
    "recovery": ("retry_delay_s",),
    "delivery": ("intent_status",),
    "ledger": ("fence_id",),
    "fork": ("check_request_id", "referenced_id", "remap_reference"),
    "entries": ("validate_payload",),
    "clear_facts": ("bounded", "clear_facts"),
    "usage": ("lenient_count", "lenient_cost", "check_count", "check_cost"),
}
"""Per ``spec`` module, the functions with contracts (the store's callers are in
``storage/ops/``; ``acquire_decision`` and ``save_decision`` are the lease and
thread-record decisions the store's machine is checked against, edge by edge,
in ``test_machines.py``)."""

CONTROLS = {
    "lease": (
        "acquire_decision",
        "epoch + 1 if edge.name in GRANTING_EDGES else epoch",
        "epoch",
    ),  # a grant keeps the old epoch
    "thread_record": (
        "save_decision",
        'return "revive"',
        'return "key_taken"',
    ),  # an archived record is not refused as a revival
    "recovery": (
        "retry_delay_s",
        "min(max_s, base_s * 2.0 ** min(attempt - 1, 62))",
        "base_s * 2.0 ** min(attempt - 1, 62)",
    ),  # the backoff is not capped
    "delivery": (
        "intent_status",
        '    if "failed" in statuses:',
        '    if "uncertain" in statuses:',
    ),  # an intent with a failed operation called uncertain
    "ledger": (
        "fence_id",
        'f"{FENCE_ID_PREFIX}{epoch}:{seq}"',
        'f"{FENCE_ID_PREFIX}{epoch}{seq}"',
    ),  # epoch 1 at 12 and epoch 11 at 2 share an id
    "fork": (
        "referenced_id",
        " or (kind == EntryKind.BRANCH_SUMMARY and value == ROOT_SENTINEL)",
        "",
    ),  # a branch summary from the root names an entry "root"
    "entries": (
        "validate_payload",
        "        if strict:",
        "        if not strict:",
    ),  # an API append of an unknown kind passes
    "clear_facts": (
        "bounded",
        "value[: NAME_MAX - 1] + CUT",
        "value[:NAME_MAX] + CUT",
    ),  # a cut value is one character too long
    "usage": (
        "lenient_count",
        "return isinstance(value, (int, float)) and not isinstance(value, bool)",
        "return isinstance(value, (int, float))",
    ),  # a JSON true counts one token
}
"""Per module: the function whose contract must catch it, and the rule broken
(text replaced, text put in its place) in a copy of the module."""


def contracted_source() -> dict[str, dict[str, list[int]]]:
    """Per module, per function whose docstring has ``post:`` lines, their line numbers."""
    found: dict[str, dict[str, list[int]]] = {}
    for path in sorted(SPEC.glob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or not node.body:
                continue
            doc = node.body[0]
            if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
                continue
            assert doc.end_lineno is not None
            posts = [
                n
                for n in range(doc.lineno, doc.end_lineno + 1)
                if lines[n - 1].strip().startswith("post:")
            ]
            if posts:
                found.setdefault(path.stem, {})[node.name] = posts
    return found


def _broken_copy(module: str, tmp: Path) -> str:
    """A copy of ``module`` with its control's rule broken; the CrossHair target
    naming the broken function (``file:line`` of its ``def``)."""
    function, rule, broken_rule = CONTROLS[module]
    src = (SPEC / f"{module}.py").read_text(encoding="utf-8")
    assert src.count(rule) == 1, f"{module}: the control's rule is not in the source once"
    broken = src.replace(rule, broken_rule)
    broken = re.sub(r"^from \.(\w+)", r"from turnkeeper.spec.\1", broken, flags=re.M)
    path = tmp / f"broken_{module}.py"
    path.write_text(broken, encoding="utf-8")
    line = broken.splitlines().index(
        next(x for x in broken.splitlines() if x.startswith(f"def {function}("))
    )
    return f"{path}:{line + 1}"


def _halves() -> tuple[list[str], list[str]]:
    """The modules in two groups of about equal work (each condition costs up to
    the per-condition bound; a control costs its function's conditions)."""
    source = contracted_source()
    weight = {
        m: sum(map(len, fs.values())) + len(fs.get(CONTROLS[m][0], [])) for m, fs in source.items()
    }
    groups: tuple[list[str], list[str]] = ([], [])
    for module in sorted(CONTRACTED, key=lambda m: (-weight.get(m, 0), m)):
        light = min(groups, key=lambda g: sum(weight.get(m, 0) for m in g))
        light.append(module)
    return groups


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> str:
    """CrossHair's answers (``--report_all``) for the installed modules and the
    controls: two processes at once (one per core), each over half the modules
    and their controls. Exit 0 or 1 (a control's counterexample) is expected;
    anything else (2: CrossHair could not run) fails here."""
    tmp = tmp_path_factory.mktemp("crosshair")
    procs = [
        subprocess.Popen(
            [
                *CROSSHAIR,
                "--report_all",
                *(f"turnkeeper.spec.{m}" for m in group),
                *(_broken_copy(m, tmp) for m in group),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp,
        )
        for group in _halves()
    ]
    out = ""
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=3600)
        assert proc.returncode in (0, 1), stdout + stderr
        out += stdout
    return out


def _answers(out: str, status: str) -> set[tuple[str, int]]:
    """``(module, line)`` of each answer about the installed ``spec`` modules."""
    return {
        (m.group(1), int(m.group(2)))
        for m in re.finditer(rf"/spec/(\w+)\.py:(\d+): {status}: ", out)
    }


def test_no_counterexample(runs):
    assert _answers(runs, "error") == set(), runs


def _coverage_gaps(
    out: str, source: dict[str, dict[str, list[int]]]
) -> tuple[dict[str, set[str]], list[tuple[str, int]], list[tuple[str, int]]]:
    """What the run and the source disagree on: the functions with contracts that
    differ from :data:`CONTRACTED` (per module, symmetric difference), the
    ``post:`` lines CrossHair did not answer for, and the answers for lines
    that are no ``post:`` of the source."""
    functions = {
        m: set(source.get(m, {})) ^ set(CONTRACTED.get(m, ()))
        for m in set(source) | set(CONTRACTED)
    }
    expected = {(m, n) for m, fs in source.items() for lines in fs.values() for n in lines}
    checked = _answers(out, "info")
    return (
        {m: fs for m, fs in functions.items() if fs},
        sorted(expected - checked),
        sorted(checked - expected),
    )


def test_every_condition_in_the_source_was_checked(runs):
    """CrossHair answered for each ``post:`` line of the contracted functions, and
    those functions are exactly :data:`CONTRACTED` (a contract removed fails)."""
    assert _coverage_gaps(runs, contracted_source()) == ({}, [], [])


def test_control_coverage_gaps_are_seen(runs):
    """Control: a function whose contract is gone, and a module CrossHair did not
    reach, are both reported."""
    source = contracted_source()
    without = {m: dict(fs) for m, fs in source.items()}
    del without["ledger"]["fence_id"]
    assert _coverage_gaps(runs, without)[0] == {"ledger": {"fence_id"}}
    unreached = "".join(line for line in runs.splitlines(True) if "/spec/usage.py:" not in line)
    missing = _coverage_gaps(unreached, source)[1]
    assert missing and {m for m, _ in missing} == {"usage"}


@pytest.mark.parametrize("module", sorted(CONTROLS))
def test_control_with_a_broken_rule_is_caught(runs, module):
    function = CONTROLS[module][0]
    caught = [
        line
        for line in runs.splitlines()
        if f"broken_{module}.py:" in line and ": error: " in line and f"{function}(" in line
    ]
    assert caught, runs


def test_readme_names_every_contracted_function():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### CrossHair contracts", 1)[1].split("\n## ", 1)[0]
    for module, functions in CONTRACTED.items():
        for function in functions:
            assert f"`{module}.{function}`" in section, f"{module}.{function}"
