"""Ordered acquisition of several lease targets (session seed AcquireMutations /
RuntimeLeaseGroup), over any :class:`~turnkeeper.runtime.LeaseStore`.

Targets are deduplicated and taken in one global (sorted) order, so two
runtimes wanting overlapping sets never deadlock: each only ever waits for a
target greater than everything it holds, so no waiting cycle can form
(runtime A holding ``a`` and wanting ``b`` while B holds ``b`` and wants
``a`` would need B to have taken ``b`` before ``a``). On any failure
everything already taken is released, in reverse, and the original error
re-raised. Durations are float seconds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from turnkeeper import runtime
from turnkeeper.spec import LeasePurpose
from turnkeeper.spec.errors import BusyError, InvalidInputError
from turnkeeper.spec.records import Lease

from .runtime import LeaseStore, RuntimeLeaseGuard, _periods, _seconds

T = TypeVar("T")

_BACKOFF_S = (0.002, 0.05)
"""First and largest pause between attempts on a busy target (``wait_s``)."""


def _global_order(targets: Iterable[str]) -> list[str]:
    """``targets`` deduplicated and sorted: the one order every caller acquires in."""
    if isinstance(targets, str | bytes):
        raise InvalidInputError("targets", "expected an iterable of target strings, not one")
    found = list(targets)
    for target in found:
        if not isinstance(target, str):
            raise InvalidInputError("targets", f"expected strings, got {type(target).__name__}")
    return sorted(set(found))


def _take_waiting(target: str, take: Callable[[str], T], deadline: float) -> T:
    """``take(target)``, retrying a ``BusyError`` with jittered backoff until ``deadline``."""
    attempt = 0
    while True:
        try:
            return take(target)
        except BusyError:
            now = runtime.monotonic()
            if now >= deadline:
                raise
            first, largest = _BACKOFF_S
            pause = min(largest, first * 2**attempt) * random.uniform(0.5, 1.0)
            time.sleep(min(pause, deadline - now))
            attempt += 1


def _drop_all(held: Sequence[T], drop: Callable[[T], object], error: BaseException) -> None:
    """Give back ``held`` in reverse order; a failure to give one back is noted on ``error``."""
    for item in reversed(held):
        try:
            drop(item)
        except Exception as exc:
            error.add_note(f"releasing {item!r} after the failure also failed: {exc!r}")


def _take_in_order(
    targets: Iterable[str],
    take: Callable[[str], T],
    drop: Callable[[T], object],
    wait_s: float,
) -> list[T]:
    """Take every target in the global order; on any failure give back what was taken."""
    order = _global_order(targets)
    deadline = runtime.monotonic() + wait_s
    held: list[T] = []
    try:
        for target in order:
            held.append(_take_waiting(target, take, deadline))
    except BaseException as exc:
        _drop_all(held, drop, exc)
        raise
    return held


def acquire_many(
    store: LeaseStore,
    targets: Iterable[str],
    owner: str,
    ttl_s: float,
    *,
    purpose: str = LeasePurpose.MUTATION,
    wait_s: float = 0.0,
) -> list[Lease]:
    """Lease every target for ``owner`` for ``ttl_s`` seconds, in one global order.

    ``targets`` (e.g. ``["session:b", "session:a"]``) is deduplicated and
    sorted; the leases come back in that sorted order. With ``wait_s`` > 0 a
    busy target is retried (jittered backoff) until ``wait_s`` seconds after
    the call began, still holding the targets taken before it; ``wait_s``
    must be shorter than ``ttl_s``, because these leases are not renewed (use
    :class:`RuntimeLeaseGroup` for heartbeated ones).

    Why the order prevents deadlock: every caller takes targets in ascending
    order and so only ever waits for a target greater than all it holds. A
    cycle of callers each waiting for a target the next one holds would need
    those awaited targets to increase all the way round the cycle, which is
    impossible. Two runtimes wanting {a, b} and {b, a} both start with ``a``:
    one gets it and then ``b``; the other waits for (or, with ``wait_s=0``,
    fails at) ``a`` while holding nothing the first needs. Taken in the given
    order instead, each could hold one and wait for the other until both gave
    up. Mixing in leases taken outside this order voids the argument.

    Raises (after releasing, in reverse order, every lease this call took;
    a failed release is added as a note to the error, and such a lease
    expires after ``ttl_s``):
        InvalidInputError: ``targets`` is not an iterable of strings, bad
            ``ttl_s``/``wait_s`` (nothing taken), or the store refused a
            target, the owner or the purpose.
        BusyError: a target stayed held under another lease for ``wait_s``.
        LeasePurposeError: ``owner`` holds a target under another purpose.
        DatabaseError: backend failure (never reported as busy).
    """
    ttl = _seconds(ttl_s, "ttl_s")
    wait = _seconds(wait_s, "wait_s", allow_zero=True)
    if wait >= ttl:
        raise InvalidInputError("wait_s", f"must be shorter than ttl_s ({ttl}), got {wait}")
    return _take_in_order(
        targets,
        lambda target: store.leases.acquire(target, owner, ttl, purpose=purpose),
        store.leases.release,
        wait,
    )


class RuntimeLeaseGroup:
    """Guards on several targets taken in one global order (seed ``RuntimeLeaseGroup``).

    Build one with :meth:`acquire` (seed ``AcquireMutations``); use it as a
    context manager or call :meth:`release`, which releases in reverse
    acquisition order.
    """

    def __init__(self, guards: Iterable[RuntimeLeaseGuard]) -> None:
        """Group ``guards`` (already held), in acquisition order."""
        self._guards = tuple(guards)

    @classmethod
    def acquire(
        cls,
        store: LeaseStore,
        targets: Iterable[str],
        owner: str,
        ttl_s: float,
        *,
        purpose: str = LeasePurpose.MUTATION,
        interval_s: float | None = None,
        wait_s: float = 0.0,
    ) -> RuntimeLeaseGroup:
        """Guard every target, taken as :func:`acquire_many` takes them.

        Each target gets a :class:`RuntimeLeaseGuard` (and so a heartbeat
        thread) as soon as it is taken, so earlier leases stay renewed while
        later ones are awaited: ``wait_s`` may exceed ``ttl_s``.

        Raises: as :func:`acquire_many` (after releasing every guard this call
        made), and ``InvalidInputError`` for a bad ``interval_s``.
        """
        ttl, interval = _periods(ttl_s, interval_s)
        wait = _seconds(wait_s, "wait_s", allow_zero=True)

        def take(target: str) -> RuntimeLeaseGuard:
            return RuntimeLeaseGuard.acquire(
                store, target, owner, ttl, purpose=purpose, interval_s=interval
            )

        return cls(_take_in_order(targets, take, RuntimeLeaseGuard.release, wait))

    @property
    def guards(self) -> tuple[RuntimeLeaseGuard, ...]:
        """The guards, in acquisition (sorted target) order."""
        return self._guards

    @property
    def leases(self) -> tuple[Lease, ...]:
        """Each guard's current lease, in acquisition order."""
        return tuple(g.lease for g in self._guards)

    def lost(self) -> list[RuntimeLeaseGuard]:
        """The guards whose lease is lost (empty while all are held)."""
        return [g for g in self._guards if g.lost.is_set()]

    def check(self) -> None:
        """:meth:`RuntimeLeaseGuard.check` on every guard, in order; the first failure raises."""
        for guard in self._guards:
            guard.check()

    def release(self) -> None:
        """Release every guard in reverse acquisition order (idempotent).

        Every guard is released even if one fails; the first failure is then
        raised with the others as notes.

        Raises:
            DatabaseError, InterfaceError: from the store's release.
        """
        first: Exception | None = None
        for guard in reversed(self._guards):
            try:
                guard.release()
            except Exception as exc:
                if first is None:
                    first = exc
                else:
                    first.add_note(f"releasing {guard!r} also failed: {exc!r}")
        if first is not None:
            raise first

    def __enter__(self) -> RuntimeLeaseGroup:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            self.release()
        except Exception as err:
            if exc is None:
                raise
            exc.add_note(f"releasing the lease group also failed: {err!r}")


__all__ = ["LeaseStore", "RuntimeLeaseGroup", "RuntimeLeaseGuard", "acquire_many"]
