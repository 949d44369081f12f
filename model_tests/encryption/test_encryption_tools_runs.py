"""Encryption at rest of tool records and run messages (issue 23): tool
executions' result and provider metadata, execution intents' request and run
events' data are sealed under the session's data key on both engines, with
the record's id and the column's name as associated data; what the report
reads stays clear.

Each failure test flips or moves stored bytes with SQL, as someone with the
database (or a backup) in hand would; the control tests patch the sealing or
a guard out to show the tests can fail.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import TEST_KEYS, close_backend, forged_rows, open_backend, reopen

import turnkeeper
from turnkeeper import EntryKind, Guidance, InputResourceEvent, ResponseItem, ResponseTurn
from turnkeeper.cli.report import collect
from turnkeeper.fuzz import FakeClock
from turnkeeper.storage.crypto.columns import SEALED
from turnkeeper.storage.ops import sealed_json

SECRET = "the launch code is 0000"
ELSEWHERE = (
    "entries",
    "opaque_records",
    "replay_snapshots",
    "capability_events",
    "delivery_intents",
    "ledger_records",
    "ledger_blobs",
)
OURS = [c for c in SEALED if c.table not in ELSEWHERE]
"""The sealed columns this part added (entries' payload is tested in test_encryption,
the other copies of users' text in test_encryption_rest, the ledger's in
test_ledger_encryption)."""


def _work(store: Any, sid: str = "s") -> dict[str, Any]:
    """A run with a tool call and a recorded event, each carrying ``SECRET``;
    the ids of what it wrote."""
    store.sessions.create(sid, cwd="/w")
    run = store.runs.admit(
        sid, {"prompt": SECRET}, user_message={"role": "user", "content": "go"}, start=True
    )
    call = {"type": "toolCall", "id": f"{sid}-c1", "name": "bash", "arguments": {"cmd": SECRET}}
    message = {"role": "assistant", "content": [call], "stopReason": "toolUse"}
    store.sessions.append(sid, EntryKind.MESSAGE, {"message": message})
    key = f"{sid}-k1"
    store.tools.claim(
        key,
        sid,
        local_turn_id=run.turn_id,
        provider_call_id=f"{sid}-c1",
        tool_name="bash",
        side_effecting=False,
        arguments={"cmd": SECRET},
        run_id=run.id,
        provider_metadata={"note": SECRET},
    )
    store.tools.complete(key, {"stdout": SECRET})
    event = store.runs.record_event(run.id, "note", {"text": SECRET}, event_id=f"{sid}-e1")
    store.runs.finish(run.id, "succeeded", assistant_message={"role": "assistant", "content": "k"})
    store.guidance.save(Guidance(f"{sid}-g1", sid, SECRET, "v1"))
    store.resources.record_event(_resource(sid, run.id, f"{sid}-r1"))
    turn = store.archives.save_turn(
        ResponseTurn(
            sid,
            f"{sid}-rt",
            "openai",
            "responses",
            "gpt-5",
            "auto",
            "completed",
            request_summary={"q": SECRET},
            response_summary={"a": SECRET},
        )
    )
    item = store.archives.save_item(
        ResponseItem(sid, f"{sid}-rt", "message", {"text": SECRET}, item_id="it-1")
    )
    return {
        "run": run.id,
        "intent": run.intent_id,
        "key": key,
        "event": event.id,
        "guidance": f"{sid}-g1",
        "resource": f"{sid}-r1",
        "response_turn": turn.id,
        "response_item": item.id,
    }


def _resource(sid: str, run_id: str, event_id: str) -> InputResourceEvent:
    return InputResourceEvent(
        sid, "file-1", "materialized", id=event_id, run_id=run_id, data={"path": SECRET}
    )


def _stored(store: Any, table: str, sid: str) -> list[dict[str, Any]]:
    return store.query(f"SELECT * FROM {table} WHERE session_id = ?", [sid]).to_pylist()


def _leaks(store: Any, sid: str) -> list[tuple[str, str]]:
    """(table, column) of every stored value of ``sid``'s rows in the sealed
    columns' tables that holds ``SECRET`` in clear, or a sealed column's
    value that is not sealed."""
    found = []
    for table in sorted({c.table for c in OURS}):
        for row in _stored(store, table, sid):
            found += [(table, k) for k, v in row.items() if isinstance(v, str) and SECRET in v]
    for c in OURS:
        for row in _stored(store, c.table, sid):
            value = row[c.column]
            if value is not None and not value.startswith("enc1:"):
                found.append((c.table, c.column))
    return found


def test_every_sealed_column_is_in_the_list():
    assert {(c.table, c.column, c.record, c.field) for c in OURS} == {
        ("tool_executions", "result", "execution_key", "result"),
        ("tool_executions", "provider_metadata", "execution_key", "provider_metadata"),
        ("execution_intents", "request", "id", "request"),
        ("run_events", "data", "id", "data"),
        ("esm_guidance", "guidance", "id", "guidance"),
        ("input_resource_events", "data", "id", "data"),
        ("response_turns", "request_summary", "id", "request_summary"),
        ("response_turns", "response_summary", "id", "response_summary"),
        ("response_items", "sanitized", "id", "sanitized"),
    }


def test_tool_records_and_run_messages_are_stored_sealed_and_read_back(enc):
    ids = _work(enc)
    assert _leaks(enc, "s") == []
    assert len(_stored(enc, "run_events", "s")) >= 4  # admit, start, note, succeeded: all sealed
    with reopen(enc, encryption=TEST_KEYS) as s:  # another key cache
        rec = s.tools.get(ids["key"])
        assert (rec.result, rec.provider_metadata) == ({"stdout": SECRET}, {"note": SECRET})
        assert [r.execution_key for r in s.tools.list("s")] == [ids["key"]]
        assert s.runs.intent(ids["intent"]).request == {"prompt": SECRET}
        events = {e.id: e for e in s.runs.events("s")}
        assert events[ids["event"]].data == {"text": SECRET}
        assert events[f"{ids['run']}:succeeded"].data == {"error": None, "stopReason": None}
        assert [g.guidance for g in s.guidance.list("s")] == [SECRET]
        assert s.guidance.save(Guidance(ids["guidance"], "s", SECRET, "v1")).guidance == SECRET
        assert [e.data for e in s.resources.events("s")] == [{"path": SECRET}]
        turn = s.archives.get_turn("s", "s-rt")
        assert (turn.request_summary, turn.response_summary) == ({"q": SECRET}, {"a": SECRET})
        assert [i.sanitized for i in s.archives.items("s", "s-rt")] == [{"text": SECRET}]
        assert s.archives.replay_items("s") == [{"text": SECRET}]
        assert [t.items for t in s.archives.replay_turns("s")] == [({"text": SECRET},)]
        assert s.resources.record_event(_resource("s", ids["run"], ids["resource"])) == "s-r1"
        # Retries compare clear values, never two seals of one value.
        assert s.tools.complete(ids["key"], {"stdout": SECRET}).state == "completed"
        again = s.runs.record_event(ids["run"], "note", {"text": SECRET}, event_id=ids["event"])
        assert again.data == {"text": SECRET}
        saved = s.runs.save_intent("s", {"prompt": SECRET}, intent_id="i-1")
        assert s.runs.save_intent("s", {"prompt": SECRET}, intent_id="i-1") == saved
        with pytest.raises(turnkeeper.ToolExecutionConflictError):
            s.tools.claim(
                ids["key"],
                "s",
                local_turn_id="other",
                provider_call_id="s-c1",
                tool_name="bash",
                side_effecting=False,
                arguments={"cmd": SECRET},
            )
    assert _leaks(enc, "s") == []


def test_control_without_sealing_the_leak_check_finds_clear_values(enc, monkeypatch):
    """The checks above can fail: with the sealing patched out, every column
    this part seals is found clear, and the secret in it."""
    monkeypatch.setattr(
        sealed_json, "seal", lambda tx, sid, values, version=-1: [v for _, _, v in values]
    )
    real = sealed_json.open_json  # (entries' payloads stay sealed)
    monkeypatch.setattr(
        sealed_json,
        "open_json",
        lambda tx, sid, rid, field, v: (
            real(tx, sid, rid, field, v) if field == "payload" else orjson.loads(v)
        ),
    )
    _work(enc, "s")
    found = set(_leaks(enc, "s"))
    assert {(c.table, c.column) for c in OURS} <= found


def _flip(stored: str) -> str:
    raw = bytearray(base64.b64decode(stored[5:]))
    raw[-1] ^= 1
    return "enc1:" + base64.b64encode(bytes(raw)).decode()


READS: dict[str, Callable[[Any, dict[str, str]], Any]] = {
    "tool_executions.result": lambda s, ids: s.tools.get(ids["key"]),
    "tool_executions.provider_metadata": lambda s, ids: s.tools.list("s"),
    "execution_intents.request": lambda s, ids: s.runs.intent(ids["intent"]),
    "run_events.data": lambda s, ids: s.runs.events("s"),
    "esm_guidance.guidance": lambda s, ids: s.guidance.list("s"),
    "input_resource_events.data": lambda s, ids: s.resources.events("s"),
    "response_turns.request_summary": lambda s, ids: s.archives.get_turn("s", "s-rt"),
    "response_turns.response_summary": lambda s, ids: s.archives.get_turn("s", "s-rt"),
    "response_items.sanitized": lambda s, ids: s.archives.replay_items("s"),
}
"""Per sealed column, a read that opens it."""


def _value(store: Any, column: Any, sid: str, rid: Any) -> str:
    rows = store.query(
        f"SELECT {column.column} AS v FROM {column.table} "
        f"WHERE {column.record} = ? AND session_id = ?",
        [rid, sid],
    ).to_pylist()
    return str(rows[0]["v"])


def _put(store: Any, column: Any, sid: str, rid: Any, value: str) -> None:
    assert forged_rows(
        store,
        f"UPDATE {column.table} SET {column.column} = ? "
        f"WHERE {column.record} = ? AND session_id = ?",
        [value, rid, sid],
    )


def _record(ids: dict[str, Any], table: str) -> Any:
    return {
        "tool_executions": ids["key"],
        "execution_intents": ids["intent"],
        "run_events": ids["event"],
        "esm_guidance": ids["guidance"],
        "input_resource_events": ids["resource"],
        "response_turns": ids["response_turn"],
        "response_items": ids["response_item"],
    }[table]


def _refused(store: Any, column: Any, ids: dict[str, Any], sid: str, rid: Any) -> None:
    with (
        reopen(store, encryption=TEST_KEYS) as s,
        pytest.raises(turnkeeper.PayloadAuthenticationError) as refused,
    ):
        READS[f"{column.table}.{column.column}"](s, ids)
    got = refused.value
    assert (got.session_id, got.record_id, got.field) == (sid, str(rid), column.field)


@pytest.mark.parametrize("column", OURS, ids=lambda c: f"{c.table}.{c.column}")
def test_a_flipped_byte_fails_authentication_naming_the_record(enc, column):
    ids = _work(enc)
    rid = _record(ids, column.table)
    _put(enc, column, "s", rid, _flip(_value(enc, column, "s", rid)))
    _refused(enc, column, ids, "s", rid)


@pytest.mark.parametrize("column", OURS, ids=lambda c: f"{c.table}.{c.column}")
def test_a_value_moved_from_another_session_or_column_fails_authentication(enc, column):
    ids = _work(enc)
    other = _work(enc, "t")
    rid = _record(ids, column.table)
    theirs = _value(enc, column, "t", _record(other, column.table))
    _put(enc, column, "s", rid, theirs)  # the same row's column of another session
    _refused(enc, column, ids, "s", rid)
    siblings = [c for c in OURS if c.table == column.table and c.column != column.column]
    for sibling in siblings:  # the same row's other sealed column
        _put(enc, column, "s", rid, _value(enc, sibling, "s", rid))
        _refused(enc, column, ids, "s", rid)


@pytest.mark.parametrize("column", OURS, ids=lambda c: f"{c.table}.{c.column}")
def test_a_clear_value_in_a_sealed_session_is_a_downgrade(enc, column):
    ids = _work(enc)
    rid = _record(ids, column.table)
    _put(enc, column, "s", rid, '{"forged": true}')
    _refused(enc, column, ids, "s", rid)


def test_a_store_opened_without_its_key_refuses_these_reads_and_serves_metadata(enc):
    ids = _work(enc)
    before = {c.table: _stored(enc, c.table, "s") for c in OURS}
    with reopen(enc) as bare:
        assert bare.runs.get(ids["run"]).status == "succeeded"
        for read in (
            lambda: bare.tools.get(ids["key"]),
            lambda: bare.tools.list("s"),
            lambda: bare.runs.intent(ids["intent"]),
            lambda: bare.runs.events("s"),
            lambda: bare.guidance.list("s"),
            lambda: bare.resources.events("s"),
            lambda: bare.archives.get_turn("s", "s-rt"),
            lambda: bare.archives.items("s", "s-rt"),
            lambda: bare.archives.replay_turns("s"),
        ):
            with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
                read()
            assert (refused.value.session_id, refused.value.key_id) == ("s", None)
        with pytest.raises(turnkeeper.KeyUnavailableError):
            bare.runs.save_intent("s", {"prompt": SECRET}, intent_id="i-2")
        with pytest.raises(turnkeeper.KeyUnavailableError):
            bare.guidance.save(Guidance("g2", "s", SECRET))
        with pytest.raises(turnkeeper.KeyUnavailableError):
            bare.tools.claim(
                "k2",
                "s",
                local_turn_id="t",
                provider_call_id="c2",
                tool_name="bash",
                side_effecting=False,
            )
    assert {c.table: _stored(enc, c.table, "s") for c in OURS} == before  # nothing written


def test_control_without_the_keyless_guard_a_sealed_value_is_no_typed_error(enc, monkeypatch):
    """The keyless guard of ``sealed_json.open_json`` is what types the refusal
    of a store object that took the store for clear: without it the sealed
    text reaches the JSON decoder."""
    ids = _work(enc)
    with reopen(enc) as bare:
        bare.db.keyring.encrypted = False  # as a store object opened before the store was marked
        with pytest.raises(turnkeeper.KeyUnavailableError):
            bare.tools.get(ids["key"])
        monkeypatch.setattr(sealed_json, "is_sealed_text", lambda text: False)
        with pytest.raises(Exception) as untyped:
            bare.tools.get(ids["key"])
        assert not isinstance(untyped.value, turnkeeper.KeyUnavailableError)


def _figures(store: Any) -> dict[str, Any]:
    runs = collect(store)["run_history"]
    keep = ("runs_by_status_attempt", "tool_executions_by_state", "failure_reasons")
    return {name: runs[name] for name in keep}


def test_the_report_reads_the_same_figures_from_an_encrypted_store(tmp_path: Path):
    with turnkeeper.open_store(str(tmp_path / "clear.duckdb")) as clear:
        _work(clear)
        expected = _figures(clear)
    with turnkeeper.open_store(str(tmp_path / "sealed.duckdb"), encryption=TEST_KEYS) as sealed:
        _work(sealed)
        assert _leaks(sealed, "s") == []
    with turnkeeper.open_store(str(tmp_path / "sealed.duckdb")) as bare:  # the report holds no key
        assert _figures(bare) == expected
        assert expected["tool_executions_by_state"]  # (the figures are not empty)


@pytest.fixture(params=["duckdb", "postgres"])
def before_marking(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[tuple[Any, Any, Any]]:
    """A store object opened without keys on a clear store, then one opened
    with keys (which marks the store encrypted) holding the sealed session
    ``s`` with a running run: (clear object, keyed object, the run)."""
    clear = open_backend(request.param, tmp_path, clock)
    keyed = reopen(clear, encryption=TEST_KEYS, clock=clock)
    keyed.sessions.create("s", cwd="/w")
    run = keyed.runs.admit("s", {"prompt": "p"}, start=True)
    try:
        yield clear, keyed, run
    finally:
        keyed.close()
        close_backend(clear)


def _clear_writes(clear: Any, run: Any) -> list[Callable[[], Any]]:
    return [
        lambda: clear.tools.claim(
            "k9",
            "s",
            local_turn_id=run.turn_id,
            provider_call_id="c9",
            tool_name="bash",
            side_effecting=False,
            provider_metadata={"note": SECRET},
        ),
        lambda: clear.runs.save_intent("s", {"prompt": SECRET}, intent_id="i9"),
        lambda: clear.guidance.save(Guidance("g9", "s", SECRET)),
        lambda: clear.runs.record_event(run.id, "note", {"text": SECRET}, event_id="e9"),
        lambda: clear.resources.record_event(_resource("s", run.id, "r9")),
        lambda: clear.archives.save_item(
            ResponseItem("s", "rt9", "message", {"text": SECRET}, item_id="it-9")
        ),
        lambda: clear.archives.save_turn(
            ResponseTurn("s", "rt9", "o", "r", "m", "auto", "completed", request_summary=SECRET)
        ),
    ]


def test_a_store_object_opened_before_marking_writes_nothing_clear(before_marking):
    clear, keyed, run = before_marking
    for write in _clear_writes(clear, run):
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            write()
        assert (refused.value.session_id, refused.value.key_id) == ("s", None)
    assert _leaks(keyed, "s") == []
    assert keyed.tools.list("s") == [] and keyed.guidance.list("s") == []


def test_control_without_the_key_version_checks_a_clear_object_writes_clear(
    before_marking, monkeypatch
):
    """Control: with the writers' read of the session's key version and the
    event cursor's compare-and-set on it patched out, the store object that
    took the store for clear writes the secret clear into the sealed session."""
    from turnkeeper.storage.ops import run_events

    clear, keyed, run = before_marking
    monkeypatch.setattr(sealed_json, "session_version", lambda tx, sid: None)
    monkeypatch.setattr(run_events, "CURSOR_IS", "id = ? AND ?::BIGINT IS NULL")
    for write in _clear_writes(clear, run):
        write()
    leaked = {table for table, _ in _leaks(keyed, "s")}
    assert leaked == {c.table for c in OURS}


def _missed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The archive upsert's read of an item's row misses it once, as one that
    a concurrent transaction inserted would be missed: the upsert seals the
    item for a new number while the row keeps its own."""
    from turnkeeper.storage.ops import archives

    real, fired = archives.keyed, []

    def keyed(key: str, rest: str, *args: Any) -> str:
        found = str(real(key, rest, *args))
        if "item_key" in rest and not fired:
            fired.append(rest)
            return f"({found}) AND FALSE"
        return found

    monkeypatch.setattr(archives, "keyed", keyed)


def test_an_item_sealed_for_a_number_its_row_did_not_keep_is_retried(enc, monkeypatch):
    ids = _work(enc)
    _missed_once(monkeypatch)
    again = enc.archives.save_item(
        ResponseItem("s", "s-rt", "message", {"text": "new"}, item_id="it-1")
    )
    assert again.id == ids["response_item"]
    monkeypatch.undo()
    assert [i.sanitized for i in enc.archives.items("s", "s-rt")] == [{"text": "new"}]


def test_control_without_the_kept_number_check_the_item_no_longer_opens(enc, monkeypatch):
    """Control: without ``archives.kept`` the upsert writes the item sealed for
    the number it took into the row that kept its own: the save's read-back
    of the row refuses it (the transaction rolls back) instead of a retry."""
    from turnkeeper.storage.ops import archives

    ids = _work(enc)
    monkeypatch.setattr(archives, "kept", lambda *args: None)
    _missed_once(monkeypatch)
    with pytest.raises(turnkeeper.PayloadAuthenticationError) as refused:  # its read-back
        enc.archives.save_item(
            ResponseItem("s", "s-rt", "message", {"text": "new"}, item_id="it-1")
        )
    assert refused.value.record_id == str(ids["response_item"])


def test_rotating_and_encrypting_a_session_reseal_every_sealed_column(enc, tmp_path: Path):
    """``sessions.rotate_key`` walks every column of ``columns.SEALED``
    (numeric record ids among them: ``response_turns``, ``response_items``),
    and ``sessions.encrypt`` seals a clear session's: each value reads back
    through the API afterwards, and none is left under the old version or
    clear."""
    from turnkeeper.storage.crypto.seal import key_version, text_bytes

    ids = _work(enc)
    assert enc.sessions.rotate_key("s") == 2
    for c in OURS:
        for row in _stored(enc, c.table, "s"):
            if row[c.column] is not None:
                assert key_version(text_bytes(row[c.column]) or b"") == 2, (c.table, c.column)
    with reopen(enc, encryption=TEST_KEYS) as s:
        assert s.tools.get(ids["key"]).result == {"stdout": SECRET}
        assert s.runs.intent(ids["intent"]).request == {"prompt": SECRET}
        assert {e.id: e.data for e in s.runs.events("s")}[ids["event"]] == {"text": SECRET}
        assert [g.guidance for g in s.guidance.list("s")] == [SECRET]
        assert [e.data for e in s.resources.events("s")] == [{"path": SECRET}]
        assert s.archives.get_turn("s", "s-rt").request_summary == {"q": SECRET}
        assert [i.sanitized for i in s.archives.items("s", "s-rt")] == [{"text": SECRET}]
    (tmp_path / "clear").mkdir()
    clear = open_backend(enc_engine(enc), tmp_path / "clear", None)
    try:
        cids = _work(clear, "c")
        with reopen(clear, encryption=TEST_KEYS) as keyed:
            assert keyed.sessions.encrypt("c") is True
            assert _leaks(keyed, "c") == []
            assert keyed.tools.get(cids["key"]).result == {"stdout": SECRET}
            assert [i.sanitized for i in keyed.archives.items("c", "c-rt")] == [{"text": SECRET}]
    finally:
        close_backend(clear)


def enc_engine(store: Any) -> str:
    return "duckdb" if isinstance(store, turnkeeper.DuckDBStore) else "postgres"
