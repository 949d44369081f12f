"""Codex rollouts imported (``turnkeeper.formats.codex``), on both backends, from
the shared corpus (read in place from ``$TURNKEEPER_CORPUS``).

The replay test computes the history Codex rebuilds on resume straight from
the raw file, following ``corpus/FORMATS.md`` §3.2: the ``response_item``
payloads the model sees, in file order, except ``system`` messages; a
``compacted`` row's ``replacement_history`` replaces everything before it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKENDS, open_backend

import turnkeeper
from turnkeeper.cli.audit import run_audit
from turnkeeper.formats import codex
from turnkeeper.formats import import_file as import_any

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


def expected_history(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Codex's own rebuild of the model's history from a rollout."""
    history: list[dict[str, Any]] = []
    for line in lines:
        payload = line.get("payload")
        if line.get("type") == "response_item" and seen(payload):
            history.append(payload)
        elif line.get("type") == "compacted" and "replacement_history" in payload:
            history = [i for i in payload["replacement_history"] if seen(i)]
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
    rolled = {
        "timestamp": "2025-09-25T01:30:01.500Z",
        "type": "event_msg",
        "payload": {"type": "thread_rolled_back", "num_turns": 1},
    }
    text = [json.dumps(x) for x in [*lines, novel, ghost, rolled]]
    text.append(json.dumps(after)[:50])  # cut off mid-write
    text += [json.dumps(old), json.dumps(after)]
    target = tmp_path / "r.jsonl"
    target.write_text("\n".join(text) + "\n")
    done = import_any(store, target)
    n = len(lines)
    assert [(i.line, i.kind) for i in done.issues] == [
        (n + 1, "unknown"),
        (n + 2, "unknown"),
        (n + 3, "unknown"),  # a rollback: kept, and replay does not apply it
        (n + 4, "opaque"),
    ]
    assert "thread_rolled_back" in done.issues[2].detail
    sid = done.session_id
    kinds = [e.kind for e in store.sessions.entries(sid)][n:]
    assert kinds == [
        "codex.future_kind",
        "codex.response_item",
        "codex.event_msg",
        "compaction",
        "message",
    ]
    (opaque,) = store.sessions.opaque_records(sid)
    assert opaque.line == n + 4 and opaque.raw == text[n + 3].rstrip()
    replay = store.sessions.replay(sid).messages
    assert [m["role"] for m in replay] == ["compactionSummary", after["payload"]["role"]]
    assert replay[0]["summary"] == "the summary so far"
