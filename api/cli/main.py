"""The ``turnkeeper`` command line: ``demo``, ``report``, ``sessions``, ``audit``,
``import``, ``export``, ``repair``, ``ledger``, ``keys``, ``encrypt`` and ``fuzz`` (each
in its own module; this one holds the group).

Every command takes ``--db PATH`` (default ``turnkeeper.duckdb`` in the
current directory; ``demo`` defaults to ``turnkeeper-demo.duckdb``). A
turnkeeper error (for example ``StoreLockedError`` when another process
holds the database, ``SessionNotFoundError`` for an unknown id), an OS error
(a path that cannot be read or written) or bad usage (a bad option value, a
missing argument, an unknown command) prints one line on stderr and exits 2,
without a traceback; failed audits and failed import files exit 1; an
interrupt (Ctrl-C) prints one line and exits 130. Only ``turnkeeper`` with
no arguments prints its whole help (on stderr, exit 2).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from typing import Any

import click

from turnkeeper.spec.errors import SessionNotFoundError, TurnkeeperError
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.crypto.keys import KEY_ENV, LocalKeyProvider

from .common import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PIPE_CLOSED,
    KEY_FILE_META,
    CliError,
    db_option,
    dumps,
    one_line,
    open_db,
)
from .demo import demo_command
from .encrypt import encrypt_command, keys_rotate_command
from .fuzz import fuzz_command
from .ledger import ledger_group
from .repair import repair_command
from .report import report_command
from .sessions_view import sessions_group
from .transfer import export_command, import_command


def _usage_line(exc: click.UsageError) -> str:
    """A usage error as one line: click's message and where to read more."""
    where = exc.ctx.command_path if exc.ctx is not None else "turnkeeper"
    return f"turnkeeper: error: {one_line(exc.format_message())} (see '{where} --help')"


class TurnkeeperGroup(click.Group):
    """A click group that turns turnkeeper errors, command errors, usage errors and
    OS errors into one stderr line and exit status 2, and an interrupt into one
    line and 130."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        """Parse the group's own options; a usage error there is one line, exit 2."""
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # no arguments at all: the whole help is the answer
        except click.UsageError as exc:
            click.echo(_usage_line(exc), err=True)
            raise click.exceptions.Exit(EXIT_ERROR) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:  # a subcommand's options, arguments or name
            click.echo(_usage_line(exc), err=True)
        except TurnkeeperError as exc:
            click.echo(f"turnkeeper: {type(exc).__name__}: {one_line(str(exc))}", err=True)
        except CliError as exc:
            click.echo(f"turnkeeper: error: {one_line(str(exc))}", err=True)
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # stdout closed early (`| head`)
                ctx.exit(_pipe_closed())
            click.echo(f"turnkeeper: error: {type(exc).__name__}: {one_line(str(exc))}", err=True)
        except KeyboardInterrupt:
            click.echo("turnkeeper: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        ctx.exit(EXIT_ERROR)


@click.group(cls=TurnkeeperGroup)
@click.version_option(package_name="turnkeeper", prog_name="turnkeeper")
@click.option(
    "--key-file",
    "key_file",
    type=click.Path(dir_okay=False),
    default=None,
    help=f"Master key file of an encrypted store (default: ${KEY_ENV} when set).",
)
@click.pass_context
def cli(ctx: click.Context, key_file: str | None) -> None:
    """turnkeeper: durable state for AI-agent runtimes (a DuckDB file or PostgreSQL)."""
    ctx.meta[KEY_FILE_META] = key_file


@cli.group("keys")
def keys_group() -> None:
    """Master keys of encrypted stores (open_store(..., encryption=...))."""


@keys_group.command("generate")
@click.option("--id", "key_id", default=None, help="The key's id (default: key-<date>-<hex>).")
def keys_generate(key_id: str | None) -> None:
    """Print a new master key line, '<key id>:<base64 of 32 bytes>': put it in
    a key file (--key-file, readable by its owner only) or in $TURNKEEPER_MASTER_KEY."""
    click.echo(LocalKeyProvider.generate(key_id))


@cli.command("audit")
@db_option()
@click.option(
    "--session",
    "sessions",
    multiple=True,
    help="Audit only this session (repeatable); default: the whole database.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def audit_command(ctx: click.Context, db: str, sessions: tuple[str, ...], as_json: bool) -> None:
    """Check a stored database's invariants: lease epochs 1,2,3… per target, no
    entry written under a lost lease, one active thread record per key, well
    formed session trees, grants stamped after the epoch they replaced. Prints
    one line per check (or one JSON object); exits 1 if any check fails, and 2
    (SessionNotFoundError) if a --session id names no session.
    """
    with open_db(db, read_only=True) as store:
        for session_id in sessions:  # an unknown id is refused, not audited as empty
            if store.sessions.get(session_id) is None:
                raise SessionNotFoundError(session_id)
        checks = run_audit(store, list(sessions) or None)
    if as_json:
        click.echo(
            dumps(
                {
                    "audit": [c.as_dict() for c in checks],
                    "audit_passed": all(c.passed for c in checks),
                }
            )
        )
    else:
        for c in checks:
            verdict = "PASS" if c.passed else "FAIL"
            detail = f": {c.detail}" if c.detail else ""
            click.echo(
                f"{verdict} {c.name}: {c.violations} violations / {c.checked} checked{detail}"
            )
    if not all(c.passed for c in checks):
        ctx.exit(EXIT_FAILED)


cli.add_command(demo_command)
cli.add_command(report_command)
cli.add_command(sessions_group)
cli.add_command(import_command)
cli.add_command(export_command)
cli.add_command(repair_command)
cli.add_command(ledger_group)
cli.add_command(encrypt_command)
cli.add_command(fuzz_command)
keys_group.add_command(keys_rotate_command)


def main() -> None:
    """Console-script entry point (``turnkeeper``). The PostgreSQL pool's own
    connection-retry log lines are silenced: a failure is the one line the
    command prints."""
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    try:
        cli(prog_name="turnkeeper")
    except SystemExit:
        try:  # what is still buffered meets a closed pipe here, not at shutdown
            sys.stdout.flush()
        except BrokenPipeError:
            raise SystemExit(_pipe_closed()) from None
        raise


def _pipe_closed() -> int:
    """Point stdout at ``/dev/null`` (so nothing more fails writing to it, nor
    the interpreter's last flush) and return :data:`EXIT_PIPE_CLOSED`."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE_CLOSED


if __name__ == "__main__":
    main()
