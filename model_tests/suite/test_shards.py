"""`make test` runs the suite as shares side by side (in_shards.py, shares.py): each
share claims files one at a time as it becomes free, every test runs in exactly one
share, files whole, and the shares' outputs and exit statuses are all reported."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from shares import CLAIMS_ENV, claim, file_order

HERE = Path(__file__).resolve().parents[1]  # model_tests/, where the support modules are
RUNNER = HERE / "in_shards.py"
SHARD_ENV = "TURNKEEPER_TEST_SHARD"


def test_a_file_is_claimed_by_the_first_claim_only(tmp_path: Path):
    assert claim(tmp_path, "model_tests/a/test_x.py")
    assert not claim(tmp_path, "model_tests/a/test_x.py")
    assert claim(tmp_path, "model_tests/a/test_y.py")


def _item(nodeid: str, slow: bool = False) -> pytest.Item:
    marker = object() if slow else None
    fake = SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: marker)
    return fake  # type: ignore[return-value]


def test_files_are_walked_slow_first_then_by_their_number_of_tests_and_kept_whole():
    items = [
        _item("b.py::t0"), _item("a.py::t0"), _item("c.py::t0"), _item("b.py::t1"),
        _item("d.py::t0", slow=True), _item("a.py::t1"),
    ]  # fmt: skip
    order = [[i.nodeid for i in f] for f in file_order(items)]
    assert order == [["d.py::t0"], ["a.py::t0", "a.py::t1"], ["b.py::t0", "b.py::t1"], ["c.py::t0"]]


# A suite where one share must run every file but one: the slow file's first
# test waits until the last of the others has run (it writes DONE). Files split
# before the run would give the waiting share some of the others too, and it
# would wait for itself (until HANG_GUARD_S, then fail). (A share claims its
# next file as its file's last test starts: here a test after the wait.)
HANG_GUARD_S = 120
WAITS = f"""
import pathlib, time, pytest

@pytest.mark.slow
def test_waits_for_the_others():
    done = pathlib.Path(__file__).with_name("DONE")
    give_up = time.monotonic() + {HANG_GUARD_S}
    while not done.exists():
        assert time.monotonic() < give_up, "the other share never ran the last file"
        time.sleep(0.05)

def test_after_the_wait():
    pass
"""
OTHERS = {
    "test_a.py": "def test_a0(): pass\ndef test_a1(): pass\ndef test_a2(): pass\n",
    "test_b.py": "def test_b0(): pass\ndef test_b1(): pass\n",
    "test_c.py": "def test_c0(): pass\n",
    "test_z.py": (  # the fewest tests and the last name: the last file walked
        "import pathlib\ndef test_z0(): pathlib.Path(__file__).with_name('DONE').write_text('')\n"
    ),
}


def test_a_share_takes_the_next_free_file_while_the_other_is_busy(tmp_path: Path):
    (tmp_path / "test_slow.py").write_text(WAITS)
    for name, text in OTHERS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (SHARD_ENV, CLAIMS_ENV, "CI") and not k.startswith("TURNKEEPER_TEST_")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    pytest_run = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "conftest"]
    done = subprocess.run(
        [sys.executable, str(RUNNER), "2", *pytest_run],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S + 120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    first, second = out.split("== share 1/2 of the suite (exit 0) ==")
    ran = [re.findall(r"^(test_\w+\.py::\w+) PASSED", share, re.M) for share in (first, second)]
    slow = ["test_slow.py::test_waits_for_the_others", "test_slow.py::test_after_the_wait"]
    every = slow + [
        f"{name}::{t}" for name, text in OTHERS.items() for t in re.findall(r"def (test_\w+)", text)
    ]
    assert sorted(ran[0] + ran[1]) == sorted(every), out
    assert slow in ran, out  # the waiting share ran its file and nothing else
    for share, tests in zip((first, second), ran, strict=True):
        left = len(every) - len(tests)
        assert re.search(rf"{len(tests)} passed, {left} deselected", share), share
        assert "[100%]" in share, share


def test_a_share_is_not_passed_on_to_the_processes_its_tests_start(tmp_path: Path):
    # Run in a share of its own, this file's check below must see no share: the
    # pytest runs tests start (killing-test collection, mutant runs) are whole.
    env = {**os.environ, SHARD_ENV: "0/1", CLAIMS_ENV: str(tmp_path)}
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
    assert SHARD_ENV not in os.environ and CLAIMS_ENV not in os.environ


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
