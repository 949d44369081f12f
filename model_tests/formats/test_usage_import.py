"""Importing a pi file records the usage its assistant messages carry, on both
backends: for every corpus file, the records equal what the file's JSON says
(computed here by :mod:`usage_expected`, not by turnkeeper's reader); a
re-import, a grown file and an import after a runtime recorded an entry's usage
record nothing twice; a file imported before usage was recorded gets it on its
next import; odd figures are unknown, never a failed import.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from usage_expected import Expected, expected_file, expected_usage

import turnkeeper
from turnkeeper.formats import pi
from turnkeeper.spec import errors
from turnkeeper.storage.ops import import_chunks, imports

CORPUS_FILES = [
    "pi-mono-zig_v3_2026-05-17T13-51-26-739Z_019e3634-be13-7330-a2a4-ffab205872d1.jsonl",
    "pi-mono_session_v1_compaction_malformed-line.jsonl",
    "sandcastle_v3_resumed-session.jsonl",
]


def _key(r: turnkeeper.UsageRecord) -> tuple:
    tokens = (
        r.input_tokens,
        r.output_tokens,
        r.cache_read_tokens,
        r.cache_write_tokens,
        r.total_tokens,
    )
    return (r.provider, r.protocol, r.model, tokens, r.cost_usd, r.recorded_at)


def _expected_key(e: Expected) -> tuple:
    return (e.provider, e.protocol, e.model, e.tokens, e.cost, e.at)


def _check(store, sid: str, found: list[Expected]) -> list[turnkeeper.UsageRecord]:
    stored = store.usage.list(sid)
    assert Counter(map(_key, stored)) == Counter(map(_expected_key, found))
    assert {r.source for r in stored} <= {"import"}
    assert all(r.id == f"entry:{r.entry_id}" for r in stored)
    for e in found:
        if e.entry_id is not None:  # version 3: keyed by the file's own entry id
            assert _key(store.usage.get(sid, f"entry:{e.entry_id}")) == _expected_key(e)
    return stored


@pytest.mark.parametrize("name", CORPUS_FILES)
def test_a_corpus_file_yields_the_usage_its_messages_carry(store, pi_dir: Path, name: str):
    path = pi_dir / name
    found = expected_file(path)
    assert found  # every corpus file has assistant messages with usage
    done = pi.import_file(store, path)
    assert done.result.usage_added == len(found)
    stored = _check(store, done.session_id, found)
    entries = {e.id for e in store.sessions.entries(done.session_id)}
    assert {r.entry_id for r in stored} <= entries

    again = pi.import_file(store, path)  # idempotent
    assert (again.result.added, again.result.usage_added) == (0, 0)
    assert store.usage.list(done.session_id) == stored


def test_a_grown_file_adds_only_the_new_messages_usage(store, pi_dir: Path, tmp_path: Path):
    path = pi_dir / CORPUS_FILES[2]
    lines = path.read_text(encoding="utf-8").split("\n")
    part = tmp_path / "resumed.jsonl"
    part.write_text("\n".join(lines[:5]) + "\n", encoding="utf-8")
    first = pi.import_file(store, part)
    assert first.result.usage_added == len(expected_usage(part.read_text(encoding="utf-8"))) == 1
    part.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    grown = pi.import_file(store, part)
    assert grown.result.usage_added == 1
    _check(store, first.session_id, expected_file(path))


def test_a_file_imported_before_usage_was_recorded_gets_it_on_its_next_import(
    store, pi_dir: Path, monkeypatch
):
    """The control first: with the usage step patched out an import records
    nothing (what a store imported into before schema 16 holds: nor what the
    import read, recorded since schema 30); the next import, unpatched,
    records every message's usage from the stored entries."""
    path = pi_dir / CORPUS_FILES[0]
    monkeypatch.setattr(
        import_chunks.usage, "import_usage", lambda tx, sid, entries, responses=None: 0
    )
    monkeypatch.setattr(imports, "record_source", lambda tx, sid, read: None)
    done = pi.import_file(store, path)
    assert store.usage.list(done.session_id) == []
    monkeypatch.undo()
    again = pi.import_file(store, path)
    assert again.result.added == 0 and again.result.usage_added == len(expected_file(path))
    _check(store, done.session_id, expected_file(path))


def test_an_entrys_usage_a_runtime_recorded_is_not_recorded_again(store, tmp_path: Path):
    usage = {"input": 100, "output": 200}
    store.sessions.create("rt")
    reply = {"role": "assistant", "content": [], "model": "m", "usage": usage}
    store.sessions.append("rt", "message", {"message": reply}, entry_id="a2")
    mine = store.usage.record("rt", provider="p", model="m", output_tokens=7, entry_id="a2")
    text = _file([_assistant("a2", usage, "m"), _assistant("a3", usage, "m")], sid="rt")
    done = pi.import_file(store, _write(tmp_path, text))
    assert done.result.usage_added == 1  # a3's only
    assert store.usage.list("rt")[0] == mine  # the runtime's record of a2 stands
    assert [r.entry_id for r in store.usage.list("rt")] == ["a2", "a3"]


def test_an_import_refused_busy_records_no_usage(store, tmp_path: Path):
    store.sessions.create("held")
    lease = store.leases.acquire("session:held", "p1", 600)
    text = _file([_assistant("b1", {"input": 1, "output": 1}, "m")], sid="held")
    path = _write(tmp_path, text)
    with pytest.raises(errors.BusyError):
        pi.import_file(store, path)
    assert store.usage.list("held") == []
    parsed = pi.parse_file(path)
    assert store.sessions.import_batch(parsed.batch, lease=lease).usage_added == 1


# -- odd figures ------------------------------------------------------------------

ODD = [
    ("o1", {"input": -5, "output": 2.5, "cacheRead": True, "cacheWrite": "7", "totalTokens": 9}),
    ("o2", {"input": 1e30, "output": 2**62, "cacheRead": 1e300, "cacheWrite": 3.0}),
    ("o3", {"input": 4, "cost": {"total": 1e300}}),
    ("o4", {"input": 4, "cost": "free"}),
    ("o5", {"output": 8, "cost": {"total": -1}}),
    ("o6", {"totalTokens": 10**12, "cost": {"total": 0.25}}),
    ("o7", {"cost": {"total": 2}}),
]


def _assistant(eid: str, usage, model: str, provider: str = "prov") -> dict:
    return {
        "type": "message",
        "id": eid,
        "parentId": None,
        "timestamp": "2026-02-03T04:05:06.789Z",
        "message": {
            "role": "assistant",
            "content": [{"type": "text", "text": "ok"}],
            "api": "api\x00x",
            "provider": provider,
            "model": model,
            "usage": usage,
            "stopReason": "stop",
        },
    }


def _file(records: list[dict], sid: str = "odd") -> str:
    header = {"type": "session", "version": 3, "id": sid, "timestamp": "2026-02-03T04:05:06Z"}
    prev = None
    lines = [json.dumps(header)]
    for r in records:
        r = {**r, "parentId": prev}
        prev = r["id"]
        lines.append(json.dumps(r))
    return "\n".join(lines) + "\n"


def _write(folder: Path, text: str, name: str = "s.jsonl") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_odd_figures_are_unknown_and_never_fail_the_import(store, tmp_path: Path):
    records = [_assistant(eid, usage, f"model\x00{eid}") for eid, usage in ODD]
    records += [
        _assistant("n1", "not a dict", "m"),
        _assistant("n2", {"tokens": 5}, "m"),  # none of pi's usage keys
        {**_assistant("n3", {"input": 1}, "m"), "message": {"role": "user", "usage": {"input": 1}}},
        _assistant("n4", {"input": 1, "output": 1}, ["not", "a", "string"]),  # type: ignore[arg-type]
    ]
    text = _file(records)
    found = expected_usage(text)
    assert [e.model for e in found] == [f"model\x00{eid}" for eid, _ in ODD] + [""]
    done = pi.import_file(store, _write(tmp_path, text))
    assert done.result.added == len(records)
    assert done.result.usage_added == len(found)
    stored = _check(store, "odd", found)
    by_id = {r.entry_id: r for r in stored}
    assert _key(by_id["o1"])[3] == (None, None, None, None, 9)
    assert _key(by_id["o2"])[3] == (None, None, None, 3, None)
    assert [by_id[e].cost_usd for e in ("o3", "o4", "o5", "o6", "o7")] == [
        None,
        None,
        None,
        0.25,
        2.0,
    ]
    assert by_id["o6"].total_tokens == 10**12
