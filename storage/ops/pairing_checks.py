"""The tool-call pairing rule (``storage/pairing.py``) applied where a write stands.

Every write of entries runs :func:`check` in its transaction before it
writes: what the new entries bring is judged in the context replay builds
at the point they are appended, and a fault refuses the whole write
(:func:`refuse`: ``ToolCallPairingError``, ``ToolCallsUnansweredError``).

What a point's context needs is only the calls still open there
(:class:`~turnkeeper.storage.pairing.Opening`), and those are decided by
the branch back to the last context message that is not a result: the
check reads the branch backwards from the leaf, one entry by its id at a
time (an index read on both backends), only as far as that message,
typically one to three entries. A compaction on the way, or more than
:data:`MAX_BACK` entries, reads the whole branch instead; so does a write
that brings a compaction or a fault (its reason needs the whole branch).

A store object also remembers, per session, the calls open at the head its
own last write left (:class:`OpeningCache`), keyed by the head: the session
row's ``(leaf_id, next_seq)``, which names a branch exactly (entries never
change, and every write of entries moves ``next_seq``; see
``storage/ops/replays.py``). A write that finds the head it remembers reads
nothing more: the steady state of one runtime writing its sessions, and
what keeps PostgreSQL's plain append one statement (it writes only while
the head is the one judged).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import Entry

from ..backend import Tx
from ..pairing import Fault, Opening, judge, new_faults, opening_from_tail, opening_of
from ..replay import context_message
from . import entry_rows

MAX_BACK = 64
"""Entries read backwards from a leaf, one by one, before the whole branch is read."""

CACHE_SESSIONS = 4096
"""Sessions whose open calls a store object remembers (least recently written evicted)."""


class OpeningCache:
    """Per session, the calls open at the head a write of this store object left
    (thread-safe; bounded to :data:`CACHE_SESSIONS` sessions). Only a value
    computed from a committed write, or read in a transaction, is put."""

    def __init__(self, size: int = CACHE_SESSIONS) -> None:
        self._size = size
        self._items: OrderedDict[str, Opening] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> Opening | None:
        """What is remembered for ``session_id``, or ``None``."""
        with self._lock:
            found = self._items.get(session_id)
            if found is not None:
                self._items.move_to_end(session_id)
            return found

    def put(self, session_id: str, opening: Opening | None) -> None:
        """Remember ``opening`` for the session (``None``: forget it)."""
        with self._lock:
            if opening is None:
                self._items.pop(session_id, None)
                return
            self._items[session_id] = opening
            self._items.move_to_end(session_id)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


class _TooFar(Exception):
    """The backwards read passed :data:`MAX_BACK` entries."""


def opening_at(tx: Tx, session_id: str, leaf: str | None, next_seq: int) -> Opening:
    """The calls open at ``leaf`` (the session's head, or a branch point, with the
    session's ``next_seq``), read in ``tx`` (see the module docstring)."""
    if leaf is None:
        return Opening(None, next_seq)

    def back() -> Iterator[Entry]:
        node: str | None = leaf
        seen: set[str] = set()
        while node is not None and node not in seen:
            if len(seen) == MAX_BACK:
                raise _TooFar
            entry = entry_rows.entry(tx, session_id, node)
            if entry is None:  # a missing parent ends a branch, as replay walks it
                return
            seen.add(node)
            yield entry
            node = entry.parent_id

    try:
        found = opening_from_tail(back(), leaf, next_seq)
    except _TooFar:
        found = None
    if found is not None:
        return found
    return opening_of(entry_rows.path_to_leaf(tx, session_id, leaf), next_seq)


def check(
    tx: Tx,
    session_id: str,
    parent: str | None,
    next_seq: int,
    new: Sequence[Entry],
    known: Opening | None = None,
) -> Opening | None:
    """Judge ``new`` (entries about to be appended as a chain under ``parent``,
    their seqs from ``next_seq``), before anything is written; returns the
    calls open after them (``None``: not known, nothing was read for it).
    ``known``: the calls open at a head, used when it is ``(parent,
    next_seq)``.

    Raises:
        ToolCallPairingError, ToolCallsUnansweredError: the first fault ``new``
            brings (see :func:`refuse`).
    """
    if not new:
        return known
    after = next_seq + len(new)
    if any(e.kind == EntryKind.COMPACTION for e in new):  # its kept tail: the whole branch
        path = [*entry_rows.path_to_leaf(tx, session_id, parent), *new]
        refuse(session_id, new_faults(path, len(new)))
        return opening_of(path, after)
    here = (
        known
        if known is not None and (known.leaf_id, known.next_seq) == (parent, next_seq)
        else None
    )
    if all(context_message(e) is None for e in new):  # no message: the open calls stay
        if here is None:
            return None
        return Opening(new[-1].id, after, here.holder, here.optional, here.calls)
    if here is None:
        here = opening_at(tx, session_id, parent, next_seq)
    ok, opened = judge(here, new)
    if ok:
        return opened
    path = [*entry_rows.path_to_leaf(tx, session_id, parent), *new]
    refuse(session_id, new_faults(path, len(new)))
    return opening_of(path, after)  # (judge's no is always confirmed: not reached)


def refuse(session_id: str, faults: Sequence[Fault]) -> None:
    """Raise the error of the first of ``faults``, if any: for ``unanswered``,
    :class:`~turnkeeper.spec.errors.ToolCallsUnansweredError` naming every call
    the same message would follow unanswered; else ``ToolCallPairingError``.
    The error's ``entry_id`` is the fault's message (for ``cut``, the kept
    result)."""
    if not faults:
        return
    first = faults[0]
    if first.reason == "unanswered":
        ids = [
            f.tool_call_id
            for f in faults
            if f.reason == "unanswered" and f.message_id == first.message_id
        ]
        raise errors.ToolCallsUnansweredError(session_id, first.message_id, ids)
    raise errors.ToolCallPairingError(
        session_id, first.message_id, first.tool_call_id, first.reason
    )
