"""Run the differential bindings machine (``turnkeeper.fuzz.bindings``: binds, unbinds,
transfers, bound creates, rotations, tool selections and deletes by runtimes
and gateways racing on channels, under live, expired, taken-over, forged and
foreign leases, with ambiguous commits and their retries), and show its
guards can fail: each guard's stored counterexample is replayed (``by_hand``)
on the patched store, where it fails, and on the real one, where it passes;
the search that finds one from scratch runs on demand (``search``).

Every step reads every binding, session and tool selection back, so the
examples are kept few (a loaded 2-core machine runs the ``ci`` profile): at
most :data:`MAX_EXAMPLES` per backend, of at most :data:`STEPS` steps.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from by_hand import Kill, Steps, kill_tests, search_test
from conftest import STORES, engine, machine_settings, opener
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from turnkeeper import Lease
from turnkeeper.fuzz.bindings import TOOLS, BindingsMachine, machine
from turnkeeper.spec import errors
from turnkeeper.storage.ops import bindings, deletes, leases
from turnkeeper.storage.ops.base import Area

MAX_EXAMPLES = 20
STEPS = 20


def make_machine(backend: str) -> type[BindingsMachine]:
    """The machine on the test store configuration ``backend`` (``conftest.opener``)."""
    return machine(opener(backend))


@pytest.mark.parametrize("backend", STORES)
def test_bindings_agree_with_the_model(backend: str) -> None:
    budget = machine_settings(backend, max_examples=MAX_EXAMPLES)
    run_state_machine_as_test(
        make_machine(backend),
        settings=settings(budget, stateful_step_count=min(budget.stateful_step_count, STEPS)),
    )


@pytest.mark.parametrize("backend", STORES)
def test_the_second_gateway_writes_through_a_store_object_of_its_own_on_postgres(
    backend: str,
) -> None:
    """On PostgreSQL G2's store object is the opener's peer (its own
    connections and caches, as another process's); on DuckDB, one store per
    file, it is the machine's own."""
    m = make_machine(backend)()
    try:
        own = m.of["G2"] is not m.store
        assert own == (engine(backend) == "postgres"), (backend, own)
        assert m.of["G2"] is (m.other or m.store)
    finally:
        m.teardown()


# -- the guards, patched out (test-only) ----------------------------------------------


def _fence_without(mp: pytest.MonkeyPatch, *dropped: str) -> None:
    """Every lease fence (``leases.fence_condition`` and its values) compares
    the lease's columns but ``dropped``."""
    shipped, real = leases.FENCED, leases.fence_values
    kept = tuple(c for c in shipped if c not in dropped)

    def values(lease: Lease) -> list[object]:
        return [v for c, v in zip(shipped, real(lease), strict=True) if c in kept]

    mp.setattr(leases, "FENCED", kept)
    mp.setattr(leases, "fence_values", values)


def drop_the_token_check(mp: pytest.MonkeyPatch) -> None:
    """The fence without its token comparison."""
    _fence_without(mp, "token_digest")


def drop_the_identity_check(mp: pytest.MonkeyPatch) -> None:
    """The fence without its epoch, token and owner comparisons (the target's
    lease row is found by its target and purpose alone)."""
    _fence_without(mp, "epoch", "token_digest", "owner")


def drop_the_purpose_check(mp: pytest.MonkeyPatch) -> None:
    """The fence without its purpose comparison."""
    _fence_without(mp, "purpose")


def drop_the_expiry_check(mp: pytest.MonkeyPatch) -> None:
    """The fence without its expiry comparison (judged at a clock reading, as shipped)."""

    def unexpired(tx: Any, target: str, expires_at: datetime, server_now: Any = None) -> datetime:
        now: datetime = tx.clock_after_locks(server_now)
        return now

    mp.setattr(leases, "unexpired", unexpired)


def drop_the_unheld_check(mp: pytest.MonkeyPatch) -> None:
    """A write without a lease goes ahead while another holds the session."""
    real = leases.fence_or_unheld

    def fence_or_unheld(tx: Any, target: str, lease: Lease | None) -> None:
        if lease is not None:
            real(tx, target, lease)

    mp.setattr(leases, "fence_or_unheld", fence_or_unheld)  # the module bindings calls


def drop_the_lease_target_check(mp: pytest.MonkeyPatch) -> None:
    """A binding write takes a lease of any session (the fence then checks that one)."""
    mp.setattr(bindings, "check_session_lease", lambda session_id, lease: lease)


def drop_the_session_check(mp: pytest.MonkeyPatch) -> None:
    """A binding write to a session that does not exist (never, or no longer) goes ahead."""

    def binding_of(tx: Any, session_id: str) -> Any:
        if tx.one("SELECT 1 FROM sessions WHERE id = ?", [session_id]) is None:
            return None
        return real(tx, session_id)

    real = bindings.binding_of
    mp.setattr(bindings, "binding_of", binding_of)


def drop_the_channel_check(mp: pytest.MonkeyPatch) -> None:
    """``bind`` and ``create_bound`` read every channel as free (lookups still
    read it; the channel's key still refuses a second session: a conflict no
    rule expects)."""
    real_bound_to = bindings.bound_to

    def blind(name: str) -> None:
        real = getattr(bindings, name)

        def call(*args: Any) -> Any:
            bindings.bound_to = lambda tx, channel: None
            try:
                return real(*args)
            finally:
                bindings.bound_to = real_bound_to

        mp.setattr(bindings, name, call)

    blind("bind")
    blind("create_bound")


def drop_the_session_bound_check(mp: pytest.MonkeyPatch) -> None:
    """``bind`` reads a session that exists as local (lookups still read its
    channel; its unique key still refuses a second channel: a conflict no rule
    expects)."""
    real, real_binding_of = bindings.bind, bindings.binding_of

    def local(tx: Any, session_id: str) -> None:
        real_binding_of(tx, session_id)  # a missing session is still refused
        return None

    def bind(*args: Any) -> Any:
        bindings.binding_of = local
        try:
            return real(*args)
        finally:
            bindings.binding_of = real_binding_of

    mp.setattr(bindings, "bind", bind)


def drop_the_same_channel_return(mp: pytest.MonkeyPatch) -> None:
    """``bind`` without its no-op for a session bound to this channel already:
    the repeat is refused as a session bound elsewhere."""
    real = bindings.bind

    def bind(tx: Any, session_id: str, channel: Any, lease: Lease | None) -> Any:
        current = bindings._writable(tx, session_id, lease)
        if current is not None and current == channel:
            raise errors.SessionBoundError(session_id, *current)
        return real(tx, session_id, channel, lease)

    mp.setattr(bindings, "bind", bind)


def drop_the_transfer_compare(mp: pytest.MonkeyPatch) -> None:
    """``transfer`` moves the channel from wherever it is bound, not only from
    the session the caller names."""
    real = bindings.transfer

    def transfer(tx: Any, channel: Any, from_id: str, to_id: str, held: Any) -> Any:
        bound = bindings.bound_to(tx, channel)
        return real(tx, channel, from_id if bound is None else bound, to_id, held)

    mp.setattr(bindings, "transfer", transfer)


def drop_the_transfer_done_return(mp: pytest.MonkeyPatch) -> None:
    """``transfer`` without its no-op for a channel at its destination already
    (a retry after a lost reply): the retry is refused as a stale move."""
    real = bindings.transfer

    def transfer(tx: Any, channel: Any, from_id: str, to_id: str, held: Any) -> Any:
        for sid in sorted({from_id, to_id}):
            bindings._writable(tx, sid, held.get(f"session:{sid}"))
        bound = bindings.bound_to(tx, channel)
        if bound == to_id and from_id != to_id:
            raise errors.BindingNotFoundError(*channel, from_id, bound)
        return real(tx, channel, from_id, to_id, held)

    mp.setattr(bindings, "transfer", transfer)


def drop_the_rotate_compare(mp: pytest.MonkeyPatch) -> None:
    """``rotate`` replaces the channel's session wherever it is bound, not only
    the session the caller names."""
    real = bindings.rotate

    def rotate(tx: Any, channel: Any, old_id: str, *args: Any) -> Any:
        bound = bindings.bound_to(tx, channel)
        return real(tx, channel, old_id if bound is None else bound, *args)

    mp.setattr(bindings, "rotate", rotate)


def drop_the_row_copy(mp: pytest.MonkeyPatch) -> None:
    """The session row no longer repeats its binding."""
    mp.setattr(bindings, "_mirror", lambda tx, session_id, channel: None)


def keep_the_binding_of_a_deleted_session(mp: pytest.MonkeyPatch) -> None:
    """A delete leaves the session's binding row (its channel stays taken)."""
    kept = tuple(r for r in deletes.REMOVED if r[0] != "channel_bindings")
    mp.setattr(deletes, "REMOVED", kept)


def drop_the_fence_record(mp: pytest.MonkeyPatch) -> None:
    """A write refused under a lost lease is no longer recorded."""
    mp.setattr(Area, "_record_fenced", lambda self, lease, operation: None)


def drop_the_transfer_fence_record(mp: pytest.MonkeyPatch) -> None:
    """A transfer refused under a lost lease is no longer recorded."""
    mp.setattr(bindings, "record_fenced", lambda tx, lease, operation: None)


# -- the stored counterexamples (each a short replayable script) ---------------------

C1 = ("chat", "c1")
C2 = ("chat", "c2")
M1 = ("mail", "c1")
SOME_TOOLS = TOOLS[1]


def bind_under_a_forged_token(m: Steps) -> None:
    lease = m.acquire(owner="R1", session="s1", ttl=3.0, purpose="execution")
    forged = m.forge(lease=lease, how="token")
    m.bind(session="s1", channel=C1, lease=forged, lost_reply=False)


def unbind_after_a_takeover(m: Steps) -> None:
    old = m.acquire(owner="R1", session="s1", ttl=1.0, purpose="execution")
    m.bind(session="s1", channel=C1, lease=old, lost_reply=False)
    m.advance(seconds=2.5)
    m.acquire(owner="R2", session="s1", ttl=3.0, purpose="execution")
    m.unbind(session="s1", lease=old, lost_reply=False)


def set_tools_under_a_relabelled_lease(m: Steps) -> None:
    lease = m.acquire(owner="R1", session="s2", ttl=3.0, purpose="execution")
    relabelled = m.forge(lease=lease, how="purpose")
    m.set_tools(session="s2", tools=SOME_TOOLS, lease=relabelled, lost_reply=False)


def bind_at_the_expiry_instant(m: Steps) -> None:
    lease = m.acquire(owner="R1", session="s1", ttl=1.0, purpose="mutation")
    m.advance(seconds=1.0)  # now == expires_at: the lease is gone
    m.bind(session="s1", channel=C1, lease=lease, lost_reply=False)


def transfer_under_an_expired_lease(m: Steps) -> None:
    m.bind(session="s1", channel=C1, lease=None, lost_reply=False)
    lease = m.acquire(owner="R1", session="s2", ttl=1.0, purpose="execution")
    m.advance(seconds=2.5)
    m.transfer(
        channel=C1, from_id="s1", to_id="s2", leases=[lease], current=False, lost_reply=False
    )


def bind_while_another_holds_the_session(m: Steps) -> None:
    m.acquire(owner="R1", session="s1", ttl=3.0, purpose="execution")
    m.bind(session="s1", channel=C1, lease=None, lost_reply=False)


def bind_with_another_session_s_lease(m: Steps) -> None:
    lease = m.acquire(owner="R1", session="s2", ttl=3.0, purpose="execution")
    m.write_with_a_foreign_lease(session="s1", lease=lease, operation="bind")


def bind_a_missing_and_a_deleted_session(m: Steps) -> None:
    m.bind(session="ghost", channel=C1, lease=None, lost_reply=False)
    m.delete(session="s2", lease=None, lost_reply=False)
    m.bind(session="s2", channel=C2, lease=None, lost_reply=False)


def bind_a_taken_channel(m: Steps) -> None:
    m.bind(session="s1", channel=C1, lease=None, lost_reply=False)
    m.bind(session="s2", channel=C1, lease=None, lost_reply=False)


def gateways_race_to_bind_a_free_channel(m: Steps) -> None:
    m.look(gateway="G1", channel=C2)
    m.look(gateway="G2", channel=C2)
    m.route(gateway="G2", channel=C2, session="s1", lease=None, lost_reply=False)
    m.route(gateway="G1", channel=C2, session="s2", lease=None, lost_reply=False)


def create_bound_on_a_taken_channel(m: Steps) -> None:
    m.bind(session="s1", channel=M1, lease=None, lost_reply=False)
    m.create_bound(channel=M1, which="new", free=False, lost_reply=False)


def bind_a_bound_session_elsewhere(m: Steps) -> None:
    m.bind(session="s1", channel=C1, lease=None, lost_reply=False)
    m.bind(session="s1", channel=M1, lease=None, lost_reply=False)  # the same id, another type


def retry_a_bind_after_a_lost_reply(m: Steps) -> None:
    m.bind(session="s3", channel=C2, lease=None, lost_reply=True)


def gateways_race_to_move_a_channel(m: Steps) -> None:
    m.bind(session="s1", channel=C1, lease=None, lost_reply=False)
    m.look(gateway="G1", channel=C1)
    m.look(gateway="G2", channel=C1)
    m.route(gateway="G2", channel=C1, session="s2", lease=None, lost_reply=False)
    m.route(gateway="G1", channel=C1, session="s3", lease=None, lost_reply=False)  # stale view


def retry_a_transfer_after_a_lost_reply(m: Steps) -> None:
    lease = m.acquire(owner="R2", session="s2", ttl=3.0, purpose="execution")
    m.bind(session="s1", channel=C1, lease=None, lost_reply=False)
    m.transfer(channel=C1, from_id="s1", to_id="s2", leases=[lease], current=False, lost_reply=True)


def rotate_a_session_the_channel_left(m: Steps) -> None:
    m.bind(session="s1", channel=C1, lease=None, lost_reply=False)
    m.rotate(channel=C1, old="s2", which="new", lease=None, current=False, lost_reply=False)


def bind_and_read_the_session_row(m: Steps) -> None:
    m.bind(session="s2", channel=M1, lease=None, lost_reply=False)


def delete_a_bound_session(m: Steps) -> None:
    m.bind(session="s1", channel=C1, lease=None, lost_reply=False)
    m.delete(session="s1", lease=None, lost_reply=False)
    m.create_bound(channel=C1, which="new", free=False, lost_reply=True)


KILLS: dict[str, Kill] = {
    "binding-lease-token": (drop_the_token_check, bind_under_a_forged_token),
    "binding-lease-takeover": (drop_the_identity_check, unbind_after_a_takeover),
    "binding-lease-purpose": (drop_the_purpose_check, set_tools_under_a_relabelled_lease),
    "binding-lease-expiry-boundary": (drop_the_expiry_check, bind_at_the_expiry_instant),
    "binding-lease-expiry-transfer": (drop_the_expiry_check, transfer_under_an_expired_lease),
    "binding-unheld": (drop_the_unheld_check, bind_while_another_holds_the_session),
    "binding-lease-target": (drop_the_lease_target_check, bind_with_another_session_s_lease),
    "binding-session-exists": (drop_the_session_check, bind_a_missing_and_a_deleted_session),
    "binding-channel-taken": (drop_the_channel_check, bind_a_taken_channel),
    "binding-channel-taken-race": (drop_the_channel_check, gateways_race_to_bind_a_free_channel),
    "binding-channel-taken-create": (drop_the_channel_check, create_bound_on_a_taken_channel),
    "binding-session-bound": (drop_the_session_bound_check, bind_a_bound_session_elsewhere),
    "binding-repeat-is-a-no-op": (drop_the_same_channel_return, retry_a_bind_after_a_lost_reply),
    "binding-transfer-compare": (drop_the_transfer_compare, gateways_race_to_move_a_channel),
    "binding-transfer-retry": (drop_the_transfer_done_return, retry_a_transfer_after_a_lost_reply),
    "binding-rotate-compare": (drop_the_rotate_compare, rotate_a_session_the_channel_left),
    "binding-session-row-copy": (drop_the_row_copy, bind_and_read_the_session_row),
    "binding-deleted-with-session": (keep_the_binding_of_a_deleted_session, delete_a_bound_session),
    "binding-fence-recorded": (drop_the_fence_record, bind_at_the_expiry_instant),
    "binding-transfer-fence-recorded": (
        drop_the_transfer_fence_record,
        transfer_under_an_expired_lease,
    ),
}


(
    test_stored_counterexample_passes_on_the_real_store,
    test_stored_counterexample_fails_with_the_guard_patched_out,
) = kill_tests(KILLS, make_machine)


test_machine_finds_a_counterexample_with_the_guard_patched_out = search_test(
    KILLS, make_machine, examples=2000, backends=STORES
)
