"""Run a command (the test suite, a benchmark) beside a throwaway PostgreSQL server.

``python model_tests/with_postgres.py [--durable] CMD …`` runs ``CMD`` with
``TURNKEEPER_TEST_PG`` naming a PostgreSQL server it may create schemas in,
and stops the server and deletes its folder when ``CMD`` ends (on failure,
Ctrl-C or SIGTERM too); the exit status is ``CMD``'s.

- ``TURNKEEPER_TEST_PG`` already set: that server is used as it is;
- else PostgreSQL's ``initdb`` and ``pg_ctl`` (found on PATH, through
  ``pg_config --bindir``, or in ``/usr/lib/postgresql/*/bin``) create a cluster
  in a new temporary folder and start it on a Unix socket in that folder
  only (no TCP port, so runs side by side never collide), as the
  ``postgres`` system user when we are root (the server refuses to run as
  root);
- else nothing can start one: one line says the PostgreSQL tests are skipped
  and why, and ``CMD`` runs without them (under ``CI=true`` that is a failure
  instead: CI must test both backends).

For the tests the server trades durability for speed (``fsync=off``: it holds
test data only); ``--durable`` keeps PostgreSQL's durable defaults (the
benchmark's figures). Why not ``pg_virtualenv``: as root it always makes the
system-wide cluster ``15/regress``, so two runs on one machine collide and a
killed run blocks the next; ``pytest-postgresql`` cannot start the server as
another user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ENV = "TURNKEEPER_TEST_PG"
FAST = ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
COMMON = ["max_connections=300", "listen_addresses=''", "shared_buffers=128MB"]
START_TIMEOUT_S = 300
"""How long pg_ctl waits for the server to accept connections (a loaded machine)."""


def bindir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``, or ``None``."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    config = shutil.which("pg_config")
    if config:
        out = subprocess.run([config, "--bindir"], capture_output=True, text=True)
        folder = Path(out.stdout.strip())
        if out.returncode == 0 and (folder / "initdb").exists():
            return folder
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


def server_user() -> dict[str, Any]:
    """subprocess arguments that run the server as ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


def start(bin_: Path, folder: Path, *, durable: bool) -> str:
    """initdb + pg_ctl start in ``folder``; the server's URL."""
    as_user = server_user()
    if as_user:
        entry = pwd.getpwnam("postgres")
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    data = folder / "data"
    initdb = ["-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"]
    subprocess.run(
        [str(bin_ / "initdb"), *initdb, "--no-sync"],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=folder,
        **as_user,
    )
    options = [*COMMON, *([] if durable else FAST), f"unix_socket_directories='{folder}'"]
    settings = " ".join(f"-c {o}" for o in options)
    pg_ctl = ["-D", str(data), "-l", str(folder / "server.log"), "-w", "-t", str(START_TIMEOUT_S)]
    subprocess.run(
        [str(bin_ / "pg_ctl"), *pg_ctl, "-o", settings, "start"],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=folder,
        **as_user,
    )
    return f"postgresql://postgres@/postgres?host={folder}"


def stop(bin_: Path, folder: Path) -> None:
    """Stop the server at once (its data is thrown away) and delete its folder."""
    subprocess.run(
        [str(bin_ / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate", "-w", "stop"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=folder,
        **server_user(),
    )
    shutil.rmtree(folder, ignore_errors=True)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    durable = bool(argv) and argv[0] == "--durable"
    argv = argv[1:] if durable else argv
    if not argv:
        print("usage: with_postgres.py [--durable] CMD [ARG …]", file=sys.stderr)
        return 2
    if os.environ.get(ENV):
        return subprocess.call(argv)
    bin_ = bindir()
    if bin_ is None:
        why = "PostgreSQL's initdb and pg_ctl are not installed (not on PATH, no pg_config)"
        if os.environ.get("CI", "").lower() == "true":
            print(f"CI=true and no PostgreSQL test server can start: {why}", file=sys.stderr)
            return 1
        print(f"PostgreSQL tests skipped: {why} (or set {ENV} to a server's URL)")
        return subprocess.call(argv)
    signal.signal(signal.SIGTERM, _terminated)
    folder = Path(tempfile.mkdtemp(prefix="turnkeeper-pg-"))
    try:
        try:
            url = start(bin_, folder, durable=durable)
        except subprocess.CalledProcessError as exc:
            log = folder / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            print(f"the PostgreSQL test server did not start: {exc}\n{tail}", file=sys.stderr)
            return 1
        return subprocess.call(argv, env={**os.environ, ENV: url})
    finally:
        stop(bin_, folder)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
