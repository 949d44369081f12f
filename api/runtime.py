"""Runtime leases: a heartbeated guard with a loss signal, and ordered multi-target acquisition.

The session seed's runtime lease layer over any :class:`LeaseStore` (every
backend's ``Store`` is one):

- :class:`RuntimeLeaseGuard` (seed ``RuntimeLeaseGuard``) holds one lease,
  renews it on a background daemon thread (the heartbeat), exposes a loss
  signal the holder can wait on (seed ``RuntimeLeaseGuard.Lost`` /
  ``RuntimeLeaseLost``) and :meth:`RuntimeLeaseGuard.check`, the final fence
  a runtime calls right before a side effect (seed ``ValidateRuntimeLease``);
- ordered acquisition of several targets lives in
  :mod:`turnkeeper.runtime_order` (:func:`~turnkeeper.runtime_order.acquire_many`,
  :class:`~turnkeeper.runtime_order.RuntimeLeaseGroup`).

Purposes are the seed's (``LeasePurpose``: admission, execution, recovery,
mutation, fork); the store keeps only a digest of each token. The loss
signal is advisory, for cancelling work early: every durable write still
carries its own fence (token digest, epoch, expiry by the store's clock).

Time: durations are float seconds (``ttl_s``, ``interval_s``, ``wait_s``,
``timeout_s``). The guard keeps its own *loss deadline* on the local
monotonic clock: before each acquire or renew call it notes the time ``t0``;
the store sets the expiry to its now + ``ttl_s`` at some instant after
``t0``, so ``t0 + ttl_s`` is no later than the lease's expiry, provided the
store's clock does not run faster than the local one (true of the database
clock; a test clock moved by hand past the expiry is the exception, and then
the next renewal or :meth:`~RuntimeLeaseGuard.check` finds the loss). The
loss signal fires by that deadline at the latest.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol, TypeVar

from turnkeeper.spec import LeasePurpose
from turnkeeper.spec.errors import DatabaseError, InvalidInputError, LeaseLostError
from turnkeeper.spec.records import Lease
from turnkeeper.storage.protocol import LeasesAPI

T = TypeVar("T")

monotonic: Callable[[], float] = time.monotonic
"""The local clock of loss deadlines and waits (a module attribute so tests can replace it)."""

_MIN_RETRY_S = 0.01
"""Shortest pause between heartbeat retries after a backend error."""


class LeaseStore(Protocol):
    """What this module needs of a store: its :class:`~turnkeeper.storage.protocol.LeasesAPI`
    as ``leases`` (every backend's ``Store`` has one)."""

    @property
    def leases(self) -> LeasesAPI: ...


def _seconds(value: object, field: str, *, allow_zero: bool = False) -> float:
    """``value`` as finite seconds, positive (or, with ``allow_zero``, non-negative)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        kind = "non-negative" if allow_zero else "positive"
        raise InvalidInputError(field, f"must be {kind} finite seconds, got {value!r}")
    return float(value)


def _periods(ttl_s: object, interval_s: object) -> tuple[float, float]:
    """Validated (ttl, heartbeat interval); the interval defaults to ttl / 3."""
    ttl = _seconds(ttl_s, "ttl_s")
    if interval_s is None:
        return ttl, ttl / 3
    interval = _seconds(interval_s, "interval_s")
    if interval >= ttl:
        raise InvalidInputError("interval_s", f"must be shorter than ttl_s ({ttl}), got {interval}")
    return ttl, interval


class RuntimeLeaseGuard:
    """One held lease, renewed by a heartbeat thread (seed ``RuntimeLeaseGuard``).

    Build one with :meth:`acquire` (take the target, then guard it) or with
    the constructor (adopt a lease already held: it is renewed once at once,
    which fixes the guard's loss deadline). Every ``interval_s`` seconds
    (default ``ttl_s / 3``) a daemon thread calls ``store.leases.renew(lease,
    ttl_s)``; :attr:`lease` is the latest renewal.

    Loss (:attr:`lost`, :meth:`wait_lost`, :attr:`lost_error`) is signalled,
    once and for good, when

    - a renewal (or :meth:`check`) raises ``LeaseLostError``: the lease
      expired, was released or was taken over; or
    - the guard's loss deadline (see the module docstring; :attr:`remaining_s`)
      passes without a confirmed renewal.

    A backend failure (``DatabaseError``: ``TransactionConflictError``,
    ``OperationalError`` …) is not a loss while the lease may still be held:
    the heartbeat keeps retrying (at most ``interval_s`` apart, faster as the
    deadline nears) and only the deadline turns it into a loss, with that
    backend error as :attr:`lost_error`. Any other failure of the renew call
    (``InterfaceError`` for a closed store, a backend bug) stops the
    renewals, since retrying cannot help; the loss is then signalled at the
    deadline, when the lease may no longer be held. Cancellation
    (``KeyboardInterrupt``) raised in the heartbeat signals the loss at once
    and is re-raised in that thread, never swallowed.

    :attr:`lost` is set by the heartbeat thread at the deadline, or as soon
    as a renew call that was still running then returns; :meth:`wait_lost`,
    :meth:`check` and reading :attr:`lost` also enforce the deadline
    themselves, so they never report the lease as held past it.

    Use it as a context manager, or call :meth:`release`: that stops the
    thread (joined before it returns) and releases the lease. The thread
    holds only a weak reference to the guard and none to the store: a guard
    dropped without release stops its thread, and a closed guard lets go of
    the store.

    Give each guard its own owner name, or at least its own target: the same
    owner re-acquiring a target it holds gets the same lease, so two guards
    would share it and one's release would end the other's.
    """

    _store: LeaseStore | None

    def __init__(
        self,
        store: LeaseStore,
        lease: Lease,
        ttl_s: float,
        *,
        interval_s: float | None = None,
    ) -> None:
        """Adopt ``lease`` (already held) and guard it, renewing for ``ttl_s`` seconds.

        Raises:
            InvalidInputError: ``ttl_s`` or ``interval_s`` is not positive
                finite seconds, or ``interval_s >= ttl_s``; nothing was called.
            LeaseLostError: the lease is no longer held (the first renewal failed).
            DatabaseError: backend failure of the first renewal; nothing is
                guarded and the lease, if still held, expires in its own time.
        """
        ttl, interval = _periods(ttl_s, interval_s)
        requested = monotonic()
        renewed = store.leases.renew(lease, ttl)
        self._start(store, renewed, ttl, interval, requested)

    @classmethod
    def acquire(
        cls,
        store: LeaseStore,
        target: str,
        owner: str,
        ttl_s: float,
        *,
        purpose: str = LeasePurpose.MUTATION,
        run_id: str | None = None,
        interval_s: float | None = None,
    ) -> RuntimeLeaseGuard:
        """Take ``target`` for ``owner`` for ``ttl_s`` seconds and guard it.

        The seed's ``AcquireExecutionAdmission``, ``AcquireRecovery`` (with
        ``run_id``, the expected run), ``AcquireMutation`` and ``AcquireFork``
        are this with ``purpose`` ``admission``, ``recovery``, ``mutation``
        (default) and ``fork``; ``store.leases.acquire`` checks what each
        purpose requires of a ``session:`` target's session
        (``RuntimeSessionNotFoundError``, ``SessionRecoveryRequiredError``,
        ``RecoveryNotNeededError``, ``RuntimeLeaseRunMismatchError``).

        Raises:
            InvalidInputError: bad ``ttl_s``/``interval_s`` (nothing called),
                or the store refused the target, owner or purpose.
            BusyError: another owner (or ``owner`` through another store
                object or process) holds an unexpired lease on ``target``.
            LeasePurposeError: ``owner`` holds it under another purpose.
            DatabaseError: backend failure (never reported as busy).
            RuntimeError: the heartbeat thread could not start; the lease was
                released first.
        """
        ttl, interval = _periods(ttl_s, interval_s)
        requested = monotonic()
        lease = store.leases.acquire(target, owner, ttl, purpose=purpose, run_id=run_id)
        guard = cls.__new__(cls)
        try:
            guard._start(store, lease, ttl, interval, requested)
        except BaseException:
            store.leases.release(lease)
            raise
        return guard

    def _start(
        self, store: LeaseStore, lease: Lease, ttl: float, interval: float, requested: float
    ) -> None:
        self._store = store
        self._lease = lease
        self._ttl_s = ttl
        self._interval_s = interval
        self._cond = threading.Condition(threading.Lock())
        self._lost = threading.Event()
        self._deadline = requested + ttl
        self._next_beat = requested + interval
        self._last_error: BaseException | None = None
        self._lost_error: BaseException | None = None
        self._halted = False
        self._closed = False
        self._released_by_caller = False
        self._retained = 0
        self._renewing = threading.Lock()  # a renewal and bind_run never overlap
        stop = threading.Event()
        self._stop = weakref.finalize(self, stop.set)
        self._thread = threading.Thread(
            target=_heartbeat,
            args=(weakref.ref(self), stop),
            name=f"turnkeeper-lease[{lease.target}]",
            daemon=True,
        )
        self._thread.start()

    # -- state -----------------------------------------------------------------

    @property
    def lease(self) -> Lease:
        """The lease as last acquired or renewed (its ``expires_at`` is by the store's clock)."""
        with self._cond:
            return self._lease

    @property
    def lost(self) -> threading.Event:
        """The loss signal: set once the lease is lost (never cleared; see the class docstring).

        Reading this property first applies the loss deadline.
        """
        with self._cond:
            self._expire_if_due()
            return self._lost

    @property
    def lost_error(self) -> BaseException | None:
        """What ended the lease: ``None`` while it is held.

        The ``LeaseLostError`` the store raised; or, when the deadline passed,
        the last renewal error (a ``DatabaseError``, or whatever stopped the
        renewals), else a ``LeaseLostError`` made by the guard; or the
        cancellation raised in the heartbeat.
        """
        with self._cond:
            self._expire_if_due()
            return self._lost_error

    @property
    def last_error(self) -> BaseException | None:
        """The latest renewal failure since the last successful renewal, else ``None``."""
        with self._cond:
            return self._last_error

    @property
    def remaining_s(self) -> float:
        """Seconds until the loss deadline (negative once it has passed)."""
        with self._cond:
            return self._deadline - monotonic()

    @property
    def closed(self) -> bool:
        """Whether :meth:`release` (or the context manager's exit) has run."""
        with self._cond:
            return self._closed

    def wait_lost(self, timeout_s: float | None = None) -> bool:
        """Block until the lease is lost, or for at most ``timeout_s`` seconds.

        Returns ``True`` once lost; ``False`` on timeout, or at once if the
        guard is (or becomes) released without having been lost. Wakes by the
        loss deadline at the latest, whatever the heartbeat thread is doing.
        """
        end = None if timeout_s is None else monotonic() + max(0.0, float(timeout_s))
        with self._cond:
            while True:
                self._expire_if_due()
                if self._lost.is_set():
                    return True
                if self._closed:
                    return False
                now = monotonic()
                wait = self._deadline - now
                if end is not None:
                    if now >= end:
                        return False
                    wait = min(wait, end - now)
                self._cond.wait(wait)

    def check(self, *, run_id: str | None = None, purpose: str | None = None) -> None:
        """The final fence right before a side effect (seed ``ValidateRuntimeLease``).

        Raises ``LeaseLostError`` at once if the loss was signalled (or the
        deadline passed), else asks the store, which checks token digest,
        epoch and expiry by its clock in the database, and with ``run_id`` /
        ``purpose`` the run bound and the purpose (``store.leases.validate``:
        ``RuntimeLeaseRunMismatchError``, ``LeasePurposeError``).

        Raises:
            LeaseLostError: lost, released, or the store says so (the loss is
                then signalled too); ``__cause__`` is :attr:`lost_error`.
            DatabaseError: the store could not check; the lease may still be
                held, nothing is signalled, and the side effect must wait.
            InterfaceError: the store is closed.
        """
        with self._cond:
            if self._closed:
                raise LeaseLostError(self._lease.target, detail="the guard was released")
            self._expire_if_due()
            if self._lost.is_set():
                raise LeaseLostError(
                    self._lease.target, detail=f"lost: {self._lost_error!r}"
                ) from self._lost_error
            store, lease = self._store, self._lease
        assert store is not None  # only dropped once closed
        try:
            if run_id is None and purpose is None:
                store.leases.validate(lease)
            else:
                store.leases.validate(lease, run_id=run_id, purpose=purpose)
        except LeaseLostError as exc:
            with self._cond:
                self._mark_lost(exc)
            raise

    # -- binding and retaining ------------------------------------------------------

    def bind_run(self, run_id: str) -> Lease:
        """Promote the guarded lease to ``execution`` bound to ``run_id`` (seed
        ``BindRuntimeLeaseToExistingRun``; ``store.leases.bind_run``) and guard
        the promoted lease from then on; returns it. No renewal runs meanwhile.

        Raises:
            LeaseLostError: the guard was released or lost, or the store says so.
            LeasePurposeError, RuntimeLeaseRunMismatchError, DatabaseError: as
                ``store.leases.bind_run``; the guard keeps the lease it had.
        """
        with self._renewing:
            with self._cond:
                self._expire_if_due()
                if self._closed or self._released_by_caller or self._lost.is_set():
                    raise LeaseLostError(self._lease.target, detail="the guard holds no lease")
                store, lease = self._store, self._lease
            assert store is not None
            bound = store.leases.bind_run(lease, run_id)
            with self._cond:
                self._lease = bound
            return bound

    def retain(self, run_id: str) -> RetainedLease:
        """Add a reference to the guarded ``execution`` lease of ``run_id``
        (seed ``RetainRuntimeLease``): the lease stays held and heartbeated
        until every reference is released, even once :meth:`release` has been
        called on the guard. An in-process handoff (e.g. from the code that
        admitted a run to the executor that finishes it), never an
        authorization: the store checks the lease is of purpose ``execution``
        and bound to ``run_id`` first (``store.leases.validate``).

        Raises:
            LeaseLostError: the guard was released or lost, or the store says so.
            LeasePurposeError: the lease is not of purpose ``execution``.
            RuntimeLeaseRunMismatchError: ``run_id`` is not the run bound to it.
            DatabaseError: the store could not check; nothing is retained.
        """
        with self._cond:
            if self._released_by_caller:
                raise LeaseLostError(self._lease.target, detail="the guard was released")
        self.check(run_id=run_id, purpose=LeasePurpose.EXECUTION)
        with self._cond:
            if self._closed or self._released_by_caller or self._lost.is_set():
                raise LeaseLostError(self._lease.target, detail="the guard holds no lease")
            self._retained += 1
            return RetainedLease(self, self._lease)

    def _unretain(self) -> bool:
        with self._cond:
            self._retained -= 1
            if self._retained or not self._released_by_caller:
                return False
        return self._close()

    @property
    def retained(self) -> int:
        """How many :meth:`retain` references are not yet released."""
        with self._cond:
            return self._retained

    # -- release -------------------------------------------------------------------

    def release(self) -> bool:
        """Stop the heartbeat (joined before returning) and release the lease.

        With :meth:`retain` references outstanding, the lease stays held and
        heartbeated until the last of them is released, and this returns
        ``False``. Idempotent. Returns whether this call released a held lease (the
        store's ``leases.release``; ``False`` if it was already lost, or on a
        second call). The guard drops its store reference either way.

        Raises:
            DatabaseError, InterfaceError: from the store's release; the guard
                is closed anyway and the lease expires after at most ``ttl_s``.
        """
        with self._cond:
            if self._closed or self._released_by_caller:
                return False
            self._released_by_caller = True
            if self._retained:  # retained references keep it (seed RetainRuntimeLease)
                return False
        return self._close()

    def _close(self) -> bool:
        """Stop the heartbeat and release the lease (the last reference is gone)."""
        with self._cond:
            if self._closed:
                return False
            self._closed = True
            self._cond.notify_all()
        self._stop()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._cond:
            store, lease = self._store, self._lease
            self._store = None
        assert store is not None
        return store.leases.release(lease)

    def __enter__(self) -> RuntimeLeaseGuard:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            self.release()
        except Exception as err:
            if exc is None:
                raise
            exc.add_note(f"releasing the lease on {self._lease.target!r} also failed: {err!r}")

    def __repr__(self) -> str:
        with self._cond:
            state = "closed" if self._closed else "lost" if self._lost.is_set() else "held"
            return f"<RuntimeLeaseGuard {self._lease.target!r} {state} epoch={self._lease.epoch}>"

    # -- heartbeat (called from the thread) ------------------------------------------

    def _mark_lost(self, error: BaseException) -> None:
        """Signal the loss once (``self._cond`` held)."""
        if self._lost.is_set():
            return
        self._lost_error = error
        self._lost.set()
        self._cond.notify_all()

    def _expire_if_due(self) -> None:
        """Signal the loss if the deadline passed (``self._cond`` held)."""
        if self._closed or self._lost.is_set() or monotonic() < self._deadline:
            return
        error = self._last_error
        if error is None:
            error = LeaseLostError(self._lease.target, detail="not renewed before its expiry")
        self._mark_lost(error)

    def _wait_from(self, now: float) -> float:
        """Seconds until the heartbeat's next action (``self._cond`` held)."""
        due = self._deadline if self._halted else min(self._next_beat, self._deadline)
        return max(0.0, due - now)

    def _beat(self) -> float | None:
        """Renew if due; the seconds to sleep before the next call, ``None`` to stop."""
        with self._cond:
            self._expire_if_due()
            if self._closed or self._lost.is_set():
                return None
            now = monotonic()
            if self._halted or now < self._next_beat:
                return self._wait_from(now)
            store, lease = self._store, self._lease
        assert store is not None
        if not self._renewing.acquire(blocking=False):  # bind_run is swapping the lease
            return _MIN_RETRY_S
        try:
            with self._cond:
                lease = self._lease  # as a bind_run that just ended left it
            return self._renew(store, lease)
        finally:
            self._renewing.release()

    def _renew(self, store: LeaseStore, lease: Lease) -> float | None:
        """One renewal of ``lease`` and what it means for the guard (see :meth:`_beat`)."""
        requested = monotonic()
        try:
            renewed = store.leases.renew(lease, self._ttl_s)
        except LeaseLostError as exc:
            with self._cond:
                self._mark_lost(exc)
            return None
        except DatabaseError as exc:  # may still be held: retry until the deadline
            with self._cond:
                self._last_error = exc
                now = monotonic()
                pause = max((self._deadline - now) / 2, _MIN_RETRY_S)
                self._next_beat = now + min(self._interval_s, pause)
                return self._wait_from(now)
        except Exception as exc:  # retrying cannot help: wait for the deadline
            with self._cond:
                self._last_error = exc
                self._halted = True
                return self._wait_from(monotonic())
        except BaseException as exc:  # cancellation: signal, then never swallow
            with self._cond:
                self._mark_lost(exc)
            raise
        with self._cond:
            self._lease = renewed  # so release() frees it even if lost meanwhile
            self._expire_if_due()  # confirmed too late: the deadline already passed
            if self._closed or self._lost.is_set():
                return None
            self._deadline = max(self._deadline, requested + self._ttl_s)
            self._next_beat = requested + self._interval_s
            self._last_error = None
            return self._wait_from(monotonic())


class RetainedLease:
    """One reference to a guarded execution lease (seed ``RetainRuntimeLease``),
    made by :meth:`RuntimeLeaseGuard.retain`. :meth:`release` (or leaving its
    ``with`` block) drops it; the last reference dropped after the guard's own
    release releases the lease."""

    def __init__(self, guard: RuntimeLeaseGuard, lease: Lease) -> None:
        self._guard: RuntimeLeaseGuard | None = guard
        self.lease = lease
        """The lease as it was when retained."""

    def release(self) -> bool:
        """Drop this reference; idempotent. Returns whether it released the
        lease itself (it was the last reference and the guard was released).

        Raises:
            DatabaseError, InterfaceError: from the store's release, as
                :meth:`RuntimeLeaseGuard.release` raises them.
        """
        guard, self._guard = self._guard, None
        return False if guard is None else guard._unretain()

    def __enter__(self) -> RetainedLease:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.release()


def _heartbeat(ref: weakref.ReferenceType[RuntimeLeaseGuard], stop: threading.Event) -> None:
    """The heartbeat thread: holds the guard only while it renews."""
    while True:
        guard = ref()
        if guard is None:
            return
        delay = guard._beat()
        del guard
        if delay is None or stop.wait(delay):
            return


# -- several targets ---------------------------------------------------------------
