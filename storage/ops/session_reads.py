"""Reads of one session: message paging by sequence, the latest settings on the
branch, the header and the execution facts (session seed ListSessionMessages*,
Manager.GetLatest*, GetHeader, ReadSessionExecutionFacts).

``entries_after`` pages through every entry of the session the same way.
Message paging reads a session's ``message`` entries by ``seq`` (the
``(session_id, seq)`` key on PostgreSQL; on DuckDB a read of the session's
rows, as a replay is). ``after``/``before``/``latest`` page through every
stored message (all branches: the seq cursor is the store's, not the
branch's); ``messages_with_seq`` is the replayed context with each message's
cursor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import (
    Entry,
    ExecutionFacts,
    LeaseSnapshot,
    SequencedMessage,
)
from turnkeeper.spec.run import NON_TERMINAL

from ..backend import Tx, present, utc
from ..codec import check_id, check_text
from ..replay import build_replay
from ..validate import check_int, check_limit
from . import archives, entry_rows, recovery, session_rows
from .base import Area
from .leases import NOW
from .run_reads import RUN_COLS, run_row

_MESSAGES = "SELECT seq, id, payload FROM entries WHERE session_id = ? AND kind = 'message'"
_NON_TERMINAL = sorted(s.value for s in NON_TERMINAL)


def _known(tx: Tx, session_id: str) -> None:
    if tx.one("SELECT 1 FROM sessions WHERE id = ?", [session_id]) is None:
        raise errors.SessionNotFoundError(session_id)


def _page(
    tx: Tx, session_id: str, cond: str, params: Sequence[Any], order: str, limit: int
) -> list[SequencedMessage]:
    _known(tx, session_id)
    rows = tx.rows(f"{_MESSAGES}{cond} ORDER BY seq {order} LIMIT ?", [session_id, *params, limit])
    return [
        SequencedMessage(r[0], r[1], entry_rows.payload_of(tx, session_id, r[1], r[2])["message"])
        for r in rows
    ]


def entries_after(tx: Tx, session_id: str, after_seq: int, offset: int, limit: int) -> list[Entry]:
    """A page of the session's entries in sequence order: those with ``seq >
    after_seq``, the first ``offset`` of them skipped, at most ``limit``."""
    _known(tx, session_id)
    rows = tx.rows(
        f"SELECT {entry_rows.entry_columns(tx)} FROM entries WHERE session_id = ? AND seq > ? "
        "ORDER BY seq LIMIT ? OFFSET ?",
        [session_id, after_seq, limit, offset],
    )
    return [entry_rows.entry_row(tx, r) for r in rows]


def with_seq(tx: Tx, session_id: str) -> list[SequencedMessage]:
    """The replayed messages of the current branch, each with its entry's seq."""
    head = tx.one("SELECT leaf_id FROM sessions WHERE id = ?", [session_id])
    if head is None:
        raise errors.SessionNotFoundError(session_id)
    path = entry_rows.path_to_leaf(tx, session_id, head[0])
    seqs = {e.id: e.seq for e in path}
    replay = build_replay(path)
    return [
        SequencedMessage(seqs[i], i, m)
        for i, m in zip(replay.entry_ids, replay.messages, strict=True)
    ]


def latest(tx: Tx, session_id: str, kind: str) -> Entry | None:
    """The newest entry of ``kind`` on the session's current branch."""
    head = tx.one("SELECT leaf_id FROM sessions WHERE id = ?", [session_id])
    if head is None:
        raise errors.SessionNotFoundError(session_id)
    path = entry_rows.path_to_leaf(tx, session_id, head[0])
    return next((e for e in reversed(path) if e.kind == kind), None)


def facts(tx: Tx, session_id: str) -> ExecutionFacts:
    """The session's execution facts in this transaction's snapshot."""
    now = utc(present(tx.one(f"SELECT {NOW}", [tx.now]), "now")[0])
    exists = tx.one("SELECT 1 FROM sessions WHERE id = ?", [session_id]) is not None
    runs = tx.rows(
        f"SELECT {RUN_COLS} FROM runs WHERE session_id = ? "
        f"AND status IN ({', '.join('?' * len(_NON_TERMINAL))}) ORDER BY started_at, id",
        [session_id, *_NON_TERMINAL],
    )
    active = tuple(run_row(r) for r in runs)
    row = tx.one(
        "SELECT target, owner, epoch, purpose, state, expires_at FROM leases WHERE target = ?",
        [session_target(session_id)],
    )
    lease = None
    if row is not None:
        expires = utc(row[5])
        lease = LeaseSnapshot(
            row[0], row[1], row[2], row[3], row[4], expires, row[4] == "held" and expires > now
        )
    found = (recovery.get(tx, r.id) for r in active)
    remote = archives.linked_run(tx, session_id, active[0].id) if len(active) == 1 else None
    return ExecutionFacts(
        session_id, exists, now, active, lease, tuple(r for r in found if r), remote
    )


def _stamp(value: Any) -> str:
    text: str = value.astimezone(UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


class SessionReadsPart(Area):
    """Message paging, the latest settings, the header and the execution facts."""

    def messages_after(
        self, session_id: str, after_seq: int, *, limit: int = 100
    ) -> list[SequencedMessage]:
        """Stored messages with ``seq > after_seq``, oldest first, at most ``limit``
        (session seed ListSessionMessagesAfter; ``after_seq=0`` starts at the first).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a negative ``after_seq`` or a bad ``limit``.
        """
        check_id(session_id, "session_id")
        check_int(after_seq, "after_seq", 0)
        check_limit(limit)
        return self.db.read(
            "messages_after",
            lambda tx: _page(tx, session_id, " AND seq > ?", [after_seq], "ASC", limit),
            snapshot=True,
        )

    def messages_before(
        self, session_id: str, before_seq: int, *, limit: int = 100
    ) -> list[SequencedMessage]:
        """Stored messages with ``seq < before_seq``, newest first, at most ``limit``
        (session seed ListSessionMessagesBefore).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a negative ``before_seq`` or a bad ``limit``.
        """
        check_id(session_id, "session_id")
        check_int(before_seq, "before_seq", 0)
        check_limit(limit)
        return self.db.read(
            "messages_before",
            lambda tx: _page(tx, session_id, " AND seq < ?", [before_seq], "DESC", limit),
            snapshot=True,
        )

    def messages_latest(self, session_id: str, *, limit: int = 100) -> list[SequencedMessage]:
        """The ``limit`` newest stored messages, newest first (session seed
        ListSessionMessagesLatest).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad ``limit``.
        """
        check_id(session_id, "session_id")
        check_limit(limit)
        return self.db.read(
            "messages_latest",
            lambda tx: _page(tx, session_id, "", [], "DESC", limit),
            snapshot=True,
        )

    def entries_after(
        self, session_id: str, after_seq: int = 0, *, offset: int = 0, limit: int = 100
    ) -> list[Entry]:
        """A page of the session's entries (every branch) in sequence (append)
        order: those with ``seq > after_seq`` (``0``: from the first), the first
        ``offset`` of them skipped, at most ``limit``; page on with the last
        one's ``seq``. ``turnkeeper sessions show`` prints a big session this
        way, a page at a time, never holding the whole session.

        Cost: one statement reading the page's rows (the ``(session_id, seq)``
        key on PostgreSQL; on DuckDB a scan of the session's rows that hands
        over only the page, as message paging does).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a negative ``after_seq`` or ``offset``, a bad ``limit``.
        """
        check_id(session_id, "session_id")
        check_int(after_seq, "after_seq", 0)
        check_int(offset, "offset", 0)
        check_limit(limit)
        return self.db.read(
            "entries_after",
            lambda tx: entries_after(tx, session_id, after_seq, offset, limit),
            snapshot=True,
        )

    def messages_with_seq(self, session_id: str) -> list[SequencedMessage]:
        """The replayed context of the current branch (``replay().messages``, compaction
        applied), each with the seq of the entry it came from (session seed
        ListSessionMessagesWithSeq).

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self.db.read("messages_with_seq", lambda tx: with_seq(tx, session_id), snapshot=True)

    def latest(self, session_id: str, kind: str) -> Entry | None:
        """The newest entry of ``kind`` on the current branch, or ``None`` (session seed
        GetLatestCompaction, GetLatestModelChange, GetLatestModeChange,
        GetLatestThinkingLevelChange, GetLatestAdditionalDirectories: ``kind`` is
        ``EntryKind.COMPACTION``, ``MODEL_CHANGE``, ``MODE_CHANGE``,
        ``THINKING_LEVEL_CHANGE`` or ``ADDITIONAL_DIRECTORIES``; any kind works).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad ``kind``.
        """
        check_id(session_id, "session_id")
        check_text(kind, "kind", allow_empty=False)
        return self.db.read(
            "latest_entry", lambda tx: latest(tx, session_id, str(kind)), snapshot=True
        )

    def header(self, session_id: str) -> Mapping[str, Any]:
        """The session header as the seed's ``Header`` line has it (session seed
        GetHeader): ``type`` (``"session"``), ``version`` (3), ``id``,
        ``timestamp`` (creation time, ISO 8601 UTC with milliseconds), ``cwd``,
        then the stored header fields (``parentSession``, ``forkKind`` …), and
        ``channelType`` and ``channelId`` of its current binding (``store.bindings``)
        when it is bound, in place of any the stored header holds (a local
        session's are the stored header's, as an imported file had them).

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        s = self.db.read("get_session", lambda tx: session_rows.get(tx, session_id))
        if s is None:
            raise errors.SessionNotFoundError(session_id)
        first = {"type": "session", "version": 3, "id": s.id, "timestamp": _stamp(s.created_at)}
        bound = (
            {}
            if s.channel_type is None
            else {"channelType": s.channel_type, "channelId": s.channel_id}
        )
        skip = {*first, "cwd", *bound}
        return {
            **first,
            "cwd": s.cwd,
            **{k: v for k, v in s.header.items() if k not in skip},
            **bound,
        }

    def execution_facts(self, session_id: str) -> ExecutionFacts:
        """The session's durable execution facts from one snapshot and one sample of
        the store's clock (session seed ReadSessionExecutionFacts): no process-local
        state is consulted. An unknown session gives ``session_exists=False``.
        ``remote_run`` is the remote run record of the one active run (see
        :class:`~turnkeeper.spec.records.ExecutionFacts`).

        Raises:
            InvalidInputError: a bad ``session_id``.
        """
        check_id(session_id, "session_id")
        return self.db.read("execution_facts", lambda tx: facts(tx, session_id), snapshot=True)
