"""Stored replay snapshots (``storage/ops/replay_snapshots.py``): a replay by a
store object without a cache (a fresh process) served from the session's
stored snapshot always equals one built from the rows, on both backends,
across appends, batches, branch moves, compactions, labels, settings
changes and imports of a missing parent; a damaged part is never
served; the lazy write stores nothing for a session deleted or written
since, and never replaces a later snapshot; the peak RSS of a cold replay of
100,000 entries, measured in a subprocess, stays within its stated bound.

Controls: serving the stored snapshot whatever the session row says, and a
part check that passes anything, each make the agreement fail.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from test_replay_cache import STEPS, apply, uncached, user

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.spec.records import ImportBatch, ImportEntry
from turnkeeper.storage.ops import replay_snapshots, replays

M = EntryKind.MESSAGE


def cold_store(backend: str, tmp_path: Path) -> turnkeeper.BaseStore:
    """A store object without a replay cache: every replay reads the database."""
    if backend == "duckdb":
        return turnkeeper.open_store(str(tmp_path / "s.duckdb"), replay_cache_bytes=0)
    from conftest import new_pg_schema

    return turnkeeper.open_store(new_pg_schema(), replay_cache_bytes=0)


def stored(store: turnkeeper.BaseStore, sid: str) -> list[tuple[Any, ...]]:
    return store.db.read(
        "stored",
        lambda tx: tx.rows(
            "SELECT part, leaf_id, next_seq FROM replay_snapshots WHERE session_id = ? "
            "ORDER BY part",
            [sid],
        ),
    )


@pytest.fixture
def every_replay_stored(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every replay that read a row stores its snapshot; counts the snapshots loaded."""
    monkeypatch.setattr(replay_snapshots, "PERSIST_ROWS", 1)
    loads: list[int] = []
    real = replay_snapshots.load

    def counted(tx: Any, session_id: str, head: Any) -> Any:
        got = real(tx, session_id, head)
        loads.append(0 if got is None else 1)
        return got

    monkeypatch.setattr(replay_snapshots, "load", counted)
    return loads


def agree(store: turnkeeper.BaseStore, steps: list[tuple[str, int | str]]) -> None:
    sid = uuid.uuid4().hex
    store.sessions.create(sid)
    ids: list[str] = []
    assert store.sessions.replay(sid) == uncached(store, sid)
    for step in steps:
        apply(store, sid, step, ids)
        assert store.sessions.replay(sid) == uncached(store, sid), step
        assert store.sessions.replay(sid) == uncached(store, sid), step  # served as stored


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_a_replay_from_the_stored_snapshot_equals_the_rows_replayed(
    backend: str, tmp_path: Path, every_replay_stored: list[int]
) -> None:
    store = cold_store(backend, tmp_path)

    @settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=25)
    @given(STEPS)
    def check(steps: list[tuple[str, int | str]]) -> None:
        agree(store, steps)

    try:
        check()
        agree(store, [("append", 1), ("append", 2), ("compaction", 0), ("branch", 0)])
    finally:
        store.close()
    assert sum(every_replay_stored) > 0  # the snapshots were served, not only written


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_parts_are_bounded_in_messages_and_bytes(
    backend: str,
    tmp_path: Path,
    every_replay_stored: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parts hold at most ``PART`` messages and ``PART_BYTES`` bytes of msgpack
    (one larger message is a part of its own), and a replay from many parts
    equals the rows replayed."""
    import ormsgpack
    import zstandard

    monkeypatch.setattr(replay_snapshots, "PART", 4)
    monkeypatch.setattr(replay_snapshots, "PART_BYTES", 300)
    sizes = [10, 10, 10, 10, 10, 10, 150, 150, 600, 10, 10, 120, 120, 120, 10]
    with cold_store(backend, tmp_path) as store:
        store.sessions.create("s")
        store.sessions.append_many("s", [(M, user("x" * n)) for n in sizes])
        want = uncached(store, "s")
        assert store.sessions.replay("s") == want  # from the rows: stores the snapshot
        every_replay_stored.clear()
        assert store.sessions.replay("s") == want
        assert every_replay_stored == [1]
        bodies = store.db.read(
            "parts",
            lambda tx: tx.rows(
                "SELECT body FROM replay_snapshots WHERE session_id = ? ORDER BY part",
                ["s"],
                binary=True,
            ),
        )
    parts = [zstandard.decompress(bytes(row[0])) for row in bodies]
    counts = [len(ormsgpack.unpackb(part)[1]) for part in parts]
    assert sum(counts) == len(sizes) and max(counts) <= 4
    assert all(len(part) <= 300 or n == 1 for part, n in zip(parts, counts, strict=True))
    lengths = [[len(m["content"]) for m in ormsgpack.unpackb(part)[1]] for part in parts]
    assert [600] in lengths  # the one larger message, alone


def test_control_a_snapshot_served_whatever_the_row_says_fails(
    tmp_path: Path, every_replay_stored: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The freshness rules patched out (any stored snapshot served as it is): the
    session grew, the stale replay differs."""

    def stale(tx: Any, session_id: str, found: Any, *rest: Any) -> Any:
        return None if found is None else replay_snapshots.load(tx, session_id, found)

    monkeypatch.setattr(replays, "_from_stored", stale)
    with cold_store("duckdb", tmp_path) as store, pytest.raises(AssertionError):
        agree(store, [("append", 1), ("replay", 0), ("append", 2)])


def _body(ids: Any, messages: Any) -> bytes:
    """A part's body in the stored format (``replay_snapshots.FORMAT``)."""
    import ormsgpack
    import zstandard

    return zstandard.compress(ormsgpack.packb([ids, messages]))


def _damage(store: turnkeeper.BaseStore, sid: str) -> None:
    """Replace the stored part by another valid one, the check value kept."""
    (entry_id,) = store.sessions.replay(sid).entry_ids
    other = _body([entry_id], [{"role": "user", "content": "forged"}])
    store.db.write(
        "damage",
        lambda tx: tx.exec(
            "UPDATE replay_snapshots SET body = ? WHERE session_id = ?", [other, sid]
        ),
    )


def _forge(store: turnkeeper.BaseStore, sid: str, body: bytes, format: int) -> None:
    """Replace part 0 by ``body`` in ``format``, with the digest its header and body have."""

    def write(tx: Any) -> None:
        row = tx.one(
            "SELECT parts, leaf_id, next_seq, rooted, model, thinking FROM replay_snapshots "
            "WHERE part_key = ?",
            [replay_snapshots.key(sid, 0)],
        )
        header = replay_snapshots.Stored(row[0], format, *row[1:], None)
        digest = replay_snapshots._digest(sid, 0, header, body)
        tx.exec(
            "UPDATE replay_snapshots SET body = ?, format = ?, digest = ? WHERE part_key = ?",
            [body, format, digest, replay_snapshots.key(sid, 0)],
        )

    store.db.write("forge", write)


def test_a_damaged_part_is_never_served(tmp_path: Path, every_replay_stored: list[int]) -> None:
    with cold_store("duckdb", tmp_path) as store:
        store.sessions.create("s")
        store.sessions.append("s", M, user("real"))
        store.sessions.replay("s")
        assert len(stored(store, "s")) == 1
        _damage(store, "s")
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["real"]
        assert store.sessions.replay("s") == uncached(store, "s")


@pytest.mark.parametrize("parts", [0, -1])
def test_a_header_naming_no_part_is_never_served(
    tmp_path: Path, every_replay_stored: list[int], parts: int
) -> None:
    """A header whose part count is 0 or less names no part to check: it is
    damage, and the replay comes from the rows (an attack saw an empty context)."""
    with cold_store("duckdb", tmp_path) as store:
        store.sessions.create("s")
        store.sessions.append("s", M, user("real"))
        store.sessions.replay("s")
        store.db.write(
            "damage",
            lambda tx: tx.exec(
                "UPDATE replay_snapshots SET parts = ? WHERE session_id = ?", [parts, "s"]
            ),
        )
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["real"]
        store.sessions.append("s", M, user("more"))
        assert store.sessions.replay("s") == uncached(store, "s")


def test_a_damaged_snapshot_is_stored_again_by_the_replay_that_found_it(
    tmp_path: Path, every_replay_stored: list[int]
) -> None:
    """The replay that found the damage stores its snapshot in its place, so
    the next cold replay is served from it (not from every row again)."""
    with cold_store("duckdb", tmp_path) as store:
        store.sessions.create("s")
        store.sessions.append("s", M, user("real"))
        store.sessions.replay("s")
        _damage(store, "s")
        store.sessions.replay("s")  # from the rows: stores the snapshot again
        every_replay_stored.clear()
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["real"]
        assert every_replay_stored == [1], "the next replay was not served from a snapshot"


def test_a_part_of_another_format_is_never_served_and_is_replaced(
    tmp_path: Path, every_replay_stored: list[int]
) -> None:
    """A part stored under another format number, its digest right for its
    header, is never served, even when the current decoder would read its body:
    the replay reads the rows and stores the snapshot again in the current
    format, which the next replay is served from. (Control: run against the load
    without its format check, the forged part was served.)"""
    with cold_store("duckdb", tmp_path) as store:
        store.sessions.create("s")
        store.sessions.append("s", M, user("real"))
        store.sessions.replay("s")
        (entry_id,) = store.sessions.replay("s").entry_ids
        old = _body([entry_id], [{"role": "user", "content": "old"}])
        _forge(store, "s", old, replay_snapshots.FORMAT - 1)
        every_replay_stored.clear()
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["real"]
        assert every_replay_stored == [0]
        formats = store.db.read(
            "formats", lambda tx: tx.rows("SELECT format FROM replay_snapshots", [])
        )
        assert formats == [(replay_snapshots.FORMAT,)]
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["real"]
        assert every_replay_stored == [0, 1]


@pytest.mark.parametrize(
    "body",
    [
        b"not a frame",
        _body(["a"], []),
        __import__("zstandard").compress(b"\xc1"),
        _body(1, 2),
    ],
    ids=["no frame", "ids and messages differ", "no msgpack", "no lists"],
)
def test_a_part_that_does_not_decode_is_never_served(
    tmp_path: Path, every_replay_stored: list[int], body: bytes
) -> None:
    """A part whose digest holds but whose body is no frame of msgpack ``[ids,
    messages]`` of equal lengths is damage too: the replay comes from the rows."""
    with cold_store("duckdb", tmp_path) as store:
        store.sessions.create("s")
        store.sessions.append("s", M, user("real"))
        store.sessions.replay("s")
        _forge(store, "s", body, replay_snapshots.FORMAT)
        every_replay_stored.clear()
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["real"]
        assert every_replay_stored == [0]


def test_control_a_part_check_that_passes_anything_serves_the_damage(
    tmp_path: Path, every_replay_stored: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_snapshots, "_digest", lambda *args: "same")
    with cold_store("duckdb", tmp_path) as store:
        store.sessions.create("s")
        store.sessions.append("s", M, user("real"))
        store.sessions.replay("s")
        _damage(store, "s")
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["forged"]


def test_an_imported_missing_parent_is_replayed_above_the_stored_snapshot(
    tmp_path: Path, every_replay_stored: list[int]
) -> None:
    """A snapshot of a branch whose first entry's parent is missing is never
    carried on: the import that supplies the parent puts it above."""
    t = datetime(2024, 1, 1, tzinfo=UTC)
    with cold_store("duckdb", tmp_path) as store:

        def imported(entries: list[ImportEntry], leaf: str) -> None:
            header = {"type": "session", "version": 3, "id": "s"}
            store.sessions.import_batch(ImportBatch("s", "/", t, header, entries, leaf))

        imported([ImportEntry("B", "X", "message", t, user("b"))], "B")
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["b"]
        assert stored(store, "s") != []
        imported([ImportEntry("X", None, "message", t, user("x"))], "B")
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["x", "b"]
        store.sessions.append("s", M, user("c"))
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["x", "b", "c"]
        assert store.sessions.replay("s") == uncached(store, "s")


def test_the_lazy_write_is_fenced(tmp_path: Path) -> None:
    """Nothing is stored for a session deleted or written since the replay, and
    a snapshot at a later ``next_seq`` is never replaced by an earlier one."""
    with cold_store("duckdb", tmp_path) as store:
        for sid in ("gone", "grown"):
            store.sessions.create(sid)
            store.sessions.append(sid, M, user("a"))
        pending = {
            sid: store.db.read(
                "head", lambda tx, sid=sid: replay_snapshots.head(tx, sid, with_first=False)
            )
            for sid in ("gone", "grown")
        }

        def pend(sid: str) -> replay_snapshots.Pending:
            leaf, next_seq, _ = pending[sid]
            return replay_snapshots.Pending(uncached(store, sid), True, leaf, next_seq)

        gone = pend("gone")
        store.sessions.delete("gone")
        replay_snapshots.store(store.db, "gone", gone)
        assert stored(store, "gone") == []

        old = pend("grown")
        store.sessions.append("grown", M, user("b"))
        replay_snapshots.store(store.db, "grown", old)
        assert stored(store, "grown") == []  # written since: a later replay stores its own

        leaf, next_seq, _ = store.db.read(
            "head", lambda tx: replay_snapshots.head(tx, "grown", with_first=False)
        )
        now = replay_snapshots.Pending(uncached(store, "grown"), True, leaf, next_seq)
        replay_snapshots.store(store.db, "grown", now)
        assert stored(store, "grown") == [(0, leaf, next_seq)]
        replay_snapshots.store(store.db, "grown", old)
        assert stored(store, "grown") == [(0, leaf, next_seq)]


_RSS_SCRIPT = """
import sys, turnkeeper

def status(name):
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024

with turnkeeper.open_store(sys.argv[1], replay_cache_bytes=0) as store:
    store.sessions.replay("small")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM restarts from VmRSS: the open's own peak is not counted
    base = status("VmRSS")
    got = store.sessions.replay("big")
    print(len(got.messages), status("VmHWM") - base)
"""
RSS_BOUND = 3.25
"""Peak RSS of a cold replay from a stored snapshot, over the session's stored
payload bytes (the issue's goal is 3). Measured on a loaded 2-core machine
(load 3-6): 2.87-2.88 here, 2.87-2.91 in ``reports/bench.py replay`` (three
such sessions in the file); before format 2, 4.4-9.9. Of that, the replay's
own objects are 2.36 (tracemalloc: 57 MB for 24 MB of 200-character
messages: a dict, two strings and an entry id each), DuckDB's cache of the
blocks read (the compressed parts, the session row, their indexes) about
0.18, and the allocator's kept free space and arenas the rest (about 5 MB of
it freed by a ``malloc_trim``). With real messages (30,000 from the pi
corpus, 62 MB of payload) it is 2.5-2.6."""


@pytest.mark.skipif(sys.platform != "linux", reason="reads VmRSS from /proc")
def test_a_cold_replay_of_100k_entries_stays_within_its_rss_bound(tmp_path: Path) -> None:
    """A fresh process replays a 100,000-entry session from its stored snapshot:
    its peak RSS above what it held before stays below :data:`RSS_BOUND` times
    the session's stored payload bytes (RSS, measured in a subprocess)."""
    n, path = 100_000, str(tmp_path / "s.duckdb")
    with turnkeeper.open_store(path) as store:
        store.sessions.create("big")
        store.sessions.create("small")
        store.sessions.append("small", M, user("s"))
        for _ in range(0, n, 10_000):
            store.sessions.append_many("big", [(M, user("x" * 200))] * 10_000)
        payload = int(
            store.query("SELECT sum(strlen(payload)) FROM entries WHERE session_id = 'big'")
            .column(0)[0]
            .as_py()
        )
        store.sessions.replay("big")  # stores the snapshot
        assert stored(store, "big")
    out = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, path],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.split()
    count, grew = int(out[0]), int(out[1])
    print(f"payload {payload / 1e6:.1f} MB, peak RSS +{grew / 1e6:.1f} MB ({grew / payload:.2f}x)")
    assert count == n
    assert grew < RSS_BOUND * payload


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_an_upgrade_drops_the_older_snapshots_and_a_replay_stores_its_own(
    backend: str,
    tmp_path: Path,
    every_replay_stored: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store at schema version 30 holding a format 1 snapshot (its messages
    forged): opened by this turnkeeper, the snapshot is gone with its table; the
    replay comes from the rows and stores one in the current format, which the
    next replay is served from."""
    from older_stores import _database, _where, written_by_now

    db = _database(backend)
    where = _where(backend, tmp_path, "v30")
    with monkeypatch.context() as patch:
        patch.setattr(db.Database, "migrations", lambda self: written_by_now(db.MIGRATIONS, 30))
        with turnkeeper.open_store(where, replay_cache_bytes=0) as store:
            store.sessions.create("s")
            entry = store.sessions.append("s", M, user("real"))
            leaf, next_seq = store.db.read(
                "row", lambda tx: tx.one("SELECT leaf_id, next_seq FROM sessions WHERE id = 's'")
            )
            store.db.write(
                "format 1",
                lambda tx: tx.exec(
                    "INSERT INTO replay_snapshots (session_id, part, parts, leaf_id, next_seq, "
                    "rooted, model, thinking, messages, entry_ids, digest) "
                    "VALUES (?, 0, 1, ?, ?, true, NULL, 'off', ?, ?, 'crc32:00000000')",
                    [
                        "s",
                        leaf,
                        next_seq,
                        __import__("ormsgpack").packb([user("forged")["message"]]),
                        __import__("ormsgpack").packb([entry.id]),
                    ],
                ),
            )
    with turnkeeper.open_store(where, replay_cache_bytes=0) as store:
        assert stored(store, "s") == []
        every_replay_stored.clear()
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["real"]
        assert every_replay_stored == []  # no snapshot to load: read from the rows
        assert stored(store, "s") == [(0, leaf, next_seq)]
        assert store.sessions.replay("s") == uncached(store, "s")
        assert every_replay_stored == [1]


def test_a_part_without_a_body_is_never_served(
    tmp_path: Path, every_replay_stored: list[int]
) -> None:
    """DuckDB's body column is nullable (added to an indexed table): a part
    whose body is missing fails its digest, and the replay reads the rows."""
    with cold_store("duckdb", tmp_path) as store:
        store.sessions.create("s")
        store.sessions.append("s", M, user("real"))
        store.sessions.replay("s")
        store.db.write("damage", lambda tx: tx.exec("UPDATE replay_snapshots SET body = NULL", []))
        every_replay_stored.clear()
        assert [m["content"] for m in store.sessions.replay("s").messages] == ["real"]
        assert every_replay_stored == [0]
