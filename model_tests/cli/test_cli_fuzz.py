"""``turnkeeper fuzz`` (issue 22): the differential machines against scratch
stores made beside a user's configuration.

A short run (every machine one small batch) on DuckDB and on PostgreSQL
exits 0, writes a well-formed report (Markdown and JSON) with counts above
zero, leaves no scratch folder or schema behind, and leaves the user's store
byte for byte (DuckDB) or row for row (PostgreSQL) as it was; controls show
those checks fail when the scratch isolation is patched out. With a fence
patched out (in-process, through click's ``CliRunner``) the run exits 1 and
the report names the machine and shows its failing steps (the lease
machine's with the busy fence out, the bindings machine's with the session
check out); ``--machine``'s choices are the runner's machines. An unusable URL, a
role without ``CREATE``, a connection that loses the scratch ``search_path``
and a missing Hypothesis are refused with the typed error, exit 2.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import as_user, direct_url, with_schema
from hypothesis import Phase, settings
from test_stateful_bindings import drop_the_session_check
from test_stateful_sessions import drop_the_expected_leaf_guard

import turnkeeper
from turnkeeper.cli import fuzz as command
from turnkeeper.cli.main import cli
from turnkeeper.fuzz import runner, scratch
from turnkeeper.storage.ops import deletes, leases, tool_records
from turnkeeper.storage.ops.ledger import condemn

SHORT = ["--minutes", "0", "--examples", "2", "--steps", "8", "--seed", "11"]
"""One batch per machine: two examples of at most eight steps."""


def fuzz(*args: str) -> Result:
    return CliRunner().invoke(cli, ["fuzz", *args], catch_exceptions=False)


def refused(result: Result) -> str:
    """The one stderr line of a refusal (exit status 2)."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


def well_formed(report: Path, machines: list[str], *, backend: str) -> dict[str, Any]:
    """The JSON beside ``report``, checked against the Markdown: every machine
    ran examples, steps and invariant checks; returns the JSON."""
    data = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))
    text = report.read_text(encoding="utf-8")
    assert data["format"] == 1 and data["turnkeeper"] == turnkeeper_version()
    assert data["backend"] == backend and data["seed"] == 11
    assert [m["name"] for m in data["machines"]] == machines
    for m in data["machines"]:
        assert m["batches"] >= 1 and m["examples"] > 0, m
        assert m["steps"] > 0 and m["invariant_checks"] > 0, m
        row = f"| {m['name']} | {m['covers']} | {m['batches']} | {m['examples']} | "
        assert row in text, (row, text)
    return data


def turnkeeper_version() -> str:
    from importlib.metadata import version

    return version("turnkeeper")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- DuckDB ------------------------------------------------------------------------------


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    """A user's DuckDB store with a session and a run in it, in a folder of its own."""
    folder = tmp_path / "deploy"
    folder.mkdir()
    path = folder / "prod.duckdb"
    with turnkeeper.open_store(str(path)) as store:
        store.sessions.create("live")
        store.sessions.append("live", "message", {"message": {"role": "user", "content": "hi"}})
        run = store.runs.admit("live", {"q": 1})
        store.runs.start(run.id)
    return path


def test_a_short_run_on_duckdb_reports_and_leaves_the_users_file_as_it_was(
    user_file: Path, tmp_path: Path
) -> None:
    before, listing = digest(user_file), sorted(p.name for p in user_file.parent.iterdir())
    report = tmp_path / "out" / "fuzz.md"
    report.parent.mkdir()
    result = fuzz("--db", str(user_file), *SHORT, "--report", str(report))
    assert result.exit_code == 0, (result.output, result.stderr)
    data = well_formed(report, list(runner.MACHINES), backend="duckdb")
    assert not data["failed"] and data["target"] == str(user_file)
    assert digest(user_file) == before  # never opened: the same bytes
    assert sorted(p.name for p in user_file.parent.iterdir()) == listing  # no scratch left
    assert "passed" in result.stderr


def test_a_run_without_a_seed_reports_the_one_it_drew_and_that_seed_repeats_it(
    user_file: Path, tmp_path: Path
) -> None:
    quick = ["--minutes", "0", "--examples", "2", "--steps", "8", "--machine", "leases"]
    first = tmp_path / "first.md"
    assert fuzz("--db", str(user_file), *quick, "--report", str(first)).exit_code == 0
    drawn = json.loads(first.with_suffix(".json").read_text(encoding="utf-8"))
    assert isinstance(drawn["seed"], int)
    assert f"- seed: {drawn['seed']}" in first.read_text(encoding="utf-8")
    again = tmp_path / "again.md"
    args = ["--db", str(user_file), *quick, "--seed", str(drawn["seed"]), "--report", str(again)]
    assert fuzz(*args).exit_code == 0
    repeated = json.loads(again.with_suffix(".json").read_text(encoding="utf-8"))
    # the same examples, step for step (the clock is the machine's own)
    assert repeated["machines"] == drawn["machines"]


def test_the_deletes_machine_runs_alone(user_file: Path, tmp_path: Path) -> None:
    report = tmp_path / "deletes.md"
    result = fuzz("--db", str(user_file), *SHORT, "--machine", "deletes", "--report", str(report))
    assert result.exit_code == 0, (result.output, result.stderr)
    well_formed(report, ["deletes"], backend="duckdb")


def test_control_the_active_run_guard_patched_out_fails_the_deletes_run(
    user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete's active-run guard patched out (test-only: no status counts
    as a live run): the deletes machine deletes (or retains past) a session
    mid-run where its model refuses: exit 1, the report gives the failing
    steps. Shrinking is left out (test-only, for CI's time: an example of this
    machine costs about a second, and the leases control above shows the
    shrunk report); the seed's eighth example is the first to fail."""
    monkeypatch.setattr(deletes, "NON_TERMINAL", ("none", "none", "none"))
    real = runner.batch_settings

    def unshrunk(examples: int, steps: int, seed: int | None) -> Any:
        return settings(real(examples, steps, seed), phases=(Phase.explicit, Phase.generate))

    monkeypatch.setattr(runner, "batch_settings", unshrunk)
    steps = failed_run(str(user_file), "deletes", tmp_path)["steps"]
    assert "state = DeletesMachine[duckdb]()" in steps, steps
    assert "state.admit(" in steps and ("state.delete" in steps or "state.retain(" in steps)


def test_encrypted_runs_on_a_throwaway_key(user_file: Path, tmp_path: Path) -> None:
    report = tmp_path / "enc.md"
    result = fuzz(
        "--db", str(user_file), *SHORT, "--machine", "runs", "--encrypted", "--report", str(report)
    )
    assert result.exit_code == 0, (result.output, result.stderr)
    well_formed(report, ["runs"], backend="duckdb+enc")


def a_short_sessions_run(target: str, backend: str, tmp_path: Path) -> None:
    """``--machine sessions`` for one small batch: exit 0, counts above zero."""
    report = tmp_path / "sessions.md"
    result = fuzz("--db", target, *SHORT, "--machine", "sessions", "--report", str(report))
    assert result.exit_code == 0, (result.output, result.stderr)
    data = well_formed(report, ["sessions"], backend=backend)
    assert not data["failed"], data


def test_the_sessions_machine_runs_on_duckdb(user_file: Path, tmp_path: Path) -> None:
    a_short_sessions_run(str(user_file), "duckdb", tmp_path)


def test_control_the_expected_leaf_patched_out_fails_the_sessions_run(
    user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sessions machine is a real check from the CLI: with the appends'
    ``expected_leaf`` guard patched out (test-only: an append on a stale leaf
    goes in), the run exits 1 and the report shows the shrunk steps."""
    drop_the_expected_leaf_guard(monkeypatch)
    # found and shrunk in 36 examples (17 s at load 4; the shrinking is most of it)
    failure = failed_run(str(user_file), "sessions", tmp_path, examples=10, steps=5, seed=2)
    assert "state = SessionsMachine[duckdb]()" in failure["steps"], failure["steps"]
    assert "appends" in failure["steps"], failure["steps"]  # the machine's notes


def test_control_scratch_stores_in_the_users_file_change_it(
    user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with the scratch copy patched out (each example opens the
    user's own file), the byte-for-byte check above sees the change."""
    before = digest(user_file)

    def the_users_file(self: scratch.DuckDBScratch, clock: Any) -> turnkeeper.BaseStore:
        store = turnkeeper.open_store(str(user_file), clock=clock)
        self._open[id(store)] = (store, None)  # type: ignore[assignment]
        return store

    monkeypatch.setattr(scratch.DuckDBScratch, "open", the_users_file)
    fuzz("--db", str(user_file), *SHORT, "--machine", "outbox", "--report", str(tmp_path / "r.md"))
    assert digest(user_file) != before


def take_any_lease(mp: pytest.MonkeyPatch) -> None:
    """The lease's busy fence patched out (test-only): every acquire of a held
    lease is decided as if it had expired, so another owner (or the holder's
    own retry) takes it over with a new epoch."""
    real = leases._MACHINE

    class TakeAnyway:
        def decide(self, trigger: str, source: str, facts: dict[str, Any]) -> Any:
            if trigger == "acquire":
                facts = {**facts, "expired": True}
            return real.decide(trigger, source, facts)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    mp.setattr(leases, "_MACHINE", TakeAnyway())


def failed_run(
    target: str,
    machine: str,
    tmp_path: Path,
    *,
    examples: int = 30,
    steps: int = 8,
    seed: int = 3,
) -> dict[str, Any]:
    """Run ``machine`` alone (a seeded batch of ``examples`` examples of at
    most ``steps`` steps) with a guard patched out: it exits 1, the report names the machine
    and gives its shrunk steps (in the Markdown too) and an ``AssertionError``;
    returns the failure as the JSON gives it."""
    report = tmp_path / "kill.md"
    args = ["--minutes", "0", "--examples", str(examples), "--steps", str(steps)]
    args += ["--seed", str(seed)]
    result = fuzz("--db", target, *args, "--machine", machine, "--report", str(report))
    assert result.exit_code == 1, (result.output, result.stderr)
    assert f"FAILED: {machine}" in result.stderr
    text = report.read_text(encoding="utf-8")
    assert f"## {machine} failed" in text and "result: **FAILED**" in text
    data = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))
    failure: dict[str, Any] = data["machines"][0]["failure"]
    assert "state.teardown()" in failure["steps"], failure["steps"]
    assert failure["error"].startswith("AssertionError"), failure["error"]
    assert failure["steps"] in text
    return failure


def a_fence_patched_out_fails_the_run(target: str, backend: str, tmp_path: Path) -> None:
    """With :func:`take_any_lease` applied, the lease machine finds a grant the
    oracle refuses: exit 1, and the report names the machine and gives its
    shrunk steps and the error."""
    failure = failed_run(target, "leases", tmp_path)
    assert f"state = LeaseAndThreadMachine[{backend}]()" in failure["steps"], failure["steps"]
    assert "state.acquire" in failure["steps"]


def test_control_a_fence_patched_out_fails_the_run_and_the_report_shows_the_steps(
    user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    take_any_lease(monkeypatch)
    a_fence_patched_out_fails_the_run(str(user_file), "duckdb", tmp_path)


def test_control_a_bindings_guard_patched_out_fails_the_run(
    user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the bindings' session check patched out (test-only: a binding
    write to a session that never existed goes ahead), the bindings machine
    finds a write its model refuses, and its note gives the step that
    replays it."""
    drop_the_session_check(monkeypatch)
    failure = failed_run(str(user_file), "bindings", tmp_path)
    assert "state = BindingsMachine[duckdb]()" in failure["steps"], failure["steps"]
    assert "session='ghost'" in failure["steps"], failure["steps"]  # the replayable note
    assert "'missing', 'ghost'" in failure["error"], failure["error"]


def test_the_bindings_machine_alone_on_duckdb(user_file: Path, tmp_path: Path) -> None:
    report = tmp_path / "bindings.md"
    result = fuzz("--db", str(user_file), *SHORT, "--machine", "bindings", "--report", str(report))
    assert result.exit_code == 0, (result.output, result.stderr)
    well_formed(report, ["bindings"], backend="duckdb")


def forget_claimed_keys(mp: pytest.MonkeyPatch) -> None:
    """A tool claim's lookup of its execution key patched out (test-only): a
    claim never finds the key's record, so the retry of a claim whose reply
    was lost inserts it again instead of returning the stored record."""
    mp.setattr(tool_records, "get", lambda tx, execution_key: None)


def test_the_tool_records_machine_runs_on_its_own(user_file: Path, tmp_path: Path) -> None:
    report = tmp_path / "tools.md"
    result = fuzz("--db", str(user_file), *SHORT, "--machine", "tools", "--report", str(report))
    assert result.exit_code == 0, (result.output, result.stderr)
    assert not well_formed(report, ["tools"], backend="duckdb")["failed"]


def test_control_a_tool_guard_patched_out_fails_the_tools_run(
    user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped tool-records machine is a real check from the command: with
    the claimed-key lookup patched out, a claim retried after a lost reply
    does not give the stored record (one step: short examples keep the
    shrinking cheap)."""
    forget_claimed_keys(monkeypatch)
    failure = failed_run(str(user_file), "tools", tmp_path, steps=3, seed=1)
    assert "state = ToolRecordsMachine[duckdb]()" in failure["steps"], failure["steps"]
    assert "state.claim" in failure["steps"], failure["steps"]


def test_the_machine_choices_and_the_help_follow_the_runners_machines() -> None:
    """``--machine``'s choices (kept in the CLI, so ``--help`` needs no
    Hypothesis) are ``runner.MACHINES``' names in order, each with what it
    covers, and ``--help`` lists them."""
    assert tuple(runner.MACHINES) == command.MACHINE_NAMES
    assert list(runner.COVERS) == list(runner.MACHINES)
    shown = CliRunner().invoke(cli, ["fuzz", "--help"], terminal_width=200).output
    assert "[" + "|".join(runner.MACHINES) + "]" in shown, shown


def test_the_ledger_machine_alone_on_duckdb(user_file: Path, tmp_path: Path) -> None:
    """``--machine ledger``: the shipped ledger machine (public API only; the
    damage rules are the test suite's) runs, passes and counts."""
    report = tmp_path / "ledger.md"
    result = fuzz("--db", str(user_file), *SHORT, "--machine", "ledger", "--report", str(report))
    assert result.exit_code == 0, (result.output, result.stderr)
    well_formed(report, ["ledger"], backend="duckdb")


def test_control_the_condemned_blob_check_patched_out_fails_the_ledger_run(
    user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with the writer's refusal of a pointer to a blob GC condemned
    patched out (test-only), the ledger machine's GC whose lease lapses
    mid-delete deletes an acknowledged record's blob: exit 1, the report
    shows the shrunk steps. (A fixed seed whose search and shrink take
    about 30 examples.)"""
    monkeypatch.setattr(condemn, "refuse_condemned", lambda session_id, new, marked: None)
    failure = failed_run(str(user_file), "ledger", tmp_path, examples=20, steps=4, seed=4)
    assert "state = LedgerMachine[duckdb]()" in failure["steps"], failure["steps"]
    assert "state.gc_lapses_mid_delete(" in failure["steps"], failure["steps"]
    assert "GC deleted an acknowledged record's blob" in failure["error"], failure["error"]


def test_without_hypothesis_the_command_names_the_extra(
    user_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hypothesis not importable (and ``turnkeeper.fuzz``'s machines not yet
    imported): the one line names the extra to install."""
    import turnkeeper.fuzz as package

    for name in list(sys.modules):
        if name.startswith("turnkeeper.fuzz."):
            monkeypatch.delitem(sys.modules, name)
            monkeypatch.delattr(package, name.rsplit(".", 1)[1], raising=False)
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    line = refused(fuzz("--db", str(user_file), *SHORT))
    assert "NotSupportedError" in line or "not supported" in line.lower(), line
    assert "turnkeeper[fuzz]" in line, line


def test_memory_and_a_missing_folder_are_refused(tmp_path: Path) -> None:
    assert "db" in refused(fuzz("--db", ":memory:", *SHORT))
    assert "not a folder" in refused(fuzz("--db", str(tmp_path / "no" / "x.duckdb"), *SHORT))


def test_usage_errors_exit_2(user_file: Path) -> None:
    refused(fuzz("--db", str(user_file)))  # --minutes is required
    refused(fuzz("--db", str(user_file), "--minutes", "-1"))
    refused(fuzz("--db", str(user_file), "--minutes", "1", "--machine", "nope"))


# -- PostgreSQL --------------------------------------------------------------------------


def rows(url: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table in ``schema``, sorted, by table."""
    import psycopg

    with psycopg.connect(url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", [schema]
            )
        ]
        return {
            t: sorted(map(repr, conn.execute(f"SELECT * FROM {schema}.{t}").fetchall()))
            for t in tables
        }


def scratch_schemas(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s",
                [scratch.SCHEMA_PREFIX + "%"],
            )
        ]


@pytest.fixture
def user_schema() -> Any:
    """A user's PostgreSQL store (a schema of its own, direct to the server)
    with a session and a run; its URL and schema; dropped afterwards."""
    psycopg = pytest.importorskip("psycopg")
    server = direct_url()
    schema = f"tk_user_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = with_schema(server, schema)
    with turnkeeper.open_store(url) as store:
        store.sessions.create("live")
        store.sessions.append("live", "message", {"message": {"role": "user", "content": "hi"}})
        run = store.runs.admit("live", {"q": 1})
        store.runs.start(run.id)
    yield server, url, schema
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.postgres
def test_a_short_run_on_postgres_reports_and_leaves_the_users_rows_as_they_were(
    user_schema: Any, tmp_path: Path
) -> None:
    server, url, schema = user_schema
    before = rows(server, schema)
    assert before["sessions"], before
    report = tmp_path / "pg.md"
    result = fuzz("--db", url, *SHORT, "--report", str(report))
    assert result.exit_code == 0, (result.output, result.stderr)
    data = well_formed(report, list(runner.MACHINES), backend="postgres")
    assert data["target"] == scratch.redacted(url)
    assert rows(server, schema) == before
    assert scratch_schemas(server) == []


@pytest.mark.postgres
def test_the_sessions_machine_runs_on_postgres_with_a_peer(
    user_schema: Any, tmp_path: Path
) -> None:
    """On PostgreSQL writer w3 writes through the scratch opener's peer."""
    server, url, schema = user_schema
    before = rows(server, schema)
    a_short_sessions_run(url, "postgres", tmp_path)
    assert rows(server, schema) == before
    assert scratch_schemas(server) == []


@pytest.mark.postgres
def test_control_a_fence_patched_out_fails_the_run_on_postgres(
    user_schema: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, url, _ = user_schema
    take_any_lease(monkeypatch)
    a_fence_patched_out_fails_the_run(url, "postgres", tmp_path)
    assert scratch_schemas(server) == []


@pytest.mark.postgres
def test_the_bindings_machine_alone_on_postgres_with_a_peer(
    user_schema: Any, tmp_path: Path
) -> None:
    """The bindings machine's second gateway writes through a peer store
    object; the run passes and leaves no scratch schema."""
    server, url, schema = user_schema
    before = rows(server, schema)
    report = tmp_path / "bindings-pg.md"
    result = fuzz("--db", url, *SHORT, "--machine", "bindings", "--report", str(report))
    assert result.exit_code == 0, (result.output, result.stderr)
    well_formed(report, ["bindings"], backend="postgres")
    assert rows(server, schema) == before
    assert scratch_schemas(server) == []


@pytest.mark.postgres
def test_control_scratch_stores_in_the_users_schema_change_its_rows(
    user_schema: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with the scratch schema patched out of the stores' URL (and
    the check that refuses such a connection patched out too), the
    row-for-row check sees the machines' writes."""
    server, url, schema = user_schema
    before = rows(server, schema)
    monkeypatch.setattr(scratch.PostgresScratch, "_check_search_path", lambda self: None)
    monkeypatch.setattr(scratch, "in_schema", lambda target, name: target)
    monkeypatch.setattr(scratch.PostgresScratch, "close", lambda self, store: store.close())
    fuzz("--db", url, *SHORT, "--machine", "runs", "--report", str(tmp_path / "r.md"))
    assert rows(server, schema) != before


@pytest.mark.postgres
def test_a_connection_outside_the_scratch_schema_is_refused(
    user_schema: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that does not keep the scratch ``search_path`` (as through
    a transaction pooler: here, the scratch schema patched out of the URL)
    is refused before any store opens, the user's rows untouched."""
    server, url, schema = user_schema
    before = rows(server, schema)
    monkeypatch.setattr(scratch, "in_schema", lambda target, name: target)
    line = refused(fuzz("--db", url, *SHORT))
    assert "InvalidInputError" in line or "not in the scratch schema" in line, line
    assert "transaction pooler" in line, line
    assert rows(server, schema) == before
    assert scratch_schemas(server) == []


@pytest.mark.postgres
def test_a_role_without_create_is_refused_with_the_typed_error() -> None:
    psycopg = pytest.importorskip("psycopg")
    server = direct_url()
    role = f"tk_fuzz_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        line = refused(fuzz("--db", as_user(server, role), *SHORT))
        assert "may not create" in line and "GRANT CREATE" in line, line
        assert "ProgrammingError" in line or "programming" in line.lower() or "may not" in line
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")
    assert scratch_schemas(server) == []


def test_an_unusable_url_is_refused_and_its_password_never_shown() -> None:
    pytest.importorskip("psycopg")
    line = refused(fuzz("--db", "postgresql://u:s3cret@127.0.0.1:1/none", *SHORT))
    assert "cannot connect" in line and "s3cret" not in line, line


def test_redacted_removes_every_form_of_password() -> None:
    assert scratch.redacted("postgresql://u:pw@h:5/db?sslmode=require&password=x") == (
        "postgresql://u@h:5/db?sslmode=require"
    )
    assert scratch.redacted("host=h password='a b' dbname=d") == "host=h password=*** dbname=d"
    assert scratch.redacted("/srv/x.duckdb") == "/srv/x.duckdb"


def test_ctrl_c_removes_the_scratch_writes_the_report_and_exits_130(
    user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt during the second batch: exit 130, the report of the
    first batch written (marked interrupted), no scratch folder left."""
    from turnkeeper.fuzz import runner

    real, calls = runner._batch, []

    def interrupted(cls: Any, batch: Any) -> Any:
        calls.append(cls)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(cls, batch)

    monkeypatch.setattr(runner, "_batch", interrupted)
    listing = sorted(p.name for p in user_file.parent.iterdir())
    report = tmp_path / "int.md"
    result = fuzz("--db", str(user_file), *SHORT, "--report", str(report))
    assert result.exit_code == 130, (result.output, result.stderr)
    data = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))
    assert data["interrupted"] and data["machines"][0]["examples"] > 0, data
    assert "(interrupted)" in report.read_text(encoding="utf-8")
    assert sorted(p.name for p in user_file.parent.iterdir()) == listing


def test_sigterm_removes_the_scratch_writes_the_report_and_exits_143(
    user_file: Path, tmp_path: Path
) -> None:
    """A cancelled CI job (``SIGTERM`` to the process, once a batch is done):
    exit 143, the report written (interrupted), no scratch folder left."""
    import signal
    import subprocess
    import time

    report = tmp_path / "term.md"
    listing = sorted(p.name for p in user_file.parent.iterdir())
    args = ["--db", str(user_file), "--minutes", "10", "--examples", "2", "--steps", "5"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnkeeper.cli.main", "fuzz", *args, "--report", str(report)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # the first batch's progress line
        if " ex/" in line:
            break
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.stderr.read()
    assert proc.wait(timeout=120) == 143
    data = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))
    assert data["interrupted"], data
    assert sorted(p.name for p in user_file.parent.iterdir()) == listing


@pytest.mark.postgres
def test_a_peer_sees_the_examples_data_and_closes_with_the_example(user_schema: Any) -> None:
    """A machine racing two workers gets a second store object on the
    example's schema (``peer``); closing the example closes its peers too, so
    no connection of the example holds the schema while it is emptied."""
    server, _, _ = user_schema
    from turnkeeper.fuzz import FakeClock

    clock = FakeClock()
    with scratch.scratch(server) as made:
        store = made.open(clock)
        other = made.peer(store, clock)
        assert other is not None
        store.sessions.create("seen")
        assert other.sessions.get("seen") is not None  # the same data, another store object
        made.close(store)
        with pytest.raises(turnkeeper.InterfaceError):
            other.sessions.get("seen")  # closed with its example
        again = made.open(clock)
        assert again.sessions.get("seen") is None  # the next example starts empty
        made.close(again)


def test_duckdb_scratch_has_no_peer(tmp_path: Path) -> None:
    """A DuckDB file is one store per process: no peer."""
    from turnkeeper.fuzz import FakeClock

    with scratch.scratch(str(tmp_path / "x.duckdb")) as made:
        store = made.open(FakeClock())
        assert made.peer(store, FakeClock()) is None
        made.close(store)
