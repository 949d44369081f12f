"""pi session files (JSONL, format versions 1–3): import into a store, export from it.

A pi session file (``corpus/FORMATS.md`` §1) is one JSON record per line:
line 1 the header ``{"type":"session","version":3,"id",...}`` (``version``
missing means 1), then the tree entries ``{"type","id","parentId",
"timestamp",...}``. On load pi migrates old files to version 3 and takes the
**last entry in the file as the leaf**; this module does the same:

- version 1 entries have no ``id``/``parentId``: each gets a deterministic id
  derived from the session id and its record index (header = 0, see
  :func:`v1_entry_id`) and the previous entry as parent, so re-importing a
  grown version 1 file gives the old records the same ids. A compaction's
  ``firstKeptEntryIndex`` becomes ``firstKeptEntryId`` (the index is kept
  too);
- version < 3 message role ``hookMessage`` becomes ``custom``.

Unlike pi, which drops every line ``JSON.parse`` refuses, lines holding
several glued records are split back into them (a ``repaired`` issue), and
unparseable text, or a record the store would refuse, is kept as an
:class:`~turnkeeper.spec.records.OpaqueRecord` outside the tree (an
``opaque`` issue). Unknown entry types and fields are kept verbatim.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from turnkeeper.spec.entries import BASE_FIELDS, EntryKind
from turnkeeper.spec.errors import InvalidInputError, SessionFileError, SessionNotFoundError
from turnkeeper.spec.records import ImportBatch, ImportedSource, ImportEntry, ImportResult
from turnkeeper.storage.protocol import Store

from ._rows import (
    FileImport,
    ParsedFile,
    Pieces,
    Row,
    Rows,
    file_digest,
    first_record,
    opaque_records,
    sorted_issues,
    stream_lines,
)
from ._rows import LineIssue as LineIssue  # re-exported: it was defined here
from .pi_parse import Piece, format_timestamp, parse_timestamp, split_lines

FORMAT = "pi"
"""The ``format`` of a :class:`FileImport` of a pi file."""

CURRENT_VERSION = 3
"""The pi session format version this module writes (pi ``CURRENT_SESSION_VERSION``)."""

SUPPORTED_VERSIONS = (1, 2, 3)
"""Header versions this module reads. Version 4 is the oh-my-pi fork, not upstream pi."""

_HEADER_FIRST = ("type", "version", "id", "timestamp", "cwd")


def v1_entry_id(session_id: str, record_index: int) -> str:
    """The id given to the version 1 record at ``record_index`` (header = 0):
    the first 16 hex digits of ``sha256(f"{session_id}:{record_index}")``."""
    return hashlib.sha256(f"{session_id}:{record_index}".encode()).hexdigest()[:16]


def _header(first: Piece, path: str) -> tuple[dict[str, Any], int]:
    """The header record and its version; raises ``SessionFileError`` when unusable."""
    value = first.value if first.ok else None
    if not isinstance(value, dict) or value.get("type") != "session":
        raise SessionFileError(
            path, first.line, detail="the first record is not a pi session header"
        )
    sid = value.get("id")
    if not isinstance(sid, str) or not sid:
        raise SessionFileError(path, first.line, detail="the session header has no id")
    version = value.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise SessionFileError(path, first.line, detail=f"bad header version {version!r}")
    if version not in SUPPORTED_VERSIONS:
        raise SessionFileError(path, first.line, detail=f"unsupported pi version {version}")
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise SessionFileError(path, first.line, detail=f"header not storable: {exc}") from None
    return value, version


def _rename_hook_role(payload: dict[str, Any]) -> dict[str, Any]:
    """v2 → v3: message role ``hookMessage`` becomes ``custom`` (key order kept)."""
    message = payload.get("message")
    if isinstance(message, dict) and message.get("role") == "hookMessage":
        payload["message"] = {k: ("custom" if k == "role" else v) for k, v in message.items()}
    return payload


def _first_kept(payload: dict[str, Any], ids_by_index: Mapping[int, str]) -> dict[str, Any]:
    """v1 compaction: add ``firstKeptEntryId`` for ``firstKeptEntryIndex``, in its place.

    ``None`` when the index is the header, an opaque record, out of range or
    not an integer (pi then keeps nothing before the compaction).
    """
    if "firstKeptEntryIndex" not in payload or "firstKeptEntryId" in payload:
        return payload
    index = payload["firstKeptEntryIndex"]
    target = None
    if isinstance(index, int) and not isinstance(index, bool):
        target = ids_by_index.get(index)
    out: dict[str, Any] = {}
    for key, value in payload.items():
        if key == "firstKeptEntryIndex":
            out["firstKeptEntryId"] = target
        out[key] = value
    return out


@dataclass(slots=True)
class _Reader:
    """State of one parse: the rows so far (:class:`~._rows.Rows`) and the ids by record index."""

    path: str
    session_id: str
    version: int
    rows: Rows = field(init=False)
    ids_by_index: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rows = Rows(self.path)

    def add(self, piece: Piece, index: int) -> None:
        """Make the record at ``index`` a tree entry, or reject it as opaque."""
        eid = self.rows.add(piece, self._convert(piece, index))
        if eid is not None:
            self.ids_by_index[index] = eid

    def _convert(self, piece: Piece, index: int) -> Row | str:
        """The entry row for a record, or why it cannot be one."""
        record = piece.value
        if not piece.ok:
            return piece.reason
        if not isinstance(record, dict):
            return f"not a JSON object but {type(record).__name__}"
        kind = record.get("type")
        if not isinstance(kind, str) or not kind:
            return "record without a string 'type'"
        if self.version == 1:
            eid: Any = v1_entry_id(self.session_id, index)
            entries = self.rows.entries
            parent: Any = entries[-1][0] if entries else None
        else:
            eid, parent = record.get("id"), record.get("parentId")
            if not isinstance(eid, str) or not eid:
                return f"{kind} entry without a string 'id'"
            if parent is not None and not isinstance(parent, str):
                return f"{kind} entry {eid}: parentId is not a string or null"
        payload = {k: v for k, v in record.items() if k not in BASE_FIELDS}
        if self.version < 3 and kind == EntryKind.MESSAGE:
            payload = _rename_hook_role(payload)
        if self.version == 1 and kind == EntryKind.COMPACTION:
            payload = _first_kept(payload, self.ids_by_index)
        ts = parse_timestamp(record.get("timestamp"))
        return self.rows.entry(piece.line, eid, parent, kind, ts, payload)


def parse_text(text: str, path: str = "<text>") -> ParsedFile:
    """Parse the text of a pi session file (versions 1–3) into an import batch.

    ``path`` names the file in issues and opaque records. The batch's
    ``session_id`` is the header ``id``, ``cwd`` the header ``cwd`` (or
    ``""``), ``created_at`` the header ``timestamp`` (when unusable: the
    first usable entry timestamp), ``header`` every header field but
    ``type``, verbatim. Entries are in file order, each with the payload
    ``{every field but type/id/parentId/timestamp}`` in the original key
    order and its ``timestamp`` as an aware UTC datetime (missing or
    unparseable: ``created_at``); the leaf is the last entry, as in pi
    ``_buildIndex``. Blank lines are ignored.

    Record indexes (version 1 ids, ``firstKeptEntryIndex``) count records as
    pi wrote them: the header is 0, each record of a glued line counts, and
    each unparseable run of text counts as one record.

    Raises:
        SessionFileError: the first record is not a ``session`` header with a
            string id and a supported version (1–3), or nothing in the file
            has a usable timestamp; ``line`` says where. Nothing is returned.
    """
    return _parse(split_lines(text), path)


def _parse(lines: Iterable[tuple[int, str, list[Piece]]], path: str) -> ParsedFile:
    """:func:`parse_text` of a file's lines (``(number, text, pieces)``, as
    :func:`~.pi_parse.split_lines` gives them), consumed one at a time: each
    record is made an entry (or kept as opaque) and let go before the next
    line is read, so only the entries are held, never the file's text."""
    split: dict[int, tuple[str, list[Piece]]] = {}
    reader: _Reader | None = None
    header: dict[str, Any] = {}
    version, index, first_line = 1, 0, 1
    for number, raw, found in lines:
        if len(found) > 1:
            split[number] = (raw, found)
        for piece in found:
            if reader is None:
                header, version = _header(piece, path)
                reader = _Reader(path, header["id"], version)
                first_line = piece.line
            else:
                reader.add(piece, index)
            index += 1
    if reader is None:
        raise SessionFileError(path, 1, detail="the file has no records")
    lines_split = Pieces([], split)
    issues = lines_split.repaired(path)
    created = parse_timestamp(header.get("timestamp"))
    if created is None:
        created = next((e[3] for e in reader.rows.entries if e[3] is not None), None)
    if created is None:
        raise SessionFileError(path, first_line, detail="no usable timestamp in the file")
    entries = [ImportEntry(i, p, k, t or created, pl) for i, p, k, t, pl in reader.rows.entries]
    reader.rows.entries.clear()
    cwd = header.get("cwd")
    batch = ImportBatch(
        session_id=reader.session_id,
        cwd=cwd if isinstance(cwd, str) else "",
        created_at=created,
        header={k: v for k, v in header.items() if k != "type"},
        entries=entries,
        leaf_id=entries[-1].id if entries else None,
        opaque=opaque_records(path, reader.rows.rejected, lines_split.raw_lines()),
        source=path,
    )
    issues.extend(reader.rows.issues)
    return ParsedFile(batch, version, sorted_issues(issues))


def parse_file(path: str | os.PathLike[str]) -> ParsedFile:
    """Read and parse the pi session file at ``path`` (UTF-8); see :func:`parse_text`.

    The file is read a line at a time (:func:`~._rows.stream_lines`), never
    held whole; then its bytes once more through their digest
    (:func:`~._rows.file_digest`, ``ImportBatch.read``), so a file changed
    while it was parsed is never recorded as read (its next import parses
    it again). Bytes that are not UTF-8 make their line unparseable (kept
    as opaque, with U+FFFD in place of the bad bytes) instead of failing the
    file; a gzipped file is read decompressed.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: as :func:`parse_text`, or a corrupt gzip file.
    """
    before = file_digest(path)
    parsed = _parse(stream_lines(path), os.fspath(path))
    size, digest = file_digest(path)
    if (size, digest) != before:
        return parsed  # changed while read: imported, never recorded as read
    read = ImportedSource(os.path.realpath(path), size, digest, len(parsed.batch.entries))
    return replace(parsed, batch=replace(parsed.batch, read=read))


def unchanged(store: Store, path: str | os.PathLike[str]) -> FileImport | None:
    """The :class:`FileImport` of a file its last import into ``store`` read as it
    is now (``store.sessions.imported_source``: the same size and sha256 at
    the same resolved path, into the session its header names), or ``None``
    (never imported, or changed since: grown, cut or edited anywhere). Reads
    the header line and, when a record exists, the file's bytes once through
    a digest (no parse, memory independent of the file's size).

    Raises:
        OSError: the file cannot be read.
    """
    _, first = first_record(path)
    value = first.value if first is not None and first.ok else None
    if not isinstance(value, dict) or value.get("type") != "session":
        return None
    sid, version = value.get("id"), value.get("version", 1)
    if not isinstance(sid, str) or not sid or version not in SUPPORTED_VERSIONS:
        return None
    try:
        known = store.sessions.imported_source(sid, os.path.realpath(path))
    except InvalidInputError:
        return None  # the full import reports what is wrong with it
    if known is None or file_digest(path) != (known.bytes, known.sha256):
        return None
    result = ImportResult(sid, False, 0, known.entries, 0, 0)
    return FileImport(os.fspath(path), sid, version, result, (), FORMAT, unchanged=True)


def import_file(store: Store, path: str | os.PathLike[str]) -> FileImport:
    """Parse the pi session file at ``path`` and import it into ``store``.

    The session id is the header's: importing the same file again adds
    nothing, importing it after it grew (a resumed session) adds only the new
    entries and moves the leaf to the file's last entry
    (``Store.sessions.import_batch``). The import records what it read (the
    file's size and sha256, ``ImportBatch.read``), so a re-import of the
    unchanged file is not parsed at all (:func:`unchanged`: its
    ``FileImport.unchanged`` is true); a file changed in any way since
    (grown, cut or edited) is parsed and imported whole, as above.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: the file has no usable header; nothing is written.
        ToolCallPairingError, EntryCycleError, EntryIdReservedError: the
            file's entries would make a tree no write may make
            (``Store.sessions.import_batch``); nothing is written.
        DatabaseError: the store failed; nothing is written.
    """
    same = unchanged(store, path)
    if same is not None:
        return same
    parsed = parse_file(path)
    result = store.sessions.import_batch(parsed.batch)
    return FileImport(
        os.fspath(path), parsed.batch.session_id, parsed.version, result, parsed.issues, FORMAT
    )


def _dumps(value: Mapping[str, Any]) -> str:
    return orjson.dumps(value).decode("utf-8")


def export_lines(store: Store, session_id: str) -> Iterator[str]:
    """The session as pi version 3 JSONL lines (no trailing newlines), header first.

    Header: ``type``, ``version`` (3), ``id``, ``timestamp`` (the session's
    creation time, see :func:`~turnkeeper.formats.pi_parse.format_timestamp`),
    ``cwd``, then every other stored header field (``parentSession``, fields
    pi ignores) in stored order, ``channelType`` and ``channelId`` those of the
    session's binding when it is bound (``store.bindings``). Then every entry in sequence order as
    ``{"type", "id", "parentId", "timestamp", **payload}``. Opaque records
    are not exported.

    pi takes the last entry of a file as the leaf, so a leaf moved elsewhere
    with ``Store.branch`` (not persisted by pi either) is not represented.

    Raises:
        SessionNotFoundError: no session has this id (raised on first iteration).
    """
    session = store.sessions.get(session_id)
    if session is None:
        raise SessionNotFoundError(session_id)
    header: dict[str, Any] = {
        "type": "session",
        "version": CURRENT_VERSION,
        "id": session.id,
        "timestamp": format_timestamp(session.created_at),
        "cwd": session.cwd,
    }
    header.update((k, v) for k, v in session.header.items() if k not in _HEADER_FIRST)
    if session.channel_type is not None:  # its binding (store.bindings), as the seed's Header
        header["channelType"] = session.channel_type
        header["channelId"] = session.channel_id
    yield _dumps(header)
    for e in store.sessions.entries(session_id):
        base = {"type": e.kind, "id": e.id, "parentId": e.parent_id}
        yield _dumps({**base, "timestamp": format_timestamp(e.timestamp), **e.payload})


def export_file(store: Store, session_id: str, path: str | os.PathLike[str]) -> int:
    """Write the session to ``path`` as a pi version 3 file (UTF-8, ``\\n`` after
    every line; see :func:`export_lines`) and return the number of lines.

    The file is written to a new file in the target's folder, flushed to disk
    and renamed over the target, so a failure never leaves a half-written
    session file. When ``path`` is a symbolic link, the file it points at is
    replaced and the link kept (see :func:`_resolve_target`). A new file gets
    mode ``0o666`` less the umask (as ``open(path, "w")`` would); a replaced
    file keeps its permission bits. A target that is not a regular file (a
    device such as ``/dev/stdout``, a FIFO) is written to, never replaced.

    Raises:
        SessionNotFoundError: no session has this id; nothing is written.
        OSError: the file cannot be written (``ELOOP`` for a symlink loop); its
            ``filename`` is ``path`` as given, never the temporary file's.
    """
    target = _resolve_target(path)
    lines = list(export_lines(store, session_id))
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    mode = None if st is None else stat.S_IMODE(st.st_mode)
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    if st is not None and not stat.S_ISREG(st.st_mode):
        # A device, pipe or socket (/dev/stdout, a FIFO): written to, never replaced.
        try:
            with open(target, "wb") as out:
                out.write(data)
        except OSError as exc:
            if exc.errno is None:
                raise
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc
        return len(lines)
    try:
        fd, tmp = _create_beside(target)
        try:
            with os.fdopen(fd, "wb") as out:
                if mode is not None:
                    os.fchmod(out.fileno(), mode)
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as exc:  # name the file the caller asked for, not the temporary one
        if exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc
    return len(lines)


def _resolve_target(path: str | os.PathLike[str]) -> Path:
    """The file that writing ``path`` should replace: ``path`` with every symbolic
    link followed (a dangling link gives the missing file it names).

    Raises:
        OSError: ``ELOOP`` when the links form a loop.
    """
    target = Path(os.path.realpath(path))
    if target.is_symlink():  # realpath stops inside a loop without raising
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fspath(path))
    return target


_CREATE_ATTEMPTS = 100
"""Unique temporary names tried before giving up (a clash is ~impossible)."""


def _create_beside(target: Path) -> tuple[int, str]:
    """Create a new, empty file in ``target``'s folder: ``(descriptor, path)``.

    Created with ``os.open(..., O_CREAT | O_EXCL, 0o666)`` under a random
    name, so the process umask applies as for any new file (no umask read,
    which would race with other threads) and no existing file is reused.

    Raises:
        OSError: the folder does not exist or is not writable.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_CREATE_ATTEMPTS):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), os.fspath(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", os.fspath(target.parent))
