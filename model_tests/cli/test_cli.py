"""The ``turnkeeper`` CLI: demo (fleet + audit), audit failures on corrupted data,
report, sessions list/show, import/export wrappers and error handling."""

from __future__ import annotations

import importlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner, Result

import turnkeeper
from turnkeeper.cli import sessions_view
from turnkeeper.cli.fleet import MODELS, FleetConfig, plan_iteration
from turnkeeper.cli.main import cli
from turnkeeper.storage.audit.checks import tree_problems

pq = importlib.import_module("pyarrow.parquet")

DEMO_ARGS = ["--duration", "3", "--min-turns", "30", "--workers", "4", "--sessions", "4"]
DEMO_ARGS += ["--seed", "1", "--ttl", "6"]
"""The shared demo: 30 committed turns at least, however long a loaded machine
takes (the corruptions below need tool calls, deliveries and takeovers in it).
Its leases last 6 s, not the default 2 s: CI runs this first, beside the
suite's heaviest files in the other lanes, and there a turn outlasted a 2 s
lease again and again (22 lost mid-turn, 11 turns, then 60 s without one:
the fleet stopped short). Stalls still sleep past the TTL, so takeovers stay."""


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def checks_by_name(figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in figures["audit"]}


def checked_of(figures: dict[str, Any], name: str) -> int:
    return int(checks_by_name(figures)[name]["checked"])


def changed(
    con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None, *, rows: int = 1
) -> None:
    """Run one raw write on ``con`` and check that it changed ``rows`` rows: a
    forged corruption that changed nothing leaves the audit nothing to find (CI:
    a demo on a loaded machine had no completed tool record to break)."""
    found = con.execute(sql, params or []).fetchone()
    assert found is not None and found[0] == rows, (found, rows, sql)


@dataclass
class DemoRun:
    db: Path
    figures: dict[str, Any]

    def copy(self, dest: Path) -> Path:
        target = dest / "copy.duckdb"
        shutil.copy(self.db, target)
        wal = self.db.with_name(self.db.name + ".wal")
        if wal.exists():
            shutil.copy(wal, target.with_name(target.name + ".wal"))
        return target


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    db = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    result = run("demo", "--db", str(db), *DEMO_ARGS, "--json")
    assert result.exit_code == 0, result.output
    return DemoRun(db, json.loads(result.stdout))


# -- demo ----------------------------------------------------------------------------


def test_short_demo_is_clean_and_fences_stale_writes(demo: DemoRun) -> None:
    f = demo.figures
    assert f["audit_passed"] is True
    assert all(c["passed"] for c in f["audit"]), f["audit"]
    assert set(checks_by_name(f)) == {
        "epochs_strictly_increasing",
        "grants_follow_prior_epoch",
        "no_entry_under_lost_lease",
        "refused_writes_absent",
        "one_active_record_per_key",
        "session_trees_well_formed",
        "stale_writes_refused",
        "workers_error_free",
        "payloads_open",
        "one_active_run_per_session",
        "no_run_revived",
        "delivered_at_most_once",
        "tool_calls_paired",
        "tool_results_in_context",
        "no_orphan_rows",
        "bindings_agree",
        "ledger_tips_match_records",
        "ledgers_verify",
        "ledger_catalog_lists_sessions",
        "stale_ledger_appends_absent",
        "stale_delivery_acks_refused",
        "fleet_did_work",
    }
    assert f["turns_committed"] >= 30 == f["config"]["min_turns"]
    assert f["runs_admitted"] >= f["turns_committed"]
    assert f["recoveries_converged"] > 0  # stalled and crashed workers' runs
    assert f["deliveries"]["delivered"] > 0
    assert f["deliveries"]["replies_read"] > 0  # the workers read the replies they send
    assert checked_of(f, "one_active_run_per_session") >= 2 * f["runs_admitted"] - 8
    assert f["stale_writes_fenced"] > 0
    assert f["stale_writes_accepted"] == 0
    assert f["store_operations"] > 0 and f["ops_per_s"] > 0
    for op in ("acquire_lease", "renew_lease", "release_lease", "append"):
        assert f["statements"][op]["calls"] > 0
        assert f["statements"][op]["statements_per_call"] >= 1
    # The checks looked at real data.
    checked = {c["name"]: c["checked"] for c in f["audit"]}
    assert checked["no_entry_under_lost_lease"] >= f["turns_committed"]
    assert (
        checked["refused_writes_absent"]
        >= f["stale_writes_fenced"] - f["stale_ledger_appends_fenced"]
    )
    assert checked["stale_ledger_appends_absent"] == f["stale_ledger_appends_fenced"]
    # every session the fleet wrote a turn of has a ledger, verified and listed
    assert f["ledger_records"] >= 2 * f["turns_committed"]
    assert f["stale_ledger_appends_fenced"] == f["stalls"]
    written = {c["name"]: c["checked"] for c in f["audit"]}["ledger_tips_match_records"]
    assert written >= 1
    for name in ("ledgers_verify", "ledger_catalog_lists_sessions"):
        assert checked[name] == written


def test_demo_counts_match_the_stored_history(demo: DemoRun) -> None:
    f = demo.figures
    con = duckdb.connect(str(demo.db), read_only=True)
    try:
        takeovers = con.execute(
            "SELECT count(*) FROM lease_events WHERE edge = 'takeover'"
        ).fetchone()
        fenced = con.execute("SELECT count(*) FROM fence_events").fetchone()
        leased = con.execute(  # entries workers wrote (recovery's are told apart by id)
            "SELECT count(*) FROM entries WHERE lease_epoch IS NOT NULL "
            "AND id NOT LIKE '%:interrupted' AND id NOT IN ("
            "SELECT run_id || ':turn-end' FROM recovery_events WHERE edge = 'converge')"
        ).fetchone()
    finally:
        con.close()
    assert takeovers is not None and fenced is not None and leased is not None
    assert f["takeovers"] == takeovers[0]
    assert fenced[0] >= f["stale_writes_fenced"]
    assert leased[0] == f["entries_written"]


def test_demo_table_output(tmp_path: Path) -> None:
    result = run(
        "demo",
        "--db",
        str(tmp_path / "t.duckdb"),
        "--duration",
        "1",
        "--workers",
        "2",
        "--sessions",
        "2",
        "--seed",
        "3",
    )
    assert result.exit_code == 0, result.output
    for text in (
        "runs succeeded",
        "orphans recovered",
        "replies delivered",
        "stale writes fenced",
        "takeovers",
        "busy refusals",
        "store operations / s",
        "statements / acquire_lease",
        "statements / append",
        "audit: epochs_strictly_increasing",
        "audit: session_trees_well_formed",
        "PASS",
    ):
        assert text in result.stdout
    assert "FAIL" not in result.stdout


def test_demo_table_names_every_hot_operation_even_one_not_called(tmp_path: Path) -> None:
    """A run too short or too loaded to call an operation (CI saw a 1 s demo on a
    busy machine make no append) still shows its row, saying it was not called."""
    import json

    from rich.console import Console

    from turnkeeper.cli.demo import HOT_OPERATIONS, render

    result = run("demo", "--db", str(tmp_path / "t.duckdb"), "--duration", "1", "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    figures["statements"].pop("append", None)
    console = Console(record=True, width=200)
    render(console, figures)
    shown = console.export_text()
    for op in HOT_OPERATIONS:
        assert f"statements / {op}" in shown
    assert "not called in this run" in shown


def test_seed_fixes_each_workers_choices(tmp_path: Path) -> None:
    cfg = FleetConfig(workers=3, sessions=5, seed=7)
    result = run(
        "demo",
        "--db",
        str(tmp_path / "s.duckdb"),
        "--duration",
        "1",
        "--min-turns",  # at least as many iterations as workers, however loaded
        "3",
        "--workers",
        "3",
        "--sessions",
        "5",
        "--seed",
        "7",
        "--json",
    )
    assert result.exit_code == 0, result.output
    chosen = json.loads(result.stdout)["first_choices"]
    assert sum(len(c) for c in chosen.values()) >= cfg.workers
    for index in range(cfg.workers):
        rng = random.Random(cfg.seed + index)  # the documented per-worker generator
        expected = [f"demo-7-{plan_iteration(rng, cfg).session}" for _ in range(16)]
        got = chosen[str(index)]
        assert got == expected[: len(got)]


def test_plans_repeat_per_seed_and_differ_across_seeds() -> None:
    cfg = FleetConfig(sessions=20, seed=5)

    def plans(seed: int, index: int) -> list[Any]:
        rng = random.Random(seed + index)
        return [plan_iteration(rng, cfg) for _ in range(80)]

    assert plans(5, 0) == plans(5, 0)
    assert plans(5, 0) != plans(5, 1)
    assert plans(5, 0) != plans(6, 0)
    actions = {p.action for p in plans(5, 0) + plans(5, 1)}
    assert actions == {"turn", "stall", "abandon", "crash"}


# -- the audit can fail ----------------------------------------------------------------


def _append_corrupt_entry(
    con: duckdb.DuckDBPyConnection, lease_epoch: int | None, parent: str | None = None
) -> None:
    """Insert an entry as the new leaf of demo-1-0, keeping the session row consistent."""
    leaf, seq = con.execute(
        "SELECT leaf_id, next_seq FROM sessions WHERE id = 'demo-1-0'"
    ).fetchone() or (None, None)
    changed(
        con,
        "INSERT INTO entries (session_id, id, parent_id, kind, seq, ts, payload, lease_epoch, "
        "written_at) VALUES ('demo-1-0', 'forged01', ?, 'message', ?, now(), ?, ?, now())",
        [
            leaf if parent is None else parent,
            seq,
            json.dumps({"message": {"role": "user", "content": "forged"}}),
            lease_epoch,
        ],
    )
    changed(
        con,
        "UPDATE sessions SET leaf_id = 'forged01', next_seq = next_seq + 1, "
        "entry_count = entry_count + 1 WHERE id = 'demo-1-0'",
    )


def _never_granted_epoch(con: duckdb.DuckDBPyConnection) -> None:
    _append_corrupt_entry(con, lease_epoch=999)


def _duplicate_active_record(con: duckdb.DuckDBPyConnection) -> None:
    """Two forged active records on demo-1-0's key, copied from one of its records
    (or any record: whatever the demo left there, it then has two active)."""
    for forged in ("forged-record", "forged-record-2"):
        changed(
            con,
            f"INSERT INTO thread_records SELECT '{forged}', 'demo-1-0', 'active', driver_type, "
            "agent, fingerprint, compatibility_fingerprint, session_codec, state, created_at, "
            "updated_at FROM thread_records ORDER BY key = 'demo-1-0' DESC, id LIMIT 1",
        )


def _missing_parent(con: duckdb.DuckDBPyConnection) -> None:
    _append_corrupt_entry(con, lease_epoch=None, parent="ghost-parent")


def _epoch_gap(con: duckdb.DuckDBPyConnection) -> None:
    changed(
        con,
        "INSERT INTO lease_events SELECT target, epoch + 2, 'intruder', purpose, 'takeover', "
        "'acquire', 'held', 'held', owner, now() + INTERVAL 1 HOUR, now() FROM leases "
        "WHERE target = 'session:demo-1-0'",
    )
    changed(con, "UPDATE leases SET epoch = epoch + 2 WHERE target = 'session:demo-1-0'")


def _write_after_takeover(con: duckdb.DuckDBPyConnection) -> None:
    """A write under epoch 1 appended after later epochs wrote: stamped inside epoch 1's
    own lifetime, so only the seq-order rule can see it."""
    row = con.execute(
        "SELECT occurred_at + INTERVAL 1 MICROSECOND FROM lease_events "
        "WHERE target = 'session:demo-1-0' AND epoch = 1 AND edge = 'grant'"
    ).fetchone()
    assert row is not None
    _append_corrupt_entry(con, lease_epoch=1)
    changed(con, "UPDATE entries SET ts = ? WHERE id = 'forged01'", [row[0]])


def _run_event(
    con: duckdb.DuckDBPyConnection, run_id: str, edge: str, source: str, dest: str, as_run: str = ""
) -> None:
    """Append a forged run event (for ``as_run``, default the run) to the run's session."""
    changed(
        con,
        "INSERT INTO run_events SELECT r.session_id, (SELECT max(seq) + 1 FROM run_events e "
        "WHERE e.session_id = r.session_id), 'forged-' || ? || '-' || ?, ?, ?, ?, ?, ?, "
        "'{}', now() FROM runs r WHERE r.id = ?",
        [as_run or run_id, edge, as_run or run_id, edge, edge, source, dest, run_id],
    )


def _succeeded_run(con: duckdb.DuckDBPyConnection) -> str:
    row = con.execute(
        "SELECT id FROM runs WHERE status = 'succeeded' ORDER BY id LIMIT 1"
    ).fetchone()
    assert row is not None
    return str(row[0])


def _second_active_run(con: duckdb.DuckDBPyConnection) -> None:
    run_id = _succeeded_run(con)
    _run_event(con, run_id, "admit", "absent", "admitted", as_run="forged-run-a")
    _run_event(con, run_id, "admit", "absent", "admitted", as_run="forged-run-b")


def _revived_run(con: duckdb.DuckDBPyConnection) -> None:
    _run_event(con, _succeeded_run(con), "start", "succeeded", "running")


def _delivered_twice(con: duckdb.DuckDBPyConnection) -> None:
    changed(
        con,
        "INSERT INTO delivery_events SELECT * FROM delivery_events "
        "WHERE dest = 'delivered' ORDER BY operation_id LIMIT 1",
    )


def _tool_record_stuck(con: duckdb.DuckDBPyConnection) -> None:
    """A completed record of an ended run is running again."""
    changed(
        con,
        "UPDATE tool_executions SET state = 'running' WHERE execution_key = "
        "(SELECT min(t.execution_key) FROM tool_executions t JOIN runs r ON r.id = t.run_id "
        "WHERE t.state = 'completed' AND r.finished_at IS NOT NULL)",
    )


def _cut_splits_a_pair(con: duckdb.DuckDBPyConnection) -> None:
    """A compaction under a session's leaf keeps a toolResult but cuts off its call."""
    row = con.execute(
        "SELECT e.session_id, e.id, s.leaf_id, s.next_seq FROM entries e "
        "JOIN sessions s ON s.id = e.session_id WHERE e.kind = 'message' "
        "AND json_extract_string(e.payload, '$.message.role') = 'toolResult' "
        "ORDER BY e.session_id, e.seq LIMIT 1"
    ).fetchone()
    assert row is not None
    sid, result_id, leaf, seq = row
    payload = json.dumps({"summary": "s", "firstKeptEntryId": result_id, "tokensBefore": 1})
    changed(
        con,
        "INSERT INTO entries (session_id, id, parent_id, kind, seq, ts, payload, lease_epoch, "
        "written_at) VALUES (?, 'forged-cut', ?, 'compaction', ?, now(), ?, NULL, now())",
        [sid, leaf, seq, payload],
    )
    changed(
        con,
        "UPDATE sessions SET leaf_id = 'forged-cut', next_seq = next_seq + 1, "
        "entry_count = entry_count + 1 WHERE id = ?",
        [sid],
    )


def _call_result_lost(con: duckdb.DuckDBPyConnection) -> None:
    """A toolResult of an ended turn now answers another call: its call is unpaired."""
    changed(
        con,
        "UPDATE entries SET payload = json_merge_patch(payload, "
        '\'{"message": {"toolCallId": "ghost"}}\') WHERE id = (SELECT min(id) FROM entries '
        "WHERE kind = 'message' AND json_extract_string(payload, '$.message.role') = 'toolResult')",
    )


def _call_lapsed(con: duckdb.DuckDBPyConnection) -> None:
    """A user message slipped between a tool call and its result (issue 17 item 2:
    the write paths refuse it; stored around them, the audit flags it)."""
    row = con.execute(
        "SELECT r.session_id, r.id, r.parent_id FROM entries r WHERE r.kind = 'message' "
        "AND json_extract_string(r.payload, '$.message.role') = 'toolResult' "
        "ORDER BY r.session_id, r.seq LIMIT 1"
    ).fetchone()
    assert row is not None
    sid, result_id, parent = row
    seq = con.execute("SELECT next_seq FROM sessions WHERE id = ?", [sid]).fetchone()
    assert seq is not None
    user = json.dumps({"message": {"role": "user", "content": "meanwhile"}})
    con.execute(
        "INSERT INTO entries (session_id, id, parent_id, kind, seq, ts, payload, lease_epoch, "
        "written_at) VALUES (?, 'forged-user', ?, 'message', ?, now(), ?, NULL, now())",
        [sid, parent, seq[0], user],
    )
    con.execute(
        "UPDATE sessions SET next_seq = next_seq + 1, entry_count = entry_count + 1 WHERE id = ?",
        [sid],
    )
    con.execute(
        "UPDATE entries SET parent_id = 'forged-user' WHERE session_id = ? AND id = ?",
        [sid, result_id],
    )


def _session_half_deleted(con: duckdb.DuckDBPyConnection) -> None:
    """A session row deleted around the store: its entries, runs … outlive it."""
    sid = con.execute("SELECT min(session_id) FROM runs").fetchone()
    assert sid is not None and sid[0] is not None
    for table in ("entries", "run_events", "conversation_turns"):  # what the other checks read
        con.execute(f"DELETE FROM {table} WHERE session_id = ?", [sid[0]])
    changed(con, "DELETE FROM sessions WHERE id = ?", [sid[0]])


def _binding_without_row(con: duckdb.DuckDBPyConnection) -> None:
    """A session row naming a channel that no binding gives it, written around the store."""
    changed(
        con,
        "UPDATE sessions SET channel_type = 'chat', channel_id = 'room' "
        "WHERE id = (SELECT min(id) FROM sessions)",
    )


def _intent_deleted(con: duckdb.DuckDBPyConnection) -> None:
    """A delivery intent deleted around the store: its operations outlive it."""
    changed(
        con,
        "DELETE FROM delivery_intents WHERE id = (SELECT min(intent_id) FROM delivery_operations)",
    )


CORRUPTIONS: dict[str, tuple[Callable[[duckdb.DuckDBPyConnection], None], str | set[str]]] = {
    "never_granted_epoch": (_never_granted_epoch, "no_entry_under_lost_lease"),
    "duplicate_active_record": (_duplicate_active_record, "one_active_record_per_key"),
    "missing_parent": (_missing_parent, "session_trees_well_formed"),
    "epoch_gap": (_epoch_gap, "epochs_strictly_increasing"),
    "write_after_takeover": (_write_after_takeover, "no_entry_under_lost_lease"),
    "second_active_run": (_second_active_run, "one_active_run_per_session"),
    "revived_run": (_revived_run, "no_run_revived"),
    "delivered_twice": (_delivered_twice, "delivered_at_most_once"),
    "tool_record_stuck": (_tool_record_stuck, "tool_calls_paired"),
    "call_result_lost": (_call_result_lost, {"tool_calls_paired", "tool_results_in_context"}),
    "cut_splits_a_pair": (_cut_splits_a_pair, "tool_results_in_context"),
    "call_lapsed": (_call_lapsed, {"tool_calls_paired", "tool_results_in_context"}),
    "session_half_deleted": (_session_half_deleted, "no_orphan_rows"),
    "intent_deleted": (_intent_deleted, "no_orphan_rows"),
    "binding_without_row": (_binding_without_row, "bindings_agree"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_audit_reports_each_corruption(demo: DemoRun, tmp_path: Path, corruption: str) -> None:
    corrupt, failing = CORRUPTIONS[corruption]
    db = demo.copy(tmp_path)
    clean = run("audit", "--db", str(db), "--json")
    assert clean.exit_code == 0, clean.output
    con = duckdb.connect(str(db))
    try:
        corrupt(con)
    finally:
        con.close()
    result = run("audit", "--db", str(db), "--json")
    assert result.exit_code == 1, result.output
    out = json.loads(result.stdout)
    assert out["audit_passed"] is False
    failed = {c["name"] for c in out["audit"] if not c["passed"]}
    expected = {failing} if isinstance(failing, str) else failing
    assert failed == expected
    text = run("audit", "--db", str(db))
    assert text.exit_code == 1
    assert all(f"FAIL {name}" in text.stdout for name in expected)


def test_a_corruption_that_changes_nothing_fails_instead_of_passing(
    demo: DemoRun, tmp_path: Path
) -> None:
    """CI, loaded machine: the demo had no completed tool record of an ended run,
    ``tool_record_stuck``'s UPDATE changed no row and the audit had nothing to
    find. Such a forge now fails at once, saying it changed nothing."""
    db = demo.copy(tmp_path)
    con = duckdb.connect(str(db))
    try:
        con.execute("DELETE FROM tool_executions")  # what that demo had: no record to break
        with pytest.raises(AssertionError, match="UPDATE tool_executions"):
            _tool_record_stuck(con)
    finally:
        con.close()


def test_demo_exits_nonzero_when_stored_data_breaks_an_invariant(
    demo: DemoRun, tmp_path: Path
) -> None:
    db = demo.copy(tmp_path)
    con = duckdb.connect(str(db))
    try:
        _never_granted_epoch(con)
        _duplicate_active_record(con)
    finally:
        con.close()
    # Same seed: the demo reuses sessions demo-1-*, and audits them with the new run.
    result = run(
        "demo",
        "--db",
        str(db),
        "--duration",
        "0.5",
        "--workers",
        "2",
        "--sessions",
        "4",
        "--seed",
        "1",
        "--json",
    )
    assert result.exit_code == 1, result.output
    figures = json.loads(result.stdout)
    assert figures["audit_passed"] is False
    checks = checks_by_name(figures)
    assert not checks["no_entry_under_lost_lease"]["passed"]
    assert "demo-1-0/forged01" in checks["no_entry_under_lost_lease"]["detail"]
    assert not checks["one_active_record_per_key"]["passed"]
    table = run(
        "demo",
        "--db",
        str(db),
        "--duration",
        "0.2",
        "--workers",
        "1",
        "--sessions",
        "4",
        "--seed",
        "1",
    )
    assert table.exit_code == 1
    assert "FAIL" in table.stdout


def test_tree_problems_finds_cycles_gaps_and_bad_counts() -> None:
    good = [("a", None, 1), ("b", "a", 2), ("c", "b", 3), ("d", "b", 4)]
    assert tree_problems(good, "c", 4, 5) == []
    assert any("cycle" in p for p in tree_problems([("a", "b", 1), ("b", "a", 2)], "a", 2, 3))
    assert tree_problems([("a", None, 1), ("b", "a", 3)], "b", 2, 3) == ["seq is not 1..n"]
    assert tree_problems(good, "zz", 4, 5) == ["leaf zz missing"]
    assert tree_problems(good, "c", 3, 5) == ["counts 3/5 for 4 entries"]
    assert tree_problems([("a", "a", 1)], "a", 1, 2) == ["cycle through a"]


# -- report ------------------------------------------------------------------------------


def test_report_json_has_real_counts_and_writes_parquet(demo: DemoRun, tmp_path: Path) -> None:
    out_dir = tmp_path / "pq"
    result = run("report", "--db", str(demo.db), "--json", "--parquet", str(out_dir))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    con = duckdb.connect(str(demo.db), read_only=True)
    try:
        counts = {
            t: (con.execute(f"SELECT count(*) FROM {t}").fetchone() or [0])[0]
            for t in {*data["parquet"], "sessions", "entries", "fence_events", "thread_records"}
        }
        keys = (con.execute("SELECT count(DISTINCT key) FROM thread_records").fetchone() or [0])[0]
    finally:
        con.close()
    assert data["sessions"]["sessions"] == 4
    assert data["sessions"]["entries"] == counts["entries"] > 0
    kinds = {r["kind"]: r["entries"] for r in data["entries_by_kind"]}
    assert kinds["message"] > 0 and kinds["session_info"] == 4
    assert sum(kinds.values()) == counts["entries"]
    turns = data["turns_per_session"]
    assert turns["max"] > 0 and turns["min"] <= turns["avg"] <= turns["max"]
    providers = {(r["provider"], r["model"]) for r in data["models"] if r["source"] == "assistant"}
    assert providers and providers <= set(MODELS)
    timeline = data["timeline"]
    assert timeline["bucket"] == "second"
    assert sum(r["fenced_writes"] for r in timeline["rows"]) == counts["fence_events"]
    assert sum(r["takeovers"] for r in timeline["rows"]) == demo.figures["takeovers"]
    statuses = {r["status"]: r["records"] for r in data["thread_records"]}
    assert statuses["active"] == keys >= 1  # one active record per key that has any
    assert sum(statuses.values()) == counts["thread_records"]
    for table, info in data["parquet"].items():
        assert pq.read_table(info["path"]).num_rows == counts[table] == info["rows"]


def test_report_tables(demo: DemoRun) -> None:
    result = run("report", "--db", str(demo.db))
    assert result.exit_code == 0, result.output
    for text in ("Overview", "Entries by kind", "Models used", "per second", "message"):
        assert text in result.stdout


# -- sessions ------------------------------------------------------------------------------


def test_sessions_list_pages_with_the_cursor(
    demo: DemoRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run("sessions", "--db", str(demo.db), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["total"] == 4
    assert sorted(s["id"] for s in data["sessions"]) == [f"demo-1-{n}" for n in range(4)]
    monkeypatch.setattr(sessions_view, "PAGE_SIZE", 1)
    paged = json.loads(
        run("sessions", "list", "--db", str(demo.db), "--limit", "3", "--json").stdout
    )
    assert [s["id"] for s in paged["sessions"]] == [s["id"] for s in data["sessions"]][:3]
    found = json.loads(
        run("sessions", "--db", str(demo.db), "--search", "demo-1-2", "--json").stdout
    )
    assert [s["id"] for s in found["sessions"]] == ["demo-1-2"] and found["total"] == 1
    table = run("sessions", "--db", str(demo.db))
    assert table.exit_code == 0 and "demo-1-3" in table.stdout and "Demo session" in table.stdout


def test_sessions_show_prints_the_tree(demo: DemoRun) -> None:
    con = duckdb.connect(str(demo.db), read_only=True)
    try:  # a session where some run succeeded (it has both roles)
        row = con.execute("SELECT min(session_id) FROM runs WHERE status = 'succeeded'").fetchone()
    finally:
        con.close()
    assert row is not None and row[0] is not None
    sid = str(row[0])
    result = run("sessions", "show", sid, "--db", str(demo.db))
    assert result.exit_code == 0, result.output
    assert f"session {sid}" in result.stdout
    assert "◀ leaf" in result.stdout
    assert "user:" in result.stdout and "assistant:" in result.stdout


def test_sessions_show_marks_branches_and_labels(tmp_path: Path) -> None:
    db = str(tmp_path / "tree.duckdb")
    with turnkeeper.open_store(db) as store:
        store.sessions.create("s1", cwd="/w")

        def msg(role: str, text: str) -> dict[str, Any]:
            return {"message": {"role": role, "content": [{"type": "text", "text": text}]}}

        first = store.sessions.append("s1", "message", msg("user", "first question"))
        store.sessions.append("s1", "message", msg("assistant", "old answer"))
        store.sessions.branch("s1", first.id)
        new = store.sessions.append("s1", "message", msg("assistant", "new answer"))
        store.sessions.set_label("s1", first.id, "checkpoint")
        store.sessions.set_title("s1", "Branchy")
    result = run("sessions", "--db", db, "show", "s1")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "branch 1/2" in out and "branch 2/2" in out and "(current)" in out
    assert "[checkpoint]" in out and "old answer" in out and "Branchy" in out
    assert new.id[:8] in out


def test_sessions_show_unknown_id_is_one_line_exit_2(demo: DemoRun) -> None:
    result = run("sessions", "show", "no-such-session", "--db", str(demo.db))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "SessionNotFoundError" in result.stderr


def test_read_commands_refuse_a_missing_database(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.duckdb")
    for args in (["report"], ["sessions"], ["audit"], ["sessions", "show", "x"]):
        result = run(*args, "--db", missing)
        assert result.exit_code == 2, args
        assert "StoreNotFoundError" in result.stderr and missing in result.stderr
    assert not Path(missing).exists()


def test_locked_database_is_one_line_exit_2(tmp_path: Path) -> None:
    db = str(tmp_path / "locked.duckdb")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, turnkeeper
            store = turnkeeper.open_store({db!r})
            print("ready", flush=True)
            sys.stdin.read()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        proc = subprocess.run(
            [sys.executable, "-m", "turnkeeper.cli.main", "sessions", "--db", db],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("turnkeeper: StoreLockedError:")
    assert "Traceback" not in proc.stderr


# -- import / export (thin wrappers over turnkeeper.formats.pi) ------------------------------


def write_jsonl(path: Path, records: list[Any], glue_last: bool = False) -> Path:
    lines = [json.dumps(r) for r in records]
    if glue_last:
        lines[-2:] = [lines[-2] + lines[-1]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def pi_file(path: Path, sid: str, glue_last: bool = False) -> Path:
    header = {"type": "session", "version": 3, "id": sid, "timestamp": "2026-01-01T00:00:00.000Z"}
    msgs = [
        {
            "type": "message",
            "id": f"e{i}",
            "parentId": f"e{i - 1}" if i else None,
            "timestamp": f"2026-01-01T00:00:0{i}.000Z",
            "message": {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"},
        }
        for i in range(3)
    ]
    return write_jsonl(path, [header, *msgs], glue_last)


def test_import_reports_each_file_and_continues_after_a_bad_one(tmp_path: Path) -> None:
    one = pi_file(tmp_path / "one.jsonl", "sess-one", glue_last=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "message"}\n', encoding="utf-8")
    two = pi_file(tmp_path / "two.jsonl", "sess-two")
    db = str(tmp_path / "i.duckdb")
    result = run("import", str(one), str(bad), str(two), "--db", db)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert "session sess-one v3: added 3, skipped 0" in lines[0]
    assert "sess-two" in lines[1]
    assert f"{one}:3: repaired:" in result.stderr
    assert f"{bad}: error: SessionFormatUnknownError" in result.stderr  # no format knows it
    again = run("import", str(one), "--db", db, "--json")
    assert again.exit_code == 0
    data = json.loads(again.stdout)
    assert data["failed"] == [] and data["files"][0]["session_id"] == "sess-one"
    assert (data["files"][0]["created"], data["files"][0]["added"]) == (False, 0)


def test_an_import_that_breaks_the_tool_call_pairing_fails_that_file_only(tmp_path: Path) -> None:
    """A file whose transcript a provider would reject (a user message between a
    tool call and its result) is refused whole, on stderr; the others go in."""
    header = {
        "type": "session",
        "version": 3,
        "id": "sess-bad",
        "timestamp": "2026-01-01T00:00:00Z",
        "cwd": "/w",
    }
    call = {"type": "toolCall", "id": "c1", "name": "ls", "arguments": {}}
    rows = [
        ("a", None, {"role": "assistant", "content": [call], "stopReason": "toolUse"}),
        ("u", "a", {"role": "user", "content": "meanwhile"}),
        ("r", "u", {"role": "toolResult", "toolCallId": "c1", "toolName": "ls", "content": []}),
    ]
    entries = [
        {
            "type": "message",
            "id": i,
            "parentId": parent,
            "timestamp": "2026-01-01T00:00:01Z",
            "message": m,
        }
        for i, parent, m in rows
    ]
    bad = write_jsonl(tmp_path / "bad.jsonl", [header, *entries], False)
    good = pi_file(tmp_path / "good.jsonl", "sess-good")
    db = str(tmp_path / "i.duckdb")
    result = run("import", str(bad), str(good), "--db", db)
    assert result.exit_code == 1
    assert f"{bad}: error: ToolCallsUnansweredError" in result.stderr
    assert "'c1'" in result.stderr
    assert "sess-good" in result.stdout and "sess-bad" not in result.stdout


def test_export_to_stdout_and_file(tmp_path: Path) -> None:
    db = str(tmp_path / "e.duckdb")
    assert run("import", str(pi_file(tmp_path / "s.jsonl", "s-exp")), "--db", db).exit_code == 0
    out = run("export", "s-exp", "--db", db)
    assert out.exit_code == 0
    assert [json.loads(line)["type"] for line in out.stdout.splitlines()] == [
        "session",
        "message",
        "message",
        "message",
    ]
    target = tmp_path / "out.jsonl"
    assert run("export", "s-exp", "--db", db, "-o", str(target)).exit_code == 0
    assert target.read_text().splitlines() == out.stdout.splitlines()
    missing = run("export", "nope", "--db", db)
    assert missing.exit_code == 2 and "SessionNotFoundError" in missing.stderr


def test_import_export_round_trip_with_the_real_format(tmp_path: Path) -> None:
    src = tmp_path / "s.jsonl"
    lines = [
        {
            "type": "session",
            "version": 3,
            "id": "rt-1",
            "timestamp": "2026-01-01T00:00:00.000Z",
            "cwd": "/w",
        },
        {
            "type": "message",
            "id": "a1",
            "parentId": None,
            "timestamp": "2026-01-01T00:00:01.000Z",
            "message": {
                "role": "user",
                "content": [{"type": "text", "text": "hi"}],
                "timestamp": 1767225601000,
            },
        },
        {
            "type": "message",
            "id": "a2",
            "parentId": "a1",
            "timestamp": "2026-01-01T00:00:02.000Z",
            "message": {
                "role": "assistant",
                "content": [{"type": "text", "text": "hello"}],
                "provider": "p",
                "model": "m",
                "timestamp": 1767225602000,
            },
        },
    ]
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    db = str(tmp_path / "rt.duckdb")
    result = run("import", str(src), "--db", db)
    assert result.exit_code == 0, result.output
    assert "rt-1" in result.stdout and "added 2" in result.stdout
    exported = run("export", "rt-1", "--db", db)
    assert exported.exit_code == 0, exported.output
    assert [json.loads(x)["id"] for x in exported.stdout.splitlines()] == ["rt-1", "a1", "a2"]


def test_audit_flags_a_refused_write_that_is_stored(demo: DemoRun, tmp_path: Path) -> None:
    from turnkeeper.storage.audit import run_audit

    db = demo.copy(tmp_path)
    sessions = [f"demo-1-{n}" for n in range(4)]
    with turnkeeper.open_store(str(db)) as store:
        stored = (
            store.query(
                "SELECT regexp_extract(json_extract_string(payload, '$.message.content[0].text'), "
                "'^\\[([^\\]]+)\\]', 1) AS m FROM entries WHERE kind = 'message' AND "
                "session_id = 'demo-1-1' LIMIT 1"
            )
            .column("m")[0]
            .as_py()
        )
        record = store.threads.resolve(key="demo-1-1")
        assert stored and record is not None
        clean = run_audit(
            store, sessions, refused_markers=["never-written"], refused_records=["never-finalized"]
        )
        assert all(c.passed for c in clean)
        checks = run_audit(store, sessions, refused_markers=[stored], refused_records=[record.id])
    bad = {c.name: c for c in checks if not c.passed}
    assert set(bad) == {"refused_writes_absent"}
    assert bad["refused_writes_absent"].violations == 2


def test_demo_audit_catches_a_store_without_its_fence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Patch the lease fence out of the store: stalled workers' late writes now commit,
    and the demo's audit must say so."""
    from turnkeeper.cli.demo import run_fleet
    from turnkeeper.storage.ops import leases

    # the fence's clock reading is still returned: the ledger stamps its records with it
    monkeypatch.setattr(leases, "fence", lambda tx, lease: tx.clock_after_locks(None))
    monkeypatch.setattr(leases, "fenced", lambda tx, lease, part: tx.clock_after_locks(None))
    cfg = FleetConfig(
        workers=3, sessions=3, duration_s=2.0, seed=11, ttl_s=0.3, stall_p=0.5, min_turns=6
    )
    with turnkeeper.open_store(str(tmp_path / "nofence.duckdb")) as store:
        figures = run_fleet(store, cfg, None)
    assert figures["stalls"] > 0
    assert figures["audit_passed"] is False
    failed = {c["name"] for c in figures["audit"] if not c["passed"]}
    assert {"stale_writes_refused", "no_entry_under_lost_lease"} <= failed


def test_audit_fails_when_a_grant_is_stamped_before_the_prior_epoch(
    demo: DemoRun, tmp_path: Path
) -> None:
    db = demo.copy(tmp_path)
    con = duckdb.connect(str(db))
    try:  # the newest grant of demo-1-0, restamped an hour early
        changed(
            con,
            "UPDATE lease_events SET occurred_at = occurred_at - INTERVAL 1 HOUR "
            "WHERE target = 'session:demo-1-0' AND edge IN ('regrant', 'takeover') "
            "AND epoch = (SELECT max(epoch) FROM lease_events WHERE target = 'session:demo-1-0')",
        )
    finally:
        con.close()
    result = run("audit", "--db", str(db), "--json")
    assert result.exit_code == 1
    failed = {c["name"] for c in json.loads(result.stdout)["audit"] if not c["passed"]}
    assert failed == {"grants_follow_prior_epoch"}


# -- bad arguments, OS errors, interrupts, the demo's own database -----------------------------


def one_line_error(result: Result, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr


def test_os_errors_are_one_line_exit_2(demo: DemoRun, tmp_path: Path) -> None:
    db = str(demo.copy(tmp_path))
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    err = one_line_error(run("report", "--db", db, "--parquet", str(a_file / "sub")))
    assert err.startswith("turnkeeper: error: NotADirectoryError:") and str(a_file) in err
    if Path("/proc").is_dir() and not Path("/proc/nope").exists():
        err = one_line_error(run("report", "--db", db, "--parquet", "/proc/nope"))
        assert "/proc/nope" in err
    err = one_line_error(run("export", "demo-1-0", "--db", db, "-o", str(a_file / "x.jsonl")))
    assert err.startswith("turnkeeper: error: cannot write")


BAD_SECONDS = ["nan", "NaN", "inf", "-inf", "1e400", "0", "0.0", "-1", "abc"]


@pytest.mark.parametrize("value", BAD_SECONDS)
@pytest.mark.parametrize("option", ["--ttl", "--duration"])
def test_demo_refuses_non_finite_or_non_positive_seconds(
    tmp_path: Path, option: str, value: str
) -> None:
    db = tmp_path / "never.duckdb"
    # A short duration, so a wrongly accepted value still ends quickly.
    args = ["demo", "--db", str(db), "--duration", "0.2", "--workers", "1", "--sessions", "1"]
    result = run(*args, option, value, "--json")
    assert result.exit_code == 2, result.output
    assert "Invalid value for" in result.stderr and option in result.stderr
    assert not db.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--ttl", "3601"), ("--duration", "1e300"), ("--workers", "0"), ("--workers", "-2"),
     ("--workers", "1.5"), ("--sessions", "0"), ("--sessions", "nan")],
)  # fmt: skip
def test_demo_refuses_out_of_range_numbers(tmp_path: Path, option: str, value: str) -> None:
    db = tmp_path / "never.duckdb"
    result = run("demo", "--db", str(db), "--duration", "0.2", option, value, "--json")
    assert result.exit_code == 2, result.output
    assert "Invalid value for" in result.stderr and option in result.stderr
    assert not db.exists()


def test_interrupt_is_one_line_exit_130(demo: DemoRun, monkeypatch: pytest.MonkeyPatch) -> None:
    from turnkeeper.cli import report

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "collect", interrupted)
    result = run("report", "--db", str(demo.db))
    assert one_line_error(result, 130) == "turnkeeper: interrupted\n"


def _read_pty(fd: int, until: Callable[[str], bool], guard_s: float = 300.0) -> str:
    """Read what a process writes to the terminal ``fd`` until ``until(text so
    far)`` holds or the terminal closes (a hang guard fails the test)."""
    import select

    text = ""
    give_up = time.monotonic() + guard_s
    while not until(text):
        assert time.monotonic() < give_up, f"hang guard: {text[-2000:]!r}"
        if not select.select([fd], [], [], 1.0)[0]:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other end closed
            return text
        if not chunk:
            return text
        text += chunk.decode(errors="replace")
    return text


@pytest.mark.slow
def test_ctrl_c_stops_a_running_demo_with_exit_130(tmp_path: Path) -> None:
    """The interrupt lands while the fleet runs: the demo runs in a terminal,
    whose progress bar says a turn was committed (it used to be sent a second
    after the database file appeared, which on a loaded machine can be before
    the fleet began)."""
    import pty
    import re

    db = tmp_path / "interrupted.duckdb"
    args = ["demo", "--db", str(db), "--duration", "120", "--workers", "4", "--sessions", "4"]
    screen, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnkeeper.cli.main", *args],
        stdout=terminal,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(terminal)
    try:
        shown = _read_pty(screen, lambda text: re.search(r"[1-9][0-9]* turns", text) is not None)
        assert proc.poll() is None, shown[-2000:]
        proc.send_signal(signal.SIGINT)
        shown += _read_pty(screen, lambda text: False)  # to the end: the terminal closes
        err = proc.stderr.read() if proc.stderr else ""
        proc.wait(60)
    finally:
        os.close(screen)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.endswith("turnkeeper: interrupted\n") and "Traceback" not in err, err
    assert "runs succeeded" not in shown and "audit:" not in shown  # no figures printed


def test_demo_defaults_to_its_own_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from turnkeeper.cli.demo import DEMO_DB

    assert DEMO_DB == "turnkeeper-demo.duckdb" != turnkeeper.DEFAULT_PATH
    monkeypatch.chdir(tmp_path)
    result = run("demo", "--duration", "0.5", "--workers", "1", "--sessions", "1", "--seed", "2")
    assert result.exit_code == 0, result.output
    used = tmp_path / DEMO_DB
    assert used.exists() and not (tmp_path / turnkeeper.DEFAULT_PATH).exists()
    assert f"database: {used} " in result.stdout
    as_json = run(
        "demo", "--duration", "0.2", "--workers", "1", "--sessions", "1", "--seed", "2", "--json"
    )
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["db"] == str(used)
    assert not (tmp_path / turnkeeper.DEFAULT_PATH).exists()
    report = run("report", "--db", DEMO_DB, "--json")
    assert report.exit_code == 0 and json.loads(report.stdout)["sessions"]["sessions"] == 1


def test_read_commands_open_the_store_read_only(demo: DemoRun, tmp_path: Path) -> None:
    """report, sessions, audit and export share a file another reader holds open, and
    never migrate (a blank DuckDB file stays blank)."""
    db = str(demo.copy(tmp_path))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, turnkeeper
            store = turnkeeper.open_store({db!r}, read_only=True)
            print("ready", flush=True)
            sys.stdin.read()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        for args in (
            ["report", "--json"],
            ["sessions", "--json"],
            ["audit"],
            ["export", "demo-1-0"],
            ["sessions", "show", "demo-1-0"],
        ):
            proc = subprocess.run(
                [sys.executable, "-m", "turnkeeper.cli.main", *args, "--db", db],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 0, (args, proc.stderr)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)

    blank = tmp_path / "blank.duckdb"
    duckdb.connect(str(blank)).close()
    err = one_line_error(run("report", "--db", str(blank)))
    assert err.startswith("turnkeeper: SchemaVersionError:")
    con = duckdb.connect(str(blank), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)
    finally:
        con.close()


# -- report: run history, SQL views, Parquet of runs and deliveries -------------------------


RUN_HISTORY_VIEWS = {
    "run_history",
    "intent_attempts",
    "recovery_times",
    "delivery_outcomes",
    "delivery_intent_outcomes",
    "failure_reasons",
    "tool_outcomes",
}


def _sql_script_parts(script: str) -> tuple[dict[str, str], dict[str, str]]:
    """``report --sql`` split into ``({view: CREATE statement}, {figure: SELECT})``."""
    import re

    views: dict[str, str] = {}
    figures: dict[str, str] = {}
    for chunk in script.split(";\n"):
        view = re.search(r"^CREATE OR REPLACE TEMP VIEW (\w+) AS$", chunk, re.M)
        figure = re.search(r"^-- figure (\w+): ", chunk, re.M)
        if view:
            views[view.group(1)] = chunk
        elif figure:
            figures[figure.group(1)] = chunk
        else:
            assert not chunk.strip() or chunk.lstrip().startswith("--"), chunk
    return views, figures


def _figures_through_views(db: Path, script: str) -> dict[str, Any]:
    """Run the printed views and figure queries on a fresh read-only connection."""
    views, figures = _sql_script_parts(script)
    con = duckdb.connect(str(db), read_only=True)  # TEMP views need no write access
    try:
        for statement in views.values():
            con.execute(statement)
        out = {}
        for name, statement in figures.items():
            out[name] = json.loads(
                json.dumps(con.sql(statement).to_arrow_table().to_pylist(), default=str)
            )
    finally:
        con.close()
    return out


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (DuckDB ``quantile_cont``)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _assert_seconds(figure: dict[str, Any], values: list[float]) -> None:
    assert figure["recoveries"] == len(values)
    if not values:
        assert [figure[k] for k in ("min_s", "median_s", "p95_s", "max_s")] == [None] * 4
        return
    expected = {
        "min_s": min(values),
        "median_s": _quantile(values, 0.5),
        "p95_s": _quantile(values, 0.95),
        "max_s": max(values),
    }
    for key, value in expected.items():
        assert figure[key] == pytest.approx(value, abs=1e-3), key


def _recovery_seconds(con: duckdb.DuckDBPyConnection) -> dict[str, list[float]]:
    """Time to recovery, pickup and time since the last update, computed in Python
    from raw rows: orphaned when the run's admitting lease ended (its release, else
    its last expiry), or at admission without one."""
    ends: dict[tuple[str, int], Any] = {}
    released: dict[tuple[str, int], Any] = {}
    for target, epoch, edge, expires_at in con.execute(
        "SELECT target, epoch, edge, expires_at FROM lease_events"
    ).fetchall():
        key = (target, epoch)
        ends[key] = max(ends.get(key, expires_at), expires_at)
        if edge == "release":
            released[key] = expires_at
    updates: dict[str, Any] = {}
    for run_id, occurred_at in con.execute(
        "SELECT run_id, occurred_at FROM run_events "
        "WHERE dest IN ('admitted', 'running', 'waiting') AND edge <> 'decision'"
    ).fetchall():
        updates[run_id] = max(updates.get(run_id, occurred_at), occurred_at)
    out: dict[str, list[float]] = {"ttr": [], "pickup": [], "since_update": []}
    for run_id, state, began, completed, session, epoch, admitted in con.execute(
        "SELECT v.run_id, v.state, v.started_at, v.completed_at, r.session_id, r.lease_epoch, "
        "r.started_at FROM run_recoveries v JOIN runs r ON r.id = v.run_id"
    ).fetchall():
        key = (f"session:{session}", epoch)
        orphaned = released.get(key, ends.get(key, admitted))
        out["pickup"].append((began - orphaned).total_seconds())
        if state == "completed":
            out["ttr"].append((completed - orphaned).total_seconds())
            out["since_update"].append((completed - updates.get(run_id, admitted)).total_seconds())
    return out


def test_report_run_history_matches_direct_sql(demo: DemoRun, tmp_path: Path) -> None:
    db = demo.copy(tmp_path)
    result = run("report", "--db", str(db), "--json")
    assert result.exit_code == 0, result.output
    h = json.loads(result.stdout)["run_history"]
    con = duckdb.connect(str(db), read_only=True)
    try:

        def q(sql: str) -> list[Any]:
            return con.execute(sql).fetchall()

        by_attempt = {
            (s, a): n for s, a, n in q("SELECT status, attempt, count(*) FROM runs GROUP BY ALL")
        }
        assert {(r["status"], r["attempt"]): r["runs"] for r in h["runs_by_status_attempt"]} == (
            by_attempt
        )
        assert sum(by_attempt.values()) >= demo.figures["runs_admitted"] > 0
        intents = q(
            "SELECT max(r.attempt), arg_max(r.status, r.attempt) FROM execution_intents i "
            "LEFT JOIN runs r ON r.intent_id = i.id GROUP BY i.id"
        )
        assert h["retries"] == {
            "runs": sum(by_attempt.values()),
            "retry_runs": sum(n for (_, a), n in by_attempt.items() if a > 1),
            "intents": len(intents),
            "intents_retried": sum(1 for m, _ in intents if m > 1),
            "intents_retried_succeeded": sum(1 for m, s in intents if m > 1 and s == "succeeded"),
            "max_attempt": max(m for m, _ in intents),
        }

        states = dict(q("SELECT state, count(*) FROM run_recoveries GROUP BY state"))
        assert [(r["state"], r["recoveries"]) for r in h["recovery_states"]] == [
            (s, states.get(s, 0))
            for s in ("recovering", "completed", "failed", "dead_lettered", "detached")
        ]
        assert states["completed"] >= demo.figures["recoveries_converged"] > 0
        seconds = _recovery_seconds(con)
        _assert_seconds(h["time_to_recovery"], seconds["ttr"])
        _assert_seconds(h["recovery_pickup"], seconds["pickup"])
        _assert_seconds(h["recovery_since_update"], seconds["since_update"])
        # A recovery begins only once the run's lease has ended; the last update came first.
        assert h["recovery_pickup"]["min_s"] >= 0
        assert h["recovery_since_update"]["max_s"] >= h["time_to_recovery"]["max_s"]

        ops = dict(q("SELECT status, count(*) FROM delivery_operations GROUP BY status"))
        assert {r["status"]: r["operations"] for r in h["delivery_operations_by_status"]} == {
            s: ops.get(s, 0)
            for s in ("pending", "claimed", "in_progress", "delivered", "unsupported", "failed",
                      "uncertain")
        }  # fmt: skip
        assert ops["delivered"] > 0
        by_intent = dict(q("SELECT status, count(*) FROM delivery_intents GROUP BY status"))
        assert {r["status"]: r["intents"] for r in h["delivery_intents_by_status"]} == {
            s: by_intent.get(s, 0) for s in ("pending", "delivered", "failed", "uncertain")
        }
        [(n_ops, attempts, most)] = q(
            "SELECT count(*), sum(attempt_count)::BIGINT, max(attempt_count) "
            "FROM delivery_operations"
        )
        [(requeues, requeued)] = q(
            "SELECT count(*), count(DISTINCT operation_id) FROM delivery_events "
            "WHERE edge LIKE 'requeue\\_%' ESCAPE '\\'"
        )
        da = h["delivery_attempts"]
        assert (da["operations"], da["attempts"], da["max_attempts"]) == (n_ops, attempts, most)
        # two decimals: within half a hundredth (1.025 shows as 1.03), and a float's slack
        assert da["avg_attempts"] == pytest.approx(attempts / n_ops, abs=0.005 + 1e-9)
        assert (da["requeues"], da["operations_requeued"]) == (requeues, requeued)
        assert {r["attempts"]: r["operations"] for r in h["delivery_attempts_distribution"]} == (
            dict(q("SELECT attempt_count, count(*) FROM delivery_operations GROUP BY ALL"))
        )
        assert {
            (r["kind"], r["status"]): r["operations"] for r in h["delivery_outcomes_by_kind"]
        } == {
            (k, s): n
            for k, s, n in q("SELECT kind, status, count(*) FROM delivery_operations GROUP BY ALL")
        }

        reasons = {
            (r["source"], r["status"], r["reason"]): r["records"] for r in h["failure_reasons"]
        }
        expected = {
            ("run", s, e): n
            for s, e, n in q(
                "SELECT status, error, count(*) FROM runs WHERE error IS NOT NULL GROUP BY ALL"
            )
        }
        expected |= {
            ("recovery", s, e): n
            for s, e, n in q(
                "SELECT state, last_error, count(*) FROM run_recoveries "
                "WHERE last_error IS NOT NULL GROUP BY ALL"
            )
        }
        expected |= {
            ("delivery", s, c): n
            for s, c, n in q(
                "SELECT status, failure_code, count(*) FROM delivery_operations "
                "WHERE failure_code <> '' GROUP BY ALL"
            )
        }
        expected |= {
            ("tool", s, r): n
            for s, r, n in q(
                "SELECT state, reason, count(*) FROM tool_executions "
                "WHERE reason IS NOT NULL GROUP BY ALL"
            )
        }
        assert expected and reasons == expected  # the demo's failures all carry a reason
        assert ("run", "interrupted", "the worker lost its lease") in reasons

        tools = {
            (s, e): n
            for s, e, n in q(
                "SELECT state, side_effecting, count(*) FROM tool_executions GROUP BY ALL"
            )
        }
        assert [
            (r["state"], r["executions"], r["side_effecting"], r["read_only"])
            for r in h["tool_executions_by_state"]
        ] == [
            (s, tools.get((s, True), 0) + tools.get((s, False), 0), tools.get((s, True), 0),
             tools.get((s, False), 0))
            for s in ("running", "completed", "interrupted", "retry_requested", "abandoned")
        ]  # fmt: skip
    finally:
        con.close()


def test_report_sql_views_give_the_reports_numbers_on_a_read_only_open(
    demo: DemoRun, tmp_path: Path
) -> None:
    printed = run("report", "--sql", "--db", str(tmp_path / "not-read.duckdb"))
    assert printed.exit_code == 0, printed.output
    assert not (tmp_path / "not-read.duckdb").exists()
    views, figures = _sql_script_parts(printed.stdout)
    assert set(views) == RUN_HISTORY_VIEWS
    db = demo.copy(tmp_path)
    report = run("report", "--db", str(db), "--json")
    assert report.exit_code == 0, report.output
    expected = json.loads(report.stdout)["run_history"]
    assert set(figures) == set(expected)
    got = _figures_through_views(db, printed.stdout)
    for name, value in expected.items():
        assert (got[name][0] if isinstance(value, dict) else got[name]) == value, name
    con = duckdb.connect(str(db), read_only=True)
    try:  # TEMP views left nothing in the file; each view reads the stored rows
        assert con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone() == (
            0,
        )
        for statement in views.values():
            con.execute(statement)
        for view, table in (
            ("run_history", "runs"),
            ("intent_attempts", "execution_intents"),
            ("recovery_times", "run_recoveries"),
            ("delivery_outcomes", "delivery_operations"),
            ("delivery_intent_outcomes", "delivery_intents"),
            ("tool_outcomes", "tool_executions"),
        ):
            assert (
                con.execute(f"SELECT count(*) FROM {view}").fetchone()
                == con.execute(f"SELECT count(*) FROM {table}").fetchone()
            ), view
        columns = con.sql("SELECT * FROM delivery_intent_outcomes").columns
        assert "transport_context" not in columns
    finally:
        con.close()
    both = run("report", "--sql", "--json")
    assert both.exit_code == 2 and "--sql prints SQL only" in both.stderr


def test_report_parquet_writes_run_and_delivery_tables_without_transport_context(
    demo: DemoRun, tmp_path: Path
) -> None:
    from turnkeeper.cli.report import PARQUET_TABLES

    db = demo.copy(tmp_path)
    out = tmp_path / "pq"
    result = run("report", "--db", str(db), "--json", "--parquet", str(out))
    assert result.exit_code == 0, result.output
    written = json.loads(result.stdout)["parquet"]
    new = {
        "runs",
        "run_events",
        "run_recoveries",
        "recovery_events",
        "delivery_intents",
        "delivery_operations",
        "delivery_events",
        "tool_executions",
    }
    assert set(written) == set(PARQUET_TABLES) >= new
    con = duckdb.connect(str(db), read_only=True)
    try:
        contexts = [
            r[0] for r in con.execute("SELECT transport_context FROM delivery_intents").fetchall()
        ]
        assert contexts
        for table in PARQUET_TABLES:
            info = written[table]
            assert Path(info["path"]).name == f"{table}.parquet"
            assert Path(info["path"]).parent.samefile(out)
            data = pq.read_table(info["path"])
            count = con.execute(f"SELECT count(*) FROM {table}").fetchone()
            assert count is not None and data.num_rows == info["rows"] == count[0], table
            columns = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
            assert data.column_names == [c for c in columns if c != "transport_context"], table
            assert "transport_context" not in data.column_names
            for column in data.column_names:  # not smuggled under another name either
                values = data.column(column).to_pylist()
                assert not any(v in contexts for v in values if isinstance(v, str)), column
        for table in ("runs", "run_events", "delivery_intents", "delivery_operations"):
            assert written[table]["rows"] > 0, table
    finally:
        con.close()


def test_report_on_an_empty_database_is_zeros(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    turnkeeper.open_store(str(db)).close()
    result = run("report", "--db", str(db), "--json", "--parquet", str(tmp_path / "pq"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    h = data["run_history"]
    assert h["runs_by_status_attempt"] == [] and h["failure_reasons"] == []
    assert h["retries"] == {
        "runs": 0,
        "retry_runs": 0,
        "intents": 0,
        "intents_retried": 0,
        "intents_retried_succeeded": 0,
        "max_attempt": None,
    }
    for name in ("time_to_recovery", "recovery_pickup", "recovery_since_update"):
        _assert_seconds(h[name], [])
    assert {r["recoveries"] for r in h["recovery_states"]} == {0}
    assert len(h["recovery_states"]) == 5
    assert {r["operations"] for r in h["delivery_operations_by_status"]} == {0}
    assert h["delivery_attempts"] == {
        "operations": 0,
        "attempts": 0,
        "avg_attempts": None,
        "max_attempts": None,
        "requeues": 0,
        "operations_requeued": 0,
    }
    assert {r["executions"] for r in h["tool_executions_by_state"]} == {0}
    assert {info["rows"] for info in data["parquet"].values()} == {0}
    script = run("report", "--sql").stdout
    got = _figures_through_views(db, script)
    for name, value in h.items():
        assert (got[name][0] if isinstance(value, dict) else got[name]) == value, name
    table = run("report", "--db", str(db))
    assert table.exit_code == 0, table.output
    for text in ("Runs by status and attempt", "Recovery latency (seconds", "Failure reasons"):
        assert text in table.stdout


def test_report_recovery_latency_runs_from_the_end_of_the_runs_lease(tmp_path: Path) -> None:
    """A scripted history on an injected clock, with every recovery state, a retry, a
    requeued delivery and an interrupted tool: the figures are the hand-counted ones."""
    from turnkeeper import DeliveryPlan, DeliveryStep
    from turnkeeper.fuzz import FakeClock

    user = {"role": "user", "content": "go"}
    reply = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}
    clock = FakeClock()
    db = tmp_path / "scripted.duckdb"
    with turnkeeper.open_store(str(db), clock=clock) as store:

        def admit(sid: str, lease: Any = None, retry_of: str | None = None) -> Any:
            if store.sessions.get(sid) is None:
                store.sessions.create(sid)
            r = store.runs.admit(sid, {"q": sid}, user_message=user, lease=lease, retry_of=retry_of)
            store.runs.start(r.id, lease=lease)
            return r

        def recovery(sid: str) -> Any:
            return store.leases.acquire(f"session:{sid}", "rec", 60, purpose="recovery")

        # s1: the worker renews its lease to T+14 s, then is lost; recovered at T+27 s.
        store.sessions.create("s1")
        worker = store.leases.acquire("session:s1", "w", 10, purpose="execution")
        lost = admit("s1", worker)
        clock.advance(4)
        store.leases.renew(worker, 10)
        clock.advance(21)
        rec = recovery("s1")
        store.recovery.begin(lost.id, rec)  # pickup 11 s
        clock.advance(2)
        store.recovery.converge(lost.id, rec, error="worker crashed")  # 13 s; 27 s since update
        store.leases.release(rec)
        # Its retry succeeds; the reply's upload is requeued once, the message fails.
        retry = admit("s1", retry_of=lost.id)
        store.tools.claim(
            "k-edit", "s1", local_turn_id=retry.turn_id, provider_call_id="c1", tool_name="edit",
            side_effecting=True, run_id=retry.id,
        )  # fmt: skip
        store.tools.complete("k-edit", {"ok": True})
        plan = DeliveryPlan(
            "chat",
            "room",
            (
                DeliveryStep("upload", "attachment", artifact_id="a1", payload_digest="d1"),
                DeliveryStep("send", "message", depends_on="upload"),
            ),
            reply_message_id="m1",
            transport_context={"token": "secret"},
        )
        store.runs.finish(retry.id, "succeeded", assistant_message=reply, delivery_plan=plan)
        upload, send = f"{retry.id}:delivery:upload", f"{retry.id}:delivery:send"
        claim = store.outbox.claim(upload, "d", 5)
        store.outbox.requeue(upload, "d", claim.lease_epoch, failure_code="rate_limited")
        claim = store.outbox.claim(upload, "d", 5)
        store.outbox.finish(upload, "d", claim.lease_epoch, "delivered")
        claim = store.outbox.claim(send, "d", 5)
        store.outbox.finish(send, "d", claim.lease_epoch, "failed", failure_code="gone")
        # s2: the worker releases its lease 1 s in, with a read-only tool running.
        store.sessions.create("s2")
        worker = store.leases.acquire("session:s2", "w", 10, purpose="execution")
        released = admit("s2", worker)
        store.tools.claim(
            "k-read", "s2", local_turn_id=released.turn_id, provider_call_id="c2", tool_name="read",
            side_effecting=False, run_id=released.id, lease=worker,
        )  # fmt: skip
        clock.advance(1)
        store.leases.release(worker)
        clock.advance(4)
        rec = recovery("s2")
        store.recovery.begin(released.id, rec)  # pickup 4 s
        store.tools.interrupt("s2", reason="process lost", lease=rec)
        clock.advance(1)
        store.recovery.converge(released.id, rec)  # 5 s; 6 s since update
        store.leases.release(rec)
        # s3..s6: runs admitted without a lease, orphans from admission.
        for sid, wait_s in (("s3", 2), ("s4", 0), ("s5", 0), ("s6", 0)):
            orphan = admit(sid)
            clock.advance(wait_s)
            rec = recovery(sid)
            store.recovery.begin(orphan.id, rec)
            if sid == "s3":
                store.recovery.fail(orphan.id, rec, "boom", max_attempts=1)
            elif sid == "s4":
                store.archives.save_run(
                    turnkeeper.ResponseRun(
                        sid, "bg", "openai", "responses", "queued", orphan.id, response_id="r"
                    ),
                    lease=rec,
                )
                store.recovery.detach(orphan.id, rec)
            elif sid == "s5":
                store.recovery.fail(orphan.id, rec, "flaky", max_attempts=3)
    result = run("report", "--db", str(db), "--json")
    assert result.exit_code == 0, result.output
    h = json.loads(result.stdout)["run_history"]
    assert h["runs_by_status_attempt"] == [
        {"status": "running", "attempt": 1, "runs": 4},
        {"status": "succeeded", "attempt": 2, "runs": 1},
        {"status": "interrupted", "attempt": 1, "runs": 2},
    ]
    assert h["retries"] == {
        "runs": 7,
        "retry_runs": 1,
        "intents": 6,
        "intents_retried": 1,
        "intents_retried_succeeded": 1,
        "max_attempt": 2,
    }
    assert {r["state"]: r["recoveries"] for r in h["recovery_states"]} == {
        "recovering": 1,
        "completed": 2,
        "failed": 1,
        "dead_lettered": 1,
        "detached": 1,
    }
    seconds = ("recoveries", "min_s", "median_s", "p95_s", "max_s")
    assert [h["time_to_recovery"][k] for k in seconds] == [2, 5.0, 9.0, 12.6, 13.0]
    assert [h["recovery_pickup"][k] for k in seconds] == [6, 0.0, 1.0, 9.25, 11.0]
    assert [h["recovery_since_update"][k] for k in seconds] == [2, 6.0, 16.5, 25.95, 27.0]
    assert h["delivery_attempts"] == {
        "operations": 2,
        "attempts": 3,
        "avg_attempts": 1.5,
        "max_attempts": 2,
        "requeues": 1,
        "operations_requeued": 1,
    }
    assert h["delivery_attempts_distribution"] == [
        {"attempts": 1, "operations": 1},
        {"attempts": 2, "operations": 1},
    ]
    assert h["delivery_outcomes_by_kind"] == [
        {"kind": "attachment", "status": "delivered", "operations": 1},
        {"kind": "message", "status": "failed", "operations": 1},
    ]
    assert {r["status"]: r["intents"] for r in h["delivery_intents_by_status"]}["failed"] == 1
    assert {
        (r["source"], r["status"], r["reason"]): r["records"] for r in h["failure_reasons"]
    } == {
        ("run", "interrupted", "worker crashed"): 1,
        ("run", "interrupted", "(none recorded)"): 1,
        ("recovery", "dead_lettered", "boom"): 1,
        ("recovery", "failed", "flaky"): 1,
        ("delivery", "delivered", "rate_limited"): 1,
        ("delivery", "failed", "gone"): 1,
        ("tool", "interrupted", "process lost"): 1,
    }
    tools = {r["state"]: r for r in h["tool_executions_by_state"]}
    assert (tools["completed"]["side_effecting"], tools["completed"]["read_only"]) == (1, 0)
    assert (tools["interrupted"]["side_effecting"], tools["interrupted"]["read_only"]) == (0, 1)
    table = run("report", "--db", str(db))
    assert table.exit_code == 0, table.output
    for text in ("lease ended → recovered", "dead_lettered", "worker crashed", "12.600"):
        assert text in table.stdout


def test_report_gives_failure_rate_and_p95_duration_per_model_and_day(tmp_path: Path) -> None:
    """The SRE's figure: per model and UTC day, ended runs, the share that failed
    (failed, interrupted, abandoned) and the 95th-percentile duration."""
    from datetime import UTC, datetime, timedelta

    path = tmp_path / "models.duckdb"
    now = [datetime(2026, 3, 1, 12, 0, tzinfo=UTC)]
    with turnkeeper.open_store(str(path), clock=lambda: now[0]) as store:
        store.sessions.create("s")
        outcomes = [("m1", "succeeded", 10), ("m1", "failed", 20), ("m1", "succeeded", 30)]
        outcomes += [("m1", "interrupted", 40), ("m2", "cancelled", 5)]
        for model, status, seconds in outcomes:
            admitted = store.runs.admit("s", {"m": model, "t": seconds}, model=model, start=True)
            if status == "cancelled":
                store.runs.request_cancel(admitted.id)
            now[0] += timedelta(seconds=seconds)
            store.runs.finish(admitted.id, status)
        now[0] += timedelta(days=1)
        store.runs.admit("s", {"still": "running"}, model="m1", start=True)
    result = run("report", "--db", str(path), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["run_history"]["runs_by_model_day"]
    assert rows == [
        {"model": "m1", "day": "2026-03-01", "runs": 4, "failure_rate": 0.5, "p95_s": 38.5},
        {"model": "m2", "day": "2026-03-01", "runs": 1, "failure_rate": 0.0, "p95_s": 5.0},
    ]
    text = run("report", "--db", str(path))
    assert text.exit_code == 0 and "model and day" in text.output
