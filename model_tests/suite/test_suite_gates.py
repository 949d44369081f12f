"""What the suite does without the shared corpus: the tests that read it are left
out with one summary line (they used to skip one by one, easy to miss), and
under ``CI=true`` the run fails, as it does without a PostgreSQL test server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # model_tests/, where the support modules are
CORPUS_TEST = "model_tests/formats/test_pi_format.py::test_corpus_is_the_expected_set"
OTHER_TEST = "model_tests/formats/test_pi_format.py::test_duplicate_entry_ids_keep_the_first"


def _pytest(tmp_path: Path, *, ci: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["TURNKEEPER_CORPUS"] = str(tmp_path / "no-corpus")
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", CORPUS_TEST, OTHER_TEST],
        cwd=HERE.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_without_the_corpus_its_tests_are_left_out_saying_so(tmp_path: Path) -> None:
    done = _pytest(tmp_path, ci=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 1 deselected" in done.stdout, done.stdout
    missing = tmp_path / "no-corpus" / "pi"
    line = f"corpus tests skipped (1): the folder {missing} is missing"
    assert line in done.stdout, done.stdout


def test_without_the_corpus_ci_fails(tmp_path: Path) -> None:
    done = _pytest(tmp_path, ci=True)
    assert done.returncode == 4, done.stdout + done.stderr  # a usage error: nothing ran
    assert "CI=true and the corpus folder" in done.stderr, done.stderr
    assert "passed" not in done.stdout
