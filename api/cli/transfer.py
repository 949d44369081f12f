"""``turnkeeper import`` and ``turnkeeper export``: thin wrappers over
``turnkeeper.formats`` (import: every format it detects; export: pi)."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from turnkeeper import formats
from turnkeeper.formats import FileImport, pi
from turnkeeper.spec.errors import DatabaseError, InterfaceError, TurnkeeperError

from .common import EXIT_FAILED, CliError, db_option, dumps, one_line, open_db, stderr_console
from .import_databases import import_database, is_sqlite

FILE_ERRORS = (TurnkeeperError, OSError, UnicodeDecodeError)
"""Failures that sink one file of an import; the other files still go in: the
file's own faults (its format, its records, its tool-call pairing) and its
session's (a deleted session's id, a lease another owner holds), but not the
store's (:data:`STORE_ERRORS`), which end the command."""

STORE_ERRORS = (DatabaseError, InterfaceError)
"""Failures of the store itself (a lost server, a full disk, a closed store): the
import ends there, exit 2."""


def _file_dict(fi: FileImport) -> dict[str, Any]:
    r = fi.result
    return {
        "path": str(fi.path),
        "format": fi.format,
        "session_id": fi.session_id,
        "version": fi.version,
        "created": r.created,
        "added": r.added,
        "skipped": r.skipped,
        "opaque_added": r.opaque_added,
        "usage_added": r.usage_added,
        "unchanged": fi.unchanged,
        "issues": [str(i) for i in fi.issues],
        "sub_agents": [_file_dict(sub) for sub in fi.sub_agents],
    }


class _Count(ProgressColumn):
    """Files imported of all (``3/10``), or for a file's own task (its field
    ``bytes``) the bytes read of it (``12.3/71.8 MB``)."""

    def __init__(self) -> None:
        super().__init__()
        self._files = MofNCompleteColumn()
        self._bytes = DownloadColumn()

    def render(self, task: Task) -> Text:
        return (self._bytes if task.fields.get("bytes") else self._files).render(task)


def _progress(shown: bool) -> Progress:
    """A progress bar of files imported, and one of the bytes read of the file
    being read, on stderr, shown only when ``shown`` and stderr is a
    terminal (the current file's name beside them)."""
    console = stderr_console()
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]importing"),
        BarColumn(),
        _Count(),
        TextColumn("{task.description}", markup=False),
        TimeElapsedColumn(),
        console=console,
        disable=not (shown and console.is_terminal),
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    )


def _summary(path: str, info: dict[str, Any]) -> str:
    """The line printed for one imported file (or sub-agent file)."""
    extra = f", {info['opaque_added']} opaque" if info["opaque_added"] else ""
    if info["usage_added"]:
        extra += f", {info['usage_added']} usage records"
    new = " (new session)" if info["created"] else ""
    version = info["version"]
    label = f"v{version}" if info["format"] == "pi" else f"{info['format']} {version}".rstrip()
    if info["unchanged"]:
        return (
            f"{path}: session {info['session_id']} {label}: unchanged since its last import, "
            f"skipped {info['skipped']}"
        )
    return (
        f"{path}: session {info['session_id']} {label}: "
        f"added {info['added']}, skipped {info['skipped']}{extra}{new}"
    )


def _echo(bar: Progress, line: str, err: bool) -> None:
    """Print ``line`` (to stderr when ``err``); while the progress bar is shown,
    through its console (above the bar) when the line is for stderr or stdout
    is the same kind of terminal, so a piped stdout stays clean."""
    if bar.live.is_started and (err or sys.stdout.isatty()):
        bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
    else:
        click.echo(line, err=err)


def _report(bar: Progress, fi: FileImport, as_json: bool) -> None:
    """Print ``fi``'s issues (stderr) and, unless ``as_json``, its summary line
    and its sub-agent files' (stdout)."""
    for issue in fi.issues:
        _echo(bar, str(issue), True)
    if not as_json:
        _echo(bar, _summary(fi.path, _file_dict(fi)), False)
    for sub in fi.sub_agents:
        _report(bar, sub, as_json)


def _import_database(store: Any, path: str, bar: Progress, task: Any, as_json: bool) -> Any:
    """A LangGraph or OpenAI Agents SQLite database (``import_database``), its
    lines through the bar's console and its progress in the bar's description."""

    def echo(line: str, err: bool) -> None:
        _echo(bar, line, err)

    def progress(where: str) -> None:
        bar.update(task, description=f"{path} ({where})")

    return import_database(store, path, echo=echo, quiet=as_json, progress=progress)


def _import_file(store: Any, path: str, bar: Progress) -> FileImport:
    """``formats.import_file``, the bytes it reads of the file drawn as a bar of
    their own (redrawn at once, so that each step shows), removed after."""
    task = bar.add_task(path, total=None, bytes=True)

    def progress(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)
        bar.refresh()

    try:
        return formats.import_file(store, path, progress=progress)
    finally:
        bar.remove_task(task)


@click.command("import")
@click.argument(
    "paths",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, readable=True),
)
@db_option()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def import_command(ctx: click.Context, paths: tuple[str, ...], db: str, as_json: bool) -> None:
    """Import session files: pi (JSONL), Claude Code transcripts (JSONL or
    .jsonl.gz, with the sub-agent files beside them) and Codex rollouts, each
    detected by its first record, LangGraph SQLite checkpoint databases (each
    thread a session, served by turnkeeper.langgraph) and OpenAI Agents SDK
    SQLite session databases (each SDK session a session, served by
    turnkeeper.openai_agents), told apart by their tables; re-importing adds
    only new entries.

    Prints one line per file (path, session id, format and version, entries
    added and skipped, usage records of assistant messages added) and every
    repaired, opaque, unknown or unresolved row as an issue line
    ``path:line: kind: detail`` on stderr; progress bars on stderr when it
    is a terminal (none with --json): files imported, and bytes read of a
    pi file as it is read. A path that does not exist, is a
    directory or cannot be read is refused before anything is imported (exit
    2). A file whose content cannot be imported (a format no importer knows
    among them) is reported on stderr and the others continue; exits 1 if
    any file failed.
    """
    imported: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    with open_db(db) as store, _progress(not as_json) as bar:
        task = bar.add_task("", total=len(paths))
        for path in paths:
            bar.update(task, description=path)
            try:
                if is_sqlite(path):  # a LangGraph or OpenAI Agents SQLite database
                    imported.append(_import_database(store, path, bar, task, as_json))
                    bar.advance(task)
                    continue
                fi = _import_file(store, path, bar)
            except STORE_ERRORS:
                raise
            except FILE_ERRORS as exc:
                message = one_line(str(exc))
                failed.append({"path": path, "error": f"{type(exc).__name__}: {message}"})
                _echo(bar, f"{path}: error: {type(exc).__name__}: {message}", True)
                bar.advance(task)
                continue
            imported.append(_file_dict(fi))
            _report(bar, fi, as_json)
            bar.advance(task)
    if as_json:
        click.echo(dumps({"files": imported, "failed": failed}))
    if failed:
        ctx.exit(EXIT_FAILED)


@click.command("export")
@click.argument("session_id")
@db_option()
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write to this file (replaced atomically; a symlink's target is replaced) "
    "instead of stdout.",
)
def export_command(session_id: str, db: str, output: str | None) -> None:
    """Export session SESSION_ID as a pi session file (JSONL: header line, then entries).

    Writes to stdout, or to FILE with -o (written to a new file beside it and
    renamed over it, so a failed export leaves FILE untouched; a symlink's
    target is replaced and the link kept; a new file's mode follows the
    umask, a replaced file keeps its mode). pi takes the last entry as the
    leaf, so a leaf moved with branch() is not kept.
    """
    with open_db(db, read_only=True) as store:
        if output is None or output == "-":
            for line in pi.export_lines(store, session_id):
                click.echo(line)
            return
        try:
            pi.export_file(store, session_id, output)
        except OSError as exc:
            raise CliError(f"cannot write {output}: {exc.strerror or exc}") from exc
