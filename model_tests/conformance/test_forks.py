"""Session forks (session seed ForkSession): boundaries, every ErrFork*, idempotency,
reference remapping, a fork of real corpus sessions, and no writes on any error.

Corpus files are read in place (``../shared/corpus/pi`` or ``$TURNKEEPER_CORPUS``);
without them the corpus test is left out locally and fails CI (conftest's ``pi_dir``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import forge

from turnkeeper import (
    Entry,
    Fork,
    ForkInvalidBoundaryError,
    ForkNoCompletedTurnError,
    ForkRequestConflictError,
    ForkRequestIDRequiredError,
    ForkRequestIDTooLongError,
    ForkSessionActiveError,
    ForkSessionNotFoundError,
    ForkUnavailableError,
    ForkUnsupportedEntryError,
    IntegrityError,
    InvalidInputError,
    LeaseLostError,
    LeasePurposeError,
    Replay,
    Run,
    SessionIDExistsError,
    SessionRecoveryRequiredError,
)
from turnkeeper.formats import pi
from turnkeeper.spec.fork import FORK_REQUEST_ID_MAX_BYTES, ForkKind
from turnkeeper.spec.records import ImportBatch, ImportEntry

T0 = datetime(2026, 1, 1, tzinfo=UTC)


# -- helpers -------------------------------------------------------------------


def turn(store: Any, sid: str, text: str, status: str = "succeeded") -> Run:
    """One conversation turn: admit (turn start + user), start, finish (assistant + turn end)."""
    run: Run = store.runs.admit(sid, {"text": text}, user_message={"role": "user", "content": text})
    store.runs.start(run.id)
    if status == "cancelled":
        store.runs.request_cancel(run.id)
    return store.runs.finish(
        run.id, status, assistant_message={"role": "assistant", "content": f"re: {text}"}
    )


def rows(store: Any, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = store.query(sql, params).to_pylist()
    return out


def snapshot(store: Any) -> tuple[Any, ...]:
    """Everything a fork could write (fence_events aside: a refused fenced write logs one)."""
    return (
        rows(store, "SELECT * FROM sessions ORDER BY id"),
        rows(
            store,
            "SELECT session_id, id, parent_id, kind, seq, payload FROM entries "
            "ORDER BY session_id, seq",
        ),
        rows(store, "SELECT * FROM session_forks ORDER BY request_digest"),
        rows(
            store,
            "SELECT target, epoch, state, fenced_writes, expires_at FROM leases ORDER BY target",
        ),
        rows(store, "SELECT id, status, end_seq FROM conversation_turns ORDER BY id"),
    )


@contextmanager
def nothing_written(store: Any) -> Iterator[None]:
    before = snapshot(store)
    yield
    assert snapshot(store) == before


def branch_of(store: Any, sid: str, leaf: str | None = None) -> list[Entry]:
    """Root → leaf (the session's leaf by default) by parent pointers."""
    by_id = {e.id: e for e in store.sessions.entries(sid)}
    node = by_id.get(leaf or store.sessions.get(sid).leaf_id)
    out: list[Entry] = []
    while node is not None:
        out.append(node)
        node = by_id.get(node.parent_id) if node.parent_id else None
    return out[::-1]


def id_map(source: list[Entry], copy: list[Entry]) -> dict[str, str]:
    """Source id → fork id, pairing entries in order; kinds and timestamps must agree."""
    assert len(source) == len(copy)
    for s, c in zip(source, copy, strict=True):
        assert (s.kind, s.timestamp) == (c.kind, c.timestamp)
    return {s.id: c.id for s, c in zip(source, copy, strict=True)}


def remapped(replay: Replay, ids: Mapping[str, str]) -> tuple[Any, ...]:
    """``sessions.replay`` with every entry id named in it rewritten through ``ids``."""
    messages = []
    for m in replay.messages:
        m = dict(m)
        if m.get("role") == "branchSummary" and m.get("fromId") != "root":
            m["fromId"] = ids[m["fromId"]]
        messages.append(m)
    entry_ids = tuple(ids[i] for i in replay.entry_ids)
    return (messages, entry_ids, replay.model, replay.thinking_level)


def as_tuple(replay: Replay) -> tuple[Any, ...]:
    return (
        [dict(m) for m in replay.messages],
        replay.entry_ids,
        replay.model,
        replay.thinking_level,
    )


def forks_of(store: Any, sid: str) -> int:
    headers = rows(store, "SELECT header FROM sessions")
    return sum(1 for h in headers if json.loads(h["header"]).get("parentSession") == sid)


@pytest.fixture
def sid(store: Any) -> str:
    store.sessions.create("s", cwd="/work", header={"version": 3, "extra": "kept"})
    return "s"


# -- the fork itself -----------------------------------------------------------------


def test_session_fork_copies_the_branch_to_the_latest_completed_turn(store, sid, clock):
    store.sessions.append(sid, "model_change", {"provider": "p", "modelId": "m"})
    turn(store, sid, "one")
    store.sessions.set_title(sid, "first title")
    last = turn(store, sid, "two")
    before = store.sessions.replay(sid)
    source_branch = branch_of(store, sid)
    clock.advance(5)
    fork = store.forks.fork(sid, request_id="req-1")
    assert isinstance(fork, Fork)
    assert (fork.request_id, fork.source_session_id, fork.kind) == ("req-1", sid, ForkKind.SESSION)
    assert fork.boundary_turn_id == last.turn_id
    assert fork.boundary_entry_id == f"{last.id}:turn-end" == source_branch[-1].id
    assert fork.boundary_seq == source_branch[-1].seq
    assert fork.entries_copied == len(source_branch) == 10
    assert fork.created_at == clock.now
    fid = fork.fork_session_id
    session = store.sessions.get(fid)
    assert session is not None and session.leaf_id == fork.leaf_id
    assert (session.cwd, session.title, session.entry_count) == ("/work", "first title", 10)
    assert dict(session.header) == {
        "version": 3,
        "extra": "kept",
        "parentSession": sid,
        "forkBoundarySeq": fork.boundary_seq,
        "seedLength": 10,
        "forkKind": "session",
    }
    copy = store.sessions.entries(fid)
    assert [e.seq for e in copy] == list(range(1, 11))
    assert copy == branch_of(store, fid)  # one linear branch, parents remapped
    ids = id_map(source_branch, copy)
    assert not set(ids) & set(ids.values())  # every copied entry has a new id
    assert [(e.parent_id, e.lease_epoch) for e in copy] == [(None, None)] + [
        (e.id, None) for e in copy[:-1]
    ]
    assert [dict(e.payload) for e in copy] == [dict(e.payload) for e in source_branch]
    assert as_tuple(store.sessions.replay(fid)) == remapped(before, ids)
    # the source is untouched; the fork has no runs or turns of its own yet
    assert (
        store.sessions.replay(sid) == before
        and store.sessions.entries(sid)[-1].id == source_branch[-1].id
    )
    assert store.runs.list(fid) == []
    with pytest.raises(ForkNoCompletedTurnError):
        store.forks.fork(fid, request_id="fork-of-fork")
    assert store.forks.get("req-1") == fork
    assert store.forks.get("never-used") is None


def test_message_fork_at_a_named_turn_or_one_of_its_entries(store, sid):
    first = turn(store, sid, "one")
    at_first = store.sessions.replay(sid)
    first_branch = branch_of(store, sid)
    turn(store, sid, "two")
    by_turn = store.forks.fork(sid, request_id="by-turn", boundary_turn_id=first.turn_id)
    user_seq = store.sessions.entry(sid, first.user_entry_id).seq
    by_seq = store.forks.fork(sid, request_id="by-seq", at_seq=user_seq)
    for fork in (by_turn, by_seq):
        assert fork.kind == ForkKind.MESSAGE and fork.boundary_turn_id == first.turn_id
        assert fork.boundary_seq == first_branch[-1].seq and fork.entries_copied == 4
        ids = id_map(first_branch, store.sessions.entries(fork.fork_session_id))
        assert as_tuple(store.sessions.replay(fork.fork_session_id)) == remapped(at_first, ids)
        assert store.sessions.get(fork.fork_session_id).header["forkKind"] == "message"
    # the turn_end entry itself names its turn too
    end = store.forks.fork(sid, request_id="by-end", at_seq=first_branch[-1].seq)
    assert end.boundary_turn_id == first.turn_id


def test_fork_into_a_chosen_session_id(store, sid):
    turn(store, sid, "one")
    fork = store.forks.fork(sid, request_id="r", fork_session_id="child")
    assert fork.fork_session_id == "child" and store.sessions.get("child") is not None
    with nothing_written(store), pytest.raises(SessionIDExistsError):
        store.forks.fork(sid, request_id="r2", fork_session_id="child")
    with nothing_written(store), pytest.raises(SessionIDExistsError):
        store.forks.fork(sid, request_id="r3", fork_session_id=sid)


# -- idempotency ------------------------------------------------------------------


def test_the_same_request_id_returns_the_same_fork(store, sid, clock):
    turn(store, sid, "one")
    fork = store.forks.fork(sid, request_id="r")
    turn(store, sid, "two")  # the source moves on
    store.runs.admit(sid, {"text": "three"})  # and is even active now
    clock.advance(60)
    with nothing_written(store):
        assert store.forks.fork(sid, request_id="r") == fork
    assert forks_of(store, sid) == 1
    stored = rows(store, "SELECT * FROM session_forks")
    assert len(stored) == 1 and "r" not in stored[0].values()  # only a digest of the id


@pytest.mark.parametrize(
    "change",
    [
        {"source": "other"},
        {"boundary_turn_id": "TURN"},
        {"at_seq": 2},
        {"fork_session_id": "child"},
    ],
)
def test_a_different_request_under_the_same_id_conflicts(store, sid, change):
    store.sessions.create("other")
    first = turn(store, sid, "one")
    turn(store, "other", "one")
    fork = store.forks.fork(sid, request_id="r")
    change = dict(change)
    source = change.pop("source", sid)
    if change.get("boundary_turn_id") == "TURN":
        change["boundary_turn_id"] = first.turn_id
    with nothing_written(store), pytest.raises(ForkRequestConflictError) as err:
        store.forks.fork(source, request_id="r", **change)
    assert (err.value.session_id, err.value.request_id) == (source, "r")
    assert err.value.fork_session_id == fork.fork_session_id


def test_one_fork_per_request_id_is_held_by_the_schema(store, sid):
    turn(store, sid, "one")
    store.forks.fork(sid, request_id="r")
    row = rows(store, "SELECT * FROM session_forks")[0]
    row["fork_session_id"] = "another"
    cols = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    with pytest.raises(IntegrityError):
        forge(
            store, f"INSERT INTO session_forks ({cols}) VALUES ({marks})", [*row.values()], rows=1
        )


@pytest.mark.parametrize("chosen", [None, "child"])
def test_concurrent_forks_under_one_request_id_make_exactly_one_fork(store, sid, chosen):
    for n in range(3):
        turn(store, sid, f"turn {n}")
    workers = 8
    barrier = threading.Barrier(workers)
    results: list[Fork] = []
    failures: list[BaseException] = []

    def work() -> None:
        barrier.wait()
        try:
            results.append(store.forks.fork(sid, request_id="same", fork_session_id=chosen))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert len(results) == workers and len(set(results)) == 1
    assert forks_of(store, sid) == 1
    assert rows(store, "SELECT count(*) AS n FROM session_forks")[0]["n"] == 1
    fid = results[0].fork_session_id
    assert len(store.sessions.entries(fid)) == results[0].entries_copied == 12
    total = rows(store, "SELECT count(*) AS n FROM entries WHERE session_id <> ?", [sid])
    assert total[0]["n"] == 12  # no loser left entries behind


def test_concurrent_forks_under_different_ids_are_separate(store, sid):
    turn(store, sid, "one")
    barrier = threading.Barrier(4)
    results: list[Fork] = []

    def work(n: int) -> None:
        barrier.wait()
        results.append(store.forks.fork(sid, request_id=f"r{n}"))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({f.fork_session_id for f in results}) == 4 == forks_of(store, sid)


# -- request ids -------------------------------------------------------------------


@pytest.mark.parametrize("request_id", [None, "", "   "])
def test_a_request_id_is_required(store, sid, request_id):
    turn(store, sid, "one")
    with nothing_written(store), pytest.raises(ForkRequestIDRequiredError) as err:
        store.forks.fork(sid, request_id=request_id)
    assert err.value.session_id == sid


def test_a_request_id_has_a_byte_limit(store, sid):
    turn(store, sid, "one")
    longest = "a" * FORK_REQUEST_ID_MAX_BYTES
    too_long = "é" * (FORK_REQUEST_ID_MAX_BYTES // 2 + 1)  # two UTF-8 bytes each
    with nothing_written(store), pytest.raises(ForkRequestIDTooLongError) as err:
        store.forks.fork(sid, request_id=too_long)
    assert (err.value.session_id, err.value.length, err.value.limit) == (
        sid,
        FORK_REQUEST_ID_MAX_BYTES + 2,
        FORK_REQUEST_ID_MAX_BYTES,
    )
    assert store.forks.fork(sid, request_id=longest).request_id == longest
    assert store.forks.get(longest) is not None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"request_id": 7},
        {"request_id": "bad\ud800"},
        {"request_id": "r", "at_seq": 0},
        {"request_id": "r", "at_seq": True},
        {"request_id": "r", "at_seq": "3"},
        {"request_id": "r", "at_seq": 2, "boundary_turn_id": "t"},
        {"request_id": "r", "boundary_turn_id": ""},
        {"request_id": "r", "fork_session_id": ""},
    ],
)
def test_bad_input_is_refused_before_anything_is_written(store, sid, kwargs):
    turn(store, sid, "one")
    with nothing_written(store), pytest.raises(InvalidInputError):
        store.forks.fork(sid, **kwargs)


# -- the source ---------------------------------------------------------------------


def test_a_missing_source_is_not_found(store):
    with nothing_written(store), pytest.raises(ForkSessionNotFoundError) as err:
        store.forks.fork("nope", request_id="r")
    assert err.value.session_id == "nope"


def test_a_source_with_a_non_terminal_run_is_active(store, sid):
    turn(store, sid, "one")
    run = store.runs.admit(sid, {"text": "two"})
    with nothing_written(store), pytest.raises(ForkSessionActiveError) as err:
        store.forks.fork(sid, request_id="r")
    assert err.value.session_id == sid
    with nothing_written(store), pytest.raises(SessionRecoveryRequiredError):
        store.leases.acquire(f"session:{sid}", "forker", 30, purpose="fork")  # not even taken
    store.runs.finish(run.id, "failed")  # without a lease: only while nobody holds the session
    lease = store.leases.acquire(f"session:{sid}", "forker", 30, purpose="fork")
    assert store.forks.fork(sid, request_id="r", lease=lease).boundary_turn_id


@pytest.mark.parametrize("purpose", ["mutation", "execution", "fork"])
def test_a_source_leased_by_someone_is_active(store, sid, clock, purpose):
    turn(store, sid, "one")
    lease = store.leases.acquire(f"session:{sid}", "worker", 10, purpose=purpose)
    with nothing_written(store), pytest.raises(ForkSessionActiveError):
        store.forks.fork(sid, request_id="r")
    store.leases.release(lease)
    store.forks.fork(sid, request_id="r")  # released: idle
    store.leases.acquire(f"session:{sid}", "worker", 10, purpose=purpose)
    clock.advance(10)
    store.forks.fork(sid, request_id="r2")  # expired: idle


def test_a_fork_lease_is_fenced_in_the_fork(store, sid, clock):
    turn(store, sid, "one")
    lease = store.leases.acquire(f"session:{sid}", "forker", 10, purpose="fork")
    fork = store.forks.fork(sid, request_id="r", lease=lease)
    fenced = rows(store, "SELECT fenced_writes FROM leases")[0]["fenced_writes"]
    assert fenced == (0 if store.db.dialect.serialized_writes else 1)  # DuckDB's fence reads
    assert rows(store, "SELECT lease_epoch FROM session_forks")[0]["lease_epoch"] == lease.epoch
    assert store.forks.get("r") == fork
    # a lost fork lease writes nothing but the refusal record
    clock.advance(10)
    with nothing_written(store), pytest.raises(LeaseLostError):
        store.forks.fork(sid, request_id="r2", lease=lease)
    refused = rows(store, "SELECT operation, epoch FROM fence_events")
    assert refused == [{"operation": "fork_session", "epoch": lease.epoch}]


def test_a_lease_must_be_a_fork_lease_on_the_source(store, sid):
    turn(store, sid, "one")
    store.sessions.create("other")
    mutation = store.leases.acquire(f"session:{sid}", "w", 10, purpose="mutation")
    with nothing_written(store), pytest.raises(LeasePurposeError) as err:
        store.forks.fork(sid, request_id="r", lease=mutation)
    assert (err.value.held_purpose, err.value.requested_purpose) == ("mutation", "fork")
    # a forged purpose field does not pass: the stored purpose decides
    forged = type(mutation)(
        mutation.target, mutation.owner, mutation.token, mutation.epoch, "fork", mutation.expires_at
    )
    with nothing_written(store), pytest.raises(LeasePurposeError):
        store.forks.fork(sid, request_id="r", lease=forged)
    elsewhere = store.leases.acquire("session:other", "w", 10, purpose="fork")
    with nothing_written(store), pytest.raises(InvalidInputError):
        store.forks.fork(sid, request_id="r", lease=elsewhere)


# -- boundaries ---------------------------------------------------------------------


def test_a_session_without_a_completed_turn_cannot_fork(store, sid):
    store.sessions.append(sid, "message", {"message": {"role": "user", "content": "hi"}})
    with nothing_written(store), pytest.raises(ForkNoCompletedTurnError) as err:
        store.forks.fork(sid, request_id="r")
    assert err.value.session_id == sid
    turn(store, sid, "failed", status="failed")
    turn(store, sid, "interrupted", status="interrupted")
    turn(store, sid, "cancelled", status="cancelled")
    with nothing_written(store), pytest.raises(ForkNoCompletedTurnError):
        store.forks.fork(sid, request_id="r")
    with nothing_written(store), pytest.raises(ForkNoCompletedTurnError):
        store.forks.fork("s", request_id="r", at_seq=1)


def test_a_session_fork_skips_later_turns_that_did_not_complete(store, sid):
    good = turn(store, sid, "one")
    turn(store, sid, "two", status="failed")
    fork = store.forks.fork(sid, request_id="r")
    assert fork.boundary_turn_id == good.turn_id and fork.entries_copied == 4


def test_a_named_boundary_that_is_not_there_is_unavailable(store, sid):
    store.sessions.create("other")
    turn(store, sid, "one")
    theirs = turn(store, "other", "one")
    last_seq = store.sessions.get(sid).next_seq - 1
    for kwargs in (
        {"boundary_turn_id": "no-such-turn"},
        {"boundary_turn_id": theirs.turn_id},  # another session's turn
        {"at_seq": last_seq + 1},
    ):
        with nothing_written(store), pytest.raises(ForkUnavailableError) as err:
            store.forks.fork(sid, request_id="r", **kwargs)
        assert err.value.session_id == sid


def test_a_turn_whose_end_entry_is_missing_is_unavailable(store, sid):
    run = turn(store, sid, "one")
    forge(store, "UPDATE conversation_turns SET end_seq = 99 WHERE id = ?", [run.turn_id], rows=1)
    with nothing_written(store), pytest.raises(ForkUnavailableError):
        store.forks.fork(sid, request_id="r")


def test_a_named_boundary_that_is_not_a_completed_turn_is_invalid(store, sid):
    turn(store, sid, "one")
    failed = turn(store, sid, "two", status="failed")
    label = store.sessions.set_label(sid, failed.user_entry_id, "between turns")
    abandoned = store.runs.admit(sid, {"text": "three"})
    store.runs.finish(abandoned.id, "abandoned")
    failed_user_seq = store.sessions.entry(sid, failed.user_entry_id).seq
    for kwargs in (
        {"boundary_turn_id": failed.turn_id},
        {"boundary_turn_id": abandoned.turn_id},
        {"at_seq": failed_user_seq},
        {"at_seq": label.seq},  # inside no turn
    ):
        with nothing_written(store), pytest.raises(ForkInvalidBoundaryError) as err:
            store.forks.fork(sid, request_id="r", **kwargs)
        assert err.value.session_id == sid


def test_an_open_turn_is_an_invalid_boundary(store, sid):
    turn(store, sid, "one")
    run = store.runs.admit(sid, {"text": "two"})
    # an orphaned open turn whose run row was ended without closing it
    forge(store, "DELETE FROM active_runs WHERE run_id = ?", [run.id], rows=1)
    with nothing_written(store), pytest.raises(ForkInvalidBoundaryError):
        store.forks.fork(sid, request_id="r", boundary_turn_id=run.turn_id)


def test_an_entry_off_the_turns_branch_is_an_invalid_boundary(store, sid):
    run = store.runs.admit(sid, {"text": "one"}, user_message={"role": "user", "content": "one"})
    store.runs.start(run.id)
    store.sessions.branch(sid, f"{run.id}:turn-start")  # the user entry leaves the turn's branch
    store.runs.finish(run.id, "succeeded", assistant_message={"role": "assistant", "content": "x"})
    user_seq = store.sessions.entry(sid, run.user_entry_id).seq
    with nothing_written(store), pytest.raises(ForkInvalidBoundaryError):
        store.forks.fork(sid, request_id="r", at_seq=user_seq)
    fork = store.forks.fork(sid, request_id="r2", boundary_turn_id=run.turn_id)
    assert fork.entries_copied == 3  # turn start, assistant, turn end


# -- references -------------------------------------------------------------------


def test_compaction_label_and_branch_summary_references_are_remapped(store, sid):
    def msg(role: str, text: str) -> dict[str, Any]:
        return {"message": {"role": role, "content": text}}

    m1 = store.sessions.append(sid, "message", msg("user", "m1"))
    m2 = store.sessions.append(sid, "message", msg("assistant", "m2"))
    m3 = store.sessions.append(sid, "message", msg("user", "m3"))
    comp = store.sessions.append(sid, "compaction", {"summary": "s", "firstKeptEntryId": m2.id})
    lab_on = store.sessions.set_label(sid, m1.id, "on the branch")
    a1 = store.sessions.append(sid, "message", msg("user", "abandoned 1"))
    a2 = store.sessions.append(sid, "message", msg("assistant", "abandoned 2"))
    store.sessions.branch(sid, lab_on.id)
    b1 = store.sessions.append(sid, "message", msg("user", "dropped"))  # referenced by nothing
    summary = store.sessions.branch_with_summary(sid, lab_on.id, "what b1 did")
    assert summary.payload["fromId"] == b1.id
    summary2 = store.sessions.branch_with_summary(
        sid, summary.id, "gone"
    )  # fromId: summary (on branch)
    lab_off = store.sessions.set_label(sid, a1.id, "off the branch")
    run = turn(store, sid, "after")
    before = store.sessions.replay(sid)
    fork = store.forks.fork(sid, request_id="r")
    fid = fork.fork_session_id
    copied_source = [e for e in store.sessions.entries(sid) if e.id not in {a2.id}]
    # a1 (label target) and b1 (summary source) come with their branches; a2 is on
    # no copied branch and referenced by nothing
    copied_source = [e for e in copied_source if e.seq <= fork.boundary_seq]
    copy = store.sessions.entries(fid)
    ids = id_map(copied_source, copy)
    assert fork.entries_copied == len(copy) == len(copied_source)
    by_new = {e.id: e for e in copy}
    assert by_new[ids[comp.id]].payload["firstKeptEntryId"] == ids[m2.id]
    assert by_new[ids[lab_on.id]].payload["targetId"] == ids[m1.id]
    assert by_new[ids[lab_off.id]].payload["targetId"] == ids[a1.id]
    assert by_new[ids[summary.id]].payload["fromId"] == ids[b1.id]
    assert by_new[ids[summary2.id]].payload["fromId"] == ids[summary.id]
    for e in copied_source:  # parents remapped, side branches kept as branches
        assert by_new[ids[e.id]].parent_id == (None if e.parent_id is None else ids[e.parent_id])
    assert as_tuple(store.sessions.replay(fid)) == remapped(before, ids)
    assert store.sessions.labels(fid) == {ids[t]: v for t, v in store.sessions.labels(sid).items()}
    assert fork.leaf_id == ids[f"{run.id}:turn-end"]
    assert m3.id in ids


def test_a_branch_summary_from_the_root_is_copied_as_is(store, sid):
    store.sessions.import_batch(
        ImportBatch(
            session_id=sid,
            cwd="/work",
            created_at=T0,
            header={},
            entries=[
                ImportEntry(
                    "a", None, "message", T0, {"message": {"role": "user", "content": "a"}}
                ),
                ImportEntry("b", "a", "branch_summary", T0, {"summary": "s", "fromId": "root"}),
            ],
            leaf_id="b",
        )
    )
    turn(store, sid, "one")
    fork = store.forks.fork(sid, request_id="r")
    summary = next(
        e for e in store.sessions.entries(fork.fork_session_id) if e.kind == "branch_summary"
    )
    assert summary.payload["fromId"] == "root"


def imported(store: Any, sid: str, entries: list[ImportEntry], leaf: str) -> None:
    store.sessions.create(sid)
    store.sessions.import_batch(ImportBatch(sid, "/w", T0, {}, entries, leaf))


def user(eid: str, parent: str | None) -> ImportEntry:
    return ImportEntry(eid, parent, "message", T0, {"message": {"role": "user", "content": eid}})


@pytest.mark.parametrize(
    ("entries", "culprit"),
    [
        # an entry kind the seed does not define (oh-my-pi's leaf_change)
        ([user("a", None), ImportEntry("x", "a", "leaf_change", T0, {"targetId": "a"})], "x"),
        # references to entries the session does not have
        ([user("a", None), ImportEntry("x", "a", "label", T0, {"targetId": "gone"})], "x"),
        (
            [
                user("a", None),
                ImportEntry("x", "a", "compaction", T0, {"summary": "", "firstKeptEntryId": "no"}),
            ],
            "x",
        ),
        (
            [
                user("a", None),
                ImportEntry("x", "a", "branch_summary", T0, {"summary": "s", "fromId": "q"}),
            ],
            "x",
        ),
    ],
)
def test_entries_a_fork_cannot_copy_are_unsupported(store, entries, culprit):
    imported(store, "imp", entries, entries[-1].id)
    turn(store, "imp", "one")
    with nothing_written(store), pytest.raises(ForkUnsupportedEntryError) as err:
        store.forks.fork("imp", request_id="r")
    assert (err.value.session_id, err.value.entry_id) == ("imp", culprit)


def test_a_reference_to_an_entry_after_the_boundary_is_unsupported(store):
    imported(
        store,
        "imp",
        [user("a", None), ImportEntry("x", "a", "label", T0, {"targetId": "later"})],
        "x",
    )
    turn(store, "imp", "one")
    leaf = store.sessions.get("imp").leaf_id
    # the file grows: the label's target arrives after the turn
    store.sessions.import_batch(
        ImportBatch("imp", "/w", T0, {}, [user("a", None), user("later", leaf)], "later")
    )
    with nothing_written(store), pytest.raises(ForkUnsupportedEntryError) as err:
        store.forks.fork("imp", request_id="r")
    assert err.value.entry_id == "x"


def test_unknown_kinds_off_every_copied_branch_do_not_matter(store):
    imported(
        store,
        "imp",
        [
            user("a", None),
            ImportEntry("x", "a", "leaf_change", T0, {"targetId": "a"}),
            user("b", "a"),
        ],
        "b",
    )
    turn(store, "imp", "one")
    fork = store.forks.fork("imp", request_id="r")
    assert "leaf_change" not in {e.kind for e in store.sessions.entries(fork.fork_session_id)}


# -- real sessions -------------------------------------------------------------------


@pytest.fixture(scope="module")
def pi_files(pi_dir: Path) -> list[Path]:
    files = sorted(pi_dir.glob("*.jsonl"))
    assert files
    return files


def test_fork_of_real_corpus_sessions(store, pi_files, clock):
    for path in pi_files:
        done = pi.import_file(store, path)
        sid = done.session_id
        with nothing_written(store), pytest.raises(ForkNoCompletedTurnError):
            store.forks.fork(sid, request_id=f"early:{sid}")
        run = turn(store, sid, f"continue {path.name}")
        before = store.sessions.replay(sid)
        source_branch = branch_of(store, sid)
        clock.advance(1)
        fork = store.forks.fork(sid, request_id=f"fork:{sid}")
        assert fork.boundary_turn_id == run.turn_id
        assert fork.leaf_id == store.sessions.get(fork.fork_session_id).leaf_id
        copy = store.sessions.entries(fork.fork_session_id)
        assert copy == branch_of(store, fork.fork_session_id)
        ids = id_map(source_branch, copy)
        assert as_tuple(store.sessions.replay(fork.fork_session_id)) == remapped(before, ids)
        assert len(store.sessions.replay(fork.fork_session_id).messages) == len(before.messages) > 2
        for s, c in zip(source_branch, copy, strict=True):
            if s.kind == "compaction" and s.payload.get("firstKeptEntryId") is not None:
                assert c.payload["firstKeptEntryId"] == ids[s.payload["firstKeptEntryId"]]
            else:
                assert c.payload == s.payload
        header = store.sessions.get(fork.fork_session_id).header
        assert header["parentSession"] == sid and "id" not in header
        assert store.forks.fork(sid, request_id=f"fork:{sid}") == fork


def test_fork_timestamps_are_the_sources(store, sid, clock):
    turn(store, sid, "one")
    clock.advance(timedelta(hours=1).total_seconds())
    fork = store.forks.fork(sid, request_id="r")
    src = [e.timestamp for e in store.sessions.entries(sid)]
    assert [e.timestamp for e in store.sessions.entries(fork.fork_session_id)] == src
    assert fork.created_at == clock.now > max(src)
