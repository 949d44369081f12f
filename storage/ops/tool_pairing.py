"""Every tool call in the replayed context gets its result: the tool's own, or an
explicit interrupted one (never an invented output, never another call's).

When a call's process is lost (interrupt, abandon) or its run's turn closes,
each call still open in the context replay builds at the leaf gets a result
under the leaf, in the same transaction, in the order of the calls in their
assistant message and in the call's own shape (a pi ``toolResult`` for a
``toolCall`` block, an OpenAI ``tool`` message for a ``tool_calls`` item;
``storage/pairing.py``): the tool's own result, unchanged, when the record
that belongs to the call completed (only the transcript entry was lost),
else the explicit interrupted result. Which record belongs to which call is
``call_records``' to say: a record with the call's id that belongs to
another call (an earlier one reusing the id, one on another branch) gives
it nothing. A call that is not open there (answered, on another branch,
lapsed, never written) gets none: it would be an orphan. The results are
appended like any other entries, judged by the same rule.

Each result's entry id is derived (documented in the README); when the
session already holds that id, or an entry names it as its missing parent
(both only through an import or a fork of one, or the same call answered
again on another branch), the result takes a fresh random id instead, so
the store's own write never fails on, or re-parents, what another put there.
"""

from __future__ import annotations

from collections.abc import Callable
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
from . import call_records, pairing_checks, session_rows
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
    tx: Tx, session_id: str, head: tuple[Any, ...] | None, known: Opening | None
) -> Opening:
    """The calls open at the session's head (``head``: its leaf and next seq,
    then anything, as the caller knows it in this transaction; ``known``: the
    calls open at some head)."""
    leaf, next_seq = head[:2] if head is not None else head_of(tx, session_id)
    if known is not None and (known.leaf_id, known.next_seq) == (leaf, next_seq):
        return known
    return pairing_checks.opening_at(tx, session_id, leaf, next_seq)


def free_ids(tx: Tx, session_id: str, wanted: list[str]) -> list[str]:
    """``wanted`` (derived ids, in order), each kept when it is free in the
    session (no entry has it, none names it as its parent, no earlier one of
    ``wanted`` is it), else replaced by a fresh random id."""
    taken = session_rows.existing(tx, session_id, wanted)
    taken |= set(
        session_rows.named_as_parent(tx, session_id, [i for i in wanted if i not in taken])
    )
    out: list[str] = []
    for entry_id in wanted:
        out.append(session_rows.new_entry_id() if entry_id in taken else entry_id)
        taken.add(entry_id)
    return out


def append_results(
    tx: Tx,
    session_id: str,
    results: list[tuple[str, dict[str, Any]]],
    epoch: int | None,
    opening: Opening,
) -> session_rows.Chain | None:
    """Append ``(entry id, result message)`` pairs under the leaf at ``opening``,
    in order, as one chain, judged like every write (ids derived by the store,
    made free first: :func:`free_ids`). ``None`` when there is none."""
    if not results:
        return None
    ids = free_ids(tx, session_id, [i for i, _ in results])
    drafts = [
        session_rows.own_draft(EntryKind.MESSAGE, {"message": m}, i)
        for i, (_, m) in zip(ids, results, strict=True)
    ]
    return session_rows.append_chain(
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


def close_open(
    tx: Tx,
    session_id: str,
    opening: Opening,
    found: list[ToolExecution],
    reason: str,
    epoch: int | None,
    entry_id: Callable[[Call], str],
    interrupted_now: set[str],
) -> tuple[session_rows.Chain | None, list[ToolExecution]]:
    """Give every call open at ``opening`` its result, in call order: the record
    among ``found`` that belongs to it (``call_records.owners``), if any,
    decides. A running one is marked ``interrupted`` (``reason``) and the call
    gets its interrupted result (entry id ``<execution key>:interrupted``, as
    for one in ``interrupted_now``, the keys of records the caller just
    interrupted); a completed one gives the tool's own result; any other, or
    none, the explicit interrupted result (entry id ``entry_id(call)``).
    Returns what was appended and the records this marked interrupted."""
    if not opening.calls:
        return None, []
    owners = call_records.owners(tx, session_id, opening, found)
    ms = _now_ms(tx)
    moved: list[ToolExecution] = []
    results: list[tuple[str, dict[str, Any]]] = []
    for call in opening.calls:  # call order
        rec = owners.get(call.id)
        if rec is not None and rec.state == ToolExecutionState.RUNNING:
            edge = records.MACHINE.require("interrupt", rec.state, records.facts(rec))
            rec = records.move(tx, rec, edge, "reason = ?", [reason])
            moved.append(rec)
            interrupted_now.add(rec.execution_key)
        if rec is not None and rec.execution_key in interrupted_now:
            results.append((interrupted_id(rec), interrupted(call, rec, ms)))
        elif rec is not None and rec.state == ToolExecutionState.COMPLETED:
            # the tool finished; only its transcript entry was lost
            results.append((entry_id(call), recorded(call, rec, ms)))
        else:
            results.append((entry_id(call), interrupted(call, rec, ms)))
    return append_results(tx, session_id, results, epoch, opening), moved


def pair_all(tx: Tx, session_id: str, moved: list[ToolExecution], epoch: int | None) -> int:
    """Append the explicit interrupted result of each record in ``moved`` (just
    abandoned) that belongs to a call open in the replayed context, in call
    order; returns how many. ``epoch`` is the lease the caller fenced in this
    transaction."""
    if not moved:
        return 0
    opening = open_at_head(tx, session_id, None, None)
    owners = call_records.owners(tx, session_id, opening, moved)
    ms = _now_ms(tx)
    results = [
        (interrupted_id(owners[call.id]), interrupted(call, owners[call.id], ms))
        for call in opening.calls
        if call.id in owners
    ]
    append_results(tx, session_id, results, epoch, opening)
    return len(results)


def close_session(
    tx: Tx,
    session_id: str,
    local_turn_id: str | None,
    reason: str,
    epoch: int | None,
) -> list[ToolExecution]:
    """``tools.interrupt``: mark the session's running records (only
    ``local_turn_id``'s, if given) ``interrupted``, then give every call open
    at the leaf its result (:func:`close_open`; a call with no record of its
    own, or whose record is not running, gets entry id
    ``<assistant entry id>:<call id>:interrupted``). Returns every record
    marked interrupted, oldest first."""
    running = (
        records.select(tx, session_id, "state = 'running'")
        if local_turn_id is None
        else records.of_turn(tx, session_id, local_turn_id, "state = 'running'")
    )
    done: list[ToolExecution] = []
    for rec in running:
        edge = records.MACHINE.require("interrupt", rec.state, records.facts(rec))
        done.append(records.move(tx, rec, edge, "reason = ?", [reason]))
    opening = open_at_head(tx, session_id, None, None)
    if not opening.calls:
        return done
    holder = opening.holder or ""
    now = {r.execution_key for r in done}
    found = call_records.candidates(tx, session_id, opening)
    _, more = close_open(
        tx,
        session_id,
        opening,
        found,
        reason,
        epoch,
        lambda call: derived_id(f"{holder}:", call.id, ":interrupted"),
        now,
    )
    return sorted([*done, *more], key=lambda r: (r.created_at, r.execution_key))


def records_of_run(tx: Tx, run: Run) -> list[Any]:
    """The session's tool records of ``run`` or of its turn (``records.of_run``)."""
    return records.of_run(tx, run.session_id, run.id, run.turn_id)


def close_turn(
    tx: Tx,
    run: Run,
    epoch: int | None,
    head: tuple[Any, ...] | None = None,
    known: Opening | None = None,
    *,
    any_records: bool = True,
) -> tuple[session_rows.Chain | None, Opening | None]:
    """Before ``run``'s turn closes, end every tool call open in the replayed
    context at the session's leaf: running records of the run are marked
    ``interrupted``, and each open call gets a result, in call order
    (:func:`close_open`): the tool's own result, unchanged, when the record
    that belongs to the call (of this run or an earlier one) completed (the
    process died before writing it to the transcript:
    :func:`~turnkeeper.spec.tool_execution.recorded_result`), else the
    explicit interrupted result (entry id ``<run id>:<call id>:interrupted``,
    or the record's own for one interrupted now). Nothing is re-run and no
    output is invented; the turn's reply may then follow. ``epoch`` is the
    lease the caller fenced (stored on the appended entries); ``head``: the
    session's leaf and next seq as the caller knows them in this
    transaction; ``known``: the calls open at some head. Returns what was
    appended (``None``: nothing) and the calls open after it (none, at the
    head it leaves; ``None``: not known). ``any_records=False``: the caller read
    in this transaction that no tool record names the run or its turn (none
    is read).
    """
    interrupted_now: set[str] = set()
    reason = f"the run ended {run.status}"
    mine = records_of_run(tx, run) if any_records else []
    for found in mine:
        if found.state == ToolExecutionState.RUNNING:
            edge = records.MACHINE.require("interrupt", found.state, records.facts(found))
            found = records.move(tx, found, edge, "reason = ?", [reason])
            interrupted_now.add(found.execution_key)
    opening = open_at_head(tx, run.session_id, head, known)
    if not opening.calls:
        return None, opening
    chain, _ = close_open(
        tx,
        run.session_id,
        opening,
        call_records.candidates(tx, run.session_id, opening),
        reason,
        epoch,
        lambda call: derived_id(f"{run.id}:", call.id, ":interrupted"),
        interrupted_now,
    )
    return chain, opening if chain is None else chain.opening
