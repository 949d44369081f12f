"""pi session files: import (versions 1–3, repairs, opaque lines) and export round trips.

Real files are read in place from the shared corpus (``../shared/corpus/pi``
next to the repository, or ``$TURNKEEPER_CORPUS``); without it the corpus
tests are left out locally (one summary line says so) and fail CI. Tests assert on counts, ids and
structure, never on the files' text.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import turnkeeper
from turnkeeper.formats import pi
from turnkeeper.spec.errors import InvalidInputError, SessionFileError, SessionNotFoundError
from turnkeeper.spec.records import OpaqueRecord
from turnkeeper.storage.duck import DuckDBStore

V1 = "pi-mono_session_v1_compaction_malformed-line.jsonl"
ZIG = "pi-mono-zig_v3_2026-05-17T13-51-26-739Z_019e3634-be13-7330-a2a4-ffab205872d1.jsonl"
SANDCASTLE = "sandcastle_v3_resumed-session.jsonl"
CORPUS_FILES = [V1, ZIG, SANDCASTLE]
BASE = ("type", "id", "parentId", "timestamp")
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DuckDBStore]:
    s = turnkeeper.open_store(str(tmp_path / "t.duckdb"))
    yield s
    s.close()


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[DuckDBStore]:
    s = turnkeeper.open_store(str(tmp_path / "fresh.duckdb"))
    yield s
    s.close()


# -- helpers that read files independently of the module under test ----------


def records_of(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line, record) for every record, splitting glued lines at '}{"type":'."""
    out: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            out.append((number, json.loads(line)))
        except json.JSONDecodeError:
            parts = re.split(r'(?<=\})(?=\{"type":)', line)
            out.extend((number, json.loads(p)) for p in parts)
    return out


def glued_lines(path: Path) -> list[int]:
    return sorted({n for n, c in Counter(n for n, _ in records_of(path)).items() if c > 1})


def payload_of(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in BASE}


def tree(store: DuckDBStore, sid: str) -> tuple[Any, ...]:
    """Everything an export must keep: entries (not seq), leaf, labels, replay."""
    entries = tuple(
        (e.id, e.parent_id, e.kind, json.dumps(e.payload), e.timestamp)
        for e in store.sessions.entries(sid)
    )
    session = store.sessions.get(sid)
    assert session is not None
    replay = store.sessions.replay(sid)
    return (
        entries,
        session.leaf_id,
        session.cwd,
        session.created_at,
        store.sessions.labels(sid),
        json.dumps(replay.messages),
        replay.entry_ids,
        replay.model,
        replay.thinking_level,
    )


def line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def ts(n: int) -> str:
    return f"2025-12-30T10:{n // 60:02d}:{n % 60:02d}.{n:03d}Z"


def header(version: Any = 3, sid: str = "sess-1", **extra: Any) -> dict[str, Any]:
    h: dict[str, Any] = {"type": "session"}
    if version is not None:
        h["version"] = version
    h.update({"id": sid, "timestamp": ts(0), "cwd": "/tmp/project", **extra})
    return h


def msg(
    eid: str | None, parent: str | None, n: int, role: str = "user", **m: Any
) -> dict[str, Any]:
    rec: dict[str, Any] = {"type": "message"}
    if eid is not None:
        rec.update({"id": eid, "parentId": parent})
    rec["timestamp"] = ts(n)
    rec["message"] = {"role": role, "content": [{"type": "text", "text": f"text {n}"}], **m}
    return rec


def v2_fixture() -> list[dict[str, Any]]:
    """A version 2 file: hookMessage role, label, branch summary, second root, unknowns."""
    return [
        header(2, "v2-session", parentSession="/tmp/source.jsonl", futureField={"x": [1, 2]}),
        {"type": "model_change", "id": "a1", "parentId": None, "timestamp": ts(1),
         "provider": "p", "modelId": "m"},
        msg("a2", "a1", 2),
        msg("a3", "a2", 3, "assistant", provider="p", model="m2", stopReason="stop"),
        {"type": "message", "id": "a4", "parentId": "a3", "timestamp": ts(4),
         "message": {"role": "hookMessage", "customType": "note", "content": "hook",
                     "display": True, "timestamp": 1767088804004}},
        {"type": "label", "id": "a5", "parentId": "a4", "timestamp": ts(5),
         "targetId": "a2", "label": "start"},
        {"type": "branch_summary", "id": "b1", "parentId": "a2", "timestamp": ts(6),
         "fromId": "a5", "summary": "abandoned work", "details": {"readFiles": []}},
        msg("b2", "b1", 7),
        msg("r1", None, 8),
        {"type": "telemetry_sample", "id": "u1", "parentId": "r1", "timestamp": ts(9),
         "zeta": 1, "alpha": {"nested": [1, "two", None]}, "tags": ["a"]},
        {"type": "custom_message", "id": "k1", "parentId": "u1", "timestamp": ts(10),
         "customType": "ext", "content": "shown", "display": False, "extraField": 7},
        msg("b3", "b2", 11, "assistant", provider="p", model="m3"),
    ]  # fmt: skip


def write(path: Path, recs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(line(r) + "\n" for r in recs), encoding="utf-8")
    return path


def roundtrip(store: DuckDBStore, fresh: DuckDBStore, sid: str, tmp_path: Path) -> list[str]:
    out = tmp_path / "exported.jsonl"
    count = pi.export_file(store, sid, out)
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == count
    again = pi.import_file(fresh, out)
    assert again.session_id == sid and again.issues == () and again.version == 3
    assert tree(fresh, sid) == tree(store, sid)
    assert list(pi.export_lines(fresh, sid)) == lines[:-1]
    return lines[:-1]


# -- the corpus ---------------------------------------------------------------


def test_corpus_is_the_expected_set(pi_dir: Path) -> None:
    assert sorted(p.name for p in pi_dir.glob("*.jsonl")) == sorted(CORPUS_FILES)


def test_every_corpus_file_imports_with_independent_counts(pi_dir: Path, tmp_path: Path) -> None:
    files = sorted(pi_dir.glob("*.jsonl"))
    assert files
    for path in files:
        recs = records_of(path)
        with turnkeeper.open_store(str(tmp_path / f"{path.name}.duckdb")) as s:
            done = pi.import_file(s, path)
            head = recs[0][1]
            assert done.session_id == head["id"]
            assert done.version == head.get("version", 1)
            assert done.result.created and done.result.opaque_added == 0
            assert done.result.added == len(recs) - 1
            assert [i.line for i in done.issues if i.kind == "repaired"] == glued_lines(path)
            assert all(i.kind == "repaired" for i in done.issues)
            entries = s.sessions.entries(done.session_id)
            assert Counter(e.kind for e in entries) == Counter(r["type"] for _, r in recs[1:])
            assert [e.payload for e in entries if e.kind != "compaction"] == [
                payload_of(r) for _, r in recs[1:] if r["type"] != "compaction"
            ]
            assert [e.timestamp for e in entries] == [
                datetime.fromisoformat(r["timestamp"]) for _, r in recs[1:]
            ]
            session = s.sessions.get(done.session_id)
            assert session is not None
            assert session.entry_count == len(recs) - 1
            assert session.leaf_id == entries[-1].id
            assert session.cwd == head["cwd"]
            assert session.created_at == datetime.fromisoformat(head["timestamp"])
            assert dict(session.header) == {k: v for k, v in head.items() if k != "type"}
            assert s.sessions.opaque_records(done.session_id) == []


@pytest.mark.parametrize("name", CORPUS_FILES)
def test_corpus_reimport_adds_nothing(pi_dir: Path, store: DuckDBStore, name: str) -> None:
    first = pi.import_file(store, pi_dir / name)
    second = pi.import_file(store, pi_dir / name)
    assert first.result.added > 0
    assert (second.result.created, second.result.added) == (False, 0)
    assert second.result.skipped == first.result.added
    assert second.result.opaque_added == 0


@pytest.mark.parametrize("name", CORPUS_FILES)
def test_corpus_export_reimport_same_tree(
    pi_dir: Path, store: DuckDBStore, fresh: DuckDBStore, tmp_path: Path, name: str
) -> None:
    done = pi.import_file(store, pi_dir / name)
    lines = roundtrip(store, fresh, done.session_id, tmp_path)
    exported_header = json.loads(lines[0])
    assert list(exported_header)[:5] == ["type", "version", "id", "timestamp", "cwd"]
    assert exported_header["version"] == 3


@pytest.mark.parametrize("name", [ZIG, SANDCASTLE])
def test_v3_export_reproduces_the_file(pi_dir: Path, store: DuckDBStore, name: str) -> None:
    path = pi_dir / name
    done = pi.import_file(store, path)
    original = [ln for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip()]
    assert list(pi.export_lines(store, done.session_id)) == original


def test_v1_glued_line_compaction_and_replay(pi_dir: Path, store: DuckDBStore) -> None:
    path = pi_dir / V1
    recs = [r for _, r in records_of(path)]
    assert "version" not in recs[0] and all("id" not in r for r in recs[1:])
    done = pi.import_file(store, path)
    assert [(i.line, i.kind) for i in done.issues] == [(440, "repaired")]
    assert str(done.issues[0]).startswith(f"{path}:440: repaired: ")
    entries = store.sessions.entries(done.session_id)
    assert len(entries) == len(recs) - 1 and len({e.id for e in entries}) == len(entries)
    # a linear chain in file order
    assert [e.parent_id for e in entries] == [None] + [e.id for e in entries[:-1]]
    comps = [(i, e) for i, e in enumerate(entries, 1) if e.kind == "compaction"]
    assert len(comps) == 1
    comp_index, comp = comps[0]
    index = recs[comp_index]["firstKeptEntryIndex"]
    assert index == 355
    assert comp.payload["firstKeptEntryIndex"] == index
    kept = entries[index - 1]  # entries[k] is record k + 1 (the header is record 0)
    assert kept.payload == payload_of(recs[index])
    assert comp.payload["firstKeptEntryId"] == kept.id
    replay = store.sessions.replay(done.session_id)
    assert replay.messages[0]["role"] == "compactionSummary"
    assert replay.messages[0]["summary"] == recs[comp_index]["summary"]
    assert replay.entry_ids[0] == comp.id
    expected = [r["message"] for r in recs[index:comp_index] if r["type"] == "message"]
    expected += [r["message"] for r in recs[comp_index + 1 :] if r["type"] == "message"]
    assert list(replay.messages[1:]) == expected
    assert replay.entry_ids[1] == kept.id


def test_v1_grown_file_keeps_old_ids(pi_dir: Path, store: DuckDBStore, tmp_path: Path) -> None:
    path = pi_dir / V1
    lines = path.read_text(encoding="utf-8").split("\n")
    part = tmp_path / "v1-part.jsonl"
    part.write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    first = pi.import_file(store, part)
    old = [(e.id, e.parent_id, e.seq) for e in store.sessions.entries(first.session_id)]
    assert first.result.added == 299 == len(old)
    full = pi.import_file(store, path)
    assert full.result.added == len(records_of(path)) - 1 - len(old)
    assert full.result.skipped == len(old)
    now = store.sessions.entries(first.session_id)
    assert [(e.id, e.parent_id, e.seq) for e in now[: len(old)]] == old
    assert now[len(old)].parent_id == old[-1][0]
    session = store.sessions.get(first.session_id)
    assert session is not None and session.leaf_id == now[-1].id


def test_zig_v3_roots_and_cjk_kept(pi_dir: Path, store: DuckDBStore) -> None:
    path = pi_dir / ZIG
    recs = [r for _, r in records_of(path)]
    done = pi.import_file(store, path)
    entries = store.sessions.entries(done.session_id)
    assert [e.id for e in entries] == [r["id"] for r in recs[1:]]
    assert [e.parent_id for e in entries] == [r["parentId"] for r in recs[1:]]
    roots = [e for e in entries if e.parent_id is None]
    assert len(roots) == sum(r["parentId"] is None for r in recs[1:]) >= 1
    assert entries[0].kind == "model_change" and entries[0] in roots
    assert all(len(e.id) == 8 for e in entries)
    cjk_in_file = len(CJK.findall(json.dumps([payload_of(r) for r in recs], ensure_ascii=False)))
    stored = json.dumps([dict(e.payload) for e in entries], ensure_ascii=False)
    assert cjk_in_file > 0 and len(CJK.findall(stored)) == cjk_in_file
    replay = store.sessions.replay(done.session_id)
    changes = [r for r in recs if r["type"] == "model_change"]
    assert changes[0]["provider"] != changes[-1]["provider"]  # the provider switch
    assert replay.model is not None
    assert len(replay.messages) == sum(r["type"] == "message" for r in recs)


def test_sandcastle_resumed_file_adds_only_new(
    pi_dir: Path, store: DuckDBStore, tmp_path: Path
) -> None:
    path = pi_dir / SANDCASTLE
    lines = path.read_text(encoding="utf-8").split("\n")
    part = tmp_path / "resumed-part.jsonl"
    part.write_text("\n".join(lines[:5]) + "\n", encoding="utf-8")
    first = pi.import_file(store, part)
    assert (first.result.created, first.result.added) == (True, 4)
    session = store.sessions.get(first.session_id)
    assert session is not None and session.leaf_id == json.loads(lines[4])["id"]
    full = pi.import_file(store, path)
    assert (full.result.created, full.result.added, full.result.skipped) == (False, 2, 4)
    last = [r for _, r in records_of(path)][-1]
    session = store.sessions.get(first.session_id)
    assert session is not None
    assert session.leaf_id == last["id"] and session.entry_count == 6
    assert store.sessions.replay(first.session_id).entry_ids[-1] == last["id"]
    assert pi.import_file(store, path).result.added == 0


# -- synthetic files --------------------------------------------------------------


def test_v2_fixture_migrates_and_keeps_unknowns(
    store: DuckDBStore, fresh: DuckDBStore, tmp_path: Path
) -> None:
    recs = v2_fixture()
    done = pi.import_file(store, write(tmp_path / "v2.jsonl", recs))
    assert (done.version, done.issues, done.result.added) == (2, (), len(recs) - 1)
    sid = "v2-session"
    session = store.sessions.get(sid)
    assert session is not None
    assert dict(session.header) == {k: v for k, v in recs[0].items() if k != "type"}
    assert session.leaf_id == "b3"
    by_id = {e.id: e for e in store.sessions.entries(sid)}
    hook = by_id["a4"].payload["message"]
    assert hook["role"] == "custom"
    assert list(hook) == list(recs[4]["message"])
    assert {k: v for k, v in hook.items() if k != "role"} == {
        k: v for k, v in recs[4]["message"].items() if k != "role"
    }
    unknown = by_id["u1"]
    assert unknown.kind == "telemetry_sample" and unknown.parent_id == "r1"
    assert list(unknown.payload.items()) == list(payload_of(recs[9]).items())
    assert dict(by_id["k1"].payload) == payload_of(recs[10])
    assert by_id["b1"].parent_id == "a2" and by_id["b1"].payload["fromId"] == "a5"
    assert sorted(e.id for e in by_id.values() if e.parent_id is None) == ["a1", "r1"]
    assert store.sessions.labels(sid) == {"a2": "start"}
    replay = store.sessions.replay(sid)
    assert replay.entry_ids == ("a2", "b1", "b2", "b3")
    assert replay.messages[1]["role"] == "branchSummary"
    assert replay.model == {"provider": "p", "modelId": "m3"}
    lines = roundtrip(store, fresh, sid, tmp_path)
    exported = [json.loads(x) for x in lines]
    assert exported[0]["version"] == 3 and exported[0]["futureField"] == {"x": [1, 2]}
    assert exported[0]["parentSession"] == "/tmp/source.jsonl"
    assert exported[4]["message"]["role"] == "custom"
    assert exported[9] == recs[9]


def test_glued_unparseable_and_cut_off_lines(store: DuckDBStore, tmp_path: Path) -> None:
    cut = line(msg("e4", "e3", 4))
    cut = cut[: cut.index("text 4") + 3]  # cut off inside the text block
    cut_nested = line(msg("e6", "e5", 6))
    cut_nested = cut_nested[: cut_nested.rindex("}]") + 1]  # a complete nested block remains
    text = "\n".join(
        [
            line(header()),
            line(msg("e1", None, 1)),
            line(msg("e2", "e1", 2)) + line(msg("e3", "e2", 3)),
            "this is not json {",
            cut + line(msg("e5", "e3", 5)),
            "",
            "   ",
            cut_nested + line(msg("e7", "e5", 7)),
            line({"type": "label", "id": "e8", "parentId": "e7", "timestamp": ts(8)}),
            line(msg("e9", "e7", 9)),
            '{"type":"message","id":"e10","parentId":"e9","timestamp":"' + ts(10),
        ]
    )
    path = write(tmp_path / "damaged.jsonl", [])
    path.write_text(text, encoding="utf-8")
    done = pi.import_file(store, path)
    assert [(i.line, i.kind) for i in done.issues] == [
        (3, "repaired"),
        (4, "opaque"),
        (5, "repaired"),
        (5, "opaque"),
        (8, "repaired"),
        (8, "opaque"),
        (9, "opaque"),
        (11, "opaque"),
    ]
    assert "targetId" in done.issues[6].detail
    assert str(done.issues[1]) == f"{path}:4: opaque: {done.issues[1].detail}"
    entries = store.sessions.entries("sess-1")
    assert [e.id for e in entries] == ["e1", "e2", "e3", "e5", "e7", "e9"]
    assert done.result.opaque_added == 5
    opaque = store.sessions.opaque_records("sess-1")
    assert [(o.line, o.source) for o in opaque] == [(n, str(path)) for n in (4, 5, 8, 9, 11)]
    raws = {o.line: o.raw for o in opaque}
    assert raws[4] == "this is not json {"
    assert raws[5] == cut and raws[8] == cut_nested
    assert json.loads(raws[9])["id"] == "e8"
    assert all(o.reason for o in opaque)
    session = store.sessions.get("sess-1")
    assert session is not None and session.leaf_id == "e9"
    again = pi.import_file(store, path)
    assert (again.result.added, again.result.opaque_added) == (0, 0)


def test_several_bad_parts_on_one_line_are_one_opaque_record(store: DuckDBStore) -> None:
    bad = line({"type": "label", "id": "x1", "parentId": None, "timestamp": ts(1)})
    text = "\n".join([line(header()), "garbage" + bad + line(msg("e1", None, 2))])
    parsed = pi.parse_text(text, "mem.jsonl")
    assert [e.id for e in parsed.batch.entries] == ["e1"]
    assert len(parsed.batch.opaque) == 1
    assert parsed.batch.opaque[0].raw == text.split("\n")[1]
    assert store.sessions.import_batch(parsed.batch).opaque_added == 1


@pytest.mark.parametrize(
    "first",
    [
        "",
        "not json",
        line(msg("e1", None, 1)),
        line({"type": "session", "timestamp": ts(0)}),
        line(header(version=4)),
        line(header(version="3")),
        line({**header(), "timestamp": "yesterday"}),
    ],
)
def test_bad_header_raises_and_writes_nothing(
    store: DuckDBStore, tmp_path: Path, first: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(first + "\n", encoding="utf-8")
    with pytest.raises(SessionFileError) as info:
        pi.import_file(store, path)
    assert info.value.path == str(path) and info.value.line == 1
    assert store.sessions.count() == 0


def test_entry_timestamps_fall_back_to_the_header(store: DuckDBStore) -> None:
    a = msg("e1", None, 1)
    del a["timestamp"]
    b = {**msg("e2", "e1", 2), "timestamp": "not a time"}
    parsed = pi.parse_text("\n".join(line(r) for r in [header(), a, b, msg("e3", "e2", 3)]))
    created = datetime(2025, 12, 30, 10, 0, 0, tzinfo=UTC)
    assert parsed.batch.created_at == created
    assert [e.timestamp for e in parsed.batch.entries] == [
        created,
        created,
        datetime(2025, 12, 30, 10, 0, 3, 3000, tzinfo=UTC),
    ]
    assert parsed.issues == ()


def test_v1_indexes_count_glued_and_opaque_records(store: DuckDBStore) -> None:
    def comp(n: int, index: Any) -> dict[str, Any]:
        return {"type": "compaction", "timestamp": ts(n), "summary": f"s{n}",
                "firstKeptEntryIndex": index, "tokensBefore": 10}  # fmt: skip

    lines = [
        line(header(version=None, sid="v1", provider="p", modelId="m", thinkingLevel="off")),
        line(msg(None, None, 1)),  # record 1
        line(msg(None, None, 2)) + line(msg(None, None, 3, "hookMessage")),  # records 2, 3
        "{broken",  # record 4
        line(msg(None, None, 5)),  # record 5
        line(comp(6, 3)),  # record 6
        line(comp(7, 4)),  # record 7: index of the opaque line
        line(comp(8, 0)),  # record 8: the header
    ]
    parsed = pi.parse_text("\n".join(lines))
    entries = {e.payload["message"]["content"][0]["text"]: e for e in parsed.batch.entries[:4]}
    assert list(entries) == ["text 1", "text 2", "text 3", "text 5"]
    assert entries["text 3"].payload["message"]["role"] == "custom"
    comps = parsed.batch.entries[4:]
    assert [c.payload["firstKeptEntryId"] for c in comps] == [entries["text 3"].id, None, None]
    assert [list(c.payload)[:3] for c in comps] == [
        ["summary", "firstKeptEntryId", "firstKeptEntryIndex"]
    ] * 3
    assert [e.parent_id for e in parsed.batch.entries] == [None] + [
        e.id for e in parsed.batch.entries[:-1]
    ]
    assert parsed.version == 1 and parsed.batch.header["provider"] == "p"
    assert [(i.line, i.kind) for i in parsed.issues] == [(3, "repaired"), (4, "opaque")]
    assert store.sessions.import_batch(parsed.batch).added == 7
    # same ids when the file is read again, with more appended
    grown = pi.parse_text("\n".join([*lines, line(msg(None, None, 9))]))
    assert [e.id for e in grown.batch.entries[:7]] == [e.id for e in parsed.batch.entries]
    result = store.sessions.import_batch(grown.batch)
    assert (result.added, result.skipped) == (1, 7)
    assert store.sessions.replay("v1").entry_ids[:2] == (comps[-1].id, grown.batch.entries[-1].id)


def test_duplicate_entry_ids_keep_the_first(store: DuckDBStore) -> None:
    text = "\n".join(line(r) for r in [header(), msg("e1", None, 1), msg("e1", None, 2)])
    parsed = pi.parse_text(text)
    assert [e.timestamp.second for e in parsed.batch.entries] == [1]
    assert [(i.line, i.kind) for i in parsed.issues] == [(3, "opaque")]
    assert store.sessions.import_batch(parsed.batch).added == 1


def test_export_of_a_missing_session_raises(store: DuckDBStore, tmp_path: Path) -> None:
    with pytest.raises(SessionNotFoundError):
        list(pi.export_lines(store, "nope"))
    with pytest.raises(SessionNotFoundError):
        pi.export_file(store, "nope", tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_export_timestamps_keep_microseconds(store: DuckDBStore, fresh: DuckDBStore) -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    store.sessions.create("s", cwd="/w", header={"parentSession": "/p.jsonl"}, created_at=created)
    store.sessions.append(
        "s", "session_info", {"name": "t"}, timestamp=created.replace(microsecond=7000)
    )
    lines = [json.loads(x) for x in pi.export_lines(store, "s")]
    assert lines[0] == {
        "type": "session",
        "version": 3,
        "id": "s",
        "timestamp": "2026-01-02T03:04:05.123456Z",
        "cwd": "/w",
        "parentSession": "/p.jsonl",
    }
    assert lines[1]["timestamp"] == "2026-01-02T03:04:05.007Z"
    assert fresh.sessions.import_batch(pi.parse_text("\n".join(map(line, lines))).batch).added == 1
    assert tree(fresh, "s") == tree(store, "s")


def test_unstorable_records_are_opaque_and_bad_text_is_repaired(
    store: DuckDBStore, tmp_path: Path
) -> None:
    def custom(eid: str, data: bytes) -> bytes:
        head = f'{{"type":"custom","id":"{eid}","parentId":null,"timestamp":"{ts(1)}",'
        return head.encode() + b'"customType":"x","data":' + data + b"}\n"

    path = tmp_path / "odd.jsonl"
    path.write_bytes(
        (line(header()) + "\n").encode()
        + custom("a", b'"bad \xff byte"')  # not UTF-8: repaired
        + custom("b", b'"\\ud800"')  # a lone surrogate escape: repaired
        + custom("c", b"1" * 30)  # beyond 64-bit integers: opaque
        + custom("d", b"NaN")  # not JSON (JSON.parse refuses it too): opaque
        + custom("e", b'"fine"')
    )
    done = pi.import_file(store, path)
    entries = {e.id: e for e in store.sessions.entries("sess-1")}
    assert sorted(entries) == ["a", "b", "e"]
    assert entries["a"].payload["data"] == "bad \ufffd byte"
    assert entries["b"].payload["data"] == "\ufffd"
    assert [(i.line, i.kind) for i in done.issues] == [
        (2, "repaired"),
        (3, "repaired"),
        (4, "opaque"),
        (5, "opaque"),
    ]
    assert [o.line for o in store.sessions.opaque_records("sess-1")] == [4, 5]


def test_a_lone_surrogate_mid_file_does_not_cut_the_chain(store: DuckDBStore) -> None:
    recs = [msg(f"e{i}", f"e{i - 1}" if i else None, i) for i in range(5)]
    recs[2]["message"]["content"][0]["text"] = "broken \ud83d emoji"
    text = "\n".join(line(r) for r in [header(), *recs]).replace("\ud83d", "\\ud83d")
    parsed = pi.parse_text(text)
    assert [i.kind for i in parsed.issues] == ["repaired"]
    store.sessions.import_batch(parsed.batch)
    assert store.sessions.replay("sess-1").entry_ids == ("e0", "e1", "e2", "e3", "e4")


def test_store_refuses_duplicate_keys_in_one_batch(store: DuckDBStore) -> None:
    text = "\n".join([line(header()), line(msg("e1", None, 1)), "not json"])
    parsed = pi.parse_text(text)
    batch = parsed.batch
    twice = dataclasses.replace(batch, entries=[*batch.entries, *batch.entries])
    with pytest.raises(InvalidInputError):
        store.sessions.import_batch(twice)
    o = OpaqueRecord("f", 3, "x", "r")
    with pytest.raises(InvalidInputError):
        store.sessions.import_batch(dataclasses.replace(batch, opaque=[o, o]))
    assert store.sessions.count() == 0


# -- export_file: permissions and symbolic links ------------------------------------------


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    """Set the process umask for one test (restored afterwards)."""
    old = os.umask(0o022)

    def set_umask(mask: int) -> None:
        os.umask(mask)

    yield set_umask
    os.umask(old)


def stored_session(store: DuckDBStore, sid: str = "sess-1") -> list[str]:
    """Import a small session; returns its export lines."""
    store.sessions.import_batch(
        pi.parse_text("\n".join(line(r) for r in [header(sid=sid), msg("e1", None, 1)])).batch
    )
    return list(pi.export_lines(store, sid))


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_export_file_mode_follows_the_umask(
    store: DuckDBStore, tmp_path: Path, umask: Callable[[int], None], mask: int, expected: int
) -> None:
    lines = stored_session(store)
    umask(mask)
    out = tmp_path / "new.jsonl"
    assert pi.export_file(store, "sess-1", out) == len(lines)
    assert mode_of(out) == expected
    assert out.read_text(encoding="utf-8").splitlines() == lines
    assert leftovers(tmp_path) == []


def test_export_file_keeps_a_replaced_files_mode(
    store: DuckDBStore, tmp_path: Path, umask: Callable[[int], None]
) -> None:
    stored_session(store)
    umask(0o022)
    out = tmp_path / "private.jsonl"
    out.write_text("old\n")
    out.chmod(0o640)
    pi.export_file(store, "sess-1", out)
    assert mode_of(out) == 0o640 and out.read_text().startswith('{"type":"session"')


def test_export_file_through_a_symlink_replaces_its_target(
    store: DuckDBStore, tmp_path: Path, umask: Callable[[int], None]
) -> None:
    lines = stored_session(store)
    umask(0o022)
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    real = real_dir / "session.jsonl"
    real.write_text("old\n")
    link_dir = tmp_path / "links"
    link_dir.mkdir()
    link = link_dir / "session.jsonl"
    link.symlink_to(Path("..") / "real" / "session.jsonl")
    chained = tmp_path / "chained.jsonl"
    chained.symlink_to(link)

    pi.export_file(store, "sess-1", chained)
    assert chained.is_symlink() and link.is_symlink()
    assert os.readlink(link) == os.path.join("..", "real", "session.jsonl")
    assert real.read_text(encoding="utf-8").splitlines() == lines
    assert leftovers(tmp_path) == leftovers(link_dir) == leftovers(real_dir) == []

    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(real_dir / "not-yet.jsonl")
    pi.export_file(store, "sess-1", dangling)
    assert dangling.is_symlink()
    assert (real_dir / "not-yet.jsonl").read_text(encoding="utf-8").splitlines() == lines
    assert mode_of(real_dir / "not-yet.jsonl") == 0o644


def test_export_file_refuses_a_symlink_loop(store: DuckDBStore, tmp_path: Path) -> None:
    stored_session(store)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(OSError) as caught:
        pi.export_file(store, "sess-1", a)
    assert caught.value.errno == errno.ELOOP
    assert a.is_symlink() and b.is_symlink() and leftovers(tmp_path) == []
