"""The replay cache (``storage/ops/replays.py``): a replay served from it always
equals one built from the rows, on both backends, across appends, batches,
branches, compactions, settings changes and writers in other store objects;
the caller gets fresh objects; memory stays within the stated bounds.

The oracle is :func:`uncached`: the rows read and walked afresh, as before the
cache. A control patches the cache's freshness check out and sees the
agreement test fail.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turnkeeper
from turnkeeper import EntryKind, Replay
from turnkeeper.storage.ops import replays, session_rows
from turnkeeper.storage.replay import build_replay

M = EntryKind.MESSAGE


def user(text: str) -> dict[str, Any]:
    return {"message": {"role": "user", "content": text}}


def uncached(store: turnkeeper.BaseStore, session_id: str) -> Replay:
    """The replay built from the session's rows, without the cache (the oracle)."""
    return store.db.read(
        "replay_oracle",
        lambda tx: build_replay(session_rows.branch_path(tx, session_id)),
        snapshot=True,
    )


STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 3)),
        st.tuples(st.just("many"), st.integers(1, 4)),
        st.tuples(st.just("assistant"), st.sampled_from(["m1", "m2"])),
        st.tuples(st.just("model"), st.sampled_from(["m3", "m4"])),
        st.tuples(st.just("thinking"), st.sampled_from(["low", "high"])),
        st.tuples(st.just("custom"), st.integers(0, 3)),
        st.tuples(st.just("summary"), st.integers(0, 3)),
        st.tuples(st.just("compaction"), st.integers(0, 30)),
        st.tuples(st.just("label"), st.integers(0, 30)),
        st.tuples(st.just("branch"), st.integers(-1, 30)),
        st.tuples(st.just("replay"), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


def apply(
    store: turnkeeper.BaseStore, sid: str, step: tuple[str, int | str], ids: list[str]
) -> None:
    """One write of the agreement test (``ids``: every entry id written so far)."""
    name, arg = step
    pick = ids[int(arg) % len(ids)] if ids and isinstance(arg, int) and arg >= 0 else None
    if name == "append":
        ids.append(store.sessions.append(sid, M, user(f"u{arg}")).id)
    elif name == "many":
        got = store.sessions.append_many(sid, [(M, user(f"b{i}")) for i in range(int(arg))])
        ids.extend(e.id for e in got)
    elif name == "assistant":
        msg = {"role": "assistant", "content": "a", "provider": "p", "model": arg}
        ids.append(store.sessions.append(sid, M, {"message": msg}).id)
    elif name == "model":
        payload = {"provider": "q", "modelId": arg}
        ids.append(store.sessions.append(sid, EntryKind.MODEL_CHANGE, payload).id)
    elif name == "thinking":
        ids.append(
            store.sessions.append(sid, EntryKind.THINKING_LEVEL_CHANGE, {"thinkingLevel": arg}).id
        )
    elif name == "custom":
        payload = {"customType": "note", "content": f"c{arg}", "display": True}
        ids.append(store.sessions.append(sid, EntryKind.CUSTOM_MESSAGE, payload).id)
    elif name == "summary":
        payload = {"summary": f"s{arg}", "fromId": pick or "x"}
        ids.append(store.sessions.append(sid, EntryKind.BRANCH_SUMMARY, payload).id)
    elif name == "compaction" and pick is not None:
        payload = {"summary": "sum", "firstKeptEntryId": pick, "tokensBefore": 10}
        ids.append(store.sessions.append(sid, EntryKind.COMPACTION, payload).id)
    elif name == "label" and pick is not None:
        ids.append(store.sessions.append(sid, EntryKind.LABEL, {"targetId": pick, "label": "l"}).id)
    elif name == "branch":
        store.sessions.branch(sid, pick)
    elif name == "replay":
        store.sessions.replay(sid)


def check_agreement(store: turnkeeper.BaseStore, steps: list[tuple[str, int | str]]) -> None:
    sid = uuid.uuid4().hex
    store.sessions.create(sid)
    ids: list[str] = []
    assert store.sessions.replay(sid) == uncached(store, sid)
    for step in steps:
        apply(store, sid, step, ids)
        assert store.sessions.replay(sid) == uncached(store, sid), step


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_cached_replay_equals_the_rows_replayed(backend: str, tmp_path: Path) -> None:
    from conftest import open_backend

    store = open_backend(backend, tmp_path, None)

    @settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
    @given(STEPS)
    def agree(steps: list[tuple[str, int | str]]) -> None:
        check_agreement(store, steps)

    try:
        agree()
    finally:
        store.close()


def test_control_a_cache_that_never_checks_the_row_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Serving any cached replay whatever the session row says (the freshness check
    patched out) is caught: the session grew, the stale replay differs."""
    real = replays.cached_replay

    def stale(tx: Any, session_id: str, cache: replays.BranchCache, *more: Any) -> Replay:
        known = cache.get(session_id)
        return known.replay() if known is not None else real(tx, session_id, cache, *more)

    monkeypatch.setattr(replays, "cached_replay", stale)
    with turnkeeper.open_store(str(tmp_path / "s.duckdb")) as store, pytest.raises(AssertionError):
        check_agreement(store, [("append", 1), ("replay", 0), ("append", 2)])


def test_a_replay_is_fresh_objects_the_caller_may_change(store: turnkeeper.BaseStore) -> None:
    store.sessions.create("s")
    store.sessions.append("s", M, user("one"))
    store.sessions.append("s", EntryKind.MODEL_CHANGE, {"provider": "p", "modelId": "m"})
    first = store.sessions.replay("s")
    first.messages[0]["content"] = "changed"  # type: ignore[index]
    first.model["modelId"] = "changed"  # type: ignore[index]
    again = store.sessions.replay("s")
    assert again.messages[0]["content"] == "one"
    assert again.model == {"provider": "p", "modelId": "m"}
    assert again == uncached(store, "s")


@pytest.mark.postgres
def test_a_writer_in_another_store_object_is_seen() -> None:
    """Two store objects on one PostgreSQL schema (as two worker processes): each
    one's replay sees the other's appends and branch moves."""
    from conftest import new_pg_schema

    url = new_pg_schema()
    with turnkeeper.open_store(url) as a, turnkeeper.open_store(url) as b:
        a.sessions.create("s")
        first = a.sessions.append("s", M, user("a1"))
        assert [m["content"] for m in a.sessions.replay("s").messages] == ["a1"]
        b.sessions.append("s", M, user("b1"))
        assert [m["content"] for m in a.sessions.replay("s").messages] == ["a1", "b1"]
        b.sessions.branch("s", first.id)
        assert [m["content"] for m in a.sessions.replay("s").messages] == ["a1"]
        b.sessions.append("s", M, user("b2"))
        assert a.sessions.replay("s") == uncached(a, "s") == b.sessions.replay("s")


def test_a_grown_session_reads_only_its_new_entries(tmp_path: Path) -> None:
    """A session that grew along its branch is replayed from the cache and the
    new rows: one statement for the session row, one for the rows at or above
    the cached ``next_seq`` (counted), and the same replay as the rows give."""
    with turnkeeper.open_store(str(tmp_path / "s.duckdb")) as store:
        store.sessions.create("s")
        store.sessions.append_many("s", [(M, user(str(i))) for i in range(50)])
        store.sessions.replay("s")
        store.sessions.append("s", M, user("new"))
        seen: list[list[Any]] = []
        real = store.db.read

        def read(operation: str, body: Any, **kw: Any) -> Any:
            def spy(tx: Any) -> Any:
                rows = tx.rows

                def counted(sql: str, params: Any = ()) -> Any:
                    found = rows(sql, params)
                    seen.append(found)
                    return found

                tx.rows = counted
                return body(tx)

            return real(operation, spy, **kw)

        store.db.read = read  # type: ignore[method-assign]
        got = store.sessions.replay("s")
        store.db.read = real  # type: ignore[method-assign]
        assert [len(r) for r in seen] == [1, 1]  # the session row, the one new entry
        assert got == uncached(store, "s")
        assert got.messages[-1]["content"] == "new"


def test_the_cache_stays_within_its_bound(tmp_path: Path) -> None:
    """``replay_cache_bytes`` bounds the cache: the least recently replayed
    sessions are evicted, a branch larger than the bound is never cached, 0
    caches nothing; replays stay right throughout."""
    bound = 40_000
    with turnkeeper.open_store(str(tmp_path / "s.duckdb"), replay_cache_bytes=bound) as store:
        for n in range(6):
            store.sessions.create(f"s{n}")
            store.sessions.append_many(
                f"s{n}", [(M, user("x" * 100))] * 50
            )  # ~10 kB of messages each
        for n in range(6):
            assert store.sessions.replay(f"s{n}") == uncached(store, f"s{n}")
            assert store.sessions._branches.nbytes <= bound
        assert 0 < len(store.sessions._branches) < 6
        assert (
            store.sessions._branches.get("s5") is not None
            and store.sessions._branches.get("s0") is None
        )
        store.sessions.create("big")
        store.sessions.append_many("big", [(M, user("x" * 1000))] * 50)
        assert store.sessions.replay("big") == uncached(store, "big")
        assert (
            store.sessions._branches.get("big") is None and store.sessions._branches.nbytes <= bound
        )
    with turnkeeper.open_store(str(tmp_path / "s.duckdb"), replay_cache_bytes=0) as store:
        assert store.sessions.replay("s1") == uncached(store, "s1")
        assert len(store.sessions._branches) == 0
    with pytest.raises(turnkeeper.InvalidInputError) as err:
        turnkeeper.open_store(str(tmp_path / "s.duckdb"), replay_cache_bytes=-1)
    assert err.value.field == "replay_cache_bytes"


def test_the_cached_copy_of_100k_entries_counts_about_its_message_bytes(tmp_path: Path) -> None:
    """The cached copy of a 100,000-entry replay counts about its message bytes
    against the bound. (A cold replay's peak memory is measured as RSS in a
    subprocess: ``test_replay_snapshots``.)"""
    n, text = 100_000, "x" * 200
    with turnkeeper.open_store(str(tmp_path / "s.duckdb")) as store:
        store.sessions.create("big")
        for _ in range(0, n, 5_000):
            store.sessions.append_many("big", [(M, user(text))] * 5_000)
        stored = int(
            store.query(
                "SELECT sum(strlen(payload::VARCHAR)) FROM entries WHERE session_id = 'big'"
            )
            .column(0)[0]
            .as_py()
        )
        got = store.sessions.replay("big")
        assert len(got.messages) == n
        assert store.sessions._branches.nbytes < 1.5 * stored


def test_an_imported_missing_parent_is_replayed_above_the_cached_branch(
    store: turnkeeper.BaseStore,
) -> None:
    """An import may store an entry whose parent is missing; a later import that
    supplies the parent puts it on the branch, above what was cached: the cache
    carries on only a branch that starts at a real root (found by an attack
    helper: the cached replay kept ``['b']`` where the rows say ``['x', 'b']``)."""
    from datetime import UTC, datetime

    from turnkeeper.spec.records import ImportBatch, ImportEntry

    t = datetime(2024, 1, 1, tzinfo=UTC)
    header = {"type": "session", "version": 3, "id": "s"}

    def imported(entries: list[ImportEntry], leaf: str) -> None:
        store.sessions.import_batch(ImportBatch("s", "/", t, header, entries, leaf))

    imported([ImportEntry("B", "X", "message", t, user("b"))], "B")  # X is not there yet
    assert [m["content"] for m in store.sessions.replay("s").messages] == ["b"]
    imported([ImportEntry("X", None, "message", t, user("x"))], "B")  # X arrives; leaf stays B
    assert [m["content"] for m in store.sessions.replay("s").messages] == ["x", "b"]
    assert store.sessions.replay("s") == uncached(store, "s")
    store.sessions.append("s", M, user("c"))  # now rooted: carried on along the new row
    assert [m["content"] for m in store.sessions.replay("s").messages] == ["x", "b", "c"]
    assert store.sessions.replay("s") == uncached(store, "s")


def test_empty_branches_count_against_the_bound(tmp_path: Path) -> None:
    """A session without messages still takes memory in the cache: it counts a
    fixed amount, so the bound holds for many empty sessions too (found by an
    attack helper: 5,000 empty sessions cached under a 1-byte bound)."""
    bound = 20_000
    with turnkeeper.open_store(str(tmp_path / "s.duckdb"), replay_cache_bytes=bound) as store:
        for n in range(200):
            store.sessions.create(f"e{n}")
            store.sessions.replay(f"e{n}")
            assert store.sessions._branches.nbytes <= bound
        assert 0 < len(store.sessions._branches) < 200
    with turnkeeper.open_store(str(tmp_path / "s.duckdb"), replay_cache_bytes=1) as store:
        for n in range(50):
            store.sessions.replay(f"e{n}")
        assert len(store.sessions._branches) == 0
