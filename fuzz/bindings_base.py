"""The channel-bindings machine's state and checks (:mod:`.bindings` adds
the binding writes): its stores (the machine's own, and the second
gateway's from ``opener.peer``), the sessions and leases bundles, the
runtimes' lease and clock steps, the driver that runs a write and, after a
lost reply, its retry, and the invariants checked after every step against
the store's own tables and lookups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from json import loads
from typing import Any, cast

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, multiple, rule

from turnkeeper import BaseStore, Binding, ChannelToolConfig, Lease

from .ambiguous import ambiguously, replayable
from .base import FuzzMachine, checked
from .bindings_model import BindingsModel, Channel, attempt, label, target_of
from .oracle import Outcome

SESSIONS = ("s1", "s2", "s3")
GHOST = "ghost"
"""A session id that never exists (in the sessions bundle from the start)."""
CHANNELS: tuple[Channel, ...] = (("chat", "c1"), ("chat", "c2"), ("mail", "c1"))
"""Two types, and one channel id under both: a channel is the pair."""
OWNERS = ("R1", "R2")
GATEWAYS = ("G1", "G2")
PURPOSES = ("execution", "mutation")
TOOLS = (
    (),
    (ChannelToolConfig("web_search", True),),
    (ChannelToolConfig("bash", False), ChannelToolConfig("web_search", True)),
)


@dataclass(frozen=True)
class Write:
    """One write step: what it is (``operation``, the store's name for its
    write), how to call it, what the model expects, and how the model
    records it."""

    operation: str
    call: Callable[[], Any]
    expect: Callable[[], Outcome]
    apply: Callable[[Outcome], None]
    leased: bool
    """Whether a lease was given (a lost lease is then recorded)."""
    store: BaseStore | None = None
    """The store object it writes through (``None``: the machine's own)."""


class BindingsBase(FuzzMachine):
    """Runtimes R1 and R2 and gateways G1 and G2 on three sessions and three
    channels: the state, the lease and clock steps and the invariants of
    :class:`~.bindings.BindingsMachine`."""

    sessions = Bundle("sessions")
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.model = BindingsModel()
        self.views: dict[str, dict[Channel, str | None]] = {g: {} for g in GATEWAYS}
        self.other = self.opener.peer(self.store, self.clock)
        self.of = {"G1": self.store, "G2": self.other or self.store}
        """Each gateway's store object: where the engine allows one (PostgreSQL)
        G2 has its own (its own connections and caches), as a gateway process
        of its own would."""
        self.n = 0

    def teardown(self) -> None:
        """Close the second gateway's store object, then the example's store."""
        if self.other is not None:
            self.other.close()
        super().teardown()

    @initialize(target=sessions)
    def create_sessions(self) -> Any:
        """Create s1, s2 and s3; the sessions bundle also holds ``ghost``."""
        for sid in SESSIONS:
            self.store.sessions.create(sid)
            self.model.sessions.add(sid)
        return multiple(*SESSIONS, GHOST)

    def _fresh(self) -> str:
        self.n += 1
        return f"n{self.n}"

    def _run(self, write: Write, lost_reply: bool) -> Outcome:
        """Run ``write`` (its reply lost when ``lost_reply``) and compare it,
        and the retry after a lost reply, with the model; returns the outcome
        the caller finally saw."""
        expected = write.expect()
        if not lost_reply:
            got = attempt(write.call)
            assert got == expected, (write.operation, got, expected)
            self._record(write, got)
            return got
        got = ambiguously(write.store or self.store, attempt, write.call)
        if expected[0] != "ok":
            assert got == expected, (write.operation, got, expected)
            self.model.refused(got, write.leased)
            return got
        assert got == ("ambiguous", (write.operation,)), (write.operation, got, expected)
        write.apply(expected)  # it committed
        again = write.expect()
        retried = attempt(write.call)
        assert retried == again, (
            f"the retry of a committed {write.operation}: {retried}, the model says {again}"
        )
        self._record(write, retried)
        return retried

    def _record(self, write: Write, got: Outcome) -> None:
        if got[0] == "ok":
            write.apply(got)
        else:
            self.model.refused(got, write.leased)

    # -- leases and time ---------------------------------------------------------------

    @rule(
        target=leases,
        owner=st.sampled_from(OWNERS),
        session=sessions,
        ttl=st.sampled_from((1.0, 3.0)),
        purpose=st.sampled_from(PURPOSES),
    )
    def acquire(self, owner: str, session: str, ttl: float, purpose: str) -> Any:
        """A runtime's lease on a session (a takeover once the holder's expired)."""
        replayable("acquire", owner=owner, session=session, ttl=ttl, purpose=purpose)
        now = self.clock()
        expected = self.model.acquire(session, owner, ttl, purpose, now)
        got = attempt(self.store.leases.acquire, target_of(session), owner, ttl, purpose=purpose)
        if expected[0] in ("granted", "reacquired"):
            assert got[0] == "ok" and got[1].epoch == expected[1], (got, expected)
            lease = cast(Lease, got[1])
            self.model.tokens[lease.target] = lease.token
            return lease
        tag = {"busy": "busy", "purpose": "purpose", "no_session": "no_session"}[expected[0]]
        assert got[0] == tag, (got, expected)
        return multiple()

    @rule(lease=leases)
    def release(self, lease: Lease) -> None:
        """Release a lease (a stale or forged one releases nothing)."""
        replayable("release", lease=label(lease))
        self.model.release(lease, self.clock())
        self.store.leases.release(lease)

    @rule(lease=leases, how=st.sampled_from(("token", "purpose")), target=leases)
    def forge(self, lease: Lease, how: str) -> Lease:
        """A lease as a confused or hostile runtime presents it: another token
        (its owner and epoch right), or relabelled with another purpose."""
        replayable("forge", lease=label(lease), how=how)
        if how == "token":
            return replace(lease, token="forged-" + lease.token[::-1])
        other = next(p for p in PURPOSES if p != lease.purpose)
        return replace(lease, purpose=other)

    @rule(seconds=st.sampled_from((0.5, 1.0, 2.5)))
    def advance(self, seconds: float) -> None:
        """Time passes: leases expire (the longest lives 3 s)."""
        replayable("advance", seconds=seconds)
        self.clock.advance(seconds)

    def _pick_id(self, which: str) -> str:
        if which == "existing" and self.model.sessions:
            return sorted(self.model.sessions)[0]
        if which == "deleted" and self.model.deleted:
            return sorted(self.model.deleted)[0]
        return self._fresh()

    # -- invariants ----------------------------------------------------------------------

    @checked
    def bindings_are_the_models(self) -> None:
        """The table, each session row's copy, and the keys' promise: one session
        per channel, one channel per session."""
        rows = self.store.db.read(
            "test-bindings",
            lambda tx: tx.rows(
                "SELECT channel_type, channel_id, session_id, bound_at FROM channel_bindings"
            ),
        )
        stored = {(r[0], r[1]): (r[2], r[3]) for r in rows}
        assert len(stored) == len(rows), f"a channel with two sessions: {rows}"
        sessions = [s for s, _ in stored.values()]
        assert len(set(sessions)) == len(sessions), f"a session with two channels: {rows}"
        assert stored == self.model.bound, (stored, self.model.bound)
        mirrored = self.store.db.read(
            "test-mirror",
            lambda tx: tx.rows(
                "SELECT id, channel_type, channel_id FROM sessions "
                "WHERE channel_type IS NOT NULL OR channel_id IS NOT NULL"
            ),
        )
        assert sorted(mirrored) == sorted((s, *c) for c, (s, _) in self.model.bound.items()), (
            mirrored,
            self.model.bound,
        )

    @checked
    def lookups_are_the_models(self) -> None:
        """``find``, ``find_by_session`` and ``list`` (all, and by type) agree with the model."""
        for channel in CHANNELS:
            found = self.store.bindings.find(*channel)
            assert (found.session_id if found else None) == self.model.session_on(channel)
        for sid in sorted(self.model.sessions):
            mine = self.model.channel_of(sid)
            assert self.store.bindings.find_by_session(sid) == (
                None if mine is None else Binding(sid, *mine)
            ), sid
        assert self.store.bindings.list() == sorted(
            (Binding(s, *c) for c, (s, _) in self.model.bound.items()),
            key=lambda b: (b.channel_type, b.channel_id),
        )
        chats = self.store.bindings.list(channel_type="chat")
        assert [b.channel_id for b in chats] == sorted(
            c[1] for c in self.model.bound if c[0] == "chat"
        )

    @checked
    def sessions_and_tools_are_the_models(self) -> None:
        """The sessions stored, and the ``channel_tools`` rows (read as one
        table: ``set_tools`` reads each selection it wrote back through the API)."""
        ids = self.store.db.read("test-sessions", lambda tx: tx.rows("SELECT id FROM sessions"))
        assert {r[0] for r in ids} == self.model.sessions, (ids, self.model.sessions)
        rows = self.store.db.read(
            "test-tools",
            lambda tx: tx.rows("SELECT session_id, generation, tools FROM channel_tools"),
        )
        stored = {
            r[0]: (r[1], tuple(ChannelToolConfig(t["toolName"], t["enabled"]) for t in loads(r[2])))
            for r in rows
        }
        assert stored == self.model.tools, (stored, self.model.tools)

    @checked
    def every_lost_lease_write_is_recorded(self) -> None:
        """Each write refused under a lost lease left its ``fence_events`` row,
        and no other write did (an accepted write under a stale lease would
        leave the count short of the model's)."""
        row = self.store.db.read(
            "test-fenced", lambda tx: tx.one("SELECT count(*) FROM fence_events")
        )
        assert row is not None and row[0] == self.model.fenced, (row, self.model.fenced)
