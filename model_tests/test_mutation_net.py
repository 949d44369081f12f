"""The second mutation net (``mutation_net/``, issue 22) in CI: its survivor
classification cannot go stale (every entry well formed, its source line
still in the installed package, its killing tests there to run), the
committed report is well formed with every survivor classified, the areas
cover all of ``spec/`` and exist, and a small real run: two mutants of
``spec/lease.py`` made by cosmic-ray in a temporary copy of the package are
killed by their fixed test (which passes on the installed package, in
``test_machines.py``).

``make mutation-net`` runs the net itself (hours for every area on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mutants.apply import installed_package
from mutants.catalog import MUTANTS
from mutants.collect import missing
from mutation_net import report
from mutation_net.areas import AREAS, OPERATORS, Area, tests_of
from mutation_net.run import prepare_copy, run_area
from mutation_net.survivors import KINDS, SURVIVORS, Site, Verdict

PACKAGE = installed_package()
CATALOG_IDS = {m.id for m in MUTANTS}


def _lines(file: str) -> set[str]:
    path = PACKAGE / file
    return {line.strip() for line in path.read_text().splitlines()} if path.is_file() else set()


@pytest.mark.parametrize(
    ("site", "verdict"), list(SURVIVORS.items()), ids=[f"{s.file}:{s.operator}" for s in SURVIVORS]
)
def test_every_classification_is_well_formed_and_current(site: Site, verdict: Verdict) -> None:
    assert site.operator in OPERATORS, f"{site}: an operator the net does not run"
    assert site.line in _lines(site.file), f"stale: the line is not in {site.file} any more"
    assert verdict.kind in KINDS and verdict.why.strip()
    if verdict.kind == "killed":
        assert verdict.tests, f"{site}: killed by no test"
    else:
        assert not verdict.tests and not verdict.catalog
    assert not verdict.catalog or verdict.catalog in CATALOG_IDS, verdict.catalog
    assert all(not t.startswith("test_stateful_") for t in verdict.tests), (
        "a search, not a fixed test"
    )


def test_every_killing_test_exists() -> None:
    """One collection; a test that is not there (the control, beside them) is
    the only one reported."""
    tests = [t for v in SURVIVORS.values() for t in v.tests]
    gone = "test_machines.py::test_no_such_test"
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
        for t in tests_of(a)
        if not (Path(__file__).parent / t.split("::")[0]).is_file()
    ]
    assert gone == []


def test_the_report_is_well_formed_and_every_survivor_classified() -> None:
    data = json.loads(report.JSON_PATH.read_text())
    assert data["tool"] == "cosmic-ray" and data["version"] and data["operators"] == list(OPERATORS)
    for name, m in data["modules"].items():
        assert (PACKAGE / name).is_file(), name
        assert m["mutants"] == sum(m[v] for v in report.VERDICTS), name
    assert data["totals"]["survived"] == len(data["survivors"])
    for s in data["survivors"]:
        assert s["diff"] and s["file"] in data["modules"], s
        assert SURVIVORS.get(Site(s["file"], s["operator"], s["source"])) is not None, (
            f"unclassified survivor {s['file']}:{s['line']} {s['operator']}"
        )
    assert report.MD_PATH.read_text() == report.markdown(report.finish(data))


PICKS = {
    ("core/ReplaceAndWithOr", 'refusal = "purpose" if same_owner and not same_purpose else "busy"'),
    (
        "core/ReplaceComparisonOperator_In_NotIn",
        "return (edge.name, epoch + 1 if edge.name in GRANTING_EDGES else epoch)",
    ),
}
"""The two mutants the real run makes: the lease's acquire decision, broken twice."""


def test_two_mutants_made_by_cosmic_ray_are_killed(tmp_path: Path) -> None:
    assert all(line in _lines("spec/lease.py") for _, line in PICKS), "stale picks"
    area = Area(
        "ci",
        ("spec/lease.py",),
        ("test_machines.py::test_acquire_decision_matches_the_lease_machine_exhaustively",),
    )
    copy = prepare_copy(tmp_path)
    found = run_area(area, tmp_path, copy, keep=lambda op, line: (op, line) in PICKS)
    assert {(m.operator, m.source) for m in found} == PICKS
    assert all(m.verdict == "killed" for m in found), found
    assert all(m.diff.startswith("---") for m in found), found
    assert all(line in _lines("spec/lease.py") for _, line in PICKS), "the package changed"
