"""The second mutation net (``mutation_net/``, issue 22) in CI: its survivor
classification cannot go stale (every entry well formed, its source line
still in the installed package, its killing tests there to run), the
committed report is well formed with every survivor classified, the areas
cover all of ``spec/`` and exist, and a small real run: two mutants of
``spec/lease.py`` made by cosmic-ray in a temporary copy of the package are
killed by their fixed test (which passes on the installed package, in
``checking/test_machines.py``).

``make mutation-net`` runs the net itself (hours for every area on 2 cores).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from mutants.apply import installed_package
from mutants.catalog import MUTANTS
from mutants.collect import missing
from mutation_net import report
from mutation_net.areas import AREAS, OPERATORS, Area, judging_tests
from mutation_net.run import SERVER_ENV, prepare_copy, run_shards, selected, shard
from mutation_net.survivors import KINDS, SURVIVORS, Site, Verdict

PACKAGE = installed_package()
CATALOG_IDS = {m.id for m in MUTANTS}


def _lines(file: str) -> set[str]:
    path = PACKAGE / file
    return {line.strip() for line in path.read_text().splitlines()} if path.is_file() else set()


def site_problems(site: Site, verdict: Verdict) -> list[str]:
    """What is wrong with one classification (nothing, for a good one)."""
    wrong = []
    if site.operator not in OPERATORS:
        wrong.append("an operator the net does not run")
    if site.line not in _lines(site.file):
        wrong.append(f"stale: the line is not in {site.file} any more")
    if verdict.kind not in KINDS or not verdict.why.strip():
        wrong.append("no kind or no why")
    if verdict.kind == "killed" and not verdict.tests:
        wrong.append("killed by no test")
    if verdict.kind == "equivalent" and (verdict.tests or verdict.catalog):
        wrong.append("equivalent, yet killed")
    if verdict.catalog and verdict.catalog not in CATALOG_IDS:
        wrong.append(f"no catalog entry {verdict.catalog}")
    if any(t.startswith("stateful/test_stateful_") for t in verdict.tests):
        wrong.append("a search, not a fixed test")
    return wrong


@pytest.mark.parametrize(
    ("site", "verdict"), list(SURVIVORS.items()), ids=[f"{s.file}:{s.operator}" for s in SURVIVORS]
)
def test_every_classification_is_well_formed_and_current(site: Site, verdict: Verdict) -> None:
    assert site_problems(site, verdict) == []


def test_control_a_stale_or_malformed_classification_is_refused() -> None:
    site, verdict = next(iter(SURVIVORS.items()))
    assert site_problems(dataclasses.replace(site, line=site.line + "  # gone"), verdict)
    assert site_problems(dataclasses.replace(site, operator="core/NumberReplacer"), verdict)
    assert site_problems(site, dataclasses.replace(verdict, kind="killed", tests=()))
    assert site_problems(site, dataclasses.replace(verdict, catalog="no-such-entry"))
    assert site_problems(site, Verdict("equivalent", "x", ("checking/test_machines.py",)))


def test_every_killing_test_exists() -> None:
    """One collection; a test that is not there (the control, beside them) is
    the only one reported."""
    tests = [t for v in SURVIVORS.values() for t in v.tests]
    gone = "checking/test_machines.py::test_no_such_test"
    assert missing([*tests, gone]) == [gone]


def test_the_areas_cover_spec_and_exist() -> None:
    spec = {str(p.relative_to(PACKAGE)) for p in (PACKAGE / "spec").glob("*.py")}
    mutated = [m for a in AREAS for m in a.modules]
    assert len(mutated) == len(set(mutated)), "a module in two areas"
    assert spec <= set(mutated), spec - set(mutated)
    assert all((PACKAGE / m).is_file() for m in mutated)
    assert len({a.name for a in AREAS}) == len(AREAS)
    gone = [
        t
        for a in AREAS
        for t in judging_tests(a)
        if not (Path(__file__).resolve().parents[1] / t.split("::")[0]).is_file()
    ]
    assert gone == []


def report_problems(data: dict[str, Any]) -> list[str]:
    """What is wrong with the report ``data`` (nothing, for a good one)."""
    wrong = []
    if data["tool"] != "cosmic-ray" or not data["version"]:
        wrong.append("tool or version")
    if data["operators"] != list(OPERATORS):
        wrong.append("operators")
    for name, m in data["modules"].items():
        if not (PACKAGE / name).is_file() or m["mutants"] != sum(m[v] for v in report.VERDICTS):
            wrong.append(f"module {name}")
    if data["totals"]["survived"] != len(data["survivors"]):
        wrong.append("survivor count")
    for s in data["survivors"]:
        if not s["diff"] or s["file"] not in data["modules"]:
            wrong.append(f"survivor {s['file']}:{s['line']} without diff or module")
        if Site(s["file"], s["operator"], s["source"]) not in SURVIVORS:
            wrong.append(f"unclassified survivor {s['file']}:{s['line']} {s['operator']}")
    return wrong


def test_the_report_is_well_formed_and_every_survivor_classified() -> None:
    data = json.loads(report.JSON_PATH.read_text())
    assert report_problems(data) == []
    assert report.MD_PATH.read_text() == report.markdown(report.finish(data))


def test_control_an_unclassified_survivor_in_the_report_is_found() -> None:
    data = json.loads(report.JSON_PATH.read_text())
    name = next(iter(data["modules"]))
    fake = {"file": name, "line": 1, "col": 0, "operator": "core/AddNot",
            "source": "not a line of it", "diff": "--- x", "verdict": "survived"}  # fmt: skip
    data["survivors"].append(fake)
    data["modules"][name]["survived"] += 1
    data["modules"][name]["mutants"] += 1
    data["totals"]["survived"] += 1
    assert report_problems(data) == [f"unclassified survivor {name}:1 core/AddNot"]


PICKS = {
    ("core/ReplaceAndWithOr", 'refusal = "purpose" if same_owner and not same_purpose else "busy"'),
    (
        "core/AddNot",
        "return (edge.name, epoch + 1 if edge.name in GRANTING_EDGES else epoch)",
    ),
}
"""The two mutants the real run makes: the lease's acquire decision, broken twice."""


def test_two_mutants_made_by_cosmic_ray_are_killed(tmp_path: Path) -> None:
    """The two picks, run as ``--jobs 2`` runs them: each in the one shard
    :func:`shard` gives it (they differ), each shard in its own copy at once;
    both are run, once each, and killed."""
    assert all(line in _lines("spec/lease.py") for _, line in PICKS), "stale picks"
    assert sorted(shard(op, line, 2) for op, line in PICKS) == [0, 1], "picks in one shard"
    area = Area(
        "ci",
        ("spec/lease.py",),
        (
            "checking/test_machines.py::test_acquire_decision_matches_the_lease_machine_exhaustively",
        ),
    )
    folders = [tmp_path / "0", tmp_path / "1"]
    copies = [prepare_copy(folder) for folder in folders]
    found = run_shards(area, folders, copies, None, 240, keep=lambda op, line: (op, line) in PICKS)
    assert sorted((m.operator, m.source) for m in found) == sorted(PICKS)
    assert all(m.verdict == "killed" for m in found), found
    assert all(m.diff.startswith("---") for m in found), found
    assert all(line in _lines("spec/lease.py") for _, line in PICKS), "the package changed"


def test_a_kill_whose_tests_do_not_run_here_is_never_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test command that runs no test exits non-zero, which cosmic-ray counts
    as a kill: ``--check-kills`` first asks how many of a survivor's killing
    tests run here. A PostgreSQL-only test runs none without the test server
    (and the net's runs never see it unless asked), a DuckDB case runs."""
    monkeypatch.setenv(SERVER_ENV, "postgresql://nowhere.invalid/none")
    pg_only = (
        "checking/test_outbox_survivors.py::"
        "test_a_claim_of_no_such_operation_is_not_found_on_the_server"
    )
    assert selected([pg_only], tmp_path, server=False) == 0
    duck = (
        "checking/test_outbox_survivors.py::"
        "test_an_operation_is_due_at_exactly_its_next_attempt_time"
    )
    assert selected([duck], tmp_path, server=False) == 1
