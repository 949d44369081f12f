"""Big sessions in the CLI (issue 21, part 3): a re-import of an unchanged file
is not parsed, a changed one is imported whole; ``sessions show`` lists a big
session a page at a time. Synthetic pi files (``pi_big.py``), a few thousand
entries: what is asserted is counted (files parsed, pages read), never timed."""

from __future__ import annotations

import json
from pathlib import Path

import pi_big
import pytest
from click.testing import CliRunner

import turnkeeper
from turnkeeper.cli import sessions_pages
from turnkeeper.cli.main import cli
from turnkeeper.formats import pi
from turnkeeper.spec.errors import SessionIDExistsError

ENTRIES = 2400


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The line numbers every pi line reader split into records (``pi_big.spy_parses``)."""
    return pi_big.spy_parses(monkeypatch)


def test_an_unchanged_file_is_not_parsed_again(store, tmp_path: Path, parses: list[str]):
    """Only the header line is read as records again (old code: every line,
    ``parses`` grew by ENTRIES + 1 and this failed)."""
    path = tmp_path / "big.jsonl"
    size = pi_big.write(path, ENTRIES)
    first = pi.import_file(store, path)
    assert (first.result.added, first.unchanged) == (ENTRIES, False)
    assert len(parses) > ENTRIES
    known = store.sessions.imported_source("big-1", str(path.resolve()))
    assert known is not None and (known.bytes, known.entries) == (size, ENTRIES)
    parses.clear()
    again = pi.import_file(store, path)
    assert again.unchanged and parses == [1]
    assert (again.result.added, again.result.skipped, again.result.created) == (0, ENTRIES, False)


def test_a_file_changed_in_the_middle_is_imported_whole(store, tmp_path: Path, parses):
    """Same size, one entry's id changed mid-file: the digest differs, the file is
    parsed and the changed entry added (a size check alone would skip it)."""
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    pi.import_file(store, path)
    data = path.read_bytes()
    at = data.index(b'"id":"e0000010"')  # entry 16: a user message, a new branch
    path.write_bytes(data[:at] + b'"id":"f0000010"' + data[at + 15 :])
    parses.clear()
    changed = pi.import_file(store, path)
    assert not changed.unchanged and len(parses) > ENTRIES
    assert changed.result.added == 1
    assert store.sessions.entry("big-1", "f0000010") is not None
    parses.clear()
    assert pi.import_file(store, path).unchanged and parses == [1]


def test_a_grown_file_adds_its_new_entries_then_is_unchanged(store, tmp_path: Path, parses):
    """Appended to, the file is read from where its last import stopped: its
    header, then only the new lines (``test_import_tail.py``)."""
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    pi.import_file(store, path)
    pi_big.append(path, ENTRIES, 8)
    parses.clear()
    grown = pi.import_file(store, path)
    assert (grown.unchanged, grown.result.added, grown.result.skipped) == (False, 8, ENTRIES)
    assert parses == [1, 1, *range(ENTRIES + 2, ENTRIES + 10)]
    assert store.sessions.get("big-1").leaf_id == f"e{ENTRIES + 7:07x}"
    parses.clear()
    assert pi.import_file(store, path).unchanged and parses == [1]


def test_a_deleted_session_is_no_longer_unchanged(store, tmp_path: Path, parses):
    """The record goes with the session: a re-import after a delete is the full
    path's, which refuses the deleted session's id (as it creates the session,
    before it reads the entries: the skip read the header line, then the
    full path read it again, and nothing more)."""
    path = tmp_path / "small.jsonl"
    pi_big.write(path, 8)
    pi.import_file(store, path)
    store.sessions.delete("big-1")
    assert store.sessions.imported_source("big-1", str(path.resolve())) is None
    parses.clear()
    with pytest.raises(SessionIDExistsError):
        pi.import_file(store, path)
    assert parses == [1, 1]


def test_the_cli_says_a_file_is_unchanged(tmp_path: Path):
    path = tmp_path / "big.jsonl"
    pi_big.write(path, 40)
    db = str(tmp_path / "t.duckdb")
    runner = CliRunner()
    first = runner.invoke(cli, ["import", "--db", db, str(path)])
    assert first.exit_code == 0 and "added 40" in first.stdout, first.output
    again = runner.invoke(cli, ["import", "--db", db, str(path)])
    assert again.exit_code == 0 and "unchanged since its last import, skipped 40" in again.stdout
    as_json = runner.invoke(cli, ["import", "--db", db, "--json", str(path)])
    files = json.loads(as_json.stdout)["files"]
    assert [(f["unchanged"], f["added"], f["skipped"]) for f in files] == [(True, 0, 40)]


def _shown(stdout: str) -> list[int]:
    return [int(line.split()[0]) for line in stdout.splitlines() if line[:1].isdigit()]


def test_show_lists_a_big_session_a_page_at_a_time(tmp_path: Path, monkeypatch):
    """A session over TREE_MAX entries is listed in append order, read in pages of
    PAGE (never ``sessions.entries``, the whole session); --offset and --limit
    pick a window."""
    monkeypatch.setattr(sessions_pages, "TREE_MAX", 50)
    monkeypatch.setattr(sessions_pages, "PAGE", 40)
    import turnkeeper.cli.sessions_view as view

    monkeypatch.setattr(view, "TREE_MAX", 50)
    path = tmp_path / "big.jsonl"
    pi_big.write(path, 130)
    db = str(tmp_path / "t.duckdb")
    with turnkeeper.open_store(db) as store:
        pi.import_file(store, path)
    pages: list[int] = []
    real = turnkeeper.storage.ops.session_reads.SessionReadsPart.entries_after

    def counted(self, *args, **kw):
        page = real(self, *args, **kw)
        pages.append(len(page))
        return page

    def whole(self, session_id):
        raise AssertionError("show read the whole session")

    monkeypatch.setattr(
        turnkeeper.storage.ops.session_reads.SessionReadsPart, "entries_after", counted
    )
    monkeypatch.setattr(turnkeeper.storage.ops.session_rows.SessionRecordsPart, "entries", whole)
    runner = CliRunner()
    shown = runner.invoke(cli, ["sessions", "--db", db, "show", "big-1"])
    assert shown.exit_code == 0, shown.output
    assert _shown(shown.stdout) == list(range(1, 131))
    assert pages == [40, 40, 40, 10]
    assert "◀ leaf" in shown.stdout.splitlines()[-1]
    window = runner.invoke(
        cli, ["sessions", "--db", db, "show", "big-1", "--offset", "45", "--limit", "50"]
    )
    assert window.exit_code == 0, window.output
    assert _shown(window.stdout) == list(range(46, 96))
    assert "entries 46–95 of 130" in window.stdout
    past = runner.invoke(cli, ["sessions", "--db", db, "show", "big-1", "--offset", "500"])
    assert past.exit_code == 0, past.output
    assert _shown(past.stdout) == [] and "no entries at offset 500 (130 in all)" in past.stdout


def test_show_marks_a_fork_and_a_label(tmp_path: Path):
    db = str(tmp_path / "t.duckdb")
    with turnkeeper.open_store(db) as store:
        store.sessions.create("s")
        a = store.sessions.append("s", "message", {"message": {"role": "user", "content": "a"}})
        store.sessions.append("s", "message", {"message": {"role": "user", "content": "b"}})
        store.sessions.branch("s", a.id)
        store.sessions.append("s", "message", {"message": {"role": "user", "content": "c"}})
        store.sessions.set_label("s", a.id, "start")
    out = CliRunner().invoke(cli, ["sessions", "--db", db, "show", "s", "--flat"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert "[start]" in lines[1] and "↳ under" not in lines[1]
    assert "↳ under" in lines[3]  # c hangs from a, not from b above it
    assert " label " in lines[4] and lines[4].rstrip().endswith("◀ leaf")


def test_control_without_the_check_a_reimport_reads_every_line(
    store, tmp_path: Path, parses: list[int], monkeypatch: pytest.MonkeyPatch
):
    """The spy sees a re-parse: with the unchanged-file check patched out (as
    the code before it), the re-import splits every line again."""
    path = tmp_path / "big.jsonl"
    pi_big.write(path, ENTRIES)
    pi.import_file(store, path)
    monkeypatch.setattr(pi, "unchanged", lambda store, path: None)
    parses.clear()
    again = pi.import_file(store, path)
    assert (again.unchanged, again.result.added) == (False, 0)
    assert len(parses) == ENTRIES + 2  # the header read first, then every line
