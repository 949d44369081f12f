"""Ids are bounded alike on both backends (``codec.MAX_ID_BYTES``).

Found reviewing the PostgreSQL backend: an id above about 1.4 KB of random
text failed there with ``OperationalError`` (PostgreSQL's btree refuses a key
above 2704 bytes: "I/O, locks, resources", which a runtime may retry for
ever), while DuckDB stored it. Now an id over the bound is bad input, refused
with ``InvalidInputError`` before anything is written on both; ids at the
bound, in the keys that hold two of them and in what the store derives from
them, are stored on both.
"""

from __future__ import annotations

import random

import pytest

from turnkeeper import (
    DeliveryPlan,
    DeliveryStep,
    EntryKind,
    FinalizeRequest,
    InvalidInputError,
    ThreadRecord,
)
from turnkeeper.formats import pi
from turnkeeper.storage.codec import MAX_ID_BYTES, MAX_TARGET_BYTES

MSG = {"message": {"role": "user", "content": "x"}}


def dense(size: int, seed: int, escapes: bool = False) -> str:
    """``size`` bytes of UTF-8 that compress badly (random CJK characters, 3 bytes
    each); with ``escapes`` every other one is U+E000, which PostgreSQL's text
    code stores in twice its bytes."""
    rng = random.Random(seed)
    chars = []
    while sum(len(c.encode()) for c in chars) + 3 <= size:
        odd = escapes and len(chars) % 2 == 1
        chars.append("\ue000" if odd else chr(rng.randrange(0x4E00, 0x9FFF)))
    text = "".join(chars)
    return text + "a" * (size - len(text.encode()))


TOO_LONG = "k" * (MAX_ID_BYTES + 1)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.sessions.create(TOO_LONG), "session_id"),
        (lambda s: s.sessions.create(dense(MAX_ID_BYTES + 3, 1)), "session_id"),
        (lambda s: s.sessions.append("ok", EntryKind.MESSAGE, MSG, entry_id=TOO_LONG), "entry_id"),
        (lambda s: s.leases.acquire("t" * (MAX_TARGET_BYTES + 1), "o", 30), "target"),
        (lambda s: s.leases.acquire(f"session:{TOO_LONG}", "o", 30), "target (its session id)"),
        (lambda s: s.leases.acquire("session:ok", TOO_LONG, 30), "owner"),
        (lambda s: s.threads.finalize(FinalizeRequest(ThreadRecord(TOO_LONG, "k"))), "record.id"),
        (lambda s: s.threads.finalize(FinalizeRequest(ThreadRecord("r", TOO_LONG))), "record.key"),
        (
            lambda s: s.tools.claim(
                TOO_LONG,
                "ok",
                local_turn_id="t",
                provider_call_id="c",
                tool_name="x",
                side_effecting=False,
            ),
            "execution_key",
        ),
        (lambda s: s.runs.admit("ok", {"q": 1}, submission_key=TOO_LONG), "submission_key"),
    ],
)
def test_an_id_over_the_bound_is_refused_on_both_backends(store, call, field):
    store.sessions.create("ok")
    with pytest.raises(InvalidInputError) as err:
        call(store)
    assert err.value.field == field
    assert "at most" in str(err.value)
    assert store.sessions.count() == 1 and store.sessions.entries("ok") == []
    assert store.query("SELECT count(*) AS n FROM leases").to_pylist() == [{"n": 0}]


def test_ids_at_the_bound_are_stored_in_every_key_on_both_backends(store):
    """Two ids at the bound in one key (a session's and its entry's), each of
    dense text, one of them half escapes: what PostgreSQL's btree must hold."""
    sid, eid = dense(MAX_ID_BYTES, 2, escapes=True), dense(MAX_ID_BYTES, 3)
    assert len(sid.encode()) == len(eid.encode()) == MAX_ID_BYTES
    store.sessions.create(sid)
    lease = store.leases.acquire(f"session:{sid}", dense(MAX_ID_BYTES, 4), 60)
    first = store.sessions.append(sid, EntryKind.MESSAGE, MSG, entry_id=eid, lease=lease)
    store.sessions.append_many(sid, [(EntryKind.MESSAGE, MSG)] * 2, lease=lease)
    assert store.sessions.entry(sid, eid) == first
    assert store.sessions.entries(sid)[0].id == eid
    assert len(store.sessions.replay(sid).messages) == 3
    record = ThreadRecord(dense(MAX_ID_BYTES, 5), dense(MAX_ID_BYTES, 6, escapes=True))
    store.threads.finalize(FinalizeRequest(record, key=record.key, rebind_active=True))
    assert store.threads.resolve(key=record.key) is not None


def test_what_the_store_derives_from_ids_at_the_bound_can_be_passed_back(store):
    """An interrupted tool result's entry id is derived from its execution key,
    a delivery operation's id from its step key: at the bound they would not
    be ids, so the part is spelled as its digest, and both can be looked up."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message={"role": "user", "content": "go"})
    store.runs.start(run.id)
    call_id = dense(MAX_ID_BYTES, 7)
    blocks = [{"type": "toolCall", "id": call_id, "name": "bash", "arguments": {}}]
    assistant = {"role": "assistant", "content": blocks, "stopReason": "toolUse"}
    store.sessions.append("s", EntryKind.MESSAGE, {"message": assistant})
    key = dense(MAX_ID_BYTES, 8)
    store.tools.claim(
        key,
        "s",
        local_turn_id=run.turn_id,
        provider_call_id=call_id,
        tool_name="bash",
        side_effecting=True,
        run_id=run.id,
    )
    step = DeliveryStep(dense(MAX_ID_BYTES, 9), "msg")
    store.runs.finish(run.id, "interrupted", delivery_plan=DeliveryPlan("chat", "t", (step,)))
    results = [
        e for e in store.sessions.entries("s") if e.payload.get("message", {}).get("toolCallId")
    ]
    assert len(results) == 1
    assert results[0].id.startswith("sha256-") and results[0].id.endswith(":interrupted")
    assert store.sessions.entry("s", results[0].id) == results[0]
    _, (op,) = store.outbox.get_plan(f"{run.id}:delivery")
    assert ":sha256-" in op.id and op.key == step.key
    claimed = store.outbox.claim(op.id, "courier", 30)
    assert claimed.id == op.id


def test_a_pi_record_whose_id_is_not_an_id_is_kept_opaque(store, tmp_path):
    """A file's record with an id over the bound (or with a control character)
    cannot be a tree entry: it is kept as an opaque line, the rest imported."""
    long_id = "e" * (MAX_ID_BYTES + 1)
    lines = [
        '{"type":"session","version":3,"id":"f","timestamp":"2026-01-01T00:00:00Z","cwd":"/"}',
        '{"type":"message","id":"a","parentId":null,"timestamp":"2026-01-01T00:00:01Z",'
        '"message":{"role":"user","content":"hi"}}',
        f'{{"type":"message","id":"{long_id}","parentId":"a",'
        '"timestamp":"2026-01-01T00:00:02Z","message":{"role":"user","content":"long"}}',
        '{"type":"message","id":"b\\u0007","parentId":"a",'
        '"timestamp":"2026-01-01T00:00:03Z","message":{"role":"user","content":"bell"}}',
    ]
    path = tmp_path / "f.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = pi.import_file(store, path)
    assert [e.id for e in store.sessions.entries(report.session_id)] == ["a"]
    assert sorted(i.kind for i in report.issues) == ["opaque", "opaque"]
