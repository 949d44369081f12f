"""The fence-mutant catalog (``model_tests/mutants/``, issue 22) in CI: it
cannot go stale (every entry's source text is in the installed package
exactly once, every killing test exists), it covers every fence kind of the
issue's list, and two mutants run for real: applied to a temporary copy of
the package (which is what a process with ``PYTHONPATH`` at it imports),
their killing tests fail.

``make mutants`` runs every entry (``python -m mutants``, from ``model_tests/``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from mutants.__main__ import imports_copy, main, run_mutant
from mutants.apply import StaleMutantError, installed_package, mutated_copy, occurrences
from mutants.catalog import EQUIVALENT, KINDS, MUTANTS, Mutant
from mutants.collect import missing

PACKAGE = installed_package()
BY_ID = {m.id: m for m in MUTANTS}

RUN_IN_CI = ("append-expected-leaf-merged", "query-duckdb-write-nodes")
"""The two mutants this module runs for real: fast ones (one DuckDB test each)."""


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_every_entrys_source_text_occurs_exactly_once(mutant: Mutant) -> None:
    assert occurrences(mutant, PACKAGE) == 1, (
        f"{mutant.id}: stale, its source text is not in {mutant.file} exactly once"
    )
    assert mutant.new != mutant.old


def test_every_killing_test_exists() -> None:
    """One collection of every killing test's file; the id of a test that is not
    there (the control, beside them) is the only one reported."""
    tests = [t for m in MUTANTS for t in m.tests]
    searches = [t for t in tests if t.startswith("stateful/test_stateful_")]
    assert searches == [], "a search, not a fixed test"
    gone = "conformance/test_conformance_leases.py::test_no_such_test"
    assert missing([*tests, gone, f"{tests[0]}x"]) == sorted([gone, f"{tests[0]}x"])


def test_every_fence_kind_has_an_entry_and_every_entry_a_kind() -> None:
    kinds = {m.kind for m in MUTANTS}
    assert kinds == set(KINDS), (set(KINDS) - kinds, kinds - set(KINDS))
    assert len(BY_ID) == len(MUTANTS), "two entries share an id"
    assert all(m.tests and m.guards for m in MUTANTS)
    assert all(reason for reason in EQUIVALENT.values())


def test_a_stale_entry_is_refused_loudly(tmp_path: Path) -> None:
    """The runner stops on source text found 0 or 2+ times, copying nothing."""
    base = BY_ID["thread-key-absent"]
    for stale in (
        dataclasses.replace(base, old=base.old + "  # not in the file"),
        dataclasses.replace(base, old="\n"),
    ):
        with pytest.raises(StaleMutantError):
            mutated_copy(stale, PACKAGE, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_list_names_every_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{m.id}  [{m.kind}]" in out for m in MUTANTS)


def test_two_mutants_are_killed() -> None:
    """Each applied to a temporary copy, its killing tests fail (the same tests
    pass in this suite, on the installed package: the copy's unmutated twin).
    The installed package is unchanged after the runs."""
    for mutant_id in RUN_IN_CI:
        outcome = run_mutant(BY_ID[mutant_id], PACKAGE, timeout_s=300)
        assert outcome.verdict == "killed", outcome.output[-3000:]
        assert set(outcome.failed) == set(BY_ID[mutant_id].tests), outcome.output[-3000:]
    assert all(occurrences(BY_ID[i], PACKAGE) == 1 for i in RUN_IN_CI)


def test_a_copy_is_what_the_tests_import(tmp_path: Path) -> None:
    """``PYTHONPATH`` at a copy makes a process import the copy, not the
    installed package (so a mutant applied there is the code under test)."""
    copy = mutated_copy(BY_ID[RUN_IN_CI[0]], PACKAGE, tmp_path)
    assert imports_copy(tmp_path)
    assert occurrences(BY_ID[RUN_IN_CI[0]], copy) == 0
    assert (copy / BY_ID[RUN_IN_CI[0]].file).read_text().count(BY_ID[RUN_IN_CI[0]].new) >= 1
