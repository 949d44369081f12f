"""`make test` runs the suite as shares side by side (in_shards.py, conftest.shard):
every test in exactly one share, files whole, the shares' outputs and exit statuses
all reported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARD_ENV, shard

HERE = Path(__file__).resolve().parents[1]  # model_tests/, where the support modules are
RUNNER = HERE / "in_shards.py"

IDS = [
    *(f"test_a.py::t{i}" for i in range(7)),
    *(f"test_b.py::t{i}[duckdb]" for i in range(4)),
    *(f"test_c.py::t{i}" for i in range(3)),
    "test_d.py::only",
    *(f"test_e.py::C::t{i}" for i in range(2)),
]


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_every_test_is_in_exactly_one_share_and_files_stay_whole(count: int):
    shares = [shard(IDS, i, count) for i in range(count)]
    assert sorted(id_ for s in shares for id_ in s) == sorted(IDS)
    for s in shares:
        files = {id_.split("::", 1)[0] for id_ in s}
        for name in files:  # a file's tests all in this share
            assert {i for i in IDS if i.startswith(name + "::")} <= s
    # the greedy split is never off by more than the largest file
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 7
    assert [shard(IDS, i, count) for i in range(count)] == shares  # the same every time


def test_two_shares_split_these_files_evenly():
    first, second = shard(IDS, 0, 2), shard(IDS, 1, 2)
    assert {len(first), len(second)} == {8, 9}


def test_a_share_that_does_not_exist_is_a_usage_error():
    with pytest.raises(pytest.UsageError, match="no such share"):
        shard(IDS, 2, 2)


def _collected(*files: str, share: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != SHARD_ENV}
    if share is not None:
        env[SHARD_ENV] = share
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=HERE.parent,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(line for line in out.splitlines() if "::" in line)


def test_the_suite_collected_in_two_shares_is_the_suite():
    files = ("model_tests/suite/test_shards.py", "model_tests/suite/test_constraints.py")
    whole = _collected(*files, share=None)
    first, second = _collected(*files, share="0/2"), _collected(*files, share="1/2")
    assert whole and first and second
    assert not set(first) & set(second)
    assert sorted(first + second) == whole


def test_a_share_is_not_passed_on_to_the_processes_its_tests_start():
    # Run in a share of its own, this file's check below must see no share: the
    # pytest runs tests start (killing-test collection, mutant runs) are whole.
    env = {**os.environ, SHARD_ENV: "0/1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "model_tests/suite/test_shards.py::test_no_share_in_the_environment",
        ],
        cwd=HERE.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr


def test_no_share_in_the_environment():
    assert SHARD_ENV not in os.environ


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != SHARD_ENV}  # this test may run in a share
    return subprocess.run(
        [sys.executable, str(RUNNER), *argv], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_runner_prints_every_share_and_passes_when_all_pass():
    done = _run("3", sys.executable, "-c", f"import os; print('share', os.environ['{SHARD_ENV}'])")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("share 0/3") == 1
    assert "== share 1/3 of the suite (exit 0) ==\nshare 1/3" in done.stdout
    assert "== share 2/3 of the suite (exit 0) ==\nshare 2/3" in done.stdout


def test_the_runner_fails_when_one_share_fails():
    # share 1 exits 3, the others 0
    code = f"import os, sys; sys.exit(3 if os.environ['{SHARD_ENV}'] == '1/2' else 0)"
    done = _run("2", sys.executable, "-c", code)
    assert done.returncode == 3
    assert "shares failed: 1 of 2" in done.stdout
    assert "== share 1/2 of the suite (exit 3) ==" in done.stdout


def test_a_share_killed_by_a_signal_fails_the_run_as_the_shell_reports_it():
    code = (
        f"import os, signal; os.environ['{SHARD_ENV}'] == '0/2' "
        "and os.kill(os.getpid(), signal.SIGKILL)"
    )
    done = _run("2", sys.executable, "-c", code)
    assert done.returncode == 128 + 9


def test_one_share_runs_the_command_itself():
    done = _run("1", sys.executable, "-c", f"import os; print('{SHARD_ENV}' in os.environ)")
    assert done.returncode == 0
    assert done.stdout.strip() == "False"


def test_a_bad_count_is_a_usage_error():
    for argv in (("0", "true"), ("x", "true"), ("2",)):
        assert _run(*argv).returncode == 2
