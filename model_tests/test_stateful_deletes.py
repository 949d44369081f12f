"""Run the differential deletes machine (deletes and retention interleaved with
every other writer, response archives included), and show its guards can fail: each kill's stored
counterexample is replayed (``by_hand``) on the patched store, where it
fails, and on the real one, where it passes.

The machine checks the audit after every step, so its examples are kept few
(a loaded 2-core machine runs the ``ci`` profile): at most
:data:`MAX_EXAMPLES` per backend, however many the profile allows.
"""

from __future__ import annotations

import types

import pytest
from by_hand import Steps, kill_tests
from conftest import STORES, machine_settings
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from stateful_deletes import on

from turnkeeper.storage.ops import deletes

MAX_EXAMPLES = 15
STEPS = 20


@pytest.mark.parametrize("backend", STORES)
def test_deletes_and_retention_agree_with_the_model(backend: str) -> None:
    budget = machine_settings(backend, max_examples=MAX_EXAMPLES)
    run_state_machine_as_test(
        on(backend),
        settings=settings(budget, stateful_step_count=min(budget.stateful_step_count, STEPS)),
    )


def drop_the_session_lease_guard(mp: pytest.MonkeyPatch) -> None:
    """Deletes (and retention's) check of the session's lease, and only theirs."""
    unguarded = types.SimpleNamespace(
        fence_or_unheld=lambda tx, target, lease: None, fence=deletes.leases.fence
    )
    mp.setattr(deletes, "leases", unguarded)


def drop_the_active_run_guard(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(deletes, "NON_TERMINAL", ("none", "none", "none"))


def delete_a_held_session(m: Steps) -> None:
    m.acquire(owner="W1", session="s1", ttl=3.0)
    m.append(session="s1", lease=None)
    m.delete(session="s1", lease=None)


def retain_past_a_held_session(m: Steps) -> None:
    m.acquire(owner="W1", session="s2", ttl=3.0)
    m.retain(keep_last=0)


def delete_a_session_mid_run(m: Steps) -> None:
    m.admit(session="s3", lease=None)
    m.delete(session="s3", lease=None)


KILLS = {
    "delete-lease-guard": (drop_the_session_lease_guard, delete_a_held_session),
    "retention-lease-guard": (drop_the_session_lease_guard, retain_past_a_held_session),
    "delete-active-guard": (drop_the_active_run_guard, delete_a_session_mid_run),
}


(
    test_stored_counterexample_passes_on_the_real_store,
    test_stored_counterexample_fails_with_the_guard_patched_out,
) = kill_tests(KILLS, on)
