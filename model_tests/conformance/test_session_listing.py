"""Conformance: resume and listing (issue 18), on both backends.

Open by id prefix (session seed OpenByID, OpenByPathOrID), the listing options
(WithMessagesOnly, WithSearch, WithOffset, WithLimit; ListForDir, ListAll,
their Detailed forms, CountAll, CountWithMessages), ContinueRecent, message
paging by sequence (ListSessionMessagesAfter/Before/Latest/WithSeq), the
latest-entry getters, the header, the execution facts, and sub-agent sessions
(NewSubAgent).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

import turnkeeper
from turnkeeper import (
    AmbiguousSessionIDError,
    EntryKind,
    InvalidInputError,
    SessionIDExistsError,
    SessionNotFoundError,
)
from turnkeeper.storage.ops import listing, open_ids


def user(text: str) -> dict:
    return {"message": {"role": "user", "content": [{"type": "text", "text": text}]}}


def assistant(text: str) -> dict:
    return {"message": {"role": "assistant", "content": [{"type": "text", "text": text}]}}


def ids(page) -> list[str]:
    return [s.id for s in page.sessions]


# -- open by id prefix ---------------------------------------------------------------


def test_a_prefix_opens_the_one_session_it_begins(store):
    store.sessions.create("0190abcd-1111", cwd="/a")
    store.sessions.create("0190abcd-2222", cwd="/a")
    store.sessions.create("0190ffff-3333", cwd="/b")
    assert store.sessions.open("0190abcd-1").id == "0190abcd-1111"
    assert store.sessions.open("0190ffff").id == "0190ffff-3333"
    assert store.sessions.open("0190ffff-3333").id == "0190ffff-3333"


def test_an_ambiguous_prefix_is_a_typed_error_naming_the_prefix_and_candidates(store):
    for i in range(3):
        store.sessions.create(f"0190abcd-{i}", cwd="/a")
    with pytest.raises(AmbiguousSessionIDError) as caught:
        store.sessions.open("0190abcd")
    assert caught.value.prefix == "0190abcd"
    assert caught.value.candidates == ("0190abcd-0", "0190abcd-1", "0190abcd-2")
    assert isinstance(caught.value, turnkeeper.TurnkeeperError)


def test_the_candidates_are_capped(store):
    for i in range(open_ids.CANDIDATES + 3):
        store.sessions.create(f"0190abcd-{i:02}")
    with pytest.raises(AmbiguousSessionIDError) as caught:
        store.sessions.open("0190abcd-")
    assert len(caught.value.candidates) == open_ids.CANDIDATES


def test_a_value_shorter_than_the_head_opens_only_that_whole_id(store):
    store.sessions.create("s-1")
    store.sessions.create("s-10")
    assert store.sessions.open("s-1").id == "s-1"
    with pytest.raises(SessionNotFoundError) as caught:
        store.sessions.open("s-")
    assert caught.value.session_id == "s-"


def test_a_cwd_limits_the_match_to_its_sessions(store):
    store.sessions.create("0190abcd-1111", cwd="/a")
    store.sessions.create("0190abcd-2222", cwd="/b")
    assert store.sessions.open("0190abcd", cwd="/b").id == "0190abcd-2222"
    with pytest.raises(SessionNotFoundError):
        store.sessions.open("0190abcd-1111", cwd="/b")
    with pytest.raises(SessionNotFoundError):
        store.sessions.open("0190abcd", cwd="/c")


def test_an_unknown_id_is_session_not_found_and_a_bad_one_invalid(store):
    with pytest.raises(SessionNotFoundError):
        store.sessions.open("0190abcd-nothing")
    with pytest.raises(InvalidInputError):
        store.sessions.open("")


def test_a_pi_file_path_opens_the_session_its_header_names(store, tmp_path: Path):
    store.sessions.create("0190abcd-1111")
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"type": "session", "version": 3, "id": "0190abcd-1111"}) + "\n")
    assert store.sessions.open(str(path)).id == "0190abcd-1111"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "message"}\n')
    with pytest.raises(InvalidInputError):
        store.sessions.open(str(bad))


# -- listing options ---------------------------------------------------------------


@pytest.fixture
def populated(store, clock):
    """Six sessions in two directories, created a second apart (s0 oldest): the
    even ones have messages, s1 has a run admitted (active), s5 a sub-agent."""
    for i in range(6):
        store.sessions.create(f"s{i}", cwd="/a" if i < 4 else "/b")
        if i % 2 == 0:
            store.sessions.append(f"s{i}", EntryKind.MESSAGE, user(f"hello {i}"))
        clock.advance(1)
    store.sessions.append("s1", EntryKind.SESSION_INFO, {"name": "needle title"})
    store.runs.admit("s1", {"q": 1})
    store.sessions.new_sub_agent("s5", "sub-of-s5")
    clock.advance(1)
    return store


def test_listings_are_newest_first_and_leave_sub_agents_out(populated):
    assert ids(populated.sessions.list()) == ["s5", "s4", "s3", "s2", "s1", "s0"]
    assert ids(populated.sessions.list(include_sub_agents=True))[0] == "sub-of-s5"
    assert populated.sessions.count() == 6
    assert populated.sessions.count(include_sub_agents=True) == 7


def test_offset_and_limit_page_the_listing(populated):
    assert ids(populated.sessions.list(offset=2, limit=2)) == ["s3", "s2"]
    first = populated.sessions.list(limit=2)
    after = populated.sessions.list(limit=2, cursor=first.next_cursor, offset=1)
    assert ids(after) == ["s2", "s1"]
    assert ids(populated.sessions.list(offset=6)) == []
    with pytest.raises(InvalidInputError):
        populated.sessions.list(offset=-1)


OPTIONS = {
    "messages_only": [False, True],
    "cwd": [None, "/a", "/b"],
    "status": [None, "active", "idle"],
    "search": [None, "needle", "hello 4"],
}
EXPECTED_ALL = {"s0", "s1", "s2", "s3", "s4", "s5"}


def _expected(messages_only, cwd, status, search, *, sealed: bool = False) -> set[str]:
    out = set(EXPECTED_ALL)
    if messages_only:
        out &= {"s0", "s2", "s4"}
    if cwd == "/a":
        out &= {"s0", "s1", "s2", "s3"}
    if cwd == "/b":
        out &= {"s4", "s5"}
    if status == "active":
        out &= {"s1"}
    if status == "idle":
        out -= {"s1"}
    if search == "needle":
        out &= {"s1"}
    if search == "hello 4":  # only a message's text holds it: sealed, SQL cannot search it
        out &= set() if sealed else {"s4"}
    return out


@pytest.mark.parametrize("combo", list(itertools.product(*OPTIONS.values())))
def test_every_combination_of_filters_lists_and_counts_the_same_sessions(populated, combo):
    kw = dict(zip(OPTIONS, combo, strict=True))
    want = _expected(**kw, sealed=populated.db.keyring.encrypted)
    got = ids(populated.sessions.list(limit=100, **kw))
    assert set(got) == want and len(got) == len(want)
    assert got == sorted(got, reverse=True)  # newest first: s5 … s0
    assert populated.sessions.count(**kw) == len(want)
    detailed = populated.sessions.list_detailed(limit=100, **kw)
    assert [d.session.id for d in detailed.details] == got


def test_a_directory_listing_includes_its_sub_agents_when_asked(populated):
    assert ids(populated.sessions.list(cwd="/b", include_sub_agents=True)) == [
        "sub-of-s5",
        "s5",
        "s4",
    ]
    assert populated.sessions.count(cwd="/b", include_sub_agents=True) == 3


def test_an_unknown_status_is_refused(store):
    with pytest.raises(InvalidInputError) as caught:
        store.sessions.list(status="busy")
    assert caught.value.field == "status"
    with pytest.raises(InvalidInputError):
        store.sessions.count(messages_only="yes")


def test_details_count_messages_and_preview_the_first_user_message(store):
    store.sessions.create("d")
    store.sessions.append("d", EntryKind.MESSAGE, assistant("not me"))
    store.sessions.append("d", EntryKind.MESSAGE, user("  first\n question " + "x" * 200))
    store.sessions.append("d", EntryKind.MESSAGE, user("second"))
    store.sessions.append("d", EntryKind.MODEL_CHANGE, {"provider": "p", "modelId": "m"})
    store.sessions.create("empty")
    got = {d.session.id: d for d in store.sessions.list_detailed().details}
    assert got["d"].message_count == 3
    assert got["d"].preview.startswith("first question xxx")
    assert len(got["d"].preview) == listing.PREVIEW_CHARS and got["d"].preview.endswith("…")
    assert (got["empty"].message_count, got["empty"].preview) == (0, "")


# -- continue recent -----------------------------------------------------------------


def test_continue_recent_takes_the_directory_s_latest_updated_session(store, clock):
    store.sessions.create("old", cwd="/a")
    clock.advance(1)
    store.sessions.create("new", cwd="/a")
    clock.advance(1)
    store.sessions.append("old", EntryKind.MESSAGE, user("again"))
    clock.advance(1)
    store.sessions.new_sub_agent("old", "sub", cwd="/a")  # never continued
    assert store.sessions.continue_recent("/a").id == "old"
    assert store.sessions.count() == 2


def test_continue_recent_creates_a_session_when_the_directory_has_none(store):
    store.sessions.create("elsewhere", cwd="/a")
    made = store.sessions.continue_recent("/b", header={"x": 1})
    assert (made.cwd, made.header, made.entry_count) == ("/b", {"x": 1}, 0)
    assert store.sessions.continue_recent("/b").id == made.id
    store.sessions.append(made.id, EntryKind.MESSAGE, user("works"))


# -- sub-agents ----------------------------------------------------------------------


def test_a_sub_agent_names_its_parent_and_is_reachable_from_it(store, clock):
    store.sessions.create("parent", cwd="/w")
    one = store.sessions.new_sub_agent("parent", "sa-1")
    clock.advance(1)
    two = store.sessions.new_sub_agent("parent", "sa-2", cwd="/elsewhere", header={"k": "v"})
    assert (one.sub_agent_of, one.cwd) == ("parent", "/w")
    assert two.cwd == "/elsewhere"
    assert two.header == {"k": "v", "parentSession": "parent", "subAgent": True}
    assert [s.id for s in store.sessions.sub_agents("parent")] == ["sa-1", "sa-2"]
    assert store.sessions.sub_agents("sa-1") == []
    assert ids(store.sessions.list()) == ["parent"]
    assert store.sessions.get("sa-1").sub_agent_of == "parent"
    store.sessions.append("sa-1", EntryKind.MESSAGE, user("sub work"))
    assert store.sessions.header("sa-2")["parentSession"] == "parent"


def test_a_sub_agent_is_not_opened_by_prefix(store):
    store.sessions.create("0190abcd-parent")
    store.sessions.new_sub_agent("0190abcd-parent", "0190abcd-sub")
    assert store.sessions.open("0190abcd").id == "0190abcd-parent"
    assert store.sessions.open("0190abcd-sub").id == "0190abcd-sub"  # the whole id


def test_a_sub_agent_of_no_session_or_with_a_taken_id_is_refused(store):
    with pytest.raises(SessionNotFoundError) as caught:
        store.sessions.new_sub_agent("missing")
    assert caught.value.session_id == "missing"
    store.sessions.create("p")
    with pytest.raises(SessionIDExistsError):
        store.sessions.new_sub_agent("p", "p")
    assert store.sessions.count(include_sub_agents=True) == 1


# -- message paging ------------------------------------------------------------------


@pytest.fixture
def chatted(store):
    store.sessions.create("c")
    for i in range(6):
        store.sessions.append("c", EntryKind.MESSAGE, (user if i % 2 == 0 else assistant)(f"m{i}"))
        store.sessions.append("c", EntryKind.CUSTOM, {"customType": "x", "data": i})
    return store


def _texts(found) -> list[tuple[int, str]]:
    return [(m.seq, m.message["content"][0]["text"]) for m in found]


def test_messages_page_by_sequence(chatted):
    s = chatted.sessions
    assert _texts(s.messages_after("c", 0, limit=2)) == [(1, "m0"), (3, "m1")]
    assert _texts(s.messages_after("c", 3, limit=2)) == [(5, "m2"), (7, "m3")]
    assert _texts(s.messages_after("c", 11)) == []
    assert _texts(s.messages_before("c", 7, limit=2)) == [(5, "m2"), (3, "m1")]
    assert _texts(s.messages_latest("c", limit=2)) == [(11, "m5"), (9, "m4")]
    every = s.messages_after("c", 0)
    assert [m.entry_id for m in every] == [
        e.id for e in s.entries("c") if e.kind == EntryKind.MESSAGE
    ]


def test_messages_with_seq_are_the_replay_with_each_cursor(chatted):
    s = chatted.sessions
    kept = s.messages_after("c", 0)[3]
    comp = s.append(
        "c",
        EntryKind.COMPACTION,
        {"summary": "sum", "firstKeptEntryId": kept.entry_id, "tokensBefore": 3},
    )
    got = s.messages_with_seq("c")
    replay = s.replay("c")
    assert [m.message for m in got] == list(replay.messages)
    assert [m.entry_id for m in got] == list(replay.entry_ids)
    assert got[0].seq == comp.seq and got[1].seq == kept.seq


def test_message_paging_refuses_an_unknown_session_and_bad_cursors(store):
    for call in (
        lambda: store.sessions.messages_after("nope", 0),
        lambda: store.sessions.messages_before("nope", 5),
        lambda: store.sessions.messages_latest("nope"),
        lambda: store.sessions.messages_with_seq("nope"),
        lambda: store.sessions.latest("nope", EntryKind.COMPACTION),
        lambda: store.sessions.header("nope"),
    ):
        with pytest.raises(SessionNotFoundError):
            call()
    store.sessions.create("x")
    with pytest.raises(InvalidInputError):
        store.sessions.messages_after("x", -1)
    with pytest.raises(InvalidInputError):
        store.sessions.messages_latest("x", limit=0)


# -- getters ---------------------------------------------------------------------------


def test_latest_finds_the_newest_entry_of_a_kind_on_the_current_branch(store):
    store.sessions.create("g")
    first = store.sessions.append("g", EntryKind.MODEL_CHANGE, {"provider": "p", "modelId": "a"})
    store.sessions.append("g", EntryKind.MODE_CHANGE, {"mode": "plan"})
    off = store.sessions.append("g", EntryKind.MODEL_CHANGE, {"provider": "p", "modelId": "b"})
    assert store.sessions.latest("g", EntryKind.MODEL_CHANGE).id == off.id
    assert store.sessions.latest("g", EntryKind.MODE_CHANGE).payload == {"mode": "plan"}
    assert store.sessions.latest("g", EntryKind.COMPACTION) is None
    store.sessions.branch("g", first.id)  # "b" is off the branch now
    assert store.sessions.latest("g", EntryKind.MODEL_CHANGE).id == first.id
    assert store.sessions.latest("g", EntryKind.MODE_CHANGE) is None


def test_latest_title_and_directories_carry_what_was_written(store):
    """The seed's LatestSessionTitle (title and its source) and
    LatestAdditionalDirectoriesByID, read through ``latest``."""
    store.sessions.create("t")
    assert store.sessions.latest("t", EntryKind.SESSION_INFO) is None
    store.sessions.set_title("t", "first")
    store.sessions.set_title("t", "renamed", source="user")
    title = store.sessions.latest("t", EntryKind.SESSION_INFO)
    assert title.payload == {"name": "renamed", "source": "user"}
    assert store.sessions.get("t").title == "renamed"
    dirs = {"directories": ["/a", "/b"]}
    store.sessions.append("t", EntryKind.ADDITIONAL_DIRECTORIES, dirs)
    assert store.sessions.latest("t", EntryKind.ADDITIONAL_DIRECTORIES).payload == dirs


def test_the_header_is_the_seed_s_header_line(store):
    store.sessions.create("h", cwd="/w", header={"channelType": "chat", "cwd": "ignored"})
    h = store.sessions.header("h")
    assert list(h)[:5] == ["type", "version", "id", "timestamp", "cwd"]
    assert (h["type"], h["id"], h["cwd"], h["channelType"]) == ("session", "h", "/w", "chat")
    assert h["timestamp"].endswith("Z")


def test_execution_facts_read_runs_lease_and_recovery_in_one_snapshot(store):
    facts = store.sessions.execution_facts("nobody")
    assert (facts.session_exists, facts.active_runs, facts.lease) == (False, (), None)
    store.sessions.create("f")
    run = store.runs.admit("f", {"q": 1})
    lease = store.leases.acquire("session:f", "w", 60, purpose="recovery")
    store.recovery.begin(run.id, lease)
    facts = store.sessions.execution_facts("f")
    assert facts.session_exists
    assert [r.id for r in facts.active_runs] == [run.id]
    assert facts.lease is not None and facts.lease.live and facts.lease.epoch == lease.epoch
    assert (facts.lease.owner, facts.lease.purpose) == ("w", "recovery")
    assert [r.run_id for r in facts.recoveries] == [run.id]
    assert facts.lease.expires_at > facts.now
    store.leases.release(lease)
    assert not store.sessions.execution_facts("f").lease.live


# -- an upgraded store ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_sessions_of_an_older_store_open_by_prefix_after_the_upgrade(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 14 looks a prefix up by the id's first 8 characters: the sessions
    stored before it (DuckDB: the id_head the migration fills) must be found."""
    from older_stores import store_at

    def write(store: turnkeeper.BaseStore) -> dict[str, str]:
        store.sessions.create("0190abcd-1111", cwd="/a")
        store.sessions.create("0190abcd-2222", cwd="/a")
        return {}

    where = store_at(backend, 13, tmp_path, monkeypatch, write)
    with turnkeeper.open_store(where) as store:
        assert store.sessions.open("0190abcd-1").id == "0190abcd-1111"
        with pytest.raises(AmbiguousSessionIDError):
            store.sessions.open("0190abcd", cwd="/a")
        assert ids(store.sessions.list(cwd="/a")) == ["0190abcd-2222", "0190abcd-1111"]


def test_an_id_naming_a_file_in_the_working_directory_stays_an_id(
    store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store.sessions.create("0190abcd-1111")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "0190abcd-1111").write_text("not a session file\n")
    assert store.sessions.open("0190abcd-1111").id == "0190abcd-1111"


def test_two_continue_recent_on_a_new_directory_agree_on_one_session(real_store, monkeypatch):
    """Two processes resume the same empty directory at once: both read "no
    session here" before either creates one. They must still end with one
    session, not two (the read and the create are one serializable
    transaction on PostgreSQL; DuckDB's write lock orders them)."""
    check_continue_recent_race(real_store, monkeypatch)


def test_the_continue_recent_race_test_fails_at_snapshot_isolation(real_store, monkeypatch):
    """Control: the same race with the transaction at the store's usual
    REPEATABLE READ makes two sessions (write skew)."""
    if real_store.db.dialect.serialized_writes:
        pytest.skip("DuckDB: the write lock orders the two transactions")
    real_write = real_store.db.write

    def write(operation: str, body: Any, **kw: Any) -> Any:
        kw.pop("serializable", None)
        return real_write(operation, body, **kw)

    monkeypatch.setattr(real_store.db, "write", write)
    with pytest.raises(AssertionError, match="two sessions"):
        check_continue_recent_race(real_store, monkeypatch)


def check_continue_recent_race(store: Any, monkeypatch: Any) -> None:
    import contextlib
    import threading

    from turnkeeper.storage.ops import listing

    real = listing.most_recent
    both_read = threading.Barrier(2)
    waited: set[int] = set()

    def paused(tx: Any, cwd: str) -> Any:
        found = real(tx, cwd)
        me = threading.get_ident()
        if me not in waited:  # each thread's first attempt waits for the other's read
            waited.add(me)
            # DuckDB: the other waits for the write lock, so it cannot have read
            with contextlib.suppress(threading.BrokenBarrierError):
                both_read.wait(5 if store.db.dialect.serialized_writes else 60)
        return found

    monkeypatch.setattr(listing, "most_recent", paused)
    got: list[str] = []
    threads = [
        threading.Thread(target=lambda: got.append(store.sessions.continue_recent("/new").id))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(got) == 2
    assert got[0] == got[1], f"two sessions for one directory: {got}"
    assert store.sessions.count(cwd="/new") == 1
