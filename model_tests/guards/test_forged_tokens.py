"""A forged lease token is refused by every fenced write, on both backends.

A forged lease names the right target, owner, epoch and purpose and carries
another token (what a second process under the same owner name, or anyone
who read the lease row, could present). Every write that takes a lease must
refuse it: ``LeaseLostError`` (``leases.release``: ``False``), nothing
written anywhere but the refusal's ``fence_events`` row, the holder's lease
untouched; and the same call with the holder's token is taken, so the
refusal was the token's. :data:`WRITES` names each fenced write of the
store (``storage/ops``: every ``leases.fence`` and ``fence_or_unheld``
caller with a lease, the one-statement append, renew and release); DuckDB's
merged group appends are tested beside them.

The kill tests patch the token comparison out (in the test only) and
assert that each check then fails: ``leases.FENCED`` and
``leases.fence_values`` without the token's digest (the fence's condition,
which every fenced write but a release evaluates), and
``leases._HELD_BY`` without it (what a release compares).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from test_group_commit import grouped, queued_together

import turnkeeper
from turnkeeper import (
    ChannelToolConfig,
    DeliveryPlan,
    DeliveryStep,
    EntryKind,
    LeaseLostError,
    ResponseState,
)
from turnkeeper.spec.errors import LeasePurposeError
from turnkeeper.spec.records import (
    FinalizeRequest,
    ImportBatch,
    ImportEntry,
    NewEntry,
    ThreadRecord,
)
from turnkeeper.storage.ops import leases

M = EntryKind.MESSAGE
USER = {"role": "user", "content": "go"}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}
PLAN = DeliveryPlan("chat", "room-1", (DeliveryStep("send", "message"),), reply_message_id="m-1")
T0 = datetime(2026, 1, 1, tzinfo=UTC)

Call = Callable[[turnkeeper.Lease], Any]
"""The fenced write, made under the lease it is given."""


def user(text: str) -> dict[str, Any]:
    return {"message": {"role": "user", "content": text}}


def session(store: turnkeeper.BaseStore, purpose: str = "execution") -> turnkeeper.Lease:
    """Session ``s`` (one entry in it), held by ``w``."""
    store.sessions.create("s")
    store.sessions.append("s", M, user("root"))
    return store.leases.acquire("session:s", "w", 600, purpose=purpose)


def running(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, turnkeeper.Run]:
    lease = session(store)
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease)
    return lease, store.runs.start(run.id, lease=lease)


def claimed(
    store: turnkeeper.BaseStore, *, side_effecting: bool = False, interrupted: bool = False
) -> turnkeeper.Lease:
    """A tool record ``k`` of turn ``t`` claimed under the lease (then interrupted)."""
    lease = session(store)
    store.tools.claim(
        "k",
        "s",
        local_turn_id="t",
        provider_call_id="c1",
        tool_name="bash",
        side_effecting=side_effecting,
        lease=lease,
    )
    if interrupted:
        store.tools.interrupt("s", lease=lease)
    return lease


def orphan(store: turnkeeper.BaseStore, begun: bool = True) -> tuple[turnkeeper.Lease, str]:
    """A run nobody holds, and a recovery lease on its session (its recovery begun)."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    lease = store.leases.acquire("session:s", "rec", 600, purpose="recovery")
    if begun:
        store.recovery.begin(run.id, lease)
    return lease, run.id


def _append(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    return session(store), lambda lease: store.sessions.append("s", M, user("x"), lease=lease)


def _append_own_id(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    # an id of the caller's: the transaction path on both backends
    return session(store), lambda lease: store.sessions.append(
        "s", M, user("x"), entry_id="mine", lease=lease
    )


def _append_many(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    batch = [(M, user("a")), (M, user("b"))]
    return session(store), lambda lease: store.sessions.append_many("s", batch, lease=lease)


def _append_many_own_ids(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    batch = [NewEntry(M, user("a"), entry_id="a1"), NewEntry(M, user("b"), entry_id="b1")]
    return session(store), lambda lease: store.sessions.append_many("s", batch, lease=lease)


def _set_label(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    root = store.sessions.entries("s")[0].id
    return lease, lambda lease: store.sessions.set_label("s", root, "keep", lease=lease)


def _set_title(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    return session(store), lambda lease: store.sessions.set_title("s", "a title", lease=lease)


def _branch(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    root = store.sessions.entries("s")[0].id
    store.sessions.append("s", M, user("second"), lease=lease)
    return lease, lambda lease: store.sessions.branch("s", root, lease=lease)


def _branch_with_summary(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    root = store.sessions.entries("s")[0].id
    store.sessions.append("s", M, user("second"), lease=lease)
    return lease, lambda lease: store.sessions.branch_with_summary("s", root, "gist", lease=lease)


def _import_batch(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    batch = ImportBatch("s", "/w", T0, {}, [ImportEntry("i1", None, M, T0, user("i"))], "i1")
    return lease, lambda lease: store.sessions.import_batch(batch, lease=lease)


def _save_capabilities(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    caps = turnkeeper.SessionCapabilities("s", mode="act", browser=True)
    return lease, lambda lease: store.capabilities.save(caps, lease=lease)


def _record_capability_event(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    event = turnkeeper.CapabilityEvent("s", "browser", "enabled", id="ev-1")
    return lease, lambda lease: store.capabilities.record_event(event, lease=lease)


def _consume_guidance(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    store.guidance.save(turnkeeper.Guidance("g1", "s", "go"))
    return lease, lambda lease: store.guidance.consume("s", ["g1"], lease=lease)


def _record_resource_event(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    event = turnkeeper.InputResourceEvent("s", "r1", "materialized", id="ev-1")
    return lease, lambda lease: store.resources.record_event(event, lease=lease)


def _open_ledger(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    return lease, lambda lease: store.ledger.open("s", lease)


def _append_ledger(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    """An append by a writer holding ``lease`` (a new writer per call: a refused
    one stays fenced), after the holder's open."""
    lease = session(store)
    seq = store.ledger.open("s", lease).fence_seq
    return lease, lambda lease: turnkeeper.LedgerWriter(store.ledger, "s", lease, seq).append(
        "turn", b"x", "turn-1"
    )


def _gc_ledger(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    """GC of the ledger's blobs by its writer, with an orphan blob (a blob
    written, its pointer never appended) for the holder's pass to delete."""
    from turnkeeper.storage.ops.ledger import blobs

    lease = session(store)
    ledger = store.ledger.with_blobs(offload_threshold=4)
    ledger.open("s", lease)
    blobs.offload(ledger.blobs, "", "s", turnkeeper.LedgerEntry("turn", b"lost body", "t"), 1024)

    def call(lease: turnkeeper.Lease) -> Any:
        try:
            return ledger.gc("s", lease)
        except turnkeeper.GCLeaseNotHeldError as refused:
            assert isinstance(refused.__cause__, LeaseLostError)
            raise refused.__cause__ from None

    return lease, call


def _save_response_run(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    run = turnkeeper.ResponseRun("s", "bg-1", "openai", "responses", "queued")
    return lease, lambda lease: store.archives.save_run(run, lease=lease)


def _save_response_turn(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    turn = turnkeeper.ResponseTurn("s", "t1", "openai", "responses", "m", "replay", "completed")
    return lease, lambda lease: store.archives.save_turn(turn, lease=lease)


def _save_response_item(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    item = turnkeeper.ResponseItem("s", "t1", "message", {"type": "message"})
    return lease, lambda lease: store.archives.save_item(item, lease=lease)


def _delete_session(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    return lease, lambda lease: store.sessions.delete("s", lease=lease)


def _set_metadata(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    store.projects.create("p", project_id="p")
    metadata = turnkeeper.SessionMetadata(project_id="p", pinned=True)
    return lease, lambda lease: store.sessions.set_metadata("s", metadata, lease=lease)


def _retain(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    """Retention under its own lease: a pass that lost it stops (``lease_lost``),
    which the table reads as the refusal it is."""
    store.sessions.create("s")
    store.sessions.append("s", M, user("root"))
    lease = store.leases.acquire("retention:main", "w", 600)

    def call(lease: turnkeeper.Lease) -> Any:
        report = store.sessions.retain(lease, keep_last=0)
        if report.lease_lost:
            raise LeaseLostError(lease.target)
        return report

    return lease, call


def _record_usage(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    return lease, lambda lease: store.usage.record(
        "s", provider="p", model="m", input_tokens=3, lease=lease
    )


def _record_usage_from_provider(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    usage = {"input_tokens": 3, "output_tokens": 4}  # Anthropic's shape
    return lease, lambda lease: store.usage.record_from_provider(
        "s", usage, provider="anthropic", model="m", lease=lease
    )


def _update_run(what: str) -> Callable[[turnkeeper.BaseStore], tuple[turnkeeper.Lease, Call]]:
    def setup(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
        lease, run = running(store)
        update = getattr(store.runs, f"update_{what}")
        value = {"input": 3} if what == "usage" else {"step": 1}
        return lease, lambda lease: update(run.id, value, lease=lease)

    return setup


def _admit_run(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    return lease, lambda lease: store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease)


def _admit_run_with_resources(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    event = turnkeeper.InputResourceEvent("s", "img-1", "prepared", id="ev-1")
    return lease, lambda lease: store.runs.admit(
        "s", {"q": 1}, user_message=USER, lease=lease, resource_events=[event]
    )


def _save_intent(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    return lease, lambda lease: store.runs.save_intent("s", {"q": 1}, lease=lease)


def _admit_saved_intent(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    store.runs.save_intent("s", {"q": 1}, intent_id="i1", lease=lease)
    return lease, lambda lease: store.runs.admit("s", {"q": 1}, intent_id="i1", lease=lease)


def _start_run(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    run = store.runs.admit("s", {"q": 1}, user_message=USER, lease=lease)
    return lease, lambda lease: store.runs.start(run.id, lease=lease)


def _wait_run(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run = running(store)
    return lease, lambda lease: store.runs.wait(run.id, lease=lease)


def _resume_run(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run = running(store)
    store.runs.wait(run.id, lease=lease)
    return lease, lambda lease: store.runs.resume(run.id, lease=lease)


def _finish_run(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run = running(store)
    return lease, lambda lease: store.runs.finish(
        run.id, "succeeded", assistant_message=REPLY, lease=lease
    )


def _finish_run_with_plan(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run = running(store)
    return lease, lambda lease: store.runs.finish(
        run.id, "succeeded", assistant_message=REPLY, lease=lease, delivery_plan=PLAN
    )


def _create_delivery_plan(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run = running(store)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY, lease=lease)
    return lease, lambda lease: store.outbox.create_plan(run.id, PLAN, lease=lease)


def _compare_and_swap_response_state(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    state = ResponseState("s", previous_response_id="resp-1")
    return lease, lambda lease: store.lineage.compare_and_swap(state, 0, lease=lease)


def _claim_tool_execution(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = session(store)
    return lease, lambda lease: store.tools.claim(
        "k", "s", local_turn_id="t", provider_call_id="c1", tool_name="bash",
        side_effecting=False, lease=lease,
    )  # fmt: skip


def _complete_tool_execution(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = claimed(store)
    result = [{"type": "text", "text": "a.txt"}]
    return lease, lambda lease: store.tools.complete("k", result, lease=lease)


def _interrupt_tool_executions(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = claimed(store)
    return lease, lambda lease: store.tools.interrupt("s", lease=lease)


def _reclaim_tool_execution(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = claimed(store, interrupted=True)
    return lease, lambda lease: store.tools.reclaim("k", lease=lease)


def _abandon_interrupted_tool_executions(
    store: turnkeeper.BaseStore,
) -> tuple[turnkeeper.Lease, Call]:
    lease = claimed(store, side_effecting=True, interrupted=True)
    return lease, lambda lease: store.tools.abandon_interrupted("s", "t", lease=lease)


def _annotate_run_error(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run = running(store)
    store.runs.finish(run.id, "interrupted", lease=lease)
    return lease, lambda lease: store.runs.annotate_error(run.id, "the host rebooted", lease=lease)


def _fork_session(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER)
    store.runs.start(run.id)
    store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
    lease = store.leases.acquire("session:s", "w", 600, purpose="fork")
    return lease, lambda lease: store.forks.fork("s", request_id="f1", lease=lease)


def _held(store: turnkeeper.BaseStore, sid: str = "s") -> turnkeeper.Lease:
    store.sessions.create(sid)
    return store.leases.acquire(f"session:{sid}", "w", 600)


def _bind(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = _held(store)
    return lease, lambda lease: store.bindings.bind("s", "slack", "c1", lease=lease)


def _unbind(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    store.sessions.create("s")
    store.bindings.bind("s", "slack", "c1")
    lease = store.leases.acquire("session:s", "w", 600)
    return lease, lambda lease: store.bindings.unbind("s", lease=lease)


def _rotate(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    store.sessions.create("s")
    store.bindings.bind("s", "slack", "c1")
    lease = store.leases.acquire("session:s", "w", 600)
    return lease, lambda lease: store.bindings.rotate(
        "slack", "c1", "s", session_id="s2", lease=lease
    )


def _set_tools(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = _held(store)
    tools = [ChannelToolConfig("bash", True)]
    return lease, lambda lease: store.bindings.set_tools("s", tools, lease=lease)


def _finalize(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease = store.leases.acquire("thread-key:k1", "w", 600)
    record = ThreadRecord("r1", key="k1")
    return lease, lambda lease: store.threads.finalize(FinalizeRequest(record, held_leases=[lease]))


def _validate_lease(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    return session(store), store.leases.validate


def _bind_run(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run_id = orphan(store, begun=False)
    return lease, lambda lease: store.leases.bind_run(lease, run_id)


def _renew_lease(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    return session(store), lambda lease: store.leases.renew(lease, 60)


def _release_lease(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    return session(store), store.leases.release


def _begin_recovery(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run_id = orphan(store, begun=False)
    return lease, lambda lease: store.recovery.begin(run_id, lease)


def _converge_recovery(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run_id = orphan(store)
    return lease, lambda lease: store.recovery.converge(run_id, lease, delivery_plan=PLAN)


def _fail_recovery(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run_id = orphan(store)
    return lease, lambda lease: store.recovery.fail(run_id, lease, "remote down")


def _detach_recovery(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run_id = orphan(store)
    sid = lease.target.removeprefix("session:")
    remote = turnkeeper.ResponseRun(
        sid, "bg", "openai", "responses", "queued", run_id, response_id="r"
    )
    store.archives.save_run(remote, lease=lease)  # the run's remote owner, retained
    return lease, lambda lease: store.recovery.detach(run_id, lease)


def _start_turn(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run = running(store)
    store.runs.end_turn(run.turn_id, "succeeded", lease=lease)
    return lease, lambda lease: store.runs.start_turn(run.id, "turn-2", lease=lease)


def _record_run_event(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run = running(store)
    return lease, lambda lease: store.runs.record_event(
        run.id, "progress", {"step": 1}, lease=lease
    )


def _end_turn(store: turnkeeper.BaseStore) -> tuple[turnkeeper.Lease, Call]:
    lease, run = running(store)
    return lease, lambda lease: store.runs.end_turn(run.turn_id, "succeeded", lease=lease)


Setup = Callable[[turnkeeper.BaseStore], tuple[turnkeeper.Lease, Call]]

WRITES: dict[str, Setup] = {
    "bindings.bind": _bind,
    "bindings.unbind": _unbind,
    "bindings.rotate": _rotate,
    "bindings.set_tools": _set_tools,
    "sessions.append": _append,
    "sessions.append[own id]": _append_own_id,
    "sessions.append_many": _append_many,
    "sessions.append_many[own ids]": _append_many_own_ids,
    "sessions.set_label": _set_label,
    "sessions.set_title": _set_title,
    "sessions.branch": _branch,
    "sessions.branch_with_summary": _branch_with_summary,
    "sessions.import_batch": _import_batch,
    "capabilities.save": _save_capabilities,
    "capabilities.record_event": _record_capability_event,
    "guidance.consume": _consume_guidance,
    "resources.record_event": _record_resource_event,
    "archives.save_run": _save_response_run,
    "ledger.open": _open_ledger,
    "ledger.open[append]": _append_ledger,
    "ledger.gc": _gc_ledger,
    "archives.save_turn": _save_response_turn,
    "archives.save_item": _save_response_item,
    "sessions.delete": _delete_session,
    "sessions.set_metadata": _set_metadata,
    "sessions.retain": _retain,
    "usage.record": _record_usage,
    "usage.record_from_provider": _record_usage_from_provider,
    "runs.update_usage": _update_run("usage"),
    "runs.update_progress": _update_run("progress"),
    "runs.update_error_info": _update_run("error_info"),
    "runs.admit": _admit_run,
    "runs.admit[resources]": _admit_run_with_resources,
    "runs.admit[intent]": _admit_saved_intent,
    "runs.save_intent": _save_intent,
    "runs.start": _start_run,
    "runs.wait": _wait_run,
    "runs.resume": _resume_run,
    "runs.finish": _finish_run,
    "runs.finish[plan]": _finish_run_with_plan,
    "runs.start_turn": _start_turn,
    "runs.end_turn": _end_turn,
    "runs.record_event": _record_run_event,
    "outbox.create_plan": _create_delivery_plan,
    "lineage.compare_and_swap": _compare_and_swap_response_state,
    "tools.claim": _claim_tool_execution,
    "tools.complete": _complete_tool_execution,
    "tools.interrupt": _interrupt_tool_executions,
    "tools.reclaim": _reclaim_tool_execution,
    "tools.abandon_interrupted": _abandon_interrupted_tool_executions,
    "runs.annotate_error": _annotate_run_error,
    "forks.fork": _fork_session,
    "threads.finalize": _finalize,
    "leases.validate": _validate_lease,
    "leases.renew": _renew_lease,
    "leases.bind_run": _bind_run,
    "leases.release": _release_lease,
    "recovery.begin": _begin_recovery,
    "recovery.converge": _converge_recovery,
    "recovery.fail": _fail_recovery,
    "recovery.detach": _detach_recovery,
}
"""Every write that takes a lease, by method (and variant: ``[own id]``, an
id of the caller's, takes the transaction path on both backends where a
plain append takes PostgreSQL's one-statement path), and a setup that makes
the write valid for the holder's lease and returns that lease and the write."""

REFUSED_BY_FALSE = {"leases.release"}
"""Writes that refuse a lease not theirs by returning ``False`` (idempotent)."""

READS = {"leases.validate"}
"""Fenced calls that write nothing on DuckDB (a read of the lease row there)."""

HELD_BY = {"leases.release"}
"""The writes that compare ``leases._HELD_BY`` instead of the fence's condition
(a renewal is fenced: ``leases.renew``)."""


def everything(store: turnkeeper.BaseStore) -> dict[str, list[str]]:
    """Every row of every table (``fence_events`` aside: a refused fenced write
    records one), each table's rows sorted, read in one snapshot."""

    def read(snap: Any) -> dict[str, list[str]]:
        tables = snap.query(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_name <> 'fence_events'"
        ).to_pylist()
        assert len(tables) > 20, tables
        return {
            t["table_name"]: sorted(
                repr(sorted(r.items()))
                for r in snap.query(f"SELECT * FROM {t['table_name']}").to_pylist()
            )
            for t in tables
        }

    return store.snapshot(read)


def fence_events(store: turnkeeper.BaseStore) -> list[tuple[str, str, int, str]]:
    """The ``fence_events`` rows: target, owner, epoch, operation."""
    rows = store.query("SELECT target, owner, epoch, operation FROM fence_events").to_pylist()
    return [(r["target"], r["owner"], r["epoch"], r["operation"]) for r in rows]


def forge(lease: turnkeeper.Lease) -> turnkeeper.Lease:
    """``lease`` with another token: right target, owner, epoch and purpose."""
    forged = dataclasses.replace(lease, token=secrets.token_hex(32))
    assert forged.token != lease.token
    return forged


def check_forged_token_refused(store: turnkeeper.BaseStore, write: str) -> None:
    """The check itself (``AssertionError`` when the forged token is taken)."""
    lease, call = WRITES[write](store)
    before = everything(store)
    fenced = collections.Counter(fence_events(store))
    try:
        got = call(forge(lease))
    except LeaseLostError as lost:
        assert lost.target == lease.target
        recorded = list((collections.Counter(fence_events(store)) - fenced).elements())
        assert [r[:3] for r in recorded] == [(lease.target, lease.owner, lease.epoch)], (
            f"{write}: its refusal recorded {recorded} in fence_events"
        )
    else:
        assert write in REFUSED_BY_FALSE and got is False, f"{write} took a forged token: {got!r}"
    assert everything(store) == before, f"{write} under a forged token wrote"
    store.leases.validate(lease)  # the holder's lease is untouched
    call(lease)  # and the holder's own token is taken: the refusal was the token's
    if write not in READS:
        assert everything(store) != before, f"{write} under the holder's token wrote nothing"


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_forged_token_is_refused_by_every_fenced_write(store, write: str) -> None:
    check_forged_token_refused(store, write)


def test_every_write_that_takes_a_lease_is_in_the_table() -> None:
    """Every public store method that takes a lease (``threads.finalize``: in its
    request's ``held_leases``) has a forged-token case: a new fenced write
    joins the table, or this fails."""
    with turnkeeper.open_store(":memory:") as store:
        areas = {name: type(area) for name, area in vars(store).items() if name != "db"}
    taking = {
        f"{area}.{name}"
        for area, cls in areas.items()
        for name, fn in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and "lease" in inspect.signature(fn).parameters
    }
    assert {name.split("[")[0] for name in WRITES} == (taking - ENCRYPTED_ONLY) | {
        "threads.finalize"
    }
    assert taking >= ENCRYPTED_ONLY


ENCRYPTED_ONLY = {"sessions.rotate_key", "sessions.encrypt", "keys.rotate"}
"""Fenced writes that need a store object with a key provider (the ``store``
fixture's clear configurations have none): their forged-token cases are
``test_key_rotation.py``'s ``test_a_forged_token_is_refused_by_the_key_writes``
(with this module's :func:`forge` and :func:`everything`)."""


def token_blind_fence(mp: pytest.MonkeyPatch) -> None:
    """The fence's condition without the token: ``FENCED`` and ``fence_values``
    with the digest left out (test-only)."""
    columns, values = leases.FENCED, leases.fence_values
    kept = [i for i, c in enumerate(columns) if c != "token_digest"]
    assert len(kept) == len(columns) - 1, columns
    mp.setattr(leases, "FENCED", tuple(columns[i] for i in kept))
    mp.setattr(leases, "fence_values", lambda lease: [values(lease)[i] for i in kept])


def token_blind_held_by(mp: pytest.MonkeyPatch) -> None:
    """Release's condition without the token (its parameter kept
    in place, compared with nothing; test-only)."""
    blind = leases._HELD_BY.replace("token_digest = ?", "CAST(? AS VARCHAR) IS NOT NULL")
    assert blind != leases._HELD_BY
    mp.setattr(leases, "_HELD_BY", blind)


@pytest.mark.parametrize("write", sorted(WRITES))
def test_the_forged_token_check_fails_with_the_token_left_out_of_the_fence(
    store, write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (token_blind_held_by if write in HELD_BY else token_blind_fence)(monkeypatch)
    with pytest.raises(AssertionError, match="took a forged token"):
        check_forged_token_refused(store, write)


# -- the fence's epoch and owner columns (the holder's token kept) --------------------------

RELABELLED = ["sessions.append", "runs.finish", "tools.claim"]
"""Writes a lease relabelled with another epoch or owner is tried on: an append
(the one-statement path on PostgreSQL, a transaction's fence on DuckDB), a run
transition and a tool claim."""


def check_relabelled_refused(store: turnkeeper.BaseStore, write: str, field: str) -> None:
    """A copy of the holder's lease, its token kept, with another ``field``
    (``epoch``: the next one; ``owner``) is refused with nothing written (``AssertionError``
    when it is taken): the fence compares every column of the lease row, not
    only the token's digest."""
    lease, call = WRITES[write](store)
    before = everything(store)
    other = lease.epoch + 1 if field == "epoch" else "mallory"
    try:
        got = call(dataclasses.replace(lease, **{field: other}))
    except LeaseLostError as lost:
        assert lost.target == lease.target
    else:
        raise AssertionError(f"{write} took a lease with {field} {other!r}: {got!r}")
    assert everything(store) == before, f"{write} under a relabelled lease wrote"
    store.leases.validate(lease)  # the holder's lease is untouched


def blind_fence(mp: pytest.MonkeyPatch, column: str) -> None:
    """The fence's condition without ``column`` (``FENCED`` and ``fence_values``
    with it left out; test-only)."""
    columns, values = leases.FENCED, leases.fence_values
    kept = [i for i, c in enumerate(columns) if c != column]
    assert len(kept) == len(columns) - 1, columns
    mp.setattr(leases, "FENCED", tuple(columns[i] for i in kept))
    mp.setattr(leases, "fence_values", lambda lease: [values(lease)[i] for i in kept])


@pytest.mark.parametrize("write", RELABELLED)
def test_a_lease_with_another_epoch_is_refused(store, write: str) -> None:
    check_relabelled_refused(store, write, "epoch")


@pytest.mark.parametrize("write", RELABELLED)
def test_the_other_epoch_check_fails_with_the_epoch_left_out_of_the_fence(
    store, write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    blind_fence(monkeypatch, "epoch")
    with pytest.raises(AssertionError, match="took a lease"):
        check_relabelled_refused(store, write, "epoch")


@pytest.mark.parametrize("write", RELABELLED)
def test_a_lease_with_another_owner_is_refused(store, write: str) -> None:
    check_relabelled_refused(store, write, "owner")


@pytest.mark.parametrize("write", RELABELLED)
def test_the_other_owner_check_fails_with_the_owner_left_out_of_the_fence(
    store, write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    blind_fence(monkeypatch, "owner")
    with pytest.raises(AssertionError, match="took a lease"):
        check_relabelled_refused(store, write, "owner")


# -- DuckDB's merged appends (a group commit's one read of the fence) ---------------------


def merged(store: turnkeeper.BaseStore, lease: turnkeeper.Lease, many: bool) -> list[Any]:
    """An append under ``lease`` to ``s`` queued in one group with a plain append
    to ``t``; what each got. Both ran merged (the group's statistics say so)."""
    operation = "append_many" if many else "append"
    before = grouped(store, operation)

    def leased() -> Any:
        if many:
            return store.sessions.append_many("s", [(M, user("a")), (M, user("b"))], lease=lease)
        return store.sessions.append("s", M, user("a"), lease=lease)

    def other() -> Any:
        if many:
            return store.sessions.append_many("t", [(M, user("c")), (M, user("d"))])
        return store.sessions.append("t", M, user("c"))

    got = queued_together(store, [leased, other])
    assert grouped(store, operation) == before + 2, "the appends did not run merged"
    return got


def check_merged_forged_token_refused(store: turnkeeper.BaseStore, many: bool) -> None:
    lease = session(store)
    store.sessions.create("t")
    before = [len(store.sessions.entries(sid)) for sid in ("s", "t")]
    refused, beside = merged(store, forge(lease), many)
    assert isinstance(refused, LeaseLostError), f"a merged append took a forged token: {refused!r}"
    assert not isinstance(beside, BaseException), beside  # its group committed
    assert len(store.sessions.entries("s")) == before[0]
    store.leases.validate(lease)
    taken, _ = merged(store, lease, many)
    assert not isinstance(taken, BaseException), taken
    assert len(store.sessions.entries("s")) == before[0] + (2 if many else 1)


@pytest.mark.parametrize("many", [False, True], ids=["append", "append_many"])
def test_a_forged_token_is_refused_by_a_merged_append(duck_store, many: bool) -> None:
    check_merged_forged_token_refused(duck_store, many)


@pytest.mark.parametrize("many", [False, True], ids=["append", "append_many"])
def test_the_merged_forged_token_check_fails_with_the_token_left_out_of_the_fence(
    duck_store, many: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_blind_fence(monkeypatch)
    with pytest.raises(AssertionError, match="took a forged token"):
        check_merged_forged_token_refused(duck_store, many)


# -- a lease relabelled with another purpose (attack helper) --------------------------


def relabelled(store: turnkeeper.BaseStore, write: str) -> Any:
    """An execution lease relabelled in memory as the purpose ``write`` needs
    (recovery, fork), and the call: the purpose is the row's, not the object's."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", 60, purpose="execution")
    user = {"role": "user", "content": "go"}
    run = store.runs.admit("s", {"q": 1}, user_message=user, lease=lease, start=True)
    if write == "fork_session":
        store.runs.finish(run.id, "succeeded", lease=lease)
        lease = dataclasses.replace(lease, purpose="fork")
        return lambda: store.forks.fork("s", request_id="r1", lease=lease)
    lease = dataclasses.replace(lease, purpose="recovery")
    if write == "begin_recovery":
        return lambda: store.recovery.begin(run.id, lease)
    return lambda: store.recovery.converge(run.id, lease, error="gone")


@pytest.mark.parametrize("write", ["begin_recovery", "converge_recovery", "fork_session"])
def test_a_lease_relabelled_with_another_purpose_is_refused(store, write: str) -> None:
    call = relabelled(store, write)
    before = everything(store)
    with pytest.raises(LeasePurposeError) as refused:
        call()
    assert (refused.value.held_purpose, refused.value.requested_purpose) == (
        "execution",
        "fork" if write == "fork_session" else "recovery",
    )
    assert everything(store) == before


def test_the_relabel_check_fails_with_the_purpose_left_out_of_the_fence(
    store, monkeypatch: pytest.MonkeyPatch
) -> None:
    columns, values = leases.FENCED, leases.fence_values
    kept = [i for i, c in enumerate(columns) if c != "purpose"]
    monkeypatch.setattr(leases, "FENCED", tuple(columns[i] for i in kept))
    monkeypatch.setattr(leases, "fence_values", lambda lease: [values(lease)[i] for i in kept])
    call = relabelled(store, "begin_recovery")
    assert call().state == "recovering"  # the execution lease recovered its own run
