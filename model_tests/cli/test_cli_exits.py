"""Every CLI command keeps the README's exit statuses: 0 done; 1 ran and found
failures; 2 refused, with ONE line on stderr and no traceback (a turnkeeper
error, a bad option value, a path that cannot be read or written, an unknown
id); 130 interrupted; 141 when the reader of stdout stopped (``| head``),
quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result

import turnkeeper
from turnkeeper.cli.main import cli
from turnkeeper.formats import pi


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def refused(result: Result) -> str:
    """The one stderr line of a refusal (exit status 2)."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and "Usage:" not in result.stderr, result.stderr
    assert result.stderr.startswith("turnkeeper: "), result.stderr
    return result.stderr


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A database with one session ``s1`` (with a run) and nothing else."""
    path = str(tmp_path / "cli.duckdb")
    with turnkeeper.open_store(path) as store:
        store.sessions.create("s1")
        run = store.runs.admit("s1", {"q": 1}, user_message={"role": "user", "content": "hi"})
        store.runs.start(run.id)
        store.runs.finish(run.id, "succeeded", assistant_message={"role": "assistant"})
    return path


# -- unknown ids -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "--session", "nope"],
        ["audit", "--session", "nope", "--json"],
        ["audit", "--session", "s1", "--session", "nope"],
        ["sessions", "show", "nope"],
        ["export", "nope"],
    ],
)
def test_an_unknown_session_id_is_refused(db: str, args: list[str]) -> None:
    result = run(*args, "--db", db)
    line = refused(result)
    assert "SessionNotFoundError" in line and "nope" in line
    assert result.stdout == ""


def test_audit_of_a_known_session_still_checks_it(db: str) -> None:
    result = run("audit", "--session", "s1", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in json.loads(result.stdout)["audit"]}
    assert checks["session_trees_well_formed"]["checked"] == 1


# -- paths that cannot be read or written --------------------------------------------------


def test_import_of_an_unreadable_path_is_refused_and_imports_nothing(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    header = {"type": "session", "version": 3, "id": "imp", "timestamp": "2026-01-01T00:00:00Z"}
    good.write_text(json.dumps(header) + "\n")
    target = tmp_path / "i.duckdb"
    for paths in (["/nonexistent.jsonl"], [str(good), str(tmp_path / "missing.jsonl")]):
        line = refused(run("import", *paths, "--db", str(target)))
        assert paths[-1] in line
        assert not target.exists()  # refused before the database was even created
    line = refused(run("import", str(tmp_path), "--db", str(target)))  # a directory
    assert str(tmp_path) in line


def test_export_to_a_missing_folder_names_the_path_given(db: str, tmp_path: Path) -> None:
    target = tmp_path / "no-such-folder" / "x.jsonl"
    line = refused(run("export", "s1", "--db", db, "-o", str(target)))
    assert f"cannot write {target}: No such file or directory" in line
    assert ".tmp" not in line
    with turnkeeper.open_store(db, read_only=True) as store, pytest.raises(OSError) as err:
        pi.export_file(store, "s1", target)
    assert isinstance(err.value, FileNotFoundError)
    assert err.value.filename == str(target) and ".tmp" not in str(err.value)


def test_every_command_refuses_a_database_it_cannot_open(db: str, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE invoices (id INTEGER)")
    con.close()
    missing = tmp_path / "missing.duckdb"
    in_missing_folder = tmp_path / "nope" / "x.duckdb"
    pi_file = tmp_path / "s.jsonl"
    header = {"type": "session", "version": 3, "id": "s", "timestamp": "2026-01-01T00:00:00Z"}
    pi_file.write_text(json.dumps(header) + "\n")
    commands: list[list[str]] = [
        ["report"],
        ["sessions"],
        ["sessions", "show", "s1"],
        ["audit"],
        ["export", "s1"],
        ["import", str(pi_file)],
        ["demo", "--duration", "0.2", "--workers", "1", "--sessions", "1"],
    ]
    reading = {"report", "sessions", "audit", "export"}
    for args in commands:
        line = refused(run(*args, "--db", str(foreign)))
        assert "ForeignDatabaseError" in line and "not a turnkeeper database" in line, line
        line = refused(run(*args, "--db", str(tmp_path)))  # a directory
        assert "directory" in line, line
        if args[0] in reading:
            line = refused(run(*args, "--db", str(missing)))
            assert "StoreNotFoundError" in line and str(missing) in line, line
            assert not missing.exists()
        else:
            line = refused(run(*args, "--db", str(in_missing_folder)))
            assert "InvalidInputError" in line and "folder" in line, line


# -- bad usage is one line too -------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--ttl", "nan"],
        ["demo", "--workers", "0"],
        ["sessions", "--limit", "0"],
        ["sessions", "show"],
        ["import"],
        ["report", "--sql", "--json"],
        ["export"],
        ["no-such-command"],
        ["--no-such-option"],
        ["audit", "--no-such-option"],
    ],
)
def test_bad_usage_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may be created, wherever it would go
    line = refused(run(*args))
    assert line.startswith("turnkeeper: error: ")
    assert "--help" in line  # where to look next
    assert list(tmp_path.iterdir()) == []


def test_export_writes_to_a_fifo_or_device_and_never_replaces_it(tmp_path: Path) -> None:
    """A special file is written to (a reader of the FIFO gets the session), never
    replaced by a regular file; a device that refuses the write exits 2."""
    import stat
    import threading

    db = tmp_path / "e.duckdb"
    with turnkeeper.open_store(str(db)) as store:
        store.sessions.create("s1")
        store.sessions.append("s1", "message", {"message": {"role": "user", "content": "hi"}})
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    result = run("export", "--db", str(db), "s1", "-o", str(fifo))
    reader.join(60)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert b'"hi"' in got[0]
    if os.path.exists("/dev/full"):
        full = run("export", "--db", str(db), "s1", "-o", "/dev/full")
        assert full.exit_code == 2
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


# -- a reader that stops early (`| head`) --------------------------------------------------


@pytest.fixture
def long_db(tmp_path: Path) -> str:
    """A session ``long`` whose export and listing far outgrow a pipe's buffer."""
    path = str(tmp_path / "long.duckdb")
    with turnkeeper.open_store(path) as store:
        store.sessions.create("long")
        text = "x" * 200
        store.sessions.append_many(
            "long",
            [("message", {"message": {"role": "user", "content": text}}) for _ in range(2_000)],
        )
    return path


@pytest.mark.parametrize(
    "args",
    [["export", "long"], ["sessions", "show", "long", "--flat"]],
)
def test_a_reader_that_stops_early_ends_the_command_quietly_with_141(
    long_db: str, args: list[str]
) -> None:
    """``turnkeeper export long | head -1``: 141 (128 + SIGPIPE, as a shell
    reports coreutils ended by a closed pipe), nothing on stderr; before, click's
    and rich's own handling exited 1, the status of a command that found
    failures. Each command here writes many times, so one write meets the
    closed pipe whatever the timing (a command whose last write is cut short
    instead exits 0: Python reports no error for a write the pipe took in
    part)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "turnkeeper.cli.main", *args, "--db", long_db],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline()
    child.stdout.close()
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141, stderr
    assert stderr == ""
