"""Orphan-run recovery on DuckDB (session seed Begin/Converge/MarkSessionRunRecovery*).

Every write fences the caller's ``recovery``-purpose lease on the run's
session inside its transaction (the fence writes the lease row, so a
takeover by another worker conflicts), so a stale recovery worker can never
commit. Convergence ends the run (closing its open turn, writing the
terminal event) and completes the recovery record in one transaction.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from turnkeeper.machines import machine_for
from turnkeeper.spec import RECOVERY, errors
from turnkeeper.spec.delivery import DeliveryPlan
from turnkeeper.spec.lease import LeasePurpose, session_target
from turnkeeper.spec.lifecycle import Edge
from turnkeeper.spec.records import Lease, Recovery, ResponseRun, Run
from turnkeeper.spec.recovery import retry_delay_s
from turnkeeper.spec.run import NON_TERMINAL, RunStatus

from ..backend import Conflict, Tx, keyed, present, utc
from ..codec import check_id, check_text, to_json
from ..validate import check_int, check_lease, check_plan, check_seconds
from . import archives, leases, run_lifecycle, run_reads
from .base import Area

_MACHINE = machine_for(RECOVERY)

_COLS = (
    "run_id, session_id, state, trigger_source, reason, attempt, lease_epoch, "
    "previous_lease_epoch, last_error, next_retry_at, started_at, updated_at, completed_at"
)


def _recovery(row: Sequence[Any]) -> Recovery:
    return Recovery(
        run_id=row[0],
        session_id=row[1],
        state=row[2],
        trigger_source=row[3],
        reason=row[4],
        attempt=row[5],
        lease_epoch=row[6],
        previous_lease_epoch=row[7],
        last_error=row[8],
        next_retry_at=None if row[9] is None else utc(row[9]),
        started_at=utc(row[10]),
        updated_at=utc(row[11]),
        completed_at=None if row[12] is None else utc(row[12]),
    )


def get(tx: Tx, run_id: str) -> Recovery | None:
    """The run's recovery record, or ``None``."""
    row = tx.one(f"SELECT {_COLS} FROM run_recoveries WHERE run_id = ?", [run_id])
    return None if row is None else _recovery(row)


def not_retained(remote: ResponseRun | None) -> str | None:
    """Why ``remote`` (a run's newest remote run record, :func:`.archives.linked_run`)
    does not keep the run recoverable by its provider, or ``None`` when it does:
    it exists, names its response and provider, and has not ended (session seed
    MarkSessionRunRecoveryDetached: the response record is the evidence)."""
    if remote is None:
        return "its session has no remote run record linked to the run"
    if not remote.response_id:
        return f"its remote run record {remote.local_run_id!r} names no response"
    if not remote.provider.strip():
        return f"its remote run record {remote.local_run_id!r} names no provider"
    if archives.remote_terminal(remote.state):
        return f"its remote run {remote.local_run_id!r} is {remote.state}"
    return None


def remote_ended(tx: Tx, run: Run) -> bool:
    """Whether no remote run record keeps ``run`` recoverable any more."""
    return not_retained(archives.linked_run(tx, run.session_id, run.id)) is not None


def orphans(tx: Tx) -> list[Run]:
    """Non-terminal runs with no live lease on their session (store clock), including
    runs that never had one, whose recovery is not parked (dead-lettered, failed and
    not yet due, or detached while its remote run record still shows a live
    provider execution: :func:`remote_ended`).

    ``active_runs`` holds only the non-terminal runs; their runs, lease rows and
    recovery records are then read by those keys, each table's scan with one
    filter, its key list (an index scan on DuckDB: see storage/backend.py
    keyed), not joined whole: the runs and leases of every finished session stay unread, so a poll
    does not cost more with the store's history. A run admitted between the two
    statements is the next poll's."""
    active = tx.rows("SELECT session_id, run_id FROM active_runs")
    if not active:
        return []
    run_ids = [run_id for _, run_id in active]
    rows = tx.rows(
        f"WITH c AS (SELECT {leases.NOW} AS now) "
        "SELECT r.id, v.state FROM active_runs a JOIN (SELECT id, started_at FROM runs "
        "WHERE id = ANY(?::VARCHAR[])) r ON r.id = a.run_id "
        "LEFT JOIN (SELECT target, state, expires_at FROM leases "
        "WHERE target = ANY(?::VARCHAR[])) l ON l.target = 'session:' || a.session_id "
        "LEFT JOIN (SELECT run_id, state, next_retry_at FROM run_recoveries "
        "WHERE run_id = ANY(?::VARCHAR[])) v ON v.run_id = r.id, c "
        "WHERE NOT coalesce(l.state = 'held' AND l.expires_at > c.now, FALSE) "
        "AND (v.state IS NULL OR v.state IN ('recovering', 'detached') "
        "OR (v.state = 'failed' AND coalesce(v.next_retry_at <= c.now, TRUE))) "
        "ORDER BY r.started_at, r.id" + tx.dialect.skip_locked_of("r"),
        # PostgreSQL: leave out runs another worker is recovering or ending right now
        [
            tx.now,
            run_ids,
            [session_target(session_id) for session_id, _ in active],
            run_ids,
        ],
    )
    found = [(run_reads.get(tx, r[0]), r[1]) for r in rows]
    return [
        run
        for run, state in found
        if run is not None and (state != "detached" or remote_ended(tx, run))
    ]


def _event(tx: Tx, rec: Recovery, edge: Edge) -> None:
    tx.exec(
        "INSERT INTO recovery_events VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            rec.run_id,
            rec.attempt,
            edge.name,
            edge.trigger,
            edge.source,
            edge.dest,
            rec.lease_epoch,
            tx.now,
        ],
    )


def _guarded(tx: Tx, run_id: str, lease: Lease) -> Run:
    """Load the run and fence the caller's recovery lease on its session."""
    run = run_reads.get(tx, run_id)
    if run is None:
        raise errors.RunNotFoundError(run_id)
    if lease.target != session_target(run.session_id):
        raise errors.InvalidInputError(
            "lease", f"a lease on {lease.target!r} cannot recover a run of {run.session_id!r}"
        )
    if lease.purpose != LeasePurpose.RECOVERY:
        raise errors.LeasePurposeError(lease.target, lease.purpose, LeasePurpose.RECOVERY.value)
    leases.fence(tx, lease)
    return run


def begin(tx: Tx, run_id: str, lease: Lease, trigger_source: str, reason: str) -> Recovery:
    """Start (or retry, or take over) recovering an orphaned run.

    Raises:
        RecoveryNotNeededError: the run is terminal or not its session's
            active run, its recovery is parked, or already held by this lease.
        RunNotFoundError, LeaseLostError, LeasePurposeError, InvalidInputError.
    """
    run = _guarded(tx, run_id, lease)
    if run.status not in NON_TERMINAL:
        raise errors.RecoveryNotNeededError(run_id, f"the run is {run.status}")
    now = tx.now
    assert now is not None
    rec = get(tx, run_id)
    source = "absent" if rec is None else rec.state
    facts = {
        "due": rec is not None and (rec.next_retry_at is None or rec.next_retry_at <= now),
        "superseded": rec is not None and rec.lease_epoch < lease.epoch,
        "remote_ended": rec is not None and rec.state == "detached" and remote_ended(tx, run),
    }
    try:
        edge = _MACHINE.decide("begin", source, facts)
    except errors.InvalidTransitionError:
        edge = None
    if edge is None:
        if rec is not None and rec.state == "recovering" and rec.lease_epoch == lease.epoch:
            return rec  # this very lease already began it
        raise errors.RecoveryNotNeededError(run_id, f"its recovery is {source}")
    # Touch the run: a termination racing this begin then conflicts with it (one
    # of the two retries and sees the other) instead of both committing.
    run_epoch = run_lifecycle.touch(tx, run)
    previous = rec.lease_epoch if rec is not None else run_epoch
    row = tx.one(
        f"INSERT INTO run_recoveries ({_COLS}) VALUES "
        "(?, ?, 'recovering', ?, ?, 1, ?, ?, NULL, NULL, ?, ?, NULL) "
        "ON CONFLICT (run_id) DO UPDATE SET state = 'recovering', attempt = "
        "run_recoveries.attempt + 1, lease_epoch = excluded.lease_epoch, "
        "previous_lease_epoch = excluded.previous_lease_epoch, "
        "trigger_source = excluded.trigger_source, reason = excluded.reason, "
        "next_retry_at = NULL, completed_at = NULL, updated_at = excluded.updated_at "
        f"RETURNING {_COLS}",
        [run_id, run.session_id, trigger_source, reason, lease.epoch, previous, now, now],
    )
    row = present(row, "the recovery row its upsert returns")
    begun = _recovery(row)
    _event(tx, begun, edge)
    return begun


def _held(tx: Tx, run_id: str, lease: Lease, trigger: str) -> tuple[Run, Recovery]:
    run = _guarded(tx, run_id, lease)
    rec = get(tx, run_id)
    if rec is None or rec.state != "recovering":
        state = "absent" if rec is None else rec.state
        raise errors.InvalidTransitionError("recovery", trigger, state)
    if rec.lease_epoch != lease.epoch:
        raise errors.LeaseLostError(lease.target, detail="another worker took the recovery over")
    return run, rec


def _set(tx: Tx, rec: Recovery, edge: Edge, sets: str, params: list[Any]) -> Recovery:
    row = tx.one(
        f"UPDATE run_recoveries SET state = ?, updated_at = ?, {sets} "
        f"WHERE {keyed('run_id', 'state = ? AND lease_epoch = ?')} RETURNING {_COLS}",
        [edge.dest, tx.now, *params, rec.run_id, edge.source, rec.lease_epoch],
    )
    if row is None:
        raise Conflict(f"recovery of {rec.run_id!r} moved")
    done = _recovery(row)
    _event(tx, done, edge)
    return done


def converge(
    tx: Tx,
    run_id: str,
    lease: Lease,
    status: RunStatus,
    error: str | None,
    stop_reason: str | None,
    decisions: Sequence[Mapping[str, Any]] = (),
    plan: DeliveryPlan | None = None,
) -> Recovery:
    """Record the pending decisions' resolutions, end the run (``cancelled`` when a
    cancel was requested) with ``plan`` as its delivery plan, and complete the record.

    A run that reached a terminal status some other way keeps it (and gets no
    decision events and no plan: its own finalizer stays authoritative).
    """
    run, rec = _held(tx, run_id, lease, "converge")
    edge = _MACHINE.require("converge", rec.state, {})
    if run.status in NON_TERMINAL:
        run_lifecycle.record_decisions(tx, run, decisions)
        final = RunStatus.CANCELLED if run.cancel_requested else status
        run_lifecycle.finish(
            tx,
            run_id,
            final,
            assistant_message=None,
            error=error,
            stop_reason=stop_reason,
            lease=None,  # fenced above by _held; its epoch goes on the entries
            plan=plan,
            fenced_epoch=lease.epoch,
        )
    return _set(tx, rec, edge, "completed_at = ?", [tx.now])


def fail(
    tx: Tx,
    run_id: str,
    lease: Lease,
    message: str,
    max_attempts: int,
    base_delay_s: float,
    max_delay_s: float,
) -> Recovery:
    """Record a failed attempt: retry later with backoff and jitter, or dead-letter it."""
    _, rec = _held(tx, run_id, lease, "fail")
    edge = _MACHINE.require("fail", rec.state, {"attempts_exhausted": rec.attempt >= max_attempts})
    now = tx.now
    assert now is not None
    retry_at = None
    if edge.dest == "failed":
        delay = retry_delay_s(rec.attempt, base_delay_s, max_delay_s, random.random())
        retry_at = now + timedelta(seconds=delay)
    return _set(tx, rec, edge, "last_error = ?, next_retry_at = ?", [message, retry_at])


def detach(tx: Tx, run_id: str, lease: Lease) -> Recovery:
    """Leave the run to the remote execution that still owns it, as its remote
    run record shows (:func:`not_retained`).

    Raises:
        RemoteRunNotRetainedError: no remote run record keeps the run recoverable.
        LeaseLostError, InvalidTransitionError, LeasePurposeError, RunNotFoundError.
    """
    run, rec = _held(tx, run_id, lease, "detach")
    edge = _MACHINE.require("detach", rec.state, {})
    reason = not_retained(archives.linked_run(tx, run.session_id, run.id))
    if reason is not None:
        raise errors.RemoteRunNotRetainedError(run_id, reason)
    return _set(tx, rec, edge, "completed_at = ?", [tx.now])


# -- the store's methods ------------------------------------------------------------


class Recoveries(Area):
    """List orphans; begin, converge, fail or detach their recovery."""

    def list_orphans(self) -> list[Run]:
        """Non-terminal runs with no live lease on their session by the store's
        clock (including runs admitted without one), oldest first, leaving out
        runs whose recovery is dead-lettered, failed and not yet due, or detached
        while the run's remote run record still shows a live provider execution
        (session seed ListOrphanedSessionRuns; a detached run whose remote run
        has ended is listed again, to be converged). A read: recover each through
        :meth:`recovery.begin` under a recovery lease. On PostgreSQL a run
        another worker is recovering or ending at this moment is left out
        (its row lock is skipped, not waited for)."""
        return self.db.scan("list_orphaned_runs", orphans)

    def get(self, run_id: str) -> Recovery | None:
        """The run's recovery record, or ``None``."""
        check_id(run_id, "run_id")
        return self.db.read("get_recovery", lambda tx: get(tx, run_id))

    def begin(
        self, run_id: str, lease: Lease, *, trigger_source: str = "sweep", reason: str = "orphaned"
    ) -> Recovery:
        """Begin recovering ``run_id`` under ``lease`` (purpose ``recovery``, on the
        run's session), re-checking in the same transaction that the run is still
        its session's non-terminal run (session seed BeginSessionRunRecovery). A
        failed recovery is retried once due; a recovery whose worker lost its
        lease is taken over; a detached one begins anew once the run's remote
        run record no longer shows a live provider execution (it ended, lost its
        response id or provider, or is gone).

        Raises:
            RecoveryNotNeededError: the run is terminal, or its recovery is parked.
            LeasePurposeError: the lease's purpose is not ``recovery``.
            LeaseLostError, RunNotFoundError, InvalidInputError.
        """
        self._check(run_id, lease)
        check_text(trigger_source, "trigger_source")
        check_text(reason, "reason")
        return self._fenced(
            "begin_recovery",
            lease,
            lambda tx: begin(tx, run_id, lease, trigger_source, reason),
        )

    def converge(
        self,
        run_id: str,
        lease: Lease,
        *,
        status: str = RunStatus.INTERRUPTED,
        error: str | None = None,
        stop_reason: str | None = None,
        decisions: Sequence[Mapping[str, Any]] = (),
        delivery_plan: DeliveryPlan | None = None,
    ) -> Recovery:
        """Converge: record the resolutions of the run's pending decisions (one
        ``decision`` run event each: a JSON object with a string ``id``, for
        example ``{"id": "approval-7", "resolution": "expired"}``), end the run
        in ``status`` (``cancelled`` instead when a cancel was requested; a run
        already terminal keeps its status), close its open turn, write the
        terminal event and complete the record, in one transaction that
        revalidates the recovery lease (session seed
        ConvergeSessionRunRecovery). A run that already ended keeps its status
        and gets no decision events (its own finalizer stays authoritative):
        check ``runs.get`` first if the resolutions must be recorded.
        ``delivery_plan`` (say, a notice that the run was interrupted) is
        written in the same transaction as the run's end, as ``runs.finish``
        does, so a recovery that ends a run never loses its notice; a run
        that ended some other way gets none.

        Raises:
            LeaseLostError: the lease is stale or another worker took over.
            InvalidTransitionError: the record is not ``recovering``.
            InvalidInputError: ``status`` is not a terminal run status.
        """
        self._check(run_id, lease)
        try:
            final = RunStatus(status)
        except ValueError:
            raise errors.InvalidInputError("status", f"not a run status: {status!r}") from None
        if final in (RunStatus.ADMITTED, RunStatus.RUNNING, RunStatus.WAITING):
            raise errors.InvalidInputError("status", "convergence ends the run")
        for name, value in (("error", error), ("stop_reason", stop_reason)):
            if value is not None:
                check_text(value, name)
        run_lifecycle.check_outcome(final, error)
        resolved = _check_decisions(decisions)
        plan = None if delivery_plan is None else check_plan(delivery_plan)
        return self._fenced(
            "converge_recovery",
            lease,
            lambda tx: converge(tx, run_id, lease, final, error, stop_reason, resolved, plan),
        )

    def fail(
        self,
        run_id: str,
        lease: Lease,
        message: str,
        *,
        max_attempts: int = 5,
        base_delay_s: float = 1.0,
        max_delay_s: float = 300.0,
    ) -> Recovery:
        """Record a failed recovery attempt under the same fenced owner (session
        seed MarkSessionRunRecoveryFailed): retry after ``base_delay_s * 2 **
        (attempt - 1)`` seconds (capped at ``max_delay_s``, plus up to 10 %
        jitter), or dead-letter once ``max_attempts`` attempts failed.

        Raises:
            LeaseLostError, InvalidTransitionError, InvalidInputError.
        """
        self._check(run_id, lease)
        check_text(message, "message")
        check_int(max_attempts, "max_attempts", 1)
        base = check_seconds(base_delay_s, "base_delay_s", allow_zero=False)
        if base > check_seconds(max_delay_s, "max_delay_s", allow_zero=False):
            raise errors.InvalidInputError("base_delay_s", "need base_delay_s <= max_delay_s")
        return self._fenced(
            "fail_recovery",
            lease,
            lambda tx: fail(tx, run_id, lease, message, max_attempts, base_delay_s, max_delay_s),
        )

    def detach(self, run_id: str, lease: Lease) -> Recovery:
        """Mark the recovery detached: a remote execution still owns the run
        (session seed MarkSessionRunRecoveryDetached). The run is left as it is.
        The marker records that the run's canonical remote record was retained:
        the run's newest remote run record (a :class:`ResponseRun` of its
        session, ``store.archives.save_run``, whose ``local_turn_id`` is the
        run's id or starts with it and ``:``) must name its response and
        provider and not have ended (state ``completed``, ``failed``,
        ``incomplete``, ``cancelled``, ``canceled`` or ``expired``), checked in
        the same transaction. That record, not the marker, stays the evidence:
        once it ends, the run is an orphan again (:meth:`list_orphans`,
        :meth:`begin`).

        Raises:
            RemoteRunNotRetainedError: no remote run record keeps the run
                recoverable (fields ``run_id``, ``reason``); nothing is written.
            LeaseLostError, InvalidTransitionError, InvalidInputError.
        """
        self._check(run_id, lease)
        return self._fenced("detach_recovery", lease, lambda tx: detach(tx, run_id, lease))

    @staticmethod
    def _check(run_id: str, lease: Lease) -> None:
        check_id(run_id, "run_id")
        check_lease(lease)


def _check_decisions(decisions: object) -> list[dict[str, Any]]:
    """Decision resolutions: a sequence of JSON objects, each with a non-empty
    string ``id``, ids unique."""
    if not isinstance(decisions, Sequence) or isinstance(decisions, str | bytes):
        raise errors.InvalidInputError("decisions", "expected a sequence of mappings")
    out: list[dict[str, Any]] = []
    for i, decision in enumerate(decisions):
        if not isinstance(decision, Mapping):
            raise errors.InvalidInputError(f"decisions[{i}]", "expected a mapping")
        check_id(decision.get("id"), f"decisions[{i}].id")
        to_json(dict(decision), f"decisions[{i}]")
        out.append(dict(decision))
    if len({d["id"] for d in out}) != len(out):
        raise errors.InvalidInputError("decisions", "decision ids must be unique")
    return out
