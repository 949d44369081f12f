"""``turnkeeper.langgraph.import_sqlite``: a LangGraph SQLite checkpoint database,
made here by the real ``langgraph-checkpoint-sqlite`` SqliteSaver running small real
graphs offline, imported so that TurnkeeperSaver serves every thread as SqliteSaver
does; idempotent, a grown database adds only its new rows. Both backends."""

from __future__ import annotations

import json
import operator
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from click.testing import CliRunner
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import turnkeeper
from turnkeeper.cli.main import cli
from turnkeeper.langgraph import TurnkeeperSaver, import_sqlite


class State(TypedDict):
    items: Annotated[list[str], operator.add]


def _inner() -> Any:
    sub = StateGraph(State)
    sub.add_node("deep", lambda s: {"items": ["deep"]})
    sub.add_edge(START, "deep")
    sub.add_edge("deep", END)
    return sub.compile()


def _ask(state: State) -> dict[str, list[str]]:
    answer = interrupt({"question": "go on?", "seen": len(state["items"])})
    return {"items": [f"answer:{answer}"]}


def _graph(saver: Any) -> Any:
    g = StateGraph(State)
    g.add_node("left", lambda s: {"items": ["left"]})
    g.add_node("right", lambda s: {"items": ["right"]})
    g.add_node("inner", _inner())
    g.add_node("ask", _ask)
    g.add_edge(START, "left")
    g.add_edge(START, "right")
    g.add_edge(["left", "right"], "inner")
    g.add_edge("inner", "ask")
    g.add_edge("ask", END)
    return g.compile(checkpointer=saver)


def _cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[tuple[Path, SqliteSaver]]:
    path = tmp_path / "checkpoints.sqlite"
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    graph = _graph(saver)
    graph.invoke({"items": ["a"]}, _cfg("done"))
    graph.invoke(Command(resume="yes"), _cfg("done"))
    graph.invoke({"items": ["b"]}, _cfg("waiting"))  # stops at the interrupt
    yield path, saver
    conn.close()


def _all(saver: Any, config: Any) -> list[Any]:
    return list(saver.list(config))


def test_imported_threads_are_served_as_sqlite_serves_them(
    store: turnkeeper.BaseStore, sqlite_db: tuple[Path, SqliteSaver]
) -> None:
    path, sqlite_saver = sqlite_db
    seen: list[tuple[int, int]] = []
    result = import_sqlite(store, path, progress=lambda done, total: seen.append((done, total)))
    assert sorted(result.threads) == ["done", "waiting"] == sorted(result.created)
    assert seen == [(1, 2), (2, 2)]
    assert not result.conflicts and result.skipped == 0
    ours = TurnkeeperSaver(store)
    theirs_all = _all(sqlite_saver, None)
    assert {t.config["configurable"]["checkpoint_ns"] for t in theirs_all} != {""}  # subgraph
    assert any(t.pending_writes for t in theirs_all)
    assert _all(ours, None) == theirs_all
    for thread in ("done", "waiting"):
        assert _all(ours, _cfg(thread)) == _all(sqlite_saver, _cfg(thread))
        assert ours.get_tuple(_cfg(thread)) == sqlite_saver.get_tuple(_cfg(thread))
        for t in _all(sqlite_saver, _cfg(thread)):
            assert ours.get_tuple(t.config) == t
    assert result.checkpoints_added == len(theirs_all)
    # the interrupted thread resumes from the store as it would from SQLite
    resumed = _graph(ours).invoke(Command(resume="later"), _cfg("waiting"))
    assert resumed == _graph(sqlite_saver).invoke(Command(resume="later"), _cfg("waiting"))


def test_a_reimport_adds_nothing_and_a_grown_database_only_its_new_rows(
    store: turnkeeper.BaseStore, sqlite_db: tuple[Path, SqliteSaver]
) -> None:
    path, sqlite_saver = sqlite_db
    first = import_sqlite(store, path)
    again = import_sqlite(store, path)
    assert (again.checkpoints_added, again.writes_added, again.created) == (0, 0, [])
    assert again.skipped == first.checkpoints_added + first.writes_added
    _graph(sqlite_saver).invoke({"items": ["c"]}, _cfg("third"))
    grown = import_sqlite(store, path)
    assert grown.created == ["third"]
    assert grown.checkpoints_added == len(_all(sqlite_saver, _cfg("third")))
    assert _all(TurnkeeperSaver(store), None) == _all(sqlite_saver, None)


def test_a_file_that_is_no_langgraph_database_is_refused(
    store: turnkeeper.BaseStore, tmp_path: Path
) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("hello")
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    for path in (text, other):
        with pytest.raises(turnkeeper.SessionFileError):
            import_sqlite(store, path)
    assert store.bindings.list(channel_type="langgraph") == []


def test_turnkeeper_import_takes_a_langgraph_database(
    tmp_path: Path, sqlite_db: tuple[Path, SqliteSaver]
) -> None:
    path, sqlite_saver = sqlite_db
    db = str(tmp_path / "cli.duckdb")
    first = CliRunner().invoke(cli, ["import", str(path), "--db", db], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    assert "langgraph sqlite: 2 threads (2 new)" in first.stdout
    again = CliRunner().invoke(
        cli, ["import", str(path), "--db", db, "--json"], catch_exceptions=False
    )
    data = json.loads(again.stdout)["files"][0]
    assert (data["format"], data["created"], data["checkpoints_added"]) == (
        "langgraph-sqlite",
        [],
        0,
    )
    with turnkeeper.open_store(db) as store:
        assert _all(TurnkeeperSaver(store), None) == _all(sqlite_saver, None)
