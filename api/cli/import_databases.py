"""``turnkeeper import`` of SQLite databases of agent frameworks: a LangGraph
checkpoint database (``turnkeeper.langgraph``) and an OpenAI Agents SDK
session database (``turnkeeper.openai_agents``), told apart by their tables."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from turnkeeper.spec.errors import InvalidInputError, SessionFormatUnknownError

SQLITE_MAGIC = b"SQLite format 3\x00"

DATABASES = {
    "langgraph-sqlite": {"checkpoints", "writes"},
    "openai-agents-sqlite": {"agent_sessions", "agent_messages"},
}
"""Each database kind ``turnkeeper import`` takes, by the tables that make it one."""


def is_sqlite(path: str) -> bool:
    """Whether the file at ``path`` is an SQLite database (its first 16 bytes)."""
    with open(path, "rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def database_kind(path: str) -> str:
    """Which of :data:`DATABASES` the SQLite database at ``path`` is, by its tables.

    Raises:
        SessionFormatUnknownError: it has neither kind's tables, or cannot be read
            as a database (``detail`` says which).
    """
    uri = f"{Path(path).resolve().as_uri()}?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True)) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error as exc:
        raise SessionFormatUnknownError(path, 0, detail=f"not a readable database: {exc}") from exc
    for kind, needed in DATABASES.items():
        if needed <= tables:
            return kind
    raise SessionFormatUnknownError(
        path,
        0,
        detail="an SQLite database with neither LangGraph's checkpoint tables nor the "
        f"OpenAI Agents SDK's session tables (it has {sorted(tables)})",
    )


def import_database(
    store: Any,
    path: str,
    *,
    echo: Callable[[str, bool], None],
    quiet: bool,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Import the SQLite database at ``path`` by its kind (:func:`database_kind`):
    :func:`import_langgraph` or :func:`import_openai_agents`; ``progress(what)``
    names the thread or session reached. Returns the JSON summary.

    Raises:
        SessionFormatUnknownError: neither kind.
        InvalidInputError: the kind's extra is not installed (field ``path``).
        SessionFileError: the database does not hold what its kind's tables should.
    """
    if database_kind(path) == "langgraph-sqlite":
        step = None if progress is None else (lambda d, t: progress(f"thread {d} of {t}"))
        return import_langgraph(store, path, echo=echo, quiet=quiet, progress=step)
    return import_openai_agents(
        store,
        path,
        echo=echo,
        quiet=quiet,
        progress=None if progress is None else (lambda sid, n: progress(f"session {sid}")),
    )


def import_openai_agents(
    store: Any,
    path: str,
    *,
    echo: Callable[[str, bool], None],
    quiet: bool,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Import the OpenAI Agents SDK ``SQLiteSession`` database at ``path`` (each SDK
    session a turnkeeper session, ``turnkeeper.openai_agents.import_sqlite``):
    ``echo(line, to_stderr)`` prints the rows kept verbatim (not JSON) and the
    summary line unless ``quiet``. Returns the JSON summary.

    Raises:
        InvalidInputError: the ``openai-agents`` extra is not installed (field ``path``).
        SessionFileError: not such a database.
    """
    try:
        from turnkeeper.openai_agents import import_sqlite
    except ImportError as exc:
        raise InvalidInputError(
            "path", "an OpenAI Agents database needs: pip install 'turnkeeper[openai-agents]'"
        ) from exc
    r = import_sqlite(store, path, progress=progress)
    for sdk_id, rows in r.unparsed.items():
        for row in rows:
            echo(f"{path}: session {sdk_id}: row {row} is not JSON, kept verbatim", True)
    if not quiet:
        echo(
            f"{path}: openai-agents sqlite: {len(r.sessions)} sessions: "
            f"added {sum(r.added.values())} items",
            False,
        )
    return {
        "path": path,
        "format": "openai-agents-sqlite",
        "sessions": r.sessions,
        "added": r.added,
        "unparsed": r.unparsed,
    }


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
