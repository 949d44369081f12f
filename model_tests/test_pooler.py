"""PostgreSQL behind PgBouncer in transaction mode (``pool_mode = transaction``).

The pooler lends a server connection for one transaction: prepared
statements, ``LISTEN`` and startup options do not survive it. These tests
run real operations through a real PgBouncer 1.18 (``with_postgres.py``
starts it in front of the test server) and check each thing the store needs
of a session: it works in pooler mode, or is refused with a typed error
that says what to do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.postgres

HERE = Path(__file__).resolve().parent
CLI = [sys.executable, "-m", "turnkeeper.cli.main"]
TIMEOUT_S = 600
"""A guard against hangs only (a loaded 2-core machine)."""


# -- the harness ------------------------------------------------------------------

HARNESS_PROBE = """
import json, os, pathlib, psycopg
env = {k: os.environ.get(k) for k in
       ("TURNKEEPER_TEST_PG", "TURNKEEPER_TEST_PG_DIRECT", "TURNKEEPER_TEST_PGBOUNCER")}
pooled = {}
for k, url in env.items():
    with psycopg.connect(url, autocommit=True) as c:
        pooled[k] = c.execute("SELECT pg_backend_pid()").fetchone()[0] != c.info.backend_pid
folder = pathlib.Path(env["TURNKEEPER_TEST_PG_DIRECT"].split("host=", 1)[1])
pid = int((folder / "pgbouncer-6432.pid").read_text())
print(json.dumps({"env": env, "pooled": pooled, "folder": str(folder), "pid": pid}))
raise SystemExit(3)
"""


def test_the_harness_runs_pgbouncer_in_front_and_stops_it():
    """with_postgres.py starts PgBouncer in transaction mode on a socket in the
    server's folder and names it (``TURNKEEPER_TEST_PGBOUNCER``); with
    ``--through-pgbouncer`` the suite's URL is the pooler's. Afterwards the
    pooler is gone with the server and its folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_TEST_PG")}
    script = str(HERE / "with_postgres.py")
    runs = [
        subprocess.run(
            [sys.executable, script, *flag, sys.executable, "-c", HARNESS_PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        for flag in ([], ["--through-pgbouncer"])
    ]
    assert [r.returncode for r in runs] == [3, 3], [r.stderr for r in runs]
    plain, through = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    pg, direct, bouncer = plain["env"].values()
    assert pg == direct and bouncer.endswith("&port=6432")
    assert list(plain["pooled"].values()) == [False, False, True]
    pg, direct, bouncer = through["env"].values()
    assert pg == bouncer != direct
    assert list(through["pooled"].values()) == [True, False, True]
    for found in (plain, through):
        assert not os.path.exists(found["folder"])
        with pytest.raises(ProcessLookupError):
            os.kill(found["pid"], 0)
