"""Run a command (the test suite, a benchmark) beside a throwaway PostgreSQL server.

``python model_tests/with_postgres.py [--durable] [--through-pgbouncer] CMD …``
runs ``CMD`` with ``TURNKEEPER_TEST_PG`` naming a PostgreSQL server it may
create schemas in, and stops the server and deletes its folder when ``CMD``
ends (on failure, Ctrl-C or SIGTERM too); the exit status is ``CMD``'s.

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

PgBouncer (Debian's ``pgbouncer``, found on PATH or in ``/usr/sbin``), when
installed, runs in front of the server in transaction mode, on a Unix socket
in the same folder (port 6432's socket name, no TCP), as the same user:
``TURNKEEPER_TEST_PGBOUNCER`` names it (the pooler tests use it; without it
they skip, and fail under ``CI=true``) and ``TURNKEEPER_TEST_PG_DIRECT``
names the server itself. It authenticates every role of the server (trust,
through ``auth_query``) and ignores the ``options`` startup parameter, as
deployments that pass URLs with ``options`` through it are configured (the
role's default ``search_path`` then decides the schema).

``--through-pgbouncer`` points ``TURNKEEPER_TEST_PG`` at PgBouncer instead:
the PostgreSQL part of the suite then runs through the pooler (each test
schema gets a role of its own whose default ``search_path`` is that schema,
and the tests that need a session, ``LISTEN`` or raw locks across
connections, are given the direct URL; ``conftest.py`` does both).

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
import time
from pathlib import Path
from typing import Any

ENV = "TURNKEEPER_TEST_PG"
DIRECT_ENV = "TURNKEEPER_TEST_PG_DIRECT"
POOLER_ENV = "TURNKEEPER_TEST_PGBOUNCER"
POOLER_PORT = 6432
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


def pgbouncer_binary() -> str | None:
    """PgBouncer's program (Debian installs it in /usr/sbin, often not on PATH)."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


def pgbouncer_config(folder: Path, server: Path, port: int, ignore: str) -> str:
    """pgbouncer.ini for a transaction-mode pooler on ``folder``'s socket ``port``,
    in front of the server whose socket is in ``server``; ``ignore`` is its
    ``ignore_startup_parameters``."""
    return f"""[databases]
* = host={server} port=5432

[pgbouncer]
listen_addr =
listen_port = {port}
unix_socket_dir = {folder}
pool_mode = transaction
auth_type = trust
auth_file = {folder}/pgbouncer-{port}.users
auth_user = postgres
auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename = $1
ignore_startup_parameters = {ignore}
max_client_conn = 800
default_pool_size = 20
max_db_connections = 160
server_idle_timeout = 5
server_login_retry = 0.1
logfile = {folder}/pgbouncer-{port}.log
pidfile = {folder}/pgbouncer-{port}.pid
"""


def start_pgbouncer(
    folder: Path, server: Path, *, port: int = POOLER_PORT, ignore: str = "options"
) -> str:
    """Start PgBouncer in transaction mode on a Unix socket in ``folder`` in front
    of the server whose socket is in ``server``; its URL (user ``postgres``).

    Raises:
        RuntimeError: it is not installed, or did not come up.
    """
    program = pgbouncer_binary()
    if program is None:
        raise RuntimeError("PgBouncer is not installed (apt-get install pgbouncer)")
    ini = folder / f"pgbouncer-{port}.ini"
    ini.write_text(pgbouncer_config(folder, server, port, ignore))
    (folder / f"pgbouncer-{port}.users").write_text('"postgres" ""\n')
    give_to_server(folder)
    out = subprocess.run(
        [program, "-d", str(ini)], capture_output=True, text=True, cwd=folder, **server_user()
    )
    socket = folder / f".s.PGSQL.{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while out.returncode == 0 and not socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if out.returncode != 0 or not socket.exists():
        log = folder / f"pgbouncer-{port}.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(f"PgBouncer did not start: {out.stderr.strip()}\n{tail}")
    return f"postgresql://postgres@/postgres?host={folder}&port={port}"


def stop_pgbouncer(folder: Path, port: int = POOLER_PORT) -> None:
    """Stop the PgBouncer of ``folder``'s socket ``port`` (at once) and wait until it is gone."""
    pidfile = folder / f"pgbouncer-{port}.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def server_user() -> dict[str, Any]:
    """subprocess arguments that run the server as ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


def give_to_server(folder: Path) -> None:
    """Make ``folder`` the server user's (``postgres`` when we are root)."""
    if server_user():
        entry = pwd.getpwnam("postgres")
        os.chown(folder, entry.pw_uid, entry.pw_gid)


def launch(bin_: Path, folder: Path, options: list[str]) -> None:
    """``pg_ctl start`` the cluster in ``folder``/data with the ``-c`` settings
    ``options`` (a later one overrides an earlier one), logging to
    ``folder``/server.log; returns once it accepts connections."""
    settings = " ".join(f"-c {o}" for o in options)
    pg_ctl = ["-D", str(folder / "data"), "-l", str(folder / "server.log")]
    subprocess.run(
        [str(bin_ / "pg_ctl"), *pg_ctl, "-w", "-t", str(START_TIMEOUT_S), "-o", settings, "start"],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=folder,
        **server_user(),
    )


def create(bin_: Path, folder: Path) -> None:
    """initdb a cluster in ``folder``/data (superuser ``postgres``, trust), ``folder``
    given to the server user first."""
    give_to_server(folder)
    initdb = ["-D", str(folder / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
    subprocess.run(
        [str(bin_ / "initdb"), *initdb, "--locale=C", "--no-sync"],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=folder,
        **server_user(),
    )


def settings_for(folder: Path, *, durable: bool) -> list[str]:
    """The ``-c`` settings of a test server whose socket is in ``folder``."""
    return [*COMMON, *([] if durable else FAST), f"unix_socket_directories='{folder}'"]


def start(bin_: Path, folder: Path, *, durable: bool) -> str:
    """initdb + pg_ctl start in ``folder``; the server's URL (its socket in ``folder``)."""
    create(bin_, folder)
    launch(bin_, folder, settings_for(folder, durable=durable))
    return f"postgresql://postgres@/postgres?host={folder}"


def halt(bin_: Path, folder: Path) -> None:
    """Stop the server of ``folder``/data at once (``-m immediate``: no checkpoint,
    its clients cut off, as a crash would) and wait until it is gone; its data stays."""
    subprocess.run(
        [str(bin_ / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate", "-w", "stop"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=folder,
        **server_user(),
    )


def stop(bin_: Path, folder: Path) -> None:
    """Stop the server at once (its data is thrown away) and delete its folder."""
    halt(bin_, folder)
    shutil.rmtree(folder, ignore_errors=True)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    flags = set()
    while argv and argv[0] in ("--durable", "--through-pgbouncer"):
        flags.add(argv.pop(0))
    durable, through = "--durable" in flags, "--through-pgbouncer" in flags
    if not argv:
        print(
            "usage: with_postgres.py [--durable] [--through-pgbouncer] CMD [ARG …]", file=sys.stderr
        )
        return 2
    if os.environ.get(ENV):
        if through and not os.environ.get(POOLER_ENV):
            print(f"--through-pgbouncer with {ENV} set needs {POOLER_ENV} too", file=sys.stderr)
            return 2
        env = dict(os.environ)
        env.setdefault(DIRECT_ENV, env[ENV])
        if through:
            env[ENV] = env[POOLER_ENV]
        return subprocess.call(argv, env=env)
    bin_ = bindir()
    if bin_ is None:
        why = "PostgreSQL's initdb and pg_ctl are not installed (not on PATH, no pg_config)"
        if os.environ.get("CI", "").lower() == "true":
            print(f"CI=true and no PostgreSQL test server can start: {why}", file=sys.stderr)
            return 1
        print(f"PostgreSQL tests skipped: {why} (or set {ENV} to a server's URL)")
        return subprocess.call(argv)
    if through and pgbouncer_binary() is None:
        print("--through-pgbouncer: PgBouncer is not installed (apt-get install pgbouncer)")
        return 1
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
        env = {**os.environ, ENV: url, DIRECT_ENV: url}
        if pgbouncer_binary() is None:
            print("PgBouncer tests skipped: PgBouncer is not installed (apt-get install pgbouncer)")
        else:
            try:
                env[POOLER_ENV] = start_pgbouncer(folder, folder)
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                return 1
            if through:
                env[ENV] = env[POOLER_ENV]
        return subprocess.call(argv, env=env)
    finally:
        stop_pgbouncer(folder)
        stop(bin_, folder)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
