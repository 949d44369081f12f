"""Writes constraints/venv.txt and constraints/build.txt afresh (``make lock``).

venv.txt: the exact version of every package ``make install`` puts in .venv, read
off a new virtual environment in which ``pip install '.[test]'`` resolved
pyproject.toml's ranges against the index today (``pip freeze --all``, turnkeeper
itself left out). build.txt: the setuptools that builds turnkeeper's wheel (the
newest release that pyproject.toml's ``[build-system] requires`` admits; pip's
isolated build environment is not bound by the venv's constraints). Run ``make
test`` after it: a newer release of a dependency may fail the suite, and then the
lock stays as it was (``git checkout constraints/``) until that is fixed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

VENV_HEADER = """\
# The exact version of every package `make install` puts in .venv (the tests, the
# demo, CI), given to pip as constraints (-c): a release on the index cannot change
# what the suite runs against. A user's `pip install turnkeeper[...]` gets
# pyproject.toml's ranges instead. Written by `make lock` (constraints/lock.py);
# model_tests/suite/test_constraints.py checks .venv matches it.
"""

BUILD_HEADER = """\
# The setuptools that builds turnkeeper's wheel in pip's isolated build environment
# (pip --build-constraint): the newest release pyproject.toml's [build-system]
# requires admits when `make lock` (constraints/lock.py) last ran.
"""


def _run(*argv: str | Path) -> str:
    return subprocess.run(
        [str(a) for a in argv], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-lock-") as tmp:
        venv = Path(tmp) / "venv"
        _run(sys.executable, "-m", "venv", venv)
        pip = venv / "bin" / "pip"
        _run(pip, "install", "-q", "--upgrade", "pip")
        _run(pip, "install", "-q", ".[test]")
        frozen = _run(pip, "freeze", "--all", "--exclude", "turnkeeper")
        requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
        report = json.loads(
            _run(
                pip, "install", "-q", "--dry-run", "--ignore-installed", "--report", "-", *requires
            )
        )
    pins = sorted(
        f"{item['metadata']['name']}=={item['metadata']['version']}" for item in report["install"]
    )
    (ROOT / "constraints" / "venv.txt").write_text(VENV_HEADER + frozen)
    (ROOT / "constraints" / "build.txt").write_text(BUILD_HEADER + "\n".join(pins) + "\n")


if __name__ == "__main__":
    main()
