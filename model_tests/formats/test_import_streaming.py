"""A pi import reads its file as it stores it (issue 21, part 3): the store takes
the entries a chunk at a time (``storage/ops/import_chunks.py``) in the one
import transaction, so the parser is never more than a chunk ahead of the
store, and the import stays all or nothing. What is asserted is counted
(lines parsed when a chunk is taken, rows stored), never timed."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import orjson
import pi_big
import pytest
from click.testing import CliRunner
from rich.console import Console

from turnkeeper.cli import transfer
from turnkeeper.cli.main import cli
from turnkeeper.formats import _rows, pi, pi_parse
from turnkeeper.spec.errors import ToolCallPairingError
from turnkeeper.storage.ops import import_chunks

ENTRIES = 1200
CHUNK = 100


@pytest.fixture
def chunked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Chunks of :data:`CHUNK` entries; returns, for each chunk the store takes,
    how many lines the parser had split into records by then (a spy on
    ``split_line``, which every reader of a file's lines calls once per line)."""
    monkeypatch.setattr(import_chunks, "CHUNK", CHUNK)
    parsed = [0]
    real_split = pi_parse.split_line

    def split(text: str, line: int) -> list[pi_parse.Piece]:
        parsed[0] += 1
        return real_split(text, line)

    monkeypatch.setattr(pi_parse, "split_line", split)
    monkeypatch.setattr(_rows, "split_line", split)
    taken: list[int] = []
    real_chunks = import_chunks._chunks

    def chunks(rows: Any) -> Any:
        for chunk in real_chunks(rows):
            taken.append(parsed[0])
            yield chunk

    monkeypatch.setattr(import_chunks, "_chunks", chunks)
    return taken


def test_the_parser_stays_within_a_chunk_of_the_store(store, tmp_path: Path, chunked):
    """When the store takes chunk k, the parser has read the header (twice: once
    to open the stream) and the k chunks' lines, one line ahead at most."""
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    done = pi.import_file(store, path)
    assert done.result.added == ENTRIES
    assert len(chunked) == ENTRIES // CHUNK
    for k, lines in enumerate(chunked, start=1):
        assert lines <= 2 + k * CHUNK + 1, (k, lines)
    assert store.sessions.get("big-1").entry_count == ENTRIES


def test_control_a_parsed_batch_is_held_whole(store, tmp_path: Path, chunked):
    """Control: the whole-file path (``parse_file``, then ``import_batch``, as
    ``import_file`` did before) has parsed every line before the first chunk."""
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    store.sessions.import_batch(pi.parse_file(path).batch)
    assert chunked[0] == ENTRIES + 1


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def _records(count: int) -> list[dict[str, Any]]:
    return [pi_big.header("big-1"), *(pi_big.entry(i) for i in range(count))]


def test_a_fault_in_the_last_chunk_stores_nothing(store, tmp_path: Path, chunked):
    """Chunks before the fault were inserted in the import's transaction: the
    fault rolls them back with it (no session, no entries, no record of the
    file)."""
    records = _records(ENTRIES)
    records.append(
        {
            **pi_big.entry(ENTRIES),
            "message": {"role": "toolResult", "toolCallId": "nowhere", "content": []},
        }
    )
    path = tmp_path / "bad.jsonl"
    _write(path, records)
    with pytest.raises(ToolCallPairingError) as raised:
        pi.import_file(store, path)
    assert raised.value.reason == "unpaired"
    assert len(chunked) > 1
    assert store.sessions.get("big-1") is None
    assert store.sessions.imported_source("big-1", str(path.resolve())) is None


def test_a_parent_further_down_the_file_is_judged_with_its_tree(
    store, tmp_path: Path, chunked, monkeypatch: pytest.MonkeyPatch
):
    """A result whose call's message comes later in the file (its parent): judged
    alone it is unpaired, but the file's tree is valid, so the whole tree is
    judged at the end (``judge_tree``) and the import goes in, as before."""
    records = _records(ENTRIES + 1)
    call, result, reply = (pi_big.entry(ENTRIES + k) for k in (1, 2, 3))
    records += [result, call, reply]  # the result (parent: the call) before its call
    monkeypatch.setattr(import_chunks, "CHUNK", ENTRIES + 2)  # the call in the next chunk
    path = tmp_path / "late.jsonl"
    _write(path, records)
    judged: list[str] = []
    real = import_chunks.judge_tree

    def spy(tx: Any, session_id: str, *args: Any) -> None:
        judged.append(session_id)
        real(tx, session_id, *args)

    monkeypatch.setattr(import_chunks, "judge_tree", spy)
    done = pi.import_file(store, path)
    assert done.result.added == ENTRIES + 4
    assert judged == ["big-1"]
    replay = store.sessions.replay("big-1")
    assert [m["role"] for m in replay.messages[-3:]] == ["assistant", "toolResult", "assistant"]


def test_control_the_late_parent_judged_alone_is_refused(
    store, tmp_path: Path, chunked, monkeypatch: pytest.MonkeyPatch
):
    """Control for the test above: with the end's whole-tree judgment patched
    to the fault found on the way, the import is refused, so it is that
    judgment that lets the file in."""
    records = _records(ENTRIES + 1)
    records += [pi_big.entry(ENTRIES + k) for k in (2, 1, 3)]
    monkeypatch.setattr(import_chunks, "CHUNK", ENTRIES + 2)
    path = tmp_path / "late.jsonl"
    _write(path, records)

    def finish(self: Any, tx: Any) -> None:
        if self.deferred is not None:
            raise self.deferred

    monkeypatch.setattr(import_chunks._Judge, "finish", finish)
    with pytest.raises(ToolCallPairingError):
        pi.import_file(store, path)
    assert store.sessions.get("big-1") is None


def test_a_grown_file_skips_its_stored_entries_chunk_by_chunk(
    store, tmp_path: Path, chunked, monkeypatch: pytest.MonkeyPatch
):
    """A file imported, grown, imported again whole (not only its new lines, as
    a file grown in place is: ``test_import_tail.py``): the stored entries are
    skipped (found per chunk), the new ones added and judged under the stored
    ones."""
    monkeypatch.setattr(pi, "_appended", lambda store, path, stream: None)
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    pi.import_file(store, path)
    pi_big.append(path, ENTRIES, 2 * CHUNK + 8)
    again = pi.import_file(store, path)
    assert (again.result.added, again.result.skipped) == (2 * CHUNK + 8, ENTRIES)
    assert store.sessions.get("big-1").entry_count == ENTRIES + 2 * CHUNK + 8
    assert len(store.usage.list("big-1")) == (ENTRIES + 2 * CHUNK + 8) // 4


def test_the_cli_draws_the_bytes_read_of_a_file_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """On a terminal, a bar counts the bytes read of the file as it is read
    (every ``PROGRESS_BYTES``, here 64 KiB), up to its size; with --json, or
    when stderr is no terminal, nothing is drawn."""
    screens: list[io.StringIO] = []

    def terminal() -> Console:
        screens.append(io.StringIO())
        return Console(file=screens[-1], force_terminal=True, width=160)

    monkeypatch.setattr(transfer, "stderr_console", terminal)
    monkeypatch.setattr(_rows, "PROGRESS_BYTES", 1 << 16)
    monkeypatch.chdir(tmp_path)  # a short path: the columns keep their room
    path = Path("big.jsonl")
    size = pi_big.write(path, 2000)  # 718 kB
    runner = CliRunner()
    shown = runner.invoke(cli, ["import", str(path), "--db", str(tmp_path / "a.duckdb")])
    assert shown.exit_code == 0, shown.output
    steps = re.findall(r"([\d.]+)/([\d.]+) kB", screens[-1].getvalue())
    total = f"{size / 1000:.1f}"
    assert {t for _, t in steps} == {total}
    read = sorted({float(done) for done, _ in steps})
    assert len(read) >= size // (1 << 16) and read[-1] == float(total)
    assert "added 2000" in shown.stdout
    quiet = runner.invoke(cli, ["import", str(path), "--db", str(tmp_path / "b.duckdb"), "--json"])
    assert quiet.exit_code == 0 and screens[-1].getvalue() == ""
    monkeypatch.setattr(transfer, "stderr_console", lambda: Console(file=io.StringIO()))
    plain = runner.invoke(cli, ["import", str(path), "--db", str(tmp_path / "c.duckdb")])
    assert plain.exit_code == 0 and "kB" not in plain.stderr


def test_a_fault_grown_into_a_stored_session_is_raised_at_the_end(
    store, tmp_path: Path, chunked, monkeypatch: pytest.MonkeyPatch
):
    """Into a session that held entries (a later entry might still supply a
    stored one's missing parent), a fault is raised once the file is read:
    nothing of this import is stored, the session stays as it was, and no
    entry after the fault is judged (each would read its whole branch)."""
    monkeypatch.setattr(pi, "_appended", lambda store, path, stream: None)
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    pi.import_file(store, path)
    records = _records(ENTRIES)
    records.append(
        {
            **pi_big.entry(ENTRIES),
            "message": {"role": "toolResult", "toolCallId": "nowhere", "content": []},
        }
    )
    records += [pi_big.entry(ENTRIES + k) for k in range(1, 2 * CHUNK)]
    _write(path, records)
    judged: list[str] = []
    real = import_chunks.pairing_checks.check

    def spy(tx: Any, session_id: str, parent: Any, seq: int, new: Any, known: Any = None) -> Any:
        judged.append(new[0].id)
        return real(tx, session_id, parent, seq, new, known)

    monkeypatch.setattr(import_chunks.pairing_checks, "check", spy)
    with pytest.raises(ToolCallPairingError) as raised:
        pi.import_file(store, path)
    assert raised.value.reason == "unpaired"
    assert judged == [f"e{ENTRIES:07x}"]
    assert store.sessions.get("big-1").entry_count == ENTRIES
