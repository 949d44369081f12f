"""Fixed tests for the second mutation net's survivors in ``storage/ops/outbox.py``
(``mutation_net/survivors.py`` names each mutant a test here kills).

- an operation is due at exactly its next attempt time, by the claim's guard
  as by ``list_due`` (``<=`` narrowed to ``<`` survived);
- a finish retried after an unknown commit result is idempotent only with the
  same provider state (the comparison flipped survived: no test retried a
  finish that carried one);
- on PostgreSQL a claim of an operation another transaction holds is busy at
  once, without waiting for that transaction (the ``SKIP LOCKED`` probe: the net
  runs DuckDB only, where the probe does not exist, so its five mutants
  survived there; these tests kill them on PostgreSQL).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import close_backend, open_backend
from test_delivery import finished, plan
from test_fence_after_lock import Held

import turnkeeper
from turnkeeper import (
    DeliveryOperationBusyError,
    DeliveryOperationNotFoundError,
    InvalidTransitionError,
)
from turnkeeper.fuzz import FakeClock


def _one_operation(store: turnkeeper.BaseStore) -> Any:
    run = finished(store, plan())
    (op,) = store.outbox.get_plan(f"{run.id}:delivery")[1]
    return op


def test_an_operation_is_due_at_exactly_its_next_attempt_time(store, clock):
    """Requeued with a 30 s delay, the operation is not due a millisecond before
    and is due at the instant itself: listed by ``list_due`` and claimed."""
    op = _one_operation(store)
    store.outbox.claim(op.id, "a", 5)
    back = store.outbox.requeue(op.id, "a", 1, delay_s=30)
    clock.advance(29.999)
    with pytest.raises(DeliveryOperationBusyError, match="not due"):
        store.outbox.claim(op.id, "b", 5)
    clock.advance(0.001)
    assert clock() == back.next_attempt_at
    assert [o.id for o in store.outbox.list_due()] == [op.id]
    again = store.outbox.claim(op.id, "b", 5)
    assert (again.status, again.lease_owner, again.lease_epoch) == ("claimed", "b", 2)


def test_a_finish_retried_is_idempotent_only_with_the_same_provider_state(store):
    """A retry after an unknown commit result: the same result, provider state
    included, returns the stored operation and writes nothing; the same claim
    reporting another provider state is another result (refused)."""
    op = _one_operation(store)
    claimed = store.outbox.claim(op.id, "a", 30)
    state = {"phase": "sent", "attempts": [1, 2]}
    done = store.outbox.finish(
        op.id, "a", claimed.lease_epoch, "delivered", provider_message_id="m", provider_state=state
    )
    again = store.outbox.finish(
        op.id,
        "a",
        claimed.lease_epoch,
        "delivered",
        provider_message_id="m",
        provider_state=dict(state),
    )
    assert again == done
    with pytest.raises(InvalidTransitionError, match="already recorded a result"):
        store.outbox.finish(
            op.id, "a", claimed.lease_epoch, "delivered", provider_state={"phase": "other"}
        )
    assert store.outbox.get_operation(op.id) == done


@pytest.fixture
def pg_store(tmp_path: Path, clock: FakeClock) -> Iterator[turnkeeper.BaseStore]:
    """A PostgreSQL store (the backend with the ``SKIP LOCKED`` probe)."""
    s = open_backend("postgres", tmp_path, clock)
    yield s
    close_backend(s)


@pytest.mark.postgres
def test_a_claim_of_an_operation_another_transaction_holds_is_busy_at_once(pg_store):
    """Another worker's transaction holds the operation's row (its claim or
    update in flight): a claim is busy at once, never waiting for it. Should a
    claim wait (the probe left out), the holder lets go after 30 s, the claim
    then succeeds, and the test fails on its outcome, not on a time."""
    op = _one_operation(pg_store)
    held = Held(pg_store, ("delivery_operations", "id", op.id), None)
    answered = threading.Event()

    def let_go_if_waited() -> None:
        if not answered.wait(30):
            held.release()

    backstop = threading.Thread(target=let_go_if_waited)
    backstop.start()
    try:
        with pytest.raises(DeliveryOperationBusyError, match="another worker"):
            pg_store.outbox.claim(op.id, "b", 5)
    finally:
        answered.set()
        backstop.join()
        if held.conn is not None and not held.conn.closed:
            held.release()
    claimed = pg_store.outbox.claim(op.id, "b", 5)  # once the holder let go
    assert (claimed.status, claimed.lease_owner) == ("claimed", "b")


@pytest.mark.postgres
def test_a_claim_of_no_such_operation_is_not_found_on_the_server(pg_store):
    """The probe finds no row for a missing operation: that is not found, not
    busy (the probe's own second read tells the two apart)."""
    _one_operation(pg_store)
    with pytest.raises(DeliveryOperationNotFoundError):
        pg_store.outbox.claim("no-such-run:delivery:send", "b", 5)
