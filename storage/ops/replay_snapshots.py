"""Stored replay snapshots: a branch's replayed context kept in the database
(``replay_snapshots``, schema version 29), so that a fresh process or store
object replays a long session from one stored value plus the entries after
it, instead of reading and decoding every entry of the branch.

A snapshot is derived from the entries, never their source of truth. It is
the replay (``sessions.replay``) of the session as its row stood at
``(leaf_id, next_seq)``: its context messages and their entry ids as
arrays in parts of :data:`PART` messages (msgpack, which ``ormsgpack`` decodes
faster than JSON, and holds every JSON value; each part with the
CRC-32 of its header and contents, checked on every read), the model and
the thinking level, and ``rooted`` (the branch starts at an entry without a
parent). ``storage.ops.replays`` uses it only where the session row says it
still holds, by the same rules as its in-process cache: served as is when
the row's ``(leaf_id, next_seq)`` equals the snapshot's (every write of
entries moves ``next_seq``; a branch move changes ``leaf_id``); carried on
along the entries at or above its ``next_seq`` when it is rooted and the
walk from the row's leaf reaches its leaf through those entries alone, none
of them a compaction; else ignored (another branch, a new compaction, an
import that supplied a missing parent, a fork: a new session has none), and
a part whose digest or header disagrees makes the replay read the rows.

Written lazily by the reader, fenced: a replay that decoded at least
:data:`PERSIST_ROWS` entry rows (a whole branch, or a long tail past a
snapshot) stores its result in a write of its own after the read. That
write locks the session row (PostgreSQL ``FOR UPDATE``; DuckDB serializes
its writes), stores nothing for a session deleted meanwhile, and never
replaces a snapshot taken at a later ``next_seq``; it replaces every part at
once. Failing to store one (a lost race, a full disk, a read-only store)
fails nothing: the replay was already made. Appends and turns write no
snapshot, so their cost is unchanged; a session's delete removes its
snapshot with its entries (``deletes.REMOVED``).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import ormsgpack

from turnkeeper.spec import errors
from turnkeeper.spec.records import Entry, Replay

from ..backend import Backend, Tx
from ..codec import from_json, stored_json
from ..replay import context_message, path_settings

PART = 16384
"""Context messages per stored part: a part's text is decoded and let go
before the next is read, so a replay holds one part's bytes beside its result."""
PERSIST_ROWS = 256
"""A replay that decoded at least this many entry rows stores a snapshot."""
_SKIPPED = (
    errors.TransactionConflictError,
    errors.DiskFullError,
    errors.ReadOnlyError,
    errors.StoreInvalidatedError,
    errors.BusyError,
)
"""Failures of a snapshot's write that leave the replay standing (nothing stored)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored snapshot's header (part 0's row), and part 0's contents when
    they were read with it."""

    parts: int
    leaf_id: str | None
    next_seq: int
    rooted: bool
    model: str | None
    thinking: str
    first: tuple[bytes, bytes, str] | None


def head(
    tx: Tx, session_id: str, *, with_first: bool
) -> tuple[str | None, int, Stored | None] | None:
    """The session row's ``(leaf_id, next_seq)`` and its stored snapshot's
    header (with part 0's contents when ``with_first``), in one statement;
    ``None`` when there is no such session."""
    more = ", r.messages, r.entry_ids, r.digest" if with_first else ""
    sql = (
        "SELECT s.leaf_id, s.next_seq, r.parts, r.leaf_id, r.next_seq, r.rooted, r.model, "
        f"r.thinking{more} FROM sessions s LEFT JOIN (SELECT * FROM replay_snapshots "
        "WHERE session_id = ? AND part = 0) r ON true WHERE s.id = ?"
    )
    if with_first:
        found = tx.rows(sql, [session_id, session_id], binary=True)
        row = found[0] if found else None
    else:
        row = tx.one(sql, [session_id, session_id])
    if row is None:
        return None
    if row[2] is None:
        return row[0], row[1], None
    first = (_bytes(row[8]), _bytes(row[9]), row[10]) if with_first else None
    return row[0], row[1], Stored(row[2], row[3], row[4], row[5], row[6], row[7], first)


def _bytes(value: Any) -> bytes:
    """A ``BYTEA`` value as ``bytes`` (a driver may give a ``memoryview``)."""
    return value if isinstance(value, bytes) else bytes(value)


def _digest(session_id: str, part: int, stored: Stored, messages: bytes, ids: bytes) -> str:
    """A part's check value: CRC-32 of its header, its ids and its messages
    (``crc32:`` and 8 hex digits). It catches a damaged or misplaced part on
    every read at a fraction of a decode's cost; it is no defence against a
    writer of the database, who could as well change the entries."""
    header = [session_id, part, stored.parts, stored.leaf_id, stored.next_seq, stored.rooted]
    crc = zlib.crc32(orjson.dumps([*header, stored.model, stored.thinking]))
    crc = zlib.crc32(messages, zlib.crc32(b"\0" + ids + b"\0", crc))
    return f"crc32:{crc:08x}"


def load(tx: Tx, session_id: str, stored: Stored) -> Replay | None:
    """The stored snapshot's replay (fresh objects), or ``None`` when a part is
    missing, belongs to another snapshot or fails its digest (then the caller
    replays from the rows)."""
    if stored.parts < 1:  # a header naming no part to check is damage too
        return None
    messages: list[Any] = []
    ids: list[str] = []
    for part in range(stored.parts):
        if part == 0 and stored.first is not None:
            text, id_text, digest = stored.first
        else:
            found = tx.rows(
                "SELECT messages, entry_ids, digest FROM replay_snapshots "
                "WHERE session_id = ? AND part = ?",
                [session_id, part],
                binary=True,
            )
            if not found:
                return None
            text, id_text, digest = _bytes(found[0][0]), _bytes(found[0][1]), found[0][2]
        if _digest(session_id, part, stored, text, id_text) != digest:
            return None
        messages.extend(ormsgpack.unpackb(text))
        ids.extend(ormsgpack.unpackb(id_text))
        del text, id_text
    if len(messages) != len(ids):
        return None
    model = None if stored.model is None else from_json(stored.model)
    return Replay(tuple(messages), tuple(ids), model, stored.thinking)


def carried_on(replay: Replay, tail: Sequence[Entry]) -> Replay:
    """``replay`` carried on along ``tail`` (entries after its leaf, root first,
    none a compaction): their context messages follow, the settings move on."""
    messages, ids = list(replay.messages), list(replay.entry_ids)
    for entry in tail:
        message = context_message(entry)
        if message is not None:
            messages.append(message)
            ids.append(entry.id)
    model, thinking = path_settings(tail, replay.model, replay.thinking_level)
    return Replay(tuple(messages), tuple(ids), model, thinking)


@dataclass(frozen=True, slots=True)
class Pending:
    """A snapshot to store after the read that made it."""

    replay: Replay
    rooted: bool
    leaf_id: str | None
    next_seq: int


def store(db: Backend, session_id: str, pending: Pending) -> None:
    """Store ``pending`` as the session's snapshot (see the module docstring),
    unless the store is read-only, the session is gone, or a snapshot at a later
    ``next_seq`` is stored (one at this very row is replaced: a replay asks to
    store one there only when the stored one failed its check, or raced it); a
    failure in :data:`_SKIPPED` stores nothing and is not raised (the replay
    stands)."""
    if db.read_only:
        return
    replay = pending.replay
    count = len(replay.messages)
    model = None if replay.model is None else stored_json(replay.model)
    header = Stored(
        max(1, -(-count // PART)),
        pending.leaf_id,
        pending.next_seq,
        pending.rooted,
        model,
        replay.thinking_level,
        None,
    )

    def body(tx: Tx) -> None:
        row = tx.one(
            f"SELECT next_seq FROM sessions WHERE id = ?{tx.dialect.update_lock()}", [session_id]
        )
        if row is None or row[0] != header.next_seq:
            return  # deleted, or written since: a later replay stores its own
        have = tx.one(
            "SELECT next_seq, leaf_id FROM replay_snapshots WHERE session_id = ? AND part = 0",
            [session_id],
        )
        if have is not None and have[0] > header.next_seq:
            return  # a later one is stored; one at this very row is replaced (it was damaged)
        tx.exec("DELETE FROM replay_snapshots WHERE session_id = ?", [session_id])
        for part in range(header.parts):
            at = part * PART
            text = ormsgpack.packb(replay.messages[at : at + PART])
            id_text = ormsgpack.packb(replay.entry_ids[at : at + PART])
            tx.exec(
                "INSERT INTO replay_snapshots (session_id, part, parts, leaf_id, next_seq, "
                "rooted, model, thinking, messages, entry_ids, digest) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    session_id,
                    part,
                    header.parts,
                    header.leaf_id,
                    header.next_seq,
                    header.rooted,
                    header.model,
                    header.thinking,
                    text,
                    id_text,
                    _digest(session_id, part, header, text, id_text),
                ],
            )

    try:
        db.write("store_replay_snapshot", body)
    except (*_SKIPPED, ormsgpack.MsgpackEncodeError):
        pass  # a message msgpack cannot hold (none that JSON holds) is replayed from the rows
