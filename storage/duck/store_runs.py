"""Execution intents, runs and run events of the DuckDB store (session seed runs)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from turnkeeper.spec import errors
from turnkeeper.spec.delivery import DeliveryPlan
from turnkeeper.spec.entries import EntryKind, validate_payload
from turnkeeper.spec.records import (
    Lease,
    ResponseState,
    Run,
    RunEvent,
)
from turnkeeper.spec.run import FINISH_TRIGGERS, RunStatus

from ..codec import check_id, check_text, to_json
from ..validate import (
    check_bool,
    check_int,
    check_lease,
    check_limit,
    check_plan,
    check_session_lease,
)
from . import lineage, runs
from .db import Tx
from .store_base import StoreBase


class RunsMixin(StoreBase):
    """Run admission, steps, termination, cancel requests and event queries."""

    def admit_run(
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
    ) -> Run:
        """Admit a run of ``request`` in one transaction (session seed
        CreateExecutionIntentAndSessionRunEventWithTurn).

        Writes the execution intent (not for a retry, which reuses its
        intent), the run (``admitted``), the turn-start entry, the user entry
        (``user_message``, a pi message dict), the conversation turn, the
        ``admit`` run event and, with ``submission_key``, the submission
        (only its sha256 digest is stored). The same key with the same
        admission (request, user message, retry target, source, model, mode,
        work dir and policy) returns the original run; with ``retry_of`` the
        run is attempt + 1 of that run's intent.

        Raises:
            SessionRunActiveError: the session already has a non-terminal run.
            SubmissionConflictError: the key was used for a different
                admission (any of its arguments differs).
            RetryNotAllowedError: ``retry_of`` is not the intent's latest
                attempt, or is not terminal.
            BusyError: no ``lease`` given and someone holds the session (the
                same submission key still returns its run).
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
        fingerprint = hashlib.sha256(
            orjson.dumps(dict(request), option=orjson.OPT_SORT_KEYS)
        ).hexdigest()
        digest = None
        if submission_key is not None:
            check_text(submission_key, "submission_key", allow_empty=False)
            digest = hashlib.sha256(f"{session_id}\x00{submission_key}".encode()).hexdigest()
        if user_message is not None:
            validate_payload(EntryKind.MESSAGE, {"message": user_message})
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
        # A submission is the whole admission: the same key with another user
        # message, retry target or intent field is another request.
        admission = hashlib.sha256(
            orjson.dumps(
                {
                    "request": dict(request),
                    "user_message": None if user_message is None else dict(user_message),
                    "retry_of": retry_of,
                    **{k: v for k, v in intent.items() if k != "request"},
                },
                option=orjson.OPT_SORT_KEYS,
            )
        ).hexdigest()

        def body(tx: Tx) -> Run:
            run, _ = runs.admit(
                tx,
                session_id,
                intent=intent,
                fingerprint=fingerprint,
                admission=admission,
                key_digest=digest,
                user_message=user_message,
                lease=lease,
                retry_of=retry_of,
            )
            return run

        return self._fenced("admit_run", lease, body)

    def _step(self, run_id: str, trigger: str, lease: Lease | None) -> Run:
        check_id(run_id, "run_id")
        if lease is not None:
            check_lease(lease)
            run = self.get_run(run_id)
            if run is not None:
                check_session_lease(run.session_id, lease)
        return self._fenced(
            f"{trigger}_run", lease, lambda tx: runs.step(tx, run_id, trigger, lease)
        )

    def start_run(self, run_id: str, *, lease: Lease | None = None) -> Run:
        """``admitted`` → ``running``. Raises RunNotFoundError, InvalidTransitionError,
        LeaseLostError (checked before the run's state: a stale holder learns it
        lost whatever the run did since), BusyError (no ``lease`` given and
        someone holds the session)."""
        return self._step(run_id, "start", lease)

    def wait_run(self, run_id: str, *, lease: Lease | None = None) -> Run:
        """``running`` → ``waiting`` (for input). Raises as :meth:`start_run`."""
        return self._step(run_id, "wait", lease)

    def resume_run(self, run_id: str, *, lease: Lease | None = None) -> Run:
        """``waiting`` → ``running``. Raises as :meth:`start_run`."""
        return self._step(run_id, "resume", lease)

    def finish_run(
        self,
        run_id: str,
        status: str,
        *,
        assistant_message: Mapping[str, Any] | None = None,
        error: str | None = None,
        stop_reason: str | None = None,
        lease: Lease | None = None,
        delivery_plan: DeliveryPlan | None = None,
    ) -> Run:
        """End a run in a terminal ``status`` in one transaction (session seed
        FinishSessionRunAndConversationTurn): status, terminal event, assistant
        entry, turn end and, with ``delivery_plan``, the outbox intent
        (``<run id>:delivery``) and its ``pending`` operations. Before the turn
        closes, every tool call in it is paired: running tool records of the
        run become ``interrupted`` and each ``toolCall`` without a result gets
        an explicit interrupted ``toolResult``.

        Repeating the same terminal status (a retry after an unknown commit
        result) returns the stored run: the first termination is
        authoritative (its message, error and stop reason stand), and a
        ``delivery_plan`` is written only if the run has none yet (the same
        plan again writes nothing; another raises DeliveryPlanConflictError).

        Without ``lease``, nobody may hold a live lease on the session (a
        stale worker cannot end a run by leaving its lease out).

        Raises:
            InvalidTransitionError: the run is terminal in another status, or
                ``cancelled`` without a cancel request.
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
        if delivery_plan is not None:
            check_plan(delivery_plan)
        if lease is not None:
            check_lease(lease)
            run = self.get_run(run_id)
            if run is not None:
                check_session_lease(run.session_id, lease)

        def body(tx: Tx) -> Run:
            run, _ = runs.finish(
                tx,
                run_id,
                final,
                assistant_message=assistant_message,
                error=error,
                stop_reason=stop_reason,
                lease=lease,
                plan=delivery_plan,
            )
            return run

        return self._fenced("finish_run", lease, body)

    def request_cancel(self, run_id: str) -> Run:
        """Record a cancel request on a non-terminal run; its owner or recovery
        honours it with ``finish_run(run_id, "cancelled")``.

        Raises:
            RunNotFoundError, InvalidTransitionError (the run is terminal).
        """
        check_id(run_id, "run_id")
        return self.db.write("request_cancel", lambda tx: runs.request_cancel(tx, run_id))

    def get_run(self, run_id: str) -> Run | None:
        """The run, or ``None``."""
        check_id(run_id, "run_id")
        return self.db.read("get_run", lambda tx: runs.get(tx, run_id))

    def active_run(self, session_id: str) -> Run | None:
        """The session's non-terminal run, or ``None`` when it has none.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(
            session_id, self.db.read("active_run", lambda tx: runs.active(tx, session_id))
        )

    def session_runs(self, session_id: str) -> list[Run]:
        """Every run of the session, oldest first.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(
            session_id, self.db.read("session_runs", lambda tx: runs.session_runs(tx, session_id))
        )

    def run_events(
        self,
        session_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        latest: bool = False,
        limit: int = 100,
    ) -> list[RunEvent]:
        """The session's run events in sequence order (session seed
        ListSessionRunEventsAfter/Before/Latest): ``after`` a cursor (a
        reconnecting client asks for what it missed), ``before`` one, or the
        ``latest`` ``limit`` events.

        Raises:
            InvalidInputError: a cursor that is not an integer, or a bad limit.
        """
        check_id(session_id, "session_id")
        for name, cursor in (("after", after), ("before", before)):
            if cursor is not None:
                check_int(cursor, name, 0)
        check_bool(latest, "latest")
        check_limit(limit)
        return self._inside(
            session_id,
            self.db.read(
                "run_events", lambda tx: runs.events(tx, session_id, after, before, latest, limit)
            ),
        )

    # -- response lineage --------------------------------------------------------

    def get_response_state(self, session_id: str) -> ResponseState | None:
        """The session's remote response lineage, or ``None`` (use the default mode)."""
        check_id(session_id, "session_id")
        return self.db.read("get_response_state", lambda tx: lineage.get(tx, session_id))

    def compare_and_swap_response_state(
        self, state: ResponseState, expected_version: int, *, lease: Lease | None = None
    ) -> bool:
        """Advance the session's lineage only if its version is still
        ``expected_version`` (``0``: none yet); returns whether it did (session
        seed CompareAndSwapResponseSessionState). Two concurrent turns that read
        the same version cannot both swap, so a ``previous_response_id`` chain
        never branches silently. A session write: under the session's
        ``lease``, or while nobody holds it.

        Raises:
            SessionNotFoundError, InvalidInputError.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        """
        if not isinstance(state, ResponseState):
            raise errors.InvalidInputError("state", "expected a ResponseState")
        check_id(state.session_id, "session_id")
        for name in (
            "state_mode",
            "previous_response_id",
            "conversation_id",
            "provider",
            "api",
            "model",
        ):
            check_text(getattr(state, name), name)
        check_int(expected_version, "expected_version", 0)
        check_session_lease(state.session_id, lease)
        return self._fenced(
            "compare_and_swap_response_state",
            lease,
            lambda tx: lineage.swap(tx, state, expected_version, lease),
        )
