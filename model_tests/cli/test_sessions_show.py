"""``turnkeeper sessions show``: the short id on each line tells the entries apart."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

import turnkeeper
from turnkeeper.cli import sessions_view
from turnkeeper.cli.main import cli

LINE = re.compile(r"^[\s│├└─⎇]*(?P<kind>[a-z_]+) (?P<id>\S+) ")


def test_every_entry_of_a_session_with_runs_shows_a_distinct_id(tmp_path: Path) -> None:
    db = str(tmp_path / "show.duckdb")
    with turnkeeper.open_store(db) as store:
        store.sessions.create("s")
        store.sessions.set_title("s", "two runs")
        for n in range(2):
            lease = store.leases.acquire("session:s", "w", 30, purpose="execution")
            run = store.runs.admit(
                "s", {"n": n}, user_message={"role": "user", "content": f"q{n}"}, lease=lease
            )
            store.runs.start(run.id, lease=lease)
            reply = {"role": "assistant", "content": [{"type": "text", "text": f"a{n}"}]}
            store.runs.finish(run.id, "succeeded", assistant_message=reply, lease=lease)
            store.leases.release(lease)
        store.sessions.set_label("s", store.sessions.entries("s")[1].id, "first question")
        entries = store.sessions.entries("s")
    assert len({e.id[:8] for e in entries if ":" in e.id}) == 1  # the bug's premise
    result = CliRunner().invoke(cli, ["sessions", "--db", db, "show", "s"])
    assert result.exit_code == 0, result.output
    shown = [m["id"] for m in map(LINE.match, result.stdout.splitlines()[1:]) if m]
    assert len(shown) == len(entries), result.stdout
    assert len(set(shown)) == len(shown), result.stdout
    display = sessions_view.short_ids([e.id for e in entries])
    assert shown == [display[e.id] for e in entries]
    assert any(s.endswith(":turn-start") for s in shown)
    label_line = next(line for line in result.stdout.splitlines() if " label " in line)
    assert f"{display[entries[1].id]} = first question" in label_line


def test_short_ids_are_unique_prefixes_plus_the_derived_suffix() -> None:
    run_a = "01a23082-e5a4-7a52-84bb-c787d4b48884"
    run_b = "01a23082-e5a4-7a77-9000-000000000000"  # the same millisecond
    ids = [
        "3f2a9c1d",
        "3f2a9c1e",
        f"{run_a}:turn-start",
        f"{run_a}:user",
        f"{run_b}:turn-start",
        f"{run_b}:call_1:interrupted",
        "a23ec1c0dd6c5c6f",
    ]
    display = sessions_view.short_ids(ids)
    assert len(set(display.values())) == len(ids)
    assert display["3f2a9c1d"] == "3f2a9c1d" and display["a23ec1c0dd6c5c6f"] == "a23ec1c0"
    assert display[f"{run_a}:turn-start"] == "01a23082-e5a4-7a5:turn-start"
    assert display[f"{run_b}:call_1:interrupted"] == "01a23082-e5a4-7a7:call_1:interrupted"
    for full, short in display.items():  # each is the id with its base cut short
        base, _, suffix = full.partition(":")
        shown_base, _, shown_suffix = short.partition(":")
        assert base.startswith(shown_base) and suffix == shown_suffix
        assert not shown_base.endswith("-")
    assert sessions_view.short_ids(["01a23082-aaaa", "01a23082-bbbb"]) == {
        "01a23082-aaaa": "01a23082-a",
        "01a23082-bbbb": "01a23082-b",
    }
