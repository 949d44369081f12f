"""reports/bench.py's encryption section (issue 23, cost): measured alone and
merged into an existing bench.json with every other figure kept as it was,
its table regenerated from the merged file; a twin whose payloads are not
what it is named is refused, never timed; the notes say when the figures
were taken under load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_machines import TINY_BENCH

import turnkeeper

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    """reports/bench.py as a module (and bench_encryption beside it)."""
    monkeypatch.syspath_prepend(str(REPORTS))
    for name in ("bench", "bench_encryption"):
        sys.modules.pop(name, None)
    import bench as module

    yield module
    for name in ("bench", "bench_encryption"):
        sys.modules.pop(name, None)


def alone(tmp_path: Path, section: str = "encryption") -> subprocess.CompletedProcess[str]:
    """``reports/bench.py <section>`` at the tiny size, its bench.json and
    BENCH.md in ``tmp_path`` (PostgreSQL too when the tests have a server)."""
    env = {k: v for k, v in os.environ.items() if k != "TURNKEEPER_TEST_PG"}
    env.update(TINY_BENCH)
    env["TURNKEEPER_BENCH_OUT"] = str(tmp_path / "bench.json")
    env["TURNKEEPER_BENCH_TABLE"] = str(tmp_path / "BENCH.md")
    if os.environ.get("TURNKEEPER_TEST_PG"):
        env["TURNKEEPER_TEST_PG"] = os.environ["TURNKEEPER_TEST_PG"]
    return subprocess.run(
        [sys.executable, str(REPORTS / "bench.py"), section],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_section_alone_is_merged_keeping_every_other_figure(bench, tmp_path: Path) -> None:
    """``bench.py encryption`` at a tiny size on a copy of the committed
    bench.json: each measured backend gains its section (marked alone),
    everything else in the file is byte for byte what it was, and BENCH.md is
    the table of the merged file, encryption rows included."""
    before = json.loads((REPORTS / "bench.json").read_text(encoding="utf-8"))
    for backend in before["backends"].values():
        backend.pop("encryption", None)  # as a file from before this section
    (tmp_path / "bench.json").write_text(json.dumps(before), encoding="utf-8")
    done = alone(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    after = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    measured = {"duckdb", *(["postgres"] if os.environ.get("TURNKEEPER_TEST_PG") else [])}
    assert {n for n, b in after["backends"].items() if "encryption" in b} == measured
    sections = {n: after["backends"][n].pop("encryption") for n in measured}
    assert after == before
    for section in sections.values():
        assert section["alone"] is True and section["reps"] == 1
        ratios = section["encrypted_over_clear"]
        assert len(ratios) == 4 and all(r["median"] > 0 for r in ratios.values())
        turns = section["statements_per_turn"]
        assert turns["clear"]["total"] > 0 and turns["encrypted"]["total"] > 0
        assert all(v > 0 for k, v in section["per_payload"].items())
    for name, section in sections.items():
        after["backends"][name]["encryption"] = section
    table = (tmp_path / "BENCH.md").read_text(encoding="utf-8")
    assert table == bench.table(after)
    assert "| encryption: append (fenced), encrypted / clear |" in table
    assert "measured alone (`python reports/bench.py encryption`)" in table


def test_the_section_alone_refuses_without_a_full_run(tmp_path: Path) -> None:
    """No bench.json to merge into: exit non-zero, nothing written."""
    done = alone(tmp_path)
    assert done.returncode != 0 and "run the whole benchmark first" in done.stderr
    assert not (tmp_path / "bench.json").exists() and not (tmp_path / "BENCH.md").exists()


def test_a_twin_not_stored_as_named_is_refused(bench, tmp_path: Path) -> None:
    """The encrypted twin's payloads must all be ciphertext and the clear
    twin's none: a store opened without ``encryption=`` timed as the
    encrypted twin (or the other way round) raises before any timing."""
    import bench_encryption

    keys = bench_encryption.provider()
    msg = {"message": {"role": "user", "content": "x"}}
    with (
        turnkeeper.open_store(str(tmp_path / "clear.duckdb")) as clear,
        turnkeeper.open_store(str(tmp_path / "sealed.duckdb"), encryption=keys) as sealed,
    ):
        for store in (clear, sealed):
            store.sessions.create("r")
            store.sessions.append("r", "message", msg)
        bench_encryption.sealed_check(clear, "r", sealed=False)
        bench_encryption.sealed_check(sealed, "r", sealed=True)
        with pytest.raises(RuntimeError, match="sealed twin's session 'r' holds 0 sealed"):
            bench_encryption.sealed_check(clear, "r", sealed=True)
        with pytest.raises(RuntimeError, match="clear twin's session 'r' holds 1 sealed"):
            bench_encryption.sealed_check(sealed, "r", sealed=False)
        with pytest.raises(RuntimeError, match="holds 0 sealed payloads of 0"):
            bench_encryption.sealed_check(sealed, "nothing", sealed=True)
    bench.REPLAY_ENTRIES = 20  # the module is this test's own (the fixture drops it after)
    with (
        turnkeeper.open_store(str(tmp_path / "twin.duckdb")) as clear,
        turnkeeper.open_store(str(tmp_path / "twin.duckdb"), replay_cache_bytes=0) as cold,
        pytest.raises(RuntimeError, match="sealed twin's session 'r' holds 0 sealed"),
    ):
        bench_encryption.twin(bench, clear, cold, sealed=True)


def _section(load: float) -> dict:
    ratio = {"median": 1.5, "min": 1.2, "max": 2.0}
    stmts = {"admit_run": 10, "append_many": 5, "finish_run": 12, "total": 27}
    return {
        "load_average": [load, 1.0, 1.0],
        "alone": True,
        "encrypted_over_clear": {"append (fenced)": ratio},
        "ms": {"encrypted": {"append (fenced)": 3.0}, "clear": {"append (fenced)": 2.0}},
        "statements_per_turn": {"encrypted": stmts, "clear": stmts},
        "append_statements_per_call": {"encrypted": 4.0, "clear": 1.0},
        "per_payload": {
            "seal_us": 5.0,
            "open_us": 4.0,
            "aes_gcm_decrypt_us": 1.0,
            "unwrap_us": 9.0,
            "payload_bytes": 220,
        },
    }


def test_the_notes_say_the_figures_were_taken_under_load_when_they_were(bench) -> None:
    import bench_encryption

    busy = bench_encryption.note({"duckdb": _section(1.0), "postgres": None}, cores=2)[2]
    idle = bench_encryption.note({"duckdb": _section(0.99), "postgres": None}, cores=2)[2]
    assert busy.startswith("The encryption rows: measured alone")
    assert "taken under load" in busy and "duckdb [1.0, 1.0, 1.0] on 2 cores" in busy
    assert "taken under load" not in idle and "duckdb [0.99, 1.0, 1.0] on 2 cores" in idle
    assert bench_encryption.note({"duckdb": None, "postgres": None}, cores=2) == []
    rows = bench_encryption.rows([_section(0.5), None], bench.TURN_PHASES)
    assert rows[0] == (
        "| encryption: append (fenced), encrypted / clear | 1.5× [1.2–2.0] (3.0 vs 2.0 ms) | — |"
    )
    assert "| 27 (10 / 5 / 12) vs 27 (10 / 5 / 12) | — |" in rows[1]


def test_the_notes_give_the_cold_replay_from_the_snapshot_and_from_the_rows(bench) -> None:
    """Encrypted / clear from the stored snapshot 6×, from the rows 1.5×."""
    import bench_encryption

    snap = bench_encryption.REPLAY.format(entries=10)
    rows = bench_encryption.ROWS.format(entries=10)
    section = _section(0.5)
    section["encrypted_over_clear"] = {
        snap: {"median": 6.0, "min": 6.0, "max": 6.0},
        rows: {"median": 1.5, "min": 1.5, "max": 1.5},
    }
    section["ms"] = {"encrypted": {snap: 12.0, rows: 12.0}, "clear": {snap: 2.0, rows: 8.0}}
    lines = bench_encryption.note({"duckdb": None, "postgres": section}, cores=2)
    split = [line for line in lines if line.startswith("- postgres:")]
    assert split == [
        "- postgres: the encrypted cold replay from its sealed snapshot is 6.0× the clear one "
        "from its snapshot; from their rows (every entry opened) 1.5×; opening a payload "
        "costs 4.0 µs, AES-GCM's decrypt 1.0 µs of it."
    ]
    assert lines[-2] == f"- {bench_encryption.OPENING}."
    assert not any(line.startswith("- ") for line in bench_encryption.note({"d": _section(0.5)}, 2))


def test_the_clear_twin_from_its_rows_reads_and_stores_no_snapshot(
    bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``from_rows`` sets the stored snapshot aside for its one call: the
    clear cold replay it wraps loads none and stores none, and gives the
    same replay; before and after it, the store reads its snapshot again."""
    import bench_encryption

    from turnkeeper.storage.ops import replay_snapshots

    loads: list[str] = []
    real = replay_snapshots.load

    def counted(tx, session_id, stored):
        loads.append(session_id)
        return real(tx, session_id, stored)

    monkeypatch.setattr(replay_snapshots, "load", counted)
    msg = {"message": {"role": "user", "content": "x"}}
    path = str(tmp_path / "clear.duckdb")
    entries = replay_snapshots.PERSIST_ROWS + 10
    with (
        turnkeeper.open_store(path) as store,
        turnkeeper.open_store(path, replay_cache_bytes=0) as cold,
    ):
        store.sessions.create("r")
        store.sessions.append_many("r", [("message", msg)] * entries)
        first = cold.sessions.replay("r")  # from the rows: stores the snapshot

        def snapshots() -> int:
            return store.query("SELECT count(*) AS n FROM replay_snapshots").to_pylist()[0]["n"]

        stored = snapshots()
        assert stored > 0 and loads == []
        assert cold.sessions.replay("r").messages == first.messages and loads == ["r"]
        rows = bench_encryption.from_rows(lambda: cold.sessions.replay("r"))
        assert rows().messages == first.messages and len(first.messages) == entries
        assert loads == ["r"]  # the stored snapshot not read
        store.db.write("drop", lambda tx: tx.exec("DELETE FROM replay_snapshots"))
        assert rows().messages == first.messages
        assert loads == ["r"] and snapshots() == 0  # and none stored
        cold.sessions.replay("r")  # unpatched again: stores it anew
        assert snapshots() == stored
