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

import hashlib
import os
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import orjson

from turnkeeper.spec.entries import BASE_FIELDS, EntryKind
from turnkeeper.spec.errors import ImportTailStoredError, InvalidInputError, SessionFileError
from turnkeeper.spec.records import (
    ImportBatch,
    ImportedSource,
    ImportEntry,
    ImportResult,
    ImportStream,
    OpaqueRecord,
)
from turnkeeper.storage.protocol import Store

from ._rows import (
    FileImport,
    ParsedFile,
    Pieces,
    Progress,
    Rows,
    file_digest,
    first_record,
    opaque_records,
    prefix_digest,
    sorted_issues,
    stream_lines,
    unchanged_source,
)
from ._rows import LineIssue as LineIssue  # re-exported: it was defined here
from ._rows import Row as _Row
from .pi_export import CURRENT_VERSION as CURRENT_VERSION  # re-exported: defined here before
from .pi_export import export_file as export_file
from .pi_export import export_lines as export_lines
from .pi_parse import Piece, parse_timestamp, split_lines

FORMAT = "pi"
"""The ``format`` of a :class:`FileImport` of a pi file."""


SUPPORTED_VERSIONS = (1, 2, 3)
"""Header versions this module reads. Version 4 is the oh-my-pi fork, not upstream pi."""


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


def _first_kept(payload: dict[str, Any], ids_by_index: _V1Ids) -> dict[str, Any]:
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
class _V1Ids:
    """The ids of a version 1 file's records read so far, by record index,
    without holding them: record ``i`` is an entry when ``0 < i < count`` and
    it was not rejected, and its id is ``v1_entry_id(session_id, i)``."""

    session_id: str
    count: int = 0
    rejected: set[int] = field(default_factory=set)

    def get(self, index: int) -> str | None:
        """The id of the entry at record ``index``, or ``None``."""
        if 0 < index < self.count and index not in self.rejected:
            return v1_entry_id(self.session_id, index)
        return None


@dataclass(slots=True)
class _Reader:
    """State of one parse: the rows so far (:class:`~._rows.Rows`, taken away
    as they are read) and, for version 1, the ids by record index and the
    last entry's id."""

    path: str
    session_id: str
    version: int
    rows: Rows = field(init=False)
    ids_by_index: _V1Ids = field(init=False)
    last_id: str | None = None

    def __post_init__(self) -> None:
        self.rows = Rows(self.path)
        self.ids_by_index = _V1Ids(self.session_id)

    def add(self, piece: Piece, index: int) -> None:
        """Make the record at ``index`` a tree entry, or reject it as opaque."""
        self.ids_by_index.count = index
        eid = self.rows.add(piece, self._convert(piece, index))
        if eid is None:
            self.ids_by_index.rejected.add(index)
        else:
            self.last_id = eid

    def _convert(self, piece: Piece, index: int) -> _Row | str:
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
            parent: Any = self.last_id
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


@dataclass(slots=True)
class _Scan:
    """What one pass over a file's lines (:func:`_records`) found besides its
    entries: the header, its version and line, the reader (its opaque pieces
    and issues) and the lines split into several records."""

    path: str
    header: dict[str, Any] = field(default_factory=dict)
    version: int = 1
    first_line: int = 1
    reader: _Reader | None = None
    split: dict[int, tuple[str, list[Piece]]] = field(default_factory=dict)

    def created(self) -> datetime | None:
        """The header's timestamp, when usable."""
        return parse_timestamp(self.header.get("timestamp"))

    def cwd(self) -> str:
        """The header's ``cwd`` (``""`` when it is not a string)."""
        cwd = self.header.get("cwd")
        return cwd if isinstance(cwd, str) else ""

    def ends(self) -> tuple[list[OpaqueRecord], tuple[LineIssue, ...]]:
        """The opaque records and the issues (in line order) of the pass, once
        it has read every line."""
        assert self.reader is not None
        lines_split = Pieces([], self.split)
        issues = lines_split.repaired(self.path) + self.reader.rows.issues
        opaque = opaque_records(self.path, self.reader.rows.rejected, lines_split.raw_lines())
        return opaque, sorted_issues(issues)


def _records(
    lines: Iterable[tuple[int, str, list[Piece]]], scan: _Scan, header_only: bool = False
) -> Generator[_Row, None, None]:
    """The entries of a file's lines (``(number, text, pieces)``, as
    :func:`~.pi_parse.split_lines` gives them), each made an entry (or kept
    as opaque, in ``scan``) and given up as it is read: only the current line
    and the file's entry ids (to refuse a duplicate) are held. The header
    goes to ``scan`` (with ``header_only``, nothing more is read); a timestamp
    is ``None`` where the entry's is unusable.

    Raises:
        SessionFileError: the first record is not a usable header, or the file
            has no records.
    """
    index = 0
    for number, raw, found in lines:
        if len(found) > 1:
            scan.split[number] = (raw, found)
        for piece in found:
            if scan.reader is None:
                scan.header, scan.version = _header(piece, scan.path)
                scan.reader = _Reader(scan.path, scan.header["id"], scan.version)
                scan.first_line = piece.line
                if header_only:
                    return
            else:
                scan.reader.add(piece, index)
                taken = scan.reader.rows.entries
                if taken:
                    yield from taken
                    taken.clear()
            index += 1
    if scan.reader is None:
        raise SessionFileError(scan.path, 1, detail="the file has no records")


def _parse(lines: Iterable[tuple[int, str, list[Piece]]], path: str) -> ParsedFile:
    """:func:`parse_text` of a file's lines (``(number, text, pieces)``, as
    :func:`~.pi_parse.split_lines` gives them), consumed one at a time
    (:func:`_records`): only the entries are held, never the file's text."""
    scan = _Scan(path)
    rows = list(_records(lines, scan))
    assert scan.reader is not None
    created = scan.created() or next((r[3] for r in rows if r[3] is not None), None)
    if created is None:
        raise SessionFileError(path, scan.first_line, detail="no usable timestamp in the file")
    entries = [ImportEntry(i, p, k, t or created, pl) for i, p, k, t, pl in rows]
    rows.clear()
    opaque, issues = scan.ends()
    batch = ImportBatch(
        session_id=scan.reader.session_id,
        cwd=scan.cwd(),
        created_at=created,
        header={k: v for k, v in scan.header.items() if k != "type"},
        entries=entries,
        leaf_id=entries[-1].id if entries else None,
        opaque=opaque,
        source=path,
    )
    return ParsedFile(batch, scan.version, issues)


class FileStream(ImportStream):
    """The entries of the pi file at ``path``, read as the store imports them
    (:class:`~turnkeeper.spec.records.ImportStream`): each iteration parses
    the file again from its start (:func:`_records`), holding one line and
    the file's entry ids, never its entries. Made by :func:`open_stream`,
    which reads the header and ``created_at`` first. After a whole
    iteration, :attr:`issues` holds what it found (in line order) and
    :attr:`read` what it read (``None`` if the file changed meanwhile).

    With ``tail`` (what an import read of the file before, and the line after
    it), an iteration reads only the lines appended since: from that byte and
    line, the header already known (:func:`import_file` checks that the
    bytes before are the ones read then)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        scan: _Scan,
        created_at: datetime,
        progress: Progress | None = None,
        tail: tuple[ImportedSource, int] | None = None,
    ) -> None:
        assert scan.reader is not None
        self.tail = tail
        self._scan = scan
        self.path = os.fspath(path)
        self.session_id = scan.reader.session_id
        self.version = scan.version
        self.cwd = scan.cwd()
        self.header = {k: v for k, v in scan.header.items() if k != "type"}
        self.created_at = created_at
        self.issues: tuple[LineIssue, ...] = ()
        self._progress = progress
        self._leaf: str | None = None
        self._opaque: list[OpaqueRecord] = []
        self._read: ImportedSource | None = None

    @property
    def leaf_id(self) -> str | None:
        """The last entry's id (pi's leaf), after a whole iteration."""
        return self._leaf

    @property
    def opaque(self) -> list[OpaqueRecord]:
        """The unparseable lines kept, after a whole iteration."""
        return self._opaque

    @property
    def read(self) -> ImportedSource | None:
        """What a whole iteration read (the file's size and sha256, and its
        entries), or ``None`` when the file changed while it was read."""
        return self._read

    @property
    def from_line(self) -> int:
        """The first line an iteration reads (1, or the tail's first)."""
        return 1 if self.tail is None else self.tail[1]

    def __iter__(self) -> Iterator[ImportEntry]:
        self._leaf, self._opaque, self._read, self.issues = None, [], None, ()
        before = file_digest(self.path)
        scan = _Scan(self.path)
        count, offset = 0, 0
        if self.tail is not None:  # the header known: the reader starts at the tail
            head = self._scan
            scan = _Scan(self.path, head.header, head.version, head.first_line)
            scan.reader = _Reader(self.path, self.session_id, self.version)
            count, offset = self.tail[0].entries, self.tail[0].bytes
        lines = stream_lines(self.path, self._progress, offset, self.from_line)
        for eid, parent, kind, ts, payload in _records(lines, scan):
            yield ImportEntry(eid, parent, kind, ts or self.created_at, payload)
            self._leaf = eid
            count += 1
        self._opaque, self.issues = list(scan.ends()[0]), scan.ends()[1]
        after = file_digest(self.path)
        if after == before:  # else changed while read: imported, never recorded as read
            self._read = ImportedSource(os.path.realpath(self.path), *after, count)


def open_stream(path: str | os.PathLike[str], progress: Progress | None = None) -> FileStream:
    """The :class:`FileStream` of the pi file at ``path``, its header read (and,
    when the header's timestamp is unusable, the file as far as the first
    entry's usable one, which is then ``created_at``).

    Raises:
        OSError: the file cannot be read.
        SessionFileError: as :func:`parse_text`.
    """
    where = os.fspath(path)
    scan = _Scan(where)
    for _ in _records(stream_lines(path), scan, header_only=True):
        pass
    created = scan.created()
    if created is None:
        records = _records(stream_lines(path), _Scan(where))
        try:
            created = next((r[3] for r in records if r[3] is not None), None)
        finally:
            records.close()
    if created is None:
        raise SessionFileError(where, scan.first_line, detail="no usable timestamp in the file")
    return FileStream(path, scan, created, progress)


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
    entries = parsed.batch.entries
    assert not isinstance(entries, ImportStream)  # _parse holds them all
    read = ImportedSource(os.path.realpath(path), size, digest, len(entries))
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
    found = unchanged_source(store, path, [sid])
    if found is None:
        return None
    result = ImportResult(sid, False, 0, found[1].entries, 0, 0)
    return FileImport(os.fspath(path), sid, version, result, (), FORMAT, unchanged=True)


def import_file(
    store: Store, path: str | os.PathLike[str], *, progress: Progress | None = None
) -> FileImport:
    """Parse the pi session file at ``path`` and import it into ``store``, a
    line at a time as the store takes its entries (:class:`FileStream`):
    memory holds a chunk of entries (``storage/ops/import_chunks.py``
    ``CHUNK``) and the file's entry ids, not the file. ``progress`` is told
    the bytes read as the file is read (``(read, total)``).

    The session id is the header's: importing the same file again adds
    nothing, importing it after it grew (a resumed session) adds only the new
    entries and moves the leaf to the file's last entry
    (``Store.sessions.import_batch``). The import records what it read (the
    file's size and sha256, ``ImportBatch.read``), so a re-import of the
    unchanged file is not parsed at all (:func:`unchanged`: its
    ``FileImport.unchanged`` is true); a file changed otherwise since
    (cut, or edited anywhere before its end) is parsed and imported whole,
    as above; a file that has only grown since (a version 2 or 3 file, its
    bytes read then unchanged and ending a line) is read from where the last
    import stopped (:func:`_appended`), its new entries judged under the
    stored ones (``result.skipped`` counts the entries read before); when an
    appended line names an id the session holds, the file is read whole
    instead (``ImportTailStoredError``), so the line is what an import of
    the whole file makes it (a repeated id: an opaque line).

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
    stream = open_stream(path, progress)
    stream.tail = _appended(store, path, stream)
    batch = ImportBatch(
        stream.session_id,
        stream.cwd,
        stream.created_at,
        stream.header,
        stream,
        None,
        source=os.fspath(path),
    )
    try:
        result = store.sessions.import_batch(batch)
    except ImportTailStoredError:  # an appended line names a stored id: read it all
        stream.tail = None
        result = store.sessions.import_batch(batch)
    if stream.tail is not None:  # the entries read before: in the file, and stored
        result = replace(result, skipped=result.skipped + stream.tail[0].entries)
    return FileImport(
        os.fspath(path), stream.session_id, stream.version, result, stream.issues, FORMAT
    )


def _appended(
    store: Store, path: str | os.PathLike[str], stream: FileStream
) -> tuple[ImportedSource, int] | None:
    """What the last import of the file read (``sessions.imported_source``) and
    the first line after it, when the file has only grown since: longer, its
    bytes up to there the same (their sha256) and ending a line. ``None``
    for any other change, and for a version 1 file (its ids count every
    record from the header) or a gzipped one.

    Raises:
        OSError: the file cannot be read.
    """
    if stream.version < 2:
        return None
    try:
        known = store.sessions.imported_source(stream.session_id, os.path.realpath(path))
    except InvalidInputError:
        return None
    if known is None:
        return None
    prefix = prefix_digest(path, known.bytes)
    if prefix is None or prefix[0] != known.sha256:
        return None
    return known, prefix[1] + 1
