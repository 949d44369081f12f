"""What every session-file importer shares: reading the file, issues, opaque
lines, the result type, and the checks that make a record a storable entry.

The pi importer (:mod:`.pi`), the Claude Code importer (:mod:`.claude_code`)
and the Codex importer (:mod:`.codex`) parse their own rows; each row becomes
a tree entry through :class:`Rows`, which refuses what the store would
refuse and keeps it as an :class:`~turnkeeper.spec.records.OpaqueRecord`
(one per line: the store keys them by line) with an ``opaque`` issue.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from turnkeeper.spec.entries import validate_payload
from turnkeeper.spec.errors import InvalidInputError, SessionFileError
from turnkeeper.spec.records import (
    ImportBatch,
    ImportedSource,
    ImportResult,
    ImportStream,
    OpaqueRecord,
)
from turnkeeper.storage.codec import check_id
from turnkeeper.storage.protocol import Store

from .pi_parse import Piece, split_line, split_lines, storable_text

GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of a gzip stream (RFC 1952); such a file is read decompressed."""


@dataclass(frozen=True, slots=True)
class LineIssue:
    """One problem found in a session file, at ``path``:``line`` (1-based).

    ``kind`` is ``"repaired"`` (a line held several records, or a record and
    unparseable text, and was split; or text UTF-8 cannot hold was replaced),
    ``"opaque"`` (text that could not be parsed, or a record that could not
    be stored, kept as an opaque record), ``"unknown"`` (a row of a type the
    importer does not map, kept verbatim as an entry of its own kind) or
    ``"reference"`` (a row names a session or entry the import cannot find:
    a sub-agent's absent parent, a summary's ``leafUuid`` in another session)
    or ``"sub-agent"`` (a sub-agent file beside this one could not be
    imported; line 0). Line 0 is about the file as a whole.
    """

    path: str
    line: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.detail}"


@dataclass(frozen=True, slots=True)
class FileImport:
    """What an ``import_file`` did: the store's result plus the parse issues.

    ``format`` is ``"pi"``, ``"claude-code"`` or ``"codex"``; ``version`` the
    file's format version (pi's header version, an int) or the writing tool's
    version (Claude Code's ``version``, Codex's ``cli_version``; ``""`` when
    the file names none). ``sub_agents`` are the imports of the sub-agent
    files that came with this one (Claude Code's ``<session>/subagents/``).
    """

    path: str
    session_id: str
    version: int | str
    result: ImportResult
    issues: tuple[LineIssue, ...]
    format: str = "pi"
    sub_agents: tuple[FileImport, ...] = ()
    unchanged: bool = False
    """The file was as its last import into this store read it (the same bytes,
    ``sessions.imported_source``): it was not parsed, nothing was written, and
    ``result.skipped`` counts the entries it held; ``issues`` is then empty."""


DIGEST_CHUNK = 1 << 20
"""Bytes :func:`file_digest` reads at a time."""


def file_digest(path: str | os.PathLike[str]) -> tuple[int, str]:
    """``(bytes, sha256 hex)`` of the file at ``path`` as stored (a gzipped file's
    compressed bytes), read :data:`DIGEST_CHUNK` bytes at a time: memory does
    not grow with the file.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(DIGEST_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def read_text(path: str | os.PathLike[str]) -> str:
    """The text of the session file at ``path``: gunzipped when it starts with
    the gzip magic (``.jsonl.gz``), decoded as UTF-8; bytes that are not
    UTF-8 are kept as surrogates (``surrogateescape``), which make their line
    unparseable or are replaced by U+FFFD (:func:`scrub`), never failing the
    file.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: a gzip file is corrupt or cut off (``line`` 0).
    """
    return _decode(Path(path).read_bytes(), path)


def read_source(path: str | os.PathLike[str]) -> tuple[str, tuple[int, str]]:
    """:func:`read_text` of the file at ``path`` and ``(bytes, sha256 hex)`` of
    exactly the bytes it read (as :func:`file_digest` gives them): what an
    import of that text records it read (``ImportBatch.read``).

    Raises:
        OSError: the file cannot be read.
        SessionFileError: a gzip file is corrupt or cut off (``line`` 0).
    """
    data = Path(path).read_bytes()
    return _decode(data, path), (len(data), hashlib.sha256(data).hexdigest())


def first_records(path: str | os.PathLike[str]) -> Iterator[Any]:
    """The JSON values of the records on the first :data:`DETECT_LINES` lines of
    the file at ``path`` (gzipped or not), unparseable text passed over.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: a gzip file is corrupt (``line`` 0).
    """
    for _, piece in _first_pieces(path):
        if piece.ok:
            yield piece.value


def unchanged_source(
    store: Store, path: str | os.PathLike[str], session_ids: Iterable[Any]
) -> tuple[str, ImportedSource] | None:
    """The first of ``session_ids`` (the sessions the file's first records say it
    is, a value that is no id passed over) into which the last import of the
    file at ``path`` (its resolved path) read the file as it is now (the same
    size and sha256, ``store.sessions.imported_source``), with that record;
    or ``None``. Reads the file's bytes once through a digest, only when a
    record exists: memory does not grow with the file.

    Raises:
        OSError: the file cannot be read.
    """
    source = os.path.realpath(path)
    now: tuple[int, str] | None = None
    for sid in session_ids:
        if not isinstance(sid, str) or not sid:
            continue
        try:
            known = store.sessions.imported_source(sid, source)
        except InvalidInputError:
            continue  # the full import reports what is wrong with it
        if known is None:
            continue
        now = now or file_digest(path)
        if now == (known.bytes, known.sha256):
            return sid, known
    return None


def read_record(
    parsed: ParsedFile, path: str | os.PathLike[str], read: tuple[int, str]
) -> ParsedFile:
    """``parsed`` with its batch's ``read``: the file at ``path`` (its resolved
    path) read as ``read`` (``(bytes, sha256)``), with the batch's entries."""
    entries = parsed.batch.entries
    assert not isinstance(entries, ImportStream)  # a parsed text holds them all
    done = ImportedSource(os.path.realpath(path), read[0], read[1], len(entries))
    return replace(parsed, batch=replace(parsed.batch, read=done))


def _decode(data: bytes, path: str | os.PathLike[str]) -> str:
    if data.startswith(GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise SessionFileError(os.fspath(path), 0, detail=f"bad gzip data: {exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", "surrogateescape")


DETECT_LINES = 50
"""Lines :func:`first_record` reads at most, looking past damaged ones."""


def first_record(path: str | os.PathLike[str]) -> tuple[int, Piece | None]:
    """The first JSON object record of the session file at ``path`` (gzipped
    or not) and its line, looking past unparseable text (a cut-off or
    NUL-filled first line) for up to :data:`DETECT_LINES` lines; when none
    is found there, the first piece (its ``reason`` says why it is none);
    ``(0, None)`` when the file has no record.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: a gzip file is corrupt (``line`` 0).
    """
    first: tuple[int, Piece | None] = (0, None)
    for number, piece in _first_pieces(path):
        if piece.ok and isinstance(piece.value, dict):
            return number, piece
        if first[1] is None:
            first = (number, piece)
    return first


def _first_pieces(path: str | os.PathLike[str]) -> Iterator[tuple[int, Piece]]:
    """The pieces of the first :data:`DETECT_LINES` lines of the file at
    ``path`` (gzipped or not; a leading BOM dropped), each with its line.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: a gzip file is corrupt (``line`` 0).
    """
    with open(path, "rb") as raw:
        gz = raw.read(2) == GZIP_MAGIC
    opener: Any = gzip.open if gz else open
    try:
        with opener(path, "rb") as stream:
            for number, data in enumerate(stream, start=1):
                if number > DETECT_LINES:
                    return
                text = data.decode("utf-8", "surrogateescape")
                if number == 1:
                    text = text.removeprefix("\ufeff")
                for piece in split_line(text.rstrip("\r\n"), number):
                    yield number, piece
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise SessionFileError(os.fspath(path), 0, detail=f"bad gzip data: {exc}") from None


def scrub(value: Any) -> tuple[Any, bool]:
    """``value`` with every string UTF-8 cannot hold made storable, and whether any was.

    JavaScript's ``JSON.stringify`` writes lone surrogates as ``\\udXXX``
    escapes; refusing such a record would cut every later entry off its
    parent, so the text is repaired (U+FFFD per bad code unit) and reported.
    """
    if isinstance(value, str):
        fixed = storable_text(value)
        return fixed, fixed is not value
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        changed = False
        for k, v in value.items():
            (k2, v2), c = scrub((k, v))
            out[k2] = v2
            changed = changed or c
        return (out if changed else value), changed
    if isinstance(value, list | tuple):
        items = [scrub(v) for v in value]
        if not any(c for _, c in items):
            return value, False
        seq = [v for v, _ in items]
        return (tuple(seq) if isinstance(value, tuple) else seq), True
    return value, False


def line_entry_id(session_id: str, line: int, part: int = 0) -> str:
    """The id given to a row that carries none (a Codex rollout line, a Claude
    Code bookkeeping row): the first 16 hex digits of
    ``sha256(f"{session_id}:{line}.{part}")``, ``part`` counting records glued
    on one line. Lines are only ever appended, so a grown file gives its old
    rows the same ids."""
    return hashlib.sha256(f"{session_id}:{line}.{part}".encode()).hexdigest()[:16]


def opaque_records(
    path: str, rejected: Mapping[int, list[tuple[str, str]]], raw_lines: Mapping[int, str]
) -> list[OpaqueRecord]:
    """One opaque record per line of ``rejected`` (line → its rejected pieces'
    ``(text, reason)``); when one line has several, the record is the whole
    line (``raw_lines``) and the reasons are joined."""
    out: list[OpaqueRecord] = []
    for line, found in sorted(rejected.items()):
        raw, reason = found[0]
        if len(found) > 1:
            raw = raw_lines[line]
            reason = "; ".join(f"part {n}: {r}" for n, (_, r) in enumerate(found, 1))
        out.append(OpaqueRecord(path, line, storable_text(raw), reason))
    return out


def _split_detail(found: list[Piece]) -> str:
    bad = sum(not p.ok for p in found)
    if not bad:
        return f"{len(found)} records glued on one line, split apart"
    return f"line split into {len(found)} parts, {bad} of them unparseable"


PROGRESS_BYTES = 1 << 20
"""Bytes :func:`stream_lines` reads between two calls of its ``progress``."""

Progress = Callable[[int, int], None]
"""Told ``(bytes read, bytes in all)`` of a file as it is read (for a gzipped
file, of its compressed bytes)."""


def prefix_digest(path: str | os.PathLike[str], size: int) -> tuple[str, int] | None:
    """``(sha256 hex, lines)`` of the first ``size`` bytes of the plain (not
    gzipped) file at ``path``, ``lines`` the newlines among them, when the
    file is longer than that and those bytes end a line; else ``None``. Read
    :data:`DIGEST_CHUNK` bytes at a time.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    lines, left, last = 0, size, b""
    with open(path, "rb") as f:
        if size < 1 or os.fstat(f.fileno()).st_size <= size or f.read(2) == GZIP_MAGIC:
            return None
        f.seek(0)
        while left and (chunk := f.read(min(DIGEST_CHUNK, left))):
            h.update(chunk)
            lines += chunk.count(b"\n")
            left -= len(chunk)
            last = chunk[-1:]
    return (h.hexdigest(), lines) if not left and last == b"\n" else None


def stream_lines(
    path: str | os.PathLike[str],
    progress: Progress | None = None,
    offset: int = 0,
    first_line: int = 1,
) -> Iterator[tuple[int, str, list[Piece]]]:
    """``(line number, line text, pieces)`` for every non-blank line of the file
    at ``path``, as :func:`~.pi_parse.split_lines` gives them for its text
    (:func:`read_text`), read one line at a time: memory holds one line, not
    the file. A gzipped file is read decompressed; a line that is not UTF-8
    keeps its bad bytes as surrogates (``surrogateescape``), as
    :func:`read_text` does. ``progress`` is told the bytes read every
    :data:`PROGRESS_BYTES` and at the end. With ``offset`` (a plain file's
    byte where a line starts, ``first_line`` its number), the file is read
    from there.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: a gzip file is corrupt or cut off (``line`` 0).
    """
    with open(path, "rb") as raw:
        gz = raw.read(2) == GZIP_MAGIC
        if gz and offset:
            raise ValueError("a gzipped file is read from its start")
        raw.seek(offset)
        total = os.fstat(raw.fileno()).st_size
        stream: Any = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        told = offset
        try:
            with stream:
                for number, data in enumerate(stream, start=first_line):
                    if progress is not None and (done := raw.tell()) - told >= PROGRESS_BYTES:
                        told = done
                        progress(done, total)
                    try:
                        text = data.decode("utf-8")
                    except UnicodeDecodeError:
                        text = data.decode("utf-8", "surrogateescape")
                    if number == 1:
                        text = text.removeprefix("\ufeff")
                    text = text.removesuffix("\n").removesuffix("\r")
                    pieces = split_line(text, number)
                    if pieces:
                        yield number, text, pieces
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise SessionFileError(os.fspath(path), 0, detail=f"bad gzip data: {exc}") from None
        if progress is not None:
            progress(total, total)


@dataclass(frozen=True, slots=True)
class Pieces:
    """A file's records in order (:func:`~.pi_parse.split_lines`) and the lines
    that were split into several (line → its text and pieces)."""

    pieces: list[Piece]
    split: dict[int, tuple[str, list[Piece]]]

    @classmethod
    def of(cls, text: str) -> Pieces:
        """Split ``text`` into its records; never raises."""
        pieces: list[Piece] = []
        split: dict[int, tuple[str, list[Piece]]] = {}
        for number, raw, found in split_lines(text):
            pieces.extend(found)
            if len(found) > 1:
                split[number] = (raw, found)
        return cls(pieces, split)

    def repaired(self, path: str) -> list[LineIssue]:
        """A ``repaired`` issue per split line."""
        return [
            LineIssue(path, n, "repaired", _split_detail(found))
            for n, (_, found) in self.split.items()
        ]

    def raw_lines(self) -> dict[int, str]:
        """The text of each split line, by line."""
        return {n: raw for n, (raw, _) in self.split.items()}


@dataclass(frozen=True, slots=True)
class ParsedFile:
    """A parsed session file: the batch to import, the format version
    (:attr:`FileImport.version`) and the issues found, in line order."""

    batch: ImportBatch
    version: int | str
    issues: tuple[LineIssue, ...]


def sorted_issues(issues: list[LineIssue]) -> tuple[LineIssue, ...]:
    """``issues`` by line, a line's ``repaired`` issue first."""
    return tuple(sorted(issues, key=lambda i: (i.line, i.kind != "repaired")))


Row = tuple[str, str | None, str, datetime | None, dict[str, Any]]
"""An entry being read: id, parent id, kind, timestamp (``None``: fall back), payload."""


@dataclass(slots=True)
class Rows:
    """The entries of one file being read, the pieces rejected (by line) and the issues."""

    path: str
    entries: list[Row] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    rejected: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    issues: list[LineIssue] = field(default_factory=list)

    def reject(self, piece: Piece, reason: str) -> None:
        """Keep ``piece`` as (part of) an opaque line, with an ``opaque`` issue."""
        self.rejected.setdefault(piece.line, []).append((piece.text, reason))
        self.issues.append(LineIssue(self.path, piece.line, "opaque", reason))

    def note(self, line: int, kind: str, detail: str) -> None:
        """Report an issue at ``line``."""
        self.issues.append(LineIssue(self.path, line, kind, detail))

    def entry(
        self,
        line: int,
        eid: Any,
        parent: Any,
        kind: str,
        timestamp: datetime | None,
        payload: dict[str, Any],
    ) -> Row | str:
        """The storable row for an entry, or why the store would refuse it: the
        id is not an id or is taken, the parent is not a string, the payload
        lacks what ``kind`` requires or is not JSON. Text UTF-8 cannot hold is
        replaced (a ``repaired`` issue, the one thing recorded here: the row
        is recorded by :meth:`add`)."""
        if not isinstance(eid, str) or not eid:
            return f"{kind} entry without a string id"
        if parent is not None and not isinstance(parent, str):
            return f"{kind} entry {eid}: its parent is not a string or null"
        (eid, parent, payload), scrubbed = scrub((eid, parent, payload))
        if scrubbed:
            self.note(
                line,
                "repaired",
                f"{kind} entry {eid}: text UTF-8 cannot hold (a lone surrogate) replaced by U+FFFD",
            )
        try:
            check_id(eid, "id")
        except InvalidInputError as exc:
            return f"{kind} entry: its id is not an id: {getattr(exc, 'reason', exc)}"
        if eid in self.ids:
            return f"{kind} entry {eid}: duplicate entry id"
        try:
            validate_payload(kind, payload, strict=False)
            orjson.dumps([eid, parent, payload])
        except InvalidInputError as exc:
            return f"{kind} entry {eid}: {getattr(exc, 'reason', exc)}"
        except orjson.JSONEncodeError as exc:
            return f"{kind} entry {eid}: not storable: {exc}"
        return (eid, parent, kind, timestamp, payload)

    def add(self, piece: Piece, found: Row | str) -> str | None:
        """Record :meth:`entry`'s answer for ``piece``: the row (its id is
        returned) or, for a reason, ``piece`` as opaque (``None``)."""
        if isinstance(found, str):
            self.reject(piece, found)
            return None
        self.ids.add(found[0])
        self.entries.append(found)
        return found[0]
