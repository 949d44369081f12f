"""Run admission (session seed CreateExecutionIntentAndSessionRunEventWithTurn).

Admission is one transaction: the submission digest check, the lease fence,
the one-active-run check, the intent (for a first attempt), the run, the
``active_runs`` row, the turn-start and user entries, the conversation turn,
the ``admit`` run event and the submission row.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import uuid6

from turnkeeper.machines import machine_for
from turnkeeper.spec import RUN, errors
from turnkeeper.spec.entries import EntryKind, validate_payload
from turnkeeper.spec.lease import LeasePurpose, session_target
from turnkeeper.spec.lifecycle import Edge
from turnkeeper.spec.records import (
    ANY_LEAF,
    InputResourceEvent,
    Lease,
    Run,
)
from turnkeeper.spec.run import (
    TERMINAL,
    ActiveRunPolicy,
    RunStatus,
)

from ..backend import Tx, keyed, present, utc
from ..codec import check_id, check_text, to_json
from ..pairing import Opening
from ..validate import check_bool, check_list, check_session_lease
from . import (
    leases,
    resources,
    run_intents,
    run_lifecycle,
    sealed_json,
    session_rows,
    submissions,
)
from .base import Area
from .run_reads import RUN_BASE_COLS, get
from .run_records import REQUEST

_MACHINE = machine_for(RUN)

ADMITTING = frozenset({LeasePurpose.ADMISSION, LeasePurpose.EXECUTION})
"""Lease purposes that may admit a run: an admission lease (seed
AcquireExecutionAdmission) or an execution lease; never a ``mutation``,
``fork`` or ``recovery`` one."""


_HEAD_AND_ACTIVE = (
    "SELECT s.leaf_id, s.next_seq, s.key_version, a.run_id FROM sessions AS s "
    "LEFT JOIN active_runs AS a ON a.session_id = s.id WHERE s.id = ?"
)
"""A session's head (leaf, next seq, data key version) and its active run (``NULL``: none)."""


def _head(
    tx: Tx,
    session_id: str,
    key_digest: str | None,
    admission: submissions.Admission,
    lease: Lease | None,
) -> tuple[tuple[Any, ...], tuple[Any, ...] | None, Run | None]:
    """The session's head, its active run (``(run_id,)`` or ``None``), past
    the fence; or, when ``key_digest``'s submission was admitted before, its
    run (third), with neither fenced. Without a key and with a lease the
    reads and the fence are one statement (``leases.fenced_read``).

    Raises:
        SessionNotFoundError, SubmissionConflictError, LeaseLostError, BusyError.
    """
    if key_digest is None and lease is not None:
        row, fence = leases.fenced_read(tx, lease, _HEAD_AND_ACTIVE, [session_id])
        if row is None:
            raise errors.SessionNotFoundError(session_id)
        leases.fenced(tx, lease, fence)
        return row[:3], None if row[3] is None else row[3:], None
    head = tx.one(session_rows.HEAD_READ, [session_id])
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
            return head, None, present(get(tx, sub[0]), "the run its submission names")
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    current = tx.one("SELECT run_id FROM active_runs WHERE session_id = ?", [session_id])
    return head, current, None


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
    start: bool,
    known: Opening | None,
    on_active: ActiveRunPolicy,
    resource_events: Sequence[tuple[InputResourceEvent, str | None]],
    saved_intent: str | None,
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
    (:class:`ActiveRunPolicy`), decided after the fence. ``resource_events``:
    input resource events (checked, with their data as JSON text) written for
    the new run (its id as their ``run_id``) in this transaction.
    ``saved_intent``: the id of a saved intent (``runs.save_intent``) the
    run is the first attempt of, instead of a new intent.

    Raises:
        SessionNotFoundError, SubmissionConflictError, SessionRunActiveError,
        RunNotFoundError, RetryNotAllowedError, LeaseLostError,
        ToolCallsUnansweredError, ResourceEventConflictError,
        ExecutionIntentNotFoundError.
    """
    head, current, found = _head(tx, session_id, key_digest, admission, lease)
    if found is not None:  # the submission's run, admitted before
        return found, False, None
    if current is not None and on_active == ActiveRunPolicy.USE_EXISTING:
        found = present(get(tx, current[0]), "the session's active run")
        if key_digest is not None:  # the key now names that run
            tx.exec(
                "INSERT INTO submissions VALUES (?, ?, ?, ?, ?, ?)",
                [session_id, key_digest, admission.digest, found.intent_id, found.id, tx.now],
            )
        return found, False, None
    if current is not None and on_active == ActiveRunPolicy.CANCEL_EXISTING:
        run_lifecycle.request_cancel(tx, current[0])
        _, _, known = run_lifecycle.finish(
            tx,
            current[0],
            RunStatus.CANCELLED,
            assistant_message=None,
            error=None,
            stop_reason="replaced",
            lease=lease,
        )
        head = present(
            tx.one(session_rows.HEAD_READ, [session_id]),
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
    if saved_intent is not None:
        run_intents.check_saved(tx, saved_intent, session_id, intent)
        intent_id = saved_intent
    now = tx.now
    run_id = str(uuid6.uuid7())
    # The writes of the run, its intent and the session's active run are held
    # (``Tx.later``): none reads another's rows (the run's model is the new
    # intent's, given as a value), so a server sends them as one statement.
    fresh = intent_id is None
    model = "?" if fresh else "(SELECT model FROM execution_intents WHERE id = ?)"
    if intent_id is None:
        intent_id = str(uuid6.uuid7())
        tx.later(
            "INSERT INTO execution_intents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                intent_id,
                session_id,
                intent["source"],
                intent["model"],
                intent["mode"],
                intent["work_dir"],
                admission.fingerprint,
                # sealed under the head's key version, named in its compare-and-set below
                sealed_json.seal_one(
                    tx, session_id, intent_id, REQUEST, intent["request"], head[2]
                ),
                intent["policy"],
                now,
            ],
        )
    status = (RunStatus.RUNNING if start else RunStatus.ADMITTED).value
    tx.later(
        f"INSERT INTO runs ({RUN_BASE_COLS}, lease_epoch, model) "
        f"VALUES (?, ?, ?, ?, ?, ?, FALSE, NULL, ?, ?, NULL, ?, {model})",
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
            intent["model"] if fresh else intent_id,
        ],
    )
    tx.later("INSERT INTO active_runs VALUES (?, ?)", [session_id, run_id])
    turn = {"turnId": f"{run_id}:turn", "intentId": intent_id, "runId": run_id, "attempt": attempt}
    epoch = None if lease is None else lease.epoch
    # The entry ids derive from a run id made just now: no existence check is needed.
    drafts = [session_rows.own_draft(EntryKind.TURN_START, turn, f"{run_id}:turn-start")]
    if user_message is not None:
        message = {"message": user_message}
        drafts.append(session_rows.own_draft(EntryKind.MESSAGE, message, f"{run_id}:user"))
    events: list[tuple[Edge, str, Mapping[str, Any]]] = [
        (RUN.edge("admit"), f"{run_id}:admitted", {"attempt": attempt})
    ]
    if start:
        events.append((RUN.edge("start"), f"{run_id}:start:{secrets.token_hex(4)}", {}))
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
    chain = session_rows.append_chain(
        tx,
        session_id,
        drafts,
        expected_leaf=ANY_LEAF,
        lease=None,
        fenced_epoch=epoch,
        checked=True,
        head=head,  # nothing above moved the leaf, the seq or the key version
        known=known,
        new_events=(run, events),  # their seqs taken by the same update of the session
        hold=True,  # with the writes above (none writes the session, entries or events)
    )
    written = chain.entries
    tx.later(
        "INSERT INTO conversation_turns VALUES (?, ?, ?, ?, ?, 'open', ?, NULL, ?, NULL)",
        [f"{run_id}:turn", session_id, intent_id, run_id, attempt, written[0].seq, now],
    )
    for event, data in resource_events:  # session seed AppendInputResourceEventTx
        resources.write(tx, replace(event, run_id=run_id), data, head[2])
    if key_digest is not None:
        tx.exec(
            "INSERT INTO submissions VALUES (?, ?, ?, ?, ?, ?)",
            [session_id, key_digest, admission.digest, intent_id, run_id, now],
        )
    return run, True, chain.opening


# -- the store's methods ------------------------------------------------------------


class AdmissionPart(Area):
    """Admit a run."""

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
        resource_events: Sequence[InputResourceEvent] = (),
        intent_id: str | None = None,
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

        ``intent_id`` names an intent saved with :meth:`runs.save_intent`
        (session seed SaveExecutionIntent, then CreateSessionRun): the run is
        its first attempt, and no new intent is written. ``request``,
        ``source``, ``model``, ``mode``, ``work_dir`` and ``policy`` must be
        the intent's. Not with ``retry_of`` (a retry's intent is its run's).

        ``resource_events`` (session seed AppendInputResourceEventTx: an input
        resource event in the admission's own transaction) are
        :class:`~turnkeeper.InputResourceEvent` rows of the input resources
        the runtime prepared for the run, written for the admitted run in its
        transaction, as ``resources.record_event`` writes one: each event's
        ``session_id`` is ``session_id`` and its ``run_id`` left empty (the
        run's id fills it); an empty ``id`` gets a new UUIDv7. So a run is
        never admitted without its resources' events, nor are they written
        for a run that was not. A submission key that returns an earlier run,
        and ``"use_existing"``, write none (the admission that admitted the
        run wrote its own); they are not part of the admission a submission
        key compares.

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
            ResourceEventConflictError: a resource event's id names a
                different event.
            ExecutionIntentNotFoundError: ``intent_id`` names no intent of the
                session.
            RetryNotAllowedError: also when the ``intent_id`` intent already
                has a run (retry its latest attempt instead).
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

        if intent_id is not None:
            check_id(intent_id, "intent_id")
            if retry_of is not None:
                raise errors.InvalidInputError(
                    "intent_id", "a retry's intent is its run's: give retry_of or intent_id"
                )
        prepared: list[tuple[InputResourceEvent, str | None]] = []
        for event in check_list(resource_events, "resource_events", "InputResourceEvent"):
            given, data = resources.checked(event)
            if given.session_id != session_id:
                raise errors.InvalidInputError(
                    "resource_events", f"an event of session {given.session_id!r}"
                )
            if given.run_id:
                raise errors.InvalidInputError(
                    "resource_events", "leave run_id empty: the admitted run's id fills it"
                )
            prepared.append((given, data))
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
                resource_events=prepared,
                saved_intent=intent_id,
            )
            wrote[:] = [opening] if admitted_now else []
            return run

        run = self._fenced("admit_run", lease, body)
        if wrote:  # committed: remember the calls open at the head it left
            self._openings.put(session_id, wrote[0])
        return run
