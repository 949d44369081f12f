"""The tool-call pairing rule: when a replayed context is valid for a model provider.

This module states the rule once; every write path enforces it (API appends
alone, in batches and merged in a DuckDB group, PostgreSQL's one-statement
append, ``runs.finish``'s entries and the store's own turn ends, admissions,
branch summaries, compactions, imports, forks and the results the store
writes itself on interrupt, abandon and recovery), and ``turnkeeper audit``
(``tool_results_in_context``) judges stored sessions with the very same
functions, so a state the writes refuse is exactly a state the audit flags.

**The context** is what replay builds from a branch (``storage/replay.py``,
pi's ``buildSessionContext``): the context messages of the entries from the
root (or the last compaction's kept tail) to the leaf. Entries that are not
context messages (turn boundaries, labels, titles, settings changes,
``custom`` entries, a branch summary without text) play no part.

**Shapes understood**, in each context message (a JSON object):

- a tool *call*: a pi ``toolCall`` content block of an ``assistant`` message
  (``{"type": "toolCall", "id": …, "name": …}``), or an OpenAI chat
  ``tool_calls`` item of an ``assistant`` message
  (``{"id": …, "type": "function", "function": {"name": …}}``); its id is a
  string. One message may make several calls (blocks in content order, then
  ``tool_calls`` items); a repeated id in one message is one call;
- a tool *result*: a pi ``toolResult`` message (``toolCallId``) or an OpenAI
  ``tool`` message (``tool_call_id``); a result without a string id answers
  the id ``""``. A result answers by id, whatever the call's shape;
- every other message, of any role, including roles this module does not
  know and messages in other vendors' shapes (an Anthropic ``tool_use`` or
  ``tool_result`` block is not understood: such messages are stored verbatim
  and count as other messages), is *another message*.

**A valid context**: each call of an assistant message is answered exactly
once, by results that come right after that message (with only results of
its calls between), before any other message. So, judged in the context
replay builds at each point of the branch, an entry is refused when it is

- a result whose call is not in the context (``unpaired``), was answered
  already (``duplicate``), or was followed by another message before it
  (``late``);
- another message, an assistant message included, while calls of the last
  assistant message have no result yet (``unanswered``: a provider takes no
  message between calls and their results);
- a compaction whose kept tail is not valid by itself, as replay will start
  from it: it keeps a result but cuts off its call (``cut``), or keeps some
  other fault.

Calls still open at the leaf are valid (their tools may be running): the next
entry must answer them. One exception, from pi: an ``assistant`` message whose
``stopReason`` is ``"aborted"`` or ``"error"`` is an incomplete reply, which
pi's provider layer leaves out of a request together with the results of its
calls (partial ``toolCall`` blocks stay in such messages in real pi files).
Its calls need no result: another message may follow them; a result may still
answer one, right after it, as for any call.

When the store itself ends calls (``tools.interrupt``,
``tools.abandon_interrupted``, a run's end in ``runs.finish`` or
recovery), it writes each open call's result in the call's own shape (a
``toolResult`` for a pi call, a ``tool`` message for an OpenAI call), in call
order, right under the leaf: the tool's own result when the record that
belongs to the call completed (``storage/ops/call_records.py``), else an
explicit interrupted one.

``turnkeeper audit`` and imports judge a whole tree (:func:`tree_faults`):
every entry, along the branch replay walks to it, on a cycle of parents
(which only a store written around the writes can hold) or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import Entry

from .replay import context_message, path_to

PI = "pi"
"""A pi ``toolCall`` block (answered by a ``toolResult`` message)."""
OPENAI = "openai"
"""An OpenAI chat ``tool_calls`` item (answered by a ``tool`` message)."""

INCOMPLETE_STOP_REASONS = frozenset({"aborted", "error"})
"""pi ``stopReason`` values of an incomplete assistant reply, whose calls need no result."""

REASONS = ("unpaired", "duplicate", "late", "cut", "unanswered")
"""Every ``reason`` a :class:`Fault` (and ``ToolCallPairingError``) carries."""


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call of an assistant message: its id, tool name and shape
    (:data:`PI` or :data:`OPENAI`)."""

    id: str
    name: str
    shape: str


@dataclass(frozen=True, slots=True)
class Fault:
    """One entry that breaks the rule, judged where it stands.

    ``entry_id`` is the entry whose write brings the fault: the result, the
    message that follows unanswered calls, or the compaction whose kept tail
    holds a fault. ``message_id`` is the message concerned: the same entry,
    or for a compaction the kept one (the result it cuts from its call, or
    the kept entry that is at fault). ``reason`` is one of :data:`REASONS`
    (a fault inside a compaction's kept tail is ``cut`` when it is a
    result's, else its own reason).
    """

    entry_id: str
    tool_call_id: str
    reason: str
    message_id: str


def calls_of(message: Mapping[str, Any]) -> list[Call]:
    """The tool calls an ``assistant`` message makes, in order, each id once."""
    if message.get("role") != "assistant":
        return []
    out: dict[str, Call] = {}
    content = message.get("content")
    for block in content if isinstance(content, list) else ():
        if (
            isinstance(block, Mapping)
            and block.get("type") == "toolCall"
            and isinstance(block.get("id"), str)
        ):
            name = block.get("name")
            call = Call(block["id"], name if isinstance(name, str) else "", PI)
            out.setdefault(block["id"], call)
    items = message.get("tool_calls")
    for item in items if isinstance(items, list) else ():
        if isinstance(item, Mapping) and isinstance(item.get("id"), str):
            function = item.get("function")
            name = function.get("name") if isinstance(function, Mapping) else None
            call = Call(item["id"], name if isinstance(name, str) else "", OPENAI)
            out.setdefault(item["id"], call)
    return list(out.values())


def answered_by(message: Mapping[str, Any]) -> str | None:
    """The call id a result message answers (``""`` when it names none), or
    ``None`` when the message is not a result."""
    role = message.get("role")
    if role == "toolResult":
        call_id = message.get("toolCallId")
    elif role == "tool":
        call_id = message.get("tool_call_id")
    else:
        return None
    return call_id if isinstance(call_id, str) else ""


def incomplete(message: Mapping[str, Any]) -> bool:
    """Whether an assistant message is an incomplete reply (pi ``stopReason``
    ``aborted`` or ``error``): its calls need no result."""
    return message.get("stopReason") in INCOMPLETE_STOP_REASONS


@dataclass(frozen=True, slots=True)
class Opening:
    """The calls that can still be answered at a point of a branch: those of the
    last assistant message (``holder``, its entry id) that have no result yet,
    in call order; ``optional``: that message is incomplete (its calls need
    none). ``leaf_id`` and ``next_seq`` name the point (a session row's head)."""

    leaf_id: str | None
    next_seq: int
    holder: str | None = None
    optional: bool = False
    calls: tuple[Call, ...] = ()


class Context:
    """The tool calls and results of a replayed context as it grows, judged by
    the rule (see the module docstring). Started from an :class:`Opening` it
    judges what follows that point exactly as long as nothing it adds is a
    fault; a fault's reason needs the whole branch (:func:`walk`)."""

    def __init__(self, opening: Opening | None = None) -> None:
        self.holder = None if opening is None else opening.holder
        self.optional = False if opening is None else opening.optional
        self.open: dict[str, Call] = {} if opening is None else {c.id: c for c in opening.calls}
        self.answered: set[str] = set()
        self.expired: set[str] = set()  # calls another message followed before their result
        self.lapsed: list[tuple[str, str | None]] = []
        """(call id, its assistant entry's id) of each call another message
        followed before it had a result (calls of incomplete replies left out)."""

    def add(self, entry: Entry) -> list[Fault]:
        """Add ``entry`` (the next on the branch); the faults it brings."""
        message = context_message(entry)
        if message is None:
            return []
        answers = answered_by(message)
        if answers is None:
            faults = []
            if not self.optional:
                faults = [Fault(entry.id, c, "unanswered", entry.id) for c in self.open]
                self.lapsed += [(c, self.holder) for c in self.open]
            self.expired.update(self.open)
            calls = calls_of(message)
            self.open = {c.id: c for c in calls}
            self.holder = entry.id if calls else None
            self.optional = bool(calls) and incomplete(message)
            for call in calls:
                self.answered.discard(call.id)
                self.expired.discard(call.id)
            return faults
        if answers in self.open:
            del self.open[answers]
            self.answered.add(answers)
            return []
        if answers in self.answered:
            reason = "duplicate"
        elif answers in self.expired:
            reason = "late"
        else:
            reason = "unpaired"
        return [Fault(entry.id, answers, reason, entry.id)]

    def opening(self, leaf_id: str | None, next_seq: int) -> Opening:
        """The calls open now, as an :class:`Opening` at ``leaf_id``/``next_seq``."""
        if not self.open:
            return Opening(leaf_id, next_seq)
        return Opening(leaf_id, next_seq, self.holder, self.optional, tuple(self.open.values()))


def walk(path: Sequence[Entry]) -> tuple[Context, list[Fault], int]:
    """Judge ``path`` (root → leaf) entry by entry in the context replay builds
    at each point. Returns the final context, every fault along the path, and
    where in that list the faults of the final context begin (at the last
    compaction, whose kept tail starts the context afresh)."""
    faults: list[Fault] = []
    context = Context()
    last_reset = 0
    for i, entry in enumerate(path):
        if entry.kind == EntryKind.COMPACTION:
            last_reset = len(faults)
            first_kept = entry.payload.get("firstKeptEntryId")
            start = next((k for k in range(i) if path[k].id == first_kept), i)
            context, kept_faults = restart(entry, path[start:i])
            faults += kept_faults
            continue
        faults += context.add(entry)
    return context, faults, last_reset


def restart(compaction: Entry, kept: Sequence[Entry]) -> tuple[Context, list[Fault]]:
    """The context a compaction starts (replay starts afresh from its kept tail,
    ``kept``: the branch from its ``firstKeptEntryId`` to its parent, or
    nothing when that id is not on its branch) and the faults of that tail,
    each the compaction's (``cut`` for a result's, else its own reason)."""
    context = Context()
    faults: list[Fault] = []
    for entry in kept:
        for fault in context.add(entry):
            reason = "unanswered" if fault.reason == "unanswered" else "cut"
            faults.append(Fault(compaction.id, fault.tool_call_id, reason, entry.id))
    return context, faults


def unanswered_calls(
    path: Sequence[Entry], children: Mapping[str, Sequence[Entry]] | None = None
) -> list[tuple[str, str | None]]:
    """``(call id, its assistant entry's id)`` of every call along ``path`` that
    has no result at its end: those another message followed first (calls of
    incomplete replies left out) and those still open, unless (with
    ``children``: the tree's entries by parent id) a branch on from the end
    answers them (:func:`answered_after`)."""
    context = walk(path)[0]
    still = list(context.open)
    if children is not None and path:
        still = [c for c in still if not answered_after(children, path[-1].id, c)]
    return [*context.lapsed, *((c, context.holder) for c in still)]


def answered_after(children: Mapping[str, Sequence[Entry]], start: str, call_id: str) -> bool:
    """Whether a branch on from entry ``start`` (``children``: a tree's entries by
    parent id) answers ``call_id``, open there, as the rule takes it: a result
    for it before any other message (entries that are no context message,
    and other results, in between)."""
    todo = list(children.get(start, ()))
    seen: set[str] = {start}
    while todo:
        entry = todo.pop()
        if entry.id in seen:
            continue
        seen.add(entry.id)
        message = context_message(entry)
        answers = None if message is None else answered_by(message)
        if answers == call_id:
            return True
        if message is None or answers is not None:
            todo.extend(children.get(entry.id, ()))
    return False


def path_faults(path: Sequence[Entry]) -> list[Fault]:
    """Every fault along ``path`` (root → leaf), each judged in the context
    replay builds where it stands."""
    return walk(path)[1]


def context_faults(path: Sequence[Entry]) -> list[Fault]:
    """The faults in the context replay builds at the end of ``path`` (those a
    later compaction cut away are not in it)."""
    _, faults, start = walk(path)
    return faults[start:]


def new_faults(path: Sequence[Entry], new: int) -> list[Fault]:
    """The faults the last ``new`` entries of ``path`` bring (the rest of the
    path was judged when it was written)."""
    if not path or new < 1:
        return []
    ids = {e.id for e in path[-new:]}
    return [f for f in path_faults(path) if f.entry_id in ids]


def tree_faults(entries: Mapping[str, Entry]) -> list[Fault]:
    """Every fault of a session tree (entries by id), each entry judged in the
    context replay builds at it: along the branch to each leaf (an entry no
    other names as its parent), as replay walks it, then along the branch to
    each entry no such walk reached (an entry on a cycle of parents, which
    has no leaf: replay walks it from wherever its leaf is set, to the entry
    that would come round again); each fault once, in the order found."""
    parents = {e.parent_id for e in entries.values()}
    seen: dict[Fault, None] = {}
    judged: set[str] = set()
    for start in [*(i for i in entries if i not in parents), *entries]:
        if start in judged:
            continue
        path = path_to(entries, start)
        judged.update(e.id for e in path)
        for fault in path_faults(path):
            seen.setdefault(fault, None)
    return list(seen)


def cycles(entries: Mapping[str, Entry]) -> list[list[str]]:
    """Every cycle of parents in a session tree (entries by id): the ids of each,
    each the parent of the one before (the last one's parent is the first)."""
    state: dict[str, int] = {}  # 1: on the walk now, 2: done
    found: list[list[str]] = []
    for start in entries:
        trail: list[str] = []
        node: str | None = start
        while node is not None and node in entries and node not in state:
            state[node] = 1
            trail.append(node)
            node = entries[node].parent_id
        if node is not None and state.get(node) == 1:
            found.append(trail[trail.index(node) :])
        for done in trail:
            state[done] = 2
    return found


def opening_of(path: Sequence[Entry], next_seq: int) -> Opening:
    """The calls open at the end of ``path`` (root → leaf), at ``next_seq``."""
    return walk(path)[0].opening(path[-1].id if path else None, next_seq)


def opening_from_tail(back: Iterable[Entry], leaf_id: str | None, next_seq: int) -> Opening | None:
    """The calls open at ``leaf_id``, judged from the branch read backwards from
    its leaf (``back``: the leaf, its parent …) only as far as it takes: to the
    last context message that is not a result (no call before it can be open
    there), or to the branch's first entry. ``None`` when a compaction comes
    first (the kept tail decides: judge the whole branch, :func:`opening_of`)."""
    tail: list[Entry] = []
    for entry in back:
        if entry.kind == EntryKind.COMPACTION:
            return None
        tail.append(entry)
        message = context_message(entry)
        if message is not None and answered_by(message) is None:
            break
    context = Context()
    for entry in reversed(tail):
        context.add(entry)
    return context.opening(leaf_id, next_seq)


def judge(opening: Opening, new: Sequence[Entry]) -> tuple[bool, Opening]:
    """Whether ``new`` (entries appended in order at ``opening``'s point, none a
    compaction) brings no fault, and the calls open after them. Exact when it
    says yes; a no is confirmed, and its reason found, over the whole branch
    (:func:`new_faults`)."""
    context = Context(opening)
    ok = True
    for entry in new:
        if context.add(entry):
            ok = False
    last = new[-1].id if new else opening.leaf_id
    return ok, context.opening(last, opening.next_seq + len(new))
