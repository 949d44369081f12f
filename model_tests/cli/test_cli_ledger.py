"""``turnkeeper ledger append|replay|verify|gc|repair`` on both backends (the CLI
takes the PostgreSQL URL through ``--db``).

``verify`` must catch each kind of damage the stateful machine injects, each
forged with SQL straight into the database (``conftest.forge``): a flipped
byte in a record's payload, a truncated payload, a record stamped with a
stale epoch, a deleted record (a gap) and a lost tail, a flipped byte in a
blob, a deleted blob, a blob whose id is not its pointer's; it exits 1 and
names the typed error class, the sequence and the blob key. The replay
checks themselves are ``store.ledger``'s (``test_ledger.py``,
``test_ledger_blobs.py``); a control here patches the blob hash check out
and sees ``verify`` pass a damaged ledger.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import BACKENDS, forge, new_pg_schema, open_pg, reseal

import turnkeeper
from turnkeeper.cli import report_ledger
from turnkeeper.cli.main import cli
from turnkeeper.spec.ledger import LedgerEntry
from turnkeeper.storage.ops.ledger import blobs as blob_ops

THRESHOLD = "64"
BIG = bytes(range(256)) * 2  # 512 bytes: offloaded at THRESHOLD
SMALL = b'{"note": "inline"}'


def tk(*args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database (a DuckDB file, or a fresh PostgreSQL schema's URL) with
    the sessions ``s`` and ``t``, no ledger yet."""
    url = str(tmp_path / "cli.duckdb") if request.param == "duckdb" else new_pg_schema()
    with _open(url) as store:
        store.sessions.create("s")
        store.sessions.create("t")
    yield url


def _open(url: str) -> turnkeeper.BaseStore:
    return turnkeeper.open_store(url) if "://" not in url else open_pg(url)


def _append(db: str, sid: str, kind: str, payload: bytes, rid: str, *extra: str) -> dict[str, Any]:
    r = tk(
        "ledger", "append", sid, "--kind", kind, "--id", rid, "--db", db,
        "--offload-threshold", THRESHOLD, "--json", *extra, stdin=payload,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    return dict(json.loads(r.stdout))


def _ledger_of_s(db: str, *extra: str) -> None:
    """``s``: fence 1, SMALL at 2, fence 3, BIG (offloaded) at 4, SMALL again at 6."""
    assert _append(db, "s", "note", SMALL, "n1", *extra)["seq"] == 2
    assert _append(db, "s", "big", BIG, "b1", *extra)["seq"] == 4
    assert _append(db, "s", "note", b"last", "n2", *extra)["seq"] == 6


def _verify(db: str, *args: str) -> Result:
    return tk("ledger", "verify", *args, "--db", db)


def _damaged(result: Result, error: str, seq: int, key: str | None = None) -> str:
    """The DAMAGED line of ``s``, checked: exit 1, the error class, the sequence, the key."""
    assert result.exit_code == 1, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith("DAMAGED s:"))
    assert line.startswith(f"DAMAGED s: {error} at seq {seq}"), line
    if key is not None:
        assert f"(blob {key})" in line, line
    return line


def _pointer(db: str, seq: int) -> dict[str, Any]:
    with _open(db) as store:
        rows = store.query(
            "SELECT kind, payload FROM ledger_records WHERE session_id = 's' AND seq = ?", [seq]
        ).to_pylist()
    assert rows[0]["kind"] == "blobptr"
    return dict(json.loads(bytes(rows[0]["payload"])))


def _forge(db: str, sql: str, params: list[Any], rows: int = 1) -> None:
    with _open(db) as store:
        forge(store, sql, params, rows=rows)


# -- append and replay ------------------------------------------------------------------


def test_append_prints_the_sequence_and_a_redelivery_is_a_duplicate(db):
    first = _append(db, "s", "note", SMALL, "n1")
    assert (first["seq"], first["duplicate"]) == (2, False)  # 1 is the writer's fence
    again = _append(db, "s", "note", SMALL, "n1")
    assert (again["seq"], again["duplicate"]) == (2, True)
    plain = tk("ledger", "append", "s", "--kind", "note", "--db", db, stdin=b"hello")
    assert plain.exit_code == 0 and plain.stdout.startswith("s: seq 5, id sha256:"), plain.output
    rerun = tk("ledger", "append", "s", "--kind", "note", "--db", db, stdin=b"hello")
    assert "seq 5" in rerun.stdout and "duplicate" in rerun.stdout, rerun.output
    with _open(db) as store:  # released: another owner takes it at once
        assert store.leases.acquire("session:s", "next", 5.0).owner == "next"


def test_append_from_a_file_and_replay_as_jsonl_and_text(db, tmp_path):
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"\xff\x00raw")
    r = tk("ledger", "append", "s", "--kind", "raw", "--file", str(binary), "--db", db)
    assert r.exit_code == 0, r.output
    _append(db, "s", "big", BIG, "b1")
    lines = [json.loads(x) for x in tk("ledger", "replay", "s", "--db", db).stdout.splitlines()]
    assert [(x["seq"], x["kind"]) for x in lines] == [
        (1, "fence"), (2, "raw"), (3, "fence"), (4, "big"),
    ]  # fmt: skip
    assert lines[1]["encoding"] == "base64"
    assert base64.b64decode(lines[1]["payload"]) == b"\xff\x00raw"
    assert lines[3]["encoding"] == "base64" and base64.b64decode(lines[3]["payload"]) == BIG
    assert lines[3]["idempotency_id"] == "b1" and lines[3]["epoch"] == 2
    tail = tk("ledger", "replay", "s", "--from", "3", "--format", "text", "--db", db)
    assert tail.exit_code == 0, tail.output
    assert [x.split()[0:2] for x in tail.stdout.splitlines()] == [["3", "fence"], ["4", "big"]]
    assert "base64:" in tail.stdout


def test_append_under_a_lease_another_owner_holds_is_refused_and_writes_nothing(db):
    with _open(db) as store:
        store.leases.acquire("session:s", "someone-else", 60.0)
    r = tk("ledger", "append", "s", "--kind", "note", "--db", db, stdin=b"x")
    assert r.exit_code == 2 and r.stderr.startswith("turnkeeper: BusyError"), r.output
    with _open(db) as store:
        assert store.ledger.tip("s") == 0


def test_an_unknown_session_or_an_empty_ledger_is_refused(db):
    for args in (["append", "nope", "--kind", "k"], ["replay", "nope"], ["verify", "nope"]):
        r = tk("ledger", *args, "--db", db, stdin=b"x")
        assert r.exit_code == 2 and "SessionNotFoundError" in r.stderr, (args, r.output)
    r = _verify(db, "s")
    assert r.exit_code == 2 and "EmptySessionError" in r.stderr, r.output
    r = _verify(db)
    assert r.exit_code == 2 and "--all" in r.stderr, r.output


# -- verify: clean, and each kind of damage ------------------------------------------------


def test_verify_of_a_clean_ledger_prints_its_counts(db):
    _ledger_of_s(db)
    _append(db, "t", "note", b"t1", "t1")
    r = _verify(db, "--all")
    assert r.exit_code == 0, r.output
    blob_bytes = len(blob_ops.envelope(LedgerEntry("big", BIG, "b1")))
    payload = len(SMALL) + len(BIG) + len(b"last")
    assert r.stdout.splitlines() == [
        f"ok s: 6 records, {payload} bytes, 1 blobs ({blob_bytes} bytes)",
        "ok t: 2 records, 2 bytes, 0 blobs (0 bytes)",
    ]
    data = json.loads(_verify(db, "s", "--json").stdout)
    assert data["verified"] is True and data["verify"][0]["records"] == 6


def test_verify_catches_a_lowered_or_lost_tip_and_all_finds_a_tipless_ledger(db):
    """Failed before (attack on issue 19): a lowered tip verified ``ok`` with
    half the records, and ``--all`` skipped a ledger whose tip row was lost."""
    _ledger_of_s(db)
    _append(db, "t", "note", b"t1", "t1")
    _forge(db, "UPDATE ledger_tips SET seq = 3 WHERE session_id = 's'", [])
    r = _verify(db, "s")
    assert r.exit_code == 1 and r.stdout.startswith("DAMAGED s: ReplayReadError at seq 4"), r.output
    _forge(db, "DELETE FROM ledger_tips WHERE session_id = 't'", [])
    r = _verify(db, "--all")
    assert r.exit_code == 1, r.output
    assert any(
        line.startswith("DAMAGED t: ReplayReadError at seq 1") for line in r.stdout.splitlines()
    )


def test_verify_catches_a_flipped_byte_in_a_record_payload(db):
    _ledger_of_s(db)
    flipped = bytes([SMALL[0] ^ 1]) + SMALL[1:]
    _forge(
        db, "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 2", [flipped]
    )
    line = _damaged(_verify(db, "s"), "ReplayDecodeError", 2)
    assert "sha256" in line


def test_verify_catches_a_truncated_payload(db):
    _ledger_of_s(db)
    _forge(db, "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 6", [b"la"])
    _damaged(_verify(db, "s"), "ReplayDecodeError", 6)


def test_verify_catches_a_record_stamped_with_a_stale_epoch(db):
    _ledger_of_s(db)
    _forge(db, "UPDATE ledger_records SET epoch = 1 WHERE session_id = 's' AND seq = 6", [])
    line = _damaged(_verify(db, "s"), "ReplayDecodeError", 6)
    assert "record digest" in line  # the epoch is bound by the record's digest
    with _open(db) as store:  # and a stale writer's record, consistently sealed
        reseal(store, 6, epoch=1)
    line = _damaged(_verify(db, "s"), "ReplayDecodeError", 6)
    assert "epoch 1" in line


def test_verify_catches_a_deleted_record_a_gap(db):
    _ledger_of_s(db)
    _forge(db, "DELETE FROM ledger_records WHERE session_id = 's' AND seq = 2", [])
    line = _damaged(_verify(db, "s"), "ReplayReadError", 2)
    assert "record 2 is missing" in line


def test_verify_catches_a_lost_tail(db):
    _ledger_of_s(db)
    _forge(db, "DELETE FROM ledger_records WHERE session_id = 's' AND seq = 6", [])
    line = _damaged(_verify(db, "s"), "ReplayReadError", 6)
    assert "before its tip 6" in line


def test_verify_catches_a_flipped_byte_in_a_blob(db):
    _ledger_of_s(db)
    key = _pointer(db, 4)["key"]
    with _open(db) as store:
        blob = store.ledger.blobs.get(key)
    flipped = blob[:-1] + bytes([blob[-1] ^ 1])
    _forge(db, "UPDATE ledger_blobs SET data = ? WHERE key = ?", [flipped, key])
    line = _damaged(_verify(db, "s"), "BlobIntegrityError", 4, key)
    assert hashlib.sha256(flipped).hexdigest() in line


def test_verify_catches_a_deleted_blob(db):
    _ledger_of_s(db)
    key = _pointer(db, 4)["key"]
    _forge(db, "DELETE FROM ledger_blobs WHERE key = ?", [key])
    _damaged(_verify(db, "s"), "BlobUnavailableError", 4, key)


def test_verify_catches_a_blob_whose_id_is_not_its_pointers(db):
    _ledger_of_s(db)
    other = blob_ops.envelope(LedgerEntry("big", BIG, "someone-else"))
    key = blob_ops.blob_prefix("", "s") + hashlib.sha256(other).hexdigest()
    pointer = json.dumps(
        {"key": key, "sha256": hashlib.sha256(other).hexdigest(), "size": len(other)},
        sort_keys=True,
    ).encode()
    with _open(db) as store:  # a blob of s with another id, and s's pointer to it
        store.ledger.blobs.put(key, other)
        reseal(store, 4, pointer)
    line = _damaged(_verify(db, "s"), "BlobPointerIDMismatchError", 4, key)
    assert "someone-else" in line


def test_verify_all_reports_every_session_and_fails_for_the_damaged_one(db):
    _ledger_of_s(db)
    _append(db, "t", "note", b"t1", "t1")
    _forge(db, "DELETE FROM ledger_records WHERE session_id = 's' AND seq = 4", [])
    r = _verify(db, "--all", "--json")
    assert r.exit_code == 1, r.output
    found = {v["session_id"]: v for v in json.loads(r.stdout)["verify"]}
    assert found["t"]["ok"] and found["t"]["records"] == 2
    assert (found["s"]["error"], found["s"]["seq"], found["s"]["records"]) == (
        "ReplayReadError",
        4,
        3,
    )


def test_verify_of_an_fsspec_blob_directory_catches_a_flipped_blob(db, tmp_path):
    root = str(tmp_path / "blobs")
    _ledger_of_s(db, "--blobs", root)
    key = _pointer(db, 4)["key"]
    assert _verify(db, "s", "--blobs", root).exit_code == 0
    path = Path(root, key)
    blob = path.read_bytes()
    path.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    _damaged(_verify(db, "s", "--blobs", root), "BlobIntegrityError", 4, key)
    path.unlink()
    _damaged(_verify(db, "s", "--blobs", root), "BlobUnavailableError", 4, key)
    # without --blobs the database table holds no such blob: unavailable too
    _damaged(_verify(db, "s"), "BlobUnavailableError", 4, key)


def test_control_without_the_blob_hash_check_verify_passes_a_flipped_blob(db, monkeypatch):
    _ledger_of_s(db)
    key = _pointer(db, 4)["key"]
    with _open(db) as store:
        blob = store.ledger.blobs.get(key)
    _forge(db, "UPDATE ledger_blobs SET data = ? WHERE key = ?", [blob[:-1] + b"\x00", key])
    assert _verify(db, "s").exit_code == 1
    monkeypatch.setattr(blob_ops, "blob_hash_ok", lambda *a: True)
    r = _verify(db, "s")
    assert r.exit_code == 0 and r.stdout.startswith("ok s: 6 records"), r.output


# -- gc and repair --------------------------------------------------------------------


def test_gc_deletes_an_orphan_and_keeps_the_referenced_blob(db):
    _ledger_of_s(db)
    live = _pointer(db, 4)["key"]
    orphan_blob = blob_ops.envelope(LedgerEntry("big", BIG + b"!", "crashed"))
    orphan = blob_ops.blob_prefix("", "s") + hashlib.sha256(orphan_blob).hexdigest()
    with _open(db) as store:
        store.ledger.blobs.put(orphan, orphan_blob)  # a blob whose pointer never landed
        forge(  # a key not of the blob shape (the store never writes one): left alone
            store,
            "INSERT INTO ledger_blobs (key, session_id, data, size, written_at) "
            "VALUES (?, 's', ?, 1, CURRENT_TIMESTAMP)",
            [blob_ops.blob_prefix("", "s") + "not-a-digest", b"x"],
            rows=1,
        )
    r = tk("ledger", "gc", "s", "--db", db, "--json")
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)["gc"]
    assert result == {
        "scanned": 2,
        "referenced": 1,
        "deleted": 1,
        "deleted_keys": [orphan],
        "unreclaimable": 1,
        "temps_deleted": 0,
        "temps_deleted_keys": [],
    }
    assert result["scanned"] == result["referenced"] + result["deleted"]
    with _open(db) as store:
        assert sorted(store.ledger.blobs.list(blob_ops.blob_prefix("", "s"))) == sorted(
            [live, blob_ops.blob_prefix("", "s") + "not-a-digest"]
        )
    assert _verify(db, "s").exit_code == 0
    again = tk("ledger", "gc", "s", "--db", db)
    assert again.stdout.startswith(
        "s: scanned 1, referenced 1, deleted 0, temporary files deleted 0, unreclaimable 1"
    )


def test_gc_under_a_lease_another_owner_holds_is_refused_and_deletes_nothing(db):
    _ledger_of_s(db)
    orphan = blob_ops.blob_prefix("", "s") + hashlib.sha256(b"o").hexdigest()
    with _open(db) as store:
        store.ledger.blobs.put(orphan, b"o")
        store.leases.acquire("session:s", "someone-else", 60.0)
    r = tk("ledger", "gc", "s", "--db", db)
    assert r.exit_code == 2 and "BusyError" in r.stderr, r.output
    with _open(db) as store:
        assert orphan in store.ledger.blobs.list(blob_ops.blob_prefix("", "s"))


def test_repair_rebuilds_the_catalog_entry_from_the_ledger(db):
    started = json.dumps({"created_at": "2026-01-01T00:00:00+00:00"}).encode()
    _append(db, "s", "session_started", started, "start")
    turn = json.dumps({"turn_id": "u1", "user_text": "Fix the build\nplease"}).encode()
    _append(db, "s", "turn_started", turn, "turn-1")
    _append(db, "s", "turn_done", json.dumps({"turn_id": "u1", "summary": "built"}).encode(), "d")
    with _open(db) as store:
        _forge_catalog_away(store)
    r = tk("ledger", "repair", "s", "--db", db, "--json")
    assert r.exit_code == 0, r.output
    meta = json.loads(r.stdout)["repair"]
    assert (meta["title"], meta["state"], meta["last_turn"], meta["last_journal_seq"]) == (
        "Fix the build",
        "idle",
        "built",
        6,
    )
    text = tk("ledger", "repair", "s", "--db", db)
    assert "title: Fix the build" in text.stdout and "status: active" in text.stdout
    bad = tk("ledger", "repair", "t", "--db", db)
    assert bad.exit_code == 2 and "EmptySessionError" in bad.stderr, bad.output


def _forge_catalog_away(store: turnkeeper.BaseStore) -> None:
    """Drop ``s``'s catalog entry, so that only ``repair`` can bring it back."""
    forge(store, "DELETE FROM ledger_catalog WHERE session_id = 's'", [], rows=1)
    assert store.ledger.catalog.read_meta("s") is None


# -- report -------------------------------------------------------------------------


def test_report_counts_records_bytes_blobs_and_orphans_per_session(db, monkeypatch):
    _ledger_of_s(db)
    _append(db, "s", "big", BIG, "b1", "--tenant", "acme")  # the same blob, a tenant's key
    _append(db, "t", "note", b"t1", "t1")
    key = _pointer(db, 4)["key"]
    blob_bytes = len(blob_ops.envelope(LedgerEntry("big", BIG, "b1")))
    with _open(db) as store:
        orphan = blob_ops.blob_prefix("", "t") + hashlib.sha256(b"o").hexdigest()
        store.ledger.blobs.put(orphan, b"o")
        stored = store.query(
            "SELECT session_id, count(*) AS n, sum(octet_length(payload)) AS b "
            "FROM ledger_records GROUP BY session_id ORDER BY session_id"
        ).to_pylist()

    def figures() -> dict[str, Any]:
        r = tk("report", "--db", db, "--json")
        assert r.exit_code == 0, r.output
        return dict(json.loads(r.stdout)["ledger"])

    data = figures()
    by = {row["session_id"]: row for row in data["by_session"]}
    assert [r["session_id"] for r in data["by_session"]] == ["s", "t"]  # largest first
    assert (by["s"]["records"], by["s"]["ledger_bytes"]) == (stored[0]["n"], stored[0]["b"])
    assert (by["s"]["pointers"], by["s"]["blobs"], by["s"]["blob_bytes"]) == (
        2,
        2,
        2 * blob_bytes,
    )
    assert (by["s"]["orphan_blobs"], by["t"]["orphan_blobs"], by["t"]["orphan_bytes"]) == (0, 1, 1)
    assert data["total"]["ledgers"] == 3 and data["total"]["orphan_blobs"] == 1
    assert data["gc"]["recorded"] is False
    # the default tenant's pointer names a longer key that ends with its blob's:
    # its blob is an orphan (keys are matched whole, by the clear blob_key column)
    _forge(
        db,
        "UPDATE ledger_records SET payload = ?, blob_key = ? "
        "WHERE tenant = '' AND session_id = 's' AND seq = 4",
        [json.dumps({"key": "x" + key, "sha256": "0" * 64, "size": 1}).encode(), "x" + key],
    )
    text = tk("report", "--db", db)
    assert "Ledger per session" in text.stdout and "GC results are not recorded" in text.stdout
    by = {row["session_id"]: row for row in figures()["by_session"]}
    assert (by["s"]["orphan_blobs"], by["s"]["orphan_bytes"]) == (1, blob_bytes), key
    tail = "r.blob_key LIKE '%' || b.key"
    with monkeypatch.context() as patch:  # control: keys matched by their tail, the orphan hides
        patch.setattr(report_ledger, "_NAMED", tail)
        assert {r["session_id"]: r for r in figures()["by_session"]}["s"]["orphan_blobs"] == 0
    # that pointer gone, and tenant acme's pointer (forged) naming the default
    # tenant's blob: still an orphan (a pointer names a blob of its own tenant);
    # acme's blob, its pointer renamed, is one too
    _forge(db, "DELETE FROM ledger_records WHERE tenant = '' AND session_id = 's' AND seq = 4", [])
    _forge(
        db,
        "UPDATE ledger_records SET payload = ?, blob_key = ? "
        "WHERE tenant = 'acme' AND session_id = 's' AND kind = 'blobptr'",
        [json.dumps({"key": key, "sha256": "0" * 64, "size": 1}).encode(), key],
    )
    by = {row["session_id"]: row for row in figures()["by_session"]}
    assert (by["s"]["orphan_blobs"], by["s"]["orphan_bytes"]) == (2, 2 * blob_bytes), key
    across = report_ledger._ORPHANS.replace("r.tenant = b.tenant AND ", "")
    assert across != report_ledger._ORPHANS
    monkeypatch.setattr(report_ledger, "_ORPHANS", across)  # control: tenants not matched
    by = {row["session_id"]: row for row in figures()["by_session"]}
    assert by["s"]["orphan_blobs"] == 1


# -- audit ----------------------------------------------------------------------------


def _audit(db: str, *args: str) -> dict[str, dict[str, Any]]:
    r = tk("audit", "--db", db, "--json", *args)
    return {c["name"]: c for c in json.loads(r.stdout)["audit"]}


LEDGER_CHECKS = ("ledger_tips_match_records", "ledgers_verify", "ledger_catalog_lists_sessions")


def test_audit_checks_every_ledger_and_each_check_can_fail(db):
    _ledger_of_s(db)
    _append(db, "t", "note", b"t1", "t1")
    _append(db, "t", "note", b"t2", "t2", "--tenant", "acme")
    found = _audit(db)
    assert [(found[n]["passed"], found[n]["checked"]) for n in LEDGER_CHECKS] == [(True, 3)] * 3
    scoped = _audit(db, "--session", "t")
    assert [scoped[n]["checked"] for n in LEDGER_CHECKS] == [2, 2, 2]  # t and acme/t
    # a tip that names a record the ledger does not hold
    _forge(db, "UPDATE ledger_tips SET seq = 9 WHERE tenant = 'acme' AND session_id = 't'", [])
    found = _audit(db)
    assert not found["ledger_tips_match_records"]["passed"]
    assert found["ledger_tips_match_records"]["detail"] == "acme/t"
    assert "acme/t: ReplayReadError at seq 3" in found["ledgers_verify"]["detail"]
    assert found["ledger_catalog_lists_sessions"]["detail"] == "acme/t (folded 2 of 9)"
    _forge(db, "UPDATE ledger_tips SET seq = 2 WHERE tenant = 'acme' AND session_id = 't'", [])
    # a flipped payload byte: only the replay sees it
    _forge(
        db, "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 6", [b"lost"]
    )
    found = _audit(db)
    assert found["ledger_tips_match_records"]["passed"]
    assert found["ledgers_verify"]["detail"].startswith("s: ReplayDecodeError at seq 6")
    _forge(
        db, "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 6", [b"last"]
    )
    # a session the catalog does not list
    _forge(db, "DELETE FROM ledger_catalog WHERE tenant = '' AND session_id = 't'", [])
    found = _audit(db)
    assert [found[n]["passed"] for n in LEDGER_CHECKS] == [True, True, False]
    assert found["ledger_catalog_lists_sessions"]["detail"] == "t (not listed)"


# -- a mistyped --db, an oversized payload -------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["ledger", "append", "s", "--kind", "note"],
        ["ledger", "repair", "s"],
        ["ledger", "gc", "s"],
        ["sessions", "delete", "s", "--yes"],
        ["sessions", "retain", "--keep-last", "1"],
    ],
)
def test_a_command_on_stored_sessions_never_creates_a_mistyped_database(
    tmp_path: Path, args: list[str]
) -> None:
    """Failed before (attack on issue 19, minor): ``ledger append|repair|gc
    --db missing.duckdb`` created an empty database, then said
    SessionNotFoundError; ``sessions delete`` and ``retain`` did the same."""
    missing = tmp_path / "mistyped.duckdb"
    result = tk(*args, "--db", str(missing), stdin=b"x")
    assert result.exit_code == 2, result.output
    assert "StoreNotFoundError" in result.output
    assert not missing.exists()


def test_an_oversized_payload_is_refused_without_reading_it_whole(monkeypatch, tmp_path):
    """Failed before (attack on issue 19, minor): ``ledger append`` read all
    of stdin before its size check (400 MB of stdin: 925 MB RSS)."""
    import io

    from turnkeeper.cli import ledger as ledger_cli

    monkeypatch.setattr(ledger_cli, "MAX_BODY_BYTES", 10)
    source = io.BytesIO(b"y" * 1000)
    with pytest.raises(turnkeeper.DurableBodyTooLargeError) as err:
        ledger_cli._read_payload(source, "stdin")
    assert (err.value.object_id, err.value.max_bytes, source.tell()) == ("stdin", 10, 11)
    path = tmp_path / "db.duckdb"
    with turnkeeper.open_store(str(path)) as store:
        store.sessions.create("s")
    result = tk("ledger", "append", "s", "--kind", "note", "--db", str(path), stdin=b"z" * 11)
    assert result.exit_code == 2 and "DurableBodyTooLargeError" in result.output
    assert (
        tk("ledger", "append", "s", "--kind", "note", "--db", str(path), stdin=b"z" * 10).exit_code
        == 0
    )


def test_a_failed_catalog_update_is_a_one_line_warning(db):
    """Failed before (attack on issue 19, minor): ``ledger append`` exited 0
    but printed the library's warning with a whole traceback on stderr."""
    assert _append(db, "s", "turn_started", b'{"turn_id": "t"}', "t")["seq"] == 2
    bad = b"{not json"
    _forge(
        db,
        "UPDATE ledger_records SET payload = ?, payload_sha256 = ? "
        "WHERE session_id = 's' AND seq = 2",
        [bad, hashlib.sha256(bad).hexdigest()],
    )
    _forge(db, "DELETE FROM ledger_catalog WHERE session_id = 's'", [])
    r = tk("ledger", "append", "s", "--kind", "note", "--db", db, stdin=b"x")
    assert r.exit_code == 0, r.output
    warning = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and "ReplayDecodeError" in warning[0], r.stderr
    assert "Traceback" not in r.stderr
