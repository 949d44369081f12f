"""``turnkeeper sessions``: filters by directory, project, channel, status and messages, pages with
--offset and --limit, sub-agents only when asked (issue 18), on both backends;
``sessions show`` opens a prefix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import BACKENDS, new_pg_schema

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.cli import sessions_view
from turnkeeper.cli.main import cli
from turnkeeper.fuzz import FakeClock


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database (a DuckDB file, or a PostgreSQL schema's URL) holding five
    sessions a second apart (s0 oldest): s0–s2 in /a, s3–s4 in /b; s1 and s3
    have messages, s2 an admitted run; s4 a sub-agent."""
    where = str(tmp_path / "f.duckdb") if request.param == "duckdb" else new_pg_schema()
    clock = FakeClock()
    with turnkeeper.open_store(where, clock=clock) as store:
        for i in range(5):
            store.sessions.create(f"0190abc{i}-sess", cwd="/a" if i < 3 else "/b")
            if i in (1, 3):
                store.sessions.append(
                    f"0190abc{i}-sess",
                    EntryKind.MESSAGE,
                    {"message": {"role": "user", "content": "q"}},
                )
            clock.advance(1)
        store.runs.admit("0190abc2-sess", {"q": 1})
        store.sessions.new_sub_agent("0190abc4-sess", "0190abc9-sub")
    yield where


def listed(db: str, *args: str, sub: tuple[str, ...] = ()) -> tuple[int, list[str]]:
    result = run("sessions", *sub, "--db", db, "--json", *args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    return data["total"], [s["id"][:8] for s in data["sessions"]]


def test_filters_select_and_total_counts_what_they_select(db: str) -> None:
    assert listed(db) == (5, ["0190abc4", "0190abc3", "0190abc2", "0190abc1", "0190abc0"])
    assert listed(db, "--cwd", "/a") == (3, ["0190abc2", "0190abc1", "0190abc0"])
    assert listed(db, "--status", "active") == (1, ["0190abc2"])
    assert listed(db, "--status", "idle", "--cwd", "/b") == (2, ["0190abc4", "0190abc3"])
    assert listed(db, "--messages-only") == (2, ["0190abc3", "0190abc1"])
    assert listed(db, "--sub-agents", "--cwd", "/b")[1] == ["0190abc9", "0190abc4", "0190abc3"]
    assert listed(db, "--sub-agents-of", "0190abc4-sess") == (1, ["0190abc9"])


def test_offset_and_limit_page_the_listing(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions_view, "PAGE_SIZE", 1)  # the cursor follows each page
    assert listed(db, "--offset", "1", "--limit", "3") == (
        5,
        ["0190abc3", "0190abc2", "0190abc1"],
    )
    assert listed(db, "--offset", "4", sub=("list",)) == (5, ["0190abc0"])
    assert listed(db, "--offset", "2", "--limit", "1", "--cwd", "/a") == (3, ["0190abc0"])


def test_a_bad_status_is_a_usage_error(db: str) -> None:
    result = run("sessions", "--db", db, "--status", "busy")
    assert result.exit_code == 2 and "busy" in result.stderr


def test_show_opens_a_prefix_and_names_an_ambiguous_one(db: str) -> None:
    shown = run("sessions", "--db", db, "show", "0190abc3-")
    assert shown.exit_code == 0, shown.output
    short = run("sessions", "--db", db, "show", "0190abc")  # under 8 characters: whole ids only
    assert short.exit_code == 2 and "SessionNotFoundError" in short.stderr
    with turnkeeper.open_store(db) as store:
        store.sessions.create("0190abc3-other")
    many = run("sessions", "--db", db, "show", "0190abc3")
    assert many.exit_code == 2 and "AmbiguousSessionIDError" in many.stderr
    assert "0190abc3-other" in many.stderr and "0190abc3-sess" in many.stderr


def test_filters_by_project_and_channel(db: str) -> None:
    with turnkeeper.open_store(db) as store:
        work = store.projects.create("work", project_id="work")
        for sid in ("0190abc0-sess", "0190abc3-sess"):
            store.sessions.set_metadata(sid, turnkeeper.SessionMetadata(project_id=work.id))
        store.bindings.bind("0190abc1-sess", "telegram", "42")
        store.bindings.bind("0190abc3-sess", "slack", "C7")
    assert listed(db, "--project", "work") == (2, ["0190abc3", "0190abc0"])
    assert listed(db, "--project", "work", "--cwd", "/a") == (1, ["0190abc0"])
    assert listed(db, "--channel-type", "telegram") == (1, ["0190abc1"])
    assert listed(db, "--channel-id", "C7") == (1, ["0190abc3"])
    assert listed(db, "--channel-type", "slack", "--channel-id", "42") == (0, [])
    assert listed(db, "--search", "telegr") == (1, ["0190abc1"])  # WithSearch: channel metadata
    data = json.loads(run("sessions", "--db", db, "--json", "--project", "work").stdout)
    assert [(s["channel_type"], s["channel_id"]) for s in data["sessions"]] == [
        ("slack", "C7"),
        (None, None),
    ]
    table = run("sessions", "--db", db, "--channel-type", "slack")
    assert table.exit_code == 0 and "slack:C7" in table.stdout, table.output
    missing = run("sessions", "--db", db, "--project", "nope")
    assert missing.exit_code == 2 and "ProjectNotFoundError" in missing.stderr
