"""Appends merged by DuckDB's group commit (``storage/ops/appends.py``).

Queued plain appends run as set-based statements in one call; each is still
judged on its own. A differential test queues random batches (sessions
repeated, missing, held by others, leases valid, stale or absent, expected
leaves right or wrong) behind the write lock and compares every caller's
outcome and everything stored with the same calls made one after another on
a second store. Controls: a merge without its fence, and one that ignores
the session's holder, are caught.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_group_commit import grouped, queued_together, user

import turnkeeper
from turnkeeper import ANY_LEAF, EntryKind
from turnkeeper.spec import errors
from turnkeeper.storage.ops import appends, leases

M = EntryKind.MESSAGE
SESSIONS = ["a", "b", "c", "held", "missing"]
"""``held`` is held by another owner; ``missing`` is never created."""

CALL = st.tuples(
    st.sampled_from(SESSIONS),
    st.sampled_from(["none", "valid", "stale"]),
    st.sampled_from(["any", "right", "wrong"]),
    st.integers(1, 3),  # entries: 1 → append, more → append_many
)


class World:
    """One store with the sessions and leases the calls use."""

    def __init__(self, path: Path, clock: Any, behind: tuple[str, ...] = ()) -> None:
        self.store = turnkeeper.open_store(str(path), clock=clock)
        self.leases: dict[str, tuple[turnkeeper.Lease, turnkeeper.Lease]] = {}
        for sid in ("a", "b", "c", "held"):
            self.store.sessions.create(sid)
            self.store.sessions.append(sid, M, user("root"))
        for sid in ("a", "b"):
            stale = self.store.leases.acquire(f"session:{sid}", "w0", 5)
            self.leases[sid] = (stale, stale)
        self.store.leases.acquire("session:held", "other", 3600)
        clock.advance(6)  # the w0 leases expire; w1 takes them over
        for sid in ("a", "b"):
            valid = self.store.leases.acquire(f"session:{sid}", "w1", 3600)
            self.leases[sid] = (valid, self.leases[sid][0])
        for sid in behind:
            self.move_behind(sid)

    def move_behind(self, sid: str) -> None:
        """Append to ``sid`` and then have the store object remember the head
        before it (``pairing_checks.OpeningCache``), as if another store
        object had appended: the merged path's assumed head is behind."""
        remembered = self.store.sessions._openings  # type: ignore[attr-defined]
        before = remembered.get(sid)
        assert before is not None, sid
        lease = self.leases[sid][0] if sid in self.leases else None
        self.store.sessions.append(sid, M, user(f"behind {sid}"), lease=lease)
        remembered.put(sid, before)

    def call(self, spec: tuple[str, str, str, int], n: int) -> Any:
        sid, lease_kind, leaf_kind, count = spec
        lease = None
        if lease_kind != "none" and sid in self.leases:
            lease = self.leases[sid][0 if lease_kind == "valid" else 1]
        head = self.store.sessions.get(sid)
        leaf: Any = ANY_LEAF
        if leaf_kind == "right" and head is not None:
            leaf = head.leaf_id
        elif leaf_kind == "wrong":
            leaf = "not-the-leaf"
        payloads = [user(f"{n}.{k}") for k in range(count)]

        def run() -> Any:
            if count == 1:
                return self.store.sessions.append(
                    sid, M, payloads[0], lease=lease, expected_leaf=leaf
                )
            return self.store.sessions.append_many(
                sid, [(M, p) for p in payloads], lease=lease, expected_leaf=leaf
            )

        return run

    def stored(self) -> dict[str, list[tuple[Any, ...]]]:
        return {
            sid: [
                (e.payload["message"]["content"], e.seq, e.lease_epoch)
                for e in self.store.sessions.entries(sid)
            ]
            for sid in ("a", "b", "c", "held")
        }


def outcome(value: Any) -> Any:
    if isinstance(value, BaseException):
        return type(value).__name__
    entries = value if isinstance(value, list) else [value]
    return [(e.session_id, e.seq, e.payload["message"]["content"]) for e in entries]


def differential(
    tmp: Path,
    clock_factory: Any,
    calls: list[tuple[str, str, str, int]],
    behind: tuple[str, ...] = (),
) -> None:
    grouped_world = World(tmp / f"g{next(_n)}.duckdb", clock_factory(), behind)
    serial_world = World(tmp / f"s{next(_n)}.duckdb", clock_factory(), behind)
    try:
        # the expected leaf of "right" is read before the batch (all see the same)
        got = queued_together(
            grouped_world.store, [grouped_world.call(c, n) for n, c in enumerate(calls)]
        )
        want = []
        runs = [serial_world.call(c, n) for n, c in enumerate(calls)]
        for run in runs:
            try:
                want.append(run())
            except errors.TurnkeeperError as exc:
                want.append(exc)
        assert [outcome(g) for g in got] == [outcome(w) for w in want], calls
        assert grouped_world.stored() == serial_world.stored()
    finally:
        grouped_world.store.close()
        serial_world.store.close()


_n = itertools.count()


def test_merged_appends_agree_with_the_same_calls_one_after_another(tmp_path: Path) -> None:
    from turnkeeper.fuzz import FakeClock

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(st.lists(CALL, min_size=2, max_size=12))
    def agree(calls: list[tuple[str, str, str, int]]) -> None:
        differential(tmp_path, FakeClock, calls)

    agree()


def test_merged_appends_at_heads_remembered_behind_agree_with_one_after_another(
    tmp_path: Path,
) -> None:
    """As above, with the heads the store object remembers for some sessions
    behind theirs (another store object appended since): the merged path
    assumes the remembered heads (``appends._heads``), and each append whose
    compare-and-set finds another head, or that is refused at the assumed
    one, is judged again at its read head, with the outcome of a call alone."""
    from turnkeeper.fuzz import FakeClock

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(
        st.lists(CALL.filter(lambda c: c[0] != "missing"), min_size=2, max_size=12),
        st.sets(st.sampled_from(["a", "b", "c"]), min_size=1),
    )
    def agree(calls: list[tuple[str, str, str, int]], behind: set[str]) -> None:
        differential(tmp_path, FakeClock, calls, tuple(sorted(behind)))

    agree()


def remembered_behind(
    store: turnkeeper.BaseStore, other: turnkeeper.BaseStore, *, expect: bool
) -> list[Any]:
    """Sessions ``s`` and ``t`` written through ``store`` (which remembers their
    heads), then ``s`` appended to through ``other``, a second store object on
    the same file; then, queued together on ``store``: an append to ``s``
    (``expect``: expecting its leaf as it now is), and one to ``t``."""
    for sid in ("s", "t"):
        store.sessions.create(sid)
        store.sessions.append(sid, M, user(f"{sid} first"))
    moved = other.sessions.append("s", M, user("s by the other"))
    return queued_together(
        store,
        [
            lambda: store.sessions.append(
                "s", M, user("s second"), expected_leaf=moved.id if expect else ANY_LEAF
            ),
            lambda: store.sessions.append("t", M, user("t second")),
        ],
    )


def check_behind(store: turnkeeper.BaseStore, got: list[Any]) -> None:
    assert [type(g).__name__ for g in got] == ["Entry", "Entry"], got
    s = store.sessions.entries("s")
    assert [e.payload["message"]["content"] for e in s] == ["s first", "s by the other", "s second"]
    assert [e.seq for e in s] == [s[0].seq, s[0].seq + 1, s[0].seq + 2]
    assert s[2].parent_id == s[1].id
    assert store.sessions.get("s").leaf_id == s[2].id  # type: ignore[union-attr]
    t = store.sessions.entries("t")
    assert [e.seq for e in t] == [t[0].seq, t[0].seq + 1]
    assert grouped(store, "append") == 2


@pytest.fixture
def twin_stores(tmp_path: Path) -> Any:
    path = tmp_path / "twins.duckdb"
    with turnkeeper.open_store(path) as store, turnkeeper.open_store(path) as other:
        yield store, other


@pytest.mark.parametrize("expect", [False, True], ids=["any-leaf", "expected-leaf"])
def test_a_merged_append_at_a_head_remembered_behind_is_judged_at_the_read_one(
    twin_stores: Any, expect: bool
) -> None:
    store, other = twin_stores
    check_behind(store, remembered_behind(store, other, expect=expect))


def test_control_written_at_a_head_remembered_behind_is_caught(
    twin_stores: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: a round that takes every compare-and-set as taken (the
    session row of ``s`` did not move) stores ``s``'s entry at the old head."""
    monkeypatch.setattr(appends, "_moved", lambda tx, requests, writing, leaves: set(writing))
    store, other = twin_stores
    got = remembered_behind(store, other, expect=False)
    with pytest.raises(AssertionError):
        check_behind(store, got)


def test_control_refused_at_a_head_remembered_behind_is_caught(
    twin_stores: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: a round that keeps the error judged at the assumed head gives
    ``s``'s caller a ``SessionModifiedError`` its call alone never gets."""
    monkeypatch.setattr(appends, "_refused_at_assumed", lambda assumed, out: [])
    store, other = twin_stores
    got = remembered_behind(store, other, expect=True)
    assert type(got[0]).__name__ == "SessionModifiedError", got
    with pytest.raises(AssertionError):
        check_behind(store, got)


def stale_at_assumed_heads(store: turnkeeper.BaseStore, clock: Any) -> list[Any]:
    """Queued together, at heads the store object remembers (each session's
    first append in the group: the assumed path): the stale holder's append
    to ``s`` (its lease taken over), and a plain append to ``t``."""
    for sid in ("s", "t"):
        store.sessions.create(sid)
    old = store.leases.acquire("session:s", "w1", 5)
    clock.advance(6)
    store.leases.acquire("session:s", "w2", 600)
    return queued_together(
        store,
        [
            lambda: store.sessions.append("s", M, user("stale"), lease=old),
            lambda: store.sessions.append("t", M, user("plain")),
        ],
    )


def check_stale_at_assumed_heads(store: turnkeeper.BaseStore, got: list[Any]) -> None:
    assert [type(g).__name__ for g in got] == ["LeaseLostError", "Entry"], got
    assert store.sessions.entries("s") == []
    assert grouped(store, "append") == 2


def test_a_merged_group_fences_each_append_at_assumed_heads(
    duck_store: turnkeeper.BaseStore, clock: Any
) -> None:
    check_stale_at_assumed_heads(duck_store, stale_at_assumed_heads(duck_store, clock))


def test_control_the_assumed_heads_fence_is_caught(
    duck_store: turnkeeper.BaseStore, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the fence on the lease rows read alone (``leases.fence_holds``,
    at assumed heads) patched to pass every lease lets the stale holder's
    append in."""
    monkeypatch.setattr(leases, "fence_holds", lambda row, lease: True)
    got = stale_at_assumed_heads(duck_store, clock)
    with pytest.raises(AssertionError):
        check_stale_at_assumed_heads(duck_store, got)


def test_a_later_round_assumes_the_head_the_earlier_round_left(
    duck_real_store: turnkeeper.BaseStore,
) -> None:
    """Two queued appends to ``s`` (two rounds) and one to ``t``, every head
    remembered: the second append to ``s`` assumes the head the first left,
    so each round is a read of the lease rows, the compare-and-set and the
    insert: 8 statements for the three with BEGIN and COMMIT (a head taken
    from before the group would miss, and be read again with its branch)."""
    store = duck_real_store
    for sid in ("s", "t"):
        store.sessions.create(sid)
    got = queued_together(
        store,
        [
            lambda: store.sessions.append("s", M, user("s1")),
            lambda: store.sessions.append("t", M, user("t1")),
            lambda: store.sessions.append("s", M, user("s2")),
        ],
    )
    assert [type(g).__name__ for g in got] == ["Entry", "Entry", "Entry"], got
    assert got[2].parent_id == got[0].id and got[2].seq == got[0].seq + 1
    assert grouped(store, "append") == 3
    assert store.statement_stats()["append"]["statements_per_call"] * 3 == pytest.approx(8)


def test_queued_appends_are_merged(duck_real_store: turnkeeper.BaseStore) -> None:
    """Sixteen queued appends to sixteen sessions run as one merged call: a
    handful of statements for all of them, not four or five each."""
    store = duck_real_store
    for i in range(16):
        store.sessions.create(f"s{i}")
    got = queued_together(
        store, [lambda i=i: store.sessions.append(f"s{i}", M, user(str(i))) for i in range(16)]
    )
    assert all(isinstance(e, turnkeeper.Entry) for e in got), got
    assert grouped(store, "append") == 16
    per_call = store.statement_stats()["append"]["statements_per_call"]
    # BEGIN, sessions, leases, the session rows, the insert, COMMIT: for all 16
    assert per_call * 16 <= 8, per_call
    assert [store.sessions.replay(f"s{i}").messages[0]["content"] for i in range(16)] == [
        str(i) for i in range(16)
    ]


def stale_scenario(store: turnkeeper.BaseStore, clock: Any) -> list[Any]:
    """Queued together: a fresh holder's append, the stale holder's, a lease-less
    append to a session someone holds, and a plain one."""
    for sid in ("s", "t", "u"):
        store.sessions.create(sid)
    old = store.leases.acquire("session:s", "w1", 5)
    clock.advance(6)
    new = store.leases.acquire("session:s", "w2", 600)
    store.leases.acquire("session:t", "w3", 600)
    return queued_together(
        store,
        [
            lambda: store.sessions.append("s", M, user("fresh"), lease=new),
            lambda: store.sessions.append("s", M, user("stale"), lease=old),
            lambda: store.sessions.append("t", M, user("no lease")),
            lambda: store.sessions.append("u", M, user("plain")),
        ],
    )


def check_stale(store: turnkeeper.BaseStore, got: list[Any]) -> None:
    assert [type(g).__name__ for g in got] == ["Entry", "LeaseLostError", "BusyError", "Entry"]
    assert [e.payload["message"]["content"] for e in store.sessions.entries("s")] == ["fresh"]
    assert store.sessions.entries("t") == []
    assert grouped(store, "append") == 4


def test_a_merged_group_fences_each_append(duck_store: turnkeeper.BaseStore, clock: Any) -> None:
    check_stale(duck_store, stale_scenario(duck_store, clock))


def test_a_stale_expected_leaf_in_a_group_is_refused(duck_store: turnkeeper.BaseStore) -> None:
    """Queued together: an append expecting a leaf its session has left, and a
    plain append to another session. The stale one is ``SessionModifiedError``
    (never a second child), the other commits, both ran merged. (The guard
    patched out: mutant ``append-expected-leaf-merged``, ``make mutants``.)"""
    store = duck_store
    for sid in ("s", "t"):
        store.sessions.create(sid)
    a = store.sessions.append("s", M, user("a"))
    b = store.sessions.append("s", M, user("b"), expected_leaf=a.id)
    before = grouped(store, "append")
    stale, plain = queued_together(
        store,
        [
            lambda: store.sessions.append("s", M, user("stale"), expected_leaf=a.id),
            lambda: store.sessions.append("t", M, user("plain")),
        ],
    )
    assert isinstance(stale, errors.SessionModifiedError), stale
    assert (stale.expected_leaf, stale.actual_leaf) == (a.id, b.id)
    assert isinstance(plain, turnkeeper.Entry), plain
    assert grouped(store, "append") == before + 2, "the appends did not run merged"
    assert [e.id for e in store.sessions.entries("s")] == [a.id, b.id]
    assert store.sessions.get("s").leaf_id == b.id


def _patched_heads(monkeypatch: pytest.MonkeyPatch, change: Any) -> None:
    real = appends._heads

    def heads(tx: Any, requests: Any) -> Any:
        return [None if h is None else change(h) for h in real(tx, requests)]

    monkeypatch.setattr(appends, "_heads", heads)


def test_control_a_merge_without_its_fence_is_caught(
    duck_store: turnkeeper.BaseStore, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _patched_heads(monkeypatch, lambda h: (*h[:2], True, *h[3:]))  # every lease passes
    got = stale_scenario(duck_store, clock)
    with pytest.raises(AssertionError):
        check_stale(duck_store, got)


def test_control_a_merge_that_ignores_the_holder_is_caught(
    duck_store: turnkeeper.BaseStore, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _patched_heads(monkeypatch, lambda h: (*h[:4], None, h[5]))  # nobody holds anything
    got = stale_scenario(duck_store, clock)
    with pytest.raises(AssertionError):
        check_stale(duck_store, got)


def append_between_check_and_commit(
    store: turnkeeper.BaseStore,
    monkeypatch: Any,
    hook: Any,
    *,
    merged: bool,
    lease: turnkeeper.Lease | None,
) -> Any:
    """An append to session ``s`` (under ``lease``, or without one) that calls
    ``hook`` right after its lease check, before its commit; what it got.
    Merged: queued into a group with an append to ``t`` (the check is
    ``appends._heads``); else alone (``leases.fence``, ``leases.fenced`` or
    ``leases.fence_or_unheld``)."""
    if merged:
        real = appends._heads

        def heads(tx: Any, requests: Any) -> Any:
            found = real(tx, requests)
            hook()
            return found

        monkeypatch.setattr(appends, "_heads", heads)
        calls = [
            lambda: store.sessions.append("s", M, user("s"), lease=lease),
            lambda: store.sessions.append("t", M, user("x")),
        ]
        return queued_together(store, calls)[0]
    if lease is not None:
        real_fence = leases.fence

        def fence(tx: Any, held: Any) -> None:
            real_fence(tx, held)
            hook()

        monkeypatch.setattr(leases, "fence", fence)
        real_fenced = leases.fenced  # the fence of a read and fence in one statement

        def fenced(tx: Any, held: Any, part: Any) -> Any:
            at = real_fenced(tx, held, part)
            hook()
            return at

        monkeypatch.setattr(leases, "fenced", fenced)
    else:
        real_check = leases.fence_or_unheld

        def check(tx: Any, target: str, held: Any) -> None:
            real_check(tx, target, held)
            if target == "session:s":
                hook()

        monkeypatch.setattr(leases, "fence_or_unheld", check)
    try:
        return store.sessions.append("s", M, user("s"), lease=lease)
    except errors.TurnkeeperError as exc:
        return exc


def renewal_inside_a_lease_less_write(
    store: turnkeeper.BaseStore, clock: Any, monkeypatch: Any, *, merged: bool
) -> tuple[Any, list[Any]]:
    """A lease-less append to a session whose lease has just expired by the
    append's clock, and the holder's renewal, made at an earlier instant (a
    heartbeat: renewals skip the write lock), sent between the append's check
    and its commit. Merged: two appends queued into one group (the check is
    ``appends._heads``); else one append alone (``leases.fence_or_unheld``).
    What the append got, and the renewal's outcome."""
    store.sessions.create("s")
    store.sessions.create("t")
    lease = store.leases.acquire("session:s", "holder", 5)
    clock.advance(5.05)  # the append's now: just past the expiry
    renewal: list[Any] = []

    def renew() -> None:
        try:
            renewal.append(store.leases.renew(lease, 30))
        except errors.TurnkeeperError as exc:
            renewal.append(exc)

    def after_the_check() -> None:
        if renewal or worker.is_alive():
            return
        clock.advance(-0.1)  # the heartbeat's instant, before the expiry
        worker.start()
        worker.join(0.5)  # done at once, unless it must wait for the append's commit
        clock.advance(0.1)

    worker = threading.Thread(target=renew)
    got = append_between_check_and_commit(
        store, monkeypatch, after_the_check, merged=merged, lease=None
    )
    worker.join(30)
    return got, renewal


def no_lease_less_write_beside_a_live_renewal(got: Any, renewal: list[Any]) -> None:
    """Either the renewal won (the append is refused) or the append did (the
    renewal finds the lease expired): never both."""
    assert len(renewal) == 1
    assert not (isinstance(got, turnkeeper.Entry) and isinstance(renewal[0], turnkeeper.Lease)), (
        got,
        renewal,
    )


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "alone"])
def test_a_heartbeat_never_renews_beside_a_lease_less_write(
    duck_store: turnkeeper.BaseStore, clock: Any, monkeypatch: pytest.MonkeyPatch, merged: bool
) -> None:
    """Found by an attack helper: a lease-less append's check could pass on a
    just-expired lease while the holder's heartbeat renewed it before the
    append committed (DuckDB's write-write conflicts are per column, and
    renewals skip the write lock), so the write landed beside a live lease.
    The check now holds the target until its commit; the renewal waits."""
    got, renewal = renewal_inside_a_lease_less_write(duck_store, clock, monkeypatch, merged=merged)
    no_lease_less_write_beside_a_live_renewal(got, renewal)


def test_control_without_holding_the_target_the_heartbeat_slips_in(
    duck_store: turnkeeper.BaseStore, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merged check without the hold: the renewal commits beside it. (Alone,
    DuckDB happens to see a conflict between the check's write and the
    renewal, which retries until the append commits and then finds the lease
    expired; the hold spares those retries and does not rest on that.)"""
    from turnkeeper.storage.duck import db as duck_db

    monkeypatch.setattr(duck_db.Tx, "hold", lambda self, target: None)
    got, renewal = renewal_inside_a_lease_less_write(duck_store, clock, monkeypatch, merged=True)
    with pytest.raises(AssertionError):
        no_lease_less_write_beside_a_live_renewal(got, renewal)


def release_inside_a_fenced_append(
    store: turnkeeper.BaseStore, monkeypatch: Any, *, merged: bool
) -> tuple[Any, int, int]:
    """The holder releases its lease (releases skip the write lock) between a
    fenced append's fence and its commit. Merged: in a group with another
    append (the fence is ``appends._heads``); else alone (``leases.fence``).
    What the append got, the entries the session had when the release
    returned, and the entries it has at the end."""
    store.sessions.create("s")
    store.sessions.create("t")
    lease = store.leases.acquire("session:s", "holder", 600)
    seen: list[int] = []

    def release() -> None:
        assert store.leases.release(lease)
        seen.append(len(store.sessions.entries("s")))

    worker = threading.Thread(target=release)

    def after_the_fence() -> None:
        if not worker.is_alive() and not seen:
            worker.start()
            worker.join(0.5)  # done at once, unless it must wait for the append's commit

    got = append_between_check_and_commit(
        store, monkeypatch, after_the_fence, merged=merged, lease=lease
    )
    worker.join(30)
    return got, seen[0], len(store.sessions.entries("s"))


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "alone"])
def test_a_fenced_append_never_commits_after_its_lease_was_released(
    duck_store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch, merged: bool
) -> None:
    """Found by an attack helper: a merged fenced append committed after the
    holder's release_lease had returned (the merged fence is a read, and
    releases skip the write lock): `turnkeeper audit` then reported entries
    under a released lease. The append now holds its target until it
    commits; the release waits, and sees the entry when it returns."""
    got, at_release, at_end = release_inside_a_fenced_append(duck_store, monkeypatch, merged=merged)
    assert isinstance(got, turnkeeper.Entry)
    assert at_release == at_end == 1


def test_control_a_merged_fence_without_the_hold_lets_the_release_pass(
    duck_store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnkeeper.storage.duck import db as duck_db

    monkeypatch.setattr(duck_db.Tx, "hold", lambda self, target: None)
    got, at_release, at_end = release_inside_a_fenced_append(duck_store, monkeypatch, merged=True)
    assert isinstance(got, turnkeeper.Entry)
    assert (at_release, at_end) == (0, 1)  # the release returned before the append committed


# -- the tool-call pairing rule, in a merged group (issue 17 item 2) -------------------------


def _call(call_id: str) -> dict[str, Any]:
    content = [{"type": "toolCall", "id": call_id, "name": "ls", "arguments": {}}]
    return {"message": {"role": "assistant", "content": content}}


def pairing_scenario(store: turnkeeper.BaseStore, remembered: bool) -> list[Any]:
    """Queued together: a user message to a session whose call c1 has no result
    (refused), a plain one elsewhere, and a second call under the first one's
    session's leaf (refused too). ``remembered``: the store object knows the
    calls open at the heads (else the group reads them back from the leaf)."""
    for sid in ("p", "q", "r"):
        store.sessions.create(sid)
    store.sessions.append("p", M, _call("c1"))
    store.sessions.append("r", M, _call("c2"))
    if not remembered:
        for sid in ("p", "q", "r"):
            store.sessions._openings.put(sid, None)  # type: ignore[attr-defined]
    return queued_together(
        store,
        [
            lambda: store.sessions.append("p", M, user("lapses c1")),
            lambda: store.sessions.append("q", M, user("plain")),
            lambda: store.sessions.append_many("r", [(M, user("a")), (M, user("b"))]),
        ],
    )


@pytest.mark.parametrize("remembered", [True, False], ids=["remembered", "read back"])
def test_a_merged_group_judges_each_append_by_the_pairing_rule(
    duck_store: turnkeeper.BaseStore, remembered: bool
) -> None:
    got = pairing_scenario(duck_store, remembered)
    assert [type(g).__name__ for g in got] == [
        "ToolCallsUnansweredError",
        "Entry",
        "ToolCallsUnansweredError",
    ]
    assert (got[0].session_id, got[0].tool_call_ids) == ("p", ("c1",))
    assert (got[2].session_id, got[2].tool_call_ids) == ("r", ("c2",))
    assert grouped(duck_store, "append") >= 2  # merged, not run alone
    assert [len(duck_store.sessions.entries(s)) for s in ("p", "q", "r")] == [1, 1, 1]


def test_control_a_merge_without_the_pairing_check_is_caught(
    duck_store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(appends, "_judge_round", lambda tx, requests, heads, out: [None] * len(out))
    got = pairing_scenario(duck_store, remembered=True)
    assert [type(g).__name__ for g in got] == ["Entry", "Entry", "list"]
