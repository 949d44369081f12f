"""The differential state machine for channel bindings (issue 22).

Runtimes and gateways write ``store.bindings`` as explicit steps on an
injected clock: bind a session to a channel, unbind it, transfer a channel
from one session to another, create a bound session, rotate a channel's
session, replace a session's channel tools, and delete sessions (a delete
frees its channel). Each write is a session write, so it runs under the
session's lease or while nobody holds one: runtimes take leases (an
``execution`` or ``mutation`` runtime lease, granted only on a session that
exists), release them, let them expire as the clock moves, are taken over,
and present stale, forged (another token) or relabelled (another purpose)
leases; a lease of one session given for a write to another is refused
before any I/O. Two gateways race for one channel: each ``look``s where the
channel is bound and later acts on what it saw (binds a channel it saw free,
transfers one from the session it saw), so the loser of a race acts on a
stale view and must get the typed error of its lost race (on PostgreSQL the
second gateway writes through a store object of its own, as another process
would). Sessions that were deleted or never existed are written too.

Every write rule takes ``lost_reply``: the write commits and its caller sees
``OperationalError`` (``ambiguous.py``), then retries the same call; the
retry's outcome is compared with the model's (a bind, an unbind and a
transfer repeat as a no-op, a create or a rotation is refused by the id or
the binding it made, a tool selection is counted again).

:class:`BindingsModel` is the oracle (plain Python, written from the README
and the docstrings of ``store.bindings``, not from its SQL): every store
outcome, refusals with their fields included, is compared with it, and
after every step:

- the ``channel_bindings`` rows are the model's (channel, session, bound
  time), each session's row repeats exactly its binding, and no channel has
  two sessions nor a session two channels;
- ``find``, ``find_by_session`` and ``list`` agree with the model;
- the sessions stored are the model's, with the model's tool generation
  and selection;
- every write refused under a lost lease is recorded in ``fence_events``
  (and nothing else is), so no write under a stale, expired or forged lease
  went unnoticed.

``machine(opener)`` returns the machine class with its stores from
``opener`` (the second gateway's from ``opener.peer``); the fence kill tests
(``model_tests/stateful/test_stateful_bindings.py``) replay its stored
counterexamples with one guard patched out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import multiple, precondition, rule

from turnkeeper import BaseStore, Binding, ChannelToolConfig, Lease

from .ambiguous import replayable
from .base import bound
from .bindings_base import CHANNELS, GATEWAYS, TOOLS, BindingsBase, Write
from .bindings_model import Channel, attempt, label, session_of, target_of
from .opener import StoreOpener
from .oracle import Outcome


class BindingsMachine(BindingsBase):
    """The binding writes of runtimes and gateways, each with and without a
    lost reply, on :class:`~.bindings_base.BindingsBase`'s state."""

    sessions = BindingsBase.sessions
    leases = BindingsBase.leases

    # -- the binding writes ---------------------------------------------------------------

    def _bind(
        self, session: str, channel: Channel, lease: Lease | None, store: BaseStore | None = None
    ) -> Write:
        via = store or self.store

        def apply(_: Outcome) -> None:
            self.model.apply_bind(session, channel, self.clock())

        return Write(
            "bind_session",
            lambda: via.bindings.bind(session, *channel, lease=lease),
            lambda: self.model.expect_bind(session, channel, lease, self.clock()),
            apply,
            lease is not None,
            via,
        )

    def _transfer(
        self,
        channel: Channel,
        from_id: str,
        to_id: str,
        leases: Sequence[Lease],
        store: BaseStore | None = None,
    ) -> Write:
        via = store or self.store

        def apply(_: Outcome) -> None:
            self.model.apply_transfer(channel, to_id, self.clock())

        return Write(
            "transfer_binding",
            lambda: via.bindings.transfer(*channel, from_id, to_id, leases=leases),
            lambda: self.model.expect_transfer(channel, from_id, to_id, leases, self.clock()),
            apply,
            bool(leases),
            via,
        )

    @rule(
        session=sessions,
        channel=st.sampled_from(CHANNELS),
        lease=st.none() | leases,
        lost_reply=st.booleans(),
    )
    def bind(self, session: str, channel: Channel, lease: Lease | None, lost_reply: bool) -> None:
        """Bind a session (the lease's own, when a lease is given) to a channel."""
        session = session if lease is None else session_of(lease)
        replayable("bind", session=session, channel=channel, lease=label(lease), lost=lost_reply)
        self._run(self._bind(session, channel, lease), lost_reply)

    @rule(session=sessions, lease=st.none() | leases, lost_reply=st.booleans())
    def unbind(self, session: str, lease: Lease | None, lost_reply: bool) -> None:
        """Unbind a session (the lease's own, when a lease is given) from its channel."""
        session = session if lease is None else session_of(lease)
        replayable("unbind", session=session, lease=label(lease), lost=lost_reply)

        def call() -> Binding | None:
            return self.store.bindings.unbind(session, lease=lease)

        self._run(
            Write(
                "unbind_session",
                call,
                lambda: self.model.expect_unbind(session, lease, self.clock()),
                lambda _: self.model.apply_unbind(session),
                lease is not None,
            ),
            lost_reply,
        )

    @rule(
        channel=st.sampled_from(CHANNELS),
        from_id=sessions,
        to_id=sessions,
        leases=st.lists(leases, max_size=2),
        current=st.booleans(),
        lost_reply=st.booleans(),
    )
    def transfer(
        self,
        channel: Channel,
        from_id: str,
        to_id: str,
        leases: list[Lease],
        current: bool,
        lost_reply: bool,
    ) -> None:
        """Move a channel between two sessions (from ``from_id``, or from where it
        is bound when ``current``), with leases (each session's own, or some
        other session's, which the move ignores)."""
        if current:
            from_id = self.model.session_on(channel) or from_id
        replayable(
            "transfer",
            channel=channel,
            from_id=from_id,
            to_id=to_id,
            leases=[label(lease) for lease in leases],
            lost=lost_reply,
        )
        self._run(self._transfer(channel, from_id, to_id, leases), lost_reply)

    @rule(gateway=st.sampled_from(GATEWAYS), channel=st.sampled_from(CHANNELS))
    def look(self, gateway: str, channel: Channel) -> None:
        """A gateway reads where a channel is bound, to act on it later."""
        replayable("look", gateway=gateway, channel=channel)
        found = self.of[gateway].bindings.find(*channel)
        seen = None if found is None else found.session_id
        assert seen == self.model.session_on(channel), (channel, found)
        self.views[gateway][channel] = seen

    @rule(
        gateway=st.sampled_from(GATEWAYS),
        channel=st.sampled_from(CHANNELS),
        session=sessions,
        lease=st.none() | leases,
        lost_reply=st.booleans(),
    )
    def route(
        self,
        gateway: str,
        channel: Channel,
        session: str,
        lease: Lease | None,
        lost_reply: bool,
    ) -> None:
        """A gateway acts on what it last saw: a channel it saw free it binds to
        the session (the lease's, when given); one it saw bound it transfers
        from that session. Another gateway may have moved it since: then this
        one's view is stale and its write must lose as the model says."""
        session = session if lease is None else session_of(lease)
        seen = self.views[gateway].get(channel)
        replayable(
            "route",
            gateway=gateway,
            channel=channel,
            session=session,
            lease=label(lease),
            lost=lost_reply,
        )
        if seen is None:
            self._run(self._bind(session, channel, lease, self.of[gateway]), lost_reply)
        else:
            held = [] if lease is None else [lease]
            self._run(self._transfer(channel, seen, session, held, self.of[gateway]), lost_reply)

    @rule(
        target=sessions,
        channel=st.sampled_from(CHANNELS),
        which=st.sampled_from(("new", "existing", "deleted")),
        free=st.booleans(),
        lost_reply=st.booleans(),
    )
    def create_bound(self, channel: Channel, which: str, free: bool, lost_reply: bool) -> Any:
        """Create a session bound to a channel (a free one, if any, when
        ``free``): a new id, or one taken or deleted."""
        if free:
            channel = next((c for c in CHANNELS if c not in self.model.bound), channel)
        session = self._pick_id(which)
        replayable("create_bound", channel=channel, session=session, lost=lost_reply)

        def call() -> tuple[str, str | None, str | None]:
            made = self.store.bindings.create_bound(*channel, session_id=session)
            return (made.id, made.channel_type, made.channel_id)

        def apply(_: Outcome) -> None:
            self.model.apply_create(channel, session, self.clock())

        before = set(self.model.sessions)
        self._run(
            Write(
                "create_bound",
                call,
                lambda: self.model.expect_create_bound(channel, session),
                apply,
                False,
            ),
            lost_reply,
        )
        return session if session not in before and session in self.model.sessions else multiple()

    @rule(
        target=sessions,
        channel=st.sampled_from(CHANNELS),
        old=sessions,
        which=st.sampled_from(("new", "existing", "deleted")),
        lease=st.none() | leases,
        current=st.booleans(),
        lost_reply=st.booleans(),
    )
    def rotate(
        self,
        channel: Channel,
        old: str,
        which: str,
        lease: Lease | None,
        current: bool,
        lost_reply: bool,
    ) -> Any:
        """Replace the channel's session (``old``; the lease's, when a lease is
        given; else where the channel is bound, when ``current``) with a new one."""
        if current:
            old = self.model.session_on(channel) or old
        old = old if lease is None else session_of(lease)
        session = self._pick_id(which)
        replayable(
            "rotate",
            channel=channel,
            old=old,
            session=session,
            lease=label(lease),
            lost=lost_reply,
        )

        def call() -> tuple[str, str | None, str | None]:
            made = self.store.bindings.rotate(*channel, old, session_id=session, lease=lease)
            return (made.id, made.channel_type, made.channel_id)

        def apply(_: Outcome) -> None:
            self.model.apply_unbind(old)
            self.model.apply_create(channel, session, self.clock())

        before = set(self.model.sessions)
        self._run(
            Write(
                "rotate_bound_session",
                call,
                lambda: self.model.expect_rotate(channel, old, session, lease, self.clock()),
                apply,
                lease is not None,
            ),
            lost_reply,
        )
        return session if session not in before and session in self.model.sessions else multiple()

    @rule(
        session=sessions,
        tools=st.sampled_from(TOOLS),
        lease=st.none() | leases,
        lost_reply=st.booleans(),
    )
    def set_tools(
        self,
        session: str,
        tools: tuple[ChannelToolConfig, ...],
        lease: Lease | None,
        lost_reply: bool,
    ) -> None:
        """Replace a session's channel tools (the lease's session, when a lease
        is given), then read them back as a runtime does."""
        session = session if lease is None else session_of(lease)
        replayable("set_tools", session=session, tools=tools, lease=label(lease), lost=lost_reply)

        def call() -> int:
            return self.store.bindings.set_tools(session, list(tools), lease=lease)

        got = self._run(
            Write(
                "set_channel_tools",
                call,
                lambda: self.model.expect_set_tools(session, lease, self.clock()),
                lambda _: self.model.apply_set_tools(session, tools),
                lease is not None,
            ),
            lost_reply,
        )
        if got[0] == "ok":  # read back as a runtime reads it
            assert self.store.bindings.tool_generation(session) == got[1], (session, got)
            assert tuple(self.store.bindings.tools(session)) == tools, session

    @precondition(lambda self: len(self.model.deleted) < 2)
    @rule(session=sessions, lease=st.none() | leases, lost_reply=st.booleans())
    def delete(self, session: str, lease: Lease | None, lost_reply: bool) -> None:
        """Delete a session: its channel is free for another, its id is gone for
        good (at most two per example: the other rules need sessions)."""
        session = session if lease is None else session_of(lease)
        replayable("delete", session=session, lease=label(lease), lost=lost_reply)

        def call() -> None:
            self.store.sessions.delete(session, lease=lease)

        self._run(
            Write(
                "delete_session",
                call,
                lambda: self.model.expect_delete(session, lease, self.clock()),
                lambda _: self.model.apply_delete(session),
                lease is not None,
            ),
            lost_reply,
        )

    @rule(
        session=sessions,
        lease=leases,
        operation=st.sampled_from(("bind", "unbind", "rotate", "set_tools")),
    )
    def write_with_a_foreign_lease(self, session: str, lease: Lease, operation: str) -> None:
        """A lease is authority over its own session only: one of another
        session is refused before anything is read or written."""
        if lease.target == target_of(session):
            return
        replayable("write_with_a_foreign_lease", session=session, lease=label(lease), op=operation)
        channel = CHANNELS[0]
        calls: dict[str, Callable[[], Any]] = {
            "bind": lambda: self.store.bindings.bind(session, *channel, lease=lease),
            "unbind": lambda: self.store.bindings.unbind(session, lease=lease),
            "rotate": lambda: self.store.bindings.rotate(
                *channel, session, session_id=self._fresh(), lease=lease
            ),
            "set_tools": lambda: self.store.bindings.set_tools(session, [], lease=lease),
        }
        got = attempt(calls[operation])
        assert got == ("invalid", "lease"), (operation, session, label(lease), got)


def machine(opener: StoreOpener) -> type[BindingsMachine]:
    """The machine with its stores from ``opener``."""
    return bound(BindingsMachine, opener, f"BindingsMachine[{opener.name}]")
