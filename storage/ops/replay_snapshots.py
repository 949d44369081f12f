"""Stored replay snapshots: a branch's replayed context kept in the database
(``replay_snapshots``, schema version 31, format :data:`FORMAT`), so that a
fresh process or store object replays a long session from one stored value
plus the entries after it, instead of reading and decoding every entry of
the branch.

A snapshot is derived from the entries, never their source of truth. It is
the replay (``sessions.replay``) of the session as its row stood at
``(leaf_id, next_seq)``: its context messages and their entry ids in parts
of at most :data:`PART` messages and :data:`PART_BYTES` bytes, each part one
row under ``part_key`` (see :func:`key`) whose body is a Zstandard frame of
the msgpack array ``[entry ids, messages]`` (the ids one string: see
:data:`FORMAT`; msgpack holds every JSON value,
and ``ormsgpack`` decodes it faster than JSON; the frame decodes into one
buffer of the size it states), with the CRC-32 of the part's header and
body, checked on every read; the model and the thinking level; and
``rooted`` (the branch starts at an entry without a parent). A read fetches
one part at a time through the one-column key (DuckDB reads a row through an
index only for one filter on one indexed column) and lets its bytes go
before the next, so a replay holds one part's decoded bytes beside its
result, and the database holds and caches only the compressed ones.
``storage.ops.replays`` uses a snapshot only where the session row says it
still holds, by the same rules as its in-process cache: served as is when
the row's ``(leaf_id, next_seq)`` equals the snapshot's (every write of
entries moves ``next_seq``; a branch move changes ``leaf_id``); carried on
along the entries at or above its ``next_seq`` when it is rooted and the
walk from the row's leaf reaches its leaf through those entries alone, none
of them a compaction; else ignored (another branch, a new compaction, an
import that supplied a missing parent, a fork: a new session has none). A
part whose digest or header disagrees, that does not decode, or of another
format makes the replay read the rows (and store its snapshot in its place).

Written lazily by the reader, fenced: a replay that decoded at least
:data:`PERSIST_ROWS` entry rows (a whole branch, or a long tail past a
snapshot) stores its result in a write of its own after the read. That
write locks the session row (PostgreSQL ``FOR UPDATE``; DuckDB serializes
its writes), stores nothing for a session deleted meanwhile, and never
replaces a snapshot taken at a later ``next_seq``; it replaces every part at
once. Failing to store one (a lost race, a full disk, a read-only store)
fails nothing: the replay was already made. In a session whose payloads
are sealed (encryption at rest) each part's body is sealed under the
session's data key (record id its ``part_key``, field :data:`MESSAGES`),
read and written as above. Appends and turns write no
snapshot, so their cost is unchanged; a session's delete removes its
snapshot with its entries (``deletes.REMOVED``).
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import ormsgpack
import zstandard

from turnkeeper.spec import errors
from turnkeeper.spec.records import Entry, Replay

from ..backend import Backend, Tx
from ..codec import from_json, stored_json
from ..crypto.seal import is_sealed
from ..replay import context_message, path_settings

PART = 16384
"""Most context messages in one stored part."""
PART_BYTES = 4 * 2**20
"""Most bytes of one part's msgpack (unless it is one message): a part is
decoded and let go before the next is read, so a replay holds one part's
bytes (this many at most, and their compressed frame) beside its result."""
FORMAT = 3
"""The stored format: each part's body a Zstandard frame (level
:data:`LEVEL`, its content size stated) of the msgpack array
``[entry ids, messages]`` (schema 31), the entry ids one string joined by
newlines (:data:`_IDS_SEP`) when none holds one (else an array of strings).
A 10,000-id array decoded with the messages cost about as much again as
the string split (issue 21: ids 16 characters long, the replay's decode about
a third slower). Format 2 (the ids always an array) and format 1 (schema 29:
two msgpack arrays, uncompressed, gone with its table) are not served: a part
stored in any other format is never served (the replay reads the rows and
stores its own in its place)."""
_IDS_SEP = "\n"
"""What joins a part's entry ids into one string (no id the store checks holds
one: ``codec.check_id``; a part with one that does keeps them an array)."""
MESSAGES = "messages"
"""The field name a part is sealed under (``replay_snapshots.body``, record id
the part's ``part_key``). A sealed part's clear bytes are the part's header
(:func:`_bound`: session, part, parts, format, leaf, ``next_seq``, rooted,
model, thinking) and then its Zstandard frame, so a header row changed to
serve an old snapshot for a newer branch, or fewer parts than it has, no
longer matches what was sealed: the part is not served."""
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
LEVEL = 1
"""Zstandard level of the parts (a decode costs the same at any level; 1 writes fastest)."""
_UNDECODABLE = (zstandard.ZstdError, ValueError, TypeError, ormsgpack.MsgpackDecodeError)
"""What a body that is no Zstandard frame of msgpack ``[ids, messages]`` raises
(unpacking a value that is no pair: ``ValueError`` or ``TypeError``)."""


_LOCAL = threading.local()
"""Each thread's Zstandard decompression context, about 96 KB kept per thread that
decoded a part (a ``ZstdDecompressor`` is used by one thread at a time; making one
per part cost about a third of a 10,000-message part's decompression)."""


def _decompress(frame: bytes | memoryview) -> bytes:
    """``frame`` decompressed into one buffer of the size it states.

    Raises:
        zstandard.ZstdError: not a Zstandard frame, or one without its size.
    """
    dctx: zstandard.ZstdDecompressor | None = getattr(_LOCAL, "dctx", None)
    if dctx is None:
        dctx = _LOCAL.dctx = zstandard.ZstdDecompressor()
    return dctx.decompress(frame)


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored snapshot's header (part 0's row), and part 0's ``(body,
    digest)`` when they were read with it."""

    parts: int
    format: int
    leaf_id: str | None
    next_seq: int
    rooted: bool
    model: str | None
    thinking: str
    first: tuple[bytes, str] | None


def key(session_id: str, part: int) -> str:
    """Part ``part``'s ``part_key``: ``session_id/part`` (one per pair: the part
    number, after the last ``/``, holds none)."""
    return f"{session_id}/{part}"


def head(
    tx: Tx, session_id: str, *, with_first: bool
) -> tuple[str | None, int, Stored | None] | None:
    """The session row's ``(leaf_id, next_seq)`` and its stored snapshot's
    header (with part 0's body when ``with_first``), in one statement;
    ``None`` when there is no such session."""
    more = ", r.body, r.digest" if with_first else ""
    sql = (
        "SELECT s.leaf_id, s.next_seq, r.parts, r.format, r.leaf_id, r.next_seq, r.rooted, "
        f"r.model, r.thinking{more} FROM sessions s LEFT JOIN (SELECT * FROM replay_snapshots "
        "WHERE part_key = ?) r ON true WHERE s.id = ?"
    )
    params = [key(session_id, 0), session_id]
    if with_first:
        found = tx.rows(sql, params, binary=True)
        row = found[0] if found else None
    else:
        row = tx.one(sql, params)
    if row is None:
        return None
    if row[2] is None:
        return row[0], row[1], None
    first = (_bytes(row[9]), row[10]) if with_first else None
    parts, form, leaf_id, next_seq, rooted, model, thinking = row[2:9]
    return row[0], row[1], Stored(parts, form, leaf_id, next_seq, rooted, model, thinking, first)


def _bytes(value: Any) -> bytes:
    """A ``BYTEA`` value as ``bytes`` (a driver may give a ``memoryview``; a
    missing one, DuckDB's column being nullable, is empty: it fails its digest)."""
    return value if isinstance(value, bytes) else b"" if value is None else bytes(value)


def _digest(session_id: str, part: int, stored: Stored, body: bytes) -> str:
    """A part's check value: CRC-32 of its header and its (compressed) body
    (``crc32:`` and 8 hex digits). It catches a damaged or misplaced part on
    every read at a fraction of a decode's cost; it is no defence against a
    writer of the database, who could as well change the entries."""
    header = [session_id, part, stored.parts, stored.format, stored.leaf_id, stored.next_seq]
    crc = zlib.crc32(orjson.dumps([*header, stored.rooted, stored.model, stored.thinking]))
    return f"crc32:{zlib.crc32(body, crc):08x}"


def _part(tx: Tx, session_id: str, part: int, stored: Stored) -> tuple[bytes, str] | None:
    """Part ``part``'s ``(body, digest)``: part 0's as read with the header, else
    read by its key (``None``: there is no such part)."""
    if part == 0 and stored.first is not None:
        return stored.first
    found = tx.rows(
        "SELECT body, digest FROM replay_snapshots WHERE part_key = ?",
        [key(session_id, part)],
        binary=True,
    )
    return (_bytes(found[0][0]), found[0][1]) if found else None


def _bound(session_id: str, part: int, stored: Stored) -> bytes:
    """The header a sealed part's clear bytes start with (see :data:`MESSAGES`):
    its length (4 bytes, big-endian) and the msgpack of the part's header."""
    fields = (stored.parts, stored.format, stored.leaf_id, stored.next_seq, stored.rooted)
    header = ormsgpack.packb([session_id, part, *fields, stored.model, stored.thinking])
    return len(header).to_bytes(4, "big") + header


def _opened(
    tx: Tx, session_id: str, part: int, stored: Stored, body: bytes
) -> bytes | memoryview | None:
    """Part ``part``'s Zstandard frame: ``body`` itself when clear (in a clear
    session); opened when sealed. ``None`` when the part is not served: the
    header it was sealed with is not the row's (the row's header was
    changed), or it does not open (``PayloadAuthenticationError``: a part
    sealed under a key version the session no longer holds, restored from
    before a rotation, or a clear part in a sealed session). A snapshot is a
    cache: the replay then reads the rows, each authenticated, and stores a
    new snapshot (attack finding on issue 23, part 2: such a part failed
    every cold replay and was never replaced).

    Raises:
        KeyUnavailableError: as ``Keyring.open_bytes``: a sealed part and no
            key (the rows would need it too).
    """
    if not is_sealed(body) and not tx.keys.encrypted:
        return body
    try:
        plain = tx.keys.open_bytes(tx, session_id, key(session_id, part), MESSAGES, body)
    except errors.PayloadAuthenticationError:
        return None
    if not is_sealed(body):
        return plain  # a clear session's part in an encrypted store
    bound = _bound(session_id, part, stored)
    if plain[: len(bound)] != bound:
        return None
    return memoryview(plain)[len(bound) :]


def _unpacked(frame: bytes | memoryview) -> tuple[list[str], list[Any]] | None:
    """A part's ``(entry ids, messages)`` from its Zstandard frame (see
    :data:`FORMAT`: the ids one string or an array), or ``None`` when it is no
    frame of msgpack ``[ids, messages]`` of equal lengths."""
    try:
        ids, messages = ormsgpack.unpackb(_decompress(frame))
    except _UNDECODABLE:
        return None
    if isinstance(ids, str):
        ids = ids.split(_IDS_SEP)
    if not isinstance(ids, list) or not isinstance(messages, list):
        return None
    if len(ids) != len(messages):
        return None
    return ids, messages


def load(tx: Tx, session_id: str, stored: Stored) -> Replay | None:
    """The stored snapshot's replay (fresh objects), or ``None`` when it is of
    another :data:`FORMAT`, or a part is missing, belongs to another snapshot,
    fails its digest or does not decode, or a sealed part's header is not its
    row's (then the caller replays from the rows).

    Raises:
        KeyUnavailableError: a sealed part and no key (see :func:`_opened`);
            never a partial replay.
    """
    if stored.parts < 1 or stored.format != FORMAT:  # a header naming no part is damage too
        return None
    messages: list[Any] = []
    ids: list[str] = []
    for part in range(stored.parts):
        found = _part(tx, session_id, part, stored)
        if found is None or _digest(session_id, part, stored, found[0]) != found[1]:
            return None
        frame = _opened(tx, session_id, part, stored, found[0])
        del found
        if frame is None:
            return None
        unpacked = _unpacked(frame)
        del frame  # the part's bytes go before the next part is read
        if unpacked is None:
            return None
        part_ids, part_messages = unpacked
        del unpacked
        if stored.parts == 1:  # one part: its lists are the replay's (no copy)
            messages, ids = part_messages, part_ids
        else:
            messages.extend(part_messages)
            ids.extend(part_ids)
        del part_ids, part_messages
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


def _bodies(replay: Replay) -> list[bytes]:
    """The parts' bodies (see :data:`FORMAT`: the ids of a part joined into one
    string unless one holds the separator): the messages in order, at most
    :data:`PART` to a part, a part whose msgpack is over :data:`PART_BYTES`
    split into as many equal runs as that takes, again until each fits or is
    one message (an empty replay is one part of none).

    Raises:
        ormsgpack.MsgpackEncodeError: a message msgpack cannot hold.
    """
    bodies: list[bytes] = []

    def add(at: int, end: int) -> None:
        ids = replay.entry_ids[at:end]
        joined = _IDS_SEP.join(ids)
        one = bool(ids) and joined.count(_IDS_SEP) == len(ids) - 1  # no id holds one
        packed = ormsgpack.packb([joined if one else ids, replay.messages[at:end]])
        if len(packed) <= PART_BYTES or end - at == 1:
            bodies.append(zstandard.compress(packed, LEVEL))
            return
        step = -(-(end - at) // -(-len(packed) // PART_BYTES))
        del packed
        for start in range(at, end, step):
            add(start, min(start + step, end))

    count = len(replay.messages)
    for at in range(0, max(count, 1), PART):
        add(at, min(at + PART, count))
    return bodies


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
    model = None if replay.model is None else stored_json(replay.model)
    try:
        bodies = _bodies(replay)
    except ormsgpack.MsgpackEncodeError:
        return  # a message msgpack cannot hold (none that JSON holds) is replayed from the rows
    header = Stored(
        len(bodies),
        FORMAT,
        pending.leaf_id,
        pending.next_seq,
        pending.rooted,
        model,
        replay.thinking_level,
        None,
    )

    def body(tx: Tx) -> None:
        row = tx.one(
            f"SELECT next_seq, key_version FROM sessions WHERE id = ?{tx.dialect.update_lock()}",
            [session_id],
        )
        if row is None or row[0] != header.next_seq:
            return  # deleted, or written since: a later replay stores its own
        have = tx.one(
            "SELECT next_seq FROM replay_snapshots WHERE part_key = ?", [key(session_id, 0)]
        )
        if have is not None and have[0] > header.next_seq:
            return  # a later one is stored; one at this very row is replaced (it was damaged)
        # Sealed under the key version the session row names, read under its lock.
        sealing, _ = tx.keys.sealing(tx, session_id, row[1])
        tx.exec("DELETE FROM replay_snapshots WHERE session_id = ?", [session_id])
        for part, data in enumerate(bodies):
            if sealing is not None:
                bound = _bound(session_id, part, header) + data
                data = sealing.seal(key(session_id, part), MESSAGES, bound)
            tx.exec(
                "INSERT INTO replay_snapshots (part_key, session_id, part, parts, format, "
                "leaf_id, next_seq, rooted, model, thinking, body, digest) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    key(session_id, part),
                    session_id,
                    part,
                    header.parts,
                    header.format,
                    header.leaf_id,
                    header.next_seq,
                    header.rooted,
                    header.model,
                    header.thinking,
                    data,
                    _digest(session_id, part, header, data),
                ],
            )

    with contextlib.suppress(*_SKIPPED, errors.KeyUnavailableError):
        db.write("store_replay_snapshot", body)
