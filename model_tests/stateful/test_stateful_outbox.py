"""Run the differential outbox machine, and show its fences can fail: each
kill's stored counterexample is replayed (``by_hand``) on the patched store,
where it fails, and on the real one, where it passes; the search that finds
one from scratch runs on demand (``search``: ``HYPOTHESIS_PROFILE=nightly``)."""

from __future__ import annotations

import pytest
from by_hand import Steps, kill_tests, replay, search_test
from conftest import BACKENDS, STORES, machine_settings, opener
from hypothesis.stateful import run_state_machine_as_test

from turnkeeper.fuzz.outbox import OutboxMachine, machine
from turnkeeper.spec import errors
from turnkeeper.storage.ops import outbox, outbox_plans


def on(backend: str) -> type[OutboxMachine]:
    """The machine on the test store configuration ``backend`` (``conftest.opener``)."""
    return machine(opener(backend))


@pytest.mark.parametrize("backend", STORES)
def test_outbox_agrees_with_the_model(backend: str) -> None:
    run_state_machine_as_test(on(backend), settings=machine_settings(backend))


def drop_owner_epoch_check(mp: pytest.MonkeyPatch) -> None:
    """The claim fence without its owner and epoch comparison."""

    def fence(tx, operation_id, owner, epoch):
        op = outbox_plans.load(tx, operation_id)
        if op.status not in ("claimed", "in_progress") or op.lease_expires_at <= tx.now:
            raise errors.DeliveryLeaseLostError(operation_id, owner, epoch)
        return op

    mp.setattr(outbox, "_fence", fence)


def drop_expiry_check(mp: pytest.MonkeyPatch) -> None:
    """The claim fence without its expiry comparison."""

    def fence(tx, operation_id, owner, epoch):
        op = outbox_plans.load(tx, operation_id)
        if op.lease_owner != owner or op.lease_epoch != epoch:
            raise errors.DeliveryLeaseLostError(operation_id, owner, epoch)
        if op.status not in ("claimed", "in_progress"):
            raise errors.DeliveryLeaseLostError(operation_id, owner, epoch)
        return op

    mp.setattr(outbox, "_fence", fence)


def finish_under_a_claim_taken_over(m: Steps) -> None:
    first = m.claim(key="upload", owner="W1", ttl=1.0)
    m.time_passes(seconds=1.5)
    m.claim(key="upload", owner="W2", ttl=5.0)  # the claim lapsed: W2 takes it over
    m.finish(claim=first, result="delivered")


def progress_under_an_expired_claim(m: Steps) -> None:
    claim = m.claim(key="upload", owner="W1", ttl=1.0)
    m.time_passes(seconds=1.5)
    m.progress(claim=claim)


KILLS = {
    "delivery-claim-owner-epoch": (drop_owner_epoch_check, finish_under_a_claim_taken_over),
    "delivery-claim-expiry": (drop_expiry_check, progress_under_an_expired_claim),
}


(
    test_stored_counterexample_passes_on_the_real_store,
    test_stored_counterexample_fails_with_the_fence_patched_out,
) = kill_tests(KILLS, on)


test_machine_finds_a_counterexample_with_the_fence_patched_out = search_test(
    KILLS, on, examples=2000, backends=STORES
)


def claim_and_deliver_each_ambiguously(m: Steps) -> None:
    """A claim and a delivery each commit while the worker sees a lost
    connection: the claim's retry is refused as busy (the worker reads the
    claim it holds), the delivery's retry under that claim is idempotent, and
    nothing is delivered twice; the dependent step then claims and delivers."""
    upload = m.claim_ambiguously(key="upload", owner="W1", ttl=5.0)
    m.finish_ambiguously(claim=upload, result="delivered")
    send = m.claim_ambiguously(key="send", owner="W2", ttl=1.0)
    m.progress(claim=send)
    m.finish_ambiguously(claim=send, result="delivered")
    m.finish(claim=send, result="delivered")  # a third time: still one delivery


def drop_the_repeated_result_check(mp: pytest.MonkeyPatch) -> None:
    """The result's idempotency: a result already stored under the claim is
    never recognised as this one (its retry is another result)."""
    mp.setattr(outbox, "_same_result", lambda *args: False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ambiguous_outbox_writes_retry_as_the_model_says(backend: str) -> None:
    replay(on(backend), claim_and_deliver_each_ambiguously)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ambiguous_delivery_fails_with_the_repeated_result_check_patched_out(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_the_repeated_result_check(monkeypatch)
    with pytest.raises(AssertionError, match="the retry of a recorded result"):
        replay(on(backend), claim_and_deliver_each_ambiguously)
