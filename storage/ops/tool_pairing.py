"""Every tool call in the replayed context gets its result: the tool's own, or an
explicit interrupted one (never an invented output).

When a call's process is lost (interrupt, abandon) or its run's turn closes,
each call still open in the context replay builds gets a ``toolResult``
under the current leaf, in the same transaction: the tool's recorded result
when its record completed (only the transcript entry was lost), else the
explicit interrupted result. A call that is not open there (answered, on
another branch, lapsed, never written) gets none: it would be an orphan."""

from __future__ import annotations

from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import Entry, Run
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


def pair(tx: Tx, rec: ToolExecution, epoch: int | None, open_calls: dict[str, Entry]) -> bool:
    """Append the explicit interrupted ``toolResult`` for ``rec`` if its call is
    open in the replayed context (``open_calls``, updated); returns whether it
    appended. A call that is not in the context (answered already, on another
    branch, or never written) gets no result: one would be an orphan there.
    ``epoch`` is the lease the caller fenced in this transaction."""
    if open_calls.pop(rec.provider_call_id, None) is None:
        return False
    now = tx.now
    assert now is not None
    message = interrupted_result(rec, int(now.timestamp() * 1000))
    entry_id = derived_id("", rec.execution_key, ":interrupted")
    sessions.append_own(
        tx, rec.session_id, EntryKind.MESSAGE, {"message": message}, entry_id, epoch
    )
    return True


def open_calls_of(tx: Tx, session_id: str) -> dict[str, Entry]:
    """The session's open tool calls in the context replay builds at its leaf."""
    return open_tool_calls(sessions.branch_path(tx, session_id))


def close_turn(tx: Tx, run: Run, epoch: int | None, leaf: tuple[str | None] | None = None) -> int:
    """Before ``run``'s turn closes, pair every tool call of the turn that is open
    in the replayed context: running records of the run are marked
    ``interrupted``, and each such ``toolCall`` gets a ``toolResult``: the
    tool's own result when its record completed (the process died before
    writing it to the transcript), else the explicit interrupted result.
    Nothing is re-run and no output is invented. ``epoch`` is the lease the
    caller fenced (stored on the appended entries); ``leaf``: the session's leaf
    as the caller knows it in this transaction. Returns the results appended.
    """
    of_run = records.of_run(tx, run.session_id, run.id, run.turn_id)
    running = [rec for rec in of_run if rec.state == ToolExecutionState.RUNNING]
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
    appended = 0
    for rec in running:
        edge = records.MACHINE.require("interrupt", rec.state, records.facts(rec))
        moved = records.move(tx, rec, edge, "reason = ?", [f"the run ended {run.status}"])
        appended += pair(tx, moved, epoch, open_calls)
    if not open_calls:
        return appended
    now = tx.now
    assert now is not None
    completed = {
        rec.provider_call_id: rec for rec in of_run if rec.state == ToolExecutionState.COMPLETED
    }
    for call_id, entry in open_calls.items():
        ms = int(now.timestamp() * 1000)
        done = completed.get(call_id)
        if done is not None:  # the tool finished; only its transcript entry was lost
            message = recorded_result(done, ms)
        else:
            name = next(
                (
                    str(b.get("name", ""))
                    for b in entry.payload["message"]["content"]
                    if isinstance(b, dict) and b.get("id") == call_id
                ),
                "",
            )
            message = unrecorded_interrupted_result(call_id, name, ms)
        entry_id = derived_id(f"{run.id}:", call_id, ":interrupted")
        sessions.append_own(
            tx, run.session_id, EntryKind.MESSAGE, {"message": message}, entry_id, epoch
        )
        appended += 1
    return appended
