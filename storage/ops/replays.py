"""Replay through an in-process cache of replayed branches (session seed
GetReplayState), on every backend.

Entries are immutable: the store never updates or deletes one, and every
write of entries moves the session's ``next_seq`` past them. So the session
row's ``(leaf_id, next_seq)`` names its current branch's replay exactly: a
replay reads that row (one statement) and, when the cache holds a replay
under the same pair, decodes it without reading an entry. When the session
grew along its branch since (the new leaf descends from the cached one), it
reads only the entries with ``seq`` at or above the cached ``next_seq`` and
carries the cached replay on along them, provided the cached branch is
rooted (its first entry has no parent: an import may store an entry whose
parent is missing, and a later import can supply that parent, which then
belongs on the branch above the cached part); anything else (the leaf moved
to another branch, a new compaction, an unrooted branch) is replayed from
the rows. Writers in other processes or store objects are seen the same
way: the check reads the row.

Beneath this cache, in the database, each session may keep one stored
snapshot of a replay (``replay_snapshots``): a replay that finds nothing
usable cached reads it with the session row (the same statement) and uses
it by the same rules, so a fresh process or store object (cache off) replays
a long session from one stored value; a replay that decoded many rows stores
its result there after the read (see ``storage.ops.replay_snapshots``).

Every replay returns fresh objects (decoded from the cached JSON text), so a
caller that changes the messages it got changes nothing cached. Memory: the
cache keeps each branch's context messages as JSON text, and counts what
its branches hold in memory (``sys.getsizeof`` of each text and id, plus a
fixed amount per branch, so empty branches count too) against
``replay_cache_bytes`` in all (64 MiB by default), evicting the least
recently replayed session; a branch larger than that is not cached.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import Entry, Replay

from ..backend import Tx
from ..codec import check_id, from_json, stored_json
from ..replay import build_replay, context_message, path_settings
from . import entry_rows
from . import replay_snapshots as snapshots
from .base import Area

REPLAY_CACHE_BYTES = 64 * 2**20
"""The default bound, in bytes, of a store object's replay cache."""
_BRANCH_BYTES = 512
"""Bytes counted per cached branch beyond its texts and ids (the branch, its
tuples' headers, its session id and the cache's slot for it)."""
_SLOT_BYTES = 16
"""Bytes counted per cached message for its two tuple slots."""
_CHUNK = 1024
"""Cached messages decoded per JSON decode."""


@dataclass(frozen=True, slots=True)
class Branch:
    """A replay as cached: for the session row's ``(leaf_id, next_seq)``, its
    messages as JSON text, their entry ids, and the model (JSON) and thinking
    level; ``rooted``: the branch starts at an entry without a parent (only
    then may it be carried on); ``nbytes`` is what it counts against the bound."""

    leaf_id: str | None
    next_seq: int
    messages: tuple[str, ...]
    entry_ids: tuple[str, ...]
    model: str | None
    thinking: str
    rooted: bool
    nbytes: int

    @classmethod
    def of(cls, replay: Replay, rooted: bool, leaf_id: str | None, next_seq: int) -> Branch:
        """The cached form of ``sessions.replay`` (``rooted``: its path starts at an entry
        without a parent)."""
        texts = tuple(stored_json(m) for m in replay.messages)
        return cls._make(
            leaf_id, next_seq, texts, replay.entry_ids, replay.model, replay.thinking_level, rooted
        )

    @classmethod
    def _make(
        cls,
        leaf_id: str | None,
        next_seq: int,
        texts: tuple[str, ...],
        ids: tuple[str, ...],
        model: Mapping[str, Any] | None,
        thinking: str,
        rooted: bool,
    ) -> Branch:
        model_json = None if model is None else stored_json(model)
        size = _BRANCH_BYTES + (0 if model_json is None else sys.getsizeof(model_json))
        size += sum(
            sys.getsizeof(t) + sys.getsizeof(i) + _SLOT_BYTES
            for t, i in zip(texts, ids, strict=True)
        )
        return cls(leaf_id, next_seq, texts, ids, model_json, thinking, rooted, size)

    def replay(self) -> Replay:
        """The replay, decoded afresh (one JSON decode per :data:`_CHUNK` messages:
        a decode's buffers grow with its text)."""
        texts = self.messages
        messages = [
            m
            for at in range(0, len(texts), _CHUNK)
            for m in from_json("[" + ",".join(texts[at : at + _CHUNK]) + "]")
        ]
        model = None if self.model is None else from_json(self.model)
        return Replay(tuple(messages), self.entry_ids, model, self.thinking)

    def extended(self, tail: Sequence[Entry], leaf_id: str | None, next_seq: int) -> Branch:
        """This branch carried on along ``tail`` (new entries, none a compaction,
        the first one's parent this branch's leaf): their messages follow."""
        texts, ids = list(self.messages), list(self.entry_ids)
        for entry in tail:
            message = context_message(entry)
            if message is not None:
                texts.append(stored_json(message))
                ids.append(entry.id)
        model = None if self.model is None else from_json(self.model)
        model, thinking = path_settings(tail, model, self.thinking)
        return Branch._make(
            leaf_id, next_seq, tuple(texts), tuple(ids), model, thinking, self.rooted
        )


class BranchCache:
    """Session id → its last replayed :class:`Branch`, least recently replayed
    evicted first beyond ``max_bytes`` in all (0 caches nothing); thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._branches: OrderedDict[str, Branch] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> Branch | None:
        with self._lock:
            branch = self._branches.get(session_id)
            if branch is not None:
                self._branches.move_to_end(session_id)
            return branch

    def put(self, session_id: str, branch: Branch) -> None:
        with self._lock:
            old = self._branches.pop(session_id, None)
            if old is not None:
                self.nbytes -= old.nbytes
            if branch.nbytes > self.max_bytes:
                return
            self._branches[session_id] = branch
            self.nbytes += branch.nbytes
            while self.nbytes > self.max_bytes:
                _, evicted = self._branches.popitem(last=False)
                self.nbytes -= evicted.nbytes

    def drop(self, session_id: str) -> None:
        """Forget ``session_id``'s branch (a deleted session)."""
        with self._lock:
            old = self._branches.pop(session_id, None)
            if old is not None:
                self.nbytes -= old.nbytes

    def __len__(self) -> int:
        return len(self._branches)


def _tail(
    tx: Tx, rows: Sequence[Sequence[Any]], leaf: str | None, stop: str | None
) -> list[Entry] | None:
    """Root-first entries from ``stop`` (exclusive) to ``leaf`` through ``rows``
    (``entries`` rows by ``entry_rows.ENTRY_SELECT``), or ``None`` when the walk
    from ``leaf`` leaves ``rows`` anywhere but at ``stop`` (or finds a cycle)."""
    by_id = {row[1]: row for row in rows}
    chain: list[Sequence[Any]] = []
    seen: set[str] = set()
    node = leaf
    while node != stop:
        if node is None or node in seen or node not in by_id:
            return None
        seen.add(node)
        chain.append(by_id[node])
        node = by_id[node][2]
    return [entry_rows.entry_row(tx, row) for row in reversed(chain)]


def cached_replay(
    tx: Tx, session_id: str, cache: BranchCache, pending: list[snapshots.Pending] | None = None
) -> Replay:
    """The session's replay through ``cache`` and the session's stored snapshot
    (see the module docstring and ``replay_snapshots``); one snapshot of the
    database. A replay that decoded at least ``replay_snapshots.PERSIST_ROWS``
    entry rows is appended to ``pending``, for the caller to store after the read.

    Raises:
        SessionNotFoundError: no such session.
    """
    known = cache.get(session_id)
    head = snapshots.head(tx, session_id, with_first=known is None)
    if head is None:
        raise errors.SessionNotFoundError(session_id)
    leaf, next_seq, stored = head
    if known is not None and known.leaf_id == leaf and known.next_seq == next_seq:
        return known.replay()
    if known is not None and known.rooted and known.next_seq < next_seq:
        tail = _tail(tx, _rows_from(tx, session_id, known.next_seq), leaf, known.leaf_id)
        if tail is not None and all(e.kind != EntryKind.COMPACTION for e in tail):
            branch = known.extended(tail, leaf, next_seq)
            cache.put(session_id, branch)
            grown = branch.replay()
            _keep(pending, len(tail), grown, True, leaf, next_seq)
            return grown
    replay = _from_stored(tx, session_id, stored, leaf, next_seq, pending)
    if replay is None:
        path = entry_rows.path_to_leaf(tx, session_id, leaf)
        rooted = not path or path[0].parent_id is None
        replay = build_replay(path)
        rows = len(path)
        del path  # its entries are let go before the cached copy is made
        _keep(pending, rows, replay, rooted, leaf, next_seq)
    else:
        rooted = stored is not None and stored.rooted
    if cache.max_bytes:
        cache.put(session_id, Branch.of(replay, rooted, leaf, next_seq))
    return replay


def _rows_from(tx: Tx, session_id: str, seq: int) -> list[tuple[Any, ...]]:
    """The session's entry rows at or above ``seq``."""
    return tx.rows(
        f"SELECT {entry_rows.entry_columns(tx)} FROM entries WHERE session_id = ? AND seq >= ?",
        [session_id, seq],
    )


def _from_stored(
    tx: Tx,
    session_id: str,
    stored: snapshots.Stored | None,
    leaf: str | None,
    next_seq: int,
    pending: list[snapshots.Pending] | None,
) -> Replay | None:
    """The replay from the stored snapshot: as stored when the session row still
    names it, carried on along the new rows when it is rooted and they continue
    it without a compaction; ``None`` when it does not hold (or is damaged).
    A sealed session's snapshot is sealed (``replay_snapshots.MESSAGES``).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: a sealed part
            (``replay_snapshots.load``).
    """
    if stored is None:
        return None
    if stored.leaf_id == leaf and stored.next_seq == next_seq:
        return snapshots.load(tx, session_id, stored)
    if not stored.rooted or stored.next_seq >= next_seq:
        return None
    tail = _tail(tx, _rows_from(tx, session_id, stored.next_seq), leaf, stored.leaf_id)
    if tail is None or any(e.kind == EntryKind.COMPACTION for e in tail):
        return None
    base = snapshots.load(tx, session_id, stored)
    if base is None:
        return None
    replay = snapshots.carried_on(base, tail)
    _keep(pending, len(tail), replay, True, leaf, next_seq)
    return replay


def _keep(
    pending: list[snapshots.Pending] | None,
    rows: int,
    replay: Replay,
    rooted: bool,
    leaf: str | None,
    next_seq: int,
) -> None:
    """Ask for ``replay`` to be stored when it decoded enough rows to pay for it."""
    if pending is not None and rows >= snapshots.PERSIST_ROWS:
        pending.append(snapshots.Pending(replay, rooted, leaf, next_seq))


class ReplaysPart(Area):
    """Replay (session seed GetReplayState), through the store object's cache."""

    _branches: BranchCache

    def replay(self, session_id: str) -> Replay:
        """The current branch with compaction applied (session seed GetReplayState):
        model-context messages, the entry id each came from, the model and the
        thinking level. Served from this store object's replay cache when the
        session did not change since its last replay (see ``storage.ops.replays``);
        always fresh objects the caller may change. In an encrypted store the
        stored snapshot of a sealed session is sealed too (a cold replay reads
        it, not every row).

        Raises:
            SessionNotFoundError: no such session.
            KeyUnavailableError: the session's payloads are sealed and its
                data key cannot be had (opened without ``encryption=``).
            PayloadAuthenticationError: a sealed entry or snapshot part fails
                authentication (never a partial replay).
        """
        check_id(session_id, "session_id")
        pending: list[snapshots.Pending] = []
        replay = self.db.read(
            "replay",
            lambda tx: cached_replay(tx, session_id, self._branches, pending),
            snapshot=True,
        )
        for kept in pending[-1:]:  # a retried read may have asked more than once
            snapshots.store(self.db, session_id, kept)  # sealed in a sealed session
        return replay
