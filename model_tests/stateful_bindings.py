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

``make_machine(backend)`` returns the machine class for a backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from json import loads
from typing import Any, ClassVar, cast

import conftest
from conftest import close_backend, open_backend
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from turnkeeper import (
    BaseStore,
    Binding,
    BindingNotFoundError,
    BusyError,
    ChannelBoundError,
    ChannelToolConfig,
    InvalidInputError,
    Lease,
    LeaseLostError,
    LeasePurposeError,
    OperationalError,
    RuntimeSessionNotFoundError,
    SessionBoundError,
    SessionIDExistsError,
    SessionNotFoundError,
    TurnkeeperError,
)
from turnkeeper.fuzz import FakeClock
from turnkeeper.fuzz.ambiguous import INJECTED, ambiguously, replayable
from turnkeeper.fuzz.oracle import Oracle

Channel = tuple[str, str]
"""``(channel_type, channel_id)``."""
Outcome = tuple[Any, ...]
"""What a call gave: ``("ok", value)`` or a refusal's tag and its fields."""

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


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """``fn(*args, **kwargs)`` as an outcome: ``("ok", what it returned)``, or a
    refusal with the fields that say why (``("error", …)``: a typed error no
    rule expects, such as the conflict a database key raises when a typed
    check before it is gone)."""
    try:
        return ("ok", fn(*args, **kwargs))
    except RuntimeSessionNotFoundError:
        return ("no_session",)
    except SessionNotFoundError as e:
        return ("missing", e.session_id)
    except LeasePurposeError:
        return ("purpose",)
    except LeaseLostError as e:
        return ("lost", e.target)
    except BusyError as e:
        return ("busy", e.target)
    except SessionBoundError as e:
        return ("session_bound", e.session_id, (e.channel_type, e.channel_id))
    except ChannelBoundError as e:
        return ("channel_bound", (e.channel_type, e.channel_id), e.session_id)
    except BindingNotFoundError as e:
        return ("not_found", (e.channel_type, e.channel_id), e.session_id, e.bound_session_id)
    except SessionIDExistsError:
        return ("exists",)
    except InvalidInputError as e:
        return ("invalid", e.field)
    except OperationalError as e:
        if e.detail == INJECTED:
            raise  # a lost reply (``ambiguous.py``)
        return ("error", type(e).__name__, str(e))
    except TurnkeeperError as e:  # one the model never expects: it differs from every outcome
        return ("error", type(e).__name__, str(e))


def target_of(session_id: str) -> str:
    return f"session:{session_id}"


def session_of(lease: Lease) -> str:
    return lease.target.removeprefix("session:")


def label(lease: Lease | None) -> str | None:
    """A lease as a step's note names it (its token is secret, and long)."""
    if lease is None:
        return None
    return f"{lease.owner}@{lease.target}#{lease.epoch}/{lease.purpose}"


@dataclass
class BindingsModel:
    """The oracle: sessions, bindings, tool selections and session leases.

    Leases are :class:`oracle.Oracle`'s, plus the token each grant issued (a
    lease is valid only with it). Expectation methods (``expect_*``) change
    nothing; ``apply_*`` record a write the store acknowledged (or committed
    before a lost reply)."""

    sessions: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    bound: dict[Channel, tuple[str, datetime]] = field(default_factory=dict)
    """channel → (its session, when it was bound)."""
    tools: dict[str, tuple[int, tuple[ChannelToolConfig, ...]]] = field(default_factory=dict)
    """session → (generation, selection), for sessions whose tools were set."""
    leases: Oracle = field(default_factory=Oracle)
    tokens: dict[str, str] = field(default_factory=dict)
    """target → the token of its latest grant."""
    fenced: int = 0
    """Writes refused under a lost lease (each a ``fence_events`` row)."""

    def channel_of(self, session_id: str) -> Channel | None:
        return next((c for c, (s, _) in self.bound.items() if s == session_id), None)

    def session_on(self, channel: Channel) -> str | None:
        found = self.bound.get(channel)
        return None if found is None else found[0]

    # -- leases -------------------------------------------------------------------

    def acquire(
        self, session_id: str, owner: str, ttl_s: float, purpose: str, now: datetime
    ) -> Outcome:
        """The outcome of a runtime lease on the session, applied when granted:
        ``("granted" | "reacquired", epoch)``, ``("busy", owner)``,
        ``("purpose", held)`` or ``("no_session",)``. The holder is judged
        first, then the session's existence (also on a re-acquire)."""
        target = target_of(session_id)
        live = self.leases.live(target, now)
        if live is not None and live.owner != owner:
            return ("busy", live.owner)
        if live is not None and live.purpose != purpose:
            return ("purpose", live.purpose)
        if session_id not in self.sessions:
            return ("no_session",)
        return self.leases.acquire(target, owner, ttl_s, purpose, now)

    def release(self, lease: Lease, now: datetime) -> None:
        if self.tokens.get(lease.target) == lease.token:
            self.leases.release(lease.target, lease.owner, lease.epoch, now)

    def gate(self, session_id: str, lease: Lease | None, now: datetime) -> Outcome | None:
        """The session-write rule for one session (``None``: it may be written)."""
        if session_id not in self.sessions:
            return ("missing", session_id)
        target = target_of(session_id)
        if lease is None:
            return ("busy", target) if self.leases.live(target, now) is not None else None
        cur = self.leases.leases.get(target)
        same = (
            cur is not None
            and cur.held
            and (cur.owner, cur.epoch) == (lease.owner, lease.epoch)
            and self.tokens.get(target) == lease.token
        )
        if same and cur is not None and cur.purpose != lease.purpose:
            return ("purpose",)  # a lease relabelled in memory: the stored purpose decides
        if same and cur is not None and now < cur.expires_at:
            return None
        return ("lost", target)

    # -- binding writes ---------------------------------------------------------------

    def expect_bind(
        self, session_id: str, channel: Channel, lease: Lease | None, now: datetime
    ) -> Outcome:
        refused = self.gate(session_id, lease, now)
        if refused is not None:
            return refused
        mine = self.channel_of(session_id)
        if mine == channel:
            return ("ok", Binding(session_id, *channel))
        if mine is not None:
            return ("session_bound", session_id, mine)
        other = self.session_on(channel)
        if other is not None:
            return ("channel_bound", channel, other)
        return ("ok", Binding(session_id, *channel))

    def apply_bind(self, session_id: str, channel: Channel, now: datetime) -> None:
        if self.session_on(channel) != session_id:
            self.bound[channel] = (session_id, now)

    def expect_unbind(self, session_id: str, lease: Lease | None, now: datetime) -> Outcome:
        refused = self.gate(session_id, lease, now)
        if refused is not None:
            return refused
        mine = self.channel_of(session_id)
        return ("ok", None if mine is None else Binding(session_id, *mine))

    def apply_unbind(self, session_id: str) -> None:
        self.bound = {c: b for c, b in self.bound.items() if b[0] != session_id}

    def expect_transfer(
        self, channel: Channel, from_id: str, to_id: str, leases: Sequence[Lease], now: datetime
    ) -> Outcome:
        """Each session it writes is gated in id order (both of them: the one
        bound and the one to bind), each with its own lease among ``leases``
        (a later one of a target wins; others are ignored)."""
        held = {lease.target: lease for lease in leases}
        for sid in sorted({from_id, to_id}):
            refused = self.gate(sid, held.get(target_of(sid)), now)
            if refused is not None:
                return refused
        bound = self.session_on(channel)
        if bound == to_id:
            return ("ok", Binding(to_id, *channel))
        if bound != from_id:
            return ("not_found", channel, from_id, bound)
        target = self.channel_of(to_id)
        if target is not None:
            return ("session_bound", to_id, target)
        return ("ok", Binding(to_id, *channel))

    def apply_transfer(self, channel: Channel, to_id: str, now: datetime) -> None:
        if self.session_on(channel) != to_id:
            self.bound[channel] = (to_id, now)

    def expect_create_bound(self, channel: Channel, session_id: str) -> Outcome:
        other = self.session_on(channel)
        if other is not None and other != session_id:
            return ("channel_bound", channel, other)
        if session_id in self.sessions or session_id in self.deleted:
            return ("exists",)
        return ("ok", (session_id, *channel))

    def apply_create(self, channel: Channel, session_id: str, now: datetime) -> None:
        self.sessions.add(session_id)
        self.bound[channel] = (session_id, now)

    def expect_rotate(
        self, channel: Channel, old_id: str, new_id: str, lease: Lease | None, now: datetime
    ) -> Outcome:
        refused = self.gate(old_id, lease, now)
        if refused is not None:
            return refused
        bound = self.session_on(channel)
        if bound != old_id:
            return ("not_found", channel, old_id, bound)
        if new_id in self.sessions or new_id in self.deleted:
            return ("exists",)
        return ("ok", (new_id, *channel))

    def expect_set_tools(self, session_id: str, lease: Lease | None, now: datetime) -> Outcome:
        refused = self.gate(session_id, lease, now)
        if refused is not None:
            return refused
        return ("ok", self.tools.get(session_id, (0, ()))[0] + 1)

    def apply_set_tools(self, session_id: str, tools: tuple[ChannelToolConfig, ...]) -> None:
        self.tools[session_id] = (self.tools.get(session_id, (0, ()))[0] + 1, tools)

    def expect_delete(self, session_id: str, lease: Lease | None, now: datetime) -> Outcome:
        refused = self.gate(session_id, lease, now)
        return ("ok", None) if refused is None else refused

    def apply_delete(self, session_id: str) -> None:
        """Its binding and its tool selection go with it; its id is never reused."""
        self.apply_unbind(session_id)
        self.tools.pop(session_id, None)
        self.sessions.discard(session_id)
        self.deleted.add(session_id)

    def refused(self, outcome: Outcome, lease_given: bool) -> None:
        """Count a refusal the store records in ``fence_events``."""
        if outcome[0] == "lost" and lease_given:
            self.fenced += 1


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


class BindingsMachine(RuleBasedStateMachine):
    backend: ClassVar[str] = "duckdb"
    """The backend each example's store is opened on (see :func:`make_machine`)."""
    sessions = Bundle("sessions")
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store: BaseStore = open_backend(self.backend, None, self.clock)
        self.model = BindingsModel()
        self.views: dict[str, dict[Channel, str | None]] = {g: {} for g in GATEWAYS}
        self.other = self.store
        if conftest.engine(self.backend) == "postgres":
            keys = conftest.TEST_KEYS if self.backend in conftest.ENCRYPTED else None
            url = conftest._OPENED[id(self.store)]
            self.other = conftest.open_pg(url, clock=self.clock, encryption=keys)
        self.of = {"G1": self.store, "G2": self.other}
        """Each gateway's store object: on PostgreSQL G2 has its own (its own
        connections and caches), as a gateway process of its own would."""
        self.n = 0

    def teardown(self) -> None:
        if self.other is not self.store:
            self.other.close()
        close_backend(self.store)

    @initialize(target=sessions)
    def create_sessions(self) -> Any:
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

    def _pick_id(self, which: str) -> str:
        if which == "existing" and self.model.sessions:
            return sorted(self.model.sessions)[0]
        if which == "deleted" and self.model.deleted:
            return sorted(self.model.deleted)[0]
        return self._fresh()

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

    # -- invariants ----------------------------------------------------------------------

    @invariant()
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

    @invariant()
    def lookups_are_the_models(self) -> None:
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

    @invariant()
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

    @invariant()
    def every_lost_lease_write_is_recorded(self) -> None:
        """Each write refused under a lost lease left its ``fence_events`` row,
        and no other write did (an accepted write under a stale lease would
        leave the count short of the model's)."""
        row = self.store.db.read(
            "test-fenced", lambda tx: tx.one("SELECT count(*) FROM fence_events")
        )
        assert row is not None and row[0] == self.model.fenced, (row, self.model.fenced)


def make_machine(backend: str = "duckdb") -> type[BindingsMachine]:
    """The machine with its stores on ``backend``."""
    return cast(
        type[BindingsMachine],
        type(f"BindingsMachine_{backend}", (BindingsMachine,), {"backend": backend}),
    )
