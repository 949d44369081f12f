"""The lease row and its decisions, from the ``LEASE`` lifecycle's edges and guards.

Shared by the models: a target's row is a :class:`Row` (or ``None``: the
``absent`` state); an actor presents the token it was given as the epoch it
remembers. The facts are computed here from the model state the way the store
computes them (``storage/ops/leases.py``), and the edge is chosen by the
lifecycle (``Lifecycle.select``): the rules are the spec's, not re-typed.

Token identity: the store issues a token from (target, owner, epoch,
purpose) (``issue_token``), so a presented token matches the row when the
owner, the epoch and the purpose are the row's. A write's fence is the
``renew`` edge's guard set: the store's ``fence`` is the check ``renew``
runs before it extends the expiry (token matches, not expired, held).
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

from turnkeeper.spec.lease import GRANTING_EDGES
from turnkeeper.spec.lifecycle import Facts, Lifecycle


class Row(NamedTuple):
    """A target's stored lease: ``expires`` in clock ticks."""

    state: str
    owner: str
    epoch: int
    purpose: str
    expires: int


def source(row: Row | None) -> str:
    """The lifecycle state of ``row``."""
    return "absent" if row is None else row.state


def acquire_facts(row: Row | None, owner: str, purpose: str, now: int) -> Facts:
    """The facts ``acquire`` reads (none for an absent row, as the store)."""
    if row is None:
        return {}
    return {
        "expired": now >= row.expires,
        "same_owner": row.owner == owner,
        "same_purpose": row.purpose == purpose,
        "token_matches": (row.owner, row.purpose) == (owner, purpose),
    }


def token_facts(row: Row | None, owner: str, epoch: int, purpose: str, now: int) -> Facts:
    """The facts ``renew``, ``release`` and a fenced write read for a presented token."""
    if row is None:
        return {}
    return {
        "expired": now >= row.expires,
        "token_matches": (row.owner, row.epoch, row.purpose) == (owner, epoch, purpose),
    }


def acquire(
    lifecycle: Lifecycle, row: Row | None, owner: str, purpose: str, now: int, ttl: int
) -> tuple[str, Row] | None:
    """``(edge name, new row)``, or ``None`` when the lifecycle refuses (busy)."""
    edge = lifecycle.select("acquire", source(row), acquire_facts(row, owner, purpose, now))
    if edge is None:
        return None
    if edge.name in GRANTING_EDGES:
        epoch = 1 if row is None else row.epoch + 1
        return edge.name, Row("held", owner, epoch, purpose, now + ttl)
    assert row is not None
    return edge.name, row._replace(expires=now + ttl)


def passes(
    lifecycle: Lifecycle,
    trigger: str,
    row: Row | None,
    owner: str,
    epoch: int,
    purpose: str,
    now: int,
) -> bool:
    """Whether a token-checked ``trigger`` (``renew``, ``release``) is admitted."""
    facts = token_facts(row, owner, epoch, purpose, now)
    return lifecycle.select(trigger, source(row), facts) is not None


def fenced(
    lifecycle: Lifecycle, row: Row | None, owner: str, epoch: int, purpose: str, now: int
) -> bool:
    """Whether a write under the token passes the fence (the ``renew`` guards)."""
    return passes(lifecycle, "renew", row, owner, epoch, purpose, now)


T = TypeVar("T")


def put(items: tuple[T, ...], i: int, value: T) -> tuple[T, ...]:
    """``items`` with item ``i`` replaced by ``value``."""
    return (*items[:i], value, *items[i + 1 :])
