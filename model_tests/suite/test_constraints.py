"""The pinned environment: .venv holds exactly constraints/venv.txt (what `make
install` gives pip as constraints), and constraints/build.txt's setuptools is one
pyproject.toml's [build-system] admits. A release on the index (cryptography 51
moved Fernet's clock out of Python and failed the vendored SDK tests that patch
it) cannot change what the suite runs against; `make lock` moves the pins."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
VENV_PINS = ROOT / "constraints" / "venv.txt"
BUILD_PINS = ROOT / "constraints" / "build.txt"
PIN_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def pins(text: str) -> dict[str, str]:
    """name (PEP 503 normalized) -> version of each ``name==version`` line; any other
    line that is not blank or a comment is an error (a range pins nothing)."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN_LINE.match(line)
        assert match, f"line {number} is no exact pin: {line!r}"
        name = canonicalize_name(match[1])
        assert name not in found, f"{name} pinned twice"
        found[name] = match[2]
    return found


def installed() -> dict[str, str]:
    """name (normalized) -> version of every distribution in this environment but
    turnkeeper itself."""
    found = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    found.pop("turnkeeper", None)
    return found


def mismatches(pinned: dict[str, str], present: dict[str, str]) -> list[str]:
    """Each way ``present`` differs from ``pinned``: a package installed at another
    version, installed but not pinned, or pinned but not installed."""
    out = []
    for name in sorted(pinned.keys() | present.keys()):
        want, have = pinned.get(name), present.get(name)
        if want is None:
            out.append(f"{name} {have} installed, not pinned")
        elif have is None:
            out.append(f"{name}=={want} pinned, not installed")
        elif Version(want) != Version(have):
            out.append(f"{name} {have} installed, {want} pinned")
    return out


def test_venv_is_exactly_the_pins():
    found = mismatches(pins(VENV_PINS.read_text()), installed())
    assert not found, (
        "the environment differs from constraints/venv.txt (`make install` in a new "
        f".venv installs the pins; `make lock` moves them): {found}"
    )


def test_every_installed_package_is_pinned_with_its_version():
    # The pins cover the suite's own tools too: pip, the test runner, the checkers.
    pinned = pins(VENV_PINS.read_text())
    for name in ("pip", "pytest", "hypothesis", "crosshair-tool", "mypy", "ruff", "duckdb"):
        assert name in pinned, name
    assert set(pinned) == set(installed())


def test_build_pins_satisfy_the_build_requirements():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    pinned = pins(BUILD_PINS.read_text())
    for text in requires:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is built with but not pinned in constraints/build.txt"
        assert requirement.specifier.contains(pinned[name]), (name, pinned[name])


def test_make_install_pins_pip_the_install_and_the_build():
    makefile = (ROOT / "Makefile").read_text()
    assert "PIN := -c constraints/venv.txt" in makefile
    assert "BUILD_PIN := --build-constraint constraints/build.txt" in makefile
    installs = [line.strip() for line in makefile.splitlines() if "/pip install" in line]
    assert installs, "Makefile installs nothing with pip"
    for line in installs:
        assert "$(BUILD_PIN)" in line or "$(PIN)" in line, line
        if "'.[test]'" in line:
            assert "$(PIN)" in line and "$(BUILD_PIN)" in line, line


def test_control_each_kind_of_difference_is_reported():
    pinned = {"cryptography": "50.0.2", "duckdb": "2.0.1", "pip": "26.3"}
    assert mismatches(pinned, dict(pinned)) == []
    assert mismatches(pinned, {**pinned, "cryptography": "51.0.1"}) == [
        "cryptography 51.0.1 installed, 50.0.2 pinned"
    ]
    assert mismatches(pinned, {**pinned, "mutmut": "3.0"}) == ["mutmut 3.0 installed, not pinned"]
    without = {k: v for k, v in pinned.items() if k != "duckdb"}
    assert mismatches(pinned, without) == ["duckdb==2.0.1 pinned, not installed"]
    # Equal versions spelled apart are equal; names are compared normalized.
    assert mismatches({"a-b": "1.0"}, {"a-b": "1"}) == []
    assert pins("# c\nTyping_Extensions==4.0\n") == {"typing-extensions": "4.0"}


def test_control_a_range_or_a_repeat_is_no_pin():
    with pytest.raises(AssertionError, match="no exact pin"):
        pins("cryptography>=42\n")
    with pytest.raises(AssertionError, match="pinned twice"):
        pins("duckdb==2.0.1\nDuckDB==2.0.1\n")
