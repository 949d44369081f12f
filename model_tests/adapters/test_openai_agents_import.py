"""``turnkeeper.openai_agents.import_sqlite``: an SDK ``SQLiteSession`` database (made
here by the real ``SQLiteSession``, offline) becomes one turnkeeper session per SDK
session with identical ``get_items``; importing again adds only the new rows; a row
that is not JSON is kept verbatim and reported."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from agents import SQLiteSession
from openai_agents_items import every_item

import turnkeeper
from turnkeeper.aio import AsyncStore
from turnkeeper.openai_agents import UNPARSED_TYPE, TurnkeeperSession, import_sqlite


def _sdk(db: Path, sid: str, op: str, *args: Any) -> Any:
    session = SQLiteSession(sid, db)
    try:
        return asyncio.run(getattr(session, op)(*args))
    finally:
        session.close()


async def _read(store: turnkeeper.BaseStore, sid: str, limit: int | None) -> Any:
    async with AsyncStore.wrap(store) as astore:
        return await TurnkeeperSession(sid, astore).get_items(limit)


def _ours(store: turnkeeper.BaseStore, sid: str, limit: int | None = None) -> Any:
    return asyncio.run(_read(store, sid, limit))


def test_import_gives_identical_items_and_is_idempotent(
    store: turnkeeper.BaseStore, tmp_path: Path
) -> None:
    db = tmp_path / "agents.db"
    items = every_item()
    _sdk(db, "alpha", "add_items", items)
    _sdk(db, "beta", "add_items", [{"role": "user", "content": "hi"}])
    _sdk(db, "beta", "pop_item")
    _sdk(db, "beta", "add_items", [{"role": "user", "content": "hello"}])
    with sqlite3.connect(db) as conn:  # a row the SDK itself skips
        conn.execute(
            "INSERT INTO agent_messages (session_id, message_data) VALUES ('beta', 'not json {')"
        )
    _sdk(db, "gamma", "add_items", [{"role": "user", "content": "x"}])
    _sdk(db, "gamma", "clear_session")
    shown: list[tuple[str, int]] = []
    report = import_sqlite(store, db, progress=lambda sid, n: shown.append((sid, n)))
    assert shown == [("alpha", len(items)), ("beta", 2)]
    assert sorted(report.sessions) == ["alpha", "beta"]
    assert report.added == {"alpha": len(items), "beta": 2}
    assert list(report.unparsed) == ["beta"]
    for sid in ("alpha", "beta"):
        assert _ours(store, sid) == _sdk(db, sid, "get_items")
        assert _ours(store, sid, 1) == _sdk(db, sid, "get_items", 1)
    kept = [
        e.payload
        for e in store.sessions.entries(report.sessions["beta"])
        if e.payload.get("customType") == UNPARSED_TYPE
    ]
    assert kept == [{"customType": UNPARSED_TYPE, "data": {"message_data": "not json {"}}]

    again = import_sqlite(store, db)
    assert again.added == {"alpha": 0, "beta": 0} and again.sessions == report.sessions
    _sdk(db, "alpha", "add_items", [{"role": "user", "content": "later"}])
    grown = import_sqlite(store, db)
    assert grown.added == {"alpha": 1, "beta": 0}
    assert _ours(store, "alpha") == _sdk(db, "alpha", "get_items")
    assert len(store.sessions.entries(report.sessions["alpha"])) == len(items) + 1


def test_a_file_that_is_not_a_session_database_imports_nothing(
    store: turnkeeper.BaseStore, tmp_path: Path
) -> None:
    bad = tmp_path / "other.db"
    with sqlite3.connect(bad) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(turnkeeper.SessionFileError):
        import_sqlite(store, bad)
    assert store.bindings.list() == []


def test_turnkeeper_import_takes_an_openai_agents_database(tmp_path: Path) -> None:
    """The CLI tells the SDK's database from LangGraph's by its tables, imports
    it once (a second import adds nothing), and refuses an SQLite database of
    neither kind as a format no importer knows (exit 1, nothing imported)."""
    import json

    from click.testing import CliRunner

    from turnkeeper.cli.main import cli

    db = tmp_path / "agents.db"
    _sdk(db, "alpha", "add_items", [{"role": "user", "content": "hi"}])
    store_path = str(tmp_path / "cli.duckdb")
    first = CliRunner().invoke(cli, ["import", str(db), "--db", store_path])
    assert first.exit_code == 0, first.output
    assert "openai-agents sqlite: 1 sessions: added 1 items" in first.stdout
    again = CliRunner().invoke(cli, ["import", str(db), "--db", store_path, "--json"])
    data = json.loads(again.stdout)["files"][0]
    assert (data["format"], data["added"]) == ("openai-agents-sqlite", {"alpha": 0})
    with turnkeeper.open_store(store_path) as store:
        assert _ours(store, "alpha") == [{"role": "user", "content": "hi"}]

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    refused = CliRunner().invoke(cli, ["import", str(other), "--db", store_path])
    assert refused.exit_code == 1
    assert "SessionFormatUnknownError" in refused.stderr
