"""Execution intents, runs and run events on DuckDB (session seed runs).

Admission is one transaction: the submission digest check, the lease fence,
the one-active-run check, the intent (for a first attempt), the run, the
``active_runs`` row, the turn-start and user entries, the conversation turn,
the ``admit`` run event and the submission row. Termination is one
transaction too: the status compare-and-set, the ``active_runs`` delete, the
assistant and turn-end entries, the turn row and the terminal event. Entry
and event ids derive from the run id, so repeating a terminalization whose
commit result was unknown returns the stored run and writes nothing twice.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import uuid6

from turnkeeper.machines import machine_for
from turnkeeper.spec import RUN, errors
from turnkeeper.spec.delivery import DeliveryPlan
from turnkeeper.spec.entries import EntryKind, validate_payload
from turnkeeper.spec.lease import LeasePurpose, session_target
from turnkeeper.spec.lifecycle import Edge
from turnkeeper.spec.records import (
    ANY_LEAF,
    Lease,
    NewEntry,
    Run,
)
from turnkeeper.spec.run import (
    FINISH_TRIGGERS,
    NON_TERMINAL,
    TERMINAL,
    ActiveRunPolicy,
    RunStatus,
)

from ..backend import Conflict, Tx, keyed, present, utc
from ..codec import check_id, check_text, to_json
from ..pairing import Opening
from ..validate import (
    check_bool,
    check_lease,
    check_plan,
    check_session_lease,
)
from ..wakeups import Topic
from . import leases, outbox_plans, session_rows, submissions, tool_pairing
from .pairing_checks import OpeningCache
from .run_errors import RunErrorsPart
from .run_reads import RUN_BASE_COLS, RUN_COLS, RunReadsPart, get, run_row
from .run_records import RunRecordsPart
from .run_usage import RunUsagePart

_MACHINE = machine_for(RUN)

ADMITTING = frozenset({LeasePurpose.ADMISSION, LeasePurpose.EXECUTION})
"""Lease purposes that may admit a run: an admission lease (seed
AcquireExecutionAdmission) or an execution lease; never a ``mutation``,
``fork`` or ``recovery`` one."""


def _event(tx: Tx, run: Run, edge: Edge, event_id: str, data: Mapping[str, Any]) -> None:
    """Append a run event with the session's next sequence number."""
    _events(tx, run, [(edge, event_id, data)])


def _events(tx: Tx, run: Run, events: Sequence[tuple[Edge, str, Mapping[str, Any]]]) -> None:
    """Append run events (edge, event id, data), in order, with the session's
    next sequence numbers, taken from its event cursor (``session_rows.event_seq``,
    the seq of its last run event): a point update and one insert however
    many, whatever the size of the history (the largest seq is never searched
    for among the events, which on DuckDB reads every run event in the store).

    Raises:
        Conflict: the session row is gone (the transaction retries).
    """
    n = len(events)
    # On a server the largest seq is also read, through the (session_id, seq) key
    # (an index probe): a turnkeeper older than schema 10 still running in the
    # fleet beside a migrated database numbers events by it and leaves the cursor
    # behind. A DuckDB file has one writing process, and an older turnkeeper
    # cannot open a migrated file (SchemaVersionError): the cursor alone.
    serial = tx.dialect.serialized_writes
    last = (
        "event_seq"
        if serial
        else "greatest(event_seq, (SELECT coalesce(max(seq), 0) FROM run_events "
        "WHERE session_id = ?))"
    )
    bump = [*([] if serial else [run.session_id]), n, run.session_id]
    if tx.count(f"UPDATE sessions SET event_seq = {last} + ? WHERE id = ?", bump) != 1:
        raise Conflict(f"session {run.session_id!r} of run {run.id!r} is gone")
    row = "SELECT ?::BIGINT, ?, ?, ?, ?, ?, ?, ?, ?::TIMESTAMPTZ"
    rows = " UNION ALL ".join([row] * n)
    params: list[Any] = []
    for k, (edge, event_id, data) in enumerate(events, start=1):
        params += [k, event_id, run.id, edge.name, edge.trigger, edge.source, edge.dest]
        params += [to_json(dict(data), "data"), tx.now]
    tx.exec(
        "INSERT INTO run_events SELECT s.id, s.event_seq - ? + v.n, v.id, v.run_id, v.edge, "
        "v.trigger, v.source, v.dest, v.data, v.occurred_at FROM sessions AS s, "
        f"({rows}) AS v (n, id, run_id, edge, trigger, source, dest, data, occurred_at) "
        "WHERE s.id = ?",
        [n, *params, run.session_id],
    )


def admit(
    tx: Tx,
    session_id: str,
    *,
    intent: Mapping[str, Any],
    admission: submissions.Admission,
    key_digest: str | None,
    user_message: Mapping[str, Any] | None,
    lease: Lease | None,
    retry_of: str | None,
    start: bool = False,
    known: Opening | None = None,
    on_active: ActiveRunPolicy = ActiveRunPolicy.REFUSE,
) -> tuple[Run, bool, Opening | None]:
    """Admit a run (see the module docstring); returns ``(run, admitted_now,
    opening)``: ``opening`` the calls open after its entries, if known.

    ``admission`` holds the request's digest (kept on the intent) and the
    whole admission's (kept for a submission key, and compared by
    :func:`submissions.same_admission`). With ``start``
    the run is admitted and started in this one transaction: it is stored
    ``running`` and both events (``admit``, ``start``) are written.
    ``known``: the calls open at the session's head, if the caller knows
    them (the user message is judged by the pairing rule: it may not follow
    unanswered calls). ``on_active``: what a session with an active run gets
    (:class:`ActiveRunPolicy`), decided after the fence.

    Raises:
        SessionNotFoundError, SubmissionConflictError, SessionRunActiveError,
        RunNotFoundError, RetryNotAllowedError, LeaseLostError,
        ToolCallsUnansweredError.
    """
    head = tx.one("SELECT leaf_id, next_seq FROM sessions WHERE id = ?", [session_id])
    if head is None:
        raise errors.SessionNotFoundError(session_id)
    if key_digest is not None:
        sub = tx.one(
            "SELECT run_id, request_fingerprint FROM submissions "
            f"WHERE {keyed('key_digest', 'session_id = ?')}",
            [key_digest, session_id],
        )
        if sub is not None:
            if not submissions.same_admission(tx, sub[0], sub[1], admission):
                raise errors.SubmissionConflictError(session_id, sub[0])
            found = get(tx, sub[0])
            found = present(found, "the run its submission names")
            return found, False, None
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    current = tx.one("SELECT run_id FROM active_runs WHERE session_id = ?", [session_id])
    if current is not None and on_active == ActiveRunPolicy.USE_EXISTING:
        found = present(get(tx, current[0]), "the session's active run")
        if key_digest is not None:  # the key now names that run
            tx.exec(
                "INSERT INTO submissions VALUES (?, ?, ?, ?, ?, ?)",
                [session_id, key_digest, admission.digest, found.intent_id, found.id, tx.now],
            )
        return found, False, None
    if current is not None and on_active == ActiveRunPolicy.CANCEL_EXISTING:
        request_cancel(tx, current[0])
        _, _, known = finish(
            tx,
            current[0],
            RunStatus.CANCELLED,
            assistant_message=None,
            error=None,
            stop_reason="replaced",
            lease=lease,
        )
        head = present(
            tx.one("SELECT leaf_id, next_seq FROM sessions WHERE id = ?", [session_id]),
            "the session the replaced run ended in",
        )
        current = None
    attempt, intent_id, why = 1, None, ""
    if retry_of is not None:
        prev = get(tx, retry_of)
        if prev is None:
            raise errors.RunNotFoundError(retry_of)
        if prev.session_id != session_id:
            raise errors.RetryNotAllowedError(retry_of, "the run belongs to another session")
        latest = tx.one("SELECT max(attempt) FROM runs WHERE intent_id = ?", [prev.intent_id])
        attempt, intent_id = prev.attempt + 1, prev.intent_id
        if latest is None or latest[0] != prev.attempt:
            why = f"attempt {latest[0] if latest else '?'} is the intent's latest"
        elif prev.status not in TERMINAL:
            why = f"attempt {prev.attempt} is still {prev.status}"
    facts = {"no_active_run": current is None, "retry_allowed": not why}
    if _MACHINE.decide("admit", "absent", facts) is None:
        if current is not None:
            raise errors.SessionRunActiveError(session_id, current[0])
        assert retry_of is not None
        raise errors.RetryNotAllowedError(retry_of, why)
    now = tx.now
    run_id = str(uuid6.uuid7())
    if intent_id is None:
        intent_id = str(uuid6.uuid7())
        tx.exec(
            "INSERT INTO execution_intents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                intent_id,
                session_id,
                intent["source"],
                intent["model"],
                intent["mode"],
                intent["work_dir"],
                admission.fingerprint,
                intent["request"],
                intent["policy"],
                now,
            ],
        )
    status = (RunStatus.RUNNING if start else RunStatus.ADMITTED).value
    tx.exec(
        f"INSERT INTO runs ({RUN_BASE_COLS}, lease_epoch, model) "
        "VALUES (?, ?, ?, ?, ?, ?, FALSE, NULL, ?, ?, NULL, ?, "
        "(SELECT model FROM execution_intents WHERE id = ?))",
        [
            run_id,
            session_id,
            intent_id,
            retry_of,
            attempt,
            status,
            now,
            now,
            lease and lease.epoch,
            intent_id,
        ],
    )
    tx.exec("INSERT INTO active_runs VALUES (?, ?)", [session_id, run_id])
    turn = {"turnId": f"{run_id}:turn", "intentId": intent_id, "runId": run_id, "attempt": attempt}
    epoch = None if lease is None else lease.epoch
    # The entry ids derive from a run id made just now: no existence check is needed.
    drafts = [session_rows.own_draft(EntryKind.TURN_START, turn, f"{run_id}:turn-start")]
    if user_message is not None:
        message = {"message": user_message}
        drafts.append(session_rows.own_draft(EntryKind.MESSAGE, message, f"{run_id}:user"))
    chain = session_rows.append_chain(
        tx,
        session_id,
        drafts,
        expected_leaf=ANY_LEAF,
        lease=None,
        fenced_epoch=epoch,
        checked=True,
        head=(head[0], head[1]),  # nothing above moved the leaf or the seq
        known=known,
    )
    written = chain.entries
    tx.exec(
        "INSERT INTO conversation_turns VALUES (?, ?, ?, ?, ?, 'open', ?, NULL, ?, NULL)",
        [f"{run_id}:turn", session_id, intent_id, run_id, attempt, written[0].seq, now],
    )
    assert now is not None  # always set inside a transaction
    at = utc(now)
    run = Run(
        run_id,
        session_id,
        intent_id,
        retry_of,
        attempt,
        status,
        False,
        None,
        at,
        at,
        None,
        f"{run_id}:turn",
    )
    events: list[tuple[Edge, str, Mapping[str, Any]]] = [
        (RUN.edge("admit"), f"{run_id}:admitted", {"attempt": attempt})
    ]
    if start:
        events.append((RUN.edge("start"), f"{run_id}:start:{secrets.token_hex(4)}", {}))
    _events(tx, run, events)
    if key_digest is not None:
        tx.exec(
            "INSERT INTO submissions VALUES (?, ?, ?, ?, ?, ?)",
            [session_id, key_digest, admission.digest, intent_id, run_id, now],
        )
    return run, True, chain.opening


def check_outcome(status: RunStatus, error: str | None) -> None:
    """A run that succeeded carries no error: its outcome is final and says so.

    Raises:
        InvalidInputError: ``error`` given with ``succeeded``.
    """
    if status == RunStatus.SUCCEEDED and error is not None:
        raise errors.InvalidInputError("error", "a run that succeeded carries no error")


def _load(tx: Tx, run_id: str) -> Run:
    run = get(tx, run_id)
    if run is None:
        raise errors.RunNotFoundError(run_id)
    return run


def _move(tx: Tx, run: Run, edge: Edge, error: str | None = None) -> Run:
    """Compare-and-set the run's status along ``edge``; a moved row is a retried race."""
    now = tx.now
    assert now is not None  # always set inside a transaction
    done = "finished_at = ?, " if edge.dest in TERMINAL else ""
    params: list[Any] = [edge.dest, now] + ([now] if done else []) + [error, run.id, edge.source]
    moved = tx.count(
        f"UPDATE runs SET status = ?, updated_at = ?, {done}error = coalesce(?, error) "
        f"WHERE {keyed('id', 'status = ?')}",
        params,
    )
    if moved != 1:
        raise Conflict(f"run {run.id!r} moved")
    at = utc(now)
    return dataclasses.replace(
        run,
        status=edge.dest,
        updated_at=at,
        finished_at=at if done else run.finished_at,
        error=run.error if error is None else error,
    )


def step(tx: Tx, run_id: str, trigger: str, lease: Lease | None) -> Run:
    """``start``, ``wait`` or ``resume`` a run.

    Raises:
        RunNotFoundError, InvalidTransitionError, LeaseLostError.
    """
    run = _load(tx, run_id)
    target = session_target(run.session_id)
    check_session_lease(run.session_id, lease)
    if lease is not None:  # a stale holder learns it lost, whatever the run did since
        leases.fence_or_unheld(tx, target, lease)
    edge = _MACHINE.require(trigger, run.status, {})
    if lease is None:  # without a lease, nobody else may hold the session
        leases.fence_or_unheld(tx, target, None)
    moved = _move(tx, run, edge)
    _event(tx, moved, edge, f"{run_id}:{trigger}:{secrets.token_hex(4)}", {})
    return moved


def finish(
    tx: Tx,
    run_id: str,
    status: RunStatus,
    *,
    assistant_message: Mapping[str, Any] | None,
    error: str | None,
    stop_reason: str | None,
    lease: Lease | None,
    plan: DeliveryPlan | None = None,
    fenced_epoch: int | None = None,
    drafts: Sequence[session_rows.Draft] = (),
    openings: OpeningCache | None = None,
) -> tuple[Run, bool, Opening | None]:
    """Terminalize a run (see the module docstring); returns ``(run,
    finished_now, opening)``: ``opening`` the calls open after its entries,
    if known. ``drafts`` are the turn's last entries, appended before every
    tool call still open in the context is closed (``tool_pairing.close_turn``)
    and its reply and turn end written; every one of them is judged by the
    pairing rule. ``openings``: what the store object remembers of the calls
    open at its sessions' heads (read only: a hint the head decides).

    Raises:
        RunNotFoundError, InvalidTransitionError (a terminal run is never
        revived or re-terminalized differently; cancel needs a cancel
        request), LeaseLostError, ToolCallPairingError (one of ``drafts``).
    """
    run = _load(tx, run_id)
    check_session_lease(run.session_id, lease)
    if run.status == status:  # a repeated terminalization after an unknown commit
        if plan is not None:
            intent_id = outbox_plans.intent_id_for(run.id)
            if fenced_epoch is None and outbox_plans.get_intent(tx, intent_id) is None:
                # about to write the plan the first one did not: a session write
                leases.fence_or_unheld(tx, session_target(run.session_id), lease)
            outbox_plans.create_plan(tx, run, plan)  # the stored plan, or a conflict
        return run, False, None
    if fenced_epoch is None:  # (recovery fenced its own lease before calling)
        # a stale holder learns it lost, whatever the run did since; without a lease,
        # nobody else may hold the session
        leases.fence_or_unheld(tx, session_target(run.session_id), lease)
    trigger = FINISH_TRIGGERS[status]
    edge = _MACHINE.decide(trigger, run.status, {"cancel_requested": run.cancel_requested})
    if edge is None:
        raise errors.InvalidTransitionError(
            "run", trigger, run.status, detail="the run has no cancel request"
        )
    moved = _move(tx, run, edge, error)
    epoch = fenced_epoch if lease is None else lease.epoch
    tx.exec(
        f"DELETE FROM active_runs WHERE {keyed('session_id', 'run_id = ?')}",
        [run.session_id, run.id],
    )
    head: tuple[str | None, int] | None = None  # the session's, once this call wrote it
    known = None if openings is None else openings.get(run.session_id)
    opening = known
    if drafts:
        chain = session_rows.append_chain(
            tx,
            run.session_id,
            drafts,
            expected_leaf=ANY_LEAF,
            lease=None,
            fenced_epoch=epoch,
            checked=True,
            known=known,
        )
        last = chain.entries[-1]
        head, opening = (last.id, last.seq + 1), chain.opening
    closed, opening = tool_pairing.close_turn(tx, moved, epoch, head, opening)
    if closed is not None:
        last = closed.entries[-1]
        head = (last.id, last.seq + 1)
    end = {"turnId": run.turn_id, "intentId": run.intent_id, "runId": run.id, "status": status}
    if stop_reason is not None:
        end["stopReason"] = stop_reason
    own = [] if assistant_message is None else [{"message": assistant_message}]
    drafts_own = [
        *(
            session_rows.own_draft(EntryKind.MESSAGE, p, run.assistant_entry_id, chosen=True)
            for p in own
        ),
        session_rows.own_draft(EntryKind.TURN_END, end, f"{run_id}:turn-end", chosen=True),
    ]
    ended = session_rows.append_chain(
        tx,
        run.session_id,
        drafts_own,
        expected_leaf=ANY_LEAF,
        lease=None,
        fenced_epoch=epoch,
        checked=True,
        head=head,
        known=opening,
    )
    end_seq = ended.entries[-1].seq
    tx.exec(
        "UPDATE conversation_turns SET status = ?, end_seq = ?, ended_at = ? WHERE id = ?",
        [status.value, end_seq, tx.now, run.turn_id],
    )
    _event(tx, moved, edge, f"{run_id}:{status.value}", {"error": error, "stopReason": stop_reason})
    if plan is not None:  # the run ended just now: it can have no plan yet
        outbox_plans.create_plan(tx, moved, plan, first=True)
    tx.notify(Topic.RUN_ENDED)
    return moved, True, ended.opening


DECISION = "decision"
"""The ``edge`` of a run event that records a decision resolution: not a
transition (source and dest are the run's status), kept in the run's history."""


def record_decisions(tx: Tx, run: Run, decisions: Sequence[Mapping[str, Any]]) -> None:
    """Append one ``decision`` run event per resolution (session seed decisionEvents),
    with ids derived from the run and the decision id so a retry writes none twice."""
    for decision in decisions:
        event_id = f"{run.id}:decision:{decision['id']}"
        if tx.one("SELECT 1 FROM run_events WHERE id = ?", [event_id]) is not None:
            continue
        edge = Edge(DECISION, "decide", run.status, run.status)
        _event(tx, run, edge, event_id, decision)


def touch(tx: Tx, run: Run) -> int | None:
    """Write the run's row unchanged but for ``updated_at`` (compare-and-set on its
    status) so that a transaction that only read the run conflicts with one that
    ends it, instead of both committing; returns the run's ``lease_epoch``.

    Raises:
        Conflict: the run moved (the caller's transaction retries).
    """
    row = tx.one(
        f"UPDATE runs SET updated_at = ? WHERE {keyed('id', 'status = ?')} RETURNING lease_epoch",
        [tx.now, run.id, run.status],
    )
    if row is None:
        raise Conflict(f"run {run.id!r} moved")
    epoch: int | None = row[0]
    return epoch


def request_cancel(tx: Tx, run_id: str) -> Run:
    """Record a cancel request on a non-terminal run (honoured by its owner or recovery).

    Raises:
        RunNotFoundError, InvalidTransitionError (the run is terminal).
    """
    run = _load(tx, run_id)
    if run.status not in NON_TERMINAL:
        raise errors.InvalidTransitionError("run", "request_cancel", run.status)
    row = tx.one(
        "UPDATE runs SET cancel_requested = TRUE, updated_at = ? "
        f"WHERE {keyed('id', 'status = ?')} RETURNING {RUN_COLS}",
        [tx.now, run_id, run.status],
    )
    if row is None:
        raise Conflict(f"run {run_id!r} moved")
    return run_row(row)


# -- the store's methods ------------------------------------------------------------


class Runs(RunReadsPart, RunRecordsPart, RunErrorsPart, RunUsagePart):
    """``store.runs``: run admission, steps, termination and cancel requests
    (here), reads and event queries (:mod:`.run_reads`), turns, intents,
    submissions and a run's event cursor (:mod:`.run_records`), error
    annotations (:mod:`.run_errors`), and usage, progress and structured
    errors (:mod:`.run_usage`)."""

    def admit(
        self,
        session_id: str,
        request: Mapping[str, Any],
        *,
        submission_key: str | None = None,
        user_message: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
        retry_of: str | None = None,
        source: str = "",
        model: str = "",
        mode: str = "",
        work_dir: str = "",
        policy: Mapping[str, Any] | None = None,
        start: bool = False,
        on_active: str = ActiveRunPolicy.REFUSE,
    ) -> Run:
        """Admit a run of ``request`` in one transaction (session seed
        CreateExecutionIntentAndSessionRunEventWithTurn); with ``start`` the run
        is started in that same transaction (``running``, as
        :meth:`runs.start` would leave it, with both events), which saves a
        turn one commit. A submission key that returns an earlier run returns
        it as stored (started or not).

        Writes the execution intent (not for a retry, which reuses its
        intent), the run (``admitted``), the turn-start entry, the user entry
        (``user_message``, a pi message dict), the conversation turn, the
        ``admit`` run event and, with ``submission_key``, the submission
        (only its sha256 digest is stored). The same key with the same
        admission (request, user message, retry target, source, model, mode,
        work dir and policy) returns the original run; with ``retry_of`` the
        run is attempt + 1 of that run's intent. Under ``lease`` (purpose
        ``admission`` or ``execution``) the run is bound to that lease's epoch
        (what ``leases.validate(lease, run_id=…)`` checks); unlike the seed's
        admission transaction the lease keeps its purpose, since its token is
        issued per purpose: ``leases.bind_run`` promotes it to ``execution``.

        ``on_active`` (beyond the seed) chooses what a session that already
        has a non-terminal run gets (:class:`~turnkeeper.ActiveRunPolicy`):
        ``"refuse"`` (default) raises SessionRunActiveError;
        ``"use_existing"`` returns that run as stored (with
        ``submission_key``, the key then names it); ``"cancel_existing"``
        ends it ``cancelled`` (stop reason ``replaced``) and admits the new
        run, in one transaction. Each is decided after the fence, so a session
        another worker holds is refused whatever the choice; it is not part
        of the admission a submission key compares.

        Raises:
            SessionRunActiveError: the session already has a non-terminal run
                (``on_active="refuse"``).
            SubmissionConflictError: the key was used for a different
                admission (any of its arguments differs).
            RetryNotAllowedError: ``retry_of`` is not the intent's latest
                attempt, or is not terminal.
            BusyError: no ``lease`` given and someone holds the session (the
                same submission key still returns its run).
            LeasePurposeError: ``lease`` is not of purpose ``admission`` or
                ``execution`` (a ``mutation`` lease never admits a run).
            ToolCallsUnansweredError: the session's replayed context has tool
                calls without results, which ``user_message`` would follow
                (answer them first; ``tool_call_ids`` names them).
            RunNotFoundError, SessionNotFoundError, LeaseLostError,
            InvalidInputError.
        On any error nothing is written.
        """
        check_id(session_id, "session_id")
        if not isinstance(request, Mapping):
            raise errors.InvalidInputError("request", "expected a mapping")
        if policy is not None and not isinstance(policy, Mapping):
            raise errors.InvalidInputError("policy", "expected a mapping (or None)")
        request_json = to_json(dict(request), "request")
        digest = None
        if submission_key is not None:
            check_id(submission_key, "submission_key")
            digest = submissions.key_digest(session_id, submission_key)
        if user_message is not None:
            validate_payload(EntryKind.MESSAGE, {"message": user_message})
            if user_message.get("role") != "user":
                raise errors.InvalidInputError(
                    "user_message.role", "the request admitted is a user message"
                )
            to_json(dict(user_message), "user_message")
        if retry_of is not None:
            check_id(retry_of, "retry_of")
        for name, value in (("source", source), ("model", model), ("mode", mode)):
            check_text(value, name)
        check_text(work_dir, "work_dir")
        intent = {
            "source": source,
            "model": model,
            "mode": mode,
            "work_dir": work_dir,
            "request": request_json,
            "policy": to_json(dict(policy or {}), "policy"),
        }
        check_session_lease(session_id, lease)
        if lease is not None and lease.purpose not in ADMITTING:
            # (the fence holds the row's purpose to the lease's)
            raise errors.LeasePurposeError(
                lease.target, lease.purpose, LeasePurpose.ADMISSION.value
            )
        # A submission is the whole admission: the same key with another user
        # message, retry target or intent field is another request.
        admitted = submissions.admission(request, user_message, retry_of, intent)

        check_bool(start, "start")
        try:
            busy = ActiveRunPolicy(on_active) if isinstance(on_active, str) else None
        except ValueError:
            busy = None
        if busy is None:
            allowed = ", ".join(p.value for p in ActiveRunPolicy)
            raise errors.InvalidInputError("on_active", f"must be one of {allowed}")
        if retry_of is not None and busy != ActiveRunPolicy.REFUSE:
            raise errors.InvalidInputError(
                "on_active", "a retry follows a terminal attempt: it never meets an active run"
            )

        known = self._openings.get(session_id)
        wrote: list[Opening | None] = []

        def body(tx: Tx) -> Run:
            run, admitted_now, opening = admit(
                tx,
                session_id,
                intent=intent,
                admission=admitted,
                key_digest=digest,
                user_message=user_message,
                lease=lease,
                retry_of=retry_of,
                start=start,
                known=known,
                on_active=busy,
            )
            wrote[:] = [opening] if admitted_now else []
            return run

        run = self._fenced("admit_run", lease, body)
        if wrote:  # committed: remember the calls open at the head it left
            self._openings.put(session_id, wrote[0])
        return run

    def _step(self, run_id: str, trigger: str, lease: Lease | None) -> Run:
        check_id(run_id, "run_id")
        if lease is not None:
            check_lease(lease)  # its target is checked against the run's session in the write
        return self._fenced(f"{trigger}_run", lease, lambda tx: step(tx, run_id, trigger, lease))

    def start(self, run_id: str, *, lease: Lease | None = None) -> Run:
        """``admitted`` → ``running``. Raises RunNotFoundError, InvalidTransitionError,
        LeaseLostError (checked before the run's state: a stale holder learns it
        lost whatever the run did since), BusyError (no ``lease`` given and
        someone holds the session)."""
        return self._step(run_id, "start", lease)

    def wait(self, run_id: str, *, lease: Lease | None = None) -> Run:
        """``running`` → ``waiting`` (for input). Raises as :meth:`runs.start`."""
        return self._step(run_id, "wait", lease)

    def resume(self, run_id: str, *, lease: Lease | None = None) -> Run:
        """``waiting`` → ``running``. Raises as :meth:`runs.start`."""
        return self._step(run_id, "resume", lease)

    def finish(
        self,
        run_id: str,
        status: str,
        *,
        assistant_message: Mapping[str, Any] | None = None,
        error: str | None = None,
        stop_reason: str | None = None,
        lease: Lease | None = None,
        delivery_plan: DeliveryPlan | None = None,
        entries: Sequence[NewEntry | tuple[str, Mapping[str, Any]]] = (),
    ) -> Run:
        """End a run in a terminal ``status`` in one transaction (session seed
        FinishSessionRunAndConversationTurn): ``entries`` (the turn's last
        entries, as :meth:`sessions.append_many` takes them: tool calls and results,
        intermediate messages), status, terminal event, assistant entry, turn
        end and, with ``delivery_plan``, the outbox intent (``<run id>:delivery``)
        and its ``pending`` operations. Before the turn closes, every tool
        call still open in the replayed context gets its result, in call
        order and in the call's shape (``storage/pairing.py``): running tool
        records of the run become ``interrupted``; a call whose own record
        completed (``storage/ops/call_records.py``: never a record of another
        call that reused its id) gets the tool's own result, unchanged, as
        :meth:`tools.complete` stored it, any other an explicit
        interrupted result. ``entries`` follow every rule of
        :meth:`sessions.append_many`; a refused one refuses the whole termination.

        Repeating the same terminal status (a retry after an unknown commit
        result) returns the stored run: the first termination is
        authoritative (its message, error and stop reason stand), and a
        ``delivery_plan`` is written only if the run has none yet, and then
        past the same fence as :meth:`outbox_plans.create_plan` (the same plan
        again writes nothing; another raises DeliveryPlanConflictError).

        Without ``lease``, nobody may hold a live lease on the session (a
        stale worker cannot end a run by leaving its lease out).

        Raises:
            InvalidTransitionError: the run is terminal in another status, or
                ``cancelled`` without a cancel request.
            ToolCallPairingError, EntryExistsError, EntryNotFoundError: one of
                ``entries`` is refused as :meth:`sessions.append_many` refuses it.
            BusyError: no ``lease`` given and someone holds the session.
            RunNotFoundError, LeaseLostError, InvalidInputError.
        """
        check_id(run_id, "run_id")
        try:
            final = RunStatus(status)
        except ValueError:
            raise errors.InvalidInputError("status", f"not a run status: {status!r}") from None
        if final not in FINISH_TRIGGERS:
            raise errors.InvalidInputError("status", f"{status!r} is not terminal")
        if assistant_message is not None:
            validate_payload(EntryKind.MESSAGE, {"message": assistant_message})
            if assistant_message.get("role") != "assistant":
                raise errors.InvalidInputError(
                    "assistant_message.role", "the run's reply is an assistant message"
                )
            to_json(dict(assistant_message), "assistant_message")
            content = assistant_message.get("content")
            if isinstance(content, list) and any(
                isinstance(b, Mapping) and b.get("type") == "toolCall" for b in content
            ):
                raise errors.InvalidInputError(
                    "assistant_message", "the final reply carries no toolCall (append calls first)"
                )
        for name, value in (("error", error), ("stop_reason", stop_reason)):
            if value is not None:
                check_text(value, name)
        check_outcome(final, error)
        if delivery_plan is not None:
            check_plan(delivery_plan)
        if lease is not None:
            check_lease(lease)  # its target is checked against the run's session in the write
        drafts = session_rows.drafts_of(entries) if entries else []

        wrote: list[Opening | None] = []

        def body(tx: Tx) -> Run:
            run, finished_now, opening = finish(
                tx,
                run_id,
                final,
                assistant_message=assistant_message,
                error=error,
                stop_reason=stop_reason,
                lease=lease,
                plan=delivery_plan,
                drafts=drafts,
                openings=self._openings,
            )
            wrote[:] = [opening] if finished_now else []
            return run

        run = self._fenced("finish_run", lease, body)
        if wrote:  # committed: remember the calls open at the head it left
            self._openings.put(run.session_id, wrote[0])
        return run

    def request_cancel(self, run_id: str) -> Run:
        """Record a cancel request on a non-terminal run; its owner or recovery
        honours it with ``runs.finish(run_id, "cancelled")``.

        Raises:
            RunNotFoundError, InvalidTransitionError (the run is terminal).
        """
        check_id(run_id, "run_id")
        return self.db.write("request_cancel", lambda tx: request_cancel(tx, run_id))
