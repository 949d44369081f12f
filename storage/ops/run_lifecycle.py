"""A run's steps, termination and cancel requests (session seed
FinishSessionRunAndConversationTurn).

Termination is one transaction: the status compare-and-set, the
``active_runs`` delete, the assistant and turn-end entries, the turn row and
the terminal event. Entry and event ids derive from the run id, so repeating a
terminalization whose commit result was unknown returns the stored run and
writes nothing twice.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from turnkeeper.machines import machine_for
from turnkeeper.spec import RUN, errors
from turnkeeper.spec.delivery import DeliveryPlan
from turnkeeper.spec.entries import EntryKind, validate_payload
from turnkeeper.spec.lease import session_target
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
    TURN_OPEN,
    RunStatus,
)

from ..backend import Conflict, Dialect, Tx, keyed, utc
from ..codec import check_id, check_text, to_json
from ..crypto.keyring import UNREAD
from ..pairing import Opening
from ..validate import (
    check_lease,
    check_plan,
    check_session_lease,
)
from ..wakeups import Topic
from . import leases, outbox_plans, run_events, run_turns, session_rows, tool_pairing
from .base import Area
from .pairing_checks import OpeningCache
from .run_events import DECISION
from .run_reads import RUN_COLS, get, run_row

_MACHINE = machine_for(RUN)


def check_outcome(status: RunStatus, error: str | None) -> None:
    """A run that succeeded carries no error: its outcome is final and says so.

    Raises:
        InvalidInputError: ``error`` given with ``succeeded``.
    """
    if status == RunStatus.SUCCEEDED and error is not None:
        raise errors.InvalidInputError("error", "a run that succeeded carries no error")


_TURN_STATUS = "SELECT status FROM conversation_turns WHERE id = ?"


@cache
def _run_head_turn_sql(dialect: Dialect) -> str:
    """A run, its session's head, the status of its first turn (``<run id>:turn``),
    whether any tool record names the run or that turn, whether an entry (of
    any session) has the id of the run's reply or of that turn's end
    (``Dialect.any_row``), and the session's data key version."""
    return (
        f"SELECT {', '.join('r.' + c.strip() for c in RUN_COLS.split(','))}, "
        "s.leaf_id, s.next_seq, t.status, "
        "EXISTS (SELECT 1 FROM tool_executions AS x WHERE x.run_id = ?) "
        "OR EXISTS (SELECT 1 FROM tool_executions AS x WHERE x.local_turn_id = ?), "
        f"{dialect.any_row('entries AS e', 'e.id', 2)}, s.key_version "
        "FROM runs AS r LEFT JOIN sessions AS s ON s.id = r.session_id "
        "LEFT JOIN conversation_turns AS t ON t.id = ? WHERE r.id = ?"
    )


def _run_head_turn(run_id: str) -> list[str]:
    """The values of :func:`_run_head_turn_sql` for ``run_id``."""
    turn = f"{run_id}:turn"
    return [run_id, turn, f"{run_id}:assistant", turn + run_turns.END, turn, run_id]


def _own_ids(run: Run) -> frozenset[str]:
    """The ids of the run's reply and of its first turn's end (read above as absent)."""
    return frozenset({run.assistant_entry_id, run.turn_id + run_turns.END})


def _closed(opening: Opening | None, head: tuple[Any, ...]) -> bool:
    """Whether ``opening`` is known at ``head`` (leaf, next seq, …) with no call open there."""
    return (
        opening is not None
        and (opening.leaf_id, opening.next_seq) == head[:2]
        and not opening.calls
    )


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
    tx.later(  # held: a server sends it with the writes after it (a moved row: Conflict)
        f"UPDATE runs SET status = ?, updated_at = ?, {done}error = coalesce(?, error) "
        f"WHERE {keyed('id', 'status = ?')}",
        params,
        changes=1,
    )
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
    run_events.append_event(tx, moved, edge, f"{run_id}:{trigger}:{secrets.token_hex(4)}", {})
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
    fence: tuple[Any, ...] | None = None
    read: tuple[Any, ...] | None = None  # the session's head and the first turn's status
    if lease is not None and fenced_epoch is None:  # the reads and the fence as one
        row, fence = leases.fenced_read(
            tx, lease, _run_head_turn_sql(tx.dialect), _run_head_turn(run_id)
        )
        if row is None:
            raise errors.RunNotFoundError(run_id)
        run, read = run_row(row), row[-6:]
    else:
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
    if fence is not None and lease is not None:  # a stale holder learns it lost
        leases.fenced(tx, lease, fence)
    elif fenced_epoch is None:  # (recovery fenced its own lease before calling)
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
    tx.later(
        f"DELETE FROM active_runs WHERE {keyed('session_id', 'run_id = ?')}",
        [run.session_id, run.id],
    )
    # the session's head: as read above (nothing wrote the session since), or as
    # this call wrote it
    head: tuple[Any, ...] | None = (
        None if read is None or read[1] is None else (read[0], read[1], read[5])
    )
    known = None if openings is None else openings.get(run.session_id)
    opening = known
    # ``drafts`` are written with the reply and the turn end as one chain when
    # no call is open after them (nothing for close_turn to append between):
    # judged here, written below from the head they were judged at.
    deferred: list[session_rows.Draft] = []
    start, start_known = head, known
    if drafts:
        args: dict[str, Any] = {"expected_leaf": ANY_LEAF, "lease": None, "checked": True}
        args |= {"fenced_epoch": epoch, "head": head, "known": known}
        judged = head is not None  # else written at once (a judging call would read the head)
        chain = session_rows.append_chain(tx, run.session_id, drafts, **args, write=not judged)
        last = chain.entries[-1]
        after = (last.id, last.seq + 1, *(head or ())[2:])  # (the key version: unchanged)
        if judged and _closed(chain.opening, after):
            deferred = list(drafts)
        elif judged:  # calls open after them: written now (checked again: rare, a read or two)
            chain = session_rows.append_chain(tx, run.session_id, drafts, **args)
        head, opening = after, chain.opening
    # no tool record of the run or its turn (read above): none to interrupt
    any_records = read is None or bool(read[3])
    closed, opening = tool_pairing.close_turn(
        tx, moved, epoch, head, opening, any_records=any_records
    )
    if closed is not None:
        last = closed.entries[-1]
        head = (last.id, last.seq + 1)
    # The run's open turn: its first (admission opened it) unless its runtime
    # ended that one and opened another (run_turns); none when it ended its last.
    turn_id: str | None = run.turn_id
    # (read above when it was: nothing here writes the turns)
    first = tx.one(_TURN_STATUS, [turn_id]) if read is None else read[2:3]
    if first is None or first[0] != TURN_OPEN:
        turn_id = run_turns.open_turn(tx, run.session_id)
    own = [] if assistant_message is None else [{"message": assistant_message}]
    drafts_own = [
        session_rows.own_draft(EntryKind.MESSAGE, p, run.assistant_entry_id, chosen=True)
        for p in own
    ]
    if turn_id is not None:
        end = {"turnId": turn_id, "intentId": run.intent_id, "runId": run.id, "status": status}
        if stop_reason is not None:
            end["stopReason"] = stop_reason
        drafts_own.append(
            session_rows.own_draft(EntryKind.TURN_END, end, turn_id + run_turns.END, chosen=True)
        )
    ended = session_rows.Chain([], opening)
    final = [*deferred, *drafts_own]
    terminal = [(edge, f"{run_id}:{status.value}", {"error": error, "stopReason": stop_reason})]
    if final:
        ended = session_rows.append_chain(
            tx,
            run.session_id,
            final,
            expected_leaf=ANY_LEAF,
            lease=None,
            fenced_epoch=epoch,
            checked=True,
            head=start if deferred else head,
            known=start_known if deferred else opening,
            # the terminal event, its seq taken by the same update of the session
            new_events=(moved, terminal),
            # (never one of ``drafts``' ids: a caller's id cannot end as the store's own)
            absent=_own_ids(run) if read is not None and not read[4] else frozenset(),
            hold=True,  # with the writes held above and below (none writes the session)
        )
    if turn_id is not None:
        tx.later(
            "UPDATE conversation_turns SET status = ?, end_seq = ?, ended_at = ? WHERE id = ?",
            [status.value, ended.entries[-1].seq, tx.now, turn_id],
        )
    if not final:  # no entry written: the event alone (and its cursor's update)
        run_events.append_events(tx, moved, terminal)
    if plan is not None:  # the run ended just now: it can have no plan yet (its writes held)
        # (the key version as read with the run: nothing here changes it)
        version = UNREAD if start is None else start[2]
        outbox_plans.create_plan(tx, moved, plan, first=True, version=version)
    tx.notify(Topic.RUN_ENDED)
    return moved, True, ended.opening


def record_decisions(tx: Tx, run: Run, decisions: Sequence[Mapping[str, Any]]) -> None:
    """Append one ``decision`` run event per resolution (session seed decisionEvents),
    with ids derived from the run and the decision id so a retry writes none twice."""
    for decision in decisions:
        event_id = f"{run.id}:decision:{decision['id']}"
        if tx.one("SELECT 1 FROM run_events WHERE id = ?", [event_id]) is not None:
            continue
        edge = Edge(DECISION, "decide", run.status, run.status)
        run_events.append_event(tx, run, edge, event_id, decision)


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


class LifecyclePart(Area):
    """Start, wait, resume, finish and cancel a run."""

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
