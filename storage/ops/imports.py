"""Imports of parsed session files: only the entries a session lacks, idempotently,
with the unparseable lines kept as opaque records."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

from turnkeeper.spec import errors
from turnkeeper.spec.entries import validate_payload
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import (
    ImportBatch,
    ImportedSource,
    ImportEntry,
    ImportResult,
    ImportStream,
    Lease,
    OpaqueRecord,
)

from ..backend import Tx, keyed
from ..codec import check_id, check_instant, check_text, to_json
from ..validate import (
    check_session_lease,
)
from . import deletes, import_chunks, leases
from .base import Area
from .leases import NOW
from .session_rows import ID_HEAD, SESSION_COLS


def import_rows(
    tx: Tx,
    session_id: str,
    cwd: str,
    header_json: str,
    created_at: datetime,
    rows: Iterable[import_chunks.Row],
    leaf_id: Callable[[], str | None],
    opaque: Callable[[], Sequence[tuple[int, str, str]]],
    source: str,
    lease: Lease | None = None,
    sub_agent_of: str | None = None,
    from_line: int = 1,
) -> tuple[bool, int, int, int, int]:
    """Insert the entries of an imported file that the session lacks, and the
    usage its assistant messages carry that the session has not recorded.

    ``rows`` are :data:`~.import_chunks.Row` in file order, read once, a
    chunk at a time (``import_chunks.add_entries``: never all held). Existing
    ids are skipped (a re-import changes nothing; a grown file adds only its
    new entries). When anything is added the leaf becomes ``leaf_id()`` (read
    once ``rows`` is consumed, as is ``opaque()``, the file's opaque lines).
    Every assistant message of the file whose usage has no record yet
    (``entry:<id>``, :func:`usage.import_usage`) gets one, from the entry as
    the session holds it (so a file imported before usage was recorded gets
    its usage on its next import). Returns ``(created, added, skipped,
    opaque_added, usage_added)``. A ``lease`` is fenced, also when the
    import creates the session; without one, an existing session must be
    unheld. ``sub_agent_of`` links a session the import creates to its parent
    (an existing session keeps its link). ``from_line``: the first line of
    the file the rows were read from (the opaque lines before it are kept).

    Raises:
        LeaseLostError, BusyError: as for an append.
        ToolCallPairingError: the new entries break the tool-call pairing
            (``ToolCallsUnansweredError`` among them).
        EntryCycleError, EntryIdReservedError: see ``import_chunks.judge_tree``.
        ImportTailStoredError: ``from_line`` is above 1 (the rows are the
            lines appended since the file's last import) and a row's id is
            stored: only the whole file says what that line is.
        InvalidInputError: two rows share an id, or two opaque records a line
            (the keys of the tables; left unchecked they surfaced as an
            aborted transaction or 40 retried "conflicts"), or a row is not
            storable.
    """
    head = tx.one("SELECT next_seq, key_version FROM sessions WHERE id = ?", [session_id])
    created = head is None
    if not created or lease is not None:
        # A lease given is fenced even when the import creates the session (a
        # stale or forged one writes nothing); without one, creating a session
        # is outside the session-write rule, as sessions.create is.
        leases.fence_or_unheld(tx, session_target(session_id), lease)
    if created:
        deletes.refuse_deleted(tx, session_id)
        if sub_agent_of is not None:
            # As sessions.new_sub_agent: the parent's row is written (to its own
            # values), so a concurrent delete of the parent conflicts with this
            # transaction and, retried, deletes the new sub-agent with it.
            tx.count("UPDATE sessions SET updated_at = updated_at WHERE id = ?", [sub_agent_of])
        tx.exec(
            f"INSERT INTO sessions ({SESSION_COLS}, id_head) "
            "VALUES (?, ?, ?, ?, NULL, NULL, 0, 1, ?, ?, NULL, NULL, ?)",
            [
                session_id,
                cwd,
                created_at,
                created_at,
                header_json,
                sub_agent_of,
                session_id[:ID_HEAD],
            ],
        )
        version = tx.keys.new_session(tx, session_id)
        next_seq = 1
        live = None
    else:
        assert head is not None
        next_seq, version = head[0], head[1]
        live = tx.one("SELECT run_id FROM active_runs WHERE session_id = ?", [session_id])
    done = import_chunks.add_entries(
        tx,
        session_id,
        rows,
        next_seq,
        created,
        None if live is None else live[0],
        from_line > 1,
        version,
    )
    if done.added:
        now = tx.now
        tx.exec(
            "UPDATE sessions SET leaf_id = ?, next_seq = next_seq + ?, "
            f"entry_count = entry_count + ?, updated_at = greatest(updated_at, {NOW}), "
            "title = coalesce(?, title) WHERE id = ?",
            [leaf_id(), done.added, done.added, now, done.title, session_id],
        )
    lines = opaque()
    seen_lines: set[int] = set()
    for o in lines:
        if o[0] in seen_lines:
            raise errors.InvalidInputError("opaque", f"two opaque records for line {o[0]}")
        seen_lines.add(o[0])
    have_lines: set[int] = set()
    if not created:
        have_lines = {
            r[0]
            for r in tx.rows("SELECT line FROM opaque_records WHERE session_id = ?", [session_id])
        }
    if source and not created:
        # Lines of this file that were unparseable before and parse now (a
        # truncated last line the file has since completed) are no longer opaque.
        current = [o[0] for o in lines]
        tx.exec(
            "DELETE FROM opaque_records WHERE session_id = ? AND source = ? "
            "AND line >= ? AND line <> ALL(?::BIGINT[])",
            [session_id, source, from_line, current],
        )
        have_lines &= set(current)
    fresh = [o for o in lines if o[0] not in have_lines]
    if fresh:
        key, _ = tx.keys.sealing(tx, session_id, version)
        for line, raw, reason in fresh:
            if key is not None:
                raw = key.seal_text(opaque_record_id(source, line), RAW, raw)
            tx.exec(
                "INSERT INTO opaque_records VALUES (?, ?, ?, ?, ?)",
                [session_id, source, line, raw, reason],
            )
    return created, done.added, done.skipped, len(fresh), done.usage_added


_SOURCE = keyed("session_id", "source = ?")


def record_source(tx: Tx, session_id: str, read: ImportedSource) -> None:
    """Record what an import read of its file (``import_sources``), replacing
    what an earlier import of the same file recorded."""
    tx.exec(
        "INSERT INTO import_sources VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id, source) "
        "DO UPDATE SET bytes = excluded.bytes, sha256 = excluded.sha256, "
        "entries = excluded.entries",
        [session_id, read.source, read.bytes, read.sha256, read.entries],
    )


def imported_source(tx: Tx, session_id: str, source: str) -> ImportedSource | None:
    """What the last import of ``source`` into the session read, or ``None``."""
    row = tx.one(
        f"SELECT bytes, sha256, entries FROM import_sources WHERE {_SOURCE}",
        [session_id, source],
    )
    return None if row is None else ImportedSource(source, row[0], row[1], row[2])


RAW = "raw"
"""The field name an opaque line's text is sealed under (``opaque_records.raw``)."""


def opaque_record_id(source: str, line: int) -> str:
    """The record id an opaque line's ``raw`` is sealed under: ``<source>:<line>``
    (a value moved to another line or file fails to open)."""
    return f"{source}:{line}"


def opaque(tx: Tx, session_id: str) -> list[tuple[str, int, str, str]]:
    """Opaque (unparseable) lines kept for a session: (source, line, raw, reason),
    ``raw`` opened (clear) when the session's are sealed.

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: as
            ``Keyring.open_text`` (field ``raw``, record ``<source>:<line>``).
    """
    return [
        (
            r[0],
            r[1],
            tx.keys.open_text(tx, session_id, opaque_record_id(r[0], r[1]), RAW, r[2]),
            r[3],
        )
        for r in tx.rows(
            "SELECT source, line, raw, reason FROM opaque_records WHERE session_id = ? "
            "ORDER BY line",
            [session_id],
        )
    ]


# -- the store's methods ------------------------------------------------------------


class ImportsPart(Area):
    """Store parsed session files and their opaque lines."""

    def import_batch(self, batch: ImportBatch, *, lease: Lease | None = None) -> ImportResult:
        """Store a parsed session file: creates the session if needed and adds only
        entries it lacks (by entry id); the leaf moves to ``batch.leaf_id`` when
        anything is added; a session it creates is a sub-agent of
        ``batch.sub_agent_of`` when that is set (``sessions.sub_agents``).
        The usage each assistant message carries (pi's
        ``usage``) is recorded once, keyed by its entry (``store.usage.list``;
        an odd figure is recorded as unknown, never refusing the import).
        Re-importing the same file changes nothing. Into an
        existing session it is a session write: under the session's ``lease``,
        or while nobody holds it. A ``lease`` given is fenced even when the
        import creates the session, so a stale or forged one writes nothing.

        An import keeps every replayed context valid for a model provider, as
        every write does (``storage/pairing.py``): entries that would break
        the tool-call pairing on any branch of the session's tree (a result
        without its call, an assistant's calls followed by another message
        before their results …) refuse the whole import, because storing them
        under another form would invent a transcript the file does not hold.
        Real pi files pass (an aborted reply's partial calls need no result).
        For the same reason an import never makes a tree no write could: its
        entries' parents may not form a cycle (a cycle has no root, and the
        context along it depends on where replay starts), and while a run of
        the session has not ended, the ids the store will write for it
        (``<run>:assistant``, ``<run>:turn-end``, ``<run>:<call>:interrupted``
        …) are its own: an entry may not take one, nor name one as its
        missing parent. Entries with the store's ids of runs that ended (an
        exported session's) import as they are.

        ``batch.entries`` may be an :class:`~turnkeeper.spec.records.ImportStream`
        (``turnkeeper.formats.pi`` makes one per file): its entries are read
        as they are stored, 2,000 at a time (``storage/ops/import_chunks.py``
        ``CHUNK``), each checked, stored and judged in the one transaction, so
        memory holds a chunk, not the file; a refusal, or an error the stream
        raises (``SessionFileError``, ``OSError``), rolls back everything.
        Its ``leaf_id``, ``opaque`` and ``read`` replace the batch's.

        Raises:
            ToolCallPairingError: the entries break the tool-call pairing
                (``ToolCallsUnansweredError`` among them); nothing is written.
            EntryCycleError: the entries' parents would form a cycle
                (``entry_ids`` names it); nothing is written.
            EntryIdReservedError: an entry takes, or hangs under, an id of the
                session's run that has not ended (``reason`` ``"run"``, ``by``
                the run); nothing is written.
            InvalidInputError: an entry or header is not storable, or two
                entries share an id; nothing is written.
            LeaseLostError: ``lease`` is no longer valid (nothing is written,
                not even a new session).
            BusyError: no ``lease`` given and someone holds the session.
            KeyUnavailableError: the store is encrypted and the session's
                data key cannot be had (opened without ``encryption=``, or
                the provider cannot unwrap it); nothing is written.
        """
        check_id(batch.session_id, "session_id")
        check_instant(batch.created_at, "created_at")
        check_session_lease(batch.session_id, lease)
        header_json = to_json(dict(batch.header), "header")
        stream = batch.entries if isinstance(batch.entries, ImportStream) else None
        if stream is None:
            # A whole batch in hand: every entry and line is checked before any I/O.
            checked = [_row(e) for e in batch.entries]
            lines = _opaque(batch.opaque)
        source = batch.source or (batch.opaque[0].source if batch.opaque else "")
        if batch.sub_agent_of is not None:
            check_id(batch.sub_agent_of, "sub_agent_of")
        if batch.read is not None:
            _check_read(batch.read)

        def body(tx: Tx) -> ImportResult:
            if stream is None:
                rows: Iterable[import_chunks.Row] = checked
                leaf: Callable[[], str | None] = lambda: batch.leaf_id  # noqa: E731
                opaque: Callable[[], Sequence[tuple[int, str, str]]] = lambda: lines  # noqa: E731
            else:  # checked as it is read, inside the transaction: refused, it writes nothing
                rows = map(_row, stream)
                leaf = lambda: stream.leaf_id  # noqa: E731
                opaque = lambda: _opaque(stream.opaque)  # noqa: E731
            created, added, skipped, opaque_added, usage_added = import_rows(
                tx,
                batch.session_id,
                batch.cwd,
                header_json,
                batch.created_at,
                rows,
                leaf,
                opaque,
                source,
                lease,
                batch.sub_agent_of,
                1 if stream is None else stream.from_line,
            )
            read = batch.read if stream is None else stream.read
            if read is not None:
                if stream is not None:
                    _check_read(read)
                record_source(tx, batch.session_id, read)
            return ImportResult(
                batch.session_id, created, added, skipped, opaque_added, usage_added
            )

        return self._fenced("import", lease, body)

    def imported_source(self, session_id: str, source: str) -> ImportedSource | None:
        """What the last import of the file ``source`` (its resolved path) into the
        session read (``ImportBatch.read``: bytes, their sha256, the file's
        entries), or ``None`` when none recorded it (an import by an older
        turnkeeper, or of another path). An importer reads this before parsing:
        a file whose size and digest match was imported whole and adds nothing
        (``turnkeeper.formats`` skips a pi, Claude Code or Codex file so), and
        a pi file whose first ``bytes`` still hash to ``sha256`` has only grown
        (its import reads from there). Deleting the session deletes it.

        Raises:
            InvalidInputError: a bad ``session_id`` or ``source``.
        """
        check_id(session_id, "session_id")
        check_text(source, "source", allow_empty=False)
        return self.db.read("imported_source", lambda tx: imported_source(tx, session_id, source))

    def opaque_records(self, session_id: str) -> list[OpaqueRecord]:
        """Unparseable lines kept from imports of this session, by line, their
        ``raw`` text clear (in an encrypted store it is stored sealed under the
        session's data key, record id ``<source>:<line>``, field ``raw``).

        Raises:
            SessionNotFoundError: no such session.
            KeyUnavailableError: the session's lines are sealed and the store
                was opened without its key (``key_id`` ``None``), or the
                provider cannot unwrap the session's data key.
            PayloadAuthenticationError: a stored ``raw`` fails authentication
                (a flipped byte, moved from another line, file or session), or
                is clear in a session whose payloads are sealed.
        """
        check_id(session_id, "session_id")
        rows = self._inside(
            session_id, self.db.read("opaque_records", lambda tx: opaque(tx, session_id))
        )
        return [OpaqueRecord(*r) for r in rows]


def _row(e: ImportEntry) -> import_chunks.Row:
    """An entry of a batch, checked, as a row to import."""
    check_id(e.id, "entry.id")
    validate_payload(e.kind, e.payload, strict=False)
    ts = check_instant(e.timestamp, "entry.timestamp")
    payload = dict(e.payload)
    return (e.id, e.parent_id, e.kind, ts, to_json(payload, "payload"), payload)


def _opaque(records: Sequence[OpaqueRecord]) -> list[tuple[int, str, str]]:
    """A batch's opaque lines, checked: ``(line, raw, reason)``."""
    return [(o.line, check_text(o.raw, "raw"), o.reason) for o in records]


def _check_read(read: ImportedSource) -> None:
    check_text(read.source, "read.source", allow_empty=False)
    for name in ("bytes", "entries"):
        value = getattr(read, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise errors.InvalidInputError(f"read.{name}", "not a non-negative int")
    digest = read.sha256
    if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
        raise errors.InvalidInputError("read.sha256", "not 64 lowercase hex digits")
