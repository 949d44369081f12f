"""Fixed tests for the survivors of the second mutation net in ``storage/``
(``mutation_net/survivors.py`` names each one's mutant): the argument checks
of ``storage/validate.py`` (pure: bad input refused before any I/O, each
refusal naming its field) and what ``storage/ops/leases.py`` decides that the
area's conformance tests left unread. The storage areas run them first."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

import turnkeeper
from turnkeeper.spec import LeasePurpose
from turnkeeper.spec.delivery import DeliveryPlan, DeliveryStep
from turnkeeper.spec.errors import (
    BusyError,
    InvalidInputError,
    LeaseLostError,
    LeasePurposeError,
    RecoveryNotNeededError,
)
from turnkeeper.spec.records import ANY_LEAF, FinalizeRequest, Lease, ThreadRecord
from turnkeeper.storage import validate as v
from turnkeeper.storage.backend import Conflict
from turnkeeper.storage.ops import leases as lease_ops
from turnkeeper.storage.ops.leases import FENCED, digest, fence_holds, fence_values
from turnkeeper.storage.wakeups import Topic

LEASE = Lease("session:s", "w", "tok", 3, "execution", None)  # type: ignore[arg-type]


def refused(call: Any, *args: Any, **kwargs: Any) -> InvalidInputError:
    """The ``InvalidInputError`` ``call(*args, **kwargs)`` raises (nothing else)."""
    with pytest.raises(InvalidInputError) as caught:
        call(*args, **kwargs)
    return caught.value


# -- storage/validate.py: numbers ----------------------------------------------------


def test_check_bool_takes_a_real_bool_only() -> None:
    assert v.check_bool(True, "f") is True
    assert v.check_bool(False, "f") is False
    for bad in ("no", 1, 0, None):
        err = refused(v.check_bool, bad, "f")
        assert err.field == "f" and repr(bad) in err.reason


@pytest.mark.parametrize("good", [1e-6, 1, 2.5, v.MAX_TTL_S])
def test_a_ttl_is_finite_seconds_above_zero_up_to_ten_years(good: float) -> None:
    got = v.check_ttl(good)
    assert got == good and type(got) is float


@pytest.mark.parametrize(
    "bad",
    [0, 0.0, -1, -1e-9, math.nan, math.inf, -math.inf, v.MAX_TTL_S * (1 + 1e-12), True, "5", None],
    ids=repr,
)
def test_a_ttl_that_is_no_such_duration_is_refused(bad: object) -> None:
    err = refused(v.check_ttl, bad)
    assert err.field == "ttl_s"
    assert "0 < seconds" in err.reason and "0 <=" not in err.reason


@pytest.mark.parametrize("good", [0, 0.0, 1e-9, 3, v.MAX_TTL_S])
def test_seconds_take_zero_by_default(good: float) -> None:
    assert v.check_seconds(good, "delay_s") == good
    assert type(v.check_seconds(good, "delay_s")) is float


@pytest.mark.parametrize(
    "bad", [-1e-9, -1, math.nan, math.inf, v.MAX_TTL_S + 1, True, False, "0"], ids=repr
)
def test_seconds_out_of_zero_to_ten_years_are_refused(bad: object) -> None:
    err = refused(v.check_seconds, bad, "delay_s")
    assert err.field == "delay_s" and "0 <= seconds" in err.reason


def test_seconds_without_zero_refuse_zero() -> None:
    assert "0 < seconds" in refused(v.check_seconds, 0, "d", allow_zero=False).reason
    assert v.check_seconds(1, "d", allow_zero=False) == 1.0


def test_check_int_takes_an_int_from_its_minimum_to_a_bigints_largest() -> None:
    assert v.check_int(1, "epoch", 1) == 1
    assert v.check_int(v.MAX_INT, "epoch", 1) == v.MAX_INT
    assert v.check_int(0, "seq", 0) == 0
    for bad in (0, v.MAX_INT + 1, True, 1.0, 1.5, "1", None):
        err = refused(v.check_int, bad, "epoch", 1)
        assert err.field == "epoch" and "from 1 to 2**63 - 1" in err.reason


def test_check_limit_takes_an_int_from_one_to_the_largest_page() -> None:
    assert v.check_limit(1) == 1
    assert v.check_limit(v.MAX_LIMIT) == v.MAX_LIMIT
    for bad in (0, -1, v.MAX_LIMIT + 1, True, 1.0, 2.5, "1", None):
        err = refused(v.check_limit, bad)
        assert err.field == "limit" and "1 to 1,000,000" in err.reason


# -- storage/validate.py: leases and targets ------------------------------------------


def test_check_purpose_takes_each_lease_purpose_and_nothing_else() -> None:
    for p in LeasePurpose:
        assert v.check_purpose(p.value) == p.value
        assert v.check_purpose(p) == p.value
    for bad in ("", "Execution", "nope", 5, None):
        err = refused(v.check_purpose, bad)
        assert err.field == "purpose" and "execution" in err.reason


def test_a_session_target_names_a_session_id() -> None:
    assert v.check_target("session:s") == "session:s"
    assert v.check_target("job:x") == "job:x"
    for bad in ("session:", "session: "):
        err = refused(v.check_target, bad)
        assert err.field == "target (its session id)"
    assert refused(v.check_target, "session:", "lease.target").field == (
        "lease.target (its session id)"
    )


def test_check_lease_checks_every_identifying_field() -> None:
    assert v.check_lease(LEASE) is LEASE
    assert refused(v.check_lease, ("session:s", "w")).field == "lease"
    cases = {
        "lease.target": Lease("", "w", "tok", 3, "execution", None),  # type: ignore[arg-type]
        "lease.owner": Lease("t", "", "tok", 3, "execution", None),  # type: ignore[arg-type]
        "lease.token": Lease("t", "w", "", 3, "execution", None),  # type: ignore[arg-type]
        "lease.epoch": Lease("t", "w", "tok", 0, "execution", None),  # type: ignore[arg-type]
    }
    for field, lease in cases.items():
        assert refused(v.check_lease, lease).field == field
    assert refused(v.check_lease, cases["lease.token"], "held").field == "held.token"


def test_check_list_takes_a_list_or_tuple_never_text_or_a_mapping() -> None:
    assert v.check_list([1], "f", "x") == [1]
    assert v.check_list((1,), "f", "x") == (1,)
    for bad in ("ab", b"ab", {"a": 1}, None, 3):
        err = refused(v.check_list, bad, "f", "things")
        assert err.field == "f" and err.reason == "expected a list of things"


def test_session_leases_are_keyed_by_target_a_later_one_winning() -> None:
    a = Lease("session:a", "w", "t1", 1, "execution", None)  # type: ignore[arg-type]
    a2 = Lease("session:a", "w", "t2", 2, "execution", None)  # type: ignore[arg-type]
    b = Lease("session:b", "w", "t3", 1, "execution", None)  # type: ignore[arg-type]
    assert v.check_session_leases([a, b, a2]) == {"session:a": a2, "session:b": b}
    assert v.check_session_leases(()) == {}
    other = Lease("job:x", "w", "t", 1, "execution", None)  # type: ignore[arg-type]
    err = refused(v.check_session_leases, [a, other])
    assert err.field == "leases[1]" and "job:x" in err.reason
    assert refused(v.check_session_leases, [a, "x"]).field == "leases[1]"
    assert refused(v.check_session_leases, a).field == "leases"


def test_a_session_lease_is_on_that_session_or_none() -> None:
    assert v.check_session_lease("s", None) is None
    assert v.check_session_lease("s", LEASE) is LEASE
    err = refused(v.check_session_lease, "other", LEASE)
    assert err.field == "lease" and "session:other" in err.reason
    assert refused(v.check_session_lease, "s", "session:s").field == "lease"


def test_an_expected_leaf_is_any_none_or_an_entry_id() -> None:
    assert v.check_expected_leaf(ANY_LEAF) is ANY_LEAF
    assert v.check_expected_leaf(None) is None
    assert v.check_expected_leaf("e1") == "e1"
    for bad in ("", 5, " "):
        assert refused(v.check_expected_leaf, bad).field == "expected_leaf"


def test_a_header_is_a_mapping_with_string_keys_or_none() -> None:
    assert v.check_header(None) == {}
    given = {"cwd": "/x", "n": 1}
    got = v.check_header(given)
    assert got == given and got is not given
    assert v.check_header(MappingProxyType({"a": 1})) == {"a": 1}
    for bad in ({1: "x"}, [("a", 1)], "ab"):
        assert refused(v.check_header, bad).field == "header"


# -- storage/validate.py: requests, paths, plans ----------------------------------------


def _request(**changed: Any) -> FinalizeRequest:
    return FinalizeRequest(ThreadRecord("r1", "k"), **changed)


def test_a_finalize_request_has_real_flags_and_a_list_of_well_formed_leases() -> None:
    good = _request(held_leases=[LEASE], archive_old=True)
    assert v.check_request(good) is good
    assert v.check_request(_request()) == _request()
    assert refused(v.check_request, ThreadRecord("r1", "k")).field == "request"
    for flag in ("archive_old", "rebind_active", "require_key_absent"):
        assert refused(v.check_request, _request(**{flag: "yes"})).field == flag
    for held in ("ab", LEASE, 5):
        assert refused(v.check_request, _request(held_leases=held)).field == "held_leases"
    bad = Lease("t", "w", "tok", 0, "execution", None)  # type: ignore[arg-type]
    err = refused(v.check_request, _request(held_leases=[LEASE, bad]))
    assert err.field == "held_leases[1].epoch"


class _BytesPath:
    def __fspath__(self) -> bytes:
        return b"/tmp/x"


def test_a_path_is_text_without_nul() -> None:
    assert v.check_path(":memory:") == ":memory:"
    assert v.check_path(Path("/tmp/a.duckdb")) == os.fspath(Path("/tmp/a.duckdb"))
    assert refused(v.check_path, 5).reason == "expected a path, got int"
    assert refused(v.check_path, _BytesPath()).reason == "expected a text path"
    assert refused(v.check_path, "").field == "path"
    assert refused(v.check_path, "a\x00b").reason == "must not contain NUL"


def _plan(*steps: DeliveryStep, **changed: Any) -> DeliveryPlan:
    parts: dict[str, Any] = {
        "platform": "slack",
        "target_id": "C1",
        "steps": steps or (DeliveryStep("a", "post"),),
    }
    return DeliveryPlan(**{**parts, **changed})


def test_a_plan_with_well_formed_steps_each_depending_on_an_earlier_one_is_taken() -> None:
    plan = _plan(
        DeliveryStep("a", "post", entry_id="e1"),
        DeliveryStep("b", "react", depends_on="a", artifact_id="x", idempotency_key="i"),
        DeliveryStep("c", "edit", depends_on=None),
    )
    assert v.check_plan(plan) is plan
    assert v.check_plan(_plan(transport_context={"ts": "1"})) == _plan(
        transport_context={"ts": "1"}
    )


@pytest.mark.parametrize(
    ("plan", "field"),
    [
        ("not a plan", "plan"),
        (_plan(platform=""), "plan.platform"),
        (_plan(target_id=""), "plan.target_id"),
        (_plan(reply_message_id=5), "plan.reply_message_id"),
        (_plan(transport_context=[("a", 1)]), "plan.transport_context"),
        (_plan(transport_context={"a": object()}), "plan.transport_context"),
        (_plan(steps="ab"), "plan.steps"),
        (_plan(steps=5), "plan.steps"),
        (_plan(steps=()), "plan.steps"),
        (_plan(steps=[DeliveryStep("a", "post"), "b"]), "plan.steps[1]"),
        (_plan(DeliveryStep("", "post")), "plan.steps[0].key"),
        (_plan(DeliveryStep("a", "")), "plan.steps[0].kind"),
        (_plan(DeliveryStep("a", "post", artifact_id=5)), "plan.steps[0].artifact_id"),  # type: ignore[arg-type]
        (_plan(DeliveryStep("a", "post", idempotency_key=5)), "plan.steps[0].idempotency_key"),  # type: ignore[arg-type]
        (_plan(DeliveryStep("a", "post", payload_digest=5)), "plan.steps[0].payload_digest"),  # type: ignore[arg-type]
        (_plan(DeliveryStep("a", "post", entry_id="")), "plan.steps[0].entry_id"),
        (_plan(DeliveryStep("a", "post"), DeliveryStep("a", "edit")), "plan.steps[1].key"),
        (_plan(DeliveryStep("a", "post", depends_on="a")), "plan.steps[0].depends_on"),
        (
            _plan(DeliveryStep("a", "post", depends_on="b"), DeliveryStep("b", "post")),
            "plan.steps[0].depends_on",
        ),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_a_malformed_plan_is_refused_naming_its_field(plan: Any, field: str) -> None:
    assert refused(v.check_plan, plan).field == field


# -- storage/ops/leases.py: pure parts -----------------------------------------------


def _row(lease: Lease, state: str = "held", **changed: Any) -> tuple[object, ...]:
    values = dict(zip(FENCED, fence_values(lease), strict=True))
    return (*{**values, **changed}.values(), state)


def test_fence_holds_on_the_held_row_of_exactly_this_lease() -> None:
    """``fence_holds`` (DuckDB's merged appends judge the fence with it): true
    for the held row whose every fenced column is the lease's, false when one
    differs, is NULL, or the row is not held."""
    assert fence_values(LEASE) == ["session:s", 3, digest("tok"), "w", "execution"]
    assert fence_holds(_row(LEASE), LEASE) is True
    assert fence_holds(_row(LEASE, "released"), LEASE) is False
    assert fence_holds(_row(LEASE, None), LEASE) is False
    for column in FENCED:
        assert fence_holds(_row(LEASE, **{column: "other"}), LEASE) is False, column
        assert fence_holds(_row(LEASE, **{column: None}), LEASE) is False, column


def test_fence_holds_takes_no_null_as_equal_to_a_null() -> None:
    """SQL's NULL equals nothing, itself included: a lease whose value is None
    never matches a row's NULL."""
    blank = Lease("t", None, "tok", 1, "execution", None)  # type: ignore[arg-type]
    assert fence_holds(_row(blank), blank) is False


# -- storage/ops/leases.py: on a store ----------------------------------------------


def test_a_recovery_lease_on_an_idle_session_names_the_run_it_was_asked_for(store: Any) -> None:
    """``RecoveryNotNeededError.run_id`` is the run the caller named, or empty
    without one (never ``None``)."""
    store.sessions.create("s")
    with pytest.raises(RecoveryNotNeededError) as named:
        store.leases.acquire("session:s", "w", 30, purpose="recovery", run_id="r1")
    assert named.value.run_id == "r1" and "no active run" in named.value.reason
    with pytest.raises(RecoveryNotNeededError) as unnamed:
        store.leases.acquire("session:s", "w", 30, purpose="recovery")
    assert unnamed.value.run_id == ""


def check_fence_many(store: Any, clock: Any) -> None:
    """``fence_many`` (a ledger group's lease fence): per lease, in order, the
    clock reading its fence judged at, or the error :func:`fence` raises for
    it alone: a lease taken over (lost), one relabelled with another purpose,
    one at its expiry instant; the live ones pass."""
    live = store.leases.acquire("a", "w", 60)
    other = store.leases.acquire("b", "w", 60, purpose="execution")
    old = store.leases.acquire("c", "w", 5)
    short = store.leases.acquire("d", "w", 20)
    clock.advance(10)
    store.leases.acquire("c", "x", 60)  # takes over the expired lease of c
    clock.advance(10)  # d at its expiry instant
    relabelled = dataclasses.replace(other, purpose="mutation")
    held = [old, live, relabelled, short, other]
    out = store.db.write("fence_many", lambda tx: lease_ops.fence_many(tx, held))
    assert len(out) == len(held)
    assert isinstance(out[0], LeaseLostError) and out[0].target == "c"
    assert out[1] == clock.now and out[4] == clock.now
    assert isinstance(out[2], LeasePurposeError)
    assert (out[2].held_purpose, out[2].requested_purpose) == ("execution", "mutation")
    assert isinstance(out[3], LeaseLostError) and "expired" in str(out[3])


def test_fence_many_judges_each_lease_as_fence_does_alone(store: Any, clock: Any) -> None:
    check_fence_many(store, clock)


def test_the_fence_many_check_fails_with_every_lease_passed(
    store: Any, clock: Any, monkeypatch: Any
) -> None:
    """Control: ``fence_many`` patched to pass every lease fails the check."""
    monkeypatch.setattr(
        lease_ops, "fence_many", lambda tx, held: [tx.clock_after_locks() for _ in held]
    )
    with pytest.raises(AssertionError):
        check_fence_many(store, clock)


def _is_duckdb(store: Any) -> bool:
    return isinstance(store, turnkeeper.DuckDBStore)


def test_a_lease_less_write_at_the_holders_expiry_instant_goes_through(
    store: Any, clock: Any
) -> None:
    """``fence_or_unheld``: a write without a lease is refused while the held
    lease is live (now < expires_at) and goes through at its expiry instant."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1})
    store.runs.start(run.id)
    holder = store.leases.acquire("session:s", "w", 10, purpose="recovery")
    clock.advance(9.999)
    with pytest.raises(BusyError) as busy:
        store.runs.finish(run.id, "failed")
    assert busy.value.holder == "w"
    clock.advance(0.001)
    assert clock() == holder.expires_at
    assert store.runs.finish(run.id, "failed").status == "failed"


def test_a_release_wakes_orphan_subscribers_only_for_a_session(duck_store: Any) -> None:
    """A released lease wakes ``lease_released`` subscribers; only a session's
    (whose run, if any, lost its owner) wakes ``orphan`` ones too. (DuckDB:
    the wake-up is published in process at commit, so ``wait(0)`` sees it.)"""
    duck_store.sessions.create("s")
    sub = duck_store.subscribe(Topic.LEASE_RELEASED, Topic.ORPHAN)
    assert duck_store.leases.release(duck_store.leases.acquire("job:x", "w", 30))
    assert sub.wait(0) == [Topic.LEASE_RELEASED]
    assert duck_store.leases.release(duck_store.leases.acquire("session:s", "w", 30))
    assert set(sub.wait(0)) == {Topic.LEASE_RELEASED, Topic.ORPHAN}
    assert sub.wait(0) == []


class _Statements:
    """A transaction that records the statements :func:`touch_session` runs."""

    def __init__(self, tx: Any, seen: list[str]) -> None:
        self._tx, self._seen = tx, seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def exec(self, sql: str, params: Any = ()) -> Any:
        self._seen.append(sql)
        return self._tx.exec(sql, params)


def test_a_grant_writes_its_sessions_row_on_a_server_only(store: Any, monkeypatch: Any) -> None:
    """``touch_session``: on PostgreSQL a grant of a ``session:`` target writes
    that session's row (where a lease-less write meets it); never on DuckDB
    (its write lock orders them), never for another target."""
    seen: list[str] = []
    real = lease_ops.touch_session
    monkeypatch.setattr(
        lease_ops, "touch_session", lambda tx, target: real(_Statements(tx, seen), target)
    )
    store.sessions.create("s")
    store.leases.acquire("job:s", "w", 30)
    assert seen == []
    store.leases.acquire("session:s", "w", 30)
    touch = "UPDATE sessions SET updated_at = updated_at WHERE id = ?"
    assert seen == ([] if _is_duckdb(store) else [touch])


def test_a_heartbeat_skips_the_write_lock_and_a_release_or_check_is_one_statement(
    store: Any, monkeypatch: Any
) -> None:
    """How the lease operations ask for their writes (``db.write``): renew,
    release and validate with ``exclusive=False`` (on DuckDB they skip the
    write lock: a heartbeat never waits behind another thread's long write);
    release and a plain validate as one autocommit statement
    (``transaction=False``); acquire and a bound validate in a transaction."""
    asked: list[tuple[str, bool, bool]] = []
    real = store.db.write

    def write(operation: str, body: Any, **kw: Any) -> Any:
        asked.append((operation, kw.get("transaction", True), kw.get("exclusive", True)))
        return real(operation, body, **kw)

    monkeypatch.setattr(store.db, "write", write)
    lease = store.leases.acquire("t", "w", 30)
    store.leases.renew(lease, 30)
    store.leases.validate(lease)
    store.leases.validate(lease, purpose="mutation")
    assert store.leases.release(lease)
    assert asked == [
        ("acquire_lease", True, True),
        ("renew_lease", True, False),
        ("validate_lease", False, False),
        ("validate_lease", True, False),
        ("release_lease", False, False),
    ]


class _RowMoved:
    """A transaction whose compare-and-set statements (``WITH w AS …``) find
    the row moved: none is run, each answers ``answer`` (no row, or another
    epoch's)."""

    def __init__(self, tx: Any, answer: Any) -> None:
        self._tx, self._answer = tx, answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def one(self, sql: str, params: Any = ()) -> Any:
        if sql.startswith("WITH w AS"):
            return self._answer
        return self._tx.one(sql, params)


@pytest.mark.parametrize("answer", [None, (7,)], ids=["no-row", "another-epoch"])
@pytest.mark.parametrize("held", [False, True], ids=["grant", "takeover"])
def test_an_acquire_whose_row_moved_under_it_is_a_conflict(
    store: Any, clock: Any, answer: Any, held: bool
) -> None:
    """``acquire``'s compare-and-set: a write that found no row, or one of
    another epoch, is a ``Conflict`` (the transaction runs again), never a
    lease."""
    if held:
        store.leases.acquire("t", "a", 1)
        clock.advance(2)

    def body(tx: Any) -> None:
        with pytest.raises(Conflict, match="moved during acquire"):
            lease_ops.acquire(_RowMoved(tx, answer), b"k", "t", "w", 30.0, "mutation")

    store.db.write("moved", body)


def test_a_busy_acquire_says_whose_lease_it_met(store: Any, clock: Any) -> None:
    """An acquire refused while the lease is live: another owner's lease is
    ``BusyError`` naming that owner under any purpose asked; the caller's own
    owner name taken through another store object is ``BusyError`` saying so
    (under another purpose, as for its own store object, ``LeasePurposeError``)."""
    store.leases.acquire("t", "a", 60, purpose="execution")
    for purpose in ("execution", "mutation"):
        with pytest.raises(BusyError) as other:
            store.leases.acquire("t", "b", 60, purpose=purpose)
        assert other.value.holder == "a"
        assert "another owner ('a') holds a live lease" in str(other.value)
    again = turnkeeper.open_store(getattr(store.db, "url", store.path), clock=clock)
    try:
        with pytest.raises(BusyError) as same:
            again.leases.acquire("t", "a", 60, purpose="execution")
        assert same.value.holder == "a"
        assert "(this caller's name)" in str(same.value)
        with pytest.raises(LeasePurposeError):
            again.leases.acquire("t", "a", 60, purpose="mutation")
    finally:
        again.close()


class _Holds:
    """A transaction that records the targets held (``Tx.hold``)."""

    def __init__(self, tx: Any, held: list[str]) -> None:
        self._tx, self._held = tx, held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def hold(self, target: str) -> None:
        self._held.append(target)
        self._tx.hold(target)


def test_fence_many_holds_every_target_it_judges(store: Any) -> None:
    """``fence_many`` holds each lease's target (``Tx.hold``) as ``fence`` does
    its one: on DuckDB that keeps a renewal or release from committing between
    the fence and the group's commit (on PostgreSQL the row lock does)."""
    leases = [store.leases.acquire(t, "w", 60) for t in ("a", "b", "c")]
    held: list[str] = []
    store.db.write("fence_many", lambda tx: lease_ops.fence_many(_Holds(tx, held), leases))
    assert held == ["a", "b", "c"]
    alone: list[str] = []
    store.db.write("fence", lambda tx: lease_ops.fence(_Holds(tx, alone), leases[0]))
    assert alone == ["a"]
