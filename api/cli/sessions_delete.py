"""``turnkeeper sessions delete`` and ``turnkeeper sessions retain``: delete a
session, or whole sessions by age or count, from the command line.

``sessions delete ID`` is ``store.sessions.delete`` without a lease: refused
(``BusyError``, exit 2) while a live lease holds the session, and
(``SessionRunActiveError``) while a run of it is not terminal. It asks first
unless ``--yes``. ``sessions retain --max-age AGE --keep-last N`` runs one
``store.sessions.retain`` pass under a lease on ``retention:<name>``
(``--name``, default ``main``), so that two passes never run at once (a second
one is ``BusyError``), and releases it afterwards. Both print what they
removed (``--json``: one JSON object); a pass that lost its lease exits 1.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from typing import Any

import click
from rich.table import Table

from turnkeeper.spec.records import DeletedSession, RetentionReport

from .common import EXIT_FAILED, CliError, cell, db_option, dumps, open_db, stdout_console

RETENTION_TTL_S = 300.0
"""The retention lease's time to live, in seconds; renewed by no one: a pass
that outlives it stops (``lease_lost``) and says so."""

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """An age such as ``90``, ``90s``, ``15m``, ``12h``, ``30d`` or ``2w``, in seconds.

    Raises:
        click.BadParameter: anything else.
    """
    match = _AGE.match(text)
    if match is None:
        raise click.BadParameter(f"{text!r} is not an age (e.g. 3600, 90m, 12h, 30d, 2w)")
    return float(match[1]) * _UNITS[match[2]]


def _deleted_dict(gone: DeletedSession) -> dict[str, Any]:
    return dataclasses.asdict(gone)


def _table(removed: list[DeletedSession]) -> Table:
    table = Table(title=f"{len(removed)} session(s) deleted")
    for column in ("session", "reason", "entries", "runs", "run events", "last updated"):
        table.add_column(column)
    for gone in removed:
        table.add_row(
            cell(gone.session_id),
            gone.reason,
            str(gone.entries),
            str(gone.runs),
            str(gone.run_events),
            gone.last_updated_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    return table


@click.command("delete")
@click.argument("session_id")
@db_option(default=None)
@click.option("--yes", is_flag=True, help="Do not ask first.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def delete_command(
    ctx: click.Context, session_id: str, db: str | None, yes: bool, as_json: bool
) -> None:
    """Delete session SESSION_ID (its whole id) and everything stored of it:
    entries, runs, events, tool records, deliveries. A row of counts stays
    (no content) and the id is never reused. Refused while a lease holds the
    session or a run of it is not terminal."""
    if not yes:
        click.confirm(f"Delete session {session_id!r} and everything stored of it?", abort=True)
    with open_db(db or ctx.obj["db"], existing=True) as store:
        gone = store.sessions.delete(session_id)
    if as_json:
        click.echo(dumps({"deleted": _deleted_dict(gone)}))
        return
    stdout_console().print(_table([gone]))


@click.command("retain")
@db_option(default=None)
@click.option(
    "--max-age",
    "max_age",
    default=None,
    metavar="AGE",
    help="Delete sessions last written longer ago than AGE (seconds, or 90m, 12h, 30d, 2w).",
)
@click.option(
    "--keep-last",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Never delete the N most recently written sessions.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Most sessions to delete in this pass (oldest first).",
)
@click.option(
    "--name",
    default="main",
    show_default=True,
    help="The pass's lease is on retention:NAME: one pass of a name at a time.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def retain_command(
    ctx: click.Context,
    db: str | None,
    max_age: str | None,
    keep_last: int | None,
    limit: int,
    name: str,
    as_json: bool,
) -> None:
    """Delete whole sessions by age (--max-age) or count (--keep-last), in one
    retention pass: each as `sessions delete` deletes it, skipping (and
    listing) any that a lease holds, that has an active run, or that was
    written since the pass chose it. Exits 1 if the pass lost its lease."""
    if max_age is None and keep_last is None:
        raise CliError("give --max-age, --keep-last or both")
    max_age_s = None if max_age is None else parse_age(max_age)
    owner = f"turnkeeper-cli:{socket.gethostname()}:{os.getpid()}"
    with open_db(db or ctx.obj["db"], existing=True) as store:
        lease = store.leases.acquire(f"retention:{name}", owner, RETENTION_TTL_S)
        try:
            report = store.sessions.retain(
                lease, max_age_s=max_age_s, keep_last=keep_last, limit=limit
            )
        finally:
            store.leases.release(lease)
    _print_report(report, as_json)
    if report.lease_lost:
        ctx.exit(EXIT_FAILED)


def _print_report(report: RetentionReport, as_json: bool) -> None:
    if as_json:
        click.echo(
            dumps(
                {
                    "removed": [_deleted_dict(g) for g in report.removed],
                    "skipped": report.skipped,
                    "lease_lost": report.lease_lost,
                }
            )
        )
        return
    console = stdout_console()
    console.print(_table(report.removed))
    for session_id, why in sorted(report.skipped.items()):
        console.print(cell(f"kept {session_id}: {why}"))
    if report.lease_lost:
        console.print("the pass lost its lease and stopped: run it again")
