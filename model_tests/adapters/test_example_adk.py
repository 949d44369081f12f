"""examples/adk_agent.py runs offline, and what it leaves in its DuckDB file is
two ADK sessions of turnkeeper's, their events and the user's state (issue 20)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import turnkeeper
from turnkeeper.adk import _codec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "adk_agent.py"


def run(path: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout.splitlines()


def test_the_adk_example_runs_and_its_sessions_persist(tmp_path: Path) -> None:
    path = tmp_path / "agents.duckdb"
    first, second = run(path), run(path)
    for out in (first, second):
        assert out[:2] == [
            "What is 2 plus 3? -> The sum is 5.",
            "And 10 plus 20? -> The sum is 30.",
        ]
        assert out[2].endswith(": 8 events stored")
    assert first[3] == "user total: 35"
    assert second[3] == "user total: 70"  # the user's state outlived the first session
    with turnkeeper.open_store(str(path)) as store:
        listed = store.sessions.list(cwd=_codec.user_dir("adder", "alice")).sessions
        assert len(listed) == 2
        for session in listed:
            entries = store.sessions.entries(session.id)
            assert len(entries) == 8 and all(_codec.is_event(e.payload) for e in entries)
            authors = [_codec.event_of(e.payload).author for e in entries]
            assert authors == ["user", "adder", "adder", "adder"] * 2
        record = store.threads.resolve(key=_codec.user_state_key("adder", "alice"))
        assert record is not None and record.state == {"total": 70}
