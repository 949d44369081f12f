"""The oracle of the channel-bindings machine (:mod:`.bindings`): sessions,
channel bindings, channel tool selections and session leases in plain
Python, written from the README and the docstrings of ``store.bindings``,
not from its SQL.

:class:`BindingsModel` says what each write must give (``expect_*``: an
:data:`~.oracle.Outcome`, refusals with their fields) and records the writes
the store acknowledged (``apply_*``); :func:`attempt` expresses a store call
the same way, so the machine compares the two directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from turnkeeper import (
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

from .ambiguous import INJECTED
from .oracle import Oracle, Outcome

Channel = tuple[str, str]
"""``(channel_type, channel_id)``."""


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """``fn(*args, **kwargs)`` as an outcome: ``("ok", what it returned)``, or a
    refusal with the fields that say why (``("error", …)``: a typed error no
    rule expects, such as the conflict a database key raises when a typed
    check before it is gone). The injected ``OperationalError`` of a lost
    reply (:data:`~.ambiguous.INJECTED`) and errors outside
    :class:`~turnkeeper.TurnkeeperError` propagate."""
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
    """The lease target of a session: ``"session:<id>"``."""
    return f"session:{session_id}"


def session_of(lease: Lease) -> str:
    """The session id a session lease is for (its target without ``session:``)."""
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
        """The channel ``session_id`` is bound to, or ``None``."""
        return next((c for c, (s, _) in self.bound.items() if s == session_id), None)

    def session_on(self, channel: Channel) -> str | None:
        """The session bound to ``channel``, or ``None``."""
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
        """Apply a release: only the latest grant's token releases its target."""
        if self.tokens.get(lease.target) == lease.token:
            self.leases.release(lease.target, lease.owner, lease.epoch, now)

    def gate(self, session_id: str, lease: Lease | None, now: datetime) -> Outcome | None:
        """The session-write rule for one session: ``None`` (it may be written),
        or ``("missing", id)``, ``("busy", target)`` (no lease while one is
        live), ``("purpose",)`` (a lease relabelled) or ``("lost", target)``."""
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
        """``bind``: ``("ok", Binding)`` (a repeat is a no-op), or the gate's
        refusal, ``("session_bound", session, its channel)`` or
        ``("channel_bound", channel, its session)``."""
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
        """Record a bind (bound at ``now``; a repeat keeps its first time)."""
        if self.session_on(channel) != session_id:
            self.bound[channel] = (session_id, now)

    def expect_unbind(self, session_id: str, lease: Lease | None, now: datetime) -> Outcome:
        """``unbind``: ``("ok", the binding removed or None)`` or the gate's refusal."""
        refused = self.gate(session_id, lease, now)
        if refused is not None:
            return refused
        mine = self.channel_of(session_id)
        return ("ok", None if mine is None else Binding(session_id, *mine))

    def apply_unbind(self, session_id: str) -> None:
        """Record an unbind: the session's channel, if any, is free."""
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
        """Record a transfer (bound at ``now``; a repeat keeps its first time)."""
        if self.session_on(channel) != to_id:
            self.bound[channel] = (to_id, now)

    def expect_create_bound(self, channel: Channel, session_id: str) -> Outcome:
        """``create_bound``: ``("ok", (id, channel_type, channel_id))``,
        ``("channel_bound", channel, its session)`` or ``("exists",)`` (an id
        taken or deleted: ids are never reused)."""
        other = self.session_on(channel)
        if other is not None and other != session_id:
            return ("channel_bound", channel, other)
        if session_id in self.sessions or session_id in self.deleted:
            return ("exists",)
        return ("ok", (session_id, *channel))

    def apply_create(self, channel: Channel, session_id: str, now: datetime) -> None:
        """Record a session created bound to ``channel`` at ``now``."""
        self.sessions.add(session_id)
        self.bound[channel] = (session_id, now)

    def expect_rotate(
        self, channel: Channel, old_id: str, new_id: str, lease: Lease | None, now: datetime
    ) -> Outcome:
        """``rotate``: ``("ok", (new id, channel_type, channel_id))``, the gate's
        refusal for ``old_id``, ``("not_found", channel, old_id, its session)``
        or ``("exists",)``."""
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
        """``set_tools``: ``("ok", the new generation)`` (one more per write) or
        the gate's refusal."""
        refused = self.gate(session_id, lease, now)
        if refused is not None:
            return refused
        return ("ok", self.tools.get(session_id, (0, ()))[0] + 1)

    def apply_set_tools(self, session_id: str, tools: tuple[ChannelToolConfig, ...]) -> None:
        """Record a tool selection (its generation one more than the last)."""
        self.tools[session_id] = (self.tools.get(session_id, (0, ()))[0] + 1, tools)

    def expect_delete(self, session_id: str, lease: Lease | None, now: datetime) -> Outcome:
        """``sessions.delete``: ``("ok", None)`` or the gate's refusal."""
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
