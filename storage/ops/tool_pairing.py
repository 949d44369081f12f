"""Every tool call in the replayed context gets its result: the tool's own, or an
explicit interrupted one (never an invented output).

When a call's process is lost (interrupt, abandon) or its run's turn closes,
each call still open in the context replay builds gets a ``toolResult``
under the current leaf, in the same transaction: the tool's recorded result
when its record completed (only the transcript entry was lost), else the
explicit interrupted result. A call that is not open there (answered, on
another branch, lapsed, never written) gets none: it would be an orphan."""

from __future__ import annotations

from typing import Any

from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import ANY_LEAF, Entry, Run
from turnkeeper.spec.tool_execution import (
    ToolExecution,
    ToolExecutionState,
    interrupted_result,
    recorded_result,
    unrecorded_interrupted_result,
)

from ..backend import Tx
from ..codec import derived_id
from ..replay import open_tool_calls
from . import sessions
from . import tool_records as records


def interrupted_id(rec: ToolExecution) -> str:
    """The entry id of ``rec``'s interrupted result: ``<execution key>:interrupted``
    for its first attempt, ``<execution key>:<attempt>:interrupted`` for a later
    one (a reclaimed call interrupted again gets a result of its own)."""
    part = rec.execution_key if rec.attempt == 1 else f"{rec.execution_key}:{rec.attempt}"
    return derived_id("", part, ":interrupted")


def pair_all(tx: Tx, session_id: str, moved: list[ToolExecution], epoch: int | None) -> int:
    """Append the explicit interrupted ``toolResult`` of each record in ``moved``
    (just interrupted or abandoned) whose call is open in the replayed context,
    in the order of the calls in their assistant message; returns how many.
    A call that is not in the context (answered already, on another branch,
    or never written) gets no result: one would be an orphan there.
    ``epoch`` is the lease the caller fenced in this transaction."""
    if not moved:
        return 0
    by_call: dict[str, ToolExecution] = {}
    for rec in moved:
        by_call.setdefault(rec.provider_call_id, rec)
    now = tx.now
    assert now is not None
    ms = int(now.timestamp() * 1000)
    results = [
        (interrupted_id(by_call[call_id]), interrupted_result(by_call[call_id], ms))
        for call_id in open_calls_of(tx, session_id)
        if call_id in by_call
    ]
    _append_results(tx, session_id, results, epoch)
    return len(results)


def _append_results(
    tx: Tx, session_id: str, results: list[tuple[str, dict[str, Any]]], epoch: int | None
) -> None:
    """Append ``(entry id, toolResult message)`` pairs under the leaf, in order, as
    one chain (ids derived by the store from keys that may be older: checked)."""
    if results:
        sessions.append_drafts(
            tx,
            session_id,
            [
                sessions.own_draft(EntryKind.MESSAGE, {"message": m}, i, chosen=True)
                for i, m in results
            ],
            expected_leaf=ANY_LEAF,
            lease=None,
            fenced_epoch=epoch,
            checked=True,
        )


def open_calls_of(tx: Tx, session_id: str) -> dict[str, Entry]:
    """The session's open tool calls in the context replay builds at its leaf,
    in call order."""
    return open_tool_calls(sessions.branch_path(tx, session_id))


def close_turn(tx: Tx, run: Run, epoch: int | None, leaf: tuple[str | None] | None = None) -> int:
    """Before ``run``'s turn closes, pair every tool call of the turn that is open
    in the replayed context: running records of the run are marked
    ``interrupted``, and each open ``toolCall`` gets a ``toolResult``, in the
    order of the calls in their assistant message: the tool's own result,
    unchanged, when its record completed (the process died before writing it
    to the transcript: :func:`~turnkeeper.spec.tool_execution.recorded_result`),
    else the explicit interrupted result. Nothing is re-run and no output is
    invented. ``epoch`` is the lease the caller fenced (stored on the appended
    entries); ``leaf``: the session's leaf as the caller knows it in this
    transaction. Returns the results appended.
    """
    of_run = records.of_run(tx, run.session_id, run.id, run.turn_id)
    start = tx.one("SELECT start_seq FROM conversation_turns WHERE id = ?", [run.turn_id])
    # The turn's calls are judged by what follows them, all in the turn's tail of
    # the branch: read only that tail (the whole branch when a compaction is in it).
    tail = None if start is None else sessions.path_since(tx, run.session_id, start[0], leaf=leaf)
    path = tail if tail is not None else sessions.branch_path(tx, run.session_id)
    open_calls = {
        call_id: entry
        for call_id, entry in open_tool_calls(path).items()
        if start is not None and entry.seq >= start[0]
    }
    latest: dict[str, ToolExecution] = {}  # per call id, the run's latest record
    interrupted: set[str] = set()
    for found in of_run:
        if found.state == ToolExecutionState.RUNNING:
            edge = records.MACHINE.require("interrupt", found.state, records.facts(found))
            found = records.move(tx, found, edge, "reason = ?", [f"the run ended {run.status}"])
            interrupted.add(found.execution_key)
        latest[found.provider_call_id] = found
    now = tx.now
    assert now is not None
    ms = int(now.timestamp() * 1000)
    results: list[tuple[str, dict[str, Any]]] = []
    for call_id, entry in open_calls.items():  # call order
        rec: ToolExecution | None = latest.get(call_id)
        if rec is not None and rec.execution_key in interrupted:
            results.append((interrupted_id(rec), interrupted_result(rec, ms)))
            continue
        entry_id = derived_id(f"{run.id}:", call_id, ":interrupted")
        if rec is not None and rec.state == ToolExecutionState.COMPLETED:
            # the tool finished; only its transcript entry was lost
            results.append((entry_id, recorded_result(rec, ms)))
        elif rec is not None:
            results.append((entry_id, interrupted_result(rec, ms)))
        else:
            name = next(
                (
                    str(b.get("name", ""))
                    for b in entry.payload["message"]["content"]
                    if isinstance(b, dict) and b.get("id") == call_id
                ),
                "",
            )
            results.append((entry_id, unrecorded_interrupted_result(call_id, name, ms)))
    _append_results(tx, run.session_id, results, epoch)
    return len(results)
