"""A pi file that has only grown since its last import (its bytes read then
unchanged: their recorded sha256) is read from where that import stopped
(issue 21, part 3); any other change is imported whole. What is asserted is
counted (lines split into records), never timed."""

from __future__ import annotations

import json
from pathlib import Path

import pi_big
import pytest

from turnkeeper.formats import _rows, pi

ENTRIES = 400


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The line numbers every pi line reader split into records (``pi_big.spy_parses``)."""
    return pi_big.spy_parses(monkeypatch)


def _grown(path: Path, extra: bytes = b"") -> None:
    """Append 8 entries to a file of :data:`ENTRIES`, after ``extra`` lines."""
    with open(path, "ab") as f:
        f.write(extra)
    pi_big.append(path, ENTRIES, 8)


def test_a_grown_file_reads_only_its_tail(store, tmp_path: Path, parses):
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    pi.import_file(store, path)
    _grown(path)
    parses.clear()
    grown = pi.import_file(store, path)
    assert parses == [1, 1, *range(ENTRIES + 2, ENTRIES + 10)]
    assert (grown.result.added, grown.result.skipped) == (8, ENTRIES)
    session = store.sessions.get("big-1")
    assert (session.entry_count, session.leaf_id) == (ENTRIES + 8, f"e{ENTRIES + 7:07x}")
    assert len(store.usage.list("big-1")) == (ENTRIES + 8) // 4
    known = store.sessions.imported_source("big-1", str(path.resolve()))
    assert (known.bytes, known.entries) == (path.stat().st_size, ENTRIES + 8)
    assert known.sha256 == _rows.file_digest(path)[1]
    replay = store.sessions.replay("big-1")
    assert replay.entry_ids[-1] == f"e{ENTRIES + 7:07x}" and len(replay.entry_ids) == ENTRIES + 8
    parses.clear()
    assert pi.import_file(store, path).unchanged and parses == [1]


def test_a_file_changed_in_its_old_bytes_and_grown_is_imported_whole(store, tmp_path: Path, parses):
    """An entry's id changed before the old end (same size), then grown: the
    old bytes' digest differs, so the file is read whole and the changed
    entry is added with the new ones."""
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    pi.import_file(store, path)
    data = path.read_bytes()
    at = data.index(b'"id":"e0000010"')  # a user message: a new branch
    path.write_bytes(data[:at] + b'"id":"f0000010"' + data[at + 15 :])
    _grown(path)
    parses.clear()
    changed = pi.import_file(store, path)
    assert len(parses) == 2 + 1 + ENTRIES + 8  # the header twice, then every line
    assert (changed.result.added, changed.result.skipped) == (9, ENTRIES - 1)
    assert store.sessions.entry("big-1", "f0000010") is not None


def test_control_without_the_digest_the_changed_old_bytes_are_missed(
    store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Control for the test above: with the old bytes' digest taken as matching,
    only the tail is read and the changed entry is never stored."""
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    pi.import_file(store, path)
    data = path.read_bytes()
    at = data.index(b'"id":"e0000010"')
    path.write_bytes(data[:at] + b'"id":"f0000010"' + data[at + 15 :])
    _grown(path)
    known = store.sessions.imported_source("big-1", str(path.resolve()))
    real = _rows.prefix_digest

    def matching(p: object, size: int) -> tuple[str, int] | None:
        found = real(p, size)  # type: ignore[arg-type]
        return None if found is None else (known.sha256, found[1])

    monkeypatch.setattr(pi, "prefix_digest", matching)
    missed = pi.import_file(store, path)
    assert missed.result.added == 8
    assert store.sessions.entry("big-1", "f0000010") is None


def test_a_cut_file_or_one_not_ending_a_line_is_imported_whole(store, tmp_path: Path, parses):
    """Cut by an entry, the file is read whole (nothing to add); a file whose
    last import ended inside a line (no newline after it) is read whole when
    grown: the line it cut may now parse."""
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 1])
    parses.clear()
    cut = pi.import_file(store, path)
    assert cut.result.added == ENTRIES - 1
    path.write_bytes(data[:-1])  # the last entry's line, without its newline
    assert pi.import_file(store, path).result.added == 1
    _grown(path, b"\n")
    parses.clear()
    grown = pi.import_file(store, path)
    assert len(parses) == 2 + 1 + ENTRIES + 8 and grown.result.added == 8


def test_the_tail_keeps_the_old_opaque_lines_and_numbers_its_own(store, tmp_path: Path):
    """An unparseable line among the old bytes stays kept (the tail does not
    hold it, yet it has not changed); one in the tail is kept and reported
    at its own line of the file."""
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    with open(path, "ab") as f:
        f.write(b"{not json\n")
    first = pi.import_file(store, path)
    assert [(i.line, i.kind) for i in first.issues] == [(ENTRIES + 2, "opaque")]
    _grown(path, b"also {not json\n")
    grown = pi.import_file(store, path)
    assert grown.result.added == 8
    assert [(i.line, i.kind) for i in grown.issues] == [(ENTRIES + 3, "opaque")]
    assert [o.line for o in store.sessions.opaque_records("big-1")] == [ENTRIES + 2, ENTRIES + 3]


def test_control_a_tail_taken_for_the_whole_file_drops_the_old_opaque_line(
    store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Control for the test above: were the tail's first line taken as the
    file's first (``from_line`` 1), the old opaque line would be dropped as
    "now parsing"."""
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    with open(path, "ab") as f:
        f.write(b"{not json\n")
    pi.import_file(store, path)
    _grown(path, b"also {not json\n")
    monkeypatch.setattr(pi.FileStream, "from_line", property(lambda self: 1))
    monkeypatch.setattr(_rows, "stream_lines", _numbered_from(_rows.stream_lines, ENTRIES + 3))
    monkeypatch.setattr(pi, "stream_lines", _numbered_from(_rows.stream_lines, ENTRIES + 3))
    pi.import_file(store, path)
    assert [o.line for o in store.sessions.opaque_records("big-1")] == [ENTRIES + 3]


def _numbered_from(real, first: int):  # type: ignore[no-untyped-def]
    """``stream_lines`` numbering a tail's lines from ``first`` as the real tail
    read does (the control patches ``from_line``, which also numbers them)."""

    def lines(path, progress=None, offset=0, first_line=1):  # type: ignore[no-untyped-def]
        return real(path, progress, offset, first if offset else first_line)

    return lines


def _lines(*records: dict[str, object]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _msg(eid: str, parent: str | None, text: str) -> dict[str, object]:
    message = {"role": "user", "content": text, "timestamp": 1}
    return {
        "type": "message",
        "id": eid,
        "parentId": parent,
        "timestamp": "2026-01-01T00:00:01.000Z",
        "message": message,
    }


HEAD = {"type": "session", "version": 3, "id": "dup-1", "timestamp": "2026-01-01T00:00:00.000Z"}


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "control"])
def test_an_appended_line_repeating_an_old_id_is_what_a_whole_import_makes_it(
    store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guarded: bool
):
    """A line appended to an imported file that repeats the id of a line read
    before is kept as an opaque line with its issue, as an import of the whole
    final file keeps it (the tail's import meets a stored id, writes nothing,
    and the file is read whole). Control: with the stored-id check patched
    out, the tail's import counts the line as skipped and keeps nothing."""
    from turnkeeper.storage.ops import import_chunks

    if not guarded:
        real = import_chunks.add_entries
        monkeypatch.setattr(
            import_chunks,
            "add_entries",
            lambda tx, sid, rows, seq, created, live, tail=False, *version: real(
                tx, sid, rows, seq, created, live, False, *version
            ),
        )
    old = [HEAD, _msg("a", None, "first"), _msg("b", "a", "second")]
    tail = [_msg("a", "b", "the first entry's id, other text"), _msg("c", "b", "third")]
    path = tmp_path / "grown.jsonl"
    path.write_text(_lines(*old))
    pi.import_file(store, path)
    path.write_text(_lines(*old, *tail))
    grown = pi.import_file(store, path)
    assert [e.id for e in store.sessions.entries("dup-1")] == ["a", "b", "c"]
    opaque = store.sessions.opaque_records("dup-1")
    assert (len(opaque), grown.result.opaque_added) == ((1, 1) if guarded else (0, 0))
    assert any("duplicate entry id" in str(i) for i in grown.issues) is guarded
    assert pi.import_file(store, path).unchanged
