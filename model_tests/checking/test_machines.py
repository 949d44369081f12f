"""The machines, the store and the reports agree with the lifecycles in spec/."""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from turnkeeper import DeliveryPlan, DeliveryStep, FinalizeRequest, ResponseRun, ThreadRecord
from turnkeeper.machines import machine_for
from turnkeeper.spec import (
    DELIVERY,
    GRANTING_EDGES,
    LEASE,
    LIFECYCLES,
    RECOVERY,
    RUN,
    THREAD_RECORD,
    TOOL_EXECUTION,
)
from turnkeeper.spec.errors import InvalidTransitionError
from turnkeeper.spec.lease import acquire_decision
from turnkeeper.spec.thread_record import save_decision

ROOT = Path(__file__).resolve().parents[2]


def test_reports_are_fresh():
    sys.path.insert(0, str(ROOT / "reports"))
    try:
        import generate  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    stale = [
        p.name
        for p, text in generate.expected().items()
        if not p.exists() or p.read_text(encoding="utf-8") != text
    ]
    assert stale == [], f"stale reports (run `make reports`): {stale}"


@pytest.mark.parametrize("lifecycle", LIFECYCLES, ids=lambda lc: lc.name)
def test_transitions_library_agrees_with_every_edge(lifecycle):
    m = machine_for(lifecycle)
    for edge in lifecycle.edges:
        m.check_machine_agrees(edge)


@pytest.mark.parametrize("lifecycle", LIFECYCLES, ids=lambda lc: lc.name)
def test_machine_decision_equals_spec_over_every_fact_combination(lifecycle):
    """Bounded exhaustive check: all triggers x states x guard valuations."""
    m = machine_for(lifecycle)
    names = sorted(lifecycle.guards)
    for trigger, source in itertools.product(lifecycle.triggers, lifecycle.states):
        has_edges = any(e.trigger == trigger and e.source == source for e in lifecycle.edges)
        for values in itertools.product([False, True], repeat=len(names)):
            facts = dict(zip(names, values, strict=True))
            if not has_edges:
                with pytest.raises(InvalidTransitionError):
                    m.decide(trigger, source, facts)
                continue
            assert m.decide(trigger, source, facts) == lifecycle.select(trigger, source, facts)


def test_unknown_trigger_is_the_projects_error():
    with pytest.raises(InvalidTransitionError) as err:
        machine_for(LEASE).decide("explode", "held", {})
    assert (err.value.machine, err.value.trigger, err.value.source) == ("lease", "explode", "held")


def test_machine_is_built_once_per_process():
    assert machine_for(LEASE) is machine_for(LEASE)


def test_acquire_decision_matches_the_lease_machine_exhaustively():
    m = machine_for(LEASE)
    for source, exp, owner, purpose, token in itertools.product(LEASE.states, *[[False, True]] * 4):
        epoch = 0 if source == "absent" else 3
        outcome, after = acquire_decision(source, exp, owner, purpose, token, epoch)
        facts = {
            "expired": exp,
            "same_owner": owner,
            "same_purpose": purpose,
            "token_matches": token,
        }
        edge = m.decide("acquire", source, facts)
        if edge is None:
            assert outcome in ("busy", "purpose") and after == epoch
            assert (outcome == "purpose") == (owner and not purpose)
        else:
            assert outcome == edge.name
            assert after == (epoch + 1 if edge.name in GRANTING_EDGES else epoch)


def drive_every_edge(store, clock) -> None:
    a = store.leases.acquire("t", "a", 1)  # grant
    store.leases.acquire("t", "a", 1)  # reacquire
    store.leases.renew(a, 1)  # renew
    store.leases.release(a)  # release
    b = store.leases.acquire("t", "b", 1)  # regrant
    clock.advance(2)
    store.leases.acquire("t", "c", 1)  # takeover
    store.leases.release(b)  # stale: no transition
    store.sessions.create("bound")
    worker = store.leases.acquire("session:bound", "w", 60, purpose="execution")
    run = store.runs.admit("bound", {"n": 1}, lease=worker)
    store.leases.release(worker)
    recovery = store.leases.acquire("session:bound", "r", 60, purpose="recovery")
    store.leases.release(store.leases.bind_run(recovery, run.id))  # bind
    store.runs.finish(run.id, "abandoned")
    store.threads.finalize(FinalizeRequest(ThreadRecord("r1", "k"), rebind_active=True))  # create
    store.threads.finalize(FinalizeRequest(ThreadRecord("r1", "k")))  # update
    store.threads.finalize(
        FinalizeRequest(
            ThreadRecord("r2", "k"), previous_id="r1", archive_old=True, rebind_active=True
        )
    )  # archive


def drive_every_run_edge(store) -> None:
    user = {"role": "user", "content": "hi"}
    store.sessions.create("runs")
    last = None

    def admit():
        nonlocal last
        last = store.runs.admit("runs", {"n": 1}, user_message=user, retry_of=last and last.id)
        return last

    r = admit()  # admit
    store.runs.finish(r.id, "failed")  # fail_admitted
    r = admit()
    store.runs.request_cancel(r.id)
    store.runs.finish(r.id, "cancelled")  # cancel_admitted
    store.runs.finish(admit().id, "abandoned")  # abandon_admitted
    store.runs.finish(admit().id, "interrupted")  # interrupt_admitted
    for end, steps in [
        ("succeeded", ["start", "wait", "resume"]),  # start, wait, resume, succeed
        ("failed", ["start"]),
        ("interrupted", ["start"]),
        ("abandoned", ["start"]),
        ("failed", ["start", "wait"]),
        ("interrupted", ["start", "wait"]),
        ("abandoned", ["start", "wait"]),
    ]:
        r = admit()
        for step in steps:
            getattr(store.runs, step)(r.id)
        store.runs.finish(r.id, end)
    for steps in (["start"], ["start", "wait"]):
        r = admit()
        for step in steps:
            getattr(store.runs, step)(r.id)
        store.runs.request_cancel(r.id)
        store.runs.finish(r.id, "cancelled")


def drive_every_recovery_edge(store, clock) -> None:
    store.sessions.create("rec")

    def orphan():
        run = store.runs.admit("rec", {"n": 1})
        store.runs.start(run.id)
        return run

    def lease(ttl: float = 1.0):
        return store.leases.acquire("session:rec", "r", ttl, purpose="recovery")

    run = orphan()
    first = lease()
    store.recovery.begin(run.id, first)  # begin
    clock.advance(2)
    second = lease()
    store.recovery.begin(run.id, second)  # supersede
    store.recovery.fail(run.id, second, "x", base_delay_s=1, max_attempts=3)  # fail
    clock.advance(5)
    third = lease(10)
    store.recovery.begin(run.id, third)  # retry
    store.recovery.fail(run.id, third, "y", max_attempts=3)  # dead_letter
    store.leases.release(third)
    for end in ("converge", "detach"):
        sid = f"rec-{end}"
        store.sessions.create(sid)
        r = store.runs.admit(sid, {"n": 1})
        held = store.leases.acquire(f"session:{sid}", "r", 5, purpose="recovery")
        store.recovery.begin(r.id, held)
        remote = ResponseRun(sid, "bg", "openai", "responses", "queued", r.id, response_id="r")
        store.archives.save_run(remote, lease=held)
        getattr(store.recovery, end)(r.id, held)  # converge, detach
    # the detached run's remote run ends: a recovery begins anew
    store.leases.release(held)
    store.archives.save_run(replace(remote, state="completed"))
    again = store.leases.acquire("session:rec-detach", "r", 5, purpose="recovery")
    store.recovery.begin(r.id, again)  # reclaim


def drive_every_delivery_edge(store, clock) -> None:
    store.sessions.create("out")
    run = store.runs.admit("out", {"n": 1})
    steps = tuple(DeliveryStep(str(i), "message") for i in range(10))
    store.runs.finish(run.id, "failed", delivery_plan=DeliveryPlan("p", "t", steps))  # plan
    ops = [o.id for o in store.outbox.get_plan(f"{run.id}:delivery")[1]]
    results = ("delivered", "unsupported", "failed", "uncertain")
    for op, result in zip(ops[:4], results, strict=True):
        epoch = store.outbox.claim(op, "w", 5).lease_epoch  # claim
        store.outbox.finish(op, "w", epoch, result)  # <result>_claimed
    for op, result in zip(ops[4:8], results, strict=True):
        epoch = store.outbox.claim(op, "w", 5).lease_epoch
        store.outbox.update_progress(op, "w", epoch)  # progress_claimed
        store.outbox.update_progress(op, "w", epoch)  # progress_in_progress
        store.outbox.finish(op, "w", epoch, result)  # <result>_in_progress
    a, b = ops[8:]
    store.outbox.requeue(a, "w", store.outbox.claim(a, "w", 5).lease_epoch)  # requeue_claimed
    epoch = store.outbox.claim(b, "w", 5).lease_epoch
    store.outbox.update_progress(b, "w", epoch)
    store.outbox.requeue(b, "w", epoch)  # requeue_in_progress
    store.outbox.claim(a, "w", 1)
    store.outbox.update_progress(b, "w", store.outbox.claim(b, "w", 1).lease_epoch)
    clock.advance(2)
    store.outbox.claim(a, "v", 5)  # reclaim_claimed
    store.outbox.claim(b, "v", 5)  # reclaim_in_progress


def drive_every_tool_edge(store) -> None:
    store.sessions.create("tools")

    def claim(key: str, side_effecting: bool) -> None:  # claim
        store.tools.claim(
            key,
            "tools",
            local_turn_id="t",
            provider_call_id=key,
            tool_name="x",
            side_effecting=side_effecting,
        )

    claim("done", True)
    store.tools.complete("done", {})  # complete
    claim("ro-run", False)
    store.tools.reclaim("ro-run")  # reclaim_running
    for key, side_effecting in (("side", True), ("ro", False), ("rr", True)):
        claim(key, side_effecting)
    store.tools.interrupt("tools")  # interrupt
    store.tools.reclaim("ro")  # reclaim_interrupted
    store.tools.request_recovery("tools", "t", ["side", "rr"])  # request_retry
    store.tools.reclaim("side")  # reclaim_confirmed
    # abandon_interrupted (ro-run), abandon_running (side, ro), abandon_retry_requested (rr)
    store.tools.abandon_interrupted("tools", "t")


def test_transitions_the_store_accepts_equal_the_spec_edges(store, clock):
    drive_every_edge(store, clock)
    drive_every_run_edge(store)
    drive_every_recovery_edge(store, clock)
    drive_every_tool_edge(store)
    drive_every_delivery_edge(store, clock)
    for lifecycle, table, extra in [
        (LEASE, "lease_events", ""),
        (THREAD_RECORD, "thread_record_events", ""),
        (RUN, "run_events", " WHERE edge <> 'decision'"),  # resolutions, not transitions
        (RECOVERY, "recovery_events", ""),
        (TOOL_EXECUTION, "tool_execution_events", ""),
        (DELIVERY, "delivery_events", ""),
    ]:
        rows = store.query(
            f"SELECT DISTINCT edge, trigger, source, dest FROM {table}{extra}"
        ).to_pylist()
        seen = {(r["edge"], r["trigger"], r["source"], r["dest"]) for r in rows}
        spec = {(e.name, e.trigger, e.source, e.dest) for e in lifecycle.edges}
        assert seen == spec, (lifecycle.name, seen ^ spec)


@pytest.mark.parametrize("dialect", ["duck", "postgres"])
def test_check_constraints_list_exactly_the_spec_states(dialect):
    from turnkeeper.storage.migrations import load

    package = {"duck": None, "postgres": "turnkeeper.storage.postgres"}[dialect]
    by_version = dict(load(package))
    files = {p.name: int(p.name[:4]) for p in (ROOT / "storage" / "migrations").glob("*.sql")}
    for lifecycle, column, file in [
        (LEASE, "state", "0001_initial.sql"),
        (THREAD_RECORD, "status", "0001_initial.sql"),
        (RUN, "status", "0002_runs.sql"),
        (RECOVERY, "state", "0003_recovery.sql"),
        (TOOL_EXECUTION, "state", "0006_tool_executions.sql"),
        (DELIVERY, "status", "0005_delivery.sql"),
    ]:
        sql = by_version[files[file]]
        stored = set(lifecycle.states) - {lifecycle.initial}
        found = re.findall(rf"CHECK \({column} IN \(([^)]*)\)\)", sql, re.S)
        assert found, column
        assert {s.strip().strip("'") for s in found[-1].split(",")} == stored, lifecycle.name


def test_save_decision_never_revives_an_archived_record():
    for source, avail in itertools.product(THREAD_RECORD.states, [False, True]):
        out = save_decision(source, avail)
        assert (source == "archived") == (out == "revive")


LAYERS = {
    "spec": set(),
    "machines": {"spec"},
    "storage": {"spec", "machines"},
    # the fuzz machines run BY the CLI (``turnkeeper fuzz``): they may use the
    # store's public API, never the CLI (the audit they check is storage's)
    "fuzz": {"spec", "machines", "storage", "api"},
}


def _layer_violations(folder: Path, allowed: set[str]) -> list[str]:
    """Each ``file imports module`` of ``folder`` whose layer is not in ``allowed``."""
    found = []
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.startswith("turnkeeper"):
                    layer = name.split(".")[1] if "." in name else "api"
                    if layer not in allowed:
                        found.append(f"{path.relative_to(folder.parent)} imports {name}")
    return found


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_layering(folder):
    assert _layer_violations(ROOT / folder, LAYERS[folder] | {folder}) == []


def test_control_a_fuzz_module_importing_the_cli_breaks_the_layering(tmp_path):
    """The check finds a fuzz module that imports the CLI, even inside a function."""
    (tmp_path / "fuzz").mkdir()
    (tmp_path / "fuzz" / "m.py").write_text(
        "def f():\n    from turnkeeper.cli.main import cli\n    return cli\n"
    )
    found = _layer_violations(tmp_path / "fuzz", LAYERS["fuzz"] | {"fuzz"})
    assert found == ["fuzz/m.py imports turnkeeper.cli.main"]


PACKAGE_DIRS = {
    "spec": "turnkeeper.spec",
    "machines": "turnkeeper.machines",
    "storage": "turnkeeper.storage",
    "fuzz": "turnkeeper.fuzz",
    "api": "turnkeeper",
}


def _module_name(path) -> str:
    for folder, package in PACKAGE_DIRS.items():
        try:
            rel = path.relative_to(ROOT / folder)
        except ValueError:
            continue
        parts = [package, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)
    raise ValueError(path)


def _imports(path, module: str, is_package: bool) -> set[str]:
    """The turnkeeper modules ``module`` imports, at load time or inside a function
    (a deferred import is still a cycle), leaving out ``if TYPE_CHECKING`` blocks."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("turnkeeper")}


def test_no_import_cycles():
    """No module of the package imports, at load time, a module that imports it back."""
    paths = {_module_name(p): p for folder in PACKAGE_DIRS for p in (ROOT / folder).rglob("*.py")}
    graph = {
        name: _imports(path, name, path.name == "__init__.py") & set(paths)
        for name, path in paths.items()
    }
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    # a package and the modules it re-exports refer to each other by design
    real = [c for c in cycles if not _through_package_init(c, paths)]
    assert real == []


def _through_package_init(cycle: str, paths) -> bool:
    return any(paths[m].name == "__init__.py" for m in cycle.split(" -> "))


def test_readme_state_tables_match_the_spec():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for lifecycle in LIFECYCLES:
        from turnkeeper.machines import markdown

        rows = [line for line in markdown(lifecycle).splitlines() if line.startswith("|")]
        assert rows and all(row in readme for row in rows), f"README table for {lifecycle.name}"


TINY_BENCH = {
    "TURNKEEPER_BENCH_REPS": "1",
    "TURNKEEPER_BENCH_SECONDS": "0.01",
    "TURNKEEPER_BENCH_REPLAY_ENTRIES": "200",
    "TURNKEEPER_BENCH_WRITERS_S": "0.1",
    "TURNKEEPER_BENCH_RUNS": "3000",
    "TURNKEEPER_BENCH_BIG_SESSIONS": "3",
    "TURNKEEPER_BENCH_BIG_COPIES": "5",
    "TURNKEEPER_BENCH_LEDGER_REPLAY": "2000",
    "TURNKEEPER_BENCH_CLI_ENTRIES": "400",
    "TURNKEEPER_BENCH_RSS_ENTRIES": "2000",
}
"""CI's size for reports/bench.py: enough to run every row, too small to mean anything."""


def run_tiny_bench(tmp_path: Path, pg: str | None) -> dict:
    """reports/bench.py at the tiny size, on DuckDB (and on ``pg`` when given)."""
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k != "TURNKEEPER_TEST_PG"}
    env.update(TINY_BENCH)
    env["TURNKEEPER_BENCH_OUT"] = str(tmp_path / "bench.json")
    env["TURNKEEPER_BENCH_TABLE"] = str(tmp_path / "BENCH.md")
    if pg:
        env["TURNKEEPER_TEST_PG"] = pg
    done = subprocess.run(
        [sys.executable, str(ROOT / "reports" / "bench.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data: dict = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    for backend in data["backends"].values():
        assert backend["floor_ms"] > 0
        assert len(backend["operations"]) == 20
        assert all(row["median"] > 0 for row in backend["operations"].values())
        assert set(backend["threads"]) == {"1", "4", "16"}
        assert backend["statements_per_call"]["append_many"] > 0
        assert backend["analytics_model_day"]["runs"] == 3000
        assert backend["dbos_three_steps"]["median"] > 0
        ledger = backend["ledger"]
        assert ledger["16_writers_batches_x_one_record_per_commit"] > 0
        assert ledger["16_writers_single_x_one_writer"] > 0
        assert ledger["replay"]["records"] == 2000
        assert ledger["replay"]["peak_bytes"] > 0
        encrypted = backend["encryption"]["encrypted_over_clear"]
        assert len(encrypted) == 4 and all(row["median"] > 0 for row in encrypted.values())
    duck = data["backends"]["duckdb"]
    assert duck["analytics_model_day"]["x_faster_than_sqlite"] > 0
    assert duck["cli"]["entries"] == 400 and duck["cli"]["noop_over_first"]["median"] > 0
    assert set(duck["langgraph"]) == {
        "replay / get_tuple",
        "replay, cache off / get_tuple",
        "append (fenced) / put",
    }
    table = (tmp_path / "BENCH.md").read_text(encoding="utf-8")
    assert table.startswith("# turnkeeper")
    assert "| ledger: 16 writers, batches of 100 |" in table
    assert "| pi import, 400 entries: no-op re-import |" in table
    assert "| encryption: append (fenced), encrypted / clear |" in table
    return data


def test_the_benchmark_runs_at_a_tiny_size(tmp_path):
    """reports/bench.py runs end to end at a tiny size and writes every figure,
    on DuckDB and on the PostgreSQL test server when there is one (always in
    CI: the suite refuses to start there without it), in its own schema; the
    sizes are CI's, the figures are not asserted."""
    import os

    url = os.environ.get("TURNKEEPER_TEST_PG")
    data = run_tiny_bench(tmp_path, url)
    assert set(data["backends"]) == {"duckdb", *(["postgres"] if url else [])}
    if url:
        assert set(data["backends"]["postgres"]["processes"]) == {"1", "4", "8"}


def test_the_committed_benchmark_is_well_formed_and_its_table_is_current():
    """reports/bench.json holds both backends at the full size, and
    reports/BENCH.md is exactly the table made from it (not stale)."""
    import importlib.util
    import json

    data = json.loads((ROOT / "reports" / "bench.json").read_text(encoding="utf-8"))
    assert set(data["backends"]) == {"duckdb", "postgres"}
    assert data["size"]["reps"] >= 5 and data["size"]["replay_entries"] >= 10_000
    assert data["size"]["runs"] >= 1_000_000
    for backend in data["backends"].values():
        assert backend["floor_ms"] > 0
        assert all(row["median"] > 0 for row in backend["operations"].values())
        assert backend["encryption"]["reps"] >= 5
        assert all(r["median"] > 0 for r in backend["encryption"]["encrypted_over_clear"].values())
    assert data["machine"]["cores"] >= 1
    spec = importlib.util.spec_from_file_location("bench", ROOT / "reports" / "bench.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert (ROOT / "reports" / "BENCH.md").read_text(encoding="utf-8") == bench.table(data)


def test_the_duckdb_store_implements_the_whole_protocol():
    import inspect

    from turnkeeper.storage import DuckDBStore, Store

    wanted = {n for n, v in vars(Store).items() if callable(v) and not n.startswith("_")}
    assert wanted, "the protocol lists operations"
    for name in sorted(wanted):
        mine = getattr(DuckDBStore, name, None)
        assert mine is not None, name
        assert list(inspect.signature(mine).parameters) == list(
            inspect.signature(getattr(Store, name)).parameters
        ), name
