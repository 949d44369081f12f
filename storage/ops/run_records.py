"""The records a run's admission writes beside the run, read on their own:
conversation turns, execution intents and submissions (session seed
ListConversationTurns, GetExecutionIntent, GetRuntimeSubmission), an intent's
latest run (LatestSessionRunForIntent), and one run's event cursor
(LatestSessionRunEventSeq)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.records import ConversationTurn, ExecutionIntent, Run, RuntimeSubmission

from ..backend import Tx, keyed, utc
from ..codec import check_id, from_json
from . import sealed_json, submissions
from .base import Area
from .run_reads import RUN_COLS, run_row

TURN_COLS = (
    "id, session_id, intent_id, run_id, attempt, status, start_seq, end_seq, started_at, ended_at"
)
_INTENT_COLS = (
    "id, session_id, source, model, mode, work_dir, request_fingerprint, request, policy, "
    "created_at"
)


def turn_row(row: Sequence[Any]) -> ConversationTurn:
    return ConversationTurn(
        id=row[0],
        session_id=row[1],
        intent_id=row[2],
        run_id=row[3],
        attempt=row[4],
        status=row[5],
        start_seq=row[6],
        end_seq=row[7],
        started_at=utc(row[8]),
        ended_at=None if row[9] is None else utc(row[9]),
    )


def turns(tx: Tx, session_id: str) -> list[ConversationTurn]:
    """The session's turns in transcript order (by ``start_seq``)."""
    rows = tx.rows(
        f"SELECT {TURN_COLS} FROM conversation_turns WHERE session_id = ? ORDER BY start_seq",
        [session_id],
    )
    return [turn_row(r) for r in rows]


REQUEST = "request"
"""The field name an intent's request is sealed under (``execution_intents.request``)."""


def intent(tx: Tx, intent_id: str) -> ExecutionIntent | None:
    """The intent, or ``None``; its request opened when sealed (record id:
    the intent's id).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: see ``sealed_json.open_json``.
    """
    row = tx.one(f"SELECT {_INTENT_COLS} FROM execution_intents WHERE id = ?", [intent_id])
    if row is None:
        return None
    return ExecutionIntent(
        id=row[0],
        session_id=row[1],
        source=row[2],
        model=row[3],
        mode=row[4],
        work_dir=row[5],
        request_fingerprint=row[6],
        request=sealed_json.open_json(tx, row[1], row[0], REQUEST, row[7]),
        policy=from_json(row[8]),
        created_at=utc(row[9]),
    )


def submission(tx: Tx, session_id: str, key_digest: str) -> RuntimeSubmission | None:
    """The submission row of this key digest, or ``None``."""
    row = tx.one(
        "SELECT session_id, key_digest, request_fingerprint, intent_id, run_id, created_at "
        "FROM submissions WHERE session_id = ? AND key_digest = ?",
        [session_id, key_digest],
    )
    if row is None:
        return None
    return RuntimeSubmission(
        session_id=row[0],
        key_digest=row[1],
        admission_digest=row[2],
        intent_id=row[3],
        run_id=row[4],
        created_at=utc(row[5]),
    )


def latest_for_intent(tx: Tx, session_id: str, intent_id: str) -> Run | None:
    """The run of the intent's highest attempt in the session, or ``None``."""
    row = tx.one(
        f"SELECT {RUN_COLS} FROM runs WHERE {keyed('intent_id', 'session_id = ?')} "
        "ORDER BY attempt DESC LIMIT 1",
        [intent_id, session_id],
    )
    return None if row is None else run_row(row)


def latest_event_seq(tx: Tx, run_id: str) -> int:
    """The seq of the run's last event (its session's sequence).

    Raises:
        RunNotFoundError: no such run.
    """
    row = tx.one("SELECT max(seq) FROM run_events WHERE run_id = ?", [run_id])
    if row is None or row[0] is None:
        raise errors.RunNotFoundError(run_id)
    return int(row[0])


# -- the store's methods ------------------------------------------------------------


class RunRecordsPart(Area):
    """Turns, intents, submissions, an intent's latest run and a run's event cursor."""

    def turns(self, session_id: str) -> list[ConversationTurn]:
        """The session's conversation turns in transcript order (session seed
        ListConversationTurns): a run's first turn, opened by its admission,
        and any later one ``runs.start_turn`` opened; each closed by
        ``runs.end_turn`` or the run's termination.

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        return self._inside(
            session_id, self.db.read("conversation_turns", lambda tx: turns(tx, session_id))
        )

    def intent(self, intent_id: str) -> ExecutionIntent | None:
        """The execution intent (session seed GetExecutionIntent), or ``None``;
        ``Run.intent_id`` names a run's."""
        check_id(intent_id, "intent_id")
        return self.db.read("execution_intent", lambda tx: intent(tx, intent_id))

    def submission(self, session_id: str, submission_key: str) -> RuntimeSubmission | None:
        """What ``submission_key`` admitted in the session (session seed
        GetRuntimeSubmission), or ``None`` when the key was never used there.
        The key itself is not stored: it is looked up by its digest."""
        check_id(session_id, "session_id")
        check_id(submission_key, "submission_key")
        digest = submissions.key_digest(session_id, submission_key)
        return self.db.read("runtime_submission", lambda tx: submission(tx, session_id, digest))

    def latest_for_intent(self, session_id: str, intent_id: str) -> Run | None:
        """The run of the intent's highest attempt (session seed
        LatestSessionRunForIntent), or ``None`` when the session has no run of
        that intent: the run a retry must follow (``runs.admit(retry_of=…)``
        refuses any other, in its own transaction, with RetryNotAllowedError).

        Raises:
            SessionNotFoundError: no such session.
        """
        check_id(session_id, "session_id")
        check_id(intent_id, "intent_id")
        return self._inside(
            session_id,
            self.db.read(
                "latest_run_for_intent", lambda tx: latest_for_intent(tx, session_id, intent_id)
            ),
        )

    def latest_event_seq(self, run_id: str) -> int:
        """The seq of the run's last event (session seed LatestSessionRunEventSeq):
        a reconnecting client's cursor for ``runs.events(session_id, after=…)``.
        Every run has at least its ``admit`` event.

        Raises:
            RunNotFoundError: no such run.
        """
        check_id(run_id, "run_id")
        return self.db.read("run_event_seq", lambda tx: latest_event_seq(tx, run_id))
