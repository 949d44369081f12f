"""Docs that run: every python block in README.md executes, and so does the
recipe that starts a PostgreSQL server of one's own."""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

import turnkeeper
from turnkeeper import EntryKind

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_examples():
    assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"README.md[python {index}]", "exec"), {})


SH_BLOCKS = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
PG_RECIPE = next((b for b in SH_BLOCKS if "initdb" in b), "")
"""The README's recipe for a PostgreSQL server of one's own."""

DEBIAN_PATH = "/usr/bin:/bin"
"""A PATH without PostgreSQL's server programs, as on Debian and Ubuntu."""


def _postgres_installed() -> bool:
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb") or shutil.which(
        "initdb", path=DEBIAN_PATH
    )
    if found:
        return True
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("CI=true and PostgreSQL's initdb is not installed")
    pytest.skip("PostgreSQL's initdb is not installed")


def test_readme_postgres_recipe_runs_as_written_on_a_unix_socket_only() -> None:
    """The recipe's lines run as written, with Debian's PATH (no ``initdb`` or
    ``pg_ctl`` on it), as a user that is not root (``postgres`` when the tests
    run as root): the server it starts takes a store at the URL it exports,
    listens on no TCP address (``listen_addresses`` empty, reached through its
    socket), and its last line stops it. Before, the recipe called ``initdb``
    from PATH ("initdb: command not found") and listened on 127.0.0.1:5544."""
    _postgres_installed()
    lines = PG_RECIPE.strip().splitlines()
    (use,) = [i for i, line in enumerate(lines) if line.startswith("turnkeeper ")]
    setup, teardown = lines[:use], lines[use + 1 :]
    assert setup and teardown, PG_RECIPE
    shown = (
        'printf "PGBIN=%s\\nPGDATA=%s\\nTURNKEEPER_DB=%s\\n" "$PGBIN" "$PGDATA" "$TURNKEEPER_DB"'
    )
    home = tempfile.mkdtemp(prefix="turnkeeper-readme-")
    as_user: dict[str, Any] = {}
    if os.geteuid() == 0:  # the server refuses root: run the recipe as postgres
        as_user = {"user": "postgres", "group": "postgres", "extra_groups": []}
        entry = pwd.getpwnam("postgres")
        os.chown(home, entry.pw_uid, entry.pw_gid)
    env = {"PATH": DEBIAN_PATH, "HOME": home}

    def sh(script: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-eu", "-c", "\n".join(script)],
            env={**env, **extra},
            cwd=home,
            capture_output=True,
            text=True,
            timeout=600,
            **as_user,
        )

    started: dict[str, str] = {}
    try:
        out = sh([*setup, shown], {})
        assert out.returncode == 0, out.stdout + out.stderr
        started = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        url = started["TURNKEEPER_DB"]
        assert started["PGDATA"] == os.path.join(home, "turnkeeper-pg")
        with turnkeeper.open_store(url) as store:
            store.sessions.create("s")
            store.sessions.append(
                "s", EntryKind.MESSAGE, {"message": {"role": "user", "content": "\x00"}}
            )
            assert list(store.sessions.replay("s").messages) == [
                {"role": "user", "content": "\x00"}
            ]
        import psycopg

        with psycopg.connect(url) as conn:  # as the recipe's superuser
            row = conn.execute(
                "SELECT current_setting('listen_addresses'), inet_server_addr() IS NULL, "
                "current_setting('unix_socket_directories'), current_setting('server_encoding')"
            ).fetchone()
        assert row == ("", True, started["PGDATA"], "UTF8")
        stopped = sh(teardown, started)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not os.path.exists(os.path.join(started["PGDATA"], "postmaster.pid"))
    finally:
        if "PGDATA" in started:  # a failed run leaves no server behind
            subprocess.run(
                [f"{started['PGBIN']}/pg_ctl", "-D", started["PGDATA"], "-m", "immediate", "stop"],
                env=env,
                capture_output=True,
                **as_user,
            )
        shutil.rmtree(home, ignore_errors=True)
