"""The write paths and ``turnkeeper audit`` judge tool-call pairing by one rule
(``storage/pairing.py``), so they agree exactly (issue 17 item 2).

For every case below, on both backends: the write through the API is refused
with a reason exactly when the same entry, stored with raw SQL past every
check, is flagged by the audit's ``tool_results_in_context`` with that
reason (and an accepted write leaves the audit passing). A Hypothesis
property drives random writes of every shape and compares each outcome with
the audit's judgement of the stored tree plus that entry; its control
patches the check out and is caught.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from conftest import forge, stored_payload
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky

import turnkeeper
from turnkeeper import EntryKind, NewEntry, ToolCallPairingError, ToolCallsUnansweredError
from turnkeeper.spec.records import Entry
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.ops import pairing_checks
from turnkeeper.storage.pairing import tree_faults

M = EntryKind.MESSAGE
USER = {"message": {"role": "user", "content": "go"}}
SAID = {"message": {"role": "assistant", "content": [{"type": "text", "text": "hm"}]}}


def call(*ids: str, stop: str = "toolUse") -> dict[str, Any]:
    blocks = [{"type": "toolCall", "id": i, "name": "ls", "arguments": {}} for i in ids]
    return {"message": {"role": "assistant", "content": blocks, "stopReason": stop}}


def result(call_id: str) -> dict[str, Any]:
    return {"message": {"role": "toolResult", "toolCallId": call_id, "content": []}}


def ocall(*ids: str) -> dict[str, Any]:
    items = [{"id": i, "type": "function", "function": {"name": "ls"}} for i in ids]
    return {"message": {"role": "assistant", "content": None, "tool_calls": items}}


def oresult(call_id: str) -> dict[str, Any]:
    return {"message": {"role": "tool", "tool_call_id": call_id, "content": "ok"}}


def compaction(first_kept: str) -> dict[str, Any]:
    return {"summary": "s", "firstKeptEntryId": first_kept, "tokensBefore": 1}


CUSTOM = {"customType": "note", "content": "an extension's message"}
SUMMARY = {"summary": "elsewhere", "fromId": "root"}

# name: (entries appended first, each (id, kind, payload); the write (kind, payload);
#        the refusal's (reason, message id, call id), or None: accepted)
CASES: dict[str, tuple[list[tuple[str, str, dict[str, Any]]], tuple[str, dict], Any]] = {
    "unpaired result": ([("u", M, USER)], (M, result("c9")), ("unpaired", "w", "c9")),
    "duplicate result": (
        [("a", M, call("c1")), ("r", M, result("c1"))],
        (M, result("c1")),
        ("duplicate", "w", "c1"),
    ),
    "late result": (
        [("a", M, call("c1", stop="aborted")), ("u", M, USER)],
        (M, result("c1")),
        ("late", "w", "c1"),
    ),
    "user after an open call": ([("a", M, call("c1"))], (M, USER), ("unanswered", "w", "c1")),
    "assistant after an open call": (
        [("a", M, call("c1", "c2")), ("r", M, result("c1"))],
        (M, SAID),
        ("unanswered", "w", "c2"),
    ),
    "custom message after an open call": (
        [("a", M, call("c1"))],
        (EntryKind.CUSTOM_MESSAGE, CUSTOM),
        ("unanswered", "w", "c1"),
    ),
    "branch summary after an open call": (
        [("a", M, call("c1"))],
        (EntryKind.BRANCH_SUMMARY, SUMMARY),
        ("unanswered", "w", "c1"),
    ),
    "compaction cutting a call from its result": (
        [("u", M, USER), ("a", M, call("c1")), ("r", M, result("c1")), ("s", M, SAID)],
        (EntryKind.COMPACTION, compaction("r")),
        ("cut", "r", "c1"),
    ),
    "openai result without its call": ([("u", M, USER)], (M, oresult("x")), ("unpaired", "w", "x")),
    "user after an open openai call": ([("a", M, ocall("x"))], (M, USER), ("unanswered", "w", "x")),
    "openai duplicate": (
        [("a", M, ocall("x")), ("r", M, oresult("x"))],
        (M, oresult("x")),
        ("duplicate", "w", "x"),
    ),
    "a result answering its call": ([("a", M, call("c1"))], (M, result("c1")), None),
    "an openai result answering its call": ([("a", M, ocall("x"))], (M, oresult("x")), None),
    "user after every result": (
        [("a", M, call("c1", "c2")), ("r", M, result("c2")), ("q", M, result("c1"))],
        (M, USER),
        None,
    ),
    "user after an aborted reply's call": (
        [("a", M, call("c1", stop="aborted"))],
        (M, USER),
        None,
    ),
    "a label under an open call": (
        [("a", M, call("c1"))],
        (EntryKind.LABEL, {"targetId": "a", "label": "x"}),
        None,
    ),
    "compaction keeping the call": (
        [("u", M, USER), ("a", M, call("c1")), ("r", M, result("c1"))],
        (EntryKind.COMPACTION, compaction("a")),
        None,
    ),
    "compaction under an open call": (
        [("u", M, USER), ("a", M, call("c1"))],
        (EntryKind.COMPACTION, compaction("a")),
        None,
    ),
}


def _setup(store: turnkeeper.BaseStore, sid: str, entries: list[tuple[str, str, dict]]) -> None:
    store.sessions.create(sid)
    for entry_id, kind, payload in entries:
        store.sessions.append(sid, kind, payload, entry_id=f"{sid}-{entry_id}")


def _ids(sid: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with the case's entry ids spelled as stored (``<sid>-<id>``)."""
    out = dict(payload)
    for key in ("targetId", "firstKeptEntryId"):
        if key in out:
            out[key] = f"{sid}-{out[key]}"
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_write_is_refused_exactly_when_the_audit_flags_what_it_would_store(store, case):
    setup, (kind, payload), refused = CASES[case]
    _setup(store, "api", setup)
    before = store.sessions.entries("api")
    try:
        store.sessions.append("api", kind, _ids("api", payload), entry_id="api-w")
    except ToolCallPairingError as exc:
        got = (exc.reason, exc.entry_id, exc.tool_call_id)
        assert store.sessions.entries("api") == before  # nothing written
    else:
        got = None
    want = None if refused is None else (refused[0], f"api-{refused[1]}", refused[2])
    assert got == want
    # the same entry stored past every check: the audit flags exactly that
    _setup(store, "raw", setup)
    leaf = store.sessions.get("raw").leaf_id
    seq = store.sessions.get("raw").next_seq
    forge(
        store,
        "INSERT INTO entries (session_id, id, parent_id, kind, seq, ts, payload, lease_epoch, "
        "written_at) VALUES ('raw', 'raw-w', ?, ?, ?, now(), ?, NULL, now())",
        [leaf, kind, seq, stored_payload(store, "raw", "raw-w", json.dumps(_ids("raw", payload)))],
        rows=1,
    )
    forge(
        store,
        "UPDATE sessions SET leaf_id = 'raw-w', next_seq = next_seq + 1 WHERE id = 'raw'",
        rows=1,
    )
    check = {c.name: c for c in run_audit(store, ["raw"])}["tool_results_in_context"]
    if refused is None:
        assert check.passed, check.detail
    else:
        reason, message, call_id = refused
        assert check.violations == 1, check.detail
        assert check.detail.startswith(f"raw/raw-{message}: {reason} {call_id!r}"), check.detail


# -- the property: every write's outcome is the audit's judgement -------------------------------

CALL_IDS = st.sampled_from(["a", "b", "c"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.lists(CALL_IDS, min_size=1, max_size=2, unique=True)),
        st.tuples(st.just("aborted"), st.lists(CALL_IDS, min_size=1, max_size=2, unique=True)),
        st.tuples(st.just("ocall"), st.lists(CALL_IDS, min_size=1, max_size=2, unique=True)),
        st.tuples(st.just("result"), CALL_IDS),
        st.tuples(st.just("oresult"), CALL_IDS),
        st.tuples(st.just("user"), st.none()),
        st.tuples(st.just("custom"), st.none()),
        st.tuples(st.just("label"), st.integers(0, 30)),
        st.tuples(st.just("compact"), st.integers(0, 30)),
        st.tuples(st.just("branch"), st.integers(0, 30)),
        st.tuples(st.just("summary"), st.integers(0, 30)),
        st.tuples(st.just("batch"), st.lists(CALL_IDS, min_size=1, max_size=2)),
    ),
    max_size=25,
)


def _payloads(op: str, arg: Any, ids: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """The entries an op appends under the leaf (kind, payload)."""
    if op in ("call", "aborted"):
        return [(M, call(*arg, stop="aborted" if op == "aborted" else "toolUse"))]
    if op == "ocall":
        return [(M, ocall(*arg))]
    if op == "result":
        return [(M, result(arg))]
    if op == "oresult":
        return [(M, oresult(arg))]
    if op == "user":
        return [(M, USER)]
    if op == "custom":
        return [(EntryKind.CUSTOM_MESSAGE, CUSTOM)]
    if op == "label":
        return [(EntryKind.LABEL, {"targetId": ids[arg % len(ids)]})] if ids else []
    if op == "compact":
        return [(EntryKind.COMPACTION, compaction(ids[arg % len(ids)]))] if ids else []
    if op == "batch":  # results, then a user message: one refused entry refuses all
        return [*((M, result(c)) for c in arg), (M, USER)]
    return []


def _judged(stored: list[Entry], parent: str | None, new: list[tuple[str, str, dict]]) -> set:
    """The audit's judgement of the stored tree with ``new`` (id, kind, payload)
    chained under ``parent``: the faults it would flag that it does not now."""
    tree = {e.id: e for e in stored}
    before = set(tree_faults(tree))
    for n, (entry_id, kind, payload) in enumerate(new):
        tree[entry_id] = Entry(
            "s", entry_id, parent, kind, 10_000 + n, stored[0].timestamp, payload
        )
        parent = entry_id
    return set(tree_faults(tree)) - before


def drive(ops: list[tuple[str, Any]]) -> None:
    """Apply ``ops`` through the API; each write is refused exactly when the
    audit would flag what it writes, and the stored tree stays valid."""
    with turnkeeper.open_store(":memory:") as store:
        store.sessions.create("s")
        store.sessions.append("s", M, USER, entry_id="root")
        for n, (op, arg) in enumerate(ops):
            stored = store.sessions.entries("s")
            ids = [e.id for e in stored]
            if op == "branch":
                store.sessions.branch("s", ids[arg % len(ids)])
                continue
            leaf = store.sessions.get("s").leaf_id
            if op == "summary":
                target = ids[arg % len(ids)]
                new = [(f"e{n}", EntryKind.BRANCH_SUMMARY, {**SUMMARY, "fromId": leaf})]
                faults = _judged(stored, target, new)
                write: Any = functools.partial(
                    store.sessions.branch_with_summary, "s", target, "elsewhere"
                )
            else:
                items = _payloads(op, arg, ids)
                if not items:
                    continue
                new = [(f"e{n}.{k}", kind, p) for k, (kind, p) in enumerate(items)]
                faults = _judged(stored, leaf, new)
                batch = [NewEntry(kind, p, entry_id=i) for i, kind, p in new]
                write = functools.partial(store.sessions.append_many, "s", batch)
            try:
                write()
            except ToolCallPairingError as exc:
                reasons = {f.reason for f in faults}
                assert faults and exc.reason in reasons, (op, arg, exc, faults)
                if isinstance(exc, ToolCallsUnansweredError):
                    assert set(exc.tool_call_ids) <= {f.tool_call_id for f in faults}
            else:
                assert not faults, (op, arg, faults)
            assert tree_faults({e.id: e for e in store.sessions.entries("s")}) == []


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_every_write_agrees_with_the_audit_and_every_reachable_tree_is_valid(ops):
    drive(ops)


def test_control_without_the_check_the_property_fails(monkeypatch):
    """Control for the property above: with the refusal patched out (the one
    place every write path raises a pairing fault), Hypothesis finds a write
    the audit flags."""
    monkeypatch.setattr(pairing_checks, "refuse", lambda session_id, faults: None)

    @settings(max_examples=200, deadline=None, database=None)
    @given(ops=OPS)
    @example(ops=[("call", ["a"]), ("user", None)])  # the example: replayed first
    def prop(ops):
        drive(ops)

    with pytest.raises((AssertionError, Flaky)):
        prop()
