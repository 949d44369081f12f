"""Every tool call in the replayed context gets its result: the tool's own, or an
explicit interrupted one (never an invented output).

When a call's process is lost (interrupt, abandon) or its run's turn closes,
each call still open in the context replay builds at the leaf gets a result
under the leaf, in the same transaction, in the order of the calls in their
assistant message and in the call's own shape (a pi ``toolResult`` for a
``toolCall`` block, an OpenAI ``tool`` message for a ``tool_calls`` item;
``storage/pairing.py``): the tool's own result, unchanged, when its record
completed (only the transcript entry was lost), else the explicit
interrupted result. A call that is not open there (answered, on another
branch, lapsed, never written) gets none: it would be an orphan. The results
are appended like any other entries, judged by the same rule.
"""

from __future__ import annotations

from typing import Any

from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import ANY_LEAF, Run
from turnkeeper.spec.tool_execution import (
    INTERRUPTED_TEXT,
    ToolExecution,
    ToolExecutionState,
    interrupted_result,
    openai_content,
    openai_result,
    recorded_result,
    unrecorded_interrupted_result,
)

from ..backend import Tx, present
from ..codec import derived_id
from ..pairing import OPENAI, Call, Opening
from . import pairing_checks, sessions
from . import tool_records as records


def interrupted_id(rec: ToolExecution) -> str:
    """The entry id of ``rec``'s interrupted result: ``<execution key>:interrupted``
    for its first attempt, ``<execution key>:<attempt>:interrupted`` for a later
    one (a reclaimed call interrupted again gets a result of its own)."""
    part = rec.execution_key if rec.attempt == 1 else f"{rec.execution_key}:{rec.attempt}"
    return derived_id("", part, ":interrupted")


def _now_ms(tx: Tx) -> int:
    now = tx.now
    assert now is not None  # always set inside a transaction
    return int(now.timestamp() * 1000)


def interrupted(call: Call, rec: ToolExecution | None, ms: int) -> dict[str, Any]:
    """The explicit interrupted result of ``call`` (``rec``: its record, if any)."""
    if call.shape == OPENAI:
        return openai_result(call.id, INTERRUPTED_TEXT)
    if rec is None:
        return unrecorded_interrupted_result(call.id, call.name, ms)
    return interrupted_result(rec, ms)


def recorded(call: Call, rec: ToolExecution, ms: int) -> dict[str, Any]:
    """``call``'s result rebuilt from its completed record, unchanged."""
    if call.shape == OPENAI:
        return openai_result(call.id, openai_content(rec.result))
    return recorded_result(rec, ms)


def head_of(tx: Tx, session_id: str) -> tuple[str | None, int]:
    """The session's leaf and next seq."""
    row = tx.one("SELECT leaf_id, next_seq FROM sessions WHERE id = ?", [session_id])
    leaf, seq = present(row, "the session row the caller found in this transaction")
    return leaf, seq


def open_at_head(
    tx: Tx, session_id: str, head: tuple[str | None, int] | None, known: Opening | None
) -> Opening:
    """The calls open at the session's head (``head``: as the caller knows it in
    this transaction; ``known``: the calls open at some head)."""
    leaf, next_seq = head if head is not None else head_of(tx, session_id)
    if known is not None and (known.leaf_id, known.next_seq) == (leaf, next_seq):
        return known
    return pairing_checks.opening_at(tx, session_id, leaf, next_seq)


def append_results(
    tx: Tx,
    session_id: str,
    results: list[tuple[str, dict[str, Any]]],
    epoch: int | None,
    opening: Opening,
) -> sessions.Chain | None:
    """Append ``(entry id, result message)`` pairs under the leaf at ``opening``,
    in order, as one chain, judged like every write (ids derived by the store
    from keys that may be older: checked). ``None`` when there is none."""
    if not results:
        return None
    drafts = [
        sessions.own_draft(EntryKind.MESSAGE, {"message": m}, i, chosen=True) for i, m in results
    ]
    return sessions.append_chain(
        tx,
        session_id,
        drafts,
        expected_leaf=ANY_LEAF,
        lease=None,
        fenced_epoch=epoch,
        checked=True,
        head=(opening.leaf_id, opening.next_seq),
        known=opening,
    )


def pair_all(tx: Tx, session_id: str, moved: list[ToolExecution], epoch: int | None) -> int:
    """Append the explicit interrupted result of each record in ``moved`` (just
    interrupted or abandoned) whose call is open in the replayed context, in
    call order; returns how many. ``epoch`` is the lease the caller fenced in
    this transaction."""
    if not moved:
        return 0
    by_call: dict[str, ToolExecution] = {}
    for rec in moved:
        by_call.setdefault(rec.provider_call_id, rec)
    opening = open_at_head(tx, session_id, None, None)
    ms = _now_ms(tx)
    results = [
        (interrupted_id(by_call[call.id]), interrupted(call, by_call[call.id], ms))
        for call in opening.calls
        if call.id in by_call
    ]
    append_results(tx, session_id, results, epoch, opening)
    return len(results)


def close_turn(
    tx: Tx,
    run: Run,
    epoch: int | None,
    head: tuple[str | None, int] | None = None,
    known: Opening | None = None,
) -> tuple[sessions.Chain | None, Opening | None]:
    """Before ``run``'s turn closes, end every tool call open in the replayed
    context at the session's leaf: running records of the run are marked
    ``interrupted``, and each open call gets a result, in call order: the
    tool's own result, unchanged, when the run's record of it completed (the
    process died before writing it to the transcript:
    :func:`~turnkeeper.spec.tool_execution.recorded_result`), else the
    explicit interrupted result. Nothing is re-run and no output is invented;
    the turn's reply may then follow. ``epoch`` is the lease the caller fenced
    (stored on the appended entries); ``head``: the session's leaf and next
    seq as the caller knows them in this transaction; ``known``: the calls
    open at some head. Returns what was appended (``None``: nothing) and the
    calls open after it (none, at the head it leaves; ``None``: not known).
    """
    latest: dict[str, ToolExecution] = {}  # per call id, the run's latest record
    interrupted_now: set[str] = set()
    for found in records.of_run(tx, run.session_id, run.id, run.turn_id):
        if found.state == ToolExecutionState.RUNNING:
            edge = records.MACHINE.require("interrupt", found.state, records.facts(found))
            found = records.move(tx, found, edge, "reason = ?", [f"the run ended {run.status}"])
            interrupted_now.add(found.execution_key)
        latest[found.provider_call_id] = found
    opening = open_at_head(tx, run.session_id, head, known)
    ms = _now_ms(tx)
    results: list[tuple[str, dict[str, Any]]] = []
    for call in opening.calls:  # call order
        rec = latest.get(call.id)
        if rec is not None and rec.execution_key in interrupted_now:
            results.append((interrupted_id(rec), interrupted(call, rec, ms)))
            continue
        entry_id = derived_id(f"{run.id}:", call.id, ":interrupted")
        if rec is not None and rec.state == ToolExecutionState.COMPLETED:
            # the tool finished; only its transcript entry was lost
            results.append((entry_id, recorded(call, rec, ms)))
        else:
            results.append((entry_id, interrupted(call, rec, ms)))
    chain = append_results(tx, run.session_id, results, epoch, opening)
    return chain, opening if chain is None else chain.opening
