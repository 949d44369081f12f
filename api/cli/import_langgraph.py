"""``turnkeeper import`` of a LangGraph SQLite checkpoint database (``turnkeeper.langgraph``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turnkeeper.spec.errors import InvalidInputError

SQLITE_MAGIC = b"SQLite format 3\x00"


def is_sqlite(path: str) -> bool:
    """Whether the file at ``path`` is an SQLite database (its first 16 bytes)."""
    with open(path, "rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def import_langgraph(
    store: Any,
    path: str,
    *,
    echo: Callable[[str, bool], None],
    quiet: bool,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Import the LangGraph SQLite checkpoint database at ``path`` (each thread a
    session, ``turnkeeper.langgraph.import_sqlite``): ``echo(line, to_stderr)``
    prints its conflicts and unknown tables, and its summary line unless
    ``quiet``; ``progress(threads done, threads)`` after each thread. Returns
    the JSON summary.

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
    r = import_sqlite(store, path, progress=progress)
    for where in r.conflicts:
        echo(f"{path}: conflict: checkpoint {where} is stored with other content", True)
    for table in r.unknown_tables:
        echo(f"{path}: unknown table {table!r} not imported", True)
    if not quiet:
        echo(
            f"{path}: langgraph sqlite: {len(r.threads)} threads ({len(r.created)} new): "
            f"added {r.checkpoints_added} checkpoints, {r.writes_added} writes, "
            f"skipped {r.skipped}",
            False,
        )
    return {
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
