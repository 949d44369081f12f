"""A re-import of an unchanged Claude Code transcript or Codex rollout is not
parsed (issue 21, part 3), as a pi file's is not (``test_big_sessions.py``):
each import records what it read (``import_sources``), and a file whose size
and sha256 match is skipped. Real files of the shared corpus, copied so that
a test may change them; what is asserted is counted (texts parsed), never
timed."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import turnkeeper
from turnkeeper.cli.main import cli
from turnkeeper.formats import claude_code, codex
from turnkeeper.formats import import_file as import_any

SESSION = "258c7280-ae70-4798-800f-63464d01a85d"
ROLLOUTS = (
    "rollout-2025-09-24T19-22-20-01997e76-d124-7592-9cac-2ec05abbca08.jsonl",
    "rollout-2026-02-23T12-54-34-019c8a59-e9dd-71f0-9ae3-4079fe9726a9.jsonl",
)


def _spy(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[str]:
    """The paths ``module.parse_text`` parsed (the parse itself runs)."""
    seen: list[str] = []
    real = module.parse_text

    def spy(text: str, path: str = "<text>") -> Any:
        seen.append(Path(path).name)
        return real(text, path)

    monkeypatch.setattr(module, "parse_text", spy)
    return seen


@pytest.fixture
def transcript(corpus_dir: Path, tmp_path: Path) -> Path:
    """A copy of the corpus's Claude Code transcript and its sub-agent files."""
    shutil.copytree(corpus_dir / "claude-code", tmp_path / "cc")
    return tmp_path / "cc" / f"{SESSION}.jsonl.gz"


def test_an_unchanged_transcript_and_its_sub_agents_are_not_parsed_again(
    store, transcript: Path, monkeypatch: pytest.MonkeyPatch
):
    parsed = _spy(monkeypatch, claude_code)
    first = claude_code.import_file(store, transcript)
    assert len(parsed) == 1 + len(first.sub_agents) == 3
    parsed.clear()
    again = import_any(store, transcript)
    assert parsed == []
    assert again.unchanged and (again.result.added, again.result.skipped) == (
        0,
        first.result.added,
    )
    assert again.session_id == SESSION and again.format == "claude-code"
    assert [s.unchanged for s in again.sub_agents] == [True, True]
    assert [s.session_id for s in again.sub_agents] == [s.session_id for s in first.sub_agents]
    # a sub-agent file imported on its own is found unchanged too
    sub = transcript.parent / SESSION / "subagents" / "agent-a881341.jsonl"
    alone = claude_code.import_file(store, sub)
    assert alone.unchanged and alone.session_id == f"{SESSION}/agent-a881341"
    assert parsed == []


def test_control_without_the_check_a_transcript_is_parsed_again(
    store, transcript: Path, monkeypatch: pytest.MonkeyPatch
):
    parsed = _spy(monkeypatch, claude_code)
    claude_code.import_file(store, transcript)
    monkeypatch.setattr(claude_code, "unchanged", lambda store, path: None)
    parsed.clear()
    again = claude_code.import_file(store, transcript)
    assert len(parsed) == 3 and not again.unchanged and again.result.added == 0


def test_a_changed_sub_agent_file_alone_is_parsed_again(
    store, transcript: Path, monkeypatch: pytest.MonkeyPatch
):
    """The main file unchanged, one sub-agent file changed (cut by a line, then
    whole again): only that file is parsed."""
    parsed = _spy(monkeypatch, claude_code)
    claude_code.import_file(store, transcript)
    sub = transcript.parent / SESSION / "subagents" / "agent-a881341.jsonl"
    lines = sub.read_text().splitlines(keepends=True)
    sub.write_text("".join(lines[:-1]))  # the import above had the whole file
    parsed.clear()
    cut = claude_code.import_file(store, transcript)
    assert parsed == ["agent-a881341.jsonl"]
    assert cut.unchanged and [s.unchanged for s in cut.sub_agents] == [False, True]
    sub.write_text("".join(lines))
    parsed.clear()
    grown = claude_code.import_file(store, transcript)
    assert parsed == ["agent-a881341.jsonl"]
    assert [s.result.added for s in grown.sub_agents] == [0, 0]


def test_a_transcript_changed_in_the_middle_is_imported_whole(
    store, transcript: Path, monkeypatch: pytest.MonkeyPatch
):
    """One byte of a row's text changed (same size): parsed and imported whole
    (the changed row's id is stored: skipped, as a re-import does)."""
    parsed = _spy(monkeypatch, claude_code)
    first = claude_code.import_file(store, transcript)
    text = gzip.decompress(transcript.read_bytes())
    edited = text.replace(b'"cwd":"/', b'"cwd":"~', 1)
    assert edited != text and len(edited) == len(text)
    transcript.write_bytes(gzip.compress(edited))
    parsed.clear()
    again = claude_code.import_file(store, transcript)
    assert parsed[0] == transcript.name and not again.unchanged
    assert (again.result.added, again.result.skipped) == (0, first.result.added)


@pytest.mark.parametrize("name", ROLLOUTS)
def test_an_unchanged_rollout_is_not_parsed_again(
    store, corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
):
    path = tmp_path / name
    shutil.copy(corpus_dir / "codex" / name, path)
    parsed = _spy(monkeypatch, codex)
    first = codex.import_file(store, path)
    assert parsed == [name] and first.result.added > 0
    known = store.sessions.imported_source(first.session_id, str(path.resolve()))
    assert known is not None and (known.bytes, known.entries) == (
        path.stat().st_size,
        first.result.added,
    )
    parsed.clear()
    again = import_any(store, path)
    assert parsed == [] and again.unchanged and again.format == "codex"
    assert (again.session_id, again.version) == (first.session_id, first.version)
    assert (again.result.added, again.result.skipped) == (0, first.result.added)
    monkeypatch.setattr(codex, "unchanged", lambda store, path: None)  # control
    assert not codex.import_file(store, path).unchanged and parsed == [name]


def test_a_changed_rollout_is_imported_whole(
    store, corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Grown by a line, the rollout is parsed whole and only the new line goes
    in; then it is unchanged again. Edited in its old bytes, parsed again."""
    path = tmp_path / ROLLOUTS[0]
    lines = (corpus_dir / "codex" / ROLLOUTS[0]).read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    parsed = _spy(monkeypatch, codex)
    first = codex.import_file(store, path)
    path.write_text("".join(lines))
    grown = codex.import_file(store, path)
    assert not grown.unchanged and grown.result.added == 1
    assert codex.import_file(store, path).unchanged
    text = path.read_text()
    path.write_text(text.replace('"type"', '"type" ', 1))
    parsed.clear()
    edited = codex.import_file(store, path)
    assert parsed == [ROLLOUTS[0]] and not edited.unchanged
    assert edited.result.added == 0 and first.result.added + 1 == edited.result.skipped


def test_the_cli_says_a_rollout_is_unchanged(corpus_dir: Path, tmp_path: Path):
    db = str(tmp_path / "t.duckdb")
    path = str(corpus_dir / "codex" / ROLLOUTS[1])
    runner = CliRunner()
    assert runner.invoke(cli, ["import", "--db", db, path]).exit_code == 0
    again = runner.invoke(cli, ["import", "--db", db, path])
    assert again.exit_code == 0, again.output
    assert "unchanged since its last import" in again.stdout
    with turnkeeper.open_store(db, read_only=True) as store:
        assert store.sessions.imported_source(
            again.stdout.split("session ")[1].split()[0], str(Path(path).resolve())
        )
