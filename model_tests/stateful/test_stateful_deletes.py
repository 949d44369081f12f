"""Run the differential deletes machine (deletes and retention interleaved with
every other writer, response archives included), and show its guards can fail: each kill's stored
counterexample is replayed (``by_hand``) on the patched store, where it
fails, and on the real one, where it passes.

The machine checks the audit after every step, so its examples are kept few
(a loaded 2-core machine runs the ``ci`` profile): at most
:data:`MAX_EXAMPLES` per backend, however many the profile allows.
"""

from __future__ import annotations

import dataclasses
import types
import uuid

import pytest
from by_hand import Steps, kill_tests, replay
from conftest import BACKENDS, STORES, machine_settings, opener
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from turnkeeper.fuzz.deletes import DeletesMachine, machine
from turnkeeper.storage.ops import deletes, forks

MAX_EXAMPLES = 15
STEPS = 20


def make_machine(backend: str) -> type[DeletesMachine]:
    """The machine on the test store configuration ``backend`` (``conftest.opener``)."""
    return machine(opener(backend))


@pytest.mark.parametrize("backend", STORES)
def test_deletes_and_retention_agree_with_the_model(backend: str) -> None:
    budget = machine_settings(backend, max_examples=MAX_EXAMPLES)
    run_state_machine_as_test(
        make_machine(backend),
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
) = kill_tests(KILLS, make_machine)


def fork_and_delete_each_ambiguously(m: Steps) -> None:
    """A fork and deletes each commit while the caller sees a lost
    connection: the fork's retry under its request id returns the same fork
    (one new session), a delete's retry is refused as a missing session with
    the first delete's row readable, under the session's lease or none."""
    m.fork_ambiguously(session="s1")
    m.delete_ambiguously(session="s1", lease=None)
    lease = m.acquire(owner="W1", session="s2", ttl=3.0)
    m.delete_ambiguously(session="s2", lease=lease)
    m.fork_ambiguously(session="s3")


def drop_the_fork_dedupe(mp: pytest.MonkeyPatch) -> None:
    """The fork's idempotency: its request id is never found (each call's
    digest is new), so a retry forks again."""
    real = forks.fork

    def fork(tx, req, new_id):
        return real(tx, dataclasses.replace(req, digest=uuid.uuid4().hex), new_id)

    mp.setattr(forks, "fork", fork)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ambiguous_forks_and_deletes_retry_as_the_model_says(backend: str) -> None:
    replay(make_machine(backend), fork_and_delete_each_ambiguously)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ambiguous_fork_fails_with_the_fork_dedupe_patched_out(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_the_fork_dedupe(monkeypatch)
    with pytest.raises(AssertionError, match="the retry of a committed fork made another"):
        replay(make_machine(backend), fork_and_delete_each_ambiguously)
