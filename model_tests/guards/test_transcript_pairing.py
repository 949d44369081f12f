"""The context replay hands to a model provider stays valid (``storage/pairing.py``
states the rule): every tool call is answered once, right after the assistant
message that made it and before any other message, in pi's shapes and in
OpenAI's, and no compaction keeps a fault.

Every write path refuses what would break it (``ToolCallPairingError``,
``ToolCallsUnansweredError``) and writes nothing; the store's own results go
only where a call is open, in the call's shape; ``turnkeeper audit`` flags
exactly the stored states the writes refuse (the agreement tests below
forge each one with raw SQL).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import forge, stored_payload

import turnkeeper
from turnkeeper import EntryKind, ToolCallPairingError, ToolCallsUnansweredError
from turnkeeper.formats import pi
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.ops import entry_rows, pairing_checks
from turnkeeper.storage.pairing import REASONS, context_faults
from turnkeeper.storage.replay import path_to

ZIG = "pi-mono-zig_v3_2026-05-17T13-51-26-739Z_019e3634-be13-7330-a2a4-ffab205872d1.jsonl"
USER = {"role": "user", "content": "go"}


def call(*ids: str) -> dict:
    blocks = [{"type": "toolCall", "id": i, "name": "bash", "arguments": {}} for i in ids]
    return {"message": {"role": "assistant", "content": blocks, "stopReason": "toolUse"}}


def result(call_id: str) -> dict:
    return {"message": {"role": "toolResult", "toolCallId": call_id, "content": []}}


def roles(store, sid: str = "s") -> list[str]:
    return [m["role"] for m in store.sessions.replay(sid).messages]


def current_faults(store, sid: str = "s") -> list:
    by_id = {e.id: e for e in store.sessions.entries(sid)}
    return context_faults(path_to(by_id, store.sessions.get(sid).leaf_id))


def test_issue_example_a_result_for_a_call_no_turn_holds_is_refused(store):
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    before = store.sessions.entries("s")
    with pytest.raises(ToolCallPairingError) as err:
        store.sessions.append("s", EntryKind.MESSAGE, result("call-9"))
    assert (err.value.session_id, err.value.tool_call_id, err.value.reason) == (
        "s",
        "call-9",
        "unpaired",
    )
    assert store.sessions.entries("s") == before
    store.runs.finish(run.id, "succeeded", assistant_message={"role": "assistant", "content": []})
    assert roles(store) == ["user", "assistant"]
    assert all(c.passed for c in run_audit(store))


def test_a_second_result_for_an_answered_call_is_refused(store):
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, call("c1"))
    store.sessions.append("s", EntryKind.MESSAGE, result("c1"))
    with pytest.raises(ToolCallPairingError) as err:
        store.sessions.append("s", EntryKind.MESSAGE, result("c1"))
    assert err.value.reason == "duplicate"
    # issue 17 item 9: the message says what happened (it said "without its toolCall")
    assert "answers tool call 'c1' a second time" in str(err.value)
    assert "without its toolCall" not in str(err.value)


SAYS = [
    ("unpaired", "which no tool call in the replayed context makes"),
    ("duplicate", "a second time"),
    ("late", "too late: other messages followed the call"),
    ("cut", "would keep toolResult 'r' but cut off its tool call 'c'"),
]


def test_every_reason_of_the_rule_has_its_message():
    assert [r for r, _ in SAYS] + ["unanswered"] == list(REASONS)


@pytest.mark.parametrize("reason, says", SAYS)
def test_each_pairing_refusal_says_what_it_refuses(reason, says):
    import pickle

    err = ToolCallPairingError("s", "r", "c", reason)
    assert says in str(err) and f"reason={reason!r}" in str(err)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_a_call_id_reused_in_a_later_turn_is_answered_again(store):
    store.sessions.create("s")
    for _ in range(2):
        store.sessions.append("s", EntryKind.MESSAGE, call("call_0"))
        store.sessions.append("s", EntryKind.MESSAGE, result("call_0"))
    assert roles(store) == ["assistant", "toolResult", "assistant", "toolResult"]


def test_a_result_for_a_call_left_on_another_branch_is_refused(store):
    """pi's orphan: the leaf moved while the tool ran; its result would land
    on a branch without the call (corpus FORMATS, tool_use on different branches)."""
    store.sessions.create("s")
    root = store.sessions.append("s", EntryKind.MESSAGE, {"message": USER})
    store.sessions.append("s", EntryKind.MESSAGE, call("c1"))
    store.sessions.branch_with_summary("s", root.id, "went elsewhere")
    with pytest.raises(ToolCallPairingError) as err:
        store.sessions.append("s", EntryKind.MESSAGE, result("c1"))
    assert err.value.reason == "unpaired"
    assert current_faults(store) == []


def test_issue_example_a_compaction_that_cuts_a_call_from_its_result_is_refused(store):
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, {"message": USER})
    assistant = store.sessions.append("s", EntryKind.MESSAGE, call("c1"))
    answer = store.sessions.append("s", EntryKind.MESSAGE, result("c1"))
    store.sessions.append("s", EntryKind.MESSAGE, {"message": {"role": "assistant", "content": []}})
    before = store.sessions.entries("s")
    with pytest.raises(ToolCallPairingError) as err:
        store.sessions.append(
            "s", EntryKind.COMPACTION, {"summary": "sum", "firstKeptEntryId": answer.id}
        )
    assert (err.value.entry_id, err.value.tool_call_id, err.value.reason) == (
        answer.id,
        "c1",
        "cut",
    )
    assert store.sessions.entries("s") == before
    store.sessions.append(
        "s", EntryKind.COMPACTION, {"summary": "sum", "firstKeptEntryId": assistant.id}
    )
    assert roles(store) == ["compactionSummary", "assistant", "toolResult", "assistant"]


def test_a_result_after_a_compaction_that_dropped_its_call_is_refused(store):
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, call("c1"))
    store.sessions.append(
        "s", EntryKind.COMPACTION, {"summary": "sum", "firstKeptEntryId": "nowhere"}
    )
    with pytest.raises(ToolCallPairingError) as err:
        store.sessions.append("s", EntryKind.MESSAGE, result("c1"))
    assert err.value.reason == "unpaired"


def test_interrupting_a_call_that_never_reached_the_transcript_adds_no_orphan(store):
    store.sessions.create("s")
    store.tools.claim(
        "k", "s", local_turn_id="t", provider_call_id="c1", tool_name="x", side_effecting=True
    )
    (rec,) = store.tools.interrupt("s")
    assert rec.state == "interrupted"
    assert store.sessions.entries("s") == []


def test_ending_a_run_after_its_call_was_branched_away_adds_no_orphan(store):
    """close_turn pairs the calls open in the context, not every call of the turn."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    user = store.sessions.entry("s", f"{run.id}:user")
    store.sessions.append("s", EntryKind.MESSAGE, call("c1"))
    store.sessions.branch_with_summary("s", user.id, "dropped the tool call")
    store.runs.finish(run.id, "failed", error="gave up")
    assert current_faults(store) == []
    assert roles(store) == ["user", "branchSummary"]
    assert all(c.passed for c in run_audit(store, ["s"]))


def test_ending_a_run_pairs_its_open_call_with_an_explicit_interrupted_result(store):
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    store.sessions.append("s", EntryKind.MESSAGE, call("c1", "c2"))
    store.sessions.append("s", EntryKind.MESSAGE, result("c1"))
    store.runs.finish(run.id, "interrupted")
    assert roles(store) == ["user", "assistant", "toolResult", "toolResult"]
    assert store.sessions.replay("s").messages[-1]["toolCallId"] == "c2"
    assert current_faults(store) == []


# -- imports and forks: the same rule ---------------------------------------------------------


def _broken_batch(pi_dir: Path):
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
    return replace(batch, entries=entries), doomed


def forge_entry(store, sid: str, entry_id: str, parent: str | None, kind: str, payload: dict):
    """Store an entry under ``parent`` with raw SQL, past every check of the
    store, and make it the session's leaf."""
    seq = store.sessions.get(sid).next_seq
    forge(
        store,
        "INSERT INTO entries (session_id, id, parent_id, kind, seq, ts, payload, lease_epoch, "
        "written_at) VALUES (?, ?, ?, ?, ?, now(), ?, NULL, now())",
        [
            sid,
            entry_id,
            parent,
            kind,
            seq,
            stored_payload(store, sid, entry_id, json.dumps(payload)),
        ],
        rows=1,
    )
    forge(
        store,
        "UPDATE sessions SET leaf_id = ?, next_seq = next_seq + 1, entry_count = entry_count + 1 "
        "WHERE id = ?",
        [entry_id, sid],
        rows=1,
    )


def test_real_corpus_files_have_valid_pairing(store, pi_dir):
    for path in sorted(pi_dir.glob("*.jsonl")):
        pi.import_file(store, path)
    checks = {c.name: c for c in run_audit(store)}
    assert checks["tool_results_in_context"].passed
    assert checks["tool_results_in_context"].checked > 0


def test_an_import_that_breaks_the_pairing_is_refused_and_writes_nothing(store, pi_dir):
    """Imports keep the rule too (issue 17 item 2: they stored what the file
    said, and the context replay built from it was one a provider rejects)."""
    batch, _ = _broken_batch(pi_dir)
    with pytest.raises(ToolCallPairingError) as err:
        store.sessions.import_batch(batch)
    assert (err.value.session_id, err.value.reason) == (batch.session_id, "unpaired")
    assert store.sessions.get(batch.session_id) is None
    whole = pi.parse_file(pi_dir / ZIG).batch
    store.sessions.import_batch(whole)  # the real file goes in


def test_an_import_that_adds_a_lapsing_message_to_a_session_is_refused(store):
    """A grown file's new entries are judged in the tree they join."""
    from turnkeeper.spec.records import ImportBatch, ImportEntry

    at = datetime(2026, 1, 1, tzinfo=UTC)

    def batch(*entries):
        return ImportBatch("imp", "/w", at, {}, tuple(entries), entries[-1].id)

    first = [
        ImportEntry("e1", None, "message", at, {"message": {"role": "user", "content": "go"}}),
        ImportEntry("e2", "e1", "message", at, call("c1")),
    ]
    store.sessions.import_batch(batch(*first))  # a call still open at the leaf: valid
    lapsing = ImportEntry("e3", "e2", "message", at, {"message": USER})
    before = store.sessions.entries("imp")
    with pytest.raises(ToolCallsUnansweredError) as err:
        store.sessions.import_batch(batch(*first, lapsing))
    assert (err.value.entry_id, err.value.tool_call_ids) == ("e3", ("c1",))
    assert store.sessions.entries("imp") == before
    answered = ImportEntry("e3", "e2", "message", at, result("c1"))
    assert store.sessions.import_batch(batch(*first, answered)).added == 1


def test_a_fork_never_copies_a_broken_pairing(store):
    """A source whose stored tree breaks the rule (forged: the store refuses to
    write it) cannot be forked: the copy would replay it."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, start=True)
    store.sessions.append("s", EntryKind.MESSAGE, call("c1"))
    leaf = store.sessions.get("s").leaf_id
    forge_entry(store, "s", "forged", leaf, "message", {"message": USER})  # lapses c1
    store.runs.finish(run.id, "succeeded", assistant_message={"role": "assistant", "content": []})
    with pytest.raises(turnkeeper.ForkUnsupportedEntryError) as err:
        store.forks.fork("s", request_id="f")
    assert err.value.entry_id == "forged" and "unanswered" in str(err.value)
    assert store.forks.get("f") is None


# -- the issue's example: a message while a call waits for its result ------------------------


def test_issue_example_a_message_while_a_call_is_unanswered_is_refused(store):
    """Issue 17 item 2: a run's assistant message holds toolCall c1; a user
    message appended before c1's result was accepted, and the audit then failed
    tool_calls_paired. Now that message is refused, naming the session and the
    open calls, and nothing is written; the run goes on and ends valid."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 60, purpose="execution")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease, start=True)
    key = f"{run.id}:c1"
    store.tools.claim(
        key, "s", local_turn_id=run.turn_id, provider_call_id="c1", tool_name="bash",
        side_effecting=False, run_id=run.id, lease=lease,
    )  # fmt: skip
    store.sessions.append("s", EntryKind.MESSAGE, call("c1", "c2"), lease=lease)
    before = store.sessions.entries("s")
    with pytest.raises(ToolCallsUnansweredError) as err:
        store.sessions.append(
            "s", EntryKind.MESSAGE, {"message": {"role": "user", "content": "stop"}}, lease=lease
        )
    assert (err.value.session_id, err.value.tool_call_ids) == ("s", ("c1", "c2"))
    assert (err.value.tool_call_id, err.value.reason) == ("c1", "unanswered")
    assert isinstance(err.value, ToolCallPairingError)
    assert "would follow tool calls that have no result yet ('c1', 'c2')" in str(err.value)
    assert store.sessions.entries("s") == before
    store.tools.complete(key, "ok", lease=lease)
    store.runs.finish(
        run.id, "succeeded", assistant_message={"role": "assistant", "content": "done"}, lease=lease
    )
    replayed = store.sessions.replay("s").messages
    assert [m["role"] for m in replayed] == [
        "user",
        "assistant",
        "toolResult",
        "toolResult",
        "assistant",
    ]
    assert [m.get("toolCallId") for m in replayed[2:4]] == ["c1", "c2"]
    assert replayed[2]["content"] == [{"type": "text", "text": "ok"}]  # c1's own result
    assert all(c.passed for c in run_audit(store))


@pytest.mark.parametrize(
    "between",
    [
        (EntryKind.MESSAGE, {"message": USER}),
        (
            EntryKind.MESSAGE,
            {"message": {"role": "assistant", "content": [{"type": "text", "text": "hm"}]}},
        ),
        (EntryKind.MESSAGE, call("c9")),
        (EntryKind.MESSAGE, {"message": {"role": "system", "content": "a role no rule names"}}),
        (EntryKind.CUSTOM_MESSAGE, {"customType": "note", "content": "an extension's message"}),
    ],
    ids=["user", "assistant", "assistant-calling", "unknown-role", "custom-message"],
)
def test_no_other_message_may_follow_calls_before_their_results(store, between):
    """A provider takes a call's results only right after the assistant message
    that made it: call → any other message is refused while a call is open."""
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, call("c1", "c2"))
    store.sessions.append("s", EntryKind.MESSAGE, result("c1"))
    with pytest.raises(ToolCallsUnansweredError) as err:
        store.sessions.append("s", *between)
    assert err.value.tool_call_ids == ("c2",)
    store.sessions.append("s", EntryKind.MESSAGE, result("c2"))
    store.sessions.append("s", *between)


@pytest.mark.parametrize("stop", ["aborted", "error"])
def test_an_incomplete_replys_calls_need_no_result(store, stop):
    """pi leaves an aborted or failed reply (and its calls' results) out of a
    provider request, and real pi files keep partial toolCall blocks in it:
    another message may follow them; a result may still answer one right
    after it, but not once another message came (late)."""
    aborted = call("c1", "c2")
    aborted["message"]["stopReason"] = stop
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, aborted)
    store.sessions.append("s", EntryKind.MESSAGE, result("c1"))
    store.sessions.append("s", EntryKind.MESSAGE, {"message": USER})
    with pytest.raises(ToolCallPairingError) as err:
        store.sessions.append("s", EntryKind.MESSAGE, result("c2"))
    assert err.value.reason == "late"
    assert all(c.passed for c in run_audit(store))


# -- OpenAI-style messages: the same rule -----------------------------------------------------


def ocall(*ids: str) -> dict:
    items = [
        {"id": i, "type": "function", "function": {"name": "ls", "arguments": "{}"}} for i in ids
    ]
    return {"message": {"role": "assistant", "content": None, "tool_calls": items}}


def oresult(call_id: str) -> dict:
    return {"message": {"role": "tool", "tool_call_id": call_id, "content": "ok"}}


def test_openai_style_messages_are_judged_by_the_same_rule(store):
    """Issue 17 item 2: ``{"role": "tool", "tool_call_id": …}`` messages were
    stored without any check."""
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, {"message": USER})
    with pytest.raises(ToolCallPairingError) as err:
        store.sessions.append("s", EntryKind.MESSAGE, oresult("call_9"))
    assert (err.value.tool_call_id, err.value.reason) == ("call_9", "unpaired")
    store.sessions.append("s", EntryKind.MESSAGE, ocall("call_1", "call_2"))
    store.sessions.append("s", EntryKind.MESSAGE, oresult("call_1"))
    with pytest.raises(ToolCallPairingError) as err:
        store.sessions.append("s", EntryKind.MESSAGE, oresult("call_1"))
    assert err.value.reason == "duplicate"
    with pytest.raises(ToolCallsUnansweredError) as err:
        store.sessions.append("s", EntryKind.MESSAGE, {"message": USER})
    assert err.value.tool_call_ids == ("call_2",)
    store.sessions.append("s", EntryKind.MESSAGE, oresult("call_2"))
    store.sessions.append(
        "s", EntryKind.MESSAGE, {"message": {"role": "assistant", "content": "done"}}
    )
    assert [m["role"] for m in store.sessions.replay("s").messages] == [
        "user", "assistant", "tool", "tool", "assistant",
    ]  # fmt: skip
    assert all(c.passed for c in run_audit(store))


def test_the_store_closes_an_openai_style_call_in_its_own_shape(store):
    """The results the store writes itself take the call's shape: an OpenAI
    ``tool`` message (only the fields the chat API takes), in call order."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, start=True)
    store.sessions.append("s", EntryKind.MESSAGE, ocall("call_1", "call_2"))
    store.tools.claim(
        "k1", "s", local_turn_id=run.turn_id, provider_call_id="call_1", tool_name="ls",
        side_effecting=False, run_id=run.id,
    )  # fmt: skip
    store.tools.complete("k1", [{"type": "text", "text": "a.txt"}])
    store.runs.finish(run.id, "interrupted")
    first, second = store.sessions.replay("s").messages[2:4]
    assert first == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": [{"type": "text", "text": "a.txt"}],
    }
    assert second["tool_call_id"] == "call_2" and set(second) == {"role", "tool_call_id", "content"}
    assert "interrupted" in second["content"]
    assert all(c.passed for c in run_audit(store))


# -- every write path --------------------------------------------------------------------------


def test_every_write_path_refuses_a_message_after_open_calls(store):
    """append_many, finish_run's entries, admit_run's user message and a branch
    summary under an assistant with open calls are judged like append."""
    store.sessions.create("s")
    with pytest.raises(ToolCallsUnansweredError):
        store.sessions.append_many(
            "s", [(EntryKind.MESSAGE, call("c1")), (EntryKind.MESSAGE, {"message": USER})]
        )
    assert store.sessions.entries("s") == []
    assistant = store.sessions.append("s", EntryKind.MESSAGE, call("c1"))
    with pytest.raises(ToolCallsUnansweredError):
        store.runs.admit("s", {"q": 1}, user_message=USER)
    assert store.runs.active("s") is None and len(store.sessions.entries("s")) == 1
    store.sessions.append("s", EntryKind.MESSAGE, result("c1"))
    with pytest.raises(ToolCallsUnansweredError):
        store.sessions.branch_with_summary("s", assistant.id, "back to the call")
    run = store.runs.admit("s", {"q": 1}, user_message=USER, start=True)
    with pytest.raises(ToolCallsUnansweredError):
        store.runs.finish(
            run.id,
            "succeeded",
            entries=[(EntryKind.MESSAGE, call("c2")), (EntryKind.MESSAGE, {"message": USER})],
        )
    assert store.runs.get(run.id).status == "running"
    store.runs.finish(
        run.id, "succeeded", entries=[(EntryKind.MESSAGE, call("c2"))]
    )  # closed by the store
    assert [m["role"] for m in store.sessions.replay("s").messages][-2:] == [
        "assistant",
        "toolResult",
    ]
    assert all(c.passed for c in run_audit(store))


def test_a_compaction_whose_kept_tail_holds_a_fault_is_refused(store):
    """A forged lapse kept by a compaction: the compaction would start the
    context with it, so it is refused (and the audit flags the forged entry)."""
    store.sessions.create("s")
    assistant = store.sessions.append("s", EntryKind.MESSAGE, call("c1"))
    forge_entry(store, "s", "forged", assistant.id, "message", {"message": USER})
    with pytest.raises(ToolCallsUnansweredError) as err:
        store.sessions.append(
            "s", EntryKind.COMPACTION, {"summary": "s", "firstKeptEntryId": assistant.id}
        )
    assert err.value.entry_id == "forged"
    store.sessions.append("s", EntryKind.COMPACTION, {"summary": "s", "firstKeptEntryId": "forged"})
    check = {c.name: c for c in run_audit(store)}["tool_results_in_context"]
    assert check.violations == 1 and "forged: unanswered 'c1'" in check.detail


def test_entries_outside_the_context_keep_a_call_answerable(store):
    """Labels, titles, settings changes and turn boundaries are not messages."""
    store.sessions.create("s")
    assistant = store.sessions.append("s", EntryKind.MESSAGE, call("c1"))
    store.sessions.set_label("s", assistant.id, "x")
    store.sessions.set_title("s", "t")
    store.sessions.append("s", EntryKind.MODEL_CHANGE, {"provider": "p", "modelId": "m"})
    store.sessions.append("s", EntryKind.MESSAGE, result("c1"))
    assert roles(store) == ["assistant", "toolResult"]


def test_a_run_cannot_admit_or_end_with_a_tool_result(store):
    """Every API write path keeps the pairing: admission's user message is a user
    message and termination's reply an assistant message."""
    store.sessions.create("s")
    stray = {"role": "toolResult", "toolCallId": "zz", "toolName": "x", "content": []}
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        store.runs.admit("s", {"x": 1}, user_message=stray)
    assert err.value.field == "user_message.role"
    run = store.runs.admit("s", {"x": 1}, user_message=USER)
    store.runs.start(run.id)
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        store.runs.finish(run.id, "succeeded", assistant_message=stray)
    assert err.value.field == "assistant_message.role"
    assert roles(store) == ["user"]


@pytest.mark.parametrize("where", ["near", "many results back", "past a compaction"])
def test_the_open_calls_are_read_back_from_the_leaf_however_far(store, where, monkeypatch):
    """With nothing remembered (another store object wrote last, say), a write
    reads the open calls back from the leaf: one entry at a time up to
    pairing_checks.MAX_BACK entries, and the whole branch past that or past a
    compaction. Either way the judgement is the rule's."""
    n = pairing_checks.MAX_BACK + 5 if where == "many results back" else 2
    ids = [f"c{i}" for i in range(n)]
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, {"message": USER})
    assistant = store.sessions.append("s", EntryKind.MESSAGE, call(*ids))
    if where == "past a compaction":
        store.sessions.append(
            "s", EntryKind.COMPACTION, {"summary": "s", "firstKeptEntryId": assistant.id}
        )
    store.sessions.append_many("s", [(EntryKind.MESSAGE, result(i)) for i in ids[:-1]])
    whole: list[str | None] = []  # leaves whose whole branch was read
    real = entry_rows.path_to_leaf
    monkeypatch.setattr(
        entry_rows, "path_to_leaf", lambda tx, sid, leaf: whole.append(leaf) or real(tx, sid, leaf)
    )
    store.sessions._openings.put("s", None)  # nothing remembered: read it back
    with pytest.raises(ToolCallsUnansweredError) as err:
        store.sessions.append("s", EntryKind.MESSAGE, {"message": USER})
    assert err.value.tool_call_ids == (ids[-1],)
    for payload in (result(ids[-1]), {"message": USER}):  # accepted: judged by the read alone
        whole.clear()
        store.sessions._openings.put("s", None)
        store.sessions.append("s", EntryKind.MESSAGE, payload)
        assert bool(whole) == (where != "near"), whole
    assert all(c.passed for c in run_audit(store))
