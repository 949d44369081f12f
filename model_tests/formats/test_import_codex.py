"""Codex rollouts imported (``turnkeeper.formats.codex``), on both backends, from
the shared corpus (read in place from ``$TURNKEEPER_CORPUS``).

The replay test computes the history Codex rebuilds on resume straight from
the raw file, following ``corpus/FORMATS.md`` §3.2: the ``response_item``
payloads the model sees, in file order, except ``system`` messages; a
``compacted`` row's ``replacement_history`` replaces everything before it; an
``event_msg`` ``thread_rolled_back`` drops the last ``num_turns`` user turns
(Codex's ``drop_last_n_user_turns``: cut at the ``num_turns``-th user message
from the end, or at the first when there are fewer; contextual user messages,
such as ``<environment_context>``, are not turns; no user turn, no change).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKENDS, open_backend

import turnkeeper
from turnkeeper.formats import codex
from turnkeeper.formats import import_file as import_any
from turnkeeper.storage.audit import run_audit

OLD = "rollout-2025-09-24T19-22-20-01997e76-d124-7592-9cac-2ec05abbca08.jsonl"
NEW = "rollout-2026-02-23T12-54-34-019c8a59-e9dd-71f0-9ae3-4079fe9726a9.jsonl"

MODEL_SEES = {
    "message",
    "reasoning",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "local_shell_call",
    "web_search_call",
    "compaction",
}


def seen(item: dict[str, Any]) -> bool:
    return item.get("type") in MODEL_SEES and item.get("role") != "system"


CONTEXTUAL = (
    "<environment_context>",
    "<user_instructions>",
    "# agents.md instructions",
    "<skill>",
    "<user_shell_command>",
    "<turn_aborted>",
    "<subagent_notification>",
)


def user_turn(item: dict[str, Any]) -> bool:
    """A user message that opens a turn (Codex's ``is_user_turn_boundary``)."""
    if item.get("type") != "message" or item.get("role") != "user":
        return False
    texts = [c.get("text", "") for c in item.get("content", []) if isinstance(c, dict)]
    return not any(t.lstrip().lower().startswith(CONTEXTUAL) for t in texts)


def expected_history(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Codex's own rebuild of the model's history from a rollout."""
    history: list[dict[str, Any]] = []
    for line in lines:
        payload = line.get("payload")
        if line.get("type") == "response_item" and seen(payload):
            history.append(payload)
        elif line.get("type") == "compacted" and "replacement_history" in payload:
            history = [i for i in payload["replacement_history"] if seen(i)]
        elif line.get("type") == "event_msg" and payload.get("type") == "thread_rolled_back":
            n = payload["num_turns"]
            turns = [i for i, item in enumerate(history) if user_turn(item)]
            if n and turns:
                history = history[: turns[0] if n >= len(turns) else turns[-n]]
    return history


def lines_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_replays_as_codex(store: turnkeeper.BaseStore, sid: str, lines: list[Any]) -> None:
    want = expected_history(lines)
    got = store.sessions.replay(sid).messages
    assert len(got) == len(want)
    for message, item in zip(got, want, strict=True):
        # An item without a role carries its type as its role; nothing else changes.
        assert message == (item if "role" in item else {**item, "role": item["type"]})


@pytest.fixture(scope="module", params=BACKENDS)
def imported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path
) -> Iterator[tuple[turnkeeper.BaseStore, dict[str, codex.FileImport]]]:
    """Both samples imported once per backend."""
    store = open_backend(request.param, tmp_path_factory.mktemp("codex"), None)
    done = {name: codex.import_file(store, corpus_dir / "codex" / name) for name in (OLD, NEW)}
    yield store, done
    store.close()


@pytest.mark.parametrize("name", [OLD, NEW])
def test_each_sample_replays_to_the_history_codex_rebuilds(
    imported: Any, corpus_dir: Path, name: str
) -> None:
    store, done = imported
    lines = lines_of((corpus_dir / "codex" / name).read_text())
    fi = done[name]
    assert fi.format == "codex" and fi.issues == ()
    assert fi.session_id == lines[0]["payload"]["id"]
    assert fi.version == lines[0]["payload"]["cli_version"]
    assert store.sessions.get(fi.session_id).cwd == lines[0]["payload"]["cwd"]
    assert_replays_as_codex(store, fi.session_id, lines)


def test_the_newer_layouts_compaction_cuts_to_its_replacement_history(
    imported: Any, corpus_dir: Path
) -> None:
    store, done = imported
    lines = lines_of((corpus_dir / "codex" / NEW).read_text())
    at = next(i for i, line in enumerate(lines) if line["type"] == "compacted")
    history = lines[at]["payload"]["replacement_history"]
    sid = done[NEW].session_id
    replay = store.sessions.replay(sid)
    entries = {e.id: e for e in store.sessions.entries(sid)}
    # The replay opens with the replacement history, nothing from before the row.
    root = entries[replay.entry_ids[0]].parent_id
    assert root is not None and entries[root].kind == "codex.compacted"
    assert entries[root].parent_id is None
    assert [dict(m) for m in replay.messages[: len(history)]] == [
        h if "role" in h else {**h, "role": h["type"]} for h in history
    ]
    # The history before stays stored, under the row's logical parent.
    before = entries[entries[root].payload["logicalParentId"]]
    prev = lines[at - 1]["payload"]
    kept = before.payload["message"] if before.kind == "message" else before.payload["payload"]
    assert {k: v for k, v in kept.items() if k != "role" or "role" in prev} == prev
    chain = [before]
    while chain[-1].parent_id is not None:
        chain.append(entries[chain[-1].parent_id])
    assert len(chain) == at  # every line before the compaction, back to the session_meta
    assert dict(entries[root].payload)["payload"] == lines[at]["payload"]
    assert len(expected_history(lines[:at])) > 100


def test_event_and_context_lines_are_kept_verbatim(imported: Any, corpus_dir: Path) -> None:
    store, done = imported
    lines = lines_of((corpus_dir / "codex" / OLD).read_text())
    entries = store.sessions.entries(done[OLD].session_id)
    assert len(entries) == len(lines)
    events = [e for e in entries if e.kind == "codex.event_msg"]
    raw = [line for line in lines if line["type"] == "event_msg"]
    assert [dict(e.payload) for e in events] == [{"payload": r["payload"]} for r in raw]
    assert sum(e.kind == "codex.turn_context" for e in entries) == 136


def test_the_imported_sessions_pass_the_audit(imported: Any) -> None:
    store, done = imported
    checks = run_audit(store, [d.session_id for d in done.values()])
    assert [(c.name, c.detail) for c in checks if not c.passed] == []


def test_importing_again_adds_nothing(imported: Any, corpus_dir: Path) -> None:
    store, done = imported
    for name in (OLD, NEW):
        again = import_any(store, corpus_dir / "codex" / name)
        assert again.format == "codex"
        assert (again.result.added, again.result.skipped) == (0, done[name].result.added)


def test_a_rollout_ending_on_a_call_replays_it_and_grows_by_its_new_lines(
    store: turnkeeper.BaseStore, corpus_dir: Path, tmp_path: Path
) -> None:
    """A prefix cut right after a function call (no output yet) replays ending on
    that call, as Codex's history holds it; the whole file then adds only the rest."""
    text = (corpus_dir / "codex" / OLD).read_text()
    lines = text.splitlines(keepends=True)
    cut = next(
        i + 1
        for i, line in enumerate(lines)
        if i > 200 and json.loads(line)["payload"].get("type") == "function_call"
    )
    target = tmp_path / "rollout.jsonl"
    target.write_text("".join(lines[:cut]))
    first = codex.import_file(store, target)
    sid = first.session_id
    last = store.sessions.replay(sid).messages[-1]
    assert last["role"] == "function_call" and last["type"] == "function_call"
    assert last["call_id"] == json.loads(lines[cut - 1])["payload"]["call_id"]
    assert_replays_as_codex(store, sid, lines_of("".join(lines[:cut])))
    target.write_text(text)
    grown = codex.import_file(store, target)
    assert (grown.result.added, grown.result.skipped) == (len(lines) - cut, cut)
    assert store.sessions.get(sid).leaf_id == store.sessions.entries(sid)[-1].id
    assert_replays_as_codex(store, sid, lines_of(text))


def test_a_sub_agent_rollout_without_its_parent_is_imported_linked_and_reported(
    store: turnkeeper.BaseStore, corpus_dir: Path, tmp_path: Path
) -> None:
    lines = lines_of((corpus_dir / "codex" / OLD).read_text())[:40]
    meta = lines[0]["payload"]
    meta["id"] = "sub-thread"
    meta["source"] = {
        "subagent": {"thread_spawn": {"parent_thread_id": "parent-thread", "depth": 1}}
    }
    target = tmp_path / "sub.jsonl"
    target.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = codex.import_file(store, target)
    assert [(i.line, i.kind) for i in done.issues] == [(0, "reference")]
    assert "parent-thread" in done.issues[0].detail
    session = store.sessions.get("sub-thread")
    assert session.sub_agent_of == "parent-thread"
    assert session.header["parentSession"] == "parent-thread"
    assert session.header["source"] == meta["source"]
    assert_replays_as_codex(store, "sub-thread", lines)
    # The parent imported later finds it.
    parent = lines_of((corpus_dir / "codex" / OLD).read_text())[:5]
    parent[0]["payload"]["id"] = "parent-thread"
    (tmp_path / "parent.jsonl").write_text("".join(json.dumps(x) + "\n" for x in parent))
    assert codex.import_file(store, tmp_path / "parent.jsonl").issues == ()
    assert [s.id for s in store.sessions.sub_agents("parent-thread")] == ["sub-thread"]


def test_unknown_lines_malformed_text_and_an_old_compaction(
    store: turnkeeper.BaseStore, corpus_dir: Path, tmp_path: Path
) -> None:
    lines = lines_of((corpus_dir / "codex" / OLD).read_text())[:30]
    novel = {"timestamp": "2025-09-25T01:30:00.000Z", "type": "future_kind", "payload": {"a": 1}}
    ghost = {
        "timestamp": "2025-09-25T01:30:01.000Z",
        "type": "response_item",
        "payload": {"type": "ghost_snapshot", "ghost_commit": {"id": "x"}},
    }
    old = {
        "timestamp": "2025-09-25T01:30:02.000Z",
        "type": "compacted",
        "payload": {"message": "the summary so far"},
    }
    after = next(x for x in lines if x["payload"].get("type") == "message")
    text = [json.dumps(x) for x in [*lines, novel, ghost]]
    text.append(json.dumps(after)[:50])  # cut off mid-write
    text += [json.dumps(old), json.dumps(after)]
    target = tmp_path / "r.jsonl"
    target.write_text("\n".join(text) + "\n")
    done = import_any(store, target)
    n = len(lines)
    assert [(i.line, i.kind) for i in done.issues] == [
        (n + 1, "unknown"),
        (n + 2, "unknown"),
        (n + 3, "opaque"),
    ]
    sid = done.session_id
    kinds = [e.kind for e in store.sessions.entries(sid)][n:]
    assert kinds == [
        "codex.future_kind",
        "codex.response_item",
        "compaction",
        "message",
    ]
    (opaque,) = store.sessions.opaque_records(sid)
    assert opaque.line == n + 3 and opaque.raw == text[n + 2].rstrip()
    replay = store.sessions.replay(sid).messages
    assert [m["role"] for m in replay] == ["compactionSummary", after["payload"]["role"]]
    assert replay[0]["summary"] == "the summary so far"


def _said(role: str, text: str, at: str) -> dict[str, Any]:
    kind = "input_text" if role == "user" else "output_text"
    return {
        "timestamp": at,
        "type": "response_item",
        "payload": {"type": "message", "role": role, "content": [{"type": kind, "text": text}]},
    }


@pytest.mark.parametrize("name", [OLD, NEW])
@pytest.mark.parametrize("turns", [0, 1, 2, 10_000])
def test_a_rollback_drops_the_last_user_turns_from_replay_and_keeps_them_stored(
    store: turnkeeper.BaseStore, corpus_dir: Path, tmp_path: Path, name: str, turns: int
) -> None:
    """``thread_rolled_back`` (FORMATS.md §3.4: readers must drop the turns): the
    replay is the history Codex rebuilds, the turns after the rollback follow the
    cut, and every line stays stored (the rolled-back turns as their own branch).
    The sample's contextual user messages (``<environment_context>``) are no turns."""
    lines = lines_of((corpus_dir / "codex" / name).read_text())
    at = lines[-1]["timestamp"]
    rolled = {
        "timestamp": at,
        "type": "event_msg",
        "payload": {"type": "thread_rolled_back", "num_turns": turns},
    }
    more = [_said("user", "try that again", at), _said("assistant", "done again", at)]
    whole = [*lines, rolled, *more]
    target = tmp_path / "rolled.jsonl"
    target.write_text("".join(json.dumps(x) + "\n" for x in whole))
    done = import_any(store, target)
    assert done.issues == ()
    replaced = sum(  # a compaction's replacement items are entries of their own
        len(x["payload"].get("replacement_history", ())) for x in whole if x["type"] == "compacted"
    )
    assert len(store.sessions.entries(done.session_id)) == len(whole) + replaced
    assert_replays_as_codex(store, done.session_id, whole)
    kept = len(expected_history(whole)) - len(more)
    unrolled = len(expected_history(lines))
    if turns == 0:
        assert kept == unrolled
    else:  # the reference itself drops something: the comparison above can fail
        assert kept < unrolled
    if turns == 10_000:  # every turn dropped: only what came before the first is left
        assert not any(user_turn(m) for m in expected_history(whole)[:kept])
