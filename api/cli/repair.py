"""``turnkeeper repair``: keep every transaction before the damage in a DuckDB
store's write-ahead log (``turnkeeper.storage.duck.repair``)."""

from __future__ import annotations

from dataclasses import asdict

import click

import turnkeeper
from turnkeeper.storage.duck.repair import Repair, repair
from turnkeeper.storage.duck.wal import REASONS

from .common import CliError, db_option, dumps


@click.command("repair")
@db_option()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def repair_command(db: str, as_json: bool) -> None:
    """Repair a DuckDB store whose write-ahead log (DB.wal) is damaged.

    Copies the database file and its log aside first
    (DB.before-repair-STAMP, DB.wal.before-repair-STAMP; never deleted),
    cuts the log after the last transaction that ends before the damage,
    replays it and checkpoints. Prints where the damage was, the
    transactions and bytes kept and dropped (the damaged transaction and
    every later one), and each table's rows at the last checkpoint and
    after the repair. Refuses (exit 2, nothing changed) a store whose log is
    intact or only torn at its end by a crash (opening drops that by
    itself), a file another process or store holds open, and a PostgreSQL
    URL.
    """
    if turnkeeper.is_postgres(db):
        raise CliError("repair is for a DuckDB file; PostgreSQL recovers its own log")
    done = repair(db)
    if as_json:
        click.echo(dumps({"repair": asdict(done)}))
        return
    for line in describe(done):
        click.echo(line)


def describe(done: Repair) -> list[str]:
    """``done`` as the lines ``turnkeeper repair`` prints."""
    lines = [
        f"repaired {done.path}: its write-ahead log ({done.wal_size} bytes) was damaged "
        f"at byte {done.damage_at} ({REASONS[done.damage]})",
        f"kept: {done.kept_transactions} transactions, bytes 0-{done.kept_bytes} of the log",
        f"dropped: {done.dropped_bytes} bytes from byte {done.kept_bytes}: the damaged "
        f"transaction and every later one ({done.later_transactions} whole transactions "
        "end after the damage)",
        f"originals kept: {done.copies[0]}, {done.copies[1]}",
        "rows per table (at the last checkpoint -> now):",
    ]
    lines += [f"  {table}: {a} -> {b}" for table, (a, b) in done.rows.items() if a or b]
    return lines
