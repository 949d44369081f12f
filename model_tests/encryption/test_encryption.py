"""Encryption at rest, part 1 (issue 23): entry payloads sealed under per-session
data keys on both engines, typed and closed failure, crypto-shredding.

Each failure test flips, moves or swaps stored bytes with SQL, as someone
with the database (or a backup) in hand would, and a control test patches
the guard out to show the test can fail.
"""

from __future__ import annotations

import base64
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_KEYS, close_backend, forged_rows, open_backend, reopen

import turnkeeper
from turnkeeper import EntryKind, LocalKeyProvider
from turnkeeper.spec.records import ImportBatch, ImportEntry
from turnkeeper.storage.crypto import keyring as keyring_module
from turnkeeper.storage.crypto.seal import wrap_context

SECRET = "the launch code is 0000"
MSG = {"message": {"role": "user", "content": SECRET}}
REPLY = {"message": {"role": "assistant", "content": f"noted: {SECRET}"}}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _key(seed: int, key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(bytes([seed]) * 32).decode()}"


def _payloads(store: Any, sid: str) -> dict[str, str]:
    rows = store.query("SELECT id, payload FROM entries WHERE session_id = ?", [sid]).to_pylist()
    return {r["id"]: r["payload"] for r in rows}


def test_every_entry_write_path_stores_sealed_payloads_and_reads_them_back(enc):
    enc.sessions.create("s", cwd="/w")
    one = enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    enc.sessions.append_many("s", [(EntryKind.MESSAGE, REPLY)])
    enc.sessions.set_title("s", SECRET)
    enc.sessions.append("s", EntryKind.LABEL, {"targetId": one.id, "label": SECRET})
    enc.sessions.append(
        "s", EntryKind.CUSTOM, {"customType": "note", "text": SECRET}, entry_id="c-1"
    )
    run = enc.runs.admit("s", {"q": 1}, user_message={"role": "user", "content": SECRET})
    enc.runs.start(run.id)
    enc.runs.finish(run.id, "succeeded", assistant_message={"role": "assistant", "content": "ok"})
    enc.sessions.import_batch(
        ImportBatch(
            session_id="imp",
            cwd="/w",
            created_at=T0,
            header={},
            entries=[ImportEntry("i1", None, EntryKind.MESSAGE, T0, MSG)],
            leaf_id="i1",
        )
    )
    fork = enc.forks.fork("s", request_id="f")
    for sid in ("s", "imp", fork.fork_session_id):
        stored = _payloads(enc, sid)
        assert stored and all(p.startswith("enc1:") for p in stored.values()), sid
        assert not any(SECRET in p for p in stored.values())
    # read back through a store object with a cold key cache, every read path
    with reopen(enc, encryption=TEST_KEYS) as fresh:
        contents = [m["content"] for m in fresh.sessions.replay("s").messages]
        assert contents[:2] == [SECRET, f"noted: {SECRET}"]
        assert fresh.sessions.labels("s") == {one.id: SECRET}
        assert fresh.sessions.custom_entry("s", "note", "c-1").payload["text"] == SECRET
        assert [e.id for e in fresh.sessions.custom_entries("s", "note", limit=5)] == ["c-1"]
        assert fresh.sessions.messages_after("s", 0, limit=1)[0].message["content"] == SECRET
        assert fresh.sessions.entry("imp", "i1").payload == MSG
        forked = fresh.sessions.replay(fork.fork_session_id)
        assert [m["content"] for m in forked.messages] == contents
    # a fork's copy is sealed under its own data key, never the source's ciphertext
    src, copy = _payloads(enc, "s"), _payloads(enc, fork.fork_session_id)
    assert not set(src.values()) & set(copy.values())
    keys = enc.query("SELECT session_id, wrapped FROM session_keys ORDER BY session_id")
    wrapped = keys.to_pylist()
    assert len({bytes(r["wrapped"]) for r in wrapped}) == len(wrapped) == 3


def test_opened_without_its_key_serves_metadata_and_refuses_payloads(enc):
    enc.sessions.create("s", cwd="/w")
    enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    run = enc.runs.admit("s", {"q": 1}, user_message={"role": "user", "content": SECRET})
    before = _payloads(enc, "s")
    with reopen(enc) as bare:
        assert [s.id for s in bare.sessions.list().sessions] == ["s"]
        assert bare.sessions.get("s").entry_count == len(before)
        assert bare.runs.get(run.id).status == run.status
        for read in (
            lambda: bare.sessions.replay("s"),
            lambda: bare.sessions.entries("s"),
            lambda: bare.sessions.messages_after("s", 0, limit=5),
        ):
            with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
                read()
            assert (refused.value.session_id, refused.value.key_id) == ("s", None)
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            bare.sessions.append("s", EntryKind.MESSAGE, REPLY)
        assert refused.value.session_id == "s"
        with pytest.raises(turnkeeper.KeyUnavailableError):
            bare.sessions.create("new", cwd="/w")
        assert bare.sessions.get("new") is None
    assert _payloads(enc, "s") == before  # nothing written


def test_a_provider_without_the_master_key_or_a_wrong_key_is_refused_at_open(enc):
    """Attack F4: a provider lacking the store's master key, or holding another
    key under its id (a mistyped key file), is refused when the store opens,
    by the marker's check value: before it could wrap a new session's key
    under the wrong key (which the right key could then never open)."""
    enc.sessions.create("s", cwd="/w")
    enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    other_id = LocalKeyProvider.from_text(_key(7, "another"))
    wrong_bytes = LocalKeyProvider.from_text(_key(9, TEST_KEYS.key_id))
    for provider, cause in ((other_id, "not hold"), (wrong_bytes, "fails authentication")):
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            reopen(enc, encryption=provider)
        assert refused.value.key_id == TEST_KEYS.key_id
        assert "check value" in str(refused.value)
        assert isinstance(refused.value.__cause__, turnkeeper.KeyUnwrapError)
        assert cause in str(refused.value.__cause__)
    with _fresh(enc) as s:  # the right key opens it, and nothing was written
        assert [m["content"] for m in s.sessions.replay("s").messages] == [SECRET]
        assert len(_payloads(enc, "s")) == 1


def test_control_without_the_check_value_a_wrong_key_opens_and_writes(enc, monkeypatch):
    """Control for the check at open: with it skipped, a wrong key under the
    right id opens the store and wraps a new session's key that the right
    key cannot open."""
    enc.sessions.create("s", cwd="/w")
    wrong = LocalKeyProvider.from_text(_key(9, TEST_KEYS.key_id))
    real = keyring_module.Keyring.adopt

    def unchecked(self: Any, tx: Any, *, writable: bool) -> None:
        saved, self.provider = self.provider, None
        try:
            real(self, tx, writable=writable)
        finally:
            self.provider = saved

    monkeypatch.setattr(keyring_module.Keyring, "adopt", unchecked)
    with reopen(enc, encryption=wrong) as s:
        s.sessions.create("t", cwd="/w")
        s.sessions.append("t", EntryKind.MESSAGE, MSG)
    monkeypatch.undo()
    with _fresh(enc) as s, pytest.raises(turnkeeper.KeyUnavailableError):
        s.sessions.replay("t")


class _SessionKeysLost:
    """A provider holding the store's master key whose unwrap of any
    session's data key fails (a KMS that lost access to one key version)."""

    def __init__(self, inner: LocalKeyProvider) -> None:
        self.inner = inner
        self.key_id = inner.key_id

    def wrap(self, key: bytes, context: bytes) -> bytes:
        return self.inner.wrap(key, context)

    def unwrap(self, wrapped: bytes, key_id: str, context: bytes) -> bytes:
        if context != keyring_module.CHECK_CONTEXT:
            raise turnkeeper.KeyUnwrapError(key_id, detail="this provider does not hold that key")
        return self.inner.unwrap(wrapped, key_id, context)


def test_a_session_key_the_provider_cannot_unwrap_is_key_unavailable(enc):
    enc.sessions.create("s", cwd="/w")
    enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    with reopen(enc, encryption=_SessionKeysLost(TEST_KEYS)) as s:
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            s.sessions.replay("s")
        assert (refused.value.session_id, refused.value.key_id) == ("s", TEST_KEYS.key_id)
        assert isinstance(refused.value.__cause__, turnkeeper.KeyUnwrapError)
        with pytest.raises(turnkeeper.KeyUnavailableError):
            s.sessions.append("s", EntryKind.MESSAGE, REPLY)
    assert len(_payloads(enc, "s")) == 1


def _fresh(enc: Any) -> Any:
    return reopen(enc, encryption=TEST_KEYS)


def _refused(store: Any, sid: str, entry_id: str) -> None:
    with pytest.raises(turnkeeper.PayloadAuthenticationError) as refused:
        store.sessions.replay(sid)  # never a partial list as if whole
    assert (refused.value.session_id, refused.value.record_id, refused.value.field) == (
        sid,
        entry_id,
        "payload",
    )
    with pytest.raises(turnkeeper.PayloadAuthenticationError):
        store.sessions.entry(sid, entry_id)


def test_a_flipped_byte_fails_authentication(enc):
    enc.sessions.create("s", cwd="/w")
    first = enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    enc.sessions.append("s", EntryKind.MESSAGE, REPLY)
    stored = _payloads(enc, "s")[first.id]
    raw = bytearray(base64.b64decode(stored[5:]))
    raw[-1] ^= 1
    flipped = "enc1:" + base64.b64encode(bytes(raw)).decode()
    assert forged_rows(enc, "UPDATE entries SET payload = ? WHERE id = ?", [flipped, first.id])
    with _fresh(enc) as s:
        _refused(s, "s", first.id)


def test_a_value_moved_to_another_entry_or_session_fails_authentication(enc):
    enc.sessions.create("s", cwd="/w")
    enc.sessions.create("t", cwd="/w")
    a = enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    b = enc.sessions.append("s", EntryKind.MESSAGE, REPLY)
    c = enc.sessions.append("t", EntryKind.MESSAGE, MSG)
    stored = {**_payloads(enc, "s"), **_payloads(enc, "t")}
    assert forged_rows(enc, "UPDATE entries SET payload = ? WHERE id = ?", [stored[a.id], b.id])
    with _fresh(enc) as s:
        _refused(s, "s", b.id)
    assert forged_rows(enc, "UPDATE entries SET payload = ? WHERE id = ?", [stored[b.id], b.id])
    assert forged_rows(enc, "UPDATE entries SET payload = ? WHERE id = ?", [stored[c.id], a.id])
    with _fresh(enc) as s:
        _refused(s, "s", a.id)


def test_a_clear_value_in_a_sealed_session_is_a_downgrade(enc):
    enc.sessions.create("s", cwd="/w")
    a = enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    assert forged_rows(
        enc, "UPDATE entries SET payload = ? WHERE id = ?", ['{"message":{"role":"user"}}', a.id]
    )
    with _fresh(enc) as s:
        _refused(s, "s", a.id)


def test_control_without_the_downgrade_check_a_forged_clear_value_is_served(enc, monkeypatch):
    """The control of the test above: with the check patched out, the forged
    clear payload is returned as if it were the session's."""
    enc.sessions.create("s", cwd="/w")
    a = enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    forged = '{"message":{"role":"user","content":"forged"}}'
    assert forged_rows(enc, "UPDATE entries SET payload = ? WHERE id = ?", [forged, a.id])
    monkeypatch.setattr(keyring_module.Keyring, "_has_key", lambda self, tx, sid: False)
    with _fresh(enc) as s:
        assert s.sessions.replay("s").messages[0]["content"] == "forged"


def test_a_value_sealed_under_a_version_the_session_does_not_hold(enc):
    enc.sessions.create("s", cwd="/w")
    a = enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    raw = bytearray(base64.b64decode(_payloads(enc, "s")[a.id][5:]))
    raw[4:8] = (2).to_bytes(4, "big")
    assert forged_rows(
        enc,
        "UPDATE entries SET payload = ? WHERE id = ?",
        ["enc1:" + base64.b64encode(bytes(raw)).decode(), a.id],
    )
    with _fresh(enc) as s:
        _refused(s, "s", a.id)


def test_swapped_wrapped_keys_are_key_unavailable(enc):
    enc.sessions.create("s", cwd="/w")
    enc.sessions.create("t", cwd="/w")
    enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    wrapped = {
        r["session_id"]: bytes(r["wrapped"])
        for r in enc.query("SELECT session_id, wrapped FROM session_keys").to_pylist()
    }
    assert forged_rows(
        enc, "UPDATE session_keys SET wrapped = ? WHERE session_id = 's'", [wrapped["t"]]
    )
    with _fresh(enc) as s:
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            s.sessions.replay("s")
        assert refused.value.session_id == "s"
        assert isinstance(refused.value.__cause__, turnkeeper.KeyUnwrapError)


def test_a_clear_store_is_unchanged_and_a_session_from_before_stays_clear(tmp_path: Path):
    path = str(tmp_path / "s.duckdb")
    with turnkeeper.open_store(path) as clear:
        clear.sessions.create("old", cwd="/w")
        clear.sessions.append("old", EntryKind.MESSAGE, MSG)
        assert clear.query("SELECT count(*) AS n FROM store_encryption").to_pylist()[0]["n"] == 0
    with turnkeeper.open_store(path, encryption=TEST_KEYS) as s:
        s.sessions.append("old", EntryKind.MESSAGE, REPLY)  # no data key: clear, as before
        assert all(SECRET in p for p in _payloads(s, "old").values())
        assert s.sessions.replay("old").messages[0]["content"] == SECRET
        s.sessions.create("new", cwd="/w")
        s.sessions.append("new", EntryKind.MESSAGE, MSG)
        assert all(p.startswith("enc1:") for p in _payloads(s, "new").values())
    with turnkeeper.open_store(path) as bare:  # marked: no new clear session
        with pytest.raises(turnkeeper.KeyUnavailableError):
            bare.sessions.create("later", cwd="/w")
        assert bare.sessions.replay("old").messages[0]["content"] == SECRET


def test_a_delete_shreds_the_key_and_a_backup_cannot_be_read_once_the_old_master_key_retires(
    tmp_path: Path,
):
    """A backup (a copy of the DuckDB file) taken before a delete holds the
    session's entries and its data key wrapped by master key ``k1``. After
    the delete the live store holds no key of that session; its remaining
    data keys and its check value are rewrapped to ``k2`` (``store.keys.rotate``) and
    ``k1`` is retired. The backup opened with the provider the user still
    holds (``k2`` only) is refused (its check value is ``k1``'s); given the
    live store's wrapped keys and check value (a restore), it reads the kept
    session and not the deleted one: no key of it is left anywhere. Before
    the retirement (``k1`` held) the backup could still be read: what
    crypto-shredding guarantees is exactly that, once every master key that
    wrapped a deleted session's data key is retired."""
    k1 = LocalKeyProvider.from_text(_key(1, "k1"))
    live, backup = tmp_path / "live.duckdb", tmp_path / "backup.duckdb"
    with turnkeeper.open_store(str(live), encryption=k1) as s:
        for sid in ("gone", "kept"):
            s.sessions.create(sid, cwd="/w")
            s.sessions.append(sid, EntryKind.MESSAGE, MSG)
    shutil.copyfile(live, backup)
    both = LocalKeyProvider.from_text(_key(2, "k2") + "\n" + _key(1, "k1"))
    with turnkeeper.open_store(str(live), encryption=k1) as s:
        s.sessions.delete("gone")
        assert s.query("SELECT session_id FROM session_keys").to_pylist() == [
            {"session_id": "kept"}
        ]
    with turnkeeper.open_store(str(live), encryption=both) as s:  # k2 current, k1 old
        # the rotation: every remaining data key and the check rewrapped from k1 to k2
        lease = s.leases.acquire("keys:rotation", "rotator", ttl_s=60)
        report = s.keys.rotate(lease)
        assert (report.rewrapped, report.remaining, report.check_rewrapped) == (1, 0, True)
        check = bytes(
            s.query("SELECT check_wrapped FROM store_encryption").to_pylist()[0]["check_wrapped"]
        )
        keys = s.query("SELECT * FROM session_keys").to_pylist()
    k2 = LocalKeyProvider.from_text(_key(2, "k2"))  # k1 retired
    with turnkeeper.open_store(str(live), encryption=k2) as s:
        assert s.sessions.replay("kept").messages[0]["content"] == SECRET
    with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
        turnkeeper.open_store(str(backup), encryption=k2)
    assert refused.value.key_id == "k1"
    with turnkeeper.open_store(str(backup), encryption=k1) as old:  # before retirement: readable
        assert old.sessions.replay("gone").messages[0]["content"] == SECRET
        # a restore: the live store's wrapped keys and check value into the backup
        assert forged_rows(old, "DELETE FROM session_keys")
        for row in keys:
            assert forged_rows(
                old,
                "INSERT INTO session_keys VALUES (?, ?, ?, ?, ?)",
                [row[c] for c in ("session_id", "version", "key_id", "wrapped", "created_at")],
            )
        assert forged_rows(
            old,
            "UPDATE store_encryption SET check_key_id = ?, check_wrapped = ?",
            ["k2", check],
        )
    with turnkeeper.open_store(str(backup), encryption=k2) as old:
        assert SECRET not in str(old.query("SELECT payload FROM entries").to_pylist())
        assert old.sessions.replay("kept").messages[0]["content"] == SECRET
        with pytest.raises(turnkeeper.KeyUnavailableError) as shredded:
            old.sessions.replay("gone")
        assert (shredded.value.session_id, shredded.value.key_id) == ("gone", None)
        assert "crypto-shredded" in str(shredded.value)


def test_a_delete_drops_the_cached_key(enc):
    enc.sessions.create("s", cwd="/w")
    enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    enc.sessions.replay("s")
    assert enc.db.keyring._cached("s")
    enc.sessions.delete("s")
    assert enc.db.keyring._cached("s") is None
    assert enc.query("SELECT count(*) AS n FROM session_keys").to_pylist()[0]["n"] == 0


def test_encryption_must_be_a_key_provider(tmp_path: Path):
    with pytest.raises(turnkeeper.InvalidInputError) as bad:
        turnkeeper.open_store(str(tmp_path / "x.duckdb"), encryption="secret")  # type: ignore[arg-type]
    assert bad.value.field == "encryption"
    assert not (tmp_path / "x.duckdb").exists()


def test_the_cli_generates_a_key_and_reads_it_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from click.testing import CliRunner

    from turnkeeper.cli.main import cli

    monkeypatch.delenv("TURNKEEPER_MASTER_KEY", raising=False)
    runner = CliRunner()
    made = runner.invoke(cli, ["keys", "generate", "--id", "cli-key"], catch_exceptions=False)
    line = made.output.strip()
    assert made.exit_code == 0 and line.startswith("cli-key:")
    assert LocalKeyProvider.from_text(line).key_id == "cli-key"
    key_file = tmp_path / "master.key"
    key_file.write_text(line + "\n")
    db = str(tmp_path / "c.duckdb")
    with turnkeeper.open_store(db, encryption=LocalKeyProvider.from_text(line)) as s:
        s.sessions.create("s", cwd="/w")
        s.sessions.append("s", EntryKind.MESSAGE, MSG)
    show = ["sessions", "show", "s", "--db", db, "--flat"]
    bare = runner.invoke(cli, show, catch_exceptions=False)
    assert bare.exit_code == 2 and "KeyUnavailableError" in bare.output, bare.output
    keyed = runner.invoke(cli, ["--key-file", str(key_file), *show], catch_exceptions=False)
    assert keyed.exit_code == 0 and SECRET in keyed.output, keyed.output
    monkeypatch.setenv("TURNKEEPER_MASTER_KEY", line)
    from_env = runner.invoke(cli, show, catch_exceptions=False)
    assert from_env.exit_code == 0 and SECRET in from_env.output, from_env.output
    report = runner.invoke(cli, ["report", "--db", db], catch_exceptions=False)
    assert report.exit_code == 0, report.output  # a sealed payload is skipped by SQL figures


def test_a_store_object_opened_before_the_store_was_encrypted_refuses_sealed_payloads(
    tmp_path: Path,
):
    """Opened clear, then the store is marked encrypted by another opener: the
    first store object's reads of a sealed payload are typed, never a JSON
    decoding error or ciphertext."""
    path = str(tmp_path / "s.duckdb")
    with (
        turnkeeper.open_store(path) as early,
        turnkeeper.open_store(path, encryption=TEST_KEYS) as s,
    ):
        s.sessions.create("s", cwd="/w")
        s.sessions.append("s", EntryKind.MESSAGE, MSG)
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            early.sessions.replay("s")
        assert (refused.value.session_id, refused.value.key_id) == ("s", None)


def _rotate_by_hand(store: Any, sid: str) -> Any:
    """Version 2 of ``sid``'s data key, stored and named on the session row as
    a rotation does (its payloads not re-sealed: not needed here)."""
    from turnkeeper.storage.crypto.seal import DataKey

    newer = DataKey.new(sid, 2)
    assert forged_rows(
        store,
        "INSERT INTO session_keys (session_id, version, key_id, wrapped, created_at) "
        "VALUES (?, 2, ?, ?, now())",
        [sid, TEST_KEYS.key_id, TEST_KEYS.wrap(newer.key, wrap_context(sid, 2))],
    )
    assert forged_rows(store, "UPDATE sessions SET key_version = 2 WHERE id = ?", [sid])
    return newer


def test_a_writer_seals_under_the_session_rows_key_version_with_an_older_one_cached(enc):
    """The writer seals under the version the session row names (read with
    its head): a data key replaced since (a rotation; here by hand) is never
    used again by a store object that cached it."""
    from turnkeeper.storage.crypto.seal import key_version, text_bytes

    enc.sessions.create("s", cwd="/w")
    first = enc.sessions.append("s", EntryKind.MESSAGE, MSG)  # version 1 now cached
    newer = _rotate_by_hand(enc, "s")
    second = enc.sessions.append("s", EntryKind.MESSAGE, REPLY)
    stored = _payloads(enc, "s")
    assert key_version(text_bytes(stored[first.id]) or b"") == 1
    assert key_version(text_bytes(stored[second.id]) or b"") == 2
    assert newer.open_text(second.id, "payload", stored[second.id]).startswith("{")
    with _fresh(enc) as s:
        assert [m["content"] for m in s.sessions.replay("s").messages] == [
            SECRET,
            f"noted: {SECRET}",
        ]


def _append_at(store: Any, head: tuple[Any, ...]) -> str:
    """An append judged at ``head`` (leaf, next seq, key version) as a writer
    read it earlier: ``"written"``, or ``"lost"`` when its compare-and-set
    of the session row failed (nothing written)."""
    from turnkeeper.storage.backend import Conflict
    from turnkeeper.storage.ops import session_rows

    def body(tx: Any) -> str:
        draft = session_rows.own_draft(EntryKind.MESSAGE, MSG, "late")
        try:
            session_rows.append_chain(
                tx, "s", [draft], expected_leaf=session_rows.ANY_LEAF, lease=None, head=head
            )
        except Conflict:
            return "lost"
        return "written"

    return str(store.db.write("late", body))


def test_an_append_judged_at_an_older_key_version_loses_its_compare_and_set(enc):
    """A writer that read the session's head before a rotation committed (its
    key version 1, the row's now 2) loses the head's compare-and-set: it
    never writes values sealed under a key the session moved off."""
    enc.sessions.create("s", cwd="/w")
    enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    (head,) = enc.query("SELECT leaf_id, next_seq FROM sessions WHERE id = 's'").to_pylist()
    leaf, seq = head["leaf_id"], head["next_seq"]
    _rotate_by_hand(enc, "s")
    assert _append_at(enc, (leaf, seq, 1)) == "lost"
    assert "late" not in _payloads(enc, "s")
    assert _append_at(enc, (leaf, seq, 2)) == "written"


def test_control_without_the_key_version_in_the_compare_and_set_the_stale_append_lands(
    enc, monkeypatch
):
    """Control of the test above: with the key version left out of the head's
    compare-and-set, the append judged at version 1 writes a value sealed
    under version 1 into a session whose row names version 2."""
    from turnkeeper.storage.ops import session_rows

    enc.sessions.create("s", cwd="/w")
    enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    (head,) = enc.query("SELECT leaf_id, next_seq FROM sessions WHERE id = 's'").to_pylist()
    leaf, seq = head["leaf_id"], head["next_seq"]
    _rotate_by_hand(enc, "s")
    monkeypatch.setattr(
        session_rows,
        "HEAD_IS",
        "next_seq = ? AND leaf_id IS NOT DISTINCT FROM ? AND ?::BIGINT IS NOT NULL",
    )
    assert _append_at(enc, (leaf, seq, 1)) == "written"


ENCRYPTED_TURN = {"duckdb": 27, "postgres": 17}
"""Statements of ``reports/bench.py``'s three-transaction turn with encryption
on, at most (clear: 27 and 12, ``test_turn_statements.py``): the writers
take the session's data key version from the head they read anyway
(schema 34), so DuckDB's turn costs what a clear one does; PostgreSQL's
sealed append runs in a transaction (5 statements more: no one-statement
append for sealed payloads)."""


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_an_encrypted_turn_costs_at_most_its_ceiling_of_statements(backend, tmp_path: Path):
    from conftest import through_pooler
    from test_turn_statements import PINNED, _bench

    store = open_backend(f"{backend}+enc", tmp_path, None)
    try:
        counted = _bench().turn_statements(store)
        pinned = 3 * PINNED if backend == "postgres" and through_pooler() else 0
        assert counted["total"] <= ENCRYPTED_TURN[backend] + pinned, counted
        (session,) = store.sessions.list().sessions
        assert all(p.startswith("enc1:") for p in _payloads(store, session.id).values())
    finally:
        close_backend(store)


class _Refusing:
    """A key provider (a KMS stand-in) whose ``wrap`` fails, for telling
    whether a write wrapped before its transaction began."""

    def __init__(self, inner: LocalKeyProvider) -> None:
        self.inner = inner
        self.refuse = False

    @property
    def key_id(self) -> str:
        return self.inner.key_id

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        if self.refuse:
            raise OSError("the KMS is unreachable")
        return self.inner.wrap(data_key, context)

    def unwrap(self, wrapped: bytes, key_id: str, context: bytes) -> bytes:
        return self.inner.unwrap(wrapped, key_id, context)


def test_a_new_sessions_data_key_is_wrapped_before_its_transaction(tmp_path: Path):
    """A KMS's wrap is a network call: ``sessions.create`` and ``forks.fork``
    make it before their transaction begins (a failed wrap sends no statement)."""
    provider = _Refusing(TEST_KEYS)
    with turnkeeper.open_store(str(tmp_path / "k.duckdb"), encryption=provider) as s:
        provider.refuse = True
        with pytest.raises(OSError):
            s.sessions.create("s", cwd="/w")
        assert "create_session" not in s.statement_stats()
        provider.refuse = False
        s.sessions.create("s", cwd="/w")
        assert s.sessions.get("s") is not None
        assert not s.db.keyring._prepared  # the prepared key was used


def test_control_without_preparing_the_wrap_runs_inside_the_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The control of the test above: with ``prepare`` patched out the wrap
    is made inside the creating transaction, which has begun (and is counted)."""
    monkeypatch.setattr(keyring_module.Keyring, "prepare", lambda self, sid: None)
    provider = _Refusing(TEST_KEYS)
    with turnkeeper.open_store(str(tmp_path / "k.duckdb"), encryption=provider) as s:
        provider.refuse = True
        with pytest.raises(OSError):
            s.sessions.create("s", cwd="/w")
        assert "create_session" in s.statement_stats()


class _Misbehaving(_Refusing):
    """A key provider whose ``unwrap`` gives back something that is no data key."""

    def __init__(self, inner: LocalKeyProvider, gives: Any) -> None:
        super().__init__(inner)
        self.gives = gives

    def unwrap(self, wrapped: bytes, key_id: str, context: bytes) -> bytes:
        if context == keyring_module.CHECK_CONTEXT and not self.at_check:
            return self.inner.unwrap(wrapped, key_id, context)
        return self.gives  # type: ignore[no-any-return]

    at_check = False


@pytest.mark.parametrize("gives", [b"k" * 16, None, "k" * 32, b"k" * 32])
def test_a_provider_that_unwraps_other_bytes_at_the_check_is_refused_at_open(enc, gives: Any):
    provider = _Misbehaving(TEST_KEYS, gives)
    provider.at_check = True
    with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
        reopen(enc, encryption=provider)
    assert (refused.value.session_id, refused.value.key_id) == ("", TEST_KEYS.key_id)
    assert "check value gave other bytes" in str(refused.value)


@pytest.mark.parametrize("gives", [b"k" * 16, None, "k" * 32])
def test_a_provider_that_unwraps_no_32_byte_key_is_key_unavailable(enc, gives: Any):
    """Its 16 bytes were reported as a flipped byte of the data, its ``None``
    as a bare ``TypeError`` (attack F7): the provider's fault is named."""
    enc.sessions.create("s", cwd="/w")
    enc.sessions.append("s", EntryKind.MESSAGE, MSG)
    with reopen(enc, encryption=_Misbehaving(TEST_KEYS, gives)) as s:
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            s.sessions.replay("s")
        assert (refused.value.session_id, refused.value.key_id) == ("s", TEST_KEYS.key_id)
        assert "32-byte key" in str(refused.value)


def _forked_after_a_retry(enc: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fork whose first transaction made the fork's data key, sealed its
    copy, and then lost (a conflict, as a racing delete of its source gave
    attack F1): the retry makes a key of its own. The fork's id."""
    from turnkeeper.storage.backend import Conflict
    from turnkeeper.storage.ops import forks

    enc.sessions.create("s", cwd="/w")
    run = enc.runs.admit("s", {"q": 1}, user_message={"role": "user", "content": SECRET})
    enc.runs.start(run.id)
    enc.runs.finish(run.id, "succeeded", assistant_message={"role": "assistant", "content": "ok"})
    real = forks.seal_payloads
    attempts: list[int] = []

    def losing_once(tx: Any, *args: Any) -> Any:
        sealed = real(tx, *args)
        attempts.append(1)
        if len(attempts) == 1:
            raise Conflict("the first attempt loses after sealing")
        return sealed

    monkeypatch.setattr(forks, "seal_payloads", losing_once)
    fork = enc.forks.fork("s", request_id="f")
    monkeypatch.undo()
    assert len(attempts) == 2
    return fork.fork_session_id


def test_a_fork_retried_after_sealing_seals_under_the_key_it_stored(enc, monkeypatch):
    """Attack F1: the first attempt's key (made in a transaction that rolled
    back) is never taken for the key the retry stored: the fork reads back
    in the store object that made it and in a fresh one (a restart)."""
    fid = _forked_after_a_retry(enc, monkeypatch)
    assert next(m["content"] for m in enc.sessions.replay(fid).messages) == SECRET
    with _fresh(enc) as s:
        assert next(m["content"] for m in s.sessions.replay(fid).messages) == SECRET


def test_control_a_made_key_cached_as_the_stores_seals_the_retry_under_the_lost_key(
    enc, monkeypatch
):
    """Control of the test above: with the key a transaction made cached for
    the store object at once (as before the fix: a key unwrapped from the
    row the same transaction inserted was cached), the retry seals under
    the first attempt's key, and a fresh store object cannot open the fork."""
    real_new, real_sealing = keyring_module.Keyring.new_session, keyring_module.Keyring.sealing

    def new_session(self: Any, tx: Any, sid: str) -> Any:
        version = real_new(self, tx, sid)
        if version is not None and self._cached(sid) is None:
            self._remember(sid, tx.made_keys.pop((sid, version)))
        return version

    def sealing(self: Any, tx: Any, sid: str, version: Any = keyring_module.UNREAD) -> Any:
        held = self._cached(sid)  # the store object's cache before the transaction's own
        if held and version in held:
            return held[version], version
        return real_sealing(self, tx, sid, version)

    monkeypatch.setattr(keyring_module.Keyring, "new_session", new_session)
    monkeypatch.setattr(keyring_module.Keyring, "sealing", sealing)
    fid = _forked_after_a_retry(enc, monkeypatch)
    with _fresh(enc) as s, pytest.raises(turnkeeper.PayloadAuthenticationError):
        s.sessions.replay(fid)
