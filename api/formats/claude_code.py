"""Claude Code transcripts (JSONL, optionally gzipped): import into a store.

A transcript (``corpus/FORMATS.md`` §2) has no header: every conversation row
(``user``, ``assistant``, ``system``, ``progress``, ``attachment``) carries
``uuid``, ``parentUuid`` (``null`` for a root), ``sessionId``, ``cwd``,
``version`` (the CLI's) and ``timestamp``; bookkeeping rows
(``file-history-snapshot``, ``queue-operation``, ``summary`` …) carry no
``uuid``. Each row becomes one entry, its payload the row without ``type``
and ``timestamp`` (those are the entry's kind and timestamp), key order kept:

- a ``user`` or ``assistant`` row with a ``message`` holding a string
  ``role`` is a ``message`` entry (replay's context message is the row's
  Anthropic ``message`` as written: one per row, so one API response written
  as several rows, one per content block, stays several messages, as the
  transcript's chain holds them);
- the ``user`` row with ``isCompactSummary`` after a compaction is the
  store's ``compaction`` (``summary``: its text, ``firstKeptEntryId``:
  ``null``, so replay starts from it as Claude Code does), and the
  ``system``/``compact_boundary`` row before it, a root in the file
  (``parentUuid: null``), hangs under its ``logicalParentUuid``, so the
  history before the compaction stays an ancestor and the boundary row keeps
  both fields in its payload;
- every other row is an entry of its own kind, ``claude-code.<type>``
  (``claude-code.progress``, ``claude-code.file-history-snapshot`` …),
  carrying the row unchanged and playing no part in replay; a type outside
  :data:`KNOWN_TYPES` is also reported (an ``unknown`` issue). A row without
  ``uuid`` gets a deterministic id from its line (:func:`~._rows.line_entry_id`)
  and no parent.

The leaf is the last ``user``/``assistant`` row of the file that is not a
sidechain's (Claude Code resumes from the latest message row, walking
``parentUuid`` back; older CLIs wrote sub-agents' rows, ``isSidechain``,
into the main file). Parents outside the file (a compaction agent's rows
point into its parent's transcript: such an entry is a root of the
sub-agent session, the parent kept in its payload's ``parentUuid``) and
``summary`` rows whose ``leafUuid`` names no row of the file (older CLIs'
titles of other sessions) are kept as written and reported (a
``reference`` issue). Unparseable text is kept as opaque records.

A sub-agent transcript (``<session>/subagents/agent-<id>.jsonl``: rows with
``isSidechain`` and ``agentId``, carrying the *parent's* ``sessionId``) is
the sub-agent session ``<parent>/agent-<id>`` of the parent session
(``store.sessions.sub_agents``); importing a session's file also imports
its sub-agent files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.errors import (
    EntryCycleError,
    EntryIdReservedError,
    InvalidInputError,
    SessionFileError,
    ToolCallPairingError,
)
from turnkeeper.spec.records import ImportBatch, ImportEntry, ImportResult
from turnkeeper.storage.codec import check_id
from turnkeeper.storage.protocol import Store

from ._rows import (
    FileImport,
    LineIssue,
    ParsedFile,
    Pieces,
    Row,
    Rows,
    first_records,
    line_entry_id,
    opaque_records,
    read_record,
    read_source,
    sorted_issues,
    unchanged_source,
)
from .pi_parse import Piece, parse_timestamp

FORMAT = "claude-code"
"""The ``format`` of a :class:`~._rows.FileImport` of a Claude Code transcript."""

KIND_PREFIX = "claude-code."
"""Prefix of the entry kind of a row that is not a message (``claude-code.progress``)."""

MESSAGE_TYPES = frozenset({"user", "assistant"})
"""Row types that are messages (when their ``message`` has a string ``role``)."""

KNOWN_TYPES = frozenset(
    {
        "user",
        "assistant",
        "system",
        "progress",
        "attachment",
        "summary",
        "file-history-snapshot",
        "file-history-delta",
        "queue-operation",
        "permission-mode",
        "mode",
        "ai-title",
        "custom-title",
        "agent-name",
        "last-prompt",
        "pr-link",
    }
)
"""Row types ``corpus/FORMATS.md`` §2.2 describes; any other is reported as unknown."""

SUB_AGENT_FAILURES = (
    SessionFileError,
    InvalidInputError,
    ToolCallPairingError,
    EntryCycleError,
    EntryIdReservedError,
    OSError,
)
"""Failures of one sub-agent file that leave its parent's import standing (an issue)."""


def looks_like(record: object) -> bool:
    """Whether a file's first record is a Claude Code row: a JSON object with a
    string ``type`` that carries a string ``sessionId`` (every conversation
    row, and bookkeeping rows of kinds new to this module), or whose ``type``
    is one of :data:`KNOWN_TYPES` and that carries ``uuid``, ``messageId`` or
    ``leafUuid`` (the file-history snapshot, the summary)."""
    if not isinstance(record, dict) or not isinstance(record.get("type"), str):
        return False
    if isinstance(record.get("sessionId"), str):
        return True
    return record["type"] in KNOWN_TYPES and any(
        k in record for k in ("uuid", "messageId", "leafUuid")
    )


def _text(content: object) -> str:
    """The text of a message ``content``: the string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b["text"]
            for b in content
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    return ""


def _timestamp_of(record: Mapping[str, Any]) -> Any:
    """A row's timestamp; a file-history snapshot has its own inside ``snapshot``."""
    if "timestamp" in record:
        return record["timestamp"]
    snapshot = record.get("snapshot")
    return snapshot.get("timestamp") if isinstance(snapshot, dict) else None


def _is_message(kind: str, record: Mapping[str, Any]) -> bool:
    message = record.get("message")
    return (
        kind in MESSAGE_TYPES and isinstance(message, dict) and isinstance(message.get("role"), str)
    )


class _Reader:
    """One parse: rows as entries, the line of each id, the message rows, summaries."""

    def __init__(self, path: str, session_id: str, sub_agent: bool) -> None:
        self.rows = Rows(path)
        self.session_id = session_id
        self.sub_agent = sub_agent
        self.line_of: dict[str, int] = {}
        self.leaf: str | None = None
        self.summaries: list[tuple[int, object]] = []

    def add(self, piece: Piece, part: int) -> None:
        found = self._convert(piece, part)
        eid = self.rows.add(piece, found)
        if eid is None:
            return
        self.line_of[eid] = piece.line
        if (
            not isinstance(found, str)
            and found[2] in (EntryKind.MESSAGE, EntryKind.COMPACTION)
            and (self.sub_agent or piece.value.get("isSidechain") is not True)
        ):
            self.leaf = eid  # a sidechain row in a main file is a sub-agent's (older CLIs)

    def _convert(self, piece: Piece, part: int) -> Row | str:
        record = piece.value
        if not piece.ok:
            return piece.reason
        if not isinstance(record, dict):
            return f"not a JSON object but {type(record).__name__}"
        kind = record.get("type")
        if not isinstance(kind, str) or not kind:
            return "row without a string 'type'"
        payload = {k: v for k, v in record.items() if k not in ("type", "timestamp")}
        eid: Any = record.get("uuid")
        parent: Any = record.get("parentUuid")
        if eid is None:
            eid, parent = line_entry_id(self.session_id, piece.line, part), None
        logical = record.get("logicalParentUuid")
        if parent is None and record.get("subtype") == "compact_boundary":
            parent = logical if isinstance(logical, str) else None
        if _is_message(kind, record):
            if kind == "user" and record.get("isCompactSummary") is True:
                summary = _text(record["message"].get("content"))
                payload = {"summary": summary, "firstKeptEntryId": None, **payload}
                entry_kind = str(EntryKind.COMPACTION)
            else:
                entry_kind = str(EntryKind.MESSAGE)
        else:
            entry_kind = KIND_PREFIX + kind
            if kind not in KNOWN_TYPES:
                self.rows.note(piece.line, "unknown", f"row type {kind!r} kept verbatim")
            elif kind in MESSAGE_TYPES:
                self.rows.note(
                    piece.line, "unknown", f"{kind} row without a message role kept verbatim"
                )
        if kind == "summary":
            self.summaries.append((piece.line, record.get("leafUuid")))
        ts = parse_timestamp(_timestamp_of(record))
        return self.rows.entry(piece.line, eid, parent, entry_kind, ts, payload)

    def references(self) -> None:
        """Report parents outside the file and summaries of other sessions' leaves.

        In a sub-agent's file such a parent is a row of the parent session's
        transcript (the compaction agent's rows point there): the entry is a
        root of the sub-agent session, the parent kept in its payload's
        ``parentUuid``. In a session's own file the parent stays the entry's,
        as pi's importer keeps one (a later import may supply it).
        """
        ids = self.rows.ids
        for i, (eid, parent, kind, ts, payload) in enumerate(self.rows.entries):
            if parent is None or parent in ids:
                continue
            if self.sub_agent:
                self.rows.entries[i] = (eid, None, kind, ts, payload)
                where = "the parent session's row, not this file's: a root here, kept as parentUuid"
            else:
                where = "not in this file (kept)"
            self.rows.note(
                self.line_of[eid], "reference", f"{kind} entry {eid}: parent {parent} is {where}"
            )
        for line, leaf in self.summaries:
            if leaf not in ids:
                self.rows.note(
                    line,
                    "reference",
                    f"summary row: leafUuid {leaf!r} is not in this file "
                    "(another session's leaf; kept)",
                )


def _first(pieces: list[Piece], key: str) -> Any:
    """The first string value of ``key`` among the records."""
    for p in pieces:
        if p.ok and isinstance(p.value, dict) and isinstance(p.value.get(key), str):
            return p.value[key]
    return None


def _agent_meta(path: str) -> dict[str, Any] | None:
    """The ``agent-<id>.meta.json`` beside a sub-agent file (agent type, spawning
    ``toolUseId``), or ``None`` when absent or not a JSON object."""
    meta = Path(path).with_name(Path(path).name.removesuffix(".jsonl") + ".meta.json")
    try:
        value = orjson.loads(meta.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def parse_text(text: str, path: str = "<text>") -> ParsedFile:
    """Parse the text of a Claude Code transcript into an import batch (see the
    module docstring for the mapping).

    The batch's ``session_id`` is the rows' ``sessionId`` (a sub-agent's:
    ``<sessionId>/agent-<agentId>``, with ``sub_agent_of`` the parent),
    ``cwd`` the first row's ``cwd`` (or ``""``), ``created_at`` the first
    usable timestamp (also the timestamp of rows without one), ``header``
    ``{"format": "claude-code", "version": <CLI version>}`` (a sub-agent's
    adds ``parentSession``, ``subAgent``, ``agentId`` and ``agentMeta`` when
    its ``.meta.json`` is beside it). The version returned is the first
    row's CLI ``version`` (``""`` when none).

    Raises:
        SessionFileError: the file has no records, its rows name no usable
            session id, or nothing in it has a usable timestamp. Nothing is
            returned.
    """
    lines = Pieces.of(text)
    pieces = lines.pieces
    if not pieces:
        raise SessionFileError(path, 1, detail="the file has no records")
    parent_sid = _first(pieces, "sessionId")
    if parent_sid is None:
        raise SessionFileError(path, 1, detail="no row names its sessionId")
    agent = _first(pieces, "agentId")
    sub_agent = agent is not None and any(
        p.ok and isinstance(p.value, dict) and p.value.get("isSidechain") is True for p in pieces
    )
    session_id = f"{parent_sid}/agent-{agent}" if sub_agent else parent_sid
    try:
        check_id(session_id, "session_id")
    except InvalidInputError as exc:
        raise SessionFileError(path, 1, detail=f"bad session id: {exc}") from None
    reader = _Reader(path, session_id, sub_agent)
    part = 0
    for i, piece in enumerate(pieces):
        part = part + 1 if i and pieces[i - 1].line == piece.line else 0
        reader.add(piece, part)
    reader.references()
    entries = reader.rows.entries
    created = next((e[3] for e in entries if e[3] is not None), None)
    if created is None:
        raise SessionFileError(path, pieces[0].line, detail="no usable timestamp in the file")
    out: list[ImportEntry] = []
    last = created
    for eid, parent, kind, ts, payload in entries:
        last = ts or last
        out.append(ImportEntry(eid, parent, kind, last, payload))
    version = _first(pieces, "version") or ""
    header: dict[str, Any] = {"format": FORMAT, "version": version}
    if sub_agent:
        header.update(parentSession=parent_sid, subAgent=True, agentId=agent)
        meta = _agent_meta(path)
        if meta is not None:
            header["agentMeta"] = meta
    cwd = _first(pieces, "cwd")
    batch = ImportBatch(
        session_id=session_id,
        cwd=cwd or "",
        created_at=created,
        header=header,
        entries=out,
        leaf_id=reader.leaf or (out[-1].id if out else None),
        opaque=opaque_records(path, reader.rows.rejected, lines.raw_lines()),
        source=path,
        sub_agent_of=parent_sid if sub_agent else None,
    )
    return ParsedFile(batch, version, sorted_issues(lines.repaired(path) + reader.rows.issues))


def parse_file(path: str | os.PathLike[str]) -> ParsedFile:
    """Read and parse the transcript at ``path`` (plain or gzipped JSONL); see
    :func:`parse_text`.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: as :func:`parse_text`, or a corrupt gzip file.
    """
    text, read = read_source(path)
    return read_record(parse_text(text, os.fspath(path)), path, read)


def unchanged(store: Store, path: str | os.PathLike[str]) -> FileImport | None:
    """The :class:`FileImport` of a transcript its last import into ``store``
    read as it is now (``store.sessions.imported_source``: the same size and
    sha256 at the same resolved path, into the session its rows name: the
    first ``sessionId``, or the sub-agent session of the first ``agentId``,
    of the first records, :func:`~._rows.first_records`), or ``None`` (never
    imported, or changed since in any way). Its sub-agent files are not
    looked at (:func:`import_file` imports each, or finds it unchanged). Reads
    the first records and, when a record of the file exists, its bytes once
    through a digest: no parse.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: a gzip file is corrupt.
    """
    first: dict[str, str] = {}
    for value in first_records(path):
        if isinstance(value, dict):
            for key in ("sessionId", "agentId", "version"):
                if isinstance(value.get(key), str):
                    first.setdefault(key, value[key])
    sid = first.get("sessionId")
    if sid is None:
        return None
    agent = first.get("agentId")
    found = unchanged_source(store, path, [f"{sid}/agent-{agent}", sid] if agent else [sid])
    if found is None:
        return None
    session_id, known = found
    result = ImportResult(session_id, False, 0, known.entries, 0, 0)
    version = first.get("version", "")
    return FileImport(os.fspath(path), session_id, version, result, (), FORMAT, unchanged=True)


def sub_agent_files(path: str | os.PathLike[str], session_id: str) -> list[Path]:
    """The sub-agent transcripts of the session file at ``path``:
    ``<folder>/<session_id>/subagents/*.jsonl`` beside it, by name."""
    folder = Path(path).parent / session_id / "subagents"
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def import_file(store: Store, path: str | os.PathLike[str]) -> FileImport:
    """Parse the Claude Code transcript at ``path`` and import it into ``store``,
    then the sub-agent files beside it (:func:`sub_agent_files`) as its
    sub-agent sessions (``FileImport.sub_agents``).

    The session id is the rows' ``sessionId``: importing the same file again
    adds nothing, importing it after it grew adds only the new rows and moves
    the leaf to its last message row (``Store.sessions.import_batch``). A
    sub-agent file imported on its own becomes the sub-agent session of its
    parent, stored or not (an absent parent is reported, a ``reference``
    issue; ``sessions.sub_agents`` finds it once the parent is imported).
    A sub-agent file that cannot be imported is reported as a ``sub-agent``
    issue of this file (line 0) and the others still go in.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: the file is not a usable transcript; nothing is written.
        ToolCallPairingError, EntryCycleError, EntryIdReservedError: the rows
            would make a tree no write may make; nothing is written.
        DatabaseError: the store failed; nothing of this file is written.
    """
    same = unchanged(store, path)
    if same is not None:
        if "/agent-" in same.session_id:
            return same
        subs, issues = _sub_agents(store, path, same.session_id)
        return replace(same, issues=sorted_issues(issues), sub_agents=tuple(subs))
    parsed = parse_file(path)
    batch = parsed.batch
    issues = list(parsed.issues)
    if batch.sub_agent_of is not None and store.sessions.get(batch.sub_agent_of) is None:
        issues.append(
            LineIssue(
                os.fspath(path),
                0,
                "reference",
                f"parent session {batch.sub_agent_of} is not in the store (linked when imported)",
            )
        )
    result = store.sessions.import_batch(batch)
    subs = []
    if batch.sub_agent_of is None:
        subs, failed = _sub_agents(store, path, batch.session_id)
        issues += failed
    return FileImport(
        os.fspath(path),
        batch.session_id,
        parsed.version,
        result,
        sorted_issues(issues),
        FORMAT,
        tuple(subs),
    )


def _sub_agents(
    store: Store, path: str | os.PathLike[str], session_id: str
) -> tuple[list[FileImport], list[LineIssue]]:
    """Import the sub-agent files of the transcript at ``path`` (session
    ``session_id``): their imports, and a ``sub-agent`` issue (line 0) for
    each that could not be imported."""
    subs: list[FileImport] = []
    issues: list[LineIssue] = []
    for sub in sub_agent_files(path, session_id):
        try:
            subs.append(import_file(store, sub))
        except SUB_AGENT_FAILURES as exc:
            issues.append(
                LineIssue(
                    os.fspath(path),
                    0,
                    "sub-agent",
                    f"sub-agent file {sub} not imported: {type(exc).__name__}: {exc}",
                )
            )
    return subs, issues
