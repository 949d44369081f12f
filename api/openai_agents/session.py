"""``TurnkeeperSession``: the OpenAI Agents SDK ``Session`` protocol over a turnkeeper
async store.

How an SDK session maps onto turnkeeper:

- The SDK's session id names a channel binding (``channel_type="openai-agents"``,
  ``channel_id=<SDK session id>``, README "Channel bindings") to its *current*
  turnkeeper session, created on the first write (``bindings.create_bound``).
- Each input item is one custom entry (``customType`` :data:`ITEM_TYPE`, the item
  under ``data``, stored as given: key order, unicode and NUL round-trip), appended
  under the leaf. The SDK session's items are the items on the root → leaf path back
  to the last :data:`REPLACED_TYPE` entry, and from there on back from the item that
  entry keeps (``data.keep``; ``None``: none).
- ``pop_item`` moves the leaf back to the popped entry's parent with a compare-and-set
  on the leaf it read (``sessions.branch(..., expected_leaf=...)``), or appends a
  replacement keeping one item fewer when the leaf is a replacement: of concurrent
  callers one wins each item, the others read the new leaf and try again.
- ``clear_session`` deletes the turnkeeper session (README "Deleting sessions"; its
  binding goes with it); the next write creates a fresh bound session, because a
  deleted id is never reused.
- A compaction (the SDK's ``OpenAIResponsesCompactionSession``) replaces history
  through the SDK's hooks: ``_atomic_replace_items`` (manual compaction,
  :meth:`TurnkeeperSession.replace_items`) and ``_get_compaction_snapshot`` (automatic
  compaction of a suffix, a compare-and-set on the leaf read). Each is one transaction
  appending a :data:`REPLACED_TYPE` entry and the new items, so a crash leaves the old
  history or the new one, never the cleared gap of the SDK's clear-then-add fallback.
  The older entries stay in the session's tree, as turnkeeper's own compactions keep
  theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from agents.items import TResponseInputItem
from agents.memory.session import _CompactionSnapshot
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import Entry, Lease, NewEntry

if TYPE_CHECKING:
    from turnkeeper.aio import AsyncStore

CHANNEL_TYPE: Final = "openai-agents"
"""The channel type of the binding from an SDK session id to its turnkeeper session."""
ITEM_TYPE: Final = "openai_agents.item"
"""``customType`` of an entry holding one Responses input item (under ``data``)."""
REPLACED_TYPE: Final = "openai_agents.replaced"
"""``customType`` of the entry a history replacement (compaction) starts with: the
items before it on the path are no longer the SDK session's."""
UNPARSED_TYPE: Final = "openai_agents.unparsed"
"""``customType`` of an imported row that was not JSON (kept verbatim under
``data.message_data``; skipped by reads and dropped by ``pop_item``, as the SDK's
``SQLiteSession`` skips and drops it)."""

_FIRST_WINDOW = 64
_MAX_WINDOW = 65_536
"""The most entries one read of the path asks for (``sessions.path_latest`` takes up to
1,000,000; the SDK asks for up to 2**31 - 1 items)."""


def _custom_type(entry: Entry) -> object:
    return entry.payload.get("customType") if entry.kind == EntryKind.CUSTOM else None


def _item(entry: Entry) -> TResponseInputItem:
    return cast(TResponseInputItem, entry.payload["data"])


def _kept(marker: Entry) -> str | None:
    """The item a :data:`REPLACED_TYPE` entry keeps the history up to (``None``: none)."""
    data = marker.payload.get("data")
    keep = data.get("keep") if isinstance(data, Mapping) else None
    return keep if isinstance(keep, str) else None


def _replaced(keep: str | None) -> NewEntry:
    """A :data:`REPLACED_TYPE` entry: the history before it is the one ending at the
    item ``keep`` (``None``: no history)."""
    return NewEntry(EntryKind.CUSTOM, {"customType": REPLACED_TYPE, "data": {"keep": keep}})


def item_entry(item: TResponseInputItem, *, entry_id: str | None = None) -> NewEntry:
    """The entry that stores ``item`` (a Responses input item, a JSON object)."""
    if not isinstance(item, Mapping):
        raise errors.InvalidInputError("items", f"an input item is a mapping, not {type(item)}")
    return NewEntry(
        EntryKind.CUSTOM,
        {"customType": ITEM_TYPE, "data": cast(Any, item)},
        entry_id=entry_id,
    )


class TurnkeeperSession:
    """An OpenAI Agents SDK ``Session`` (``agents.memory.Session``) kept in turnkeeper.

    ``TurnkeeperSession(session_id, store)`` with ``store`` an open
    ``turnkeeper.aio.AsyncStore``; ``session_id`` is the SDK's session id (any
    non-empty string). ``session_settings`` (``SessionSettings`` or its dict) gives the
    default ``limit`` of :meth:`get_items`, as for the SDK's ``SQLiteSession``.

    Fencing (optional): ``lease`` is a turnkeeper lease on ``session:<id>`` of the
    session this SDK session is bound to (see :meth:`acquire`). Every write is then
    fenced by it: a stale writer (its lease expired, released or taken over) gets
    ``LeaseLostError`` and writes nothing, also when the new holder has cleared the
    session meanwhile; ``clear_session`` re-acquires the lease on the fresh session
    for the same owner and purpose, for ``lease_ttl_s`` seconds. Without a lease, a
    write while someone else holds the session raises ``BusyError`` (README "Session
    writes and leases, one rule").

    Errors: ``InvalidInputError`` for an item that is not a mapping (nothing is
    written), ``LeaseLostError``, ``BusyError``, and the store's backend errors.
    ``asyncio.CancelledError`` is never wrapped.
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        store: AsyncStore,
        *,
        lease: Lease | None = None,
        lease_ttl_s: float = 30.0,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise errors.InvalidInputError("session_id", "an SDK session id is a non-empty string")
        self.session_id = session_id
        self.store = store
        self.session_settings = (
            coerce_session_settings(cast(Any, session_settings))
            if session_settings is not None
            else SessionSettings()
        )
        self._lease = lease
        self._ttl_s = lease_ttl_s
        self._bound: str | None = None
        if lease is not None:
            prefix, _, bound = lease.target.partition(":")
            if prefix != "session" or not bound:
                raise errors.InvalidInputError("lease", "the lease of a session:<id> target")
            self._bound = bound

    @classmethod
    async def acquire(
        cls,
        session_id: str,
        store: AsyncStore,
        owner: str,
        *,
        ttl_s: float,
        purpose: str = "execution",
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> TurnkeeperSession:
        """A fenced session: binds ``session_id`` to a turnkeeper session (creating it
        when there is none) and acquires its lease for ``owner`` (``ttl_s`` seconds,
        ``purpose`` as ``leases.acquire`` takes it). ``clear_session`` re-acquires it on
        the fresh session with the same owner, ttl and purpose.

        Raises:
            BusyError: another owner holds the session's lease.
        """
        probe = cls(session_id, store, session_settings=session_settings)
        while True:
            bound = await probe._resolve(create=True)
            assert bound is not None
            try:
                lease = await store.leases.acquire(
                    f"session:{bound}", owner, ttl_s=ttl_s, purpose=purpose
                )
            except errors.RuntimeSessionNotFoundError:
                probe._bound = None  # cleared meanwhile: bind again
                continue
            return cls(
                session_id,
                store,
                lease=lease,
                lease_ttl_s=ttl_s,
                session_settings=session_settings,
            )

    @property
    def lease(self) -> Lease | None:
        """The lease this session's writes are fenced by (``None``: unfenced)."""
        return self._lease

    @property
    def bound_session_id(self) -> str | None:
        """The turnkeeper session this SDK session was last seen bound to, if any."""
        return self._bound

    async def renew(self, ttl_s: float) -> Lease:
        """Renew the fencing lease for ``ttl_s`` seconds (``LeaseLostError`` when lost)."""
        if self._lease is None:
            raise errors.InvalidInputError("lease", "an unfenced session has no lease to renew")
        self._lease = await self.store.leases.renew(self._lease, ttl_s)
        return self._lease

    def close(self) -> None:
        """Nothing to release: the store is the caller's to close. (For code written
        against the SDK's ``SQLiteSession``, which has ``close``.)"""

    # --- the binding --------------------------------------------------------------

    async def _resolve(self, *, create: bool) -> str | None:
        """The bound turnkeeper session id (created and bound when ``create``)."""
        if self._bound is not None:
            return self._bound
        binding = await self.store.bindings.find(CHANNEL_TYPE, self.session_id)
        if binding is None and create:
            try:
                made = await self.store.bindings.create_bound(CHANNEL_TYPE, self.session_id)
                self._bound = made.id
            except errors.ChannelBoundError as taken:  # a concurrent first write won
                self._bound = taken.session_id
        elif binding is not None:
            self._bound = binding.session_id
        return self._bound

    def _gone(self) -> None:
        """The bound session was deleted (another caller's clear): a fenced session is
        stale from then on; an unfenced one binds afresh."""
        if self._lease is not None:
            raise errors.LeaseLostError(self._lease.target, detail="the session was deleted")
        self._bound = None

    # --- reads --------------------------------------------------------------------

    async def _chain(
        self, bound: str, limit: int | None, leaf_id: str | None = None
    ) -> tuple[list[Entry], bool, str | None]:
        """The item entries of the history ending at ``leaf_id`` (``None``: the
        session's leaf), the newest ``limit`` of them (``None``: all), root first;
        whether no item precedes them (``complete``); and the id of the leaf read first
        (``None``: an empty session).

        Reads the path back from the leaf in windows (``sessions.path_latest``), each
        continuing where the last ended, doubling, never the whole session; a
        :data:`REPLACED_TYPE` entry ends the history, or continues it at the item its
        ``data.keep`` names."""
        found: list[Entry] = []
        first, unread = leaf_id, leaf_id is None
        cursor = leaf_id
        fresh = _FIRST_WINDOW if limit is None else min(limit + 1, _MAX_WINDOW)
        window = fresh
        while True:
            path = await self.store.sessions.path_latest(bound, window, leaf_id=cursor)
            if unread:
                first, unread = (path[-1].id if path else None), False
            marker: Entry | None = None
            for entry in reversed(path):
                kind = _custom_type(entry)
                if kind == REPLACED_TYPE:
                    marker = entry
                    break
                if kind == ITEM_TYPE:
                    if limit is not None and len(found) == limit:
                        return found[::-1], False, first
                    found.append(entry)
            if marker is None:
                if len(path) < window or path[0].parent_id is None:
                    return found[::-1], True, first  # the root
                cursor, window = path[0].parent_id, min(2 * window, _MAX_WINDOW)
                continue
            keep = _kept(marker)
            if keep is None:
                return found[::-1], True, first
            cursor, window = keep, fresh

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first; with ``limit`` (or
        ``session_settings.limit``) the latest ``limit`` of them. ``limit`` 0 returns
        none; a negative limit returns all, as the SDK's ``SQLiteSession`` does.
        Reads about twice the returned entries at most, not the whole session."""
        resolved = resolve_session_limit(limit, self.session_settings)
        if resolved is not None and resolved == 0:
            return []
        if resolved is not None and resolved < 0:
            resolved = None
        while True:
            bound = await self._resolve(create=False)
            if bound is None:
                return []
            try:
                tail, _, _ = await self._chain(bound, resolved)
            except errors.SessionNotFoundError:
                self._gone()
                continue
            return [_item(e) for e in tail]

    # --- writes -------------------------------------------------------------------

    async def _append(self, entries: Sequence[NewEntry]) -> None:
        while True:
            bound = await self._resolve(create=True)
            assert bound is not None
            try:
                await self.store.sessions.append_many(bound, entries, lease=self._lease)
                return
            except errors.SessionNotFoundError:
                self._gone()

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` after the session's last item, in one transaction."""
        entries = [item_entry(item) for item in items]
        if entries:
            await self._append(entries)

    async def replace_items(self, items: list[TResponseInputItem]) -> None:
        """Replace the session's whole history with ``items`` in one transaction
        (a :data:`REPLACED_TYPE` entry, then the items). A crash leaves the old history
        or the new one. The history it replaces is whatever is current when the
        transaction runs (as the SDK's own atomic replacements do)."""
        await self._append([_replaced(None), *(item_entry(item) for item in items)])

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The SDK's compaction hook (``OpenAIResponsesCompactionSession`` looks it up on
        the wrapped session's type): :meth:`replace_items`, reporting it replaced."""
        await self.replace_items(items)
        return True

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the latest item (``None`` when there is none). Atomic, a
        compare-and-set on the leaf read, so concurrent callers, in any process, never
        get the same item: the leaf moves back to the item's parent
        (``sessions.branch(..., expected_leaf=...)``), or, when the leaf is a
        replacement that keeps an earlier item, a replacement keeping the item before
        that one is appended (``expected_leaf`` too)."""
        while True:
            bound = await self._resolve(create=False)
            if bound is None:
                return None
            try:
                path = await self.store.sessions.path_latest(bound, 1)
                if not path:
                    return None
                leaf = path[-1]
                if _custom_type(leaf) != REPLACED_TYPE:
                    await self.store.sessions.branch(
                        bound, leaf.parent_id, expected_leaf=leaf.id, lease=self._lease
                    )
                    if _custom_type(leaf) == ITEM_TYPE:
                        return _item(leaf)
                    continue  # not an item (an unparsed import): dropped, as SQLite does
                keep = _kept(leaf)
                if keep is None:
                    return None
                last_two, _, _ = await self._chain(bound, 2, leaf_id=keep)
                before = last_two[0].id if len(last_two) == 2 else None
                await self.store.sessions.append_many(
                    bound, [_replaced(before)], expected_leaf=leaf.id, lease=self._lease
                )
                return _item(last_two[-1])
            except errors.SessionNotFoundError:
                self._gone()
            except errors.SessionModifiedError:
                pass  # another writer moved the leaf: read it again

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[TResponseInputItem], bool] | None = None
    ) -> _CompactionSnapshot | None:
        """The SDK's hook for automatic compaction (``OpenAIResponsesCompactionSession``):
        the latest ``limit`` items, whether they are all, and ``replace_suffix(start,
        output)``, which replaces the items from ``start`` on with ``output`` in one
        transaction (a :data:`REPLACED_TYPE` entry keeping the items before ``start``,
        then ``output``), a compare-and-set on the leaf read here: ``False`` and nothing
        written when the session changed since. ``prune_prefix`` (items a wrapping
        ``EncryptedSession`` finds expired) is not applied: entries are never deleted
        but with their session, and that session filters expired items on read."""
        del prune_prefix
        bound = await self._resolve(create=False)
        if bound is None:
            return None
        try:
            found, complete, leaf = await self._chain(bound, limit + 1)
        except errors.SessionNotFoundError:
            self._gone()
            return None
        before = found[0].id if len(found) > limit else None
        window = found[-limit:] if limit > 0 else []
        complete = complete and len(found) <= limit

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            if not window[start:]:
                return False
            keep = window[start - 1].id if start > 0 else before
            try:
                await self.store.sessions.append_many(
                    bound,
                    [_replaced(keep), *(item_entry(item) for item in output)],
                    expected_leaf=leaf,
                    lease=self._lease,
                )
            except errors.SessionModifiedError:
                return False
            except errors.SessionNotFoundError:
                self._gone()
                return False
            return True

        return _CompactionSnapshot([_item(e) for e in window], complete, replace_suffix)

    async def clear_session(self) -> None:
        """Delete the bound turnkeeper session and everything stored of it (README
        "Deleting sessions"); the next write binds a fresh session. Fenced: the delete
        runs under the lease and the lease is re-acquired on the fresh session.

        Raises:
            LeaseLostError, BusyError, SessionRunActiveError (a run of the session is
            not terminal: nothing is deleted).
        """
        bound = await self._resolve(create=False)
        if bound is not None:
            try:
                await self.store.sessions.delete(bound, lease=self._lease)
            except errors.SessionNotFoundError:
                if self._lease is not None:
                    raise errors.LeaseLostError(
                        self._lease.target, detail="the session was deleted"
                    ) from None
        self._bound = None
        if self._lease is None:
            return
        old = self._lease
        fresh = await self._resolve(create=True)
        assert fresh is not None
        self._lease = await self.store.leases.acquire(
            f"session:{fresh}", old.owner, ttl_s=self._ttl_s, purpose=old.purpose
        )
