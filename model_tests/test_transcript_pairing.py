"""The context replay hands to a model provider stays valid: every ``toolResult``
answers a ``toolCall`` in it, once, and no compaction cuts a call from its result.

Writes through the API that would break this are refused
(``ToolCallPairingError``) and write nothing; the store's own interrupted
results go only where a call is open; imports store what the file says, and
the audit reports every unpaired result and every cut that splits a pair.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky

import turnkeeper
from turnkeeper import EntryKind, ToolCallPairingError
from turnkeeper.cli.audit import run_audit
from turnkeeper.formats import pi
from turnkeeper.storage.ops import sessions as ops_sessions
from turnkeeper.storage.replay import context_faults, path_to

ZIG = "pi-mono-zig_v3_2026-05-17T13-51-26-739Z_019e3634-be13-7330-a2a4-ffab205872d1.jsonl"
USER = {"role": "user", "content": "go"}


def call(*ids: str) -> dict:
    blocks = [{"type": "toolCall", "id": i, "name": "bash", "arguments": {}} for i in ids]
    return {"message": {"role": "assistant", "content": blocks, "stopReason": "toolUse"}}


def result(call_id: str) -> dict:
    return {"message": {"role": "toolResult", "toolCallId": call_id, "content": []}}


def roles(store, sid: str = "s") -> list[str]:
    return [m["role"] for m in store.replay(sid).messages]


def current_faults(store, sid: str = "s") -> list:
    by_id = {e.id: e for e in store.entries(sid)}
    return context_faults(path_to(by_id, store.get_session(sid).leaf_id))


def test_issue_example_a_result_for_a_call_no_turn_holds_is_refused(store):
    store.create_session("s")
    run = store.admit_run("s", {"q": 1}, user_message=USER)
    store.start_run(run.id)
    before = store.entries("s")
    with pytest.raises(ToolCallPairingError) as err:
        store.append("s", EntryKind.MESSAGE, result("call-9"))
    assert (err.value.session_id, err.value.tool_call_id, err.value.reason) == (
        "s",
        "call-9",
        "unpaired",
    )
    assert store.entries("s") == before
    store.finish_run(run.id, "succeeded", assistant_message={"role": "assistant", "content": []})
    assert roles(store) == ["user", "assistant"]
    assert all(c.passed for c in run_audit(store))


def test_a_second_result_for_an_answered_call_is_refused(store):
    store.create_session("s")
    store.append("s", EntryKind.MESSAGE, call("c1"))
    store.append("s", EntryKind.MESSAGE, result("c1"))
    with pytest.raises(ToolCallPairingError) as err:
        store.append("s", EntryKind.MESSAGE, result("c1"))
    assert err.value.reason == "duplicate"
    # issue 17 item 9: the message says what happened (it said "without its toolCall")
    assert "answers tool call 'c1' a second time" in str(err.value)
    assert "without its toolCall" not in str(err.value)


@pytest.mark.parametrize(
    "reason, says",
    [
        ("unpaired", "which no tool call in the replayed context makes"),
        ("duplicate", "a second time"),
        ("late", "too late: other messages followed the call"),
        ("cut", "would keep toolResult 'r' but cut off its tool call 'c'"),
    ],
)
def test_each_pairing_refusal_says_what_it_refuses(reason, says):
    import pickle

    err = ToolCallPairingError("s", "r", "c", reason)
    assert says in str(err) and f"reason={reason!r}" in str(err)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_a_call_id_reused_in_a_later_turn_is_answered_again(store):
    store.create_session("s")
    for _ in range(2):
        store.append("s", EntryKind.MESSAGE, call("call_0"))
        store.append("s", EntryKind.MESSAGE, result("call_0"))
    assert roles(store) == ["assistant", "toolResult", "assistant", "toolResult"]


def test_a_result_for_a_call_left_on_another_branch_is_refused(store):
    """pi's orphan: the leaf moved while the tool ran; its result would land
    on a branch without the call (corpus FORMATS, tool_use on different branches)."""
    store.create_session("s")
    root = store.append("s", EntryKind.MESSAGE, {"message": USER})
    store.append("s", EntryKind.MESSAGE, call("c1"))
    store.branch_with_summary("s", root.id, "went elsewhere")
    with pytest.raises(ToolCallPairingError) as err:
        store.append("s", EntryKind.MESSAGE, result("c1"))
    assert err.value.reason == "unpaired"
    assert current_faults(store) == []


def test_issue_example_a_compaction_that_cuts_a_call_from_its_result_is_refused(store):
    store.create_session("s")
    store.append("s", EntryKind.MESSAGE, {"message": USER})
    assistant = store.append("s", EntryKind.MESSAGE, call("c1"))
    answer = store.append("s", EntryKind.MESSAGE, result("c1"))
    store.append("s", EntryKind.MESSAGE, {"message": {"role": "assistant", "content": []}})
    before = store.entries("s")
    with pytest.raises(ToolCallPairingError) as err:
        store.append("s", EntryKind.COMPACTION, {"summary": "sum", "firstKeptEntryId": answer.id})
    assert (err.value.entry_id, err.value.tool_call_id, err.value.reason) == (
        answer.id,
        "c1",
        "cut",
    )
    assert store.entries("s") == before
    store.append("s", EntryKind.COMPACTION, {"summary": "sum", "firstKeptEntryId": assistant.id})
    assert roles(store) == ["compactionSummary", "assistant", "toolResult", "assistant"]


def test_a_result_after_a_compaction_that_dropped_its_call_is_refused(store):
    store.create_session("s")
    store.append("s", EntryKind.MESSAGE, call("c1"))
    kept = store.append("s", EntryKind.MESSAGE, {"message": USER})
    store.append("s", EntryKind.COMPACTION, {"summary": "sum", "firstKeptEntryId": kept.id})
    with pytest.raises(ToolCallPairingError):
        store.append("s", EntryKind.MESSAGE, result("c1"))


def test_interrupting_a_call_that_never_reached_the_transcript_adds_no_orphan(store):
    store.create_session("s")
    store.claim_tool_execution(
        "k", "s", local_turn_id="t", provider_call_id="c1", tool_name="x", side_effecting=True
    )
    (rec,) = store.interrupt_tool_executions("s")
    assert rec.state == "interrupted"
    assert store.entries("s") == []


def test_ending_a_run_after_its_call_was_branched_away_adds_no_orphan(store):
    """close_turn pairs the calls open in the context, not every call of the turn."""
    store.create_session("s")
    run = store.admit_run("s", {"q": 1}, user_message=USER)
    store.start_run(run.id)
    user = store.entry("s", f"{run.id}:user")
    store.append("s", EntryKind.MESSAGE, call("c1"))
    store.branch_with_summary("s", user.id, "dropped the tool call")
    store.finish_run(run.id, "failed", error="gave up")
    assert current_faults(store) == []
    assert roles(store) == ["user", "branchSummary"]
    assert all(c.passed for c in run_audit(store, ["s"]))


def test_ending_a_run_pairs_its_open_call_with_an_explicit_interrupted_result(store):
    store.create_session("s")
    run = store.admit_run("s", {"q": 1}, user_message=USER)
    store.start_run(run.id)
    store.append("s", EntryKind.MESSAGE, call("c1", "c2"))
    store.append("s", EntryKind.MESSAGE, result("c1"))
    store.finish_run(run.id, "interrupted")
    assert roles(store) == ["user", "assistant", "toolResult", "toolResult"]
    assert store.replay("s").messages[-1]["toolCallId"] == "c2"
    assert current_faults(store) == []


# -- imports: stored as the file says; the audit reports it; a fork refuses it --------------


def _broken_import(pi_dir: Path):
    """The real zig session with the first assistant tool call removed (its child
    re-parented onto its parent): that call's result is now unpaired."""
    batch = pi.parse_file(pi_dir / ZIG).batch
    doomed = next(
        e
        for e in batch.entries
        if e.kind == "message"
        and e.payload["message"].get("role") == "assistant"
        and any(
            isinstance(b, dict) and b.get("type") == "toolCall"
            for b in e.payload["message"].get("content", [])
        )
    )
    entries = [
        replace(e, parent_id=doomed.parent_id) if e.parent_id == doomed.id else e
        for e in batch.entries
        if e is not doomed
    ]
    return replace(batch, entries=entries)


def test_real_corpus_files_have_valid_pairing(store, pi_dir):
    for path in sorted(pi_dir.glob("*.jsonl")):
        pi.import_file(store, path)
    checks = {c.name: c for c in run_audit(store)}
    assert checks["tool_results_in_context"].passed
    assert checks["tool_results_in_context"].checked > 0


def test_an_import_keeps_an_unpaired_result_and_the_audit_reports_it(store, pi_dir):
    batch = _broken_import(pi_dir)
    store.import_batch(batch)
    assert len(store.entries(batch.session_id)) == len(batch.entries)
    check = {c.name: c for c in run_audit(store)}["tool_results_in_context"]
    assert not check.passed
    assert check.violations >= 1 and "unpaired" in check.detail


def test_a_fork_never_copies_a_broken_pairing(store, pi_dir):
    batch = _broken_import(pi_dir)
    store.import_batch(batch)
    sid = batch.session_id
    run = store.admit_run(sid, {"q": 1}, user_message=USER)
    store.start_run(run.id)
    store.finish_run(run.id, "succeeded", assistant_message={"role": "assistant", "content": []})
    with pytest.raises(turnkeeper.ForkUnsupportedEntryError):
        store.fork_session(sid, request_id="f")
    assert store.get_fork("f") is None


# -- the property, and its control ----------------------------------------------------------

CALL_IDS = st.sampled_from(["a", "b", "c"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.lists(CALL_IDS, min_size=1, max_size=2, unique=True)),
        st.tuples(st.just("result"), CALL_IDS),
        st.tuples(st.just("user"), st.none()),
        st.tuples(st.just("compact"), st.integers(0, 30)),
        st.tuples(st.just("branch"), st.integers(0, 30)),
    ),
    max_size=25,
)


def _drive(tmp_path: Path, ops) -> list:
    """Apply ``ops`` through the API (refusals ignored); the faults of the
    current context after every accepted write."""
    seen: list = []
    with turnkeeper.open_store(":memory:") as store:
        store.create_session("s")
        for op, arg in ops:
            ids = [e.id for e in store.entries("s")]
            try:
                if op == "call":
                    store.append("s", EntryKind.MESSAGE, call(*arg))
                elif op == "result":
                    store.append("s", EntryKind.MESSAGE, result(arg))
                elif op == "user":
                    store.append("s", EntryKind.MESSAGE, {"message": USER})
                elif op == "compact" and ids:
                    kept = ids[arg % len(ids)]
                    store.append(
                        "s", EntryKind.COMPACTION, {"summary": "s", "firstKeptEntryId": kept}
                    )
                elif op == "branch" and ids:
                    store.branch("s", ids[arg % len(ids)])
            except ToolCallPairingError:
                continue
            seen += current_faults(store)
    return seen


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_every_context_the_api_can_reach_is_valid(tmp_path_factory, ops):
    assert _drive(tmp_path_factory.getbasetemp(), ops) == []


def test_control_without_the_pairing_check_the_property_fails(tmp_path, monkeypatch):
    """Control for the property above: with the append-time check patched out,
    Hypothesis finds a context with a broken pairing."""
    monkeypatch.setattr(ops_sessions, "new_pairing_faults", lambda path, new=1: [])

    @settings(max_examples=200, deadline=None, database=None)
    @given(ops=OPS)
    def prop(ops):
        assert _drive(tmp_path, ops) == []

    with pytest.raises((AssertionError, Flaky)):
        prop()


@pytest.mark.parametrize(
    "between",
    [
        {"message": USER},
        {"message": {"role": "assistant", "content": [{"type": "text", "text": "hm"}]}},
        {"customType": "note", "content": "an extension's message"},
    ],
    ids=["user", "assistant", "custom-message"],
)
def test_a_result_after_another_message_followed_its_call_is_late(store, between):
    """A provider takes a call's results only right after the assistant message
    that made it: call → user message → result is refused."""
    store.create_session("s")
    store.append("s", EntryKind.MESSAGE, call("c1", "c2"))
    store.append("s", EntryKind.MESSAGE, result("c1"))
    kind = EntryKind.CUSTOM_MESSAGE if "customType" in between else EntryKind.MESSAGE
    store.append("s", kind, between)
    with pytest.raises(ToolCallPairingError) as err:
        store.append("s", EntryKind.MESSAGE, result("c2"))
    assert (err.value.tool_call_id, err.value.reason) == ("c2", "late")


def test_entries_outside_the_context_keep_a_call_answerable(store):
    """Labels, titles, settings changes and turn boundaries are not messages."""
    store.create_session("s")
    assistant = store.append("s", EntryKind.MESSAGE, call("c1"))
    store.set_label("s", assistant.id, "x")
    store.set_title("s", "t")
    store.append("s", EntryKind.MODEL_CHANGE, {"provider": "p", "modelId": "m"})
    store.append("s", EntryKind.MESSAGE, result("c1"))
    assert roles(store) == ["assistant", "toolResult"]


def test_a_run_cannot_admit_or_end_with_a_tool_result(store):
    """Every API write path keeps the pairing: admission's user message is a user
    message and termination's reply an assistant message."""
    store.create_session("s")
    stray = {"role": "toolResult", "toolCallId": "zz", "toolName": "x", "content": []}
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        store.admit_run("s", {"x": 1}, user_message=stray)
    assert err.value.field == "user_message.role"
    run = store.admit_run("s", {"x": 1}, user_message=USER)
    store.start_run(run.id)
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        store.finish_run(run.id, "succeeded", assistant_message=stray)
    assert err.value.field == "assistant_message.role"
    assert roles(store) == ["user"]
