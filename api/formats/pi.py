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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from turnkeeper.spec.entries import BASE_FIELDS, EntryKind, validate_payload
from turnkeeper.spec.errors import InvalidInputError, SessionFileError, SessionNotFoundError
from turnkeeper.spec.records import ImportBatch, ImportEntry, ImportResult, OpaqueRecord
from turnkeeper.storage.protocol import Store

from .pi_parse import Piece, format_timestamp, parse_timestamp, split_lines, storable_text

CURRENT_VERSION = 3
"""The pi session format version this module writes (pi ``CURRENT_SESSION_VERSION``)."""

SUPPORTED_VERSIONS = (1, 2, 3)
"""Header versions this module reads. Version 4 is the oh-my-pi fork, not upstream pi."""

_HEADER_FIRST = ("type", "version", "id", "timestamp", "cwd")


@dataclass(frozen=True, slots=True)
class LineIssue:
    """One problem found in a session file, at ``path``:``line`` (1-based).

    ``kind`` is ``"repaired"`` (a line held several records, or a record and
    unparseable text, and was split) or ``"opaque"`` (text that could not be
    parsed, or a record that could not be stored, kept as an opaque record).
    """

    path: str
    line: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.detail}"


@dataclass(frozen=True, slots=True)
class ParsedFile:
    """A parsed session file: the batch to import, the header's format version
    (1 when missing) and the issues found, in line order."""

    batch: ImportBatch
    version: int
    issues: tuple[LineIssue, ...]


@dataclass(frozen=True, slots=True)
class FileImport:
    """What :func:`import_file` did: the store's result plus the parse issues."""

    path: str
    session_id: str
    version: int
    result: ImportResult
    issues: tuple[LineIssue, ...]


def v1_entry_id(session_id: str, record_index: int) -> str:
    """The id given to the version 1 record at ``record_index`` (header = 0):
    the first 16 hex digits of ``sha256(f"{session_id}:{record_index}")``."""
    return hashlib.sha256(f"{session_id}:{record_index}".encode()).hexdigest()[:16]


def _header(first: Piece, path: str) -> tuple[dict[str, Any], int]:
    """The header record and its version; raises ``SessionFileError`` when unusable."""
    value = first.value if first.ok else None
    if not isinstance(value, dict) or value.get("type") != "session":
        raise SessionFileError(path, first.line, detail="line 1 is not a pi session header")
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
        storable_text(sid).encode("utf-8")
        sid.encode("utf-8")
    except (orjson.JSONEncodeError, UnicodeEncodeError) as exc:
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


class _Reader:
    """State of one parse: the header, the entries so far, opaque records, issues."""

    def __init__(self, path: str, header: dict[str, Any], version: int) -> None:
        self.path = path
        self.version = version
        self.session_id: str = header["id"]
        created = parse_timestamp(header.get("timestamp"))
        self.created_at: datetime | None = created
        self.entries: list[ImportEntry] = []
        self.ids: set[str] = set()
        self.ids_by_index: dict[int, str] = {}
        self.opaque: dict[int, list[tuple[str, str]]] = {}
        self.issues: list[LineIssue] = []

    def reject(self, piece: Piece, reason: str) -> None:
        self.opaque.setdefault(piece.line, []).append((piece.text, reason))
        self.issues.append(LineIssue(self.path, piece.line, "opaque", reason))

    def entry(self, piece: Piece, index: int) -> None:
        """Turn the record at ``index`` into a tree entry, or reject it as opaque."""
        if not piece.ok:
            self.reject(piece, piece.reason)
            return
        record = piece.value
        if not isinstance(record, dict):
            self.reject(piece, f"not a JSON object but {type(record).__name__}")
            return
        kind = record.get("type")
        if not isinstance(kind, str) or not kind:
            self.reject(piece, "record without a string 'type'")
            return
        if self.version == 1:
            eid: Any = v1_entry_id(self.session_id, index)
            parent: Any = self.entries[-1].id if self.entries else None
        else:
            eid, parent = record.get("id"), record.get("parentId")
            if not isinstance(eid, str) or not eid:
                self.reject(piece, f"{kind} entry without a string 'id'")
                return
            if parent is not None and not isinstance(parent, str):
                self.reject(piece, f"{kind} entry {eid}: 'parentId' is not a string or null")
                return
        if eid in self.ids:
            self.reject(piece, f"{kind} entry {eid}: duplicate entry id")
            return
        payload = {k: v for k, v in record.items() if k not in BASE_FIELDS}
        if self.version < 3 and kind == EntryKind.MESSAGE:
            payload = _rename_hook_role(payload)
        if self.version == 1 and kind == EntryKind.COMPACTION:
            payload = _first_kept(payload, self.ids_by_index)
        try:
            validate_payload(kind, payload, strict=False)
            orjson.dumps([eid, parent, payload])
            eid.encode("utf-8")
            if parent is not None:
                parent.encode("utf-8")
        except InvalidInputError as exc:
            self.reject(piece, f"{kind} entry {eid}: {exc.reason}")
            return
        except (orjson.JSONEncodeError, UnicodeEncodeError) as exc:
            self.reject(piece, f"{kind} entry {eid}: not storable: {exc}")
            return
        stamp = parse_timestamp(record.get("timestamp"))
        self.ids.add(eid)
        self.ids_by_index[index] = eid
        self.entries.append(ImportEntry(eid, parent, kind, stamp or _PENDING, payload))

    def opaque_records(self) -> list[OpaqueRecord]:
        """One opaque record per line (the store keys them by line); several
        unparseable pieces of one line are kept as the whole line."""
        out: list[OpaqueRecord] = []
        for line, found in sorted(self.opaque.items()):
            if len(found) == 1:
                raw, reason = found[0]
            else:
                raw = self.lines[line]
                reason = "; ".join(f"record {n}: {r}" for n, (_, r) in enumerate(found, 1))
            out.append(OpaqueRecord(self.path, line, storable_text(raw), reason))
        return out

    lines: dict[int, str]


_PENDING = datetime.min
"""Placeholder for a missing entry timestamp, replaced by the header's once known."""


def parse_text(text: str, path: str = "<text>") -> ParsedFile:
    """Parse the text of a pi session file (versions 1–3) into an import batch.

    ``path`` names the file in issues and opaque records. The batch's
    ``session_id`` is the header ``id``, ``cwd`` the header ``cwd`` (or
    ``""``), ``created_at`` the header ``timestamp`` (when unusable: the
    first entry timestamp), ``header`` every header field but ``type``,
    verbatim; entries are in file order, the leaf is the last entry (pi
    ``_buildIndex``). An entry timestamp that is missing or unparseable falls
    back to ``created_at``. Blank lines are ignored.

    Record indexes (version 1 ids, ``firstKeptEntryIndex``) count records as
    pi wrote them: the header is 0, each record of a glued line counts, and an
    unparseable run of text counts as one record.

    Raises:
        SessionFileError: the first record is not a ``session`` header with a
            string id and a supported version, or no timestamp is usable
            (``line`` says where).
    """
    lines: dict[int, str] = {}
    pieces: list[Piece] = []
    issues: list[LineIssue] = []
    for number, found in split_lines(text):
        pieces.extend(found)
        if len(found) > 1:
            lines[number] = text.split("\n")[number - 1] if not lines else lines[number]
    if not pieces:
        raise SessionFileError(path, 1, detail="the file has no records")
    header, version = _header(pieces[0], path)
    reader = _Reader(path, header, version)
    reader.lines = _split_line_map(text, lines)
    for index, piece in enumerate(pieces):
        if index:
            reader.entry(piece, index)
    for number in sorted(reader.lines):
        line_pieces = [p for p in pieces if p.line == number]
        bad = sum(not p.ok for p in line_pieces)
        what = "records glued together" if not bad else f"parts ({bad} unparseable)"
        issues.append(
            LineIssue(path, number, "repaired", f"line held {len(line_pieces)} {what}; split")
        )
    created = reader.created_at or next(
        (e.timestamp for e in reader.entries if e.timestamp is not _PENDING), None
    )
    if created is None:
        raise SessionFileError(path, pieces[0].line, detail="no usable timestamp in the file")
    entries = [
        e if e.timestamp is not _PENDING else ImportEntry(e.id, e.parent_id, e.kind, created, e.payload)
        for e in reader.entries
    ]
    cwd = header.get("cwd")
    batch = ImportBatch(
        session_id=reader.session_id,
        cwd=cwd if isinstance(cwd, str) else "",
        created_at=created,
        header={k: v for k, v in header.items() if k != "type"},
        entries=entries,
        leaf_id=entries[-1].id if entries else None,
        opaque=reader.opaque_records(),
    )
    issues.extend(reader.issues)
    issues.sort(key=lambda i: (i.line, i.kind != "repaired"))
    return ParsedFile(batch, version, tuple(issues))


def _split_line_map(text: str, wanted: Mapping[int, str]) -> dict[int, str]:
    if not wanted:
        return {}
    all_lines = text.removeprefix("\ufeff").split("\n")
    return {n: all_lines[n - 1].rstrip("\r") for n in wanted}
