"""``TurnkeeperSaver``: a LangGraph checkpointer over an open turnkeeper store."""

from __future__ import annotations

import asyncio
import builtins
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import Entry, Lease, NewEntry
from turnkeeper.storage import BaseStore

from . import _reads
from ._records import (
    CHANNEL_TYPE,
    CHECKPOINT,
    WRITE,
    StoredCheckpoint,
    StoredWrite,
    checkpoint_entry_id,
    keep_latest,
    metadata_matches,
    new_writes,
    to_tuple,
)

T = TypeVar("T")

LEASE_KEY = "turnkeeper_lease"
"""The ``configurable`` key of a per-call lease (a ``turnkeeper.Lease`` on the
thread's session): ``{"configurable": {"thread_id": …, "turnkeeper_lease": lease}}``."""
REWRITE_TTL_S = 60.0
"""The lease ``prune`` and ``delete_for_runs`` hold on a thread's session
while they rewrite it, when the saver holds none of its own."""
WRITE_ATTEMPTS = 5
"""How many times ``put_writes`` judges its writes again after a concurrent
``put_writes`` of the same task stored one of its keys first."""
CHUNK = 500
"""Entries per ``append_many`` when a thread is copied or rewritten."""


def _thread(config: RunnableConfig) -> tuple[str, str]:
    conf = config["configurable"]
    return str(conf["thread_id"]), conf.get("checkpoint_ns", "") or ""


def _ours(entry: Entry, custom_type: str) -> bool:
    return entry.kind == EntryKind.CUSTOM and entry.payload.get("customType") == custom_type


class TurnkeeperSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer (``langgraph.checkpoint.base.BaseCheckpointSaver``)
    over an open turnkeeper store (``turnkeeper.open_store``; DuckDB or
    PostgreSQL).

    A thread is one turnkeeper session, bound to the channel
    ``("langgraph", thread_id)`` (``store.bindings``); checkpoints and pending
    writes are its ``custom`` entries (``customType`` ``langgraph.checkpoint``
    and ``langgraph.write``), their values the ``serde``'s typed bytes
    (``JsonPlusSerializer`` by default), stored exactly. The session is
    created on the thread's first write. ``delete_thread`` deletes the session
    (``store.sessions.delete``: its entries, binding and all; a
    ``deleted_sessions`` row stays and its id is never reused, so a thread
    deleted and written again gets a new session). ``prune`` and
    ``delete_for_runs`` write the thread's kept entries into a new session,
    move the binding to it and delete the old one.

    ``lease``: a turnkeeper lease on one thread's session (``session:<id>``,
    see :meth:`session_id`). Every write to that thread is fenced by it: once
    it is lost (expired and taken over, released) a write raises
    ``turnkeeper.LeaseLostError`` and stores nothing. A write to a session
    that someone else holds, made without that lease, raises
    ``turnkeeper.BusyError`` and stores nothing. A lease can also be given per
    call in ``config["configurable"]["turnkeeper_lease"]``. The stock savers
    have no fence: two writers on one thread both "succeed".

    Raises (constructor): ``turnkeeper.InvalidInputError`` when ``store`` is
    not an open turnkeeper store (field ``store``; an async store goes to
    :class:`AsyncTurnkeeperSaver`).

    Raises (every method): ``turnkeeper.InvalidInputError`` for a thread id
    turnkeeper cannot hold as an id (empty, control characters, over 512
    bytes); backend failures as turnkeeper's ``OperationalError`` family.
    """

    def __init__(
        self,
        store: Any,
        *,
        serde: SerializerProtocol | None = None,
        lease: Lease | None = None,
    ) -> None:
        if not isinstance(store, BaseStore):
            raise errors.InvalidInputError(
                "store",
                "expected an open turnkeeper store (AsyncTurnkeeperSaver takes an async one)",
            )
        super().__init__(serde=serde)
        self.store = store
        self.lease = lease

    # -- threads and sessions ------------------------------------------------

    def session_id(self, thread_id: str, *, create: bool = False) -> str | None:
        """The id of the session that holds ``thread_id`` (``None``: the thread
        has none yet), created and bound with ``create=True`` (a race with
        another creator returns the winner's)."""
        found = self.store.bindings.find(CHANNEL_TYPE, str(thread_id))
        if found is not None:
            return str(found.session_id)
        if not create:
            return None
        try:
            made = self.store.bindings.create_bound(
                CHANNEL_TYPE, str(thread_id), header={"langgraph": {"thread_id": str(thread_id)}}
            )
        except errors.ChannelBoundError as taken:
            return str(taken.session_id)
        return str(made.id)

    def _lease_for(self, session_id: str, config: RunnableConfig | None = None) -> Lease | None:
        given = (config or {}).get("configurable", {}).get(LEASE_KEY)
        if given is not None:
            return given  # type: ignore[no-any-return]
        if self.lease is not None and self.lease.target == session_target(session_id):
            return self.lease
        return None

    # -- reads ---------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (``checkpoint_id``), else the latest of
        its thread and ``checkpoint_ns`` (the greatest checkpoint id), with its
        pending writes in ``writes_sort_key`` order; ``None`` when there is none.
        Two bounded reads (the checkpoint; its writes), whatever the thread's
        length."""
        thread_id, ns = _thread(config)
        sid = self.session_id(thread_id)
        if sid is None:
            return None
        wanted = get_checkpoint_id(config)
        found = _reads.checkpoints(self.store, sid, ns, checkpoint_id=wanted, limit=1)
        if not found:
            return None
        stored = found[0]
        writes = _reads.writes(self.store, sid, ns, stored.checkpoint_id)
        return to_tuple(thread_id, stored, writes, self.serde, config if wanted else None)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by checkpoint id), as SqliteSaver lists them:
        of ``config``'s thread (every thread: ``None``), its ``checkpoint_ns``
        when given (else every namespace) and its ``checkpoint_id`` when
        given; ``filter``: metadata keys that must be equal; ``before``: ids
        below its ``checkpoint_id``; ``limit``: at most that many."""
        if config is not None:
            threads = [str(config["configurable"]["thread_id"])]
            ns: str | None = config["configurable"].get("checkpoint_ns")
            wanted = get_checkpoint_id(config)
        else:
            threads = sorted(
                b.channel_id for b in self.store.bindings.list(channel_type=CHANNEL_TYPE)
            )
            ns, wanted = None, None
        before_id = get_checkpoint_id(before) if before is not None else None
        found: builtins.list[tuple[str, str, StoredCheckpoint]] = []
        for thread_id in threads:
            sid = self.session_id(thread_id)
            if sid is None:
                continue
            found += [
                (thread_id, sid, c)
                for c in _reads.checkpoints(
                    self.store,
                    sid,
                    ns,
                    checkpoint_id=wanted,
                    before=before_id,
                    limit=None if filter else limit,
                )
            ]
        if len(threads) > 1:
            found.sort(key=lambda t: t[2].checkpoint_id, reverse=True)
        left = limit
        for thread_id, sid, stored in found:
            if left is not None and left <= 0:
                return
            if filter and not metadata_matches(self.serde.loads_typed(stored.metadata), filter):
                continue
            if left is not None:
                left -= 1
            writes = _reads.writes(self.store, sid, stored.ns, stored.checkpoint_id)
            yield to_tuple(thread_id, stored, writes, self.serde)

    # -- writes --------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` (whole: its channel values are in it) under its id,
        in ``config``'s thread and namespace, its parent ``config``'s
        ``checkpoint_id``; one append. The same checkpoint put again (a retry
        after an unknown commit) stores nothing more.

        Raises:
            EntryExistsError: a different checkpoint is stored under this id
                (a checkpoint is never rewritten); nothing is stored.
            LeaseLostError, BusyError: see the class; nothing is stored.
        """
        thread_id, ns = _thread(config)
        md = get_checkpoint_metadata(config, metadata)
        run_id = md.get("run_id")
        stored = StoredCheckpoint(
            ns,
            checkpoint["id"],
            config["configurable"].get("checkpoint_id"),
            self.serde.dumps_typed(checkpoint),
            self.serde.dumps_typed(md),
            None if run_id is None else str(run_id),
            checkpoint_entry_id(ns, checkpoint["id"]),
        )
        sid = self.session_id(thread_id, create=True)
        assert sid is not None
        try:
            self.store.sessions.append(
                sid,
                EntryKind.CUSTOM,
                stored.payload(),
                entry_id=stored.entry_id,
                lease=self._lease_for(sid, config),
            )
        except errors.EntryExistsError:
            same = self.store.sessions.custom_entry(sid, CHECKPOINT, stored.entry_id)
            if same is None or StoredCheckpoint.of(same.id, same.payload) != stored:
                raise
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store ``writes`` of task ``task_id`` for ``config``'s checkpoint, keyed
        by ``(task_id, idx)`` (``idx`` the position, or ``WRITES_IDX_MAP``'s
        negative index for a special channel), as SqliteSaver does: a key
        already stored is kept, unless every write is special (error,
        interrupt, scheduled, resume), which replaces. One append.

        Raises:
            LeaseLostError, BusyError: see the class; nothing is stored.
            EntryExistsError: concurrent writers of the same keys won
                ``WRITE_ATTEMPTS`` times running; nothing is stored.
        """
        thread_id, ns = _thread(config)
        checkpoint_id = str(config["configurable"]["checkpoint_id"])
        sid = self.session_id(thread_id, create=True)
        assert sid is not None
        lease = self._lease_for(sid, config)
        for attempt in range(WRITE_ATTEMPTS):
            existing = _reads.writes(self.store, sid, ns, checkpoint_id)
            added = new_writes(ns, checkpoint_id, writes, task_id, task_path, existing, self.serde)
            if not added:
                return
            try:
                self.store.sessions.append_many(
                    sid,
                    [NewEntry(EntryKind.CUSTOM, w.payload(), entry_id=w.entry_id) for w in added],
                    lease=lease,
                )
                return
            except errors.EntryExistsError:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
                # a concurrent put_writes stored a key first: judge again

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread: its session, with every checkpoint and write of
        every namespace, and its binding (``store.sessions.delete``). A thread
        with no session is left as it is.

        Raises:
            BusyError: someone holds the session and this saver has no lease on it.
            LeaseLostError: the saver's lease is lost. Refused, nothing is deleted.
        """
        sid = self.session_id(str(thread_id))
        if sid is None:
            return
        try:
            self.store.sessions.delete(sid, lease=self._lease_for(sid))
        except errors.SessionNotFoundError:
            return  # deleted meanwhile

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of ``source_thread_id`` (every
        namespace, the whole parent chain) into ``target_thread_id``, created
        when missing; what the target holds under the same keys stays. A
        missing source copies nothing."""
        source = self.session_id(str(source_thread_id))
        if source is None:
            return
        entries = [
            e
            for e in self.store.sessions.entries(source)
            if _ours(e, CHECKPOINT) or _ours(e, WRITE)
        ]
        if not entries:
            return
        target = self.session_id(str(target_thread_id), create=True)
        assert target is not None
        present = {
            r["id"]
            for r in self.store.query(
                "SELECT id FROM entries WHERE session_id = ?", [target]
            ).to_pylist()
        }
        self._append_copies(
            target, [e for e in entries if e.id not in present], self._lease_for(target)
        )

    def _append_copies(
        self, session_id: str, entries: Sequence[Entry], lease: Lease | None
    ) -> None:
        for start in range(0, len(entries), CHUNK):
            self.store.sessions.append_many(
                session_id,
                [
                    NewEntry(e.kind, e.payload, entry_id=e.id, timestamp=e.timestamp)
                    for e in entries[start : start + CHUNK]
                ],
                lease=lease,
            )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune each thread. ``"delete"``: as :meth:`delete_thread`.
        ``"keep_latest"``: per namespace the latest checkpoint and its writes,
        and the ancestors it still needs (a ``DeltaChannel`` rebuilt from the
        writes back to its last snapshot; ``_records.keep_latest``), so the
        thread resumes with the state it had.

        Raises:
            InvalidInputError: another strategy (field ``strategy``); nothing pruned.
            BusyError, LeaseLostError: as :meth:`delete_thread`, for the thread
                being pruned (the threads before it are pruned).
        """
        if strategy not in ("keep_latest", "delete"):
            raise errors.InvalidInputError("strategy", "is 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            sid = self.session_id(str(thread_id))
            if sid is not None:
                self._rewrite(str(thread_id), sid, lambda cps: keep_latest(cps, self.serde))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints of runs ``run_ids`` (their metadata's
        ``run_id``) and their writes, in every thread and namespace; the other
        checkpoints stay (a kept checkpoint may then name a parent that is
        gone, as with LangGraph's SQL savers)."""
        doomed = {str(r) for r in run_ids}
        for sid in _reads.sessions_with_runs(self.store, sorted(doomed)):
            bound = self.store.bindings.find_by_session(sid)
            if bound is None or bound.channel_type != CHANNEL_TYPE:
                continue
            self._rewrite(
                bound.channel_id,
                sid,
                lambda cps: {c.entry_id for c in cps if c.run_id not in doomed},
            )

    def _rewrite(
        self,
        thread_id: str,
        session_id: str,
        choose: Callable[[Sequence[StoredCheckpoint]], set[str]],
    ) -> None:
        """Keep only the checkpoints ``choose`` names (entry ids) and their writes:
        under a lease on the session (the saver's, else a ``mutation`` lease
        held for the rewrite, so that no other write lands meanwhile), the kept
        entries go into a new session, the binding moves to it
        (``bindings.transfer``) and the old session is deleted. A crash in
        between leaves the thread whole on one session (and possibly an
        unbound copy or an unbound old session, which nothing reads)."""
        own = self._lease_for(session_id)
        lease = own or self.store.leases.acquire(
            session_target(session_id),
            f"turnkeeper.langgraph:{uuid.uuid4().hex}",
            ttl_s=REWRITE_TTL_S,
            purpose="mutation",
        )
        deleted = False
        try:
            entries = self.store.sessions.entries(session_id)
            cps = [StoredCheckpoint.of(e.id, e.payload) for e in entries if _ours(e, CHECKPOINT)]
            keep = choose(cps)
            kept_keys = {(c.ns, c.checkpoint_id) for c in cps if c.entry_id in keep}
            kept = [
                e
                for e in entries
                if (_ours(e, CHECKPOINT) and e.id in keep)
                or (_ours(e, WRITE) and _write_key(e) in kept_keys)
                or not (_ours(e, CHECKPOINT) or _ours(e, WRITE))
            ]
            if len(kept) == len(entries):
                return
            if not kept:
                self.store.sessions.delete(session_id, lease=lease)
                deleted = True
                return
            fresh = self.store.sessions.create(
                header={"langgraph": {"thread_id": thread_id, "rewritten_from": session_id}}
            )
            self._append_copies(fresh.id, kept, None)
            moved = [lease]
            if own is not None:
                moved.append(
                    self.store.leases.acquire(
                        session_target(fresh.id),
                        own.owner,
                        ttl_s=REWRITE_TTL_S,
                        purpose=own.purpose,
                    )
                )
            self.store.bindings.transfer(
                CHANNEL_TYPE, thread_id, session_id, fresh.id, leases=moved
            )
            self.store.sessions.delete(session_id, lease=lease)
            deleted = True
            if own is not None and own is self.lease:
                self.lease = moved[1]
        finally:
            if own is None and not deleted:
                self.store.leases.release(lease)

    # -- versions ------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The next channel version: ``<counter, 32 digits>.<random>``, as
        SqliteSaver and InMemorySaver make them (increasing as strings)."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- async: the same calls in a worker thread ------------------------------

    async def _call(self, fn: Callable[..., T], /, *args: Any) -> T:
        """``fn(*args)`` on a worker thread (``asyncio.to_thread``). A cancelled
        call raises ``CancelledError`` at once while ``fn`` runs on to its end
        (its writes may then commit): :class:`AsyncTurnkeeperSaver` waits for it."""
        return await asyncio.to_thread(fn, *args)

    async def asession_id(self, thread_id: str, *, create: bool = False) -> str | None:
        """:meth:`session_id` in a worker thread."""
        return await self._call(lambda: self.session_id(thread_id, create=create))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """:meth:`get_tuple` in a worker thread (the event loop never blocks)."""
        return await self._call(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """:meth:`list` in a worker thread."""
        found = await self._call(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """:meth:`put` in a worker thread."""
        return await self._call(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """:meth:`put_writes` in a worker thread."""
        await self._call(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """:meth:`delete_thread` in a worker thread."""
        await self._call(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """:meth:`copy_thread` in a worker thread."""
        await self._call(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """:meth:`prune` in a worker thread."""
        await self._call(lambda: self.prune(thread_ids, strategy=strategy))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """:meth:`delete_for_runs` in a worker thread."""
        await self._call(self.delete_for_runs, run_ids)


def _write_key(entry: Entry) -> tuple[str, str]:
    w = StoredWrite.of(entry.id, entry.payload)
    return (w.ns, w.checkpoint_id)
