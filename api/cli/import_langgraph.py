"""``turnkeeper import`` of a LangGraph SQLite checkpoint database (``turnkeeper.langgraph``)."""

from __future__ import annotations

import sys
from typing import Any

import click

from turnkeeper.spec.errors import InvalidInputError

SQLITE_MAGIC = b"SQLite format 3\x00"


def is_sqlite(path: str) -> bool:
    """Whether the file at ``path`` is an SQLite database (its first 16 bytes)."""
    with open(path, "rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def import_langgraph(store: Any, path: str, *, quiet: bool) -> dict[str, Any]:
    """Import the LangGraph SQLite checkpoint database at ``path`` (each thread a
    session, ``turnkeeper.langgraph.import_sqlite``); prints one line unless
    ``quiet`` (and, on a terminal, a progress bar of the threads on stderr) and
    returns the JSON summary.

    Raises:
        InvalidInputError: the ``langgraph`` extra is not installed (field ``path``).
        SessionFileError: not a LangGraph checkpoint database.
    """
    try:
        from turnkeeper.langgraph import import_sqlite
    except ImportError as exc:
        raise InvalidInputError(
            "path", "a LangGraph database needs: pip install 'turnkeeper[langgraph]'"
        ) from exc
    show = not quiet and sys.stderr.isatty()
    with click.progressbar(
        length=0, label=f"{path}: threads", file=sys.stderr, hidden=not show
    ) as bar:

        def progress(done: int, total: int) -> None:
            bar.length = total
            bar.update(done - bar.pos)

        r = import_sqlite(store, path, progress=progress)
    info = {
        "path": path,
        "format": "langgraph-sqlite",
        "threads": r.threads,
        "created": r.created,
        "checkpoints_added": r.checkpoints_added,
        "writes_added": r.writes_added,
        "skipped": r.skipped,
        "conflicts": r.conflicts,
        "unknown_tables": r.unknown_tables,
    }
    for where in r.conflicts:
        click.echo(f"{path}: conflict: checkpoint {where} is stored with other content", err=True)
    for table in r.unknown_tables:
        click.echo(f"{path}: unknown table {table!r} not imported", err=True)
    if not quiet:
        click.echo(
            f"{path}: langgraph sqlite: {len(r.threads)} threads ({len(r.created)} new): "
            f"added {r.checkpoints_added} checkpoints, {r.writes_added} writes, "
            f"skipped {r.skipped}"
        )
    return info
