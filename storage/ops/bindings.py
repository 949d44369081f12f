"""``store.bindings``: channel bindings and channel tools (session seed BindSession,
UnbindSession, TransferBinding, FindBinding, FindBindingBySessionID, ListBindings,
CreateBound, RotateBoundSession, Manager.InitWithBinding / InitWithIDAndBinding,
IdentityLocks, SetChannelTools, ListChannelTools, GetChannelToolGeneration).

A binding ties an external channel identity ``(channel_type, channel_id)`` (a
chat, a DM thread, a mailbox …) to the one session that answers it: a row of
``channel_bindings``, whose keys are the database's guard that a channel names
at most one session (its primary key) and a session has at most one channel
(a unique key). The session's row repeats its binding (``channel_type``,
``channel_id``: the seed's Header and SessionInfo fields, read as
``turnkeeper.Session.channel_type`` …), written in the same transaction by
this module only.

**Moves are atomic, on both engines and across processes.** The seed
serializes the operations on one identity with an in-process lock
(``IdentityLocks``); a lock in one process guards nothing in another, so
turnkeeper has none: every binding write is one transaction that reads the
binding, decides, and writes. A move (:meth:`Bindings.transfer`,
:meth:`Bindings.rotate`) deletes the old session's binding row and inserts
the new one's in that one transaction, so no reader ever sees a channel with
two sessions, or with none in the middle of a move, and a move fails whole.
Two writers racing for one channel meet in the database: on DuckDB its write
lock orders them; on PostgreSQL on the rows they both write (the binding's
key: the second waits for the first, then its duplicate key is a lost race;
or a session row both write: a serialization failure); either way the loser's
transaction is retried from the start, reads the winner's binding and gets the
typed error it means (``ChannelBoundError``, ``BindingNotFoundError`` …).

**The session-write rule.** A binding write changes its sessions' rows, so it
is a session write: each session it changes (both of a transfer; the old one
of a rotation) is written under its lease, or only while nobody holds a live
lease on it (``BusyError``), fenced in the write's own transaction.
Creating a bound session is outside the rule, as creating a session is.

**Delete.** Deleting a session (``store.sessions.delete``, a project's delete,
retention) deletes its binding with it (``channel_bindings``: the channel is free
for another session) and its channel tool selection (``channel_tools``).
A fork is a copy of its own and is never bound by the fork.

Channel tools are a session's tool selection (a list of
:class:`~turnkeeper.spec.records.ChannelToolConfig`), replaced as a whole; the
generation counts the replacements (0 before the first), so a runtime can see
that its cached selection is stale. They belong to the session, bound or not,
and stay when it is unbound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import uuid6

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import Binding, ChannelToolConfig, Lease, Session

from ..backend import STORE_NOW, Tx, keyed
from ..codec import check_id, check_text, from_json, to_json
from ..pairing import Opening
from ..validate import check_bool, check_header, check_session_lease, check_session_leases
from . import leases, session_rows
from .base import Area, record_fenced

Channel = tuple[str, str]
"""``(channel_type, channel_id)``."""


def bound_to(tx: Tx, channel: Channel) -> str | None:
    """The session the channel is bound to, or ``None``."""
    row = tx.one(
        f"SELECT session_id FROM channel_bindings WHERE {keyed('channel_id', 'channel_type = ?')}",
        [channel[1], channel[0]],
    )
    return None if row is None else str(row[0])


def binding_of(tx: Tx, session_id: str) -> Channel | None:
    """The session's channel, or ``None`` when it is local.

    Raises:
        SessionNotFoundError.
    """
    if tx.one("SELECT 1 FROM sessions WHERE id = ?", [session_id]) is None:
        raise errors.SessionNotFoundError(session_id)
    row = tx.one(
        "SELECT channel_type, channel_id FROM channel_bindings WHERE session_id = ?", [session_id]
    )
    return None if row is None else (row[0], row[1])


def _mirror(tx: Tx, session_id: str, channel: Channel | None) -> None:
    """Repeat the session's binding on its row (``Session.channel_type`` …)."""
    tx.exec(
        "UPDATE sessions SET channel_type = ?, channel_id = ? WHERE id = ?",
        [*(channel or (None, None)), session_id],
    )


def attach(tx: Tx, session_id: str, channel: Channel) -> None:
    """Bind a session that is local to a channel that is free (the caller checked
    both; a concurrent binder's duplicate key is a lost race, retried)."""
    tx.exec(
        "INSERT INTO channel_bindings (channel_id, channel_type, session_id, bound_at) "
        f"VALUES (?, ?, ?, {STORE_NOW})",
        [channel[1], channel[0], session_id, tx.now],
    )
    _mirror(tx, session_id, channel)


def detach(tx: Tx, session_id: str) -> None:
    """Make a session local."""
    tx.exec("DELETE FROM channel_bindings WHERE session_id = ?", [session_id])
    _mirror(tx, session_id, None)


def _writable(tx: Tx, session_id: str, lease: Lease | None) -> Channel | None:
    """The session's channel, once the session-write rule allows writing it.

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError.
    """
    channel = binding_of(tx, session_id)
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    return channel


def bind(tx: Tx, session_id: str, channel: Channel, lease: Lease | None) -> Binding:
    """Bind the session to ``channel`` (see :meth:`Bindings.bind`).

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError, SessionBoundError,
        ChannelBoundError.
    """
    current = _writable(tx, session_id, lease)
    if current == channel:
        return Binding(session_id, *channel)
    if current is not None:
        raise errors.SessionBoundError(session_id, *current)
    other = bound_to(tx, channel)
    if other is not None:
        raise errors.ChannelBoundError(*channel, other)
    attach(tx, session_id, channel)
    return Binding(session_id, *channel)


def unbind(tx: Tx, session_id: str, lease: Lease | None) -> Binding | None:
    """Make the session local (see :meth:`Bindings.unbind`).

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError.
    """
    current = _writable(tx, session_id, lease)
    if current is None:
        return None
    detach(tx, session_id)
    return Binding(session_id, *current)


def transfer(
    tx: Tx, channel: Channel, from_id: str, to_id: str, held: Mapping[str, Lease]
) -> Binding:
    """Move the channel's binding (see :meth:`Bindings.transfer`).

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError, BindingNotFoundError,
        SessionBoundError.
    """
    found: dict[str, Channel | None] = {}
    for sid in sorted({from_id, to_id}):  # one order: two opposite moves never deadlock
        found[sid] = _writable(tx, sid, held.get(session_target(sid)))
    bound = bound_to(tx, channel)
    if bound == to_id:  # done already (a retry after an unknown commit)
        return Binding(to_id, *channel)
    if bound != from_id:
        raise errors.BindingNotFoundError(*channel, from_id, bound)
    target = found[to_id]
    if target is not None:
        raise errors.SessionBoundError(to_id, *target)
    detach(tx, from_id)
    attach(tx, to_id, channel)
    return Binding(to_id, *channel)


def create_bound(tx: Tx, channel: Channel, session_id: str, cwd: str, header_json: str) -> Session:
    """A new session bound to ``channel`` (see :meth:`Bindings.create_bound`).

    Raises:
        ChannelBoundError, SessionIDExistsError.
    """
    other = bound_to(tx, channel)
    if other is not None and other != session_id:
        raise errors.ChannelBoundError(*channel, other)
    session = session_rows.create(tx, session_id, cwd, header_json, None)
    attach(tx, session_id, channel)
    return replace(session, channel_type=channel[0], channel_id=channel[1])


def rotate(
    tx: Tx,
    channel: Channel,
    old_id: str,
    new_id: str,
    cwd: str | None,
    header_json: str,
    lease: Lease | None,
) -> Session:
    """A new session bound to ``channel`` in place of ``old_id`` (see :meth:`Bindings.rotate`).

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError, BindingNotFoundError,
        SessionIDExistsError.
    """
    _writable(tx, old_id, lease)
    bound = bound_to(tx, channel)
    if bound != old_id:
        raise errors.BindingNotFoundError(*channel, old_id, bound)
    if cwd is None:
        old = session_rows.get(tx, old_id)
        assert old is not None  # read above, in this transaction
        cwd = old.cwd
    detach(tx, old_id)
    session = session_rows.create(tx, new_id, cwd, header_json, None)
    attach(tx, new_id, channel)
    return replace(session, channel_type=channel[0], channel_id=channel[1])


def _tool_row(tx: Tx, session_id: str) -> tuple[int, str | None]:
    """The session's tool generation and stored selection (0 and ``None``: never set).

    Raises:
        SessionNotFoundError.
    """
    row = tx.one(
        "SELECT s.id, t.generation, t.tools FROM sessions s "
        "LEFT JOIN channel_tools t ON t.session_id = s.id WHERE s.id = ?",
        [session_id],
    )
    if row is None:
        raise errors.SessionNotFoundError(session_id)
    return (0, None) if row[1] is None else (int(row[1]), row[2])


def set_tools(tx: Tx, session_id: str, tools_json: str, lease: Lease | None) -> int:
    """Replace the session's tool selection; returns the new generation.

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError.
    """
    generation, stored = _tool_row(tx, session_id)
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    if stored is None:
        tx.exec(
            "INSERT INTO channel_tools (session_id, generation, tools, updated_at) "
            f"VALUES (?, 1, ?, {STORE_NOW})",
            [session_id, tools_json, tx.now],
        )
        return 1
    tx.exec(
        f"UPDATE channel_tools SET generation = ?, tools = ?, updated_at = {STORE_NOW} "
        "WHERE session_id = ?",
        [generation + 1, tools_json, tx.now, session_id],
    )
    return generation + 1


def _tools_from(stored: str | None) -> list[ChannelToolConfig]:
    if stored is None:
        return []
    return [ChannelToolConfig(t["toolName"], t["enabled"]) for t in from_json(stored)]


# -- the store's methods ------------------------------------------------------------


def _channel(channel_type: object, channel_id: object) -> Channel:
    return (check_id(channel_type, "channel_type"), check_id(channel_id, "channel_id"))


def _tools_json(tools: object) -> str:
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence):
        raise errors.InvalidInputError("tools", "expected a sequence of ChannelToolConfig")
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, ChannelToolConfig):
            raise errors.InvalidInputError(f"tools[{i}]", "expected a ChannelToolConfig")
        name = check_id(tool.tool_name, f"tools[{i}].tool_name")
        check_bool(tool.enabled, f"tools[{i}].enabled")
        if name in seen:
            raise errors.InvalidInputError(f"tools[{i}]", f"tool {name!r} is given twice")
        seen.add(name)
        out.append({"toolName": name, "enabled": tool.enabled})
    return to_json(out, "tools")


class Bindings(Area):
    """``store.bindings``: see the module docstring."""

    def _created(self, session: Session) -> Session:
        self._openings.put(session.id, Opening(None, session.next_seq))  # empty: none open
        return session

    def bind(
        self, session_id: str, channel_type: str, channel_id: str, *, lease: Lease | None = None
    ) -> Binding:
        """Bind session ``session_id`` to channel identity ``(channel_type,
        channel_id)`` and return the binding (session seed BindSession). Binding
        it again to the same channel changes nothing and returns the binding. A
        session write: under the session's ``lease``, or only while nobody holds
        a live lease on it.

        Raises:
            SessionNotFoundError: no session has this id.
            SessionBoundError: the session is bound to another channel (unbind it first).
            ChannelBoundError: the channel is bound to another session (move it
                with :meth:`transfer`).
            BusyError: no ``lease`` given and a live lease holds the session.
            LeaseLostError: ``lease`` is no longer the held, unexpired one.
            InvalidInputError: a bad id or channel, or a lease on another target.

        Refused, it writes nothing.
        """
        check_id(session_id, "session_id")
        channel = _channel(channel_type, channel_id)
        check_session_lease(session_id, lease)
        return self._fenced("bind_session", lease, lambda tx: bind(tx, session_id, channel, lease))

    def unbind(self, session_id: str, *, lease: Lease | None = None) -> Binding | None:
        """Make a channel-bound session local while keeping its history (session
        seed UnbindSession); returns the binding it removed, ``None`` when the
        session was local already (nothing changes). Its channel is then free.
        A session write, as :meth:`bind` is.

        Raises:
            SessionNotFoundError: no session has this id.
            BusyError: no ``lease`` given and a live lease holds the session.
            LeaseLostError: ``lease`` is no longer the held, unexpired one.
            InvalidInputError: a bad id, or a lease on another target.
        """
        check_id(session_id, "session_id")
        check_session_lease(session_id, lease)
        return self._fenced("unbind_session", lease, lambda tx: unbind(tx, session_id, lease))

    def transfer(
        self,
        channel_type: str,
        channel_id: str,
        from_session_id: str,
        to_session_id: str,
        *,
        leases: Sequence[Lease] = (),
    ) -> Binding:
        """Move the channel's binding from ``from_session_id`` to
        ``to_session_id`` atomically (session seed TransferBinding): in one
        transaction the first is made local and the second bound, so the
        channel never has two sessions or none. A compare-and-set: the channel
        must be bound to ``from_session_id``; when it is bound to
        ``to_session_id`` already (a retry after an unknown commit) the binding
        is returned and nothing changes. It writes both sessions, each under
        its lease in ``leases`` (leases on ``session:<id>``; others of sessions
        it does not write are ignored), else only while nobody holds a live
        lease on it.

        Raises:
            SessionNotFoundError: either session does not exist.
            BindingNotFoundError: the channel is not bound to ``from_session_id``
                (``bound_session_id`` says to which session it is, if any).
            SessionBoundError: ``to_session_id`` is bound to another channel.
            BusyError: a session is held and its lease is not in ``leases``.
            LeaseLostError: a lease in ``leases`` is no longer the held one.
            InvalidInputError: a bad id, channel or lease.

        Refused, it writes nothing.
        """
        channel = _channel(channel_type, channel_id)
        check_id(from_session_id, "from_session_id")
        check_id(to_session_id, "to_session_id")
        held = check_session_leases(leases)

        def body(tx: Tx) -> Binding:
            return transfer(tx, channel, from_session_id, to_session_id, held)

        try:
            return self.db.write("transfer_binding", body)
        except errors.LeaseLostError as lost:
            refused = held.get(lost.target)
            if refused is not None:
                self.db.write(
                    "record_fenced",
                    lambda tx: record_fenced(tx, refused, "transfer_binding"),
                    transaction=False,
                )
            raise

    def find(self, channel_type: str, channel_id: str) -> Binding | None:
        """The channel's current binding, or ``None`` when no session is bound to
        it (session seed FindBinding).

        Raises:
            InvalidInputError: a bad channel.
        """
        channel = _channel(channel_type, channel_id)
        sid = self.db.read("find_binding", lambda tx: bound_to(tx, channel))
        return None if sid is None else Binding(sid, *channel)

    def find_by_session(self, session_id: str) -> Binding | None:
        """The session's current binding, or ``None`` when it is local (session
        seed FindBindingBySessionID).

        Raises:
            SessionNotFoundError: no session has this id.
            InvalidInputError: a bad id.
        """
        check_id(session_id, "session_id")
        channel = self.db.read("find_binding_by_session", lambda tx: binding_of(tx, session_id))
        return None if channel is None else Binding(session_id, *channel)

    def create_bound(
        self,
        channel_type: str,
        channel_id: str,
        *,
        session_id: str | None = None,
        cwd: str = "",
        header: Mapping[str, Any] | None = None,
    ) -> Session:
        """Create a new empty session bound to the channel (session seed
        CreateBound; with ``session_id``, Manager.InitWithIDAndBinding; without,
        Manager.InitWithBinding): its id is ``session_id``, else a new UUIDv7;
        ``cwd`` and ``header`` as ``store.sessions.create`` takes them. The
        create and the bind are one transaction.

        Raises:
            ChannelBoundError: the channel is bound to another session (see
                :meth:`rotate` to replace it).
            SessionIDExistsError: ``session_id`` is taken or was deleted.
            InvalidInputError: a bad id, channel, cwd or header.
        """
        channel = _channel(channel_type, channel_id)
        sid = str(uuid6.uuid7()) if session_id is None else check_id(session_id, "session_id")
        check_text(cwd, "cwd")
        header_json = to_json(check_header(header), "header")
        return self._created(
            self.db.write(
                "create_bound", lambda tx: create_bound(tx, channel, sid, cwd, header_json)
            )
        )

    def rotate(
        self,
        channel_type: str,
        channel_id: str,
        old_session_id: str,
        *,
        session_id: str | None = None,
        cwd: str | None = None,
        header: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
    ) -> Session:
        """Create a new session bound to the channel in place of
        ``old_session_id``, which is made local and keeps its history, in one
        transaction (session seed RotateBoundSession: "atomically creates a new
        bound session and clears the old one"). A compare-and-set: the channel
        must be bound to ``old_session_id``. The new session's id is
        ``session_id``, else a new UUIDv7; its ``cwd`` is the old one's unless
        given. Clearing the old session is a session write: under its
        ``lease``, or only while nobody holds a live lease on it.

        A retry after an unknown commit finds the channel bound to the new
        session: ``BindingNotFoundError`` with ``bound_session_id`` naming it.

        Raises:
            SessionNotFoundError: ``old_session_id`` does not exist.
            BindingNotFoundError: the channel is not bound to ``old_session_id``.
            SessionIDExistsError: ``session_id`` is taken or was deleted.
            BusyError: no ``lease`` given and a live lease holds the old session.
            LeaseLostError: ``lease`` is no longer the held, unexpired one.
            InvalidInputError: a bad id, channel, cwd, header or lease.

        Refused, it writes nothing.
        """
        channel = _channel(channel_type, channel_id)
        check_id(old_session_id, "old_session_id")
        sid = str(uuid6.uuid7()) if session_id is None else check_id(session_id, "session_id")
        if cwd is not None:
            check_text(cwd, "cwd")
        header_json = to_json(check_header(header), "header")
        check_session_lease(old_session_id, lease)
        return self._created(
            self._fenced(
                "rotate_bound_session",
                lease,
                lambda tx: rotate(tx, channel, old_session_id, sid, cwd, header_json, lease),
            )
        )

    def set_tools(
        self,
        session_id: str,
        tools: Sequence[ChannelToolConfig],
        *,
        lease: Lease | None = None,
    ) -> int:
        """Replace the session's channel tool selection with ``tools`` (kept in
        this order) and return the new generation: 1 for the first, one more
        for each later call (session seed SetChannelTools). A session write:
        under the session's ``lease``, or only while nobody holds a live lease.

        Raises:
            SessionNotFoundError: no session has this id.
            BusyError: no ``lease`` given and a live lease holds the session.
            LeaseLostError: ``lease`` is no longer the held, unexpired one.
            InvalidInputError: not a sequence of ``ChannelToolConfig``, a tool
                named twice, a bad name or ``enabled`` that is no bool, a bad
                id or lease.

        Refused, it writes nothing.
        """
        check_id(session_id, "session_id")
        tools_json = _tools_json(tools)
        check_session_lease(session_id, lease)
        return self._fenced(
            "set_channel_tools", lease, lambda tx: set_tools(tx, session_id, tools_json, lease)
        )

    def tools(self, session_id: str) -> list[ChannelToolConfig]:
        """The session's channel tool selection as last set, in its order; ``[]``
        when never set (session seed ListChannelTools).

        Raises:
            SessionNotFoundError: no session has this id.
            InvalidInputError: a bad id.
        """
        check_id(session_id, "session_id")
        _, stored = self.db.read("list_channel_tools", lambda tx: _tool_row(tx, session_id))
        return _tools_from(stored)

    def tool_generation(self, session_id: str) -> int:
        """How many times the session's tool selection was set (0: never;
        session seed GetChannelToolGeneration).

        Raises:
            SessionNotFoundError: no session has this id.
            InvalidInputError: a bad id.
        """
        check_id(session_id, "session_id")
        generation, _ = self.db.read(
            "get_channel_tool_generation", lambda tx: _tool_row(tx, session_id)
        )
        return generation

    def list(self, *, channel_type: str | None = None) -> list[Binding]:
        """Every current binding (only ``channel_type``'s when given), by channel
        type, then channel id (session seed ListBindings).

        Raises:
            InvalidInputError: a bad ``channel_type``.
        """
        if channel_type is not None:
            check_id(channel_type, "channel_type")
        where = "channel_id IS NOT NULL" + (" AND channel_type = ?" if channel_type else "")
        rows = self.db.read(
            "list_bindings",
            lambda tx: tx.rows(
                f"SELECT id, channel_type, channel_id FROM sessions WHERE {where} "
                "ORDER BY channel_type, channel_id",
                [] if channel_type is None else [channel_type],
            ),
        )
        return [Binding(*r) for r in rows]
