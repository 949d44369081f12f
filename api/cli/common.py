"""Helpers every CLI command shares: opening the store, errors, JSON and consoles.

Error policy: a :class:`~turnkeeper.spec.errors.TurnkeeperError` (for example
``StoreLockedError`` when another process holds the database file), a
:class:`CliError` or an :class:`OSError` (a path that cannot be read or
written) reaching the top-level group, and click's usage errors, are printed
as ONE line on stderr (``turnkeeper: …``) and the process exits with status
2, with no traceback.
Audit failures and per-file import failures exit with 1; an interrupt
(Ctrl-C) prints ``turnkeeper: interrupted`` and exits with 130.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, datetime
from decimal import Decimal
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

import turnkeeper
from turnkeeper import is_postgres
from turnkeeper.spec import errors
from turnkeeper.storage import BaseStore
from turnkeeper.storage.audit.base import one_line as one_line
from turnkeeper.storage.crypto.keys import KEY_ENV

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILED = 1
"""Exit status when the command ran but found failures (audit, an import file)."""

EXIT_ERROR = 2
"""Exit status when turnkeeper refused the operation (store locked, bad input, I/O …)."""

EXIT_INTERRUPTED = 130
"""Exit status after an interrupt (Ctrl-C): 128 + SIGINT, as shells report it."""

EXIT_PIPE_CLOSED = 141
"""Exit status when the reader of stdout stopped reading (``| head``): 128 +
SIGPIPE, as shells report a command that a closed pipe ended, quietly."""


class CliError(Exception):
    """A command-level failure reported as one stderr line with exit status 2."""


def db_option(default: str | None = turnkeeper.DEFAULT_PATH) -> Callable[[F], F]:
    """The shared ``--db`` option: a DuckDB file (default: ``turnkeeper.duckdb`` in
    the cwd) or a PostgreSQL URL; ``$TURNKEEPER_DB`` sets it too."""
    return click.option(
        "--db",
        "db",
        type=str,
        default=default,
        envvar=turnkeeper.DB_ENV,
        show_default=default is not None,
        help=f"DuckDB database file, or a postgresql:// URL (also ${turnkeeper.DB_ENV}).",
    )


KEY_FILE_META = "turnkeeper.key_file"
"""Where the group's ``--key-file`` is kept in the click context's ``meta``."""


def key_provider() -> turnkeeper.KeyProvider | None:
    """The master key a command opens the store with: the group's ``--key-file``,
    else ``$TURNKEEPER_MASTER_KEY`` when set, else none (a store marked
    encrypted then serves metadata only, ``KeyUnavailableError`` otherwise).

    Raises:
        InvalidInputError: (field ``encryption``) the file or variable is not
            a key line (``turnkeeper keys generate`` makes one).
    """
    ctx = click.get_current_context(silent=True)
    path = None if ctx is None else ctx.meta.get(KEY_FILE_META)
    if path:
        return turnkeeper.LocalKeyProvider.from_file(path)
    if os.environ.get(KEY_ENV):
        return turnkeeper.LocalKeyProvider.from_env()
    return None


@contextmanager
def open_db(path: str, *, read_only: bool = False, existing: bool = False) -> Iterator[BaseStore]:
    """Open the store at ``path`` and close it afterwards.

    ``read_only`` opens an existing file for inspection: a missing file is
    refused (never created), no migrations run, any write raises
    ``ReadOnlyError``, and other read-only openers may share the file (a
    writing process still locks everyone out). ``existing`` (a command that
    acts on what is stored, such as a session's ledger) refuses a missing
    file too, and writes. Otherwise a missing file is created.

    Raises:
        StoreNotFoundError: ``read_only`` or ``existing``, and there is no
            file at ``path`` (a mistyped ``--db`` is never created).
        InvalidInputError: ``path`` is a directory, or a new file's folder is missing.
        StoreLockedError: another process holds the file.
        ForeignDatabaseError: the file is not a turnkeeper database.
        SchemaVersionError: the file was written by a newer turnkeeper, or
            (read-only) needs a migration.
        CorruptDatabaseError: the file or its write-ahead log is corrupt.
    """
    in_memory = path == ":memory:"
    if existing and not in_memory and not is_postgres(path) and not os.path.exists(path):
        raise errors.StoreNotFoundError(
            path, detail="this command acts on stored sessions and never creates a database"
        )
    store = turnkeeper.open_store(
        path, read_only=read_only and not in_memory, encryption=key_provider()
    )
    try:
        yield store
    finally:
        store.close()


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def dumps(obj: Any) -> str:
    """``obj`` as one line of JSON (datetimes as ISO 8601, decimals as floats)."""
    return json.dumps(obj, default=_json_default, sort_keys=False)


PIPE_WIDTH = 160
"""Columns rich lays out for when stdout is not a terminal and ``COLUMNS`` is unset."""


class _PipeConsole(Console):
    """A rich console whose closed stdout is the command's ``EPIPE`` (exit
    :data:`EXIT_PIPE_CLOSED`), not rich's own exit 1, which is
    :data:`EXIT_FAILED`'s status."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "stdout closed")


def stdout_console() -> Console:
    """A rich console on stdout (plain text, :data:`PIPE_WIDTH` wide, when not a terminal)."""
    console = _PipeConsole(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


def stderr_console() -> Console:
    """A rich console on stderr, for progress bars and warnings."""
    return Console(stderr=True, highlight=False)


def fmt_num(value: float | int | None, digits: int = 1) -> str:
    """A number for a table cell: ints with thousands separators, floats rounded."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters but tab and newline: C0, DEL and C1."""


def visible(text: str) -> str:
    """``text`` for a terminal: each control character but tab and newline
    spelled as its escape (``\\x00``, ``\\x1b`` …), so that no stored value
    (a NUL, an escape sequence, a carriage return) can hide in a table, move
    the cursor or recolour the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def cell(text: str) -> Text:
    """A table cell that shows ``text`` as it is (:func:`visible`): never read as
    rich markup, so a stored value holding ``[/]`` or ``[red]`` is printed,
    not interpreted (or refused with a ``MarkupError``)."""
    return Text(visible(text))


def progress_bar(label: str) -> Progress:
    """A progress bar on stderr for a long command (``label`` in bold, done of
    total, time elapsed), shown only on a terminal and removed when it ends."""
    console = stderr_console()
    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    )
