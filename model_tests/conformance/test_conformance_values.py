"""Every value round-trips exactly, on every backend.

NUL (U+0000) is legal in turnkeeper text and JSON payloads: PostgreSQL's
``text`` and ``jsonb`` cannot hold it, and other stores lost whole turns to
it. So every text column and payload is tried with it (and with the
private-use characters the PostgreSQL backend's code uses), with large
payloads (tens of MB), deep JSON, extreme numbers and microsecond
timestamps in other time zones.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind, FinalizeRequest, ThreadRecord
from turnkeeper.spec.records import ImportBatch, ImportEntry, OpaqueRecord


@pytest.fixture
def store(any_store: Any) -> Any:
    """Each backend, called directly and through ``turnkeeper.aio`` (conftest's ``any_store``)."""
    return any_store


TRICKY = [
    "\x00",
    "a\x00b",
    "\x00\x00\x00",
    "\ue000",
    "\ue000\ue001",
    "\ue000\x00\ue000",
    "\ue001\ue000",
    "tab\tnew\nline\r",
    "日本語のテキスト",
    "emoji 🦆🏳️‍🌈",
    "back\\slash 'quote' \"dq\" %s ? $1 :x",
    "",
]


def deep(levels: int):
    value: object = "bottom\x00"
    for i in range(levels):
        value = {"level": i, "next": [value]}
    return value


@pytest.mark.parametrize("text", TRICKY)
def test_text_round_trips_in_every_column_that_holds_it(store, text):
    sid = "s"
    store.sessions.create(sid, cwd=f"/work/{text}", header={"note": text})
    store.sessions.set_title(sid, f"title {text}")
    payload = {"message": {"role": "user", "content": text, "extra": [text, {text: text}]}}
    entry = store.sessions.append(sid, EntryKind.MESSAGE, payload)
    session = store.sessions.get(sid)
    assert session.cwd == f"/work/{text}" and session.header == {"note": text}
    assert session.title == f"title {text}"
    assert store.sessions.entry(sid, entry.id).payload == payload
    assert store.sessions.replay(sid).messages[0]["content"] == text
    store.sessions.set_label(sid, entry.id, f"label {text}")
    assert store.sessions.labels(sid) == {entry.id: f"label {text}"}
    run = store.runs.admit(sid, {"q": text}, user_message={"role": "user", "content": text})
    store.runs.start(run.id)
    store.tools.claim(
        "k", sid, local_turn_id=run.turn_id, provider_call_id="c", tool_name="t",
        side_effecting=False, arguments={"a": text}, run_id=run.id,
        provider_metadata={"m": text},
    )  # fmt: skip
    done = store.tools.complete("k", {"out": text})
    assert done.result == {"out": text} and done.provider_metadata == {"m": text}
    plan = DeliveryPlan("chat", "room", steps=(DeliveryStep("send", "message"),),
                        transport_context={"t": text})  # fmt: skip
    ended = store.runs.finish(run.id, "failed", error=f"error {text}", delivery_plan=plan,
                             stop_reason=f"stop {text}")  # fmt: skip
    assert store.runs.get(run.id).error == f"error {text}" == ended.error
    op = store.outbox.list_due()[0]
    claim = store.outbox.claim(op.id, "o", 30)
    store.outbox.finish(op.id, "o", claim.lease_epoch, "failed", failure_code=f"f{text}")
    assert store.outbox.get_operation(op.id).failure_code == f"f{text}"
    rec = store.threads.finalize(FinalizeRequest(ThreadRecord("r", "key", state={"s": text})))
    assert rec.state == {"s": text} and store.threads.resolve(id="r").state == {"s": text}


def test_an_imported_raw_line_with_nul_is_kept_exactly(store):
    when = datetime(2026, 1, 1, tzinfo=UTC)
    raw = '{"type":"message","glued\x00":true}{"broken'
    message = {"message": {"role": "user", "c": "\x00"}}
    batch = ImportBatch(
        "imp", "/w\x00", when, {"h": "\x00"},
        [ImportEntry("e1", None, EntryKind.MESSAGE, when, message)],
        "e1", opaque=[OpaqueRecord("f.jsonl", 2, raw, "glued\x00")], source="f.jsonl",
    )  # fmt: skip
    store.sessions.import_batch(batch)
    (kept,) = store.sessions.opaque_records("imp")
    assert (kept.raw, kept.reason) == (raw, "glued\x00")
    assert store.sessions.entries("imp")[0].payload == {"message": {"role": "user", "c": "\x00"}}
    assert store.sessions.get("imp").cwd == "/w\x00"


def test_a_payload_of_tens_of_megabytes_round_trips(store):
    store.sessions.create("big")
    text = ("0123456789abcdef\x00" * (24 * 1024 * 1024 // 17))[: 24 * 1024 * 1024]
    payload = {"message": {"role": "user", "content": text}}
    entry = store.sessions.append("big", EntryKind.MESSAGE, payload)
    got = store.sessions.entry("big", entry.id).payload["message"]["content"]
    assert len(got) == len(text) and got == text


def test_deep_json_round_trips(store):
    store.sessions.create("deep")
    payload = {"message": {"role": "user", "content": "x", "tree": deep(120)}}
    entry = store.sessions.append("deep", EntryKind.MESSAGE, payload)
    assert store.sessions.entry("deep", entry.id).payload == payload


@pytest.mark.parametrize(
    "number", [2**63 - 1, -(2**63), 0, 0.1, 1e-300, 1.7976931348623157e308, 5e-324]
)
def test_extreme_numbers_round_trip(store, number):
    store.sessions.create("n")
    payload = {"message": {"role": "user", "content": "x", "n": number}}
    entry = store.sessions.append("n", EntryKind.MESSAGE, payload)
    got = store.sessions.entry("n", entry.id).payload["message"]["n"]
    assert got == number and type(got) is type(number)
    if isinstance(number, float):
        assert math.copysign(1.0, got) == math.copysign(1.0, number)


def test_timestamps_keep_microseconds_and_come_back_in_utc(store):
    store.sessions.create("t")
    zone = timezone(timedelta(hours=5, minutes=45))
    when = datetime(2031, 7, 9, 23, 59, 59, 999999, tzinfo=zone)
    entry = store.sessions.append("t", EntryKind.MESSAGE, {"message": USER}, timestamp=when)
    got = store.sessions.entry("t", entry.id).timestamp
    assert got == when and got.tzinfo is not None and got.utcoffset() == timedelta(0)
    assert got.microsecond == 999999


USER = {"role": "user", "content": "x"}
