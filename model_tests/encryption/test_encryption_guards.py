"""Encryption at rest (issue 23): the session row's data key version guards.

``sessions.key_version`` (schema 34) is read with every append's head and
named in its compare-and-set: a store object that took the store for clear
(opened before the store was first opened with a key: attack F2) never
writes a clear payload into a sealed session or creates a clear session
once the store is marked, and a session whose key row is gone (attack F3)
refuses writes and clear values instead of downgrading. Each guard has a
control that patches it out and sees the clear write land.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_KEYS, close_backend, forged_rows, open_backend, reopen

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.fuzz import FakeClock
from turnkeeper.storage.crypto import keyring as keyring_module
from turnkeeper.storage.ops import appends, listing, session_rows

SECRET = "the launch code is 0000"
MSG = {"message": {"role": "user", "content": SECRET}}


def _payloads(store: Any, sid: str) -> list[str]:
    rows = store.query(
        "SELECT payload FROM entries WHERE session_id = ? ORDER BY seq", [sid]
    ).to_pylist()
    return [r["payload"] for r in rows]


@pytest.fixture(params=["duckdb", "postgres"])
def before_marking(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[tuple[Any, Any]]:
    """A store object opened without keys on a clear store, then another one
    opened with keys (which marks the store encrypted) holding a sealed
    session ``sealed``: (clear object, keyed object)."""
    clear = open_backend(request.param, tmp_path, clock)
    keyed = reopen(clear, encryption=TEST_KEYS, clock=clock)
    keyed.sessions.create("sealed", cwd="/w")
    keyed.sessions.append("sealed", EntryKind.MESSAGE, MSG)
    try:
        yield clear, keyed
    finally:
        keyed.close()
        close_backend(clear)


def test_a_store_object_opened_before_marking_writes_nothing_clear(before_marking):
    clear, keyed = before_marking
    keyed.sessions.create("empty", cwd="/w")
    custom = {"customType": "n", "text": SECRET}  # (PostgreSQL: the one-statement append)
    for sid, kind, payload in (
        ("empty", EntryKind.CUSTOM, custom),
        ("sealed", EntryKind.MESSAGE, MSG),
        ("empty", EntryKind.MESSAGE, MSG),
    ):
        with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
            clear.sessions.append(sid, kind, payload)
        assert (refused.value.session_id, refused.value.key_id) == (sid, None)
    assert not _payloads(keyed, "empty")
    with pytest.raises(turnkeeper.KeyUnavailableError):
        clear.sessions.append_many("sealed", [(EntryKind.MESSAGE, MSG)] * 2)
    with pytest.raises(turnkeeper.KeyUnavailableError) as created:
        clear.sessions.create("late", cwd="/w")
    assert created.value.session_id == "late"
    assert clear.sessions.get("late") is None
    stored = _payloads(keyed, "sealed")
    assert len(stored) == 1 and stored[0].startswith("enc1:")
    assert [m["content"] for m in keyed.sessions.replay("sealed").messages] == [SECRET]


def test_control_without_the_key_version_in_the_head_a_clear_append_lands(
    before_marking, monkeypatch
):
    """Control: with the head read and compare-and-set blind to the key
    version (as before schema 34), and the one-statement append's check of
    it dropped, the store object that took the store for clear writes a
    clear payload into the sealed session."""
    clear, keyed = before_marking
    keyed.sessions.create("empty", cwd="/w")  # (no sealed entry the append reads)
    monkeypatch.setattr(
        session_rows, "HEAD_READ", "SELECT leaf_id, next_seq, NULL FROM sessions WHERE id = ?"
    )
    monkeypatch.setattr(
        session_rows,
        "HEAD_IS",
        "next_seq = ? AND leaf_id IS NOT DISTINCT FROM ? AND ?::BIGINT IS NULL",
    )
    monkeypatch.setattr(appends, "CLEAR_SESSION", "TRUE")
    clear.sessions.append("empty", EntryKind.MESSAGE, MSG)
    assert _payloads(keyed, "empty")[0].startswith("{")


def test_a_session_whose_key_row_is_gone_refuses_writes_and_clear_values(before_marking):
    """Attack F3: a session's key row deleted (by SQL, a partial restore):
    an append is refused, typed, instead of being stored clear; an empty
    session's too; and a clear payload forged into it is refused on read."""
    _, keyed = before_marking
    keyed.sessions.create("empty", cwd="/w")
    assert forged_rows(keyed, "DELETE FROM session_keys")
    with reopen(keyed, encryption=TEST_KEYS) as fresh:
        for sid in ("sealed", "empty"):
            with pytest.raises(turnkeeper.KeyUnavailableError) as refused:
                fresh.sessions.append(sid, EntryKind.MESSAGE, MSG)
            assert refused.value.session_id == sid
        assert len(_payloads(keyed, "sealed")) == 1 and not _payloads(keyed, "empty")
    assert forged_rows(
        keyed, "UPDATE entries SET payload = ? WHERE session_id = 'sealed'", ['{"x": 1}']
    )
    with (
        reopen(keyed, encryption=TEST_KEYS) as fresh,
        pytest.raises(turnkeeper.PayloadAuthenticationError),
    ):
        fresh.sessions.replay("sealed")


def test_control_a_session_taken_for_clear_by_its_key_row_accepts_a_forged_clear_value(
    before_marking, monkeypatch
):
    """Control: judged by its key rows (as before schema 34) instead of the
    session row's key version, the session whose key row was deleted passes
    a forged clear payload off as its own."""
    _, keyed = before_marking
    assert forged_rows(keyed, "DELETE FROM session_keys")
    assert forged_rows(
        keyed, "UPDATE entries SET payload = ? WHERE session_id = 'sealed'", ['{"x": 1}']
    )
    monkeypatch.setattr(
        keyring_module,
        "_VERSION",
        "SELECT max(version) FROM session_keys WHERE session_id = ?",
    )
    with reopen(keyed, encryption=TEST_KEYS) as fresh:
        assert fresh.sessions.entry("sealed", _ids(keyed)[0]).payload == {"x": 1}


def _ids(store: Any) -> list[str]:
    rows = store.query("SELECT id FROM entries WHERE session_id = 'sealed' ORDER BY seq")
    return [r["id"] for r in rows.to_pylist()]


def _merged_appends(clear: Any, sids: list[str], monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Appends of ``sids`` queued together behind DuckDB's write lock, tried
    as one merged group (``appends.append_group``; a lost compare-and-set
    splits it, each append then runs alone): each caller's outcome."""
    from test_group_commit import queued_together

    real, groups = appends.append_group, []

    def counted(tx: Any, requests: list[Any]) -> list[Any]:
        groups.append(len(requests))
        return real(tx, requests)

    monkeypatch.setattr(appends, "append_group", counted)
    got = queued_together(
        clear, [lambda s=s: clear.sessions.append(s, EntryKind.MESSAGE, MSG) for s in sids]
    )
    assert groups and groups[0] == len(sids), f"the appends were not merged: {groups}"
    return got


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "control"])
def test_a_merged_clear_append_never_lands_in_a_sealed_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guarded: bool
):
    """DuckDB's merged appends (a clear store object's plain appends, queued
    together) name the session's clear key version in their compare-and-set:
    the one into a sealed session loses and, alone, is refused typed; the
    clear ones land. Control: with that condition patched out (as before
    schema 34, ``appends.CLEAR_SESSION`` and the head's key version), the
    clear payload lands in the sealed session."""
    path = str(tmp_path / "s.duckdb")
    with turnkeeper.open_store(path) as clear:
        for sid in ("c1", "c2"):
            clear.sessions.create(sid, cwd="/w")
        with turnkeeper.open_store(path, encryption=TEST_KEYS) as keyed:
            keyed.sessions.create("empty", cwd="/w")
        if not guarded:
            monkeypatch.setattr(
                appends, "_MOVE_HEADS", appends._MOVE_HEADS.replace(appends.CLEAR_SESSION, "TRUE")
            )
            monkeypatch.setattr(
                session_rows,
                "HEAD_READ",
                "SELECT leaf_id, next_seq, NULL FROM sessions WHERE id = ?",
            )
            monkeypatch.setattr(
                session_rows,
                "HEAD_IS",
                "next_seq = ? AND leaf_id IS NOT DISTINCT FROM ? AND ?::BIGINT IS NULL",
            )
        got = _merged_appends(clear, ["c1", "empty", "c2"], monkeypatch)
        stored = clear.query("SELECT payload FROM entries WHERE session_id = 'empty'").to_pylist()
    assert isinstance(got[0], turnkeeper.Entry) and isinstance(got[2], turnkeeper.Entry)
    if guarded:
        assert isinstance(got[1], turnkeeper.KeyUnavailableError), got
        assert stored == []
    else:
        assert isinstance(got[1], turnkeeper.Entry) and stored[0]["payload"].startswith("{")


def test_control_without_its_clear_check_the_one_statement_append_lands_clear(
    monkeypatch, tmp_path: Path, clock: FakeClock
):
    """PostgreSQL's one-statement append (a clear store object's plain
    append) is refused in a sealed session by its own condition
    (``appends.CLEAR_SESSION``; the guard's test is
    ``test_a_store_object_opened_before_marking_writes_nothing_clear``),
    before the transaction's: patched out alone, the clear payload lands."""
    clear = open_backend("postgres", tmp_path, clock)
    try:
        with reopen(clear, encryption=TEST_KEYS) as keyed:
            keyed.sessions.create("empty", cwd="/w")
        monkeypatch.setattr(appends, "CLEAR_SESSION", "TRUE")
        # (a custom entry: the pairing rule needs no head the object knows)
        clear.sessions.append("empty", EntryKind.CUSTOM, {"customType": "n", "text": SECRET})
        assert _payloads(clear, "empty")[0].startswith("{")
    finally:
        close_backend(clear)


@pytest.mark.parametrize("keyed_audit", [True, False], ids=["with-key", "without-key"])
def test_audit_reports_a_damaged_ciphertext_and_checks_the_rest(tmp_path: Path, keyed_audit: bool):
    """Attack F6: ``turnkeeper audit`` of an encrypted store with one flipped
    byte in session ``a`` exits 1 with ``payloads_open`` failing and naming
    the session and entry, the other checks run (it stopped at the first
    sealed payload with exit 2). Without the key it opens no payload, says
    so, and runs the metadata checks (exit 0)."""
    import base64
    import json

    from click.testing import CliRunner

    from turnkeeper.cli.main import cli

    key = tmp_path / "key"
    key.write_text(turnkeeper.LocalKeyProvider.generate("k1") + "\n")
    key.chmod(0o600)
    path = str(tmp_path / "s.duckdb")
    with turnkeeper.open_store(path, encryption=turnkeeper.LocalKeyProvider.from_file(key)) as s:
        for sid in ("a", "b"):
            s.sessions.create(sid, cwd="/w")
            s.sessions.append(sid, EntryKind.MESSAGE, MSG)
            s.sessions.append(sid, EntryKind.MESSAGE, MSG)
        (row,) = s.query(
            "SELECT id, payload FROM entries WHERE session_id = 'a' LIMIT 1"
        ).to_pylist()
        raw = bytearray(base64.b64decode(row["payload"][5:]))
        raw[-1] ^= 1
        flipped = "enc1:" + base64.b64encode(bytes(raw)).decode()
        assert forged_rows(s, "UPDATE entries SET payload = ? WHERE id = ?", [flipped, row["id"]])
    args = ["--key-file", str(key)] if keyed_audit else []
    result = CliRunner().invoke(cli, [*args, "audit", "--db", path, "--json"])
    checks = {c["name"]: c for c in json.loads(result.output)["audit"]}
    assert "session_trees_well_formed" in checks and "no_orphan_rows" in checks
    if keyed_audit:
        assert result.exit_code == 1, result.output
        assert checks["payloads_open"]["violations"] == 1
        assert f"a/entries.payload/{row['id']}" in checks["payloads_open"]["detail"]
        assert [n for n, c in checks.items() if not c["passed"]] == ["payloads_open"]
    else:
        assert result.exit_code == 0, result.output
        assert checks["payloads_open"]["passed"]
        assert "2 session(s) are sealed" in checks["payloads_open"]["detail"]


class _Named:
    """A key provider (the protocol's three members) with any ``key_id``."""

    def __init__(self, key_id: Any) -> None:
        self.key_id = key_id

    def wrap(self, key: bytes, context: bytes) -> bytes:
        return TEST_KEYS.wrap(key, context)

    def unwrap(self, wrapped: bytes, key_id: str, context: bytes) -> bytes:
        return TEST_KEYS.unwrap(wrapped, TEST_KEYS.key_id, context)


@pytest.mark.parametrize("key_id", ["", " ", "k\n1", "k\x00", 7])
def test_a_provider_whose_key_id_is_no_identifier_is_refused_at_open(tmp_path: Path, key_id):
    """Attack F7: a custom provider's empty or multi-line key id was stored
    beside every data key it wrapped; it is refused when the store opens,
    typed, and nothing is written (the file is not even marked)."""
    path = str(tmp_path / "s.duckdb")
    with pytest.raises(turnkeeper.InvalidInputError) as refused:
        turnkeeper.open_store(path, encryption=_Named(key_id))
    assert refused.value.field == "encryption"
    with turnkeeper.open_store(path) as clear:  # (a clear open: nothing marked it)
        clear.sessions.create("s", cwd="/w")


@pytest.mark.postgres
def test_a_sealed_write_racing_a_key_rotation_never_outlives_its_key(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
):
    """PostgreSQL: a writer of a sealed row that is no append (here
    ``runs.save_intent`` under the session's lease) reads the session's key
    version (1) and seals under it; a ``sessions.rotate_key`` of that
    session under the same lease (another thread of the holder) runs and
    commits before the writer goes on. The writer's fence then writes the
    lease's row, which the rotation wrote after the writer's snapshot: a
    lost race, retried with version 2, so the value reads back after version
    1's key is gone. (A lease-less writer and rotation meet on the session
    row, ``leases.touch_session``; the fences' own tests patch those writes
    out.)"""
    import threading

    from turnkeeper.storage.ops import sealed_json

    store = open_backend("postgres+enc", tmp_path, clock)
    try:
        store.sessions.create("s", cwd="/w")
        store.sessions.append("s", EntryKind.MESSAGE, MSG)
        lease = store.leases.acquire("session:s", "w", 600)
        real = sealed_json.session_version
        read, go = threading.Event(), threading.Event()

        def paused(tx: Any, sid: str) -> Any:
            version = real(tx, sid)
            if not read.is_set():
                read.set()
                assert go.wait(120), "never released"
            return version

        monkeypatch.setattr(sealed_json, "session_version", paused)
        outcome: list[Any] = []
        writer = threading.Thread(
            target=lambda: outcome.append(
                store.runs.save_intent("s", {"q": SECRET}, intent_id="i1", lease=lease)
            )
        )
        writer.start()
        assert read.wait(120), "the writer never read the key version"
        rotated: list[int] = []
        rotation = threading.Thread(
            target=lambda: rotated.append(store.sessions.rotate_key("s", lease=lease))
        )
        rotation.start()
        rotation.join()  # done while the writer's snapshot predates it
        go.set()
        writer.join()
        rotation.join()
        assert rotated == [2] and len(outcome) == 1
        with reopen(store, encryption=TEST_KEYS) as fresh:
            assert fresh.runs.intent("i1").request == {"q": SECRET}
    finally:
        close_backend(store)


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "control"])
def test_search_never_matches_a_sealed_session_by_its_ciphertext(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, checked: bool
) -> None:
    """Attack finding (issue 23, part 2): ``sessions.list(search=…)`` matched a
    sealed session's ``enc1:`` base64 (``enc1``, ``Qz``, ``+/`` found sessions
    holding none of it). A sealed session's payloads are not searched; a
    session still clear is, in its messages. Control: the old condition
    (every session's payloads) lists the sealed one for ``enc1``."""
    clear = open_backend("duckdb", tmp_path, clock)
    try:
        clear.sessions.create("plain", cwd="/w")  # before the store was marked: stays clear
        clear.sessions.append("plain", EntryKind.MESSAGE, MSG)
        with reopen(clear, encryption=TEST_KEYS, clock=clock) as keyed:
            for n in range(20):
                keyed.sessions.create(f"sealed-{n}", cwd="/w")
                keyed.sessions.append(f"sealed-{n}", EntryKind.MESSAGE, MSG)
            if not checked:
                monkeypatch.setattr(
                    listing, "_SEARCH", listing._SEARCH.replace("s.key_version IS NULL", "TRUE")
                )

            def found(text: str) -> list[str]:
                return [s.id for s in keyed.sessions.list(search=text, limit=100).sessions]

            if not checked:  # the wrong answer the condition prevents
                assert len(found("enc1")) == 20
                return
            for noise in ("enc1", "Qz", "+/", "=="):
                assert found(noise) == [], noise
            assert found("launch code") == ["plain"]  # a clear session's message text
            ids = {f"sealed-{n}" for n in (1, *range(10, 20))}
            assert set(found("sealed-1")) == ids  # ids are still searched
    finally:
        close_backend(clear)
