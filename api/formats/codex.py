"""OpenAI Codex CLI rollouts (JSONL): import into a store.

A rollout (``corpus/FORMATS.md`` §3) is one envelope per line,
``{"timestamp", "type", "payload"}``, line 1 the ``session_meta``; both
layouts in the corpus (0.40's ``instructions``, 0.104's
``base_instructions``, ``model_provider`` …) are read alike, as is the
earlier ``compacted`` row with only ``message``. A rollout is linear: each
line becomes one entry whose parent is the previous line's entry, with a
deterministic id from its line (:func:`~._rows.line_entry_id`), and the leaf
is the last line's entry (Codex resumes at the end of the file).

- A ``response_item`` whose payload the model sees (:data:`CONTEXT_ITEMS`; a
  ``message`` of role ``system`` excepted, as Codex's history leaves it out)
  is a ``message`` entry: ``{"message": <the item>}`` plus the envelope's
  other fields (``ordinal``). An item without a role (``function_call``,
  ``function_call_output``, ``reasoning`` …) gets its ``type`` as its
  ``role`` (a role no item of the Responses API has), so replay keeps it in
  its place and the store does not take it for a pi or chat call or result:
  a rollout that ends on a call with no output replays ending on that call,
  as Codex's own history holds it.
- A ``compacted`` row with ``replacement_history`` (Codex: the history
  *becomes* that list): an entry ``codex.compacted`` that is a new root
  (``logicalParentId``, beside the row in its payload, names the entry
  before it, as Claude Code's compact boundary does), then one ``message``
  entry per replacement item (id ``<its id>.<index>``); what follows hangs
  under them, so replay is the replacement history plus what follows, and
  the history before stays stored as its own branch. Without
  ``replacement_history`` (older Codex) the row is the store's
  ``compaction`` (``summary``: its ``message``; nothing kept), which
  replays the summary and what follows (Codex also re-sends the earlier user
  messages there, which this does not rebuild).
- Every other line (``session_meta``, ``event_msg``, ``turn_context``, other
  ``response_item`` payloads, types of later releases) is an entry of its
  own kind, ``codex.<type>``, carrying the envelope unchanged (without
  ``type`` and ``timestamp``, the entry's kind and timestamp) and playing no
  part in replay; a type outside :data:`KNOWN_TYPES` or a response item
  outside :data:`CONTEXT_ITEMS` is reported (``unknown``).
- An ``event_msg`` ``thread_rolled_back`` (``num_turns``; FORMATS.md §3.4:
  readers drop the turns themselves) hangs from where the rollback cuts,
  as Codex's ``drop_last_n_user_turns`` cuts its history: before the
  ``num_turns``-th user turn from the end (before the first when there are
  fewer; nothing when there is none or ``num_turns`` is 0). A user turn is
  a user ``message`` entry of the current history (since the last
  compaction's replacement history) that is not contextual
  (:data:`CONTEXTUAL_USER_PREFIXES`, ``<environment_context>`` …). The lines
  after follow it, so replay leaves the rolled-back turns out and they stay
  stored as a branch of their own. (After an older compaction without
  replacement history, whose rebuilt history re-sends the earlier user
  messages, a rollback cuts no further back than that compaction.)

A sub-agent rollout (``session_meta`` ``source.subagent.thread_spawn.
parent_thread_id`` or ``parent_thread_id``) is the sub-agent session of that
thread (``store.sessions.sub_agents``), imported even when the parent is
absent (reported, the parent reference kept in the header). Unparseable text
is kept as opaque records.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.errors import InvalidInputError, SessionFileError
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
    first_record,
    line_entry_id,
    opaque_records,
    read_record,
    read_source,
    sorted_issues,
    unchanged_source,
)
from .pi_parse import Piece, parse_timestamp

FORMAT = "codex"
"""The ``format`` of a :class:`~._rows.FileImport` of a Codex rollout."""

KIND_PREFIX = "codex."
"""Prefix of the entry kind of a line that is not a context message (``codex.event_msg``)."""

KNOWN_TYPES = frozenset(
    {
        "session_meta",
        "response_item",
        "event_msg",
        "turn_context",
        "compacted",
        "world_state",
        "inter_agent_communication",
        "inter_agent_communication_metadata",
    }
)
"""Envelope types ``corpus/FORMATS.md`` §3.2 describes; any other is reported as unknown."""

CONTEXT_ITEMS = frozenset(
    {
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "local_shell_call",
        "web_search_call",
        "image_generation_call",
        "tool_search_call",
        "tool_search_output",
        "compaction",
    }
)
"""Response item types Codex keeps in the model's history (its ``is_api_message``)."""


CONTEXTUAL_USER_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "# agents.md instructions",
    "<skill>",
    "<user_shell_command>",
    "<turn_aborted>",
    "<subagent_notification>",
)
"""Lower-cased starts of the text of a user message that Codex injects as
context, not a turn of the user's (its ``is_contextual_user_fragment``)."""


def user_turn(message: Mapping[str, Any]) -> bool:
    """Whether a context message opens a user turn (Codex's
    ``is_user_turn_boundary``): a user ``message`` with no contextual text part."""
    if message.get("type") != "message" or message.get("role") != "user":
        return False
    content = message.get("content")
    parts = content if isinstance(content, list) else []
    return not any(
        isinstance(p, dict)
        and isinstance(p.get("text"), str)
        and p["text"].lstrip().lower().startswith(CONTEXTUAL_USER_PREFIXES)
        for p in parts
    )


def looks_like(record: object) -> bool:
    """Whether a file's first record is a Codex rollout's: a ``session_meta``
    envelope whose payload is an object."""
    return (
        isinstance(record, dict)
        and record.get("type") == "session_meta"
        and isinstance(record.get("payload"), dict)
    )


def context_message(item: object) -> dict[str, Any] | None:
    """The message entry's ``message`` for a response item Codex keeps in the
    model's history (the item, with its ``type`` as ``role`` when it has no
    string role), or ``None``."""
    if not isinstance(item, dict) or item.get("type") not in CONTEXT_ITEMS:
        return None
    role = item.get("role")
    if item.get("type") == "message":
        return item if isinstance(role, str) and role != "system" else None
    return item if isinstance(role, str) else {**item, "role": item["type"]}


def _parent_thread(meta: Mapping[str, Any]) -> str | None:
    """The parent thread of a sub-agent rollout's ``session_meta`` payload."""
    source = meta.get("source")
    if isinstance(source, dict):
        sub = source.get("subagent")
        spawn = sub.get("thread_spawn") if isinstance(sub, dict) else None
        if isinstance(spawn, dict) and isinstance(spawn.get("parent_thread_id"), str):
            return str(spawn["parent_thread_id"])
    parent = meta.get("parent_thread_id")
    return parent if isinstance(parent, str) else None


class _Reader:
    """One parse: the chain of entries so far (``cur`` its end)."""

    def __init__(self, path: str, session_id: str) -> None:
        self.rows = Rows(path)
        self.session_id = session_id
        self.cur: str | None = None
        self.turns: list[tuple[str, str | None]] = []
        """The user turns of the current history: (entry id, its parent)."""

    def _took(self, piece: Piece, found: Row | str, message: Mapping[str, Any] | None) -> None:
        """Record ``found`` at the end of the chain (a user turn when ``message`` is one)."""
        parent = self.cur
        eid = self.rows.add(piece, found)
        if eid is None:
            return
        self.cur = eid
        if message is not None and user_turn(message):
            self.turns.append((eid, parent))

    def _rollback(self, item: Mapping[str, Any]) -> None:
        """Move the chain's end to where dropping the last ``num_turns`` turns cuts."""
        n = item.get("num_turns")
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0 or not self.turns:
            return
        at = 0 if n >= len(self.turns) else len(self.turns) - n
        self.cur = self.turns[at][1]
        del self.turns[at:]

    def add(self, piece: Piece, part: int) -> None:
        eid = line_entry_id(self.session_id, piece.line, part)
        record = piece.value
        item = record.get("payload") if piece.ok and isinstance(record, dict) else None
        if isinstance(item, dict) and record.get("type") == "compacted":
            history = item.get("replacement_history")
            if isinstance(history, list):
                self._replace(piece, eid, record, history)
                return
            self.turns = []  # an older compaction: no cut reaches back past it
        if isinstance(item, dict) and (record.get("type"), item.get("type")) == (
            "event_msg",
            "thread_rolled_back",
        ):
            self._rollback(item)
        found = self._convert(piece, eid)
        message = found[4].get("message") if not isinstance(found, str) else None
        self._took(piece, found, message if isinstance(message, dict) else None)

    def _replace(self, piece: Piece, eid: str, record: dict[str, Any], history: list[Any]) -> None:
        """A compaction with replacement history: a new root, then the history."""
        payload = {k: v for k, v in record.items() if k not in ("type", "timestamp")}
        payload["logicalParentId"] = self.cur
        ts = parse_timestamp(record.get("timestamp"))
        root = self.rows.add(
            piece, self.rows.entry(piece.line, eid, None, KIND_PREFIX + "compacted", ts, payload)
        )
        if root is None:
            return
        self.cur = root
        self.turns = []  # the history becomes the replacement
        for index, item in enumerate(history):
            message = context_message(item)
            kind = str(EntryKind.MESSAGE) if message is not None else KIND_PREFIX + "replaced"
            body = {"message": message} if message is not None else {"item": item}
            found = self.rows.entry(piece.line, f"{eid}.{index}", self.cur, kind, ts, body)
            self._took(piece, found, message)

    def _convert(self, piece: Piece, eid: str) -> Row | str:
        record = piece.value
        if not piece.ok:
            return piece.reason
        if not isinstance(record, dict):
            return f"not a JSON object but {type(record).__name__}"
        kind = record.get("type")
        if not isinstance(kind, str) or not kind:
            return "line without a string 'type'"
        rest = {k: v for k, v in record.items() if k not in ("type", "timestamp")}
        ts = parse_timestamp(record.get("timestamp"))
        item = record.get("payload")
        item_type = item.get("type") if isinstance(item, dict) else None
        if kind == "response_item":
            message = context_message(item)
            if message is not None:
                body = {"message": message, **{k: v for k, v in rest.items() if k != "payload"}}
                return self.rows.entry(piece.line, eid, self.cur, str(EntryKind.MESSAGE), ts, body)
            if item_type not in CONTEXT_ITEMS:
                self.rows.note(piece.line, "unknown", f"response item {item_type!r} kept verbatim")
        elif kind == "compacted" and isinstance(item, dict):
            message = item.get("message")
            body = {"summary": message if isinstance(message, str) else "", **rest}
            body["firstKeptEntryId"] = None
            return self.rows.entry(piece.line, eid, self.cur, str(EntryKind.COMPACTION), ts, body)
        elif kind not in KNOWN_TYPES:
            self.rows.note(piece.line, "unknown", f"line type {kind!r} kept verbatim")
        return self.rows.entry(piece.line, eid, self.cur, KIND_PREFIX + kind, ts, rest)


def parse_text(text: str, path: str = "<text>") -> ParsedFile:
    """Parse the text of a Codex rollout into an import batch (see the module
    docstring for the mapping).

    The batch's ``session_id`` is the ``session_meta`` ``id`` (or
    ``session_id``), ``cwd`` its ``cwd`` (or ``""``), ``created_at`` its
    ``timestamp`` (or the envelope's), ``header`` ``{"format": "codex",
    "version": <cli_version>, "originator", "source"}`` as present (a
    sub-agent's adds ``parentSession`` and ``subAgent``; ``forked_from_id``
    is kept as ``forkedFrom``). Lines without a usable timestamp take the
    previous line's. The version returned is ``cli_version`` (``""`` when
    none).

    Raises:
        SessionFileError: the first record is not a ``session_meta`` envelope
            with a usable id and timestamp. Nothing is returned.
    """
    lines = Pieces.of(text)
    pieces = lines.pieces
    if not pieces:
        raise SessionFileError(path, 1, detail="the file has no records")
    first = pieces[0]
    if not first.ok or not looks_like(first.value):
        raise SessionFileError(path, first.line, detail="the first record is not a session_meta")
    envelope = first.value
    meta: dict[str, Any] = envelope["payload"]
    sid = meta.get("id", meta.get("session_id"))
    try:
        session_id = check_id(sid, "session_id")
    except InvalidInputError as exc:
        raise SessionFileError(path, first.line, detail=f"bad session id: {exc}") from None
    created = parse_timestamp(meta.get("timestamp")) or parse_timestamp(envelope.get("timestamp"))
    if created is None:
        raise SessionFileError(path, first.line, detail="the session_meta has no usable timestamp")
    reader = _Reader(path, session_id)
    part = 0
    for i, piece in enumerate(pieces):
        part = part + 1 if i and pieces[i - 1].line == piece.line else 0
        reader.add(piece, part)
    out: list[ImportEntry] = []
    last = created
    for eid, parent, kind, ts, payload in reader.rows.entries:
        last = ts or last
        out.append(ImportEntry(eid, parent, kind, last, payload))
    version = meta.get("cli_version")
    version = version if isinstance(version, str) else ""
    header: dict[str, Any] = {"format": FORMAT, "version": version}
    header.update((k, meta[k]) for k in ("originator", "source") if k in meta)
    if isinstance(meta.get("forked_from_id"), str):
        header["forkedFrom"] = meta["forked_from_id"]
    parent = _parent_thread(meta)
    if parent is not None:
        header.update(parentSession=parent, subAgent=True)
    cwd = meta.get("cwd")
    batch = ImportBatch(
        session_id=session_id,
        cwd=cwd if isinstance(cwd, str) else "",
        created_at=created,
        header=header,
        entries=out,
        leaf_id=reader.cur,
        opaque=opaque_records(path, reader.rows.rejected, lines.raw_lines()),
        source=path,
        sub_agent_of=parent,
    )
    return ParsedFile(batch, version, sorted_issues(lines.repaired(path) + reader.rows.issues))


def parse_file(path: str | os.PathLike[str]) -> ParsedFile:
    """Read and parse the rollout at ``path`` (plain or gzipped JSONL); see
    :func:`parse_text`.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: as :func:`parse_text`, or a corrupt gzip file.
    """
    text, read = read_source(path)
    return read_record(parse_text(text, os.fspath(path)), path, read)


def unchanged(store: Store, path: str | os.PathLike[str]) -> FileImport | None:
    """The :class:`FileImport` of a rollout its last import into ``store`` read as
    it is now (``store.sessions.imported_source``: the same size and sha256 at
    the same resolved path, into the thread its ``session_meta`` names), or
    ``None`` (never imported, or changed since in any way). Reads the first
    record and, when a record of the file exists, its bytes once through a
    digest: no parse.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: a gzip file is corrupt.
    """
    _, first = first_record(path)
    envelope = first.value if first is not None and first.ok else None
    if envelope is None or not looks_like(envelope):
        return None
    meta = envelope["payload"]
    found = unchanged_source(store, path, [meta.get("id", meta.get("session_id"))])
    if found is None:
        return None
    sid, known = found
    version = meta.get("cli_version")
    result = ImportResult(sid, False, 0, known.entries, 0, 0)
    return FileImport(
        os.fspath(path),
        sid,
        version if isinstance(version, str) else "",
        result,
        (),
        FORMAT,
        unchanged=True,
    )


def import_file(store: Store, path: str | os.PathLike[str]) -> FileImport:
    """Parse the Codex rollout at ``path`` and import it into ``store``.

    The session id is the ``session_meta`` id: importing the same file again
    adds nothing, importing it after it grew (a resumed thread) adds only the
    new lines and moves the leaf to the last (``Store.sessions.import_batch``).
    A sub-agent rollout whose parent thread is not in the store is imported
    all the same, linked to it, and reported (a ``reference`` issue). The
    import records what it read (``ImportBatch.read``), so a re-import of
    the unchanged file is not parsed at all (:func:`unchanged`); a file
    changed in any way is parsed and imported whole, as above.

    Raises:
        OSError: the file cannot be read.
        SessionFileError: the file is not a usable rollout; nothing is written.
        ToolCallPairingError, EntryCycleError, EntryIdReservedError: the
            lines would make a tree no write may make; nothing is written.
        DatabaseError: the store failed; nothing is written.
    """
    same = unchanged(store, path)
    if same is not None:
        return same
    parsed = parse_file(path)
    batch = parsed.batch
    issues = list(parsed.issues)
    if batch.sub_agent_of is not None and store.sessions.get(batch.sub_agent_of) is None:
        issues.append(
            LineIssue(
                os.fspath(path),
                0,
                "reference",
                f"parent thread {batch.sub_agent_of} is not in the store (linked when imported)",
            )
        )
    result = store.sessions.import_batch(batch)
    return FileImport(
        os.fspath(path), batch.session_id, parsed.version, result, sorted_issues(issues), FORMAT
    )
