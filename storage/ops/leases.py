"""Leases (threadstore AcquireLease / RenewLease / ReleaseLease) and the fence.

Statement budget per operation (BEGIN and COMMIT included):

- acquire: 4 (BEGIN, read the row, compare-and-set write whose event row is
  inserted by the same statement, COMMIT), plus for a ``session:`` target
  the read of its session row (a runtime lease needs its session); a
  refusal stops after the reads;
- renew: 4 (BEGIN, the fence, the new expiry + event row in one statement,
  COMMIT): the fence judges the expiry at a clock read after the row is
  locked (PostgreSQL) or its target held (DuckDB), which one statement
  cannot do (PostgreSQL evaluates an ``UPDATE``'s conditions before it waits
  for the row's lock);
- release: 1 (the update and its event row in one autocommit statement; zero
  rows is the idempotent no-op; it judges no expiry).

Fenced writes elsewhere call :func:`fence`, which checks the lease row under
the full fence (owner's token digest, epoch, state held,
:func:`fence_condition`; then unexpired, :func:`unexpired`) inside the
caller's transaction. Expiry is judged at the store's clock read *after* the
row is locked (``Tx.clock_after_locks``), never at a time read before a wait
for that lock: a write that waited for the lease row past its lease's expiry
is refused, and on DuckDB, whose group commit runs other queued writes
between a fence and its COMMIT, the expiry is judged again right before
COMMIT (``Tx.valid_until``).
Every operation here that reads or writes a lease row holds its target
(``Tx.hold``) until its transaction ends. On PostgreSQL the fence *writes*
the row (``fenced_writes + 1``), which locks it, so a concurrent takeover
waits or conflicts and a stale writer never commits beside its successor;
the hold is nothing there. On DuckDB the fence is a read: grants and
takeovers commit under the in-process write lock that every fenced write
holds too, renewals and releases skip that lock, and the hold is an
in-process lock stripe that keeps one from committing between a fence (or
a lease-less check, :data:`UNHELD_WRITE`) and its commit, and turns one
committed after the transaction's snapshot into a conflict. Two appends use
the fence condition another way (``storage/ops/appends.py``): PostgreSQL's
one-statement append reads the row ``FOR SHARE``, and DuckDB's merged
appends read it in a group that holds its targets.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn

from turnkeeper.machines import machine_for
from turnkeeper.spec import GRANTING_EDGES, LEASE, LeasePurpose, errors
from turnkeeper.spec.records import Lease

from ..backend import STORE_NOW, Conflict, Tx, keyed, present, utc
from ..codec import check_id
from ..validate import check_lease, check_purpose, check_target, check_ttl
from ..wakeups import Topic
from .base import Area

_MACHINE = machine_for(LEASE)

NOW = STORE_NOW
"""SQL for the store's now: the injected clock's value, else the database's."""


def digest(token: str) -> str:
    """sha256 hex digest of a lease token; the only form the store keeps."""
    return hashlib.sha256(token.encode()).hexdigest()


def issue_token(secret: bytes, target: str, owner: str, epoch: int, purpose: str) -> str:
    """The token this store instance issues for a grant.

    An HMAC of the grant under the store object's random secret: unguessable
    to anyone else, and re-derivable by the same store object so that a
    re-acquire by the same owner returns the same token. Another store object
    (another process) under the same owner name cannot derive it, and is
    treated as another holder.
    """
    msg = f"{target}\x00{owner}\x00{epoch}\x00{purpose}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def _ttl(ttl_s: float) -> timedelta:
    """``ttl_s`` seconds as a duration, to the microsecond (bound as an INTERVAL
    parameter: integer microseconds times an INTERVAL overflows 32 bits on DuckDB)."""
    return timedelta(microseconds=round(ttl_s * 1_000_000))


def touch_session(tx: Tx, target: str) -> None:
    """On a server, write the session row of a ``session:`` target (to its own
    values): a grant and a lease-less write of the session then meet on that
    row, which orders them (the second to commit is a serialization failure,
    retried, and sees the first). Without it, a lease-less write to a session
    never leased before had no row in common with the first grant (no lease
    row to lock yet), and could commit after it. DuckDB's write lock orders
    them already."""
    if tx.dialect.serialized_writes or not target.startswith("session:"):
        return
    tx.exec(
        "UPDATE sessions SET updated_at = updated_at WHERE id = ?",
        [target.removeprefix("session:")],
    )


_HELD_AT = "epoch = ? AND token_digest = ? AND state = 'held'"
"""A lease row still held at this epoch with this token digest: a re-acquire's
compare-and-set."""

_HELD_BY = "epoch = ? AND token_digest = ? AND owner = ? AND state = 'held'"
"""A lease row still held under the lease of these values (``fence_values`` after
the target): what a release compares (it judges no expiry, so it needs no fence)."""


_IDLE_PURPOSES = frozenset(
    {LeasePurpose.ADMISSION, LeasePurpose.EXECUTION, LeasePurpose.MUTATION, LeasePurpose.FORK}
)
"""Purposes that reserve an idle session (seed AcquireExecutionAdmission,
AcquireMutation, AcquireFork): granted only while it has no non-terminal run."""


def admission_check(tx: Tx, target: str, purpose: str, granting: bool, run_id: str | None) -> None:
    """What a runtime lease's purpose requires of its session when it is taken
    (the seed's Acquire… functions); other targets have none. The session
    exists; on a grant, regrant or takeover (``granting``: nobody held the
    session a moment ago, so an active run has no live owner: an orphan) an
    ``admission``, ``execution``, ``mutation`` or ``fork`` lease needs the
    session idle, and a ``recovery`` lease needs an active run (``run_id``,
    if given). A re-acquire by the holder extends its own lease: only the
    session's existence is checked.

    Raises:
        RuntimeSessionNotFoundError, SessionRecoveryRequiredError,
        RecoveryNotNeededError, RuntimeLeaseRunMismatchError.
    """
    if not target.startswith("session:"):
        return
    session_id = target.removeprefix("session:")
    if tx.one("SELECT 1 FROM sessions WHERE id = ?", [session_id]) is None:
        raise errors.RuntimeSessionNotFoundError(session_id)
    if not granting:
        return
    row = tx.one("SELECT run_id FROM active_runs WHERE session_id = ?", [session_id])
    active = None if row is None else str(row[0])
    if purpose in _IDLE_PURPOSES:
        if active is not None:
            raise errors.SessionRecoveryRequiredError(session_id, active)
        return
    if active is None:  # recovery (seed AcquireRecovery): an orphan to recover
        raise errors.RecoveryNotNeededError(
            run_id or "", f"session {session_id!r} has no active run"
        )
    if run_id is not None and run_id != active:
        raise errors.RuntimeLeaseRunMismatchError(target, run_id, active)


def acquire(
    tx: Tx,
    secret: bytes,
    target: str,
    owner: str,
    ttl_s: float,
    purpose: str,
    run_id: str | None = None,
) -> Lease:
    """Grant, take over or re-acquire ``target`` (run inside a transaction),
    after :func:`admission_check`."""
    tx.hold(target)
    touch_session(tx, target)
    row = tx.one(
        "SELECT owner, token_digest, epoch, purpose, state, expires_at FROM leases "
        f"WHERE target = ?{tx.dialect.update_lock()}",
        [target],
    )
    # Read after the row is locked (and after the snapshot, so at or after every
    # commit the read saw): a re-acquire judged before a wait for the lock could
    # revive a lease that expired meanwhile.
    now = tx.clock_after_locks()
    held_owner, held_digest, epoch, held_purpose, state, expires_at = row or (None,) * 6
    source = "absent" if state is None else state
    facts: dict[str, object] = {}
    if state is not None:
        mine = issue_token(secret, target, owner, epoch, purpose)
        facts = {
            "expired": now >= expires_at,
            "same_owner": held_owner == owner,
            "same_purpose": held_purpose == purpose,
            "token_matches": hmac.compare_digest(digest(mine), held_digest),
        }
    edge = _MACHINE.decide("acquire", source, facts)
    if edge is None:
        if held_owner == owner and held_purpose != purpose:
            raise errors.LeasePurposeError(target, held_purpose, purpose)
        if held_owner == owner:
            raise errors.BusyError.same_owner_elsewhere(target, held_owner)
        raise errors.BusyError.another_owner(target, held_owner)
    admission_check(tx, target, purpose, edge.name in GRANTING_EDGES, run_id)
    if edge.name == "reacquire":  # valid only while the lease it extends is: a
        # re-acquire whose lease expired before its COMMIT runs again (a takeover)
        tx.valid_until(utc(expires_at), Conflict(f"the lease of {target!r} expired"))
    new_epoch = (epoch or 0) + 1 if edge.name in GRANTING_EDGES else epoch
    token = issue_token(secret, target, owner, new_epoch, purpose)
    new_expiry = now + _ttl(ttl_s)
    event = (
        "INSERT INTO lease_events SELECT target, epoch, owner, purpose, ?, 'acquire', ?, 'held', "
        "?, expires_at, ? FROM w RETURNING epoch"
    )
    if edge.name == "grant":
        written = tx.one(
            "WITH w AS (INSERT INTO leases (target, owner, token_digest, epoch, purpose, state, "
            "acquired_at, renewed_at, expires_at) VALUES (?, ?, ?, 1, ?, 'held', ?, ?, ?) "
            "RETURNING *) " + event,
            [
                target,
                owner,
                digest(token),
                purpose,
                now,
                now,
                new_expiry,
                edge.name,
                source,
                None,
                now,
            ],
        )
    elif edge.name == "reacquire":
        written = tx.one(
            "WITH w AS (UPDATE leases SET expires_at = ?, renewed_at = ? "
            f"WHERE {keyed('target', _HELD_AT)} "
            "RETURNING *) " + event,
            [new_expiry, now, target, epoch, held_digest, edge.name, source, owner, now],
        )
    else:  # regrant / takeover: compare-and-set on the epoch just read
        written = tx.one(
            "WITH w AS (UPDATE leases SET owner = ?, token_digest = ?, epoch = epoch + 1, "
            "purpose = ?, state = 'held', acquired_at = ?, renewed_at = ?, expires_at = ? "
            f"WHERE {keyed('target', 'epoch = ?')} RETURNING *) " + event,
            [
                owner,
                digest(token),
                purpose,
                now,
                now,
                new_expiry,
                target,
                epoch,
                edge.name,
                source,
                held_owner,
                now,
            ],
        )
    if written is None or written[0] != new_epoch:
        raise Conflict(f"lease row of {target!r} moved during acquire")
    return Lease(target, owner, token, new_epoch, purpose, utc(new_expiry))


def renew(tx: Tx, lease: Lease, ttl_s: float) -> Lease:
    """Extend ``lease`` from now by ``ttl_s`` seconds: :func:`fence` (which
    judges its expiry after its row is locked), then the new expiry and the
    event row in one statement, in one transaction.

    Raises:
        LeaseLostError: the token/epoch no longer match, or the lease expired.
    """
    now = fence(tx, lease)
    row = tx.one(  # a compare-and-set on the epoch the fence just judged
        "WITH w AS (UPDATE leases SET expires_at = ?, renewed_at = ? "
        f"WHERE {keyed('target', 'epoch = ?')} RETURNING *) "
        "INSERT INTO lease_events SELECT target, epoch, owner, purpose, 'renew', 'renew', "
        "'held', 'held', NULL, expires_at, renewed_at FROM w RETURNING expires_at",
        [now + _ttl(ttl_s), now, lease.target, lease.epoch],
    )
    if row is None:
        raise Conflict(f"lease row of {lease.target!r} moved during renew")
    _MACHINE.require("renew", "held", {"token_matches": True, "expired": False})
    expires_at: datetime = utc(row[0])
    return Lease(lease.target, lease.owner, lease.token, lease.epoch, lease.purpose, expires_at)


def release(tx: Tx, lease: Lease) -> bool:
    """Release ``lease`` if it is still the held one; idempotent, ignores stale leases.

    Returns whether a held lease was released. Expiry is set to at most now so
    the target is free at once.
    """
    tx.hold(lease.target)  # never inside a merged group that fenced this lease
    row = tx.one(
        f"WITH c AS (SELECT {NOW} AS now), "
        "w AS (UPDATE leases SET state = 'released', "
        "expires_at = least(expires_at, (SELECT now FROM c)), renewed_at = (SELECT now FROM c) "
        f"WHERE {keyed('target', _HELD_BY)} RETURNING *) "
        "INSERT INTO lease_events SELECT target, epoch, owner, purpose, 'release', 'release', "
        "'held', 'released', NULL, expires_at, renewed_at FROM w RETURNING epoch",
        [tx.now, lease.target, lease.epoch, digest(lease.token), lease.owner],
    )
    if row is None:
        return False
    _MACHINE.require("release", "held", {"token_matches": True})
    tx.notify(Topic.LEASE_RELEASED)
    if lease.target.startswith("session:"):  # its run, if it had one, is an orphan now
        tx.notify(Topic.ORPHAN)
    return True


FENCED = ("target", "epoch", "token_digest", "owner", "purpose")
"""The lease row's columns a fence compares with the caller's lease (the
token as its digest: :func:`fence_values`). The purpose too: a write that
requires a purpose (recovery, a fork) checks the caller's lease's, and the
fence holds that to the row's, so a lease relabelled in memory is refused."""

_EXPIRED = "the lease expired"


def fence_condition(value: Callable[[str], str]) -> str:
    """The fence's identity part as SQL on a ``leases`` row: each column of
    :data:`FENCED` equal to ``value(column)`` (``?``, or a column of a set of
    leases) and the lease held. Its expiry is judged apart, by
    :func:`unexpired`, at a clock read after the row is locked: a condition on
    ``expires_at`` in the same statement would be judged at a time read before
    a wait for that lock. Every fenced write uses both: :func:`fence`, and the
    one-statement and merged appends of ``storage/ops/appends.py``."""
    same = " AND ".join(f"leases.{c} = {value(c)}" for c in FENCED[1:])
    return keyed("leases.target", f"{same} AND leases.state = 'held'", value("target"))


def fence_values(lease: Lease) -> list[object]:
    """The values :func:`fence_condition` compares, in :data:`FENCED` order."""
    return [lease.target, lease.epoch, digest(lease.token), lease.owner, lease.purpose]


def fence_holds(row: Sequence[object], lease: Lease) -> bool:
    """:func:`fence_condition` judged on a lease row already read: ``row`` holds
    the row's :data:`FENCED` columns, in that order, then its state. The same
    comparison, column by column, with SQL's ``NULL`` (``None``) equal to
    nothing. For a read of many lease rows by their targets alone (DuckDB's
    merged appends, ``storage/ops/appends.py``), where a join with each
    caller's values costs the statement half again as much to plan."""
    fenced = row[: len(FENCED)]
    state = row[len(FENCED)]
    return state == "held" and all(
        mine is not None and mine == theirs
        for mine, theirs in zip(fenced, fence_values(lease), strict=True)
    )


def unexpired(
    tx: Tx, target: str, expires_at: datetime, server_now: datetime | None = None
) -> datetime:
    """Judge a fenced lease's ``expires_at`` (read with its row locked) against
    the store's clock read after the lock (``Tx.clock_after_locks``; ``server_now``:
    the server's ``clock_timestamp()`` the locking statement returned), and keep
    the write valid only until then (``Tx.valid_until``). Returns the clock
    reading it judged at.

    Raises:
        LeaseLostError: the lease expired (``detail`` says so).
    """
    now = tx.clock_after_locks(server_now)
    expiry = utc(expires_at)
    lost = errors.LeaseLostError(target, detail=_EXPIRED)
    if expiry <= now:
        raise lost
    tx.valid_until(expiry, lost)
    return now


def fence(tx: Tx, lease: Lease) -> datetime:
    """Validate ``lease`` inside the caller's transaction: on a server by
    writing its row (``fenced_writes + 1``, which row-locks it), on DuckDB by
    reading it (see :data:`UNHELD_WRITE` for why a read is enough there), then
    its expiry at a clock read after that (:func:`unexpired`). Returns that
    clock reading.

    Raises:
        LeaseLostError: the lease is not the held, unexpired one with this token.
        Conflict: (DuckDB) a renewal or release of it committed after this
            transaction's snapshot (``Tx.hold``); the write runs again.
    """
    tx.hold(lease.target)
    condition = fence_condition(lambda c: "?")
    sql = (
        f"SELECT expires_at, NULL FROM leases WHERE {condition}"
        if tx.dialect.serialized_writes
        else f"UPDATE leases SET fenced_writes = fenced_writes + 1 WHERE {condition} "
        "RETURNING expires_at, clock_timestamp()"  # RETURNING runs once the row is locked
    )
    row = tx.one(sql, fence_values(lease))
    if row is None:
        _refused(tx, lease)
    return unexpired(tx, lease.target, row[0], row[1])


def fenced_read(
    tx: Tx, lease: Lease, read_sql: str, params: Sequence[object]
) -> tuple[tuple[Any, ...] | None, tuple[Any, ...]]:
    """:func:`fence`'s statement and a read in one statement: ``read_sql`` (a
    ``SELECT`` of at most one row, ``params`` its values) beside the lease
    row the fence finds, on a server row-locked by the same ``UPDATE``
    (a data-modifying ``WITH``, which runs whether or not a row is read).
    Returns ``(read row or None, fence part)``; the caller judges the read
    first (its errors come before the lease's, as in the separate
    statements), then the fence part with :func:`fenced`. Nothing is judged
    here: a caller that returns without judging it (a repeated call) never
    raises a lease error.

    Raises:
        Conflict: (DuckDB) as :func:`fence` raises it.
    """
    tx.hold(lease.target)
    condition = fence_condition(lambda c: "?")
    read = f"LEFT JOIN (SELECT TRUE AS found_, q.* FROM ({read_sql}) AS q) AS r ON TRUE"
    if tx.dialect.serialized_writes:
        sql = (
            f"SELECT r.*, f.* FROM (SELECT 1 AS one_) AS o {read} LEFT JOIN "
            f"(SELECT expires_at, NULL AS srv FROM leases WHERE {condition}) AS f ON TRUE"
        )
        values = [*params, *fence_values(lease)]
    else:
        sql = (
            "WITH f AS (UPDATE leases SET fenced_writes = fenced_writes + 1 "
            f"WHERE {condition} RETURNING expires_at, clock_timestamp() AS srv) "
            f"SELECT r.*, f.* FROM (SELECT 1 AS one_) AS o {read} LEFT JOIN f ON TRUE"
        )
        values = [*fence_values(lease), *params]
    row = present(tx.one(sql, values), "a fenced read's one row")
    found = None if row[0] is None else tuple(row[1:-2])
    return found, tuple(row[-2:])


def fenced(tx: Tx, lease: Lease, part: tuple[Any, ...]) -> datetime:
    """Judge the fence part of :func:`fenced_read` as :func:`fence` judges its row.

    Raises:
        LeaseLostError, LeasePurposeError: as :func:`fence` raises them.
    """
    if part[0] is None:
        _refused(tx, lease)
    return unexpired(tx, lease.target, part[0], part[1])


def fence_many(tx: Tx, held: Sequence[Lease]) -> list[datetime | Exception]:
    """:func:`fence` of each lease of ``held`` (distinct targets) in one
    statement: on a server one ``UPDATE`` of their rows (``fenced_writes +
    1``, which row-locks each), on DuckDB one read after holding every target
    (``Tx.hold``); then each expiry at a clock read after that
    (:func:`unexpired`). Returns, per lease, the clock reading its fence
    judged at, or the error :func:`fence` would raise for it alone
    (``LeaseLostError``, ``LeasePurposeError``): a group commit judges each
    member by the very fence of its single path.

    Raises:
        Conflict: (DuckDB) a renewal or release of one committed after this
            transaction's snapshot (``Tx.hold``); the write runs again.
    """
    for lease in held:
        tx.hold(lease.target)
    cols = ", ".join(
        f"unnest(?::{'BIGINT' if c == 'epoch' else 'VARCHAR'}[]) AS {c}" for c in FENCED
    )
    values = f"(SELECT unnest(?::BIGINT[]) AS i, {cols}) AS v"
    condition = fence_condition(lambda c: "v." + c)
    sql = (
        f"SELECT v.i, leases.expires_at, NULL FROM {values} JOIN leases ON {condition}"
        if tx.dialect.serialized_writes
        else f"UPDATE leases SET fenced_writes = fenced_writes + 1 FROM {values} "
        f"WHERE {condition} RETURNING v.i, leases.expires_at, clock_timestamp()"
    )
    params: list[object] = [list(range(len(held)))]
    params += [[fence_values(lease)[k] for lease in held] for k in range(len(FENCED))]
    found = {int(r[0]): r for r in tx.rows(sql, params)}
    out: list[datetime | Exception] = []
    for i, lease in enumerate(held):
        try:
            row = found.get(i)
            if row is None:
                _refused(tx, lease)
            out.append(unexpired(tx, lease.target, row[1], row[2]))
        except (errors.LeaseLostError, errors.LeasePurposeError) as refused:
            out.append(refused)
    return out


def _refused(tx: Tx, lease: Lease) -> NoReturn:
    """Why the fence found no row for ``lease``: the held lease under another
    purpose than the caller's lease says (a lease relabelled in memory: the
    row's purpose decides), else a lost lease.

    Raises:
        LeasePurposeError, LeaseLostError.
    """
    same = fence_condition(lambda c: "?" if c != "purpose" else "leases.purpose")
    values = [v for c, v in zip(FENCED, fence_values(lease), strict=True) if c != "purpose"]
    held = tx.one(f"SELECT purpose FROM leases WHERE {same}", values)
    if held is not None and held[0] != lease.purpose:
        raise errors.LeasePurposeError(lease.target, held[0], lease.purpose)
    raise errors.LeaseLostError(lease.target)


UNHELD_WRITE = "unleased_checks = unleased_checks + 1"
"""What a lease-less write writes on the lease row it checks is not held, on a
server (a counter: it changes no lease). There the write locks the row, so a
grant or takeover committed meanwhile conflicts with it. On DuckDB both
checks are reads: every grant and takeover commits under the in-process write
lock the checking transaction holds too (and one process writes a file), and
renewals and releases, which skip that lock, are kept out by ``Tx.hold``
from the check to the commit, and refused with a conflict if one committed
after the transaction's snapshot but before its hold."""


def fence_or_unheld(tx: Tx, target: str, lease: Lease | None) -> None:
    """Fence ``lease``; without one, refuse while anyone holds a live lease on
    ``target`` (a write without a lease is for a target nobody holds, so a
    stale worker cannot slip past its fence by leaving the lease out).

    Raises:
        LeaseLostError: ``lease`` is no longer the held, unexpired one.
        BusyError: no lease given and an owner holds a live one.
        Conflict: as :func:`fence` raises it.
    """
    if lease is not None:
        fence(tx, lease)
        return
    # On a server a write, not a read: a grant or takeover of the target
    # committed meanwhile then conflicts with this transaction, which retries
    # and sees the holder (see UNHELD_WRITE).
    tx.hold(target)
    touch_session(tx, target)
    found = "owner, state, expires_at"
    row = tx.one(
        f"SELECT {found}, NULL FROM leases WHERE target = ?"
        if tx.dialect.serialized_writes
        else f"UPDATE leases SET {UNHELD_WRITE} WHERE target = ? "
        f"RETURNING {found}, clock_timestamp()",
        [target],
    )
    if row is None or row[1] != "held":
        return
    if utc(row[2]) > tx.clock_after_locks(row[3]):
        raise errors.BusyError.unleased_write(target, row[0])


def _active_run(tx: Tx, target: str) -> tuple[str | None, int | None]:
    """The non-terminal run of a ``session:`` target's session and the lease
    epoch it is bound to (``runs.lease_epoch``); ``(None, None)`` when idle."""
    row = tx.one(
        "SELECT a.run_id, r.lease_epoch FROM active_runs a JOIN runs r ON r.id = a.run_id "
        "WHERE a.session_id = ?",
        [target.removeprefix("session:")],
    )
    return (None, None) if row is None else (str(row[0]), row[1])


def check_bound(tx: Tx, lease: Lease, run_id: str | None, purpose: str | None) -> None:
    """After :func:`fence`: ``lease`` has ``purpose`` and is bound to ``run_id``,
    the session's non-terminal run (admitted under this lease's epoch, or bound
    to it by :func:`bind_run`).

    Raises:
        LeasePurposeError, RuntimeLeaseRunMismatchError.
    """
    if purpose is not None and lease.purpose != purpose:
        raise errors.LeasePurposeError(lease.target, lease.purpose, purpose)
    if run_id is None:
        return
    active, epoch = _active_run(tx, lease.target)
    if active != run_id:
        raise errors.RuntimeLeaseRunMismatchError(lease.target, run_id, active)
    if epoch != lease.epoch:
        raise errors.RuntimeLeaseRunMismatchError(
            lease.target,
            run_id,
            active,
            detail=f"the run is bound to lease epoch {epoch}, not {lease.epoch}",
        )


BINDABLE = frozenset({LeasePurpose.ADMISSION, LeasePurpose.RECOVERY, LeasePurpose.EXECUTION})
"""Purposes :func:`bind_run` promotes to ``execution`` (an execution lease is re-bound)."""


def bind_run(tx: Tx, secret: bytes, lease: Lease, run_id: str) -> Lease:
    """Promote ``lease`` to ``execution`` bound to ``run_id`` (see ``Leases.bind_run``);
    the ``bind`` event is stamped at the fence's time."""
    now = fence(tx, lease)
    if lease.purpose not in BINDABLE:
        raise errors.LeasePurposeError(lease.target, lease.purpose, LeasePurpose.RECOVERY.value)
    active, _ = _active_run(tx, lease.target)
    if active != run_id:
        raise errors.RuntimeLeaseRunMismatchError(lease.target, run_id, active)
    purpose = LeasePurpose.EXECUTION.value
    token = issue_token(secret, lease.target, lease.owner, lease.epoch, purpose)
    moved = tx.one(
        "WITH w AS (UPDATE leases SET purpose = ?, token_digest = ? "
        f"WHERE {keyed('target', 'epoch = ?')} RETURNING *) "
        "INSERT INTO lease_events SELECT target, epoch, owner, purpose, 'bind', 'bind_run', "
        "'held', 'held', NULL, expires_at, ? FROM w RETURNING epoch",
        [purpose, digest(token), lease.target, lease.epoch, now],
    )
    if moved is None:
        raise Conflict(f"lease row of {lease.target!r} moved during bind_run")
    _MACHINE.require("bind_run", "held", {"token_matches": True, "expired": False})
    if (
        tx.count(
            "UPDATE runs SET lease_epoch = ?, updated_at = ? WHERE id = ?",
            [lease.epoch, tx.now, run_id],
        )
        != 1
    ):
        raise Conflict(f"run {run_id!r} moved during bind_run")
    return Lease(lease.target, lease.owner, token, lease.epoch, purpose, lease.expires_at)


# -- the store's methods ------------------------------------------------------------


class Leases(Area):
    """Leases (threadstore AcquireLease / RenewLease / ReleaseLease)."""

    def acquire(
        self,
        target: str,
        owner: str,
        ttl_s: float,
        *,
        purpose: str = LeasePurpose.MUTATION,
        run_id: str | None = None,
    ) -> Lease:
        """Take ``target`` for ``owner`` for ``ttl_s`` seconds (threadstore AcquireLease).

        A free, released or expired target is granted with a fresh token and
        epoch + 1. The same owner re-acquiring with the same purpose from this
        store object while it holds the lease gets the same token and epoch
        with a new expiry.

        A ``session:<id>`` target (a runtime lease) is granted only as its
        purpose allows, checked in the same transaction (the session seed's
        Acquire… functions): the session must exist; an ``admission``
        (AcquireExecutionAdmission), ``execution``, ``mutation``
        (AcquireMutation) or ``fork`` (AcquireFork) lease needs it idle (a
        non-terminal run found while nobody held the session is an orphan, to
        recover first); a ``recovery`` lease (AcquireRecovery) needs an active
        run, and with ``run_id`` that run. A re-acquire by the holder checks
        only that the session exists.

        Raises:
            BusyError: another owner holds an unexpired lease, or this owner
                name does through another store object or process (``holder``
                names it; the message says which).
            LeasePurposeError: this owner holds it under another purpose.
            RuntimeSessionNotFoundError: a ``session:`` target whose session
                does not exist (ErrRuntimeSessionNotFound).
            SessionRecoveryRequiredError: an idle-session purpose on a session
                with a non-terminal run (ErrSessionRecoveryRequired).
            RecoveryNotNeededError: ``recovery`` on a session with no active run.
            RuntimeLeaseRunMismatchError: ``recovery`` with a ``run_id`` that is
                not the session's active run.
            InvalidInputError: empty target/owner or non-positive ``ttl_s``.
            DatabaseError: backend failure (never reported as busy).
        On any error nothing is granted.
        """
        check_target(target)
        check_id(owner, "owner")
        why = check_purpose(purpose)
        ttl = check_ttl(ttl_s)
        if run_id is not None:
            check_id(run_id, "run_id")
            if why != LeasePurpose.RECOVERY:
                raise errors.InvalidInputError("run_id", "only a recovery lease names its run")
        return self.db.write(
            "acquire_lease",
            lambda tx: acquire(tx, self._secret, target, owner, ttl, why, run_id),
        )

    def renew(self, lease: Lease, ttl_s: float) -> Lease:
        """Extend ``lease`` to now + ``ttl_s`` seconds (threadstore RenewLease).

        Raises:
            LeaseLostError: the lease expired, was released or taken over.
        """
        check_lease(lease)
        ttl = check_ttl(ttl_s)
        # A heartbeat: a short transaction on its own lease row, never queued
        # behind another thread's long write (exclusive=False: on DuckDB it skips
        # the write lock; its target's stripe orders it with the writes of it).
        return self._fenced("renew_lease", lease, lambda tx: renew(tx, lease, ttl), exclusive=False)

    def release(self, lease: Lease) -> bool:
        """Release ``lease`` (threadstore ReleaseLease); idempotent, ignores stale leases.

        Returns whether this call released a held lease.
        """
        check_lease(lease)
        return self.db.write(
            "release_lease", lambda tx: release(tx, lease), transaction=False, exclusive=False
        )

    def validate(
        self, lease: Lease, *, run_id: str | None = None, purpose: str | None = None
    ) -> None:
        """Check ``lease`` is still held, unexpired, with this token: the final
        fence a runtime calls right before a side effect (session seed
        ValidateRuntimeLease). With ``purpose``, the lease must be of that
        purpose; with ``run_id``, that run must be its session's non-terminal
        run and bound to this lease (admitted under its epoch, or bound by
        :meth:`leases.bind_run`).

        Raises:
            LeaseLostError: it is not held.
            LeasePurposeError: another purpose (ErrRuntimeLeasePurpose).
            RuntimeLeaseRunMismatchError: ``run_id`` is not the session's
                active run, or that run is bound to another lease epoch
                (ErrRuntimeLeaseRunMismatch).
        """
        check_lease(lease)
        want = None if purpose is None else check_purpose(purpose)
        if run_id is not None:
            check_id(run_id, "run_id")
        if want is None and run_id is None:
            self._fenced(
                "validate_lease",
                lease,
                lambda tx: fence(tx, lease),
                transaction=False,
                exclusive=False,
            )
            return

        def body(tx: Tx) -> None:
            fence(tx, lease)
            check_bound(tx, lease, run_id, want)

        self._fenced("validate_lease", lease, body, exclusive=False)

    def bind_run(self, lease: Lease, run_id: str) -> Lease:
        """Promote ``lease`` to ``execution`` bound to ``run_id`` (session seed
        BindRuntimeLeaseToExistingRun): a reattach path calls it before it
        executes a run it did not admit under this lease, e.g. after
        :meth:`leases.acquire` with purpose ``recovery``.

        In one transaction: fence ``lease`` (purpose ``recovery``,
        ``admission``, or ``execution`` to re-bind), check ``run_id`` is
        still its session's sole non-terminal run, set the lease row's purpose
        to ``execution`` (under a new token: a token is issued per purpose)
        and the run's ``lease_epoch`` to this lease's epoch. Returns the
        promoted lease (same target, owner, epoch and expiry); the lease given
        no longer fences (LeaseLostError: its token is replaced), and a guard holding it must
        adopt the new one (``RuntimeLeaseGuard.bind_run`` does).

        Raises:
            LeaseLostError: the lease is no longer held.
            LeasePurposeError: a ``mutation`` or ``fork`` lease.
            RuntimeLeaseRunMismatchError: ``run_id`` is not the session's
                active run (it ended, or another run is active).
            InvalidInputError: a malformed lease or run id.
        On any error nothing is written.
        """
        check_lease(lease)
        check_id(run_id, "run_id")
        if not lease.target.startswith("session:"):
            raise errors.InvalidInputError("lease", "only a session lease is bound to a run")
        return self._fenced(
            "bind_run_lease", lease, lambda tx: bind_run(tx, self._secret, lease, run_id)
        )
