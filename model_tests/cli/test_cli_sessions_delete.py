"""``turnkeeper sessions delete`` and ``turnkeeper sessions retain`` through
click's runner, on both backends: what they remove, what they refuse (exit 2,
one line) and what they keep."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import BACKENDS, new_pg_schema

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.cli.main import cli
from turnkeeper.cli.sessions_delete import parse_age
from turnkeeper.fuzz import FakeClock

USER = {"role": "user", "content": "q"}


def run(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database holding ``old-0``/``old-1`` (written in 2001, a second apart)
    and ``new-0``/``new-1`` (written now), each with one message."""
    where = str(tmp_path / "f.duckdb") if request.param == "duckdb" else new_pg_schema()
    clock = FakeClock(datetime(2001, 1, 1, tzinfo=UTC))
    with turnkeeper.open_store(where, clock=clock) as store:
        for sid in ("old-0", "old-1"):
            store.sessions.create(sid)
            store.sessions.append(sid, EntryKind.MESSAGE, {"message": USER})
            clock.advance(1)
    with turnkeeper.open_store(where) as store:
        for sid in ("new-0", "new-1"):
            store.sessions.create(sid)
            store.sessions.append(sid, EntryKind.MESSAGE, {"message": USER})
    yield where


def kept(db: str) -> list[str]:
    with turnkeeper.open_store(db) as store:
        return sorted(s.id for s in store.sessions.list(limit=100).sessions)


def test_delete_removes_the_session_and_prints_what_remains(db: str) -> None:
    result = run("sessions", "delete", "old-0", "--db", db, "--yes", "--json")
    assert result.exit_code == 0, result.output
    gone = json.loads(result.stdout)["deleted"]
    assert (gone["session_id"], gone["reason"], gone["entries"]) == ("old-0", "delete", 1)
    assert kept(db) == ["new-0", "new-1", "old-1"]
    with turnkeeper.open_store(db) as store:
        assert store.sessions.deleted("old-0").entries == 1
    table = run("sessions", "delete", "old-1", "--db", db, "--yes")
    assert table.exit_code == 0 and "old-1" in table.stdout and "1 session(s)" in table.stdout


def test_delete_asks_first(db: str) -> None:
    declined = run("sessions", "delete", "old-0", "--db", db, stdin="n\n")
    assert declined.exit_code == 1
    assert "old-0" in kept(db)
    accepted = run("sessions", "delete", "old-0", "--db", db, stdin="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert "old-0" not in kept(db)


def test_delete_refuses_a_held_an_active_and_a_missing_session(db: str) -> None:
    with turnkeeper.open_store(db) as store:
        store.leases.acquire("session:old-0", "worker", 600)
        store.runs.admit("old-1", {"q": 1})
    for sid, error in (
        ("old-0", "BusyError"),
        ("old-1", "SessionRunActiveError"),
        ("nope", "SessionNotFoundError"),
    ):
        result = run("sessions", "delete", sid, "--db", db, "--yes")
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"turnkeeper: {error}:"), result.stderr
        assert len(result.stderr.splitlines()) == 1
    assert kept(db) == ["new-0", "new-1", "old-0", "old-1"]


def test_retain_keeps_the_newest_and_lists_what_it_skipped(db: str) -> None:
    with turnkeeper.open_store(db) as store:
        store.leases.acquire("session:old-1", "worker", 600)
    result = run("sessions", "retain", "--db", db, "--keep-last", "2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [g["session_id"] for g in report["removed"]] == ["old-0"]
    assert [g["reason"] for g in report["removed"]] == ["retention"]
    assert (report["skipped"], report["lease_lost"]) == ({"old-1": "busy"}, False)
    assert kept(db) == ["new-0", "new-1", "old-1"]
    # the pass released its lease: the next one runs
    again = run("sessions", "retain", "--db", db, "--keep-last", "0")
    assert again.exit_code == 0, again.output
    assert "kept old-1: busy" in again.stdout
    assert kept(db) == ["old-1"]


def test_retain_by_age(db: str) -> None:
    result = run("sessions", "retain", "--db", db, "--max-age", "3650d", "--json")
    assert result.exit_code == 0, result.output
    assert [g["session_id"] for g in json.loads(result.stdout)["removed"]] == ["old-0", "old-1"]
    assert kept(db) == ["new-0", "new-1"]


def test_retain_is_one_pass_at_a_time(db: str) -> None:
    with turnkeeper.open_store(db) as store:
        store.leases.acquire("retention:main", "another-pass", 600)
    result = run("sessions", "retain", "--db", db, "--keep-last", "0")
    assert result.exit_code == 2
    assert result.stderr.startswith("turnkeeper: BusyError:"), result.stderr
    assert kept(db) == ["new-0", "new-1", "old-0", "old-1"]
    other = run("sessions", "retain", "--db", db, "--keep-last", "3", "--name", "nightly")
    assert other.exit_code == 0, other.output
    assert kept(db) == ["new-0", "new-1", "old-1"]


@pytest.mark.parametrize(
    "args",
    [(), ("--max-age", "soon"), ("--max-age", "-5d"), ("--keep-last", "-1")],
)
def test_retain_needs_a_bound(db: str, args: tuple[str, ...]) -> None:
    result = run("sessions", "retain", "--db", db, *args)
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert kept(db) == ["new-0", "new-1", "old-0", "old-1"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("12h", 43200.0), ("30d", 2592000.0)],
)
def test_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds
    assert parse_age("2w") == 1209600.0
