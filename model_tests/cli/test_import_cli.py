"""``turnkeeper import`` over every format (pi, Claude Code, Codex) through click's
CliRunner, format detection (``turnkeeper.formats.detect``), and the progress
bar on a terminal."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from rich.console import Console

from turnkeeper import SessionFileError, SessionFormatUnknownError
from turnkeeper.cli import transfer
from turnkeeper.cli.main import cli
from turnkeeper.formats import claude_code, detect

CC = "claude-code/258c7280-ae70-4798-800f-63464d01a85d.jsonl.gz"
CC_SUB = "claude-code/258c7280-ae70-4798-800f-63464d01a85d/subagents/agent-a881341.jsonl"
CODEX_OLD = "codex/rollout-2025-09-24T19-22-20-01997e76-d124-7592-9cac-2ec05abbca08.jsonl"
CODEX_NEW = "codex/rollout-2026-02-23T12-54-34-019c8a59-e9dd-71f0-9ae3-4079fe9726a9.jsonl"
PI = "pi/sandcastle_v3_resumed-session.jsonl"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_detect_tells_each_sample_apart(corpus_dir: Path, tmp_path: Path) -> None:
    assert detect(corpus_dir / CC) == "claude-code"
    assert detect(corpus_dir / CC_SUB) == "claude-code"
    assert detect(corpus_dir / CODEX_OLD) == "codex"
    assert detect(corpus_dir / CODEX_NEW) == "codex"
    assert detect(corpus_dir / PI) == "pi"
    plain = tmp_path / "cc.jsonl"  # the same transcript unzipped, a blank line first
    plain.write_bytes(b"\n" + gzip.decompress((corpus_dir / CC).read_bytes()))
    assert detect(plain) == "claude-code"


@pytest.mark.parametrize(
    ("text", "line", "detail"),
    [
        ("", 0, "no records"),
        ("\n\nnot json at all\n", 3, "no JSON record found"),
        ('{"type": "message", "id": "a"}\n', 1, "type 'message'"),
        ("[1, 2]\n", 1, "type list"),
        ('{"type": "session_meta", "payload": "x"}\n', 1, "session_meta"),
    ],
)
def test_a_file_of_no_known_format_is_refused_typed(
    tmp_path: Path, text: str, line: int, detail: str
) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(text)
    with pytest.raises(SessionFormatUnknownError) as err:
        detect(path)
    assert (err.value.path, err.value.line) == (str(path), line)
    assert detail in str(err.value)


def test_a_corrupt_gzip_file_is_a_session_file_error(corpus_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes((corpus_dir / CC).read_bytes()[:4000])
    assert detect(path) == "claude-code"  # the first line is whole: read no further
    with pytest.raises(SessionFileError) as err:
        claude_code.parse_file(path)
    assert "gzip" in str(err.value) and not isinstance(err.value, SessionFormatUnknownError)


def test_import_takes_every_format_and_refuses_an_unknown_one(
    corpus_dir: Path, tmp_path: Path
) -> None:
    unknown = tmp_path / "notes.jsonl"
    unknown.write_text('{"hello": "world"}\n')
    db = str(tmp_path / "i.duckdb")
    paths = [corpus_dir / p for p in (CODEX_OLD, CC_SUB, PI)]
    result = run("import", *map(str, paths[:2]), str(unknown), str(paths[2]), "--db", db)
    assert result.exit_code == 1
    out = result.stdout.splitlines()
    assert len(out) == 3
    assert "session 01997e76-d124-7592-9cac-2ec05abbca08 codex 0.40.0: added 823" in out[0]
    assert (
        "/agent-a881341 claude-code 2.1.39: added 10, skipped 0, 3 usage records (new session)"
        in out[1]
    )
    assert " v3: added " in out[2]
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert errors == [
        f"{unknown}: error: SessionFormatUnknownError: No importer knows this session "
        f"file's format (pi, Claude Code, Codex) (path={str(unknown)!r}, line=1): "
        "the first record (type None) is no pi, Claude Code or Codex row"
    ]
    assert f"{paths[1]}:0: reference: parent session" in result.stderr
    again = run("import", *map(str, paths), "--db", db, "--json")
    assert again.exit_code == 0
    files = json.loads(again.stdout)["files"]
    assert [(f["format"], f["added"], f["created"]) for f in files] == [
        ("codex", 0, False),
        ("claude-code", 0, False),
        ("pi", 0, False),
    ]


def test_a_claude_code_session_imports_with_its_sub_agents(
    corpus_dir: Path, tmp_path: Path
) -> None:
    db = str(tmp_path / "i.duckdb")
    result = run("import", str(corpus_dir / CC), "--db", db, "--json")
    assert result.exit_code == 0
    (main,) = json.loads(result.stdout)["files"]
    assert (main["format"], main["version"], main["added"]) == ("claude-code", "2.1.39", 1863)
    assert sorted(s["session_id"].split("/")[-1] for s in main["sub_agents"]) == [
        "agent-a881341",
        "agent-acompact-fffbd0",
    ]
    assert "agent-acompact-fffbd0.jsonl:3: reference:" in result.stderr


def test_progress_is_drawn_on_a_terminal_and_never_with_json(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    screens: list[io.StringIO] = []

    def terminal() -> Console:
        screens.append(io.StringIO())
        return Console(file=screens[-1], force_terminal=True, width=120)

    monkeypatch.setattr(transfer, "stderr_console", terminal)
    db = str(tmp_path / "i.duckdb")
    path = str(corpus_dir / CC_SUB)
    shown = run("import", path, "--db", db)
    assert shown.exit_code == 0
    drawn = screens[-1].getvalue()
    assert "importing" in drawn and "0/1" in drawn
    assert "claude-code 2.1.39: added 10" in shown.stdout  # a piped stdout stays clean
    quiet = run("import", path, "--db", db, "--json")
    assert quiet.exit_code == 0 and screens[-1].getvalue() == ""
    assert json.loads(quiet.stdout)["files"][0]["skipped"] == 10
    plain = run("import", path, "--db", db)  # stderr not a terminal: no bar
    assert "importing" not in plain.stderr and "skipped 10" in plain.stdout


def test_a_file_whose_session_cannot_take_it_fails_alone(corpus_dir: Path, tmp_path: Path) -> None:
    """A file whose session was deleted since (its id stays taken,
    SessionIDExistsError) is reported as failed; the files before and after it
    are imported and reported, one JSON object, exit 1."""
    import turnkeeper

    db = str(tmp_path / "i.duckdb")
    first, gone, last = (corpus_dir / p for p in (CODEX_OLD, PI, CC_SUB))
    assert run("import", str(gone), "--db", db).exit_code == 0
    with turnkeeper.open_store(db) as store:
        (session,) = store.sessions.list().sessions
        store.sessions.delete(session.id)
    result = run("import", str(first), str(gone), str(last), "--db", db, "--json")
    assert result.exit_code == 1, result.output
    out = json.loads(result.stdout)
    assert [f["format"] for f in out["files"]] == ["codex", "claude-code"]
    assert [f["path"] for f in out["failed"]] == [str(gone)]
    assert out["failed"][0]["error"].startswith("SessionIDExistsError: ")
