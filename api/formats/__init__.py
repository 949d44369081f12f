"""Session files of agent tools, imported into a store (and pi's exported).

One importer per format, each ``import_file(store, path) -> FileImport``:
:mod:`.pi` (pi session files, versions 1–3, also exported),
:mod:`.claude_code` (Claude Code transcripts and their sub-agent files) and
:mod:`.codex` (Codex CLI rollouts). :func:`import_file` picks the importer by
the file's first record (:func:`detect`). Every importer is idempotent (a
re-import adds nothing, a grown file only its new rows), keeps what it does
not map verbatim and reports it (:class:`LineIssue`), and keeps unparseable
text as opaque records (``store.sessions.opaque_records``).
"""

import os as _os
from collections.abc import Callable as _Callable

from turnkeeper.spec.errors import SessionFormatUnknownError as _Unknown
from turnkeeper.storage.protocol import Store as _Store

from . import claude_code, codex, pi
from ._rows import FileImport, LineIssue
from ._rows import first_record as _first_record

FORMATS = ("pi", "claude-code", "codex")
"""The formats :func:`detect` tells apart, by the name a :class:`FileImport` carries."""

_IMPORTERS: dict[str, _Callable[[_Store, str | _os.PathLike[str]], FileImport]] = {
    "pi": pi.import_file,
    "claude-code": claude_code.import_file,
    "codex": codex.import_file,
}


def detect(path: str | _os.PathLike[str]) -> str:
    """The format of the session file at ``path`` (plain or gzipped), one of
    :data:`FORMATS`, from its first record: a pi ``session`` header, a Codex
    ``session_meta`` envelope (:func:`.codex.looks_like`) or a Claude Code
    row (:func:`.claude_code.looks_like`). Reads no further than that record
    (:func:`~._rows.first_record`: unparseable lines before it are passed
    over, as the importers keep them as opaque).

    Raises:
        OSError: the file cannot be read.
        SessionFormatUnknownError: the file has no record, or its first is
            none of those (``line`` and ``detail`` say what is there).
        SessionFileError: a gzip file is corrupt.
    """
    line, piece = _first_record(path)
    where = _os.fspath(path)
    if piece is None:
        raise _Unknown(where, 0, detail="the file has no records")
    if not piece.ok:
        raise _Unknown(where, line, detail=f"no JSON record found: {piece.reason}")
    value = piece.value
    if isinstance(value, dict) and value.get("type") == "session":
        return "pi"
    if codex.looks_like(value):
        return "codex"
    if claude_code.looks_like(value):
        return "claude-code"
    found = repr(value.get("type")) if isinstance(value, dict) else type(value).__name__
    raise _Unknown(
        where, line, detail=f"the first record (type {found}) is no pi, Claude Code or Codex row"
    )


def import_file(
    store: _Store,
    path: str | _os.PathLike[str],
    *,
    progress: _Callable[[int, int], None] | None = None,
) -> FileImport:
    """Import the session file at ``path`` with the importer of its format
    (:func:`detect`): :func:`.pi.import_file`, :func:`.claude_code.import_file`
    or :func:`.codex.import_file`; returns its :class:`FileImport`.
    ``progress`` is told ``(bytes read, bytes in all)`` as a pi file is read.

    Raises:
        SessionFormatUnknownError: no importer knows the file; nothing is written.
        OSError, SessionFileError, ToolCallPairingError, EntryCycleError,
        EntryIdReservedError, DatabaseError: as the format's importer.
    """
    found = detect(path)
    if found == "pi":
        return pi.import_file(store, path, progress=progress)
    return _IMPORTERS[found](store, path)


__all__ = ["FORMATS", "FileImport", "LineIssue", "detect", "import_file"]
