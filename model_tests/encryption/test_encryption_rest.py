"""Encryption at rest (issue 23): the copies of users' text outside
``entries.payload`` sealed under the session's data key (opaque import
lines, replay snapshots, ...).

Each failure test flips, moves or forges stored values with SQL, as someone
with the database (or a backup) in hand would; a control test patches the
sealing out to show the stored-value test can fail.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_KEYS, forged_rows, reopen

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.spec.delivery import DeliveryPlan, DeliveryStep
from turnkeeper.spec.records import (
    CapabilityEvent,
    Guidance,
    ImportBatch,
    ImportEntry,
    InputResourceEvent,
    OpaqueRecord,
    ResponseItem,
    ResponseTurn,
)
from turnkeeper.storage.crypto.columns import SEALED
from turnkeeper.storage.ops import imports, replay_snapshots

SECRET = "the launch code is 0000"
MSG = {"message": {"role": "user", "content": SECRET}}
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SRC = "/home/u/s.jsonl"


def _flipped(text: str) -> str:
    """A sealed text value with one byte of its ciphertext flipped."""
    raw = bytearray(base64.b64decode(text.removeprefix("enc1:")))
    raw[len(raw) // 2] ^= 1
    return "enc1:" + base64.b64encode(bytes(raw)).decode()


def _refused(call: Any, sid: str, record: str, field: str) -> None:
    with pytest.raises(turnkeeper.PayloadAuthenticationError) as refused:
        call()
    assert (refused.value.session_id, refused.value.record_id, refused.value.field) == (
        sid,
        record,
        field,
    )


# -- opaque_records.raw -------------------------------------------------------------


def _import_opaque(store: Any, sid: str = "imp", *lines: int) -> turnkeeper.ImportResult:
    """An import whose lines ``lines`` are opaque: a well-formed message that
    repeats an id (kept whole, as the importers keep it) holding the secret."""
    body = {"type": "message", "id": "i1", "message": {"role": "user", "content": SECRET}}
    dup = json.dumps(body)
    return store.sessions.import_batch(
        ImportBatch(
            session_id=sid,
            cwd="/w",
            created_at=T0,
            header={},
            entries=[ImportEntry("i1", None, EntryKind.MESSAGE, T0, MSG)],
            leaf_id="i1",
            opaque=[
                OpaqueRecord(SRC, n, f"{n}:{dup}", "message entry i1: duplicate entry id")
                for n in lines
            ],
            source=SRC,
        )
    )


def _raw(store: Any, sid: str = "imp") -> dict[int, str]:
    rows = store.query(
        "SELECT line, raw FROM opaque_records WHERE session_id = ? ORDER BY line", [sid]
    ).to_pylist()
    return {r["line"]: r["raw"] for r in rows}


def test_opaque_lines_are_stored_sealed_and_read_back_clear(enc):
    first = _import_opaque(enc, "imp", 2, 3)
    assert first.opaque_added == 2
    stored = _raw(enc)
    assert set(stored) == {2, 3}
    assert all(v.startswith("enc1:") and SECRET not in v for v in stored.values()), stored
    # a re-import compares lines, not text: nothing added, nothing resealed
    again = _import_opaque(enc, "imp", 2, 3, 4)
    assert (again.added, again.opaque_added) == (0, 1)
    assert {k: v for k, v in _raw(enc).items() if k != 4} == stored
    with reopen(enc, encryption=TEST_KEYS) as fresh:  # a cold key cache
        got = fresh.sessions.opaque_records("imp")
    assert [(o.source, o.line, o.reason) for o in got] == [
        (SRC, n, "message entry i1: duplicate entry id") for n in (2, 3, 4)
    ]
    assert all(o.raw.startswith(f"{o.line}:") and SECRET in o.raw for o in got)
    assert any(c.table == "opaque_records" and c.field == imports.RAW for c in SEALED)


def test_a_flipped_moved_or_clear_opaque_line_fails_authentication(enc):
    _import_opaque(enc, "imp", 2, 3)
    _import_opaque(enc, "other", 2)
    stored, elsewhere = _raw(enc), _raw(enc, "other")
    read = lambda: enc.sessions.opaque_records("imp")  # noqa: E731
    # a flipped byte of line 2's ciphertext
    body = _flipped(stored[2])
    assert forged_rows(
        enc, "UPDATE opaque_records SET raw = ? WHERE session_id = 'imp' AND line = 2", [body]
    )
    _refused(read, "imp", f"{SRC}:2", "raw")
    # line 3's value moved to line 2 (same session, same file)
    assert forged_rows(
        enc, "UPDATE opaque_records SET raw = ? WHERE session_id = 'imp' AND line = 2", [stored[3]]
    )
    _refused(read, "imp", f"{SRC}:2", "raw")
    # the same line of another session
    assert forged_rows(
        enc,
        "UPDATE opaque_records SET raw = ? WHERE session_id = 'imp' AND line = 2",
        [elsewhere[2]],
    )
    _refused(read, "imp", f"{SRC}:2", "raw")
    # the same line and session, another file
    assert forged_rows(
        enc,
        "UPDATE opaque_records SET raw = ?, source = 'b.jsonl' "
        "WHERE session_id = 'imp' AND line = 2",
        [stored[2]],
    )
    _refused(read, "imp", "b.jsonl:2", "raw")
    # a clear value in a sealed session (a downgrade)
    assert forged_rows(
        enc,
        "UPDATE opaque_records SET raw = 'forged', source = ? "
        "WHERE session_id = 'imp' AND line = 2",
        [SRC],
    )
    _refused(read, "imp", f"{SRC}:2", "raw")
    assert forged_rows(
        enc, "UPDATE opaque_records SET raw = ? WHERE session_id = 'imp' AND line = 2", [stored[2]]
    )
    assert [o.line for o in read()] == [2, 3]


def test_opaque_lines_of_a_sealed_session_are_refused_without_the_key(enc):
    _import_opaque(enc, "imp", 2)
    before = _raw(enc)
    with reopen(enc) as bare:
        assert bare.sessions.get("imp") is not None  # metadata still served
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            bare.sessions.opaque_records("imp")
        assert (refused.value.session_id, refused.value.key_id) == ("imp", None)
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            _import_opaque(bare, "imp", 2, 5)  # only a new opaque line to write
        assert (refused.value.session_id, refused.value.key_id) == ("imp", None)
    assert _raw(enc) == before  # nothing written


# -- replay snapshots -----------------------------------------------------------------


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every replay that read a row stores its snapshot; counts the snapshots served."""
    monkeypatch.setattr(replay_snapshots, "PERSIST_ROWS", 1)
    served: list[int] = []
    real = replay_snapshots.load

    def counted(tx: Any, session_id: str, head: Any) -> Any:
        got = real(tx, session_id, head)
        served.append(0 if got is None else 1)
        return got

    monkeypatch.setattr(replay_snapshots, "load", counted)
    return served


def _cold(store: Any, **kwargs: Any) -> Any:
    return reopen(store, replay_cache_bytes=0, **kwargs)


def _parts(store: Any, sid: str) -> list[bytes]:
    rows = store.db.read(
        "parts",
        lambda tx: tx.rows(
            "SELECT body FROM replay_snapshots WHERE session_id = ? ORDER BY part",
            [sid],
            binary=True,
        ),
    )
    return [bytes(r[0]) for r in rows]


def _put_part(store: Any, sid: str, body: bytes, **header: Any) -> None:
    """Replace part 0 of ``sid`` by ``body`` (and header values), with the
    digest its header and body have: as a writer of the database would."""

    def write(tx: Any) -> None:
        part_key = replay_snapshots.key(sid, 0)
        row = tx.one(
            "SELECT parts, format, leaf_id, next_seq, rooted, model, thinking "
            "FROM replay_snapshots WHERE part_key = ?",
            [part_key],
        )
        names = ("parts", "format", "leaf_id", "next_seq", "rooted", "model", "thinking")
        values = dict(zip(names, row, strict=True)) | header
        stored = replay_snapshots.Stored(**values, first=None)
        digest = replay_snapshots._digest(sid, 0, stored, body)
        tx.exec(
            "UPDATE replay_snapshots SET body = ?, digest = ?, leaf_id = ?, next_seq = ? "
            "WHERE part_key = ?",
            [body, digest, values["leaf_id"], values["next_seq"], part_key],
        )

    store.db.write("forge", write)


def _snapshotted(store: Any, sid: str, n: int = 3) -> Any:
    store.sessions.create(sid, cwd="/w")
    for i in range(n):
        store.sessions.append(
            sid, EntryKind.MESSAGE, {"message": {"role": "user", "content": f"{SECRET} {i}"}}
        )
    with _cold(store, encryption=TEST_KEYS) as cold:
        want = cold.sessions.replay(sid)  # reads the rows, stores the snapshot
    return want


def test_a_sealed_sessions_snapshot_is_stored_sealed_and_served(enc, loads):
    want = _snapshotted(enc, "s")
    (body,) = _parts(enc, "s")
    assert body.startswith(b"TKE1") and SECRET.encode() not in body
    assert any(c.table == "replay_snapshots" and c.binary for c in SEALED)
    loads.clear()
    with _cold(enc, encryption=TEST_KEYS) as cold:
        assert cold.sessions.replay("s") == want
    assert loads == [1]  # served from the sealed snapshot, not the rows


def test_a_flipped_moved_stale_or_clear_snapshot_part_is_not_served(enc, loads):
    """A snapshot is a cache: a part that does not open (a flipped byte, another
    session's part, one sealed under a key version the session no longer
    holds, a clear part in a sealed session; each with its digest made to
    match) is not served: the replay reads the rows, each authenticated, and
    stores a new sealed snapshot in its place (attack finding on issue 23,
    part 2: a stale or clear part failed every cold replay and was never
    replaced). ``turnkeeper audit`` names such a part (test_audit_sealed)."""
    want = _snapshotted(enc, "s")
    _snapshotted(enc, "t")
    (body,) = _parts(enc, "s")
    (other,) = _parts(enc, "t")
    import ormsgpack
    import zstandard

    clear = zstandard.compress(ormsgpack.packb([["x"], [{"role": "user", "content": "forged"}]]))
    flipped = body[:-1] + bytes([body[-1] ^ 1])
    stale = body[:4] + (7).to_bytes(4, "big") + body[8:]  # a version the session never had
    for bad in (flipped, other, stale, clear):
        _put_part(enc, "s", bad)
        loads.clear()
        with _cold(enc, encryption=TEST_KEYS) as cold:
            assert cold.sessions.replay("s") == want
        assert loads == [0]  # not served: read from the rows
        (replaced,) = _parts(enc, "s")
        assert replaced != bad and replaced.startswith(b"TKE1")
        loads.clear()
        with _cold(enc, encryption=TEST_KEYS) as cold:
            assert cold.sessions.replay("s") == want
        assert loads == [1]  # the new snapshot is served


def test_a_snapshot_header_moved_to_a_newer_branch_is_not_served(enc, loads):
    """The sealed part binds its header: an old snapshot relabelled with the
    session's current leaf and next_seq (recomputed digest) would serve a
    stale replay as if whole; it is read from the rows instead."""
    _snapshotted(enc, "s")
    enc.sessions.append("s", EntryKind.MESSAGE, {"message": {"role": "user", "content": "later"}})
    row = enc.sessions.get("s")
    _put_part(enc, "s", _parts(enc, "s")[0], leaf_id=row.leaf_id, next_seq=row.next_seq)
    loads.clear()
    with _cold(enc, encryption=TEST_KEYS) as cold:
        got = cold.sessions.replay("s")
    assert got.messages[-1]["content"] == "later"
    assert loads[0] == 0


def test_control_without_the_bound_header_the_stale_snapshot_is_served(enc, loads, monkeypatch):
    monkeypatch.setattr(replay_snapshots, "_bound", lambda sid, part, stored: b"\0\0\0\0")
    with pytest.raises(AssertionError):
        test_a_snapshot_header_moved_to_a_newer_branch_is_not_served(enc, loads)


def test_a_sealed_snapshot_is_refused_without_the_key(enc, loads):
    _snapshotted(enc, "s")
    with _cold(enc) as bare:
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            bare.sessions.replay("s")
        assert (refused.value.session_id, refused.value.key_id) == ("s", None)


# -- the JSON and text columns of a session's rows (crypto/fields.py) ------------------


@dataclass(frozen=True)
class Column:
    """A sealed column (as ``columns.SEALED`` lists it), how the API writes it
    (once per session) and reads it back in clear (the readers in a tuple)."""

    table: str
    column: str
    write: Callable[[Any, str], object]
    read: Callable[[Any, str], Any]
    clear: str = '{"forged": 1}'


def _delivery(store: Any, sid: str) -> None:
    run = store.runs.admit(sid, {"q": 1}, user_message={"role": "user", "content": "go"})
    store.runs.start(run.id)
    context = {"token": SECRET}
    plan = DeliveryPlan(
        "chat", "room", (DeliveryStep("send", "message"),), transport_context=context
    )
    reply = {"role": "assistant", "content": "ok"}
    store.runs.finish(run.id, "succeeded", assistant_message=reply, delivery_plan=plan)


def _intent(store: Any, sid: str) -> Any:
    (intent_id,) = [
        r["id"]
        for r in store.query(
            "SELECT id FROM delivery_intents WHERE session_id = ?", [sid]
        ).to_pylist()
    ]
    return store.outbox.get_plan(intent_id)[0].transport_context


def _turn(sid: str, **kw: Any) -> ResponseTurn:
    return ResponseTurn(
        sid, "t:1", "openai", "openai-responses", "gpt-x", "replay", "completed", **kw
    )


def _item(sid: str) -> ResponseItem:
    text = [{"type": "output_text", "text": SECRET}]
    body = {"type": "message", "role": "assistant", "content": text}
    return ResponseItem(sid, "t:1", "message", body, item_id="it", output_index=0)


COLUMNS = {
    "capability_events.data": Column(
        "capability_events",
        "data",
        lambda s, sid: s.capabilities.record_event(
            CapabilityEvent(sid, "web_search", "enabled", id=f"{sid}-cap", data={"q": SECRET})
        ),
        lambda s, sid: (s.capabilities.events(sid)[0].event.data,),
    ),
    "input_resource_events.data": Column(
        "input_resource_events",
        "data",
        lambda s, sid: s.resources.record_event(
            InputResourceEvent(sid, "file-1", "attached", id=f"{sid}-res", data={"text": SECRET})
        ),
        lambda s, sid: (s.resources.events(sid)[0].data,),
    ),
    "esm_guidance.guidance": Column(
        "esm_guidance",
        "guidance",
        lambda s, sid: s.guidance.save(Guidance(f"{sid}-g", sid, SECRET)),
        lambda s, sid: (s.guidance.list(sid)[0].guidance,),
        clear="forged",
    ),
    "response_turns.request_summary": Column(
        "response_turns",
        "request_summary",
        lambda s, sid: s.archives.save_turn(_turn(sid, request_summary={"input": SECRET})),
        lambda s, sid: (s.archives.get_turn(sid, "t:1").request_summary,),
    ),
    "response_turns.response_summary": Column(
        "response_turns",
        "response_summary",
        lambda s, sid: s.archives.save_turn(_turn(sid, response_summary={"output": SECRET})),
        lambda s, sid: (s.archives.get_turn(sid, "t:1").response_summary,),
    ),
    "response_items.sanitized": Column(
        "response_items",
        "sanitized",
        lambda s, sid: (s.archives.save_turn(_turn(sid)), s.archives.save_item(_item(sid))),
        lambda s, sid: (
            s.archives.items(sid, "t:1")[0].sanitized,
            s.archives.replay_items(sid)[0],
            s.archives.replay_turns(sid)[0].items[0],
        ),
    ),
    "delivery_intents.transport_context": Column(
        "delivery_intents", "transport_context", _delivery, lambda s, sid: (_intent(s, sid),)
    ),
}


def _sealed(case: Column) -> Any:
    (found,) = [c for c in SEALED if (c.table, c.column) == (case.table, case.column)]
    return found


def _stored(store: Any, case: Column, sid: str) -> tuple[str, str]:
    """The row's record id (by ``SEALED``'s expression) and stored value."""
    col = _sealed(case)
    sql = f"SELECT {col.record} AS r, {col.column} AS v FROM {col.table} WHERE {col.session} = ?"
    (row,) = store.query(sql, [sid]).to_pylist()
    return str(row["r"]), row["v"]


def _set(store: Any, case: Column, sid: str, value: str) -> None:
    col = _sealed(case)
    assert forged_rows(
        store, f"UPDATE {col.table} SET {col.column} = ? WHERE {col.session} = ?", [value, sid]
    )


@pytest.mark.parametrize("name", list(COLUMNS))
def test_a_sessions_column_is_stored_sealed_and_fails_closed(enc, name):
    case = COLUMNS[name]
    field = _sealed(case).field
    for sid in ("s", "other", "w"):
        enc.sessions.create(sid, cwd="/w")
        case.write(enc, sid)
    record, stored = _stored(enc, case, "s")
    assert stored.startswith("enc1:") and SECRET not in stored, stored
    with reopen(enc, encryption=TEST_KEYS) as fresh:  # a cold key cache
        for got in case.read(fresh, "s"):
            assert SECRET in json.dumps(got), got
        reads = lambda: case.read(fresh, "s")  # noqa: E731
        body = _flipped(stored)
        _set(enc, case, "s", body)  # a flipped byte
        _refused(reads, "s", record, field)
        _set(enc, case, "s", _stored(enc, case, "other")[1])  # moved from another session
        _refused(reads, "s", record, field)
        _set(enc, case, "s", case.clear)  # a clear value in a sealed session
        _refused(reads, "s", record, field)
        _set(enc, case, "s", stored)
        assert case.read(fresh, "s")
    with reopen(enc) as bare:
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            case.read(bare, "s")
        assert (refused.value.session_id, refused.value.key_id) == ("s", None)
        with pytest.raises(turnkeeper.KeyUnavailableError):
            case.write(bare, "w")  # (again: its stored row is opened, or a new one sealed)


def test_a_clear_store_keeps_these_columns_clear(tmp_path: Path):
    with turnkeeper.open_store(str(tmp_path / "c.duckdb")) as clear:
        for name, case in COLUMNS.items():
            sid = name.replace(".", "-").replace("_", "-")
            clear.sessions.create(sid, cwd="/w")
            case.write(clear, sid)
            assert SECRET in _stored(clear, case, sid)[1]
            assert all(SECRET in json.dumps(got) for got in case.read(clear, sid))


# -- rotation and encrypt walk these columns (columns.SEALED) ---------------------------------

MINE = {
    name: COLUMNS[name] for name in ("capability_events.data", "delivery_intents.transport_context")
}


def _every_copy(store: Any, sid: str) -> None:
    """Opaque lines, a stored snapshot and the columns of :data:`MINE` of ``sid``."""
    _import_opaque(store, sid, 2)
    for case in MINE.values():
        case.write(store, sid)
    with _cold(store, encryption=TEST_KEYS) as cold:
        cold.sessions.replay(sid)


def _read_every_copy(store: Any, sid: str) -> None:
    assert SECRET in store.sessions.opaque_records(sid)[0].raw
    for case in MINE.values():
        assert all(SECRET in json.dumps(got) for got in case.read(store, sid))
    assert store.sessions.replay(sid).messages


def test_rotating_a_sessions_key_reseals_these_columns(enc, loads):
    _every_copy(enc, "imp")
    before = {**_raw(enc, "imp"), **{n: _stored(enc, c, "imp")[1] for n, c in MINE.items()}}
    assert enc.sessions.rotate_key("imp") == 2
    after = {**_raw(enc, "imp"), **{n: _stored(enc, c, "imp")[1] for n, c in MINE.items()}}
    assert after.keys() == before.keys()
    assert all(after[k] != before[k] and after[k].startswith("enc1:") for k in after)
    for body in _parts(enc, "imp"):  # a snapshot kept is sealed under the new version
        assert body.startswith(b"TKE1") and int.from_bytes(body[4:8], "big") == 2
    with _cold(enc, encryption=TEST_KEYS) as fresh:
        _read_every_copy(fresh, "imp")


def test_encrypting_a_clear_session_seals_these_columns(tmp_path: Path, loads):
    path = str(tmp_path / "late.duckdb")
    with turnkeeper.open_store(path) as clear:
        _every_copy(clear, "imp")
        assert SECRET in _raw(clear, "imp")[2]
        assert [b[:4] for b in _parts(clear, "imp")] == [b"\x28\xb5\x2f\xfd"]  # a clear frame
    with turnkeeper.open_store(path, encryption=TEST_KEYS) as enc:
        assert enc.sessions.encrypt("imp") is True
        assert all(v.startswith("enc1:") for v in _raw(enc, "imp").values())
        for case in MINE.values():
            assert _stored(enc, case, "imp")[1].startswith("enc1:")
        assert all(b.startswith(b"TKE1") for b in _parts(enc, "imp"))  # (none clear left)
    with turnkeeper.open_store(path, encryption=TEST_KEYS, replay_cache_bytes=0) as fresh:
        _read_every_copy(fresh, "imp")
