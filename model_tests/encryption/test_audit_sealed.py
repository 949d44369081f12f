"""``turnkeeper audit``'s ``payloads_open`` check walks every sealed column
(``crypto/columns.py``), not the entries alone (attack finding on issue 23,
part 2): one flipped byte in any sealed value of a session, or a clear
value put in its place, fails the check naming the session, the column and
the record; a control with the walk patched out sees the damage pass.
A replay snapshot that does not open is not served (the replay reads the
rows) and is named all the same: a clear snapshot in a sealed session is a
clear copy at rest."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import forge

import turnkeeper
from turnkeeper import (
    CapabilityEvent,
    EntryKind,
    Guidance,
    InputResourceEvent,
    ResponseItem,
    ResponseTurn,
)
from turnkeeper.cli.main import cli
from turnkeeper.spec.delivery import DeliveryPlan, DeliveryStep
from turnkeeper.spec.records import ImportBatch, ImportEntry, OpaqueRecord
from turnkeeper.storage.audit import runs as audit_runs
from turnkeeper.storage.crypto.columns import SEALED, SealedColumn
from turnkeeper.storage.ops import replay_snapshots

SECRET = "the launch code is 0000"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WALKED = list(SEALED)


def _fill(store: Any, sid: str) -> None:
    """A value in every sealed column of ``sid`` (the replay snapshot: stored
    by the cold replay the fixture runs after)."""
    dup = json.dumps({"type": "message", "id": "i1", "message": {"role": "user", "content": "x"}})
    store.sessions.import_batch(
        ImportBatch(
            session_id=sid,
            cwd="/w",
            created_at=T0,
            header={},
            entries=[
                ImportEntry(
                    "i1",
                    None,
                    EntryKind.MESSAGE,
                    T0,
                    {"message": {"role": "user", "content": SECRET}},
                )
            ],
            leaf_id="i1",
            opaque=[OpaqueRecord("/s.jsonl", 2, f"2:{dup}", "duplicate entry id")],
            source="/s.jsonl",
        )
    )
    run = store.runs.admit(sid, {"q": SECRET}, user_message={"role": "user", "content": "go"})
    store.runs.start(run.id)
    call = {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"cmd": "ls"}}
    store.sessions.append(
        sid, EntryKind.MESSAGE, {"message": {"role": "assistant", "content": [call]}}
    )
    store.tools.claim(
        f"{sid}-k1",
        sid,
        local_turn_id=run.turn_id,
        provider_call_id="c1",
        tool_name="bash",
        side_effecting=False,
        run_id=run.id,
        provider_metadata={"note": SECRET},
    )
    store.tools.complete(f"{sid}-k1", {"stdout": SECRET})
    store.runs.record_event(run.id, "note", {"text": SECRET}, event_id=f"{sid}-e1")
    plan = DeliveryPlan(
        "chat", "room", (DeliveryStep("send", "message"),), transport_context={"t": SECRET}
    )
    reply = {"role": "assistant", "content": "ok"}
    store.runs.finish(run.id, "succeeded", assistant_message=reply, delivery_plan=plan)
    store.guidance.save(Guidance(f"{sid}-g", sid, SECRET))
    store.resources.record_event(
        InputResourceEvent(sid, "f1", "attached", id=f"{sid}-r", data={"t": SECRET})
    )
    store.capabilities.record_event(
        CapabilityEvent(sid, "web_search", "enabled", id=f"{sid}-c", data={"q": SECRET})
    )
    summaries = {"request_summary": {"i": SECRET}, "response_summary": {"o": SECRET}}
    store.archives.save_turn(
        ResponseTurn(
            sid, "t:1", "openai", "openai-responses", "m", "replay", "completed", **summaries
        )
    )
    body = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": SECRET}],
    }
    store.archives.save_item(
        ResponseItem(sid, "t:1", "message", body, item_id="it", output_index=0)
    )
    lease = store.leases.acquire(f"session:{sid}", "w", ttl_s=60)
    with store.ledger.with_blobs(offload_threshold=64).open(sid, lease) as writer:
        writer.append("note", SECRET.encode() * 8, "n1")
    store.leases.release(lease)


@pytest.fixture(scope="module")
def sealed_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """An encrypted DuckDB file with sessions ``a`` and ``b`` filled, and its key file."""
    folder = tmp_path_factory.mktemp("audit_sealed")
    key = folder / "key"
    key.write_text(turnkeeper.LocalKeyProvider.generate("k1") + "\n")
    key.chmod(0o600)
    path = str(folder / "s.duckdb")
    provider = turnkeeper.LocalKeyProvider.from_file(key)
    with turnkeeper.open_store(path, encryption=provider) as store:
        for sid in ("a", "b"):
            _fill(store, sid)
    with (
        pytest.MonkeyPatch.context() as patch,
        turnkeeper.open_store(path, encryption=provider) as cold,
    ):
        patch.setattr(replay_snapshots, "PERSIST_ROWS", 1)  # a snapshot of a small session
        for sid in ("a", "b"):
            cold.sessions.replay(sid)
    return path, key


def _value(store: Any, column: SealedColumn) -> tuple[str, Any]:
    record = f"CAST({column.record} AS VARCHAR)"
    sql = (
        f"SELECT {record} AS r, {column.column} AS v FROM {column.table} "
        f"WHERE {column.session} = 'a' AND {column.column} IS NOT NULL ORDER BY 1 LIMIT 1"
    )
    rows = store.query(sql).to_pylist()
    assert rows, f"no value of {column.table}.{column.column} was written"
    return str(rows[0]["r"]), rows[0]["v"]


def _damaged(value: Any, clear: bool) -> Any:
    if isinstance(value, bytes | bytearray):
        if clear:
            return b"clear bytes"
        raw = bytearray(value)
        raw[len(raw) // 2] ^= 1
        return bytes(raw)
    if clear:
        return '{"forged": 1}'
    mid = len(value) // 2
    return value[:mid] + ("A" if value[mid] != "A" else "B") + value[mid + 1 :]


def _set(store: Any, column: SealedColumn, record: str, value: Any) -> None:
    forge(
        store,
        f"UPDATE {column.table} SET {column.column} = ? "
        f"WHERE {column.session} = 'a' AND CAST({column.record} AS VARCHAR) = ?",
        [value, record],
        rows=1,
    )


def _audit(path: str, key: Path) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(cli, ["--key-file", str(key), "audit", "--db", path, "--json"])
    checks = {c["name"]: c for c in json.loads(result.output)["audit"]}
    return result.exit_code, checks


@pytest.mark.parametrize("clear", [False, True], ids=["flipped", "clear"])
@pytest.mark.parametrize("column", WALKED, ids=[f"{c.table}.{c.column}" for c in WALKED])
def test_a_damaged_value_of_any_sealed_column_fails_payloads_open(
    sealed_store: tuple[str, Path], column: SealedColumn, clear: bool
) -> None:
    path, key = sealed_store
    with turnkeeper.open_store(path) as store:
        record, good = _value(store, column)
        _set(store, column, record, _damaged(good, clear))
    try:
        code, checks = _audit(path, key)
        check = checks["payloads_open"]
        assert code == 1 and check["violations"] == 1, check
        assert f"a/{column.table}.{column.column}/{record}: " in check["detail"], check
    finally:
        with turnkeeper.open_store(path) as store:
            _set(store, column, record, good)
    code, checks = _audit(path, key)
    assert code == 0 and checks["payloads_open"]["passed"], checks["payloads_open"]


def test_control_without_the_walk_a_damaged_tool_result_passes(
    sealed_store: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, key = sealed_store
    (column,) = [c for c in SEALED if (c.table, c.column) == ("tool_executions", "result")]
    monkeypatch.setattr(audit_runs, "_sealed_values", lambda store, scope: (0, []))
    with turnkeeper.open_store(path) as store:
        record, good = _value(store, column)
        _set(store, column, record, _damaged(good, False))
    try:
        code, checks = _audit(path, key)
        assert code == 0 and checks["payloads_open"]["passed"]
    finally:
        with turnkeeper.open_store(path) as store:
            _set(store, column, record, good)


def test_without_the_key_the_sealed_values_are_said_not_opened(
    sealed_store: tuple[str, Path],
) -> None:
    path, _ = sealed_store
    result = CliRunner().invoke(cli, ["audit", "--db", path, "--json"])
    checks = {c["name"]: c for c in json.loads(result.output)["audit"]}
    assert result.exit_code == 0, result.output
    assert "2 session(s) are sealed" in checks["payloads_open"]["detail"]
