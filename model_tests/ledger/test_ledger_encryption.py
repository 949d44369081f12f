"""Encryption at rest of the ledger (issue 23): record payloads, blobs in the
database's table, in a directory and on S3, sealed under the data key of the
ledger's session, on both engines.

The digests stay over the clear bytes (replay, ``ledger verify``, the
redelivery check); the stored bytes hold no secret; a flipped byte or a
value moved to another record or blob is ``PayloadAuthenticationError``
naming the session, record and field; a store object opened without the key
refuses payloads typed and still serves the ledger's metadata; the audit's
and the report's ledger figures work on a sealed store. Control tests patch
the sealing out to show the checks can fail.
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import TEST_KEYS, close_backend, forge, open_backend, reopen

import turnkeeper
from turnkeeper import (
    FsspecBlobs,
    KeyUnavailableError,
    PayloadAuthenticationError,
)
from turnkeeper.cli.main import cli
from turnkeeper.cli.report_ledger import collect_ledger
from turnkeeper.spec.ledger import CommandApplication
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.crypto.columns import SEALED
from turnkeeper.storage.crypto.seal import key_version
from turnkeeper.storage.ops.ledger import blobs as blob_ops
from turnkeeper.storage.ops.ledger import sealing

TTL = 30.0
THRESHOLD = 64
SECRET = b"the launch code is 0000"
BIG = SECRET * 8  # over the threshold: offloaded
SMALL = b"inline: " + SECRET


@pytest.fixture(params=["database", "directory", "s3"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Where the blobs live: the store's table (``None``), a directory, S3."""
    if request.param == "directory":
        return FsspecBlobs(str(tmp_path / "blobs"))
    if request.param == "s3":
        return request.getfixturevalue("s3_blobs")()
    return None


def _written(store: Any, blobs: Any, sid: str = "s") -> Any:
    """A ledger of ``sid`` with an inline record (seq 2), an offloaded one (3)
    and a command application (4); the ledger."""
    ledger = store.ledger.with_blobs(blobs, offload_threshold=THRESHOLD)
    store.sessions.create(sid)
    lease = store.leases.acquire(f"session:{sid}", "w", TTL)
    w = ledger.open(sid, lease)
    assert w.append("turn", SMALL, "t1").seq == 2
    assert w.append("turn", BIG, "t2").seq == 3
    log = ledger.command_log(sid, w)
    assert (
        log.append_command_application(CommandApplication("c1", {"said": SECRET.decode()})).seq == 4
    )
    w.close()
    store.leases.release(lease)
    return ledger


def _rows(store: Any, sid: str = "s") -> list[dict[str, Any]]:
    return list(
        store.query(
            "SELECT seq, kind, payload, payload_sha256, blob_key FROM ledger_records "
            "WHERE session_id = ? ORDER BY seq",
            [sid],
        ).to_pylist()
    )


def _raw_blob(store: Any, ledger: Any, key: str) -> bytes:
    if isinstance(ledger.blobs, FsspecBlobs):
        return bytes(ledger.blobs.fs.cat_file(posixpath.join(ledger.blobs.root, key)))
    found = store.query("SELECT data FROM ledger_blobs WHERE key = ?", [key]).to_pylist()
    return bytes(found[0]["data"])


def _put_raw_blob(store: Any, ledger: Any, key: str, data: bytes) -> None:
    if isinstance(ledger.blobs, FsspecBlobs):
        ledger.blobs.fs.pipe_file(posixpath.join(ledger.blobs.root, key), data)
    else:
        forge(store, "UPDATE ledger_blobs SET data = ? WHERE key = ?", [data, key], rows=1)


def _flip(data: bytes, at: int = -1) -> bytes:
    raw = bytearray(data)
    raw[at] ^= 1
    return bytes(raw)


def _blob_key(store: Any) -> str:
    keys = [r["blob_key"] for r in _rows(store) if r["blob_key"] is not None]
    assert len(keys) == 1
    return str(keys[0])


def assert_sealed_at_rest(store: Any, ledger: Any) -> None:
    """No record payload or blob holds the secret; each is a sealed value;
    the digests are the clear bytes'; the pointer's key is in ``blob_key``."""
    rows = _rows(store)
    assert [r["kind"] for r in rows] == ["fence", "turn", "blobptr", "command_application"]
    for r in rows:
        stored = bytes(r["payload"])
        assert SECRET not in stored and key_version(stored) == 1, r
    clear = {2: SMALL}
    assert rows[1]["payload_sha256"] == hashlib.sha256(clear[2]).hexdigest()
    key = _blob_key(store)
    assert key.startswith(blob_ops.blob_prefix("", "s"))
    raw = _raw_blob(store, ledger, key)
    assert SECRET not in raw and key_version(raw) == 1
    # the key is the sha256 of the clear envelope, which the blob opens to
    envelope = sealing.open_blob(store.db, "s", key, raw)
    assert key.endswith(hashlib.sha256(envelope).hexdigest()) and envelope.endswith(BIG)


def test_records_and_blobs_are_stored_sealed_and_read_back_clear(enc, blobs):
    ledger = _written(enc, blobs)
    assert_sealed_at_rest(enc, ledger)
    got = [(r.seq, r.kind, r.payload) for r in ledger.replay("s")]
    assert got[1:3] == [(2, "turn", SMALL), (3, "turn", BIG)]
    assert ledger.read_command_application_at("s", 4).applied == {"said": SECRET.decode()}
    # a redelivery compares digests, never ciphertexts (two seals of one value differ)
    w = ledger.open("s", enc.leases.acquire("session:s", "w2", TTL))
    assert (w.append("turn", SMALL, "t1").seq, w.append("turn", BIG, "t2").seq) == (2, 3)
    assert w.append("turn", SMALL, "t1").duplicate
    # another store object (its own key cache) reads it too
    other = reopen(enc, encryption=TEST_KEYS)
    try:
        assert [r.payload for r in other.ledger.with_blobs(blobs).replay("s")][1:3] == [SMALL, BIG]
    finally:
        other.close()


def test_control_the_sealed_at_rest_check_fails_when_sealing_is_patched_out(
    enc, tmp_path, monkeypatch
):
    monkeypatch.setattr(sealing, "sealer", lambda tx, sid: sealing._clear)
    monkeypatch.setattr(sealing, "seal_blob", lambda db, sid, key, blob: blob)
    # (and the append's check of its blobs' key version, which would put them again)
    monkeypatch.setattr(sealing, "current_blobs", lambda *args: None)
    ledger = _written(enc, FsspecBlobs(str(tmp_path / "blobs")))
    with pytest.raises(AssertionError):
        assert_sealed_at_rest(enc, ledger)


def test_a_flipped_byte_or_a_moved_payload_is_an_authentication_error_naming_the_record(enc):
    ledger = _written(enc, None)
    rows = _rows(enc)
    forge(
        enc,
        "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 2",
        [_flip(bytes(rows[1]["payload"]))],
        rows=1,
    )
    with pytest.raises(PayloadAuthenticationError) as flipped:
        list(ledger.replay("s"))
    assert (flipped.value.session_id, flipped.value.record_id, flipped.value.field) == (
        "s",
        "2",
        "payload",
    )
    # seq 4's sealed payload moved to seq 2 (a valid seal, of another record)
    forge(
        enc,
        "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 2",
        [bytes(rows[3]["payload"])],
        rows=1,
    )
    with pytest.raises(PayloadAuthenticationError) as moved:
        list(ledger.replay("s"))
    assert (moved.value.record_id, moved.value.field) == ("2", "payload")
    lease = enc.leases.acquire("session:s", "gc", TTL)
    ledger.open("s", lease).close()  # GC runs as the ledger's writer
    with pytest.raises(turnkeeper.GCScanError) as scan:
        ledger.gc("s", lease)
    assert isinstance(scan.value.__cause__, PayloadAuthenticationError)
    # a clear payload in a sealed session is refused too, never taken as clear
    forge(
        enc,
        "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 2",
        [SMALL],
        rows=1,
    )
    with pytest.raises(PayloadAuthenticationError, match="a clear value"):
        list(ledger.replay("s"))


def test_a_moved_payload_from_another_session_fails_authentication(enc):
    ledger = _written(enc, None)
    _written(enc, None, "t")
    theirs = _rows(enc, "t")[1]["payload"]
    forge(
        enc,
        "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 2",
        [bytes(theirs)],
        rows=1,
    )
    with pytest.raises(PayloadAuthenticationError) as moved:
        list(ledger.replay("s"))
    assert (moved.value.session_id, moved.value.record_id) == ("s", "2")


def test_a_flipped_or_moved_blob_is_an_authentication_error_naming_its_key(enc, blobs):
    ledger = _written(enc, blobs)
    key = _blob_key(enc)
    raw = _raw_blob(enc, ledger, key)
    _put_raw_blob(enc, ledger, key, _flip(raw))
    with pytest.raises(PayloadAuthenticationError) as flipped:
        list(ledger.replay("s"))
    assert (flipped.value.session_id, flipped.value.record_id, flipped.value.field) == (
        "s",
        key,
        "data",
    )
    # another blob of the session, sealed under its own key, put under this one's
    w = ledger.open("s", enc.leases.acquire("session:s", "w2", TTL))
    w.append("turn", BIG + b"!", "t9")
    w.close()
    other = next(k for k in ledger.blobs.list(blob_ops.blob_prefix("", "s")) if k != key)
    _put_raw_blob(enc, ledger, key, _raw_blob(enc, ledger, other))
    with pytest.raises(PayloadAuthenticationError) as moved:
        list(ledger.replay("s"))
    assert (moved.value.record_id, moved.value.field) == (key, "data")


def test_a_store_opened_without_the_key_refuses_payloads_typed_and_serves_metadata(enc, blobs):
    _written(enc, blobs)
    keyless = reopen(enc)
    try:
        ledger = keyless.ledger.with_blobs(blobs, offload_threshold=THRESHOLD)
        with pytest.raises(KeyUnavailableError) as refused:
            list(ledger.replay("s"))
        assert (refused.value.session_id, refused.value.key_id) == ("s", None)
        with pytest.raises(KeyUnavailableError):
            ledger.read_command_application_at("s", 4)
        before = _rows(keyless)
        w = ledger.open  # an open writes a fence record: a payload, refused
        with pytest.raises(KeyUnavailableError):
            w("s", keyless.leases.acquire("session:s", "w2", TTL))
        assert _rows(keyless) == before
        # the metadata: the tip, the catalog, the records' clear columns
        assert ledger.tip("s") == 4
        assert [m.session_id for m in ledger.catalog.list_sessions()] == ["s"]
        assert [r["kind"] for r in before] == ["fence", "turn", "blobptr", "command_application"]
    finally:
        keyless.close()


def test_an_append_of_a_writer_whose_store_object_lost_the_key_is_refused(enc):
    ledger = _written(enc, None)
    w = ledger.open("s", enc.leases.acquire("session:s", "w2", TTL))
    forge(enc, "DELETE FROM session_keys WHERE session_id = 's'", rows=1)
    enc.db.keyring.forget("s")
    before = _rows(enc)
    with pytest.raises(KeyUnavailableError):
        w.append("turn", SMALL + b"2", "t3")
    with pytest.raises(KeyUnavailableError):
        w.append("turn", BIG + b"2", "t4")  # its blob's seal, before the put
    assert _rows(enc) == before


def test_gc_on_a_sealed_ledger_keeps_referenced_blobs_and_reclaims_orphans(enc, blobs):
    ledger = _written(enc, blobs)
    key = _blob_key(enc)
    orphan = blob_ops.blob_prefix("", "s") + hashlib.sha256(b"orphan").hexdigest()
    ledger.blobs.put(orphan, sealing.seal_blob(enc.db, "s", orphan, b"orphan"))
    lease = enc.leases.acquire("session:s", "gc", TTL)
    ledger.open("s", lease).close()  # GC runs as the ledger's writer
    result = ledger.gc("s", lease)
    assert result.deleted_keys == (orphan,)
    assert ledger.blobs.list(blob_ops.blob_prefix("", "s")) == [key]
    assert [r.payload for r in ledger.replay("s")][2] == BIG
    assert result.scanned == 2 and result.referenced == 1


def test_the_sealed_columns_list_names_the_ledgers(enc):
    named = {(c.table, c.column, c.record, c.field, c.binary) for c in SEALED}
    assert ("ledger_records", "payload", "seq", "payload", True) in named
    assert ("ledger_blobs", "data", "key", "data", True) in named


def test_rotating_the_sessions_data_key_reseals_its_ledger_in_the_database(enc):
    """``sessions.rotate_key`` walks ``columns.SEALED``: the ledger's records and
    its blobs in the database's table are sealed again under version 2 (the
    old version's key row dropped), and replay, redelivery and GC read them."""
    ledger = _written(enc, None)
    key = _blob_key(enc)
    before = _raw_blob(enc, ledger, key)
    assert enc.sessions.rotate_key("s") == 2
    assert {key_version(bytes(r["payload"])) for r in _rows(enc)} == {2}
    after = _raw_blob(enc, ledger, key)
    assert key_version(after) == 2 and after != before and SECRET not in after
    got = [(r.seq, r.payload) for r in ledger.replay("s")]
    assert got[1:3] == [(2, SMALL), (3, BIG)]
    lease = enc.leases.acquire("session:s", "w2", TTL)
    w = ledger.open("s", lease)
    assert w.append("turn", BIG, "t2").duplicate  # the redelivery's digest check
    assert key_version(bytes(_rows(enc)[-1]["payload"])) == 2  # the new fence
    assert ledger.gc("s", lease).deleted == 0


def test_audit_ledger_checks_on_a_sealed_store_with_and_without_the_key(enc):
    _written(enc, None)
    checks = {c.name: c for c in run_audit(enc, None)}
    assert checks["ledgers_verify"].passed and checks["ledgers_verify"].checked == 1
    keyless = reopen(enc)
    try:
        checks = {c.name: c for c in run_audit(keyless, None)}
        verify = checks["ledgers_verify"]
        assert verify.passed and verify.checked == 0 and "without its key" in verify.detail
        assert checks["ledger_tips_match_records"].passed
        assert checks["ledger_catalog_lists_sessions"].passed
    finally:
        keyless.close()
    row = _rows(enc)[1]
    forge(
        enc,
        "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 2",
        [_flip(bytes(row["payload"]))],
        rows=1,
    )
    verify = {c.name: c for c in run_audit(enc, None)}["ledgers_verify"]
    assert verify.violations == 1 and "PayloadAuthenticationError at seq 2" in verify.detail


def test_cli_ledger_verify_reports_a_sealed_records_damage(tmp_path, clock):
    store = open_backend("duckdb+enc", tmp_path, clock)
    _written(store, None)
    row = _rows(store)[1]
    forge(
        store,
        "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = 2",
        [_flip(bytes(row["payload"]))],
        rows=1,
    )
    path = str(store.path)
    close_backend(store)
    key_file = tmp_path / "master.key"
    key_file.write_text("test-master:" + base64.b64encode(bytes(range(32))).decode() + "\n")
    runner = CliRunner()
    out = runner.invoke(cli, ["--key-file", str(key_file), "ledger", "verify", "--db", path, "s"])
    assert out.exit_code == 1, out.output
    assert "DAMAGED s: PayloadAuthenticationError at seq 2" in out.output
    keyless = runner.invoke(
        cli, ["ledger", "verify", "--db", path, "s"], env={"TURNKEEPER_MASTER_KEY": ""}
    )
    assert keyless.exit_code == 2, keyless.output
    assert "KeyUnavailableError" in keyless.output


def test_cli_ledger_verify_reports_a_session_whose_key_row_is_gone_as_damage(tmp_path, clock):
    """A sealed ledger whose data key row was removed (a shredded version,
    a row lost) does not open: with the key, that is damage (exit 1, the
    session named), as a flipped byte is; without it, a refusal (exit 2)."""
    store = open_backend("duckdb+enc", tmp_path, clock)
    _written(store, None)
    forge(store, "DELETE FROM session_keys WHERE session_id = 's'", rows=1)
    path = str(store.path)
    close_backend(store)
    key_file = tmp_path / "master.key"
    key_file.write_text("test-master:" + base64.b64encode(bytes(range(32))).decode() + "\n")
    out = CliRunner().invoke(
        cli, ["--key-file", str(key_file), "ledger", "verify", "--db", path, "s"]
    )
    assert out.exit_code == 1, out.output
    assert "DAMAGED s: KeyUnavailableError" in out.output


def test_report_orphan_figures_read_the_clear_blob_key_column(enc):
    ledger = _written(enc, None)
    orphan = blob_ops.blob_prefix("", "s") + hashlib.sha256(b"orphan").hexdigest()
    ledger.blobs.put(orphan, sealing.seal_blob(enc.db, "s", orphan, b"orphan"))
    total = collect_ledger(enc)["total"]
    assert (total["pointers"], total["blobs"], total["orphan_blobs"]) == (1, 2, 1)


def test_the_migration_backfills_blob_key_from_clear_pointers(tmp_path, clock):
    store = open_backend("duckdb", tmp_path, clock)
    try:
        _written(store, None)
        key = _blob_key(store)
        forge(store, "UPDATE ledger_records SET blob_key = NULL WHERE kind = 'blobptr'", rows=1)
        forge(store, "INSERT INTO ledger_records SELECT tenant, session_id, 9, 'blobptr', "
              "'x', '\\xFF'::BLOB, payload_sha256, epoch, written_at, record_sha256, NULL "
              "FROM ledger_records WHERE seq = 2", rows=1)  # fmt: skip
        from importlib import resources

        sql = resources.files("turnkeeper.storage.duck").joinpath(
            "migrations/0035_ledger_sealed.sql"
        )
        body = "\n".join(line for line in sql.read_text().splitlines() if not line.startswith("--"))
        forge(store, body, rows=2)
        keys = {r["seq"]: r["blob_key"] for r in _rows(store) if r["kind"] == "blobptr"}
        assert keys == {3: key, 9: None}
        assert json.loads(bytes(_rows(store)[2]["payload"]))["key"] == key
    finally:
        close_backend(store)


@pytest.mark.parametrize("keep", [True, False], ids=["guard", "control"])
def test_a_blob_file_outside_the_database_still_opens_after_a_rotation(
    enc, tmp_path, monkeypatch, keep: bool
):
    """A blob in an fsspec blob store (a directory here) is out of the
    rotation's reach: it stays sealed under version 1, and the rotation keeps
    version 1's key row for it, so the blob (and the replay of the record
    that points at it) still opens. Control: with the old version's key row
    dropped whatever the blobs (as before), the blob no longer opens."""
    from turnkeeper.storage.ops import reseal

    if not keep:
        monkeypatch.setattr(reseal, "_EXTERNAL_BLOBS", "SELECT 1 WHERE CAST(? AS VARCHAR) IS NULL")
    ledger = _written(enc, FsspecBlobs(str(tmp_path / "blobs")))
    key = _blob_key(enc)
    assert key_version(_raw_blob(enc, ledger, key)) == 1
    assert enc.sessions.rotate_key("s") == 2
    assert {key_version(bytes(r["payload"])) for r in _rows(enc)} == {2}
    with reopen(enc, encryption=TEST_KEYS) as fresh:
        again = fresh.ledger.with_blobs(ledger.blobs, offload_threshold=THRESHOLD)
        if keep:
            got = [(r.seq, r.payload) for r in again.replay("s")]
            assert got[1:3] == [(2, SMALL), (3, BIG)]
        else:
            with pytest.raises(turnkeeper.PayloadAuthenticationError):
                list(again.replay("s"))
    enc.sessions.delete("s")  # crypto-shredding: every version goes
    assert enc.query("SELECT count(*) AS n FROM session_keys").to_pylist() == [{"n": 0}]


@pytest.mark.parametrize("refuse", [True, False], ids=["guard", "control"])
def test_a_session_whose_ledger_spans_two_tenants_is_not_rotated(enc, monkeypatch, refuse: bool):
    """Two tenants' ledgers of one session both hold sequence 2 (a record is
    sealed for its sequence alone): ``rotate_key`` refuses the session,
    typed, re-sealing nothing, and both ledgers replay. Control: with the
    refusal patched out, the walk writes one tenant's re-sealed record over
    the other's, which then fails to replay."""
    from turnkeeper.storage.ops import reseal

    if not refuse:
        monkeypatch.setattr(reseal, "_TENANTS", "SELECT 1 WHERE CAST(? AS VARCHAR) IS NULL")
    enc.sessions.create("s")
    for tenant, body in (("a", SMALL), ("b", BIG)):
        ledger = enc.ledger.with_tenant(tenant)
        lease = enc.leases.acquire("session:s", "w", TTL)
        w = ledger.open("s", lease)
        assert w.append("turn", body, "t1").seq == 2
        w.close()
        enc.leases.release(lease)

    def replays() -> list[Any]:
        return [[r.payload for r in enc.ledger.with_tenant(t).replay("s")][1] for t in ("a", "b")]

    assert replays() == [SMALL, BIG]
    if refuse:
        with pytest.raises(turnkeeper.NotSupportedError):
            enc.sessions.rotate_key("s")
        assert replays() == [SMALL, BIG]
        assert {key_version(bytes(r["payload"])) for r in _rows(enc)} == {1}
    else:
        enc.sessions.rotate_key("s")
        with pytest.raises(turnkeeper.TurnkeeperError):
            assert replays() == [SMALL, BIG]
