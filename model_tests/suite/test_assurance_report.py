"""The assurance report (``reports/ASSURANCE.md``, issue 22): it exists, it is
well formed (every section, a row for every model, machine, mutant and
contracted function, every table row as wide as its header), and it is what
``reports/assurance.py`` makes from the code as it stands (also checked, with
every generated file, by ``test_machines.test_reports_are_fresh``): a change to
what is checked without regenerating it fails here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import test_crosshair
from model_check.__main__ import BOUNDS
from mutants import catalog

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "reports"))
import assurance  # noqa: E402  (reports/ is not a package)

sys.path.remove(str(ROOT / "reports"))

SECTIONS = (
    "## Bounded model checker",
    "## Differential stateful machines",
    "## Fence mutants",
    "## CrossHair contracts",
)


@pytest.fixture(scope="module")
def text() -> str:
    assert assurance.OUT.exists(), "run `python reports/generate.py`"
    return assurance.OUT.read_text(encoding="utf-8")


def _rows(text: str, section: str) -> list[list[str]]:
    """The first table's rows (cells) under ``section``, header included."""
    body = text.split(section, 1)[1].split("\n## ", 1)[0]
    table = body[body.index("\n|") + 1 :].split("\n\n", 1)[0]
    rows = table.splitlines()
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows if "---" not in row]


def test_every_section_is_there_in_order(text: str) -> None:
    at = [text.index(s) for s in SECTIONS]
    assert at == sorted(at)


def test_every_table_row_is_as_wide_as_its_header(text: str) -> None:
    for section in SECTIONS:
        rows = _rows(text, section)
        assert len(rows) > 1, section
        assert all(len(r) == len(rows[0]) for r in rows), section


def test_every_checked_thing_has_its_row(text: str) -> None:
    models = [r[0] for r in _rows(text, SECTIONS[0])[1:]]
    assert [n for n, _ in BOUNDS["ci"]] == models[: len(BOUNDS["ci"])]
    machines = [r[0].strip("`") for r in _rows(text, SECTIONS[1])[1:]]
    assert machines == [m for m, _, _ in assurance.MACHINES]
    mutants = [r[0] for r in _rows(text, SECTIONS[2])[1:]]
    assert mutants == [m.id for m in catalog.MUTANTS]
    functions = [r[0].strip("`") for r in _rows(text, SECTIONS[3])[1:]]
    assert functions == [
        f"spec.{module}.{name}"
        for module, names in test_crosshair.CONTRACTED.items()
        for name in names
    ]


def test_the_report_is_what_the_code_makes(text: str) -> None:
    assert text == assurance.report()


def test_control_a_mutant_added_to_the_catalog_makes_the_report_stale(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the catalog changed (here: one entry more) and the committed
    report no longer matches what the code makes."""
    extra = catalog.MUTANTS[0].__class__(**{**vars(catalog.MUTANTS[0]), "id": "added"})
    monkeypatch.setattr(catalog, "MUTANTS", (*catalog.MUTANTS, extra))
    assert text != assurance.report()
