"""Which tool-execution record belongs to a tool call open at a session's leaf.

A record names its call only by the provider's call id, and providers reuse
call ids (within a run, across turns), so a record with the right id may
belong to another call: an earlier one of the run, already answered, or one
on another branch. When the store ends open calls (``tool_pairing``: a run's
end, recovery, ``tools.interrupt``, an abandon), an open call gets
a record's output, or its interrupted details, only from a record that
belongs to that very call (the assistant entry that makes it):

- a record belongs to an entry of its turn (a run's turn: the entries from
  its start to its end, by seq; a turn the store has no row of, a
  runtime's own, spans the session), or, when none there makes a call with
  its id, to one written before the turn began (a call left open before
  the run that claimed it), never to one written after its turn ended;
- when one entry is left, the record belongs to it, whatever the order in
  which the runtime wrote the message and claimed the call (a call
  reclaimed by a later run belongs to the call made again in that run's
  turn);
- else the record belongs to the last of those entries written before it was
  claimed (the store's clock: an entry's ``written_at``, a record's
  ``created_at``): a runtime claims a call after the message that makes it,
  and a later message can reuse the id only once the call's result is in.
  When that is not known (two of them written at the same instant as each
  other or as the claim, none before it, or no clock reading), the record
  belongs to none.

A call no record belongs to gets the explicit interrupted result: another
call's output is never given to it. Finding the entries reads the session's
messages that hold one of the ids (a read of the session's entries), only
when a record with an open call's id exists.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from turnkeeper.spec.tool_execution import ToolExecution

from ..backend import Tx, keyed, utc
from ..pairing import Opening, calls_of
from . import entry_rows
from . import tool_records as records

_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:\-]+")
"""Call ids whose JSON text is the id itself in any encoder (no quote, backslash,
slash, control or non-ASCII character): a substring search of the stored
payload finds every message that holds one."""


@dataclass(frozen=True, slots=True)
class Maker:
    """An assistant entry that makes a call with some id: its id, seq and the
    store's clock at its write (``None``: not known)."""

    entry_id: str
    seq: int
    written_at: datetime | None


def candidates(tx: Tx, session_id: str, opening: Opening) -> list[ToolExecution]:
    """The session's records whose call id is one of the calls open at
    ``opening``, oldest first (a read of the session's records)."""
    ids = sorted({c.id for c in opening.calls})
    if not ids:
        return []
    return records.select(tx, session_id, "provider_call_id = ANY(?::VARCHAR[])", [ids])


def makers(tx: Tx, session_id: str, call_ids: Sequence[str]) -> dict[str, list[Maker]]:
    """Per call id, the session's assistant entries (any branch) that make a call
    with it, in seq order."""
    wanted = sorted(set(call_ids))
    if not wanted:
        return {}
    sql = "SELECT id, seq, written_at, payload FROM entries WHERE session_id = ? AND kind = ?"
    params: list[object] = [session_id, "message"]
    if all(_PLAIN_ID.fullmatch(c) for c in wanted):
        match = "(" + " OR ".join("strpos(payload, ?) > 0" for _ in wanted) + ")"
        sql += " AND " + entry_rows.or_sealed(tx, match)
        params += wanted
    out: dict[str, list[Maker]] = {c: [] for c in wanted}
    for entry_id, seq, written_at, payload in tx.rows(sql + " ORDER BY seq", params):
        message = entry_rows.payload_of(tx, session_id, entry_id, payload).get("message")
        if not isinstance(message, dict):
            continue
        when = None if written_at is None else utc(written_at)
        for call in calls_of(message):
            if call.id in out:
                out[call.id].append(Maker(entry_id, seq, when))
    return out


def maker_of(rec: ToolExecution, found: Sequence[Maker]) -> str | None:
    """The entry id of the assistant entry ``rec``'s call belongs to, among
    ``found`` (the entries making a call with its id, in seq order), or
    ``None`` when it is not known (see the module docstring)."""
    if len(found) == 1:
        return found[0].entry_id
    claimed = rec.created_at
    if any(m.written_at is None for m in found):
        return None
    same = [m for m in found if m.written_at == claimed]
    before = [m for m in found if m.written_at is not None and m.written_at < claimed]
    if same:
        return same[0].entry_id if len(same) == 1 and not before else None
    if not before:
        return None
    last = max(before, key=lambda m: (m.written_at, m.seq))
    if sum(1 for m in before if m.written_at == last.written_at) > 1:
        return None
    return last.entry_id


def owners(
    tx: Tx, session_id: str, opening: Opening, found: Sequence[ToolExecution]
) -> dict[str, ToolExecution]:
    """Per call open at ``opening`` (by call id), the record among ``found``
    (records of the session, oldest first) that belongs to it: the latest of
    those that do (a call claimed under two keys answers with the later).
    Calls no record belongs to are not in the result."""
    if opening.holder is None:
        return {}
    open_ids = {c.id for c in opening.calls}
    relevant = [r for r in found if r.provider_call_id in open_ids]
    if not relevant:
        return {}
    by_call = makers(tx, session_id, [r.provider_call_id for r in relevant])
    spans = turn_spans(tx, session_id, [r.local_turn_id for r in relevant])
    out: dict[str, ToolExecution] = {}
    for rec in relevant:
        candidates_of = in_turn(by_call.get(rec.provider_call_id, []), spans.get(rec.local_turn_id))
        if maker_of(rec, candidates_of) == opening.holder:
            out[rec.provider_call_id] = rec
    return out


def in_turn(found: Sequence[Maker], span: tuple[int, int | None] | None) -> list[Maker]:
    """The entries of ``found`` a record of a turn spanning ``span`` (first and
    last seq; ``None``: the session) may belong to: those of the turn, else
    those before it."""
    if span is None:
        return list(found)
    start, end = span
    inside = [m for m in found if start <= m.seq and (end is None or m.seq <= end)]
    return inside or [m for m in found if m.seq < start]


def turn_spans(
    tx: Tx, session_id: str, turn_ids: Sequence[str]
) -> dict[str, tuple[int, int | None]]:
    """Per turn id the session has a row of (a run's turn), its first and last
    entry seq (``None``: still open)."""
    wanted = sorted(set(turn_ids))
    if not wanted:
        return {}
    rows = tx.rows(
        "SELECT id, start_seq, end_seq FROM conversation_turns "
        f"WHERE {keyed('id', 'session_id = ?', 'ANY(?::VARCHAR[])')}",
        [wanted, session_id],
        replan=True,  # a list of ids (see Tx.rows)
    )
    return {r[0]: (r[1], r[2]) for r in rows}
