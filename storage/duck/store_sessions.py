"""Sessions, entries, branches, replay, listings and imports of the DuckDB store."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import uuid6

from turnkeeper.spec import errors
from turnkeeper.spec.entries import RESERVED_ENTRY_SUFFIXES, EntryKind, validate_payload
from turnkeeper.spec.records import (
    ANY_LEAF,
    Entry,
    ImportBatch,
    ImportResult,
    Lease,
    OpaqueRecord,
    Replay,
    Session,
    SessionPage,
)

from ..codec import check_id, check_text, to_json, to_json_exact
from ..validate import (
    check_expected_leaf,
    check_header,
    check_limit,
    check_session_lease,
)
from . import sessions
from .db import Tx
from .store_base import StoreBase


def _aware(value: datetime | None, field: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise errors.InvalidInputError(field, "must be an aware datetime (with a time zone)")
    return value


def new_entry_id() -> str:
    """A random 16-hex entry id (64 bits, as the session seed's GenerateID)."""
    return secrets.token_hex(8)


class SessionsMixin(StoreBase):
    """Session operations (session seed Store/Manager)."""

    def create_session(
        self,
        session_id: str | None = None,
        *,
        cwd: str = "",
        header: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> Session:
        """Create an empty session (a UUIDv7 id when ``session_id`` is None).

        ``header`` holds extra header fields kept verbatim.

        Raises:
            SessionIDExistsError: the id is taken; the existing session is untouched.
            InvalidInputError: bad id, cwd, header or naive ``created_at``.
        """
        sid = str(uuid6.uuid7()) if session_id is None else session_id
        check_id(sid, "session_id")
        check_text(cwd, "cwd")
        header_json = to_json(check_header(header), "header")
        _aware(created_at, "created_at")
        return self.db.write(
            "create_session", lambda tx: sessions.create(tx, sid, cwd, header_json, created_at)
        )

    def get_session(self, session_id: str) -> Session | None:
        """The session, or ``None`` when there is none with this id."""
        check_id(session_id, "session_id")
        return self.db.read("get_session", lambda tx: sessions.get(tx, session_id))

    def append(
        self,
        session_id: str,
        kind: str,
        payload: Mapping[str, Any],
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        entry_id: str | None = None,
        timestamp: datetime | None = None,
    ) -> Entry:
        """Append an entry under the current leaf; it becomes the leaf (as in pi).

        ``kind`` is one of the seed's entry kinds and ``payload`` its fields
        (``{"message": {...}}`` for a message …). With ``expected_leaf`` the
        append is a compare-and-set on the leaf; without it the leaf is read
        and written in one transaction. With ``lease`` the lease is validated
        in that transaction and its epoch stored on the entry.

        The replayed context stays valid for a model provider: a
        ``toolResult`` message must answer a ``toolCall`` that is in the
        context replay builds at the leaf and not yet answered there, and a
        compaction may not keep a ``toolResult`` while cutting off its call
        (``firstKeptEntryId`` between them). Both are refused rather than
        stored in another form, because only the runtime knows what the result
        belongs to: a silently re-parented or dropped result would be a second
        invention. (Imports store what the file says; ``turnkeeper audit``
        reports every unpaired result and every cut that splits a pair.)

        Raises:
            SessionModifiedError: the leaf is not ``expected_leaf``.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
            ToolCallPairingError: the ``toolResult`` or compaction would break
                the tool-call pairing of the replayed context.
            SessionNotFoundError, EntryExistsError (``entry_id`` taken),
            EntryNotFoundError (a label's target is missing),
            InvalidInputError (kind, payload, id or naive timestamp).
        On any error nothing is written.
        """
        check_id(session_id, "session_id")
        if not isinstance(payload, Mapping):
            raise errors.InvalidInputError("payload", "expected a mapping")
        validate_payload(kind, payload)
        payload_json, stored = to_json_exact(dict(payload), "payload")
        chose = entry_id is not None
        eid = entry_id if entry_id is not None else new_entry_id()
        check_id(eid, "entry_id")
        if chose and eid.endswith(RESERVED_ENTRY_SUFFIXES):
            raise errors.InvalidInputError(
                "entry_id", f"ids ending {', '.join(RESERVED_ENTRY_SUFFIXES)} are the store's own"
            )
        check_expected_leaf(expected_leaf)
        ts = _aware(timestamp, "timestamp")
        check_session_lease(session_id, lease)
        return self._fenced(
            "append",
            lease,
            lambda tx: sessions.append(
                tx,
                session_id,
                kind,
                payload_json,
                stored,
                entry_id=eid,
                caller_chose_id=chose,
                timestamp=ts,
                expected_leaf=expected_leaf,
                lease=lease,
                pairing=True,
            ),
        )

    def branch(
        self,
        session_id: str,
        entry_id: str | None,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
    ) -> None:
        """Move the leaf to ``entry_id`` (pi ``branch``); ``None`` resets it (``resetLeaf``).

        With ``lease`` (on ``session:<session_id>``) the move is fenced like an append.

        Raises:
            SessionNotFoundError, EntryNotFoundError, SessionModifiedError,
            LeaseLostError, InvalidInputError.
        """
        check_id(session_id, "session_id")
        if entry_id is not None:
            check_id(entry_id, "entry_id")
        check_expected_leaf(expected_leaf)
        check_session_lease(session_id, lease)
        self._fenced(
            "branch",
            lease,
            lambda tx: sessions.move_leaf(tx, session_id, entry_id, expected_leaf, lease),
        )

    def branch_with_summary(
        self,
        session_id: str,
        entry_id: str,
        summary: str,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        details: Any = None,
    ) -> Entry:
        """Branch to ``entry_id`` and append a ``branch_summary`` of the abandoned path
        (pi ``branchWithSummary``): its parent is ``entry_id`` and its ``fromId``
        the leaf it leaves. One transaction.

        Raises:
            as :meth:`append`, plus EntryNotFoundError when ``entry_id`` is missing.
        """
        check_id(session_id, "session_id")
        check_text(summary, "summary")
        check_id(entry_id, "entry_id")
        check_expected_leaf(expected_leaf)
        check_session_lease(session_id, lease)
        to_json(details, "details")

        def body(tx: Tx) -> Entry:
            head = sessions.get(tx, session_id)
            if head is None:
                raise errors.SessionNotFoundError(session_id)
            payload: dict[str, Any] = {"summary": summary, "fromId": head.leaf_id or "root"}
            if details is not None:
                payload["details"] = details
            payload_json = to_json(payload, "details")
            return sessions.append(
                tx,
                session_id,
                EntryKind.BRANCH_SUMMARY,
                payload_json,
                payload,
                entry_id=new_entry_id(),
                caller_chose_id=False,
                timestamp=None,
                expected_leaf=expected_leaf,
                lease=lease,
                parent_override=entry_id,
            )

        return self._fenced("branch_with_summary", lease, body)

    def set_label(
        self,
        session_id: str,
        target_id: str,
        label: str | None,
        *,
        lease: Lease | None = None,
    ) -> Entry:
        """Label ``target_id`` (``None`` clears), as a ``label`` entry under the leaf."""
        payload: dict[str, Any] = {"targetId": target_id}
        if label is not None:
            payload["label"] = label
        return self.append(session_id, EntryKind.LABEL, payload, lease=lease)

    def set_title(
        self, session_id: str, name: str, *, source: str | None = None, lease: Lease | None = None
    ) -> Entry:
        """Title the session with a ``session_info`` entry (the latest one wins)."""
        payload: dict[str, Any] = {"name": name}
        if source is not None:
            payload["source"] = source
        return self.append(session_id, EntryKind.SESSION_INFO, payload, lease=lease)

    def entries(self, session_id: str) -> list[Entry]:
        """Every entry of the session, in sequence (append) order.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(
            session_id, self.db.read("entries", lambda tx: sessions.entries(tx, session_id))
        )

    def entry(self, session_id: str, entry_id: str) -> Entry | None:
        """One entry, or ``None``."""
        check_id(session_id, "session_id")
        check_id(entry_id, "entry_id")
        return self.db.read("entry", lambda tx: sessions.entry(tx, session_id, entry_id))

    def replay(self, session_id: str) -> Replay:
        """The current branch with compaction applied (session seed GetReplayState).

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self.db.read("replay", lambda tx: sessions.replay(tx, session_id), snapshot=True)

    def labels(self, session_id: str) -> dict[str, str]:
        """Current labels: target entry id → label.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(
            session_id, self.db.read("labels", lambda tx: sessions.labels(tx, session_id))
        )

    def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, search: str | None = None
    ) -> SessionPage:
        """Sessions newest first; ``search`` matches id, cwd, title and message text.

        Pass the page's ``next_cursor`` to continue; pages are stable under
        concurrent appends (keyset on creation time and id).

        Raises:
            InvalidInputError: ``limit`` below 1 or a foreign cursor.
        """
        check_limit(limit)
        if search is not None:
            check_text(search, "search")
        if cursor is not None:
            check_text(cursor, "cursor", allow_empty=False)
        return self.db.read(
            "list_sessions", lambda tx: sessions.list_page(tx, limit, cursor, search)
        )

    def count_sessions(self, *, search: str | None = None) -> int:
        """Number of sessions (matching ``search`` when given)."""
        if search is not None:
            check_text(search, "search")
        return self.db.read("count_sessions", lambda tx: sessions.count(tx, search))

    # -- imports -----------------------------------------------------------------

    def import_batch(self, batch: ImportBatch, *, lease: Lease | None = None) -> ImportResult:
        """Store a parsed session file: creates the session if needed and adds only
        entries it lacks (by entry id); the leaf moves to ``batch.leaf_id`` when
        anything is added. Re-importing the same file changes nothing. Into an
        existing session it is a session write: under the session's ``lease``,
        or while nobody holds it.

        Raises:
            InvalidInputError: an entry or header is not storable.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        """
        check_id(batch.session_id, "session_id")
        check_session_lease(batch.session_id, lease)
        header_json = to_json(dict(batch.header), "header")
        rows = []
        for e in batch.entries:
            check_id(e.id, "entry.id")
            validate_payload(e.kind, e.payload, strict=False)
            rows.append(
                (e.id, e.parent_id, e.kind, e.timestamp, to_json(dict(e.payload), "payload"))
            )
        opaque = [(o.line, check_text(o.raw, "raw"), o.reason) for o in batch.opaque]
        source = batch.source or (batch.opaque[0].source if batch.opaque else "")

        def body(tx: Tx) -> ImportResult:
            created, added, opaque_added = sessions.import_rows(
                tx,
                batch.session_id,
                batch.cwd,
                header_json,
                batch.created_at,
                rows,
                batch.leaf_id,
                opaque,
                source,
                lease,
            )
            return ImportResult(batch.session_id, created, added, len(rows) - added, opaque_added)

        return self._fenced("import", lease, body)

    def opaque_records(self, session_id: str) -> list[OpaqueRecord]:
        """Unparseable lines kept from imports of this session, by line.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        rows = self._inside(
            session_id, self.db.read("opaque_records", lambda tx: sessions.opaque(tx, session_id))
        )
        return [OpaqueRecord(*r) for r in rows]
