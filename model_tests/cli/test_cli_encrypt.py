"""``turnkeeper encrypt`` and ``turnkeeper keys rotate`` through click's runner,
on both backends: what they seal and rewrap, what they skip and say so,
what they refuse (exit 2, one line), and a second run resuming."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import BACKENDS, new_pg_schema

import turnkeeper
from turnkeeper import EntryKind, LocalKeyProvider
from turnkeeper.cli.main import cli
from turnkeeper.storage.crypto.keys import KEY_ENV
from turnkeeper.storage.ops import reseal as reseal_module
from turnkeeper.storage.ops.leases import Leases
from turnkeeper.storage.ops.rekeying import RekeyingPart

SECRET = "the launch code is 0000"
MSG = {"message": {"role": "user", "content": SECRET}}


def _key(seed: int, key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(bytes([seed]) * 32).decode()}"


K1, K2 = _key(1, "k1"), _key(2, "k2")


def run(*args: str, key: str | None) -> Result:
    env = {KEY_ENV: key} if key is not None else {KEY_ENV: ""}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A clear database holding sessions ``a`` and ``b``, one message each."""
    where = str(tmp_path / "f.duckdb") if request.param == "duckdb" else new_pg_schema()
    with turnkeeper.open_store(where) as store:
        for sid in ("a", "b"):
            store.sessions.create(sid)
            store.sessions.append(sid, EntryKind.MESSAGE, MSG)
    yield where


def _clear_payloads(db: str) -> int:
    with turnkeeper.open_store(db) as store:
        rows = store.query("SELECT payload FROM entries").to_pylist()
    return sum(SECRET in r["payload"] for r in rows)


def test_encrypt_seals_every_session_skips_a_held_one_and_a_second_run_resumes(db: str) -> None:
    with turnkeeper.open_store(db) as store:
        held = store.leases.acquire("session:b", "runtime-1", ttl_s=600)
    first = run("encrypt", "--db", db, key=K1)
    assert first.exit_code == 1, first.output
    assert "skipped b: held by another worker" in first.stderr
    assert "1 sessions sealed, 0 already sealed, 1 skipped" in first.stdout
    assert _clear_payloads(db) == 1
    with turnkeeper.open_store(db) as store:
        store.leases.release(held)
    second = run("encrypt", "--db", db, "--json", key=K1)
    assert second.exit_code == 0, second.output
    report = json.loads(second.stdout)
    assert (report["sealed"], report["already_sealed"], report["skipped"]) == (1, 1, {})
    first = report["reclaimed"][0] if report["reclaimed"] else ""
    # (PostgreSQL: each table named with the store's schema, VACUUM running unpinned)
    assert first == "CHECKPOINT" or (first.startswith("VACUUM ") and first.endswith(".entries"))
    assert _clear_payloads(db) == 0
    with turnkeeper.open_store(db, encryption=LocalKeyProvider.from_text(K1)) as store:
        for sid in ("a", "b"):
            assert store.sessions.replay(sid).messages[0]["content"] == SECRET


def test_encrypt_without_a_key_is_refused_in_one_line(db: str) -> None:
    result = run("encrypt", "--db", db, key=None)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "needs the master key" in result.stderr
    assert _clear_payloads(db) == 2


def test_keys_rotate_rewraps_to_the_current_key_and_the_old_one_can_retire(db: str) -> None:
    assert run("encrypt", "--db", db, key=K1).exit_code == 0
    rotated = run("keys", "rotate", "--db", db, "--batch-rows", "1", key=f"{K2}\n{K1}")
    assert rotated.exit_code == 0, rotated.output
    assert rotated.stdout.strip() == (
        "master key k2: 2 data keys rewrapped, 0 already current, 0 remaining; "
        "check value rewrapped"
    )
    again = run("keys", "rotate", "--db", db, "--json", key=f"{K2}\n{K1}")
    assert json.loads(again.stdout) == {
        "key_id": "k2",
        "rewrapped": 0,
        "already_current": 2,
        "remaining": 0,
        "check_rewrapped": False,
    }
    with turnkeeper.open_store(db, encryption=LocalKeyProvider.from_text(K2)) as store:
        assert store.sessions.replay("a").messages[0]["content"] == SECRET


def test_keys_rotate_refusals_are_typed_one_line_exit_2(db: str) -> None:
    assert run("encrypt", "--db", db, key=K1).exit_code == 0
    missing = run("keys", "rotate", "--db", db, key=K2)  # k1 not given: the check fails at open
    assert missing.exit_code == 2 and "KeyUnavailableError" in missing.stderr
    with turnkeeper.open_store(db, encryption=LocalKeyProvider.from_text(K1)) as store:
        other = store.leases.acquire("keys:rotation", "another-rotator", ttl_s=600)
    busy = run("keys", "rotate", "--db", db, key=f"{K2}\n{K1}")
    assert busy.exit_code == 2 and "BusyError" in busy.stderr
    with turnkeeper.open_store(db, encryption=LocalKeyProvider.from_text(K1)) as store:
        store.leases.release(other)
        rows = store.query("SELECT key_id FROM session_keys").to_pylist()
    assert {r["key_id"] for r in rows} == {"k1"}


def test_encrypt_into_a_new_duckdb_file_leaves_no_clear_copy(tmp_path: Path) -> None:
    """The old file keeps the clear values' freed blocks after ``CHECKPOINT``
    (the bytes are still in it: what the README warns of); the copy holds
    none and reads back whole."""
    old, new = str(tmp_path / "old.duckdb"), str(tmp_path / "new.duckdb")
    with turnkeeper.open_store(old) as store:
        store.sessions.create("a")
        store.sessions.append("a", EntryKind.MESSAGE, MSG)
    result = run("encrypt", "--db", old, "--into", new, key=K1)
    assert result.exit_code == 0, result.output
    assert f"copied into {new}" in result.stdout
    assert SECRET.encode() in Path(old).read_bytes()
    assert SECRET.encode() not in Path(new).read_bytes()
    with turnkeeper.open_store(new, encryption=LocalKeyProvider.from_text(K1)) as store:
        assert store.sessions.replay("a").messages[0]["content"] == SECRET
    again = run("encrypt", "--db", old, "--into", new, key=K1)
    assert again.exit_code == 2 and "the file exists" in again.stderr


def test_encrypt_into_is_refused_on_postgres_and_while_a_session_stays_clear(db: str) -> None:
    into = str(Path(db).parent / "copy.duckdb") if not db.startswith("postgres") else "x.duckdb"
    if db.startswith("postgres"):
        refused = run("encrypt", "--db", db, "--into", into, key=K1)
        assert refused.exit_code == 2 and "--into copies a DuckDB file" in refused.stderr
        return
    with turnkeeper.open_store(db) as store:
        store.leases.acquire("session:b", "runtime-1", ttl_s=600)
    partial = run("encrypt", "--db", db, "--into", into, key=K1)
    assert partial.exit_code == 1 and "not copied into" in partial.stderr
    assert not Path(into).exists()


def test_encrypt_stopped_between_sessions_is_finished_by_the_next_run(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = RekeyingPart.encrypt
    done: list[str] = []

    def stop_after_one(self: Any, session_id: str, **kwargs: Any) -> bool:
        if done:
            raise KeyboardInterrupt  # the process stops here (Ctrl-C, a crash)
        done.append(session_id)
        return real(self, session_id, **kwargs)

    monkeypatch.setattr(RekeyingPart, "encrypt", stop_after_one)
    stopped = CliRunner().invoke(cli, ["encrypt", "--db", db], env={KEY_ENV: K1})
    assert stopped.exit_code == 130 and "interrupted" in stopped.stderr
    assert _clear_payloads(db) == 1
    monkeypatch.setattr(RekeyingPart, "encrypt", real)
    resumed = run("encrypt", "--db", db, "--json", key=K1)
    assert resumed.exit_code == 0, resumed.output
    assert (json.loads(resumed.stdout)["sealed"], json.loads(resumed.stdout)["already_sealed"]) == (
        1,
        1,
    )
    assert _clear_payloads(db) == 0


BIG = (SECRET * 16).encode()  # offloaded at a 64-byte threshold


@pytest.mark.parametrize("refused", [True, False], ids=["refused", "control"])
def test_encrypt_skips_and_names_a_session_it_cannot_seal_and_seals_the_rest(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: bool
) -> None:
    """A session whose ledger keeps blobs in a directory (which the walk
    cannot reach: they would stay clear in a sealed session) and one whose
    ledger spans two tenants (their record ids collide) are skipped and
    named, exit 1; the others are sealed. Control: without the blob refusal
    the directory session is sealed and its ledger no longer replays (a
    clear blob in a sealed session)."""
    blobs = turnkeeper.FsspecBlobs(str(tmp_path / "blobs"))
    with turnkeeper.open_store(db) as store:
        for sid in ("files", "tenants"):
            store.sessions.create(sid)
        lease = store.leases.acquire("session:files", "w", ttl_s=60)
        with store.ledger.with_blobs(blobs, offload_threshold=64).open("files", lease) as w:
            w.append("note", BIG, "n1")
        store.leases.release(lease)
        lease = store.leases.acquire("session:tenants", "w", ttl_s=60)
        for tenant in ("t1", "t2"):
            with store.ledger.with_tenant(tenant).open("tenants", lease) as w:
                w.append("note", b"x", "n1")
        store.leases.release(lease)
    if not refused:
        monkeypatch.setattr(
            reseal_module, "_EXTERNAL_BLOBS", "SELECT 1 FROM sessions WHERE id = ? AND FALSE"
        )
    result = run("encrypt", "--db", db, key=K1)
    assert result.exit_code == 1, result.output
    assert "skipped tenants: not sealed: session 'tenants' has ledger records under 2" in (
        result.stderr
    )
    key = LocalKeyProvider.from_text(K1)
    with turnkeeper.open_store(db, encryption=key) as store:
        ledger = store.ledger.with_blobs(blobs, offload_threshold=64)
        if not refused:
            with pytest.raises(turnkeeper.PayloadAuthenticationError):
                list(ledger.replay("files"))
            return
        assert "skipped files: not sealed: session 'files' has ledger blob pointers" in (
            result.stderr
        )
        assert "2 sessions sealed, 0 already sealed, 2 skipped" in result.stdout
        assert [r.payload for r in ledger.replay("files")][1] == BIG
        versions = store.query("SELECT id, key_version FROM sessions ORDER BY id").to_pylist()
        assert {r["id"]: r["key_version"] for r in versions} == {
            "a": 1,
            "b": 1,
            "files": None,
            "tenants": None,
        }


def test_encrypt_seals_a_session_with_a_run_not_ended_and_no_live_holder(db: str) -> None:
    """Attack finding (issue 23, part 2): a session whose run was admitted and
    waits for a worker (or whose worker crashed) refuses the command's
    session lease (``SessionRecoveryRequiredError``, an idle-session
    purpose); the pass stopped there with exit 2, every later session left
    clear, run after run. It is sealed without a lease now (the reseal
    refuses while anyone holds a live one), and the pass goes on."""
    with turnkeeper.open_store(db) as store:
        store.runs.admit("a", {"q": SECRET})  # queued: no worker took it
    result = run("encrypt", "--db", db, key=K1)
    assert result.exit_code == 0, result.output
    assert "2 sessions sealed, 0 already sealed, 0 skipped" in result.stdout
    assert _clear_payloads(db) == 0
    with turnkeeper.open_store(db, encryption=LocalKeyProvider.from_text(K1)) as store:
        (queued,) = store.runs.list("a")
        assert store.runs.intent(queued.intent_id).request == {"q": SECRET}


def test_encrypt_skips_and_names_a_session_deleted_while_it_ran(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session deleted after the pass listed it (``RuntimeSessionNotFoundError``
    at its lease) is skipped and named (exit 1); the pass seals the others
    (it stopped with exit 2 and ran no reclaim)."""
    real = Leases.acquire

    def deleted_first(self: Any, target: str, *args: Any, **kwargs: Any) -> Any:
        if target == "session:a":  # what the lease of a session deleted meanwhile raises
            raise turnkeeper.RuntimeSessionNotFoundError("a")
        return real(self, target, *args, **kwargs)

    monkeypatch.setattr(Leases, "acquire", deleted_first)
    result = run("encrypt", "--db", db, "--json", key=K1)
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["skipped"] == {"a": "deleted meanwhile"} and report["sealed"] == 1
    assert report["reclaimed"]
