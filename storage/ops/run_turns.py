"""Conversation turns on their own (session seed StartConversationTurn,
EndConversationTurn and their ``Manager`` forms).

A run's admission opens its first turn (``<run id>:turn``) and its end closes
the turn still open. In between, a runtime may end a turn itself
(``runs.end_turn``: the agent reached the turn's boundary before the run
ended, e.g. it waits for input) and open the run's next one
(``runs.start_turn``). Each writes its transcript entry (``turn_start`` /
``turn_end``, ids ``<turn id>-start`` / ``<turn id>-end``) and the turn's
boundary row (``conversation_turns``) in one transaction, as a session write.

A session has at most one open turn, and only a run that has not ended has
one: a turn starts once the one before it ended, and ``runs.finish`` closes
the run's open turn, if any (a turn its runtime already ended is left as it
is, as the seed's FinishSessionRunAndConversationTurn tolerates it).
"""

from __future__ import annotations

from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import ANY_LEAF, ConversationTurn, Lease
from turnkeeper.spec.run import TERMINAL, TURN_END_STATUSES, TURN_OPEN

from ..backend import Tx, present
from ..codec import MAX_ID_BYTES, check_id, check_text
from ..pairing import Opening
from ..validate import check_lease, check_session_lease
from . import leases, session_rows, tool_pairing
from .base import Area
from .run_reads import get
from .run_records import TURN_COLS, turn_row

START = "-start"
"""The suffix of a turn's ``turn_start`` entry id (``<run id>:turn-start`` for
a run's first turn, as admission writes it)."""

END = "-end"
"""The suffix of a turn's ``turn_end`` entry id."""


def stored(tx: Tx, turn_id: str) -> ConversationTurn | None:
    """The turn, or ``None``."""
    row = tx.one(f"SELECT {TURN_COLS} FROM conversation_turns WHERE id = ?", [turn_id])
    return None if row is None else turn_row(row)


def open_turn(tx: Tx, session_id: str) -> str | None:
    """The id of the session's open turn, or ``None``."""
    row = tx.one(
        "SELECT id FROM conversation_turns WHERE session_id = ? AND end_seq IS NULL LIMIT 1",
        [session_id],
    )
    return None if row is None else str(row[0])


def start_turn(
    tx: Tx, run_id: str, turn_id: str, lease: Lease | None, known: Opening | None
) -> tuple[ConversationTurn, bool, Opening | None]:
    """Open turn ``turn_id`` of run ``run_id`` (see the module docstring);
    returns ``(turn, written_now, opening)``: ``opening`` the calls open
    after its entry, if known.

    Raises:
        RunNotFoundError, LeaseLostError, BusyError, ConversationTurnExistsError,
        InvalidTransitionError (the run ended), ConversationTurnOpenError,
        EntryExistsError (the entry id ``<turn id>-start`` is taken).
    """
    run = get(tx, run_id)
    if run is None:
        raise errors.RunNotFoundError(run_id)
    sid = run.session_id
    check_session_lease(sid, lease)
    # a stale holder learns it lost, whatever the turn did since; without a
    # lease, nobody may hold the session
    leases.fence_or_unheld(tx, session_target(sid), lease)
    found = stored(tx, turn_id)
    if found is not None:
        if found.run_id == run_id and found.status == TURN_OPEN:
            return found, False, None  # a retry after an unknown commit result
        raise errors.ConversationTurnExistsError(turn_id, found.session_id)
    if run.status in TERMINAL:
        raise errors.InvalidTransitionError(
            "run", "start_turn", run.status, detail="a turn belongs to a run that has not ended"
        )
    other = open_turn(tx, sid)
    if other is not None:
        raise errors.ConversationTurnOpenError(sid, other)
    payload: dict[str, Any] = {
        "turnId": turn_id,
        "intentId": run.intent_id,
        "runId": run.id,
        "attempt": run.attempt,
    }
    chain = session_rows.append_chain(
        tx,
        sid,
        [session_rows.own_draft(EntryKind.TURN_START, payload, turn_id + START, chosen=True)],
        expected_leaf=ANY_LEAF,
        lease=None,
        fenced_epoch=None if lease is None else lease.epoch,
        checked=True,
        known=known,
    )
    seq = chain.entries[0].seq
    tx.exec(
        "INSERT INTO conversation_turns VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, NULL)",
        [turn_id, sid, run.intent_id, run.id, run.attempt, TURN_OPEN, seq, tx.now],
    )
    return present(stored(tx, turn_id), "the turn written just now"), True, chain.opening


def end_turn(
    tx: Tx,
    turn_id: str,
    status: str,
    stop_reason: str | None,
    lease: Lease | None,
    known: Opening | None,
) -> tuple[ConversationTurn, bool, Opening | None]:
    """Close the open turn ``turn_id`` in ``status`` (see the module docstring);
    returns ``(turn, written_now, opening)`` as :func:`start_turn`. The same
    ``status`` again (a retry after an unknown commit result) returns the
    stored turn.

    Raises:
        ConversationTurnNotOpenError, LeaseLostError, BusyError,
        ToolCallsUnansweredError (a call of the turn has no result yet),
        EntryExistsError (the entry id ``<turn id>-end`` is taken).
    """
    turn = stored(tx, turn_id)
    if turn is None:
        raise errors.ConversationTurnNotOpenError(turn_id, None, None)
    sid = turn.session_id
    check_session_lease(sid, lease)
    leases.fence_or_unheld(tx, session_target(sid), lease)
    if turn.status != TURN_OPEN:
        if turn.status == status:
            return turn, False, None
        raise errors.ConversationTurnNotOpenError(turn_id, sid, turn.status)
    head = present(tx.one(session_rows.HEAD_READ, [sid]), "the session of a turn")
    leaf, next_seq = head[0], head[1]
    opening = tool_pairing.open_at_head(tx, sid, (leaf, next_seq), known)
    if opening.calls and not opening.optional:
        raise errors.ToolCallsUnansweredError(
            sid,
            turn_id + END,
            [c.id for c in opening.calls],
            detail="answer them, then end the turn",
        )
    end: dict[str, str] = {
        "turnId": turn_id,
        "intentId": turn.intent_id,
        "runId": turn.run_id,
        "status": status,
    }
    if stop_reason is not None:
        end["stopReason"] = stop_reason
    chain = session_rows.append_chain(
        tx,
        sid,
        [session_rows.own_draft(EntryKind.TURN_END, end, turn_id + END, chosen=True)],
        expected_leaf=ANY_LEAF,
        lease=None,
        fenced_epoch=None if lease is None else lease.epoch,
        checked=True,
        head=head,
        known=opening,
    )
    tx.exec(
        "UPDATE conversation_turns SET status = ?, end_seq = ?, ended_at = ? WHERE id = ?",
        [status, chain.entries[0].seq, tx.now, turn_id],
    )
    return present(stored(tx, turn_id), "the turn written just now"), True, chain.opening


# -- the store's methods ------------------------------------------------------------


class TurnsPart(Area):
    """Start and end conversation turns."""

    def start_turn(
        self, run_id: str, turn_id: str, *, lease: Lease | None = None
    ) -> ConversationTurn:
        """Open conversation turn ``turn_id`` of run ``run_id`` (session seed
        StartConversationTurn, Manager.StartConversationTurn): writes its
        ``turn_start`` entry (id ``<turn_id>-start``; payload ``turnId``,
        ``intentId``, ``runId``, ``attempt``) and its boundary row (status
        ``open``, ``start_seq`` that entry's seq) in one transaction. Its
        intent and attempt are the run's. A run's admission opens its first
        turn (``Run.turn_id``) itself; this opens a later one, once the one
        before it ended (:meth:`runs.end_turn`). The same call again, while
        the turn is open, returns it as stored (a retry after an unknown
        commit result writes nothing twice).

        A session write: under the session's ``lease`` (fenced in the
        write's transaction) or while nobody holds a live lease on it.

        Raises:
            RunNotFoundError: no such run.
            InvalidTransitionError: the run has ended.
            ConversationTurnOpenError: the session has an open turn
                (``turn_id`` names it).
            ConversationTurnExistsError: ``turn_id`` names another turn.
            EntryExistsError: the session has an entry ``<turn_id>-start``.
            BusyError: no ``lease`` given and someone holds the session.
            LeaseLostError, InvalidInputError.
        On any error nothing is written.
        """
        check_id(run_id, "run_id")
        check_id(turn_id, "turn_id", max_bytes=MAX_ID_BYTES - len(START))
        if lease is not None:
            check_lease(lease)  # its target is checked against the run's session in the write
        wrote: list[tuple[str, Opening | None]] = []

        def body(tx: Tx) -> ConversationTurn:
            known = None
            run = get(tx, run_id)
            if run is not None:
                known = self._openings.get(run.session_id)
            turn, written, opening = start_turn(tx, run_id, turn_id, lease, known)
            wrote[:] = [(turn.session_id, opening)] if written else []
            return turn

        turn = self._fenced("start_turn", lease, body)
        if wrote:  # committed: remember the calls open at the head it left
            self._openings.put(*wrote[0])
        return turn

    def end_turn(
        self,
        turn_id: str,
        status: str,
        *,
        stop_reason: str | None = None,
        lease: Lease | None = None,
    ) -> ConversationTurn:
        """End the open conversation turn ``turn_id`` in ``status`` (session
        seed EndConversationTurn, Manager.EndConversationTurn): writes its
        ``turn_end`` entry (id ``<turn_id>-end``; payload ``turnId``,
        ``intentId``, ``runId``, ``status`` and, if given, ``stopReason``) and
        closes its boundary row (``end_seq`` that entry's seq) in one
        transaction. ``status`` is one of
        :data:`~turnkeeper.spec.run.TURN_END_STATUSES` (a run's terminal
        statuses and ``incomplete``; only a ``succeeded`` turn is a fork
        boundary). The run goes on: :meth:`runs.finish` later closes only a
        turn still open. The same ``status`` again for a turn that ended in
        it returns the stored turn (a retry after an unknown commit result).

        Every tool call of the turn must have its result first: a turn ends
        with none unanswered (an incomplete reply's calls need none).

        A session write: under the session's ``lease`` (fenced in the
        write's transaction) or while nobody holds a live lease on it.

        Raises:
            ConversationTurnNotOpenError: no turn has this id (``status``
                ``None``), or it ended in another status.
            ToolCallsUnansweredError: calls in the replayed context have no
                result yet (``tool_call_ids`` names them).
            EntryExistsError: the session has an entry ``<turn_id>-end``.
            BusyError: no ``lease`` given and someone holds the session.
            LeaseLostError, InvalidInputError (a status not in
            ``TURN_END_STATUSES``, a bad id or stop reason).
        On any error nothing is written.
        """
        check_id(turn_id, "turn_id")
        if not isinstance(status, str) or status not in TURN_END_STATUSES:
            allowed = ", ".join(sorted(TURN_END_STATUSES))
            raise errors.InvalidInputError("status", f"a turn ends in one of {allowed}")
        if stop_reason is not None:
            check_text(stop_reason, "stop_reason")
        if lease is not None:
            check_lease(lease)  # its target is checked against the turn's session in the write
        wrote: list[tuple[str, Opening | None]] = []

        def body(tx: Tx) -> ConversationTurn:
            found = stored(tx, turn_id)
            known = None if found is None else self._openings.get(found.session_id)
            turn, written, opening = end_turn(tx, turn_id, status, stop_reason, lease, known)
            wrote[:] = [(turn.session_id, opening)] if written else []
            return turn

        turn = self._fenced("end_turn", lease, body)
        if wrote:  # committed: remember the calls open at the head it left
            self._openings.put(*wrote[0])
        return turn
