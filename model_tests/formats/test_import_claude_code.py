"""Claude Code transcripts imported (``turnkeeper.formats.claude_code``), on both
backends, from the shared corpus (read in place from ``$TURNKEEPER_CORPUS``).

The replay test computes the context Claude Code rebuilds straight from the
raw file, following ``corpus/FORMATS.md`` §2.3: the leaf is the last
``user``/``assistant`` row; walk ``parentUuid`` back until a root (the
compact boundary has ``parentUuid: null``, so the walk stops there) and keep
the ``user``/``assistant`` rows, one message per row.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKENDS, open_backend

import turnkeeper
from turnkeeper.formats import claude_code
from turnkeeper.formats import import_file as import_any
from turnkeeper.storage.audit import run_audit

SESSION = "258c7280-ae70-4798-800f-63464d01a85d"


def rows_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def main_file(corpus: Path) -> Path:
    return corpus / "claude-code" / f"{SESSION}.jsonl.gz"


def sub_file(corpus: Path, name: str) -> Path:
    return corpus / "claude-code" / SESSION / "subagents" / name


def expected_context(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claude Code's own rebuild: from the last message row back to a root."""
    by_uuid = {r["uuid"]: r for r in rows if "uuid" in r}
    messages = [r for r in rows if r.get("type") in ("user", "assistant")]
    main = [r for r in messages if not r.get("isSidechain")]
    leaf = (main or messages)[-1]  # a main file's sidechain rows are a sub-agent's
    chain = []
    node: dict[str, Any] | None = leaf
    while node is not None:
        chain.append(node)
        node = by_uuid.get(node["parentUuid"]) if node.get("parentUuid") else None
    chain.reverse()
    return [r for r in chain if r.get("type") in ("user", "assistant")]


def assert_replays_as_claude_code(store: turnkeeper.BaseStore, sid: str, rows: list[Any]) -> None:
    want = expected_context(rows)
    got = store.sessions.replay(sid)
    assert len(got.messages) == len(want)
    assert list(got.entry_ids) == [r["uuid"] for r in want]
    for message, row in zip(got.messages, want, strict=True):
        if row.get("isCompactSummary"):  # the store's compaction stands for the summary row
            assert message["role"] == "compactionSummary"
            assert message["summary"] == row["message"]["content"]
        else:
            assert message == row["message"]


@pytest.fixture(scope="module", params=BACKENDS)
def imported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path
) -> Iterator[tuple[turnkeeper.BaseStore, claude_code.FileImport, list[dict[str, Any]]]]:
    """The main sample imported once per backend (with its sub-agent files)."""
    store = open_backend(request.param, tmp_path_factory.mktemp("cc"), None)
    done = claude_code.import_file(store, main_file(corpus_dir))
    rows = rows_of(gzip.decompress(main_file(corpus_dir).read_bytes()).decode())
    yield store, done, rows
    store.close()


def test_the_sample_replays_to_claude_codes_own_context_cut_at_the_compaction(
    imported: Any,
) -> None:
    store, done, rows = imported
    assert (done.format, done.session_id, done.version) == ("claude-code", SESSION, "2.1.39")
    assert done.result.created and done.result.added == len(rows) and done.issues == ()
    assert_replays_as_claude_code(store, SESSION, rows)
    replay = store.sessions.replay(SESSION)
    # The cut: the replay starts at the summary row that follows the boundary,
    # and no message row written before the boundary is in it.
    boundary = next(r for r in rows if r.get("subtype") == "compact_boundary")
    summary = next(r for r in rows if r.get("isCompactSummary"))
    assert replay.entry_ids[0] == summary["uuid"]
    before = {r["uuid"] for r in rows[: rows.index(boundary)] if "uuid" in r}
    assert not before & set(replay.entry_ids)
    assert len(replay.messages) > 100


def test_the_compaction_keeps_the_logical_parent(imported: Any) -> None:
    store, _, rows = imported
    boundary = next(r for r in rows if r.get("subtype") == "compact_boundary")
    summary = next(r for r in rows if r.get("isCompactSummary"))
    entries = {e.id: e for e in store.sessions.entries(SESSION)}
    b, s = entries[boundary["uuid"]], entries[summary["uuid"]]
    assert b.kind == "claude-code.system" and b.parent_id == boundary["logicalParentUuid"]
    assert b.payload["parentUuid"] is None  # the row as written
    assert b.payload["logicalParentUuid"] == boundary["logicalParentUuid"]
    assert s.kind == "compaction" and s.parent_id == boundary["uuid"]
    assert s.payload["firstKeptEntryId"] is None
    assert s.payload["message"] == summary["message"]  # the row kept beside the summary
    # The history before the compaction stays an ancestor: a leaf there replays it.
    pre = expected_context(rows[: rows.index(boundary)])
    assert boundary["logicalParentUuid"] in entries and len(pre) > 50


def test_progress_snapshot_and_queue_rows_are_kept_verbatim_not_as_messages(
    imported: Any,
) -> None:
    store, _, rows = imported
    entries = store.sessions.entries(SESSION)
    by_kind: dict[str, int] = {}
    for e in entries:
        by_kind[e.kind] = by_kind.get(e.kind, 0) + 1
    assert by_kind["claude-code.progress"] == sum(r["type"] == "progress" for r in rows) == 1333
    snapshots = [r for r in rows if r["type"] == "file-history-snapshot"]
    assert by_kind["claude-code.file-history-snapshot"] == len(snapshots) == 28
    assert by_kind["claude-code.queue-operation"] == 6
    kept = [e for e in entries if e.kind == "claude-code.file-history-snapshot"]
    want = [{k: v for k, v in r.items() if k != "type"} for r in snapshots]
    assert [dict(e.payload) for e in kept] == want
    progress = [e for e in entries if e.kind == "claude-code.progress"]
    raw = [r for r in rows if r["type"] == "progress"]
    assert [dict(e.payload) for e in progress] == [
        {k: v for k, v in r.items() if k not in ("type", "timestamp")} for r in raw
    ]
    assert not {e.id for e in progress} & set(store.sessions.replay(SESSION).entry_ids)


def test_sub_agent_files_are_sub_agent_sessions_of_the_parent(
    imported: Any, corpus_dir: Path
) -> None:
    store, done, _ = imported
    subs = {s.id: s for s in store.sessions.sub_agents(SESSION)}
    assert set(subs) == {f"{SESSION}/agent-a881341", f"{SESSION}/agent-acompact-fffbd0"}
    assert {d.session_id for d in done.sub_agents} == set(subs)
    for sid, session in subs.items():
        assert session.sub_agent_of == SESSION
        assert session.header["parentSession"] == SESSION and session.header["subAgent"]
        name = sid.split("/")[-1] + ".jsonl"
        rows = rows_of(sub_file(corpus_dir, name).read_text())
        assert_replays_as_claude_code(store, sid, rows)
    # The compaction agent's rows point into the parent's file: roots here,
    # the parent kept as written, and reported.
    compactor = next(d for d in done.sub_agents if "acompact" in d.session_id)
    assert [i.kind for i in compactor.issues] == ["reference"] * 3
    raw = rows_of(sub_file(corpus_dir, "agent-acompact-fffbd0.jsonl").read_text())
    kept = store.sessions.entries(compactor.session_id)
    assert [e.parent_id for e in kept[:3]] == [None, None, None]
    assert [e.payload["parentUuid"] for e in kept] == [r["parentUuid"] for r in raw]
    listed = {s.id for s in store.sessions.list().sessions}
    assert SESSION in listed and not set(subs) & listed  # sub-agents are left out


def test_the_imported_sessions_pass_the_audit(imported: Any) -> None:
    store, done, _ = imported
    sessions = [done.session_id, *(s.session_id for s in done.sub_agents)]
    assert [(c.name, c.detail) for c in run_audit(store, sessions) if not c.passed] == []


def test_importing_the_sample_again_adds_nothing(imported: Any, corpus_dir: Path) -> None:
    store, _, rows = imported
    again = import_any(store, main_file(corpus_dir))
    assert again.format == "claude-code"
    assert (again.result.created, again.result.added, again.result.skipped) == (
        False,
        0,
        len(rows),
    )
    assert all(s.result.added == 0 and not s.result.created for s in again.sub_agents)
    assert_replays_as_claude_code(store, SESSION, rows)


def test_a_grown_sub_agent_file_adds_only_its_new_rows_and_names_its_absent_parent(
    store: turnkeeper.BaseStore, corpus_dir: Path, tmp_path: Path
) -> None:
    """A sub-agent file imported on its own, its parent absent: imported, linked,
    reported; then grown, only the new rows go in."""
    text = sub_file(corpus_dir, "agent-a881341.jsonl").read_text()
    lines = text.splitlines(keepends=True)
    target = tmp_path / "agent-a881341.jsonl"
    target.write_text("".join(lines[:4]))
    first = claude_code.import_file(store, target)
    sid = f"{SESSION}/agent-a881341"
    assert first.session_id == sid and first.result.added == 4
    assert [i.kind for i in first.issues] == ["reference"]
    assert SESSION in first.issues[0].detail
    assert store.sessions.get(sid).sub_agent_of == SESSION
    assert_replays_as_claude_code(store, sid, rows_of("".join(lines[:4])))
    target.write_text(text)
    grown = claude_code.import_file(store, target)
    assert (grown.result.added, grown.result.skipped) == (len(lines) - 4, 4)
    assert_replays_as_claude_code(store, sid, rows_of(text))
    assert claude_code.import_file(store, target).result.added == 0


def test_summary_rows_unknown_types_and_malformed_lines_are_kept_and_reported(
    store: turnkeeper.BaseStore, corpus_dir: Path, tmp_path: Path
) -> None:
    rows = rows_of(sub_file(corpus_dir, "agent-a881341.jsonl").read_text())
    for r in rows:  # a main-file transcript of its own, not a sidechain
        r.pop("agentId")
        r["isSidechain"] = False
    elsewhere = {"type": "summary", "summary": "Old title", "leafUuid": "not-in-this-file"}
    here = {"type": "summary", "summary": "This one", "leafUuid": rows[-1]["uuid"]}
    novel = {"type": "brand-new-kind", "sessionId": SESSION, "uuid": "n1", "parentUuid": None}
    lines = [json.dumps(elsewhere), json.dumps(here)] + [json.dumps(r) for r in rows]
    lines.insert(4, json.dumps(novel))
    lines.insert(5, json.dumps(rows[0])[:80])  # a record cut off mid-write
    target = tmp_path / "t.jsonl"
    target.write_text("\n".join(lines) + "\n")
    done = import_any(store, target)
    assert done.format == "claude-code"
    kinds = {(i.line, i.kind) for i in done.issues}
    assert kinds == {(1, "reference"), (5, "unknown"), (6, "opaque")}
    entries = {e.kind: e for e in store.sessions.entries(SESSION)}
    assert dict(entries["claude-code.brand-new-kind"].payload) == {
        k: v for k, v in novel.items() if k != "type"
    }
    summaries = [e for e in store.sessions.entries(SESSION) if e.kind == "claude-code.summary"]
    assert [dict(e.payload) for e in summaries] == [
        {"summary": "Old title", "leafUuid": "not-in-this-file"},
        {"summary": "This one", "leafUuid": rows[-1]["uuid"]},
    ]
    (opaque,) = store.sessions.opaque_records(SESSION)
    assert (opaque.line, opaque.raw) == (6, lines[5])
    assert_replays_as_claude_code(store, SESSION, rows)


def test_a_sub_agent_file_that_cannot_be_imported_is_an_issue_of_its_parent(
    store: turnkeeper.BaseStore, corpus_dir: Path, tmp_path: Path
) -> None:
    rows = rows_of(sub_file(corpus_dir, "agent-a881341.jsonl").read_text())
    main_rows = [{**r, "isSidechain": False} for r in rows]
    for r in main_rows:
        r.pop("agentId")
    main = tmp_path / f"{SESSION}.jsonl"
    main.write_text("".join(json.dumps(r) + "\n" for r in main_rows))
    subs = tmp_path / SESSION / "subagents"
    subs.mkdir(parents=True)
    (subs / "agent-broken.jsonl").write_text("\n")  # no records at all
    good = [{**r, "agentId": "b2", "uuid": f"b2-{i}"} for i, r in enumerate(rows)]
    for i, r in enumerate(good):
        r["parentUuid"] = f"b2-{i - 1}" if i else None
    (subs / "agent-b2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good))
    done = claude_code.import_file(store, main)
    assert done.result.added == len(rows)
    (issue,) = done.issues
    assert (issue.line, issue.kind) == (0, "sub-agent")
    assert "agent-broken.jsonl" in issue.detail and "SessionFileError" in issue.detail
    assert [s.session_id for s in done.sub_agents] == [f"{SESSION}/agent-b2"]
    assert [s.id for s in store.sessions.sub_agents(SESSION)] == [f"{SESSION}/agent-b2"]
    assert len(store.sessions.replay(f"{SESSION}/agent-b2").messages) == len(expected_context(good))


def test_a_batch_naming_a_bad_parent_id_writes_nothing(store: turnkeeper.BaseStore) -> None:
    from datetime import UTC, datetime

    from turnkeeper.spec.records import ImportBatch

    batch = ImportBatch("s-bad", "/w", datetime(2026, 1, 1, tzinfo=UTC), {}, [], None)
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        store.sessions.import_batch(ImportBatch(**{**_fields(batch), "sub_agent_of": "bad\nid"}))
    assert err.value.field == "sub_agent_of"
    assert store.sessions.get("s-bad") is None


def _fields(batch: Any) -> dict[str, Any]:
    return {name: getattr(batch, name) for name in batch.__slots__}


def test_damaged_lines_keep_the_records_they_hold(
    store: turnkeeper.BaseStore, corpus_dir: Path, tmp_path: Path
) -> None:
    """A first line of NUL bytes, a record cut off with the next record on its
    line (``…"prNu{"parentUuid"…``, anthropics/claude-code#52387) and a NUL run
    before a record: the records are split back out, the rest kept opaque."""
    rows = rows_of(sub_file(corpus_dir, "agent-a881341.jsonl").read_text())
    for r in rows:
        r.pop("agentId")
        r["isSidechain"] = False
    text = [json.dumps(r) for r in rows]
    lines = [
        "\0" * 40,
        text[0],
        text[1][:60] + text[2],  # row 1 cut off, row 2 on the same line
        text[3],
        "\0" * 12 + text[4],
        *text[5:],
    ]
    target = tmp_path / "t.jsonl"
    target.write_text("\n".join(lines) + "\n")
    done = import_any(store, target)
    assert done.format == "claude-code"
    assert [(i.line, i.kind) for i in done.issues] == [
        (1, "opaque"),
        (3, "repaired"),
        (3, "opaque"),
        (3, "reference"),  # row 2's parent is the row cut off
        (5, "repaired"),
        (5, "opaque"),
    ]
    stored = {e.id for e in store.sessions.entries(SESSION)}
    assert {r["uuid"] for r in rows} - stored == {rows[1]["uuid"]}
    kept = store.sessions.opaque_records(SESSION)
    assert [(o.line, o.raw) for o in kept] == [
        (1, "\0" * 40),
        (3, text[1][:60]),
        (5, "\0" * 12),
    ]


def test_a_sidechain_row_in_a_main_file_is_not_the_leaf(
    store: turnkeeper.BaseStore, corpus_dir: Path, tmp_path: Path
) -> None:
    """Older CLIs wrote sub-agents' rows (``isSidechain``) into the main file."""
    rows = rows_of(sub_file(corpus_dir, "agent-a881341.jsonl").read_text())
    for r in rows:
        r.pop("agentId")
        r["isSidechain"] = False
    side = {**rows[-1], "uuid": "side-1", "parentUuid": rows[-1]["uuid"], "isSidechain": True}
    target = tmp_path / "t.jsonl"
    target.write_text("".join(json.dumps(r) + "\n" for r in [*rows, side]))
    done = claude_code.import_file(store, target)
    assert done.result.added == len(rows) + 1
    assert store.sessions.get(SESSION).leaf_id == rows[-1]["uuid"]
    assert_replays_as_claude_code(store, SESSION, [*rows, side])


def expected_usage(rows: list[dict[str, Any]]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Per API response (``message.id``): its model and the figures of its last
    row in file order (FORMATS.md: one response is written as one row per
    content block, each with the response's usage so far; the last row's is
    the response's whole, its ``output_tokens`` grown), as (input, output,
    cache read, cache creation, their sum)."""
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for r in rows:
        m = r.get("message")
        if r.get("type") == "assistant" and isinstance(m, dict) and "usage" in m:
            u = m["usage"]
            parts = (
                u["input_tokens"],
                u["output_tokens"],
                u.get("cache_read_input_tokens", 0),
                u.get("cache_creation_input_tokens", 0),
            )
            found[m["id"]] = (m["model"], (*parts, sum(parts)))
    return found


def _usage_of(store: turnkeeper.BaseStore, sid: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    entries = {e.id: e for e in store.sessions.entries(sid)}
    got: dict[str, tuple[str, tuple[int, ...]]] = {}
    for r in store.usage.list(sid):
        assert (r.provider, r.protocol, r.source) == ("anthropic", "anthropic-messages", "import")
        response = entries[r.entry_id].payload["message"]["id"]
        assert response not in got  # one record per API response, never one per row
        figures = (
            r.input_tokens,
            r.output_tokens,
            r.cache_read_tokens,
            r.cache_write_tokens,
            r.total_tokens,
        )
        got[response] = (r.model, figures)
    return got


def test_usage_is_recorded_once_per_api_response_with_its_last_rows_figures(
    imported: Any, corpus_dir: Path
) -> None:
    store, done, rows = imported
    want = expected_usage(rows)
    assert len(want) == 152 and sum(r.get("type") == "assistant" for r in rows) == 299
    assert done.result.usage_added == len(want)
    assert _usage_of(store, SESSION) == want
    for sub in done.sub_agents:
        name = sub.session_id.split("/")[-1] + ".jsonl"
        assert _usage_of(store, sub.session_id) == expected_usage(
            rows_of(sub_file(corpus_dir, name).read_text())
        )
    again = import_any(store, main_file(corpus_dir))
    assert again.result.usage_added == 0


def test_a_grown_file_records_no_response_twice(
    store: Any, corpus_dir: Path, tmp_path: Path
) -> None:
    """Imported while a response was still being written (only its first rows),
    then whole: each response is recorded once (a response recorded from its
    first rows keeps those figures; see the README)."""
    text = sub_file(corpus_dir, "agent-a881341.jsonl").read_text()
    lines = text.splitlines(keepends=True)
    rows = rows_of(text)
    ids = [r["message"]["id"] if r.get("type") == "assistant" else None for r in rows]
    split = next(i for i, x in enumerate(ids) if x is not None and ids.count(x) > 1) + 1
    target = tmp_path / "agent-a881341.jsonl"
    target.write_text("".join(lines[:split]))
    first = claude_code.import_file(store, target)
    target.write_text(text)
    grown = claude_code.import_file(store, target)
    want = expected_usage(rows)
    assert first.result.usage_added + grown.result.usage_added == len(want) == 3
    assert set(_usage_of(store, first.session_id)) == set(want)
