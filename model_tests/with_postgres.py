"""Run a command (the test suite) beside a throwaway PostgreSQL server.

``python model_tests/with_postgres.py CMD …`` runs ``CMD`` with
``TURNKEEPER_TEST_PG`` naming a PostgreSQL server the tests may create schemas
in, and stops the server when ``CMD`` ends (even on failure or Ctrl-C):

- ``TURNKEEPER_TEST_PG`` already set: that server is used as it is;
- else ``pg_virtualenv`` (Debian's postgresql-common) creates a throwaway
  cluster in a temporary folder, on a localhost port, running as the
  ``postgres`` user when we are root (the server refuses to run as root),
  exports its ``PG*`` variables to ``CMD`` and drops the cluster afterwards;
- else nothing can start one: one line says the PostgreSQL tests are
  skipped and why, and ``CMD`` runs without them (under ``CI=true`` that is a
  failure instead: CI must test both backends).

The server trades durability for speed (``fsync=off``): it holds test data
only and is dropped with its folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ENV = "TURNKEEPER_TEST_PG"
SERVER_OPTIONS = ["fsync=off", "synchronous_commit=off", "max_connections=300"]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: with_postgres.py CMD [ARG …]", file=sys.stderr)
        return 2
    if os.environ.get(ENV):
        return subprocess.call(argv)
    launcher = shutil.which("pg_virtualenv")
    if launcher is None or shutil.which("pg_config") is None:
        why = "pg_virtualenv and PostgreSQL's server binaries are not on PATH"
        if os.environ.get("CI", "").lower() == "true":
            print(f"CI=true and no PostgreSQL test server can start: {why}", file=sys.stderr)
            return 1
        print(f"PostgreSQL tests skipped: {why} (or set {ENV} to a server's URL)")
        return subprocess.call(argv)
    command = [launcher]
    for option in SERVER_OPTIONS:
        command += ["-o", option]
    # pg_virtualenv exports PGHOST, PGPORT, PGUSER and PGPASSWORD: an empty URL
    # lets libpq take them.
    command += ["env", f"{ENV}=postgresql://", *argv]
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
