"""Run the differential outbox machine, and show its fences can fail."""

from __future__ import annotations

import pytest
from conftest import BACKENDS
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from stateful_outbox import on

from turnkeeper.spec import errors
from turnkeeper.storage.ops import delivery, delivery_claims

SEARCH = settings(
    max_examples=2000,
    derandomize=True,
    database=None,
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.generate),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outbox_agrees_with_the_model(backend: str) -> None:
    run_state_machine_as_test(on(backend))


def drop_owner_epoch_check(mp: pytest.MonkeyPatch) -> None:
    """The claim fence without its owner and epoch comparison."""

    def fence(tx, operation_id, owner, epoch):
        op = delivery.load(tx, operation_id)
        if op.status not in ("claimed", "in_progress") or op.lease_expires_at <= tx.now:
            raise errors.DeliveryLeaseLostError(operation_id, owner, epoch)
        return op

    mp.setattr(delivery_claims, "_fence", fence)


def drop_expiry_check(mp: pytest.MonkeyPatch) -> None:
    """The claim fence without its expiry comparison."""

    def fence(tx, operation_id, owner, epoch):
        op = delivery.load(tx, operation_id)
        if op.lease_owner != owner or op.lease_epoch != epoch:
            raise errors.DeliveryLeaseLostError(operation_id, owner, epoch)
        if op.status not in ("claimed", "in_progress"):
            raise errors.DeliveryLeaseLostError(operation_id, owner, epoch)
        return op

    mp.setattr(delivery_claims, "_fence", fence)


KILLS = {
    "delivery-claim-owner-epoch": drop_owner_epoch_check,
    "delivery-claim-expiry": drop_expiry_check,
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fence", sorted(KILLS))
def test_machine_finds_a_counterexample_with_the_fence_patched_out(
    fence: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    KILLS[fence](monkeypatch)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(on(backend), settings=SEARCH)
