"""``turnkeeper import`` and ``turnkeeper export``: thin wrappers over ``turnkeeper.formats.pi``."""

from __future__ import annotations

from typing import Any

import click

from turnkeeper.formats import pi
from turnkeeper.spec.errors import (
    EntryCycleError,
    EntryIdReservedError,
    InvalidInputError,
    SessionFileError,
    ToolCallPairingError,
)

from .common import EXIT_FAILED, CliError, db_option, dumps, one_line, open_db
from .import_langgraph import import_langgraph, is_sqlite

FILE_ERRORS = (
    SessionFileError,
    InvalidInputError,
    ToolCallPairingError,
    EntryCycleError,
    EntryIdReservedError,
    OSError,
    UnicodeDecodeError,
)
"""Failures that sink one file of an import; the other files still go in."""


def _file_dict(fi: Any) -> dict[str, Any]:
    r = fi.result
    return {
        "path": str(fi.path),
        "session_id": fi.session_id,
        "version": fi.version,
        "created": r.created,
        "added": r.added,
        "skipped": r.skipped,
        "opaque_added": r.opaque_added,
        "usage_added": r.usage_added,
        "issues": [str(i) for i in fi.issues],
    }


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
    """Import pi session files (JSONL) and LangGraph SQLite checkpoint databases
    (each thread a session, served by turnkeeper.langgraph) into the store;
    re-importing adds only new entries.

    Prints one line per file (path, session id, format version, entries
    added and skipped, usage records of assistant messages added) and every
    repaired or opaque line as an issue line
    ``path:line: kind: detail`` on stderr. A path that does not exist, is a
    directory or cannot be read is refused before anything is imported (exit
    2). A file whose content cannot be imported is reported on stderr and the
    others continue; exits 1 if any file failed.
    """
    imported: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    with open_db(db) as store:
        for path in paths:
            try:
                if is_sqlite(path):  # a LangGraph SQLite checkpoint database
                    imported.append(import_langgraph(store, path, quiet=as_json))
                    continue
                fi = pi.import_file(store, path)
            except FILE_ERRORS as exc:
                message = one_line(str(exc))
                failed.append({"path": path, "error": f"{type(exc).__name__}: {message}"})
                click.echo(f"{path}: error: {type(exc).__name__}: {message}", err=True)
                continue
            for issue in fi.issues:
                click.echo(str(issue), err=True)
            info = _file_dict(fi)
            imported.append(info)
            if not as_json:
                extra = f", {info['opaque_added']} opaque" if info["opaque_added"] else ""
                if info["usage_added"]:
                    extra += f", {info['usage_added']} usage records"
                new = " (new session)" if info["created"] else ""
                click.echo(
                    f"{path}: session {info['session_id']} v{info['version']}: "
                    f"added {info['added']}, skipped {info['skipped']}{extra}{new}"
                )
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
