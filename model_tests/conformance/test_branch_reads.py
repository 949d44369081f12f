"""store.sessions.path_after / path_latest / custom_entry / custom_entries: the
reads framework adapters need, without reading the whole session (issue 20)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import through_pooler

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.spec import errors
from turnkeeper.spec.records import Entry, ImportBatch, ImportEntry
from turnkeeper.storage.ops import branch_reads, entry_rows


@pytest.fixture
def store(any_store: Any) -> Any:
    """Each backend, called directly and through ``turnkeeper.aio``."""
    return any_store


def _msg(i: int) -> dict[str, Any]:
    return {"message": {"role": "user", "content": f"m{i}"}}


def _path(store: turnkeeper.BaseStore, sid: str, leaf: str | None) -> list[Entry]:
    """The root → leaf path, walked over every entry (the reference)."""
    by_id = {e.id: e for e in store.sessions.entries(sid)}
    out: list[Entry] = []
    while leaf is not None:
        out.append(by_id[leaf])
        leaf = by_id[leaf].parent_id
    return out[::-1]


def _ids(entries: list[Entry]) -> list[str]:
    return [e.id for e in entries]


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows each statement of a branch read hands over to the walk; a read of
    the whole path (``path_to_leaf``) fails the test."""
    seen: list[int] = []
    real = branch_reads._walk

    def counted(tx: Any, rows: list[tuple[Any, ...]], leaf_id: str, most: int | None) -> Any:
        seen.append(len(rows))
        return real(tx, rows, leaf_id, most)

    def whole(*_: Any) -> Any:
        raise AssertionError("the read walked the whole session")

    monkeypatch.setattr(branch_reads, "_walk", counted)
    monkeypatch.setattr(entry_rows, "path_to_leaf", whole)
    return seen


def _two_branches(store: turnkeeper.BaseStore, sid: str) -> tuple[list[Entry], list[Entry]]:
    """40 entries, then 15 more on a branch from the 20th: (main, side)."""
    store.sessions.create(sid)
    main = store.sessions.append_many(sid, [(EntryKind.MESSAGE, _msg(i)) for i in range(40)])
    store.sessions.branch(sid, main[19].id)
    side = store.sessions.append_many(sid, [(EntryKind.MESSAGE, _msg(100 + i)) for i in range(15)])
    return main, side


def test_path_reads_follow_the_current_leaf(store, handed):
    main, side = _two_branches(store, "s")
    current = main[:20] + side
    assert _ids(store.sessions.path_after("s")) == _ids(current)
    for after in (0, 5, main[19].seq, main[30].seq, side[10].seq, side[-1].seq):
        want = [e for e in current if e.seq > after]
        assert store.sessions.path_after("s", after) == want
        assert store.sessions.path_after("s", after, limit=3) == want[:3]
    for n in (1, 3, 15, 16, 34, 35, 100):
        assert store.sessions.path_latest("s", n) == current[-n:]
    # to a given leaf: the abandoned branch
    assert store.sessions.path_latest("s", 7, leaf_id=main[-1].id) == main[-7:]
    assert _ids(store.sessions.path_after("s", main[25].seq, leaf_id=main[-1].id)) == _ids(
        main[26:]
    )
    # the branch moves: the reads follow the leaf
    store.sessions.branch("s", main[-1].id)
    assert store.sessions.path_latest("s", 4) == main[-4:]
    assert store.sessions.path_after("s", main[35].seq) == main[36:]
    store.sessions.branch("s", None)
    assert store.sessions.path_after("s") == []
    assert store.sessions.path_latest("s", 5) == []
    assert _path(store, "s", side[-1].id) == current  # the reference agrees


def test_pop_newest_is_a_compare_and_set_on_the_leaf(store):
    """An OpenAI Agents ``pop_item``: the newest entry, then the leaf moved to its
    parent only if it is still the leaf; a second popper that read the same
    newest entry is refused and reads again."""
    store.sessions.create("p")
    items = store.sessions.append_many("p", [(EntryKind.MESSAGE, _msg(i)) for i in range(3)])
    (mine,) = store.sessions.path_latest("p", 1)
    (theirs,) = store.sessions.path_latest("p", 1)
    assert mine == theirs == items[-1]
    store.sessions.branch("p", mine.parent_id, expected_leaf=mine.id)
    with pytest.raises(errors.SessionModifiedError):
        store.sessions.branch("p", theirs.parent_id, expected_leaf=theirs.id)
    (again,) = store.sessions.path_latest("p", 1)
    store.sessions.branch("p", again.parent_id, expected_leaf=again.id)
    assert [mine.id, again.id] == [items[2].id, items[1].id]
    assert store.sessions.path_after("p") == items[:1]


def test_path_reads_hand_over_only_the_tail(store, handed):
    store.sessions.create("long")
    for chunk in range(10):
        store.sessions.append_many(
            "long", [(EntryKind.MESSAGE, _msg(chunk * 100 + i)) for i in range(100)]
        )
    tail = store.sessions.path_latest("long", 5)
    assert [e.payload["message"]["content"] for e in tail] == [f"m{i}" for i in range(995, 1000)]
    assert sum(handed) <= 2 * 5 and len(handed) == 1
    handed.clear()
    after = store.sessions.path_after("long", tail[0].seq)
    assert after == tail[1:] and handed == [4]
    stats = store.statement_stats()
    # BEGIN, the leaf's id, the leaf, the range, the parent the walk stopped at, COMMIT
    # (behind a transaction pooler BEGIN carries the search_path's pin too)
    pinned = store.db.dialect.name == "postgres" and through_pooler()
    assert stats["path_after"]["statements_per_call"] <= 6 + pinned, stats["path_after"]


def test_path_latest_widens_over_other_branches(store, handed):
    """Entries of other branches in the range: the range doubles, a few statements."""
    store.sessions.create("w")
    trunk = store.sessions.append_many("w", [(EntryKind.MESSAGE, _msg(i)) for i in range(10)])
    store.sessions.append_many("w", [(EntryKind.MESSAGE, _msg(50 + i)) for i in range(60)])
    store.sessions.branch("w", trunk[-1].id)
    side = store.sessions.append_many("w", [(EntryKind.MESSAGE, _msg(i)) for i in range(4)])
    got = store.sessions.path_latest("w", 8)
    assert got == trunk[-4:] + side
    assert 1 < len(handed) <= 4 and max(handed) <= 2 * (60 + 8), handed


def test_path_after_an_entry_stored_before_its_parent(store, monkeypatch):
    """An import in file order can store a child before its parent: the read
    finds the parent outside its range and walks the whole path."""
    t = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        ImportEntry("b", "a", EntryKind.MESSAGE, t, _msg(2)),
        ImportEntry("a", None, EntryKind.MESSAGE, t, _msg(1)),
        ImportEntry("c", "b", EntryKind.MESSAGE, t, _msg(3)),
    ]
    store.sessions.import_batch(ImportBatch("imp", "/", t, {}, rows, "c"))
    seqs = {e.id: e.seq for e in store.sessions.entries("imp")}
    assert seqs["a"] > seqs["b"]
    assert _ids(store.sessions.path_after("imp")) == ["a", "b", "c"]
    assert _ids(store.sessions.path_latest("imp", 3)) == ["a", "b", "c"]
    assert _ids(store.sessions.path_after("imp", seqs["b"])) == ["c"]  # below b
    # the leaf b's parent a was stored after it: the read walks the whole path
    assert _ids(store.sessions.path_after("imp", leaf_id="b")) == ["a", "b"]
    assert _ids(store.sessions.path_latest("imp", 1, leaf_id="b")) == ["b"]
    assert _ids(store.sessions.path_latest("imp", 5, leaf_id="b")) == ["a", "b"]


def test_path_reads_refuse_typed(store):
    with pytest.raises(errors.SessionNotFoundError):
        store.sessions.path_after("nope")
    with pytest.raises(errors.SessionNotFoundError):
        store.sessions.path_latest("nope", 3)
    store.sessions.create("s")
    store.sessions.append("s", EntryKind.MESSAGE, _msg(0))
    with pytest.raises(errors.EntryNotFoundError) as lost:
        store.sessions.path_after("s", leaf_id="gone")
    assert (lost.value.session_id, lost.value.entry_id) == ("s", "gone")
    bad: list[tuple[Any, ...]] = [
        (store.sessions.path_after, ("s", -1), {}),
        (store.sessions.path_after, ("s", True), {}),
        (store.sessions.path_after, ("s",), {"limit": 0}),
        (store.sessions.path_after, ("s",), {"leaf_id": ""}),
        (store.sessions.path_latest, ("s", 0), {}),
        (store.sessions.path_latest, ("s", "3"), {}),
        (store.sessions.path_after, ("",), {}),
    ]
    for call, args, kwargs in bad:
        with pytest.raises(errors.InvalidInputError):
            call(*args, **kwargs)


def _custom(store: turnkeeper.BaseStore, sid: str, kind: str, key: str, **data: Any) -> Entry:
    return store.sessions.append(
        sid, EntryKind.CUSTOM, {"customType": kind, "data": data}, entry_id=key
    )


def test_custom_entries_by_key_and_type(store):
    store.sessions.create("t")
    cps = []
    for i in range(7):
        cps.append(_custom(store, "t", "checkpoint", f"cp{i}", n=i))
        _custom(store, "t", "writes", f"cp{i}/w/0", n=i)
        _custom(store, "t", "writes", f"cp{i}/w/1", n=i)
        store.sessions.append("t", EntryKind.MESSAGE, _msg(i))
    # a decoy: the type's text deeper in another type's payload
    _custom(store, "t", "other", "decoy", inner={"customType": "checkpoint"})
    store.sessions.append("t", EntryKind.MESSAGE, _msg(99), entry_id="msg-key")
    assert store.sessions.custom_entry("t", "checkpoint", "cp3") == cps[3]
    assert store.sessions.custom_entry("t", "writes", "cp3") is None
    assert store.sessions.custom_entry("t", "checkpoint", "decoy") is None
    assert store.sessions.custom_entry("t", "checkpoint", "msg-key") is None
    assert store.sessions.custom_entry("t", "checkpoint", "absent") is None
    assert store.sessions.custom_entries("t", "checkpoint") == cps[::-1]
    assert store.sessions.custom_entries("t", "checkpoint", limit=2) == cps[:-3:-1]
    page = store.sessions.custom_entries("t", "checkpoint", before_seq=cps[4].seq, limit=3)
    assert page == [cps[3], cps[2], cps[1]]
    writes = store.sessions.custom_entries("t", "writes", key_prefix="cp5/")
    assert _ids(writes) == ["cp5/w/1", "cp5/w/0"]
    assert store.sessions.custom_entries("t", "writes", key_prefix="cp5/", limit=1)[0].id == (
        "cp5/w/1"
    )
    assert store.sessions.custom_entries("t", "absent") == []
    # on every branch: a branch move hides nothing from the key lookups
    store.sessions.branch("t", None)
    assert store.sessions.custom_entry("t", "checkpoint", "cp6") == cps[6]
    assert len(store.sessions.custom_entries("t", "checkpoint")) == 7


def test_custom_entries_refuse_typed(store):
    with pytest.raises(errors.SessionNotFoundError):
        store.sessions.custom_entry("nope", "x", "k")
    with pytest.raises(errors.SessionNotFoundError):
        store.sessions.custom_entries("nope", "x")
    store.sessions.create("s")
    for call, args, kwargs in [
        (store.sessions.custom_entry, ("s", "", "k"), {}),
        (store.sessions.custom_entry, ("s", "x", ""), {}),
        (store.sessions.custom_entries, ("s", ""), {}),
        (store.sessions.custom_entries, ("s", "x"), {"limit": 0}),
        (store.sessions.custom_entries, ("s", "x"), {"before_seq": -1}),
        (store.sessions.custom_entries, ("s", "x"), {"key_prefix": 3}),
    ]:
        with pytest.raises(errors.InvalidInputError):
            call(*args, **kwargs)
