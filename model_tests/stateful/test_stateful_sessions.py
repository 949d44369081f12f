"""Run the differential sessions machine (writers racing on the leaf, batches,
branches, compactions, titles, turns, forks, ambiguous commits and their
retries), and show its guards can fail: each guard's stored counterexample is
replayed (``by_hand``) on the patched store, where it fails, and on the real
one, where it passes.

Every step compares every session's entries and replay with the model, so
the examples are kept few (a loaded 2-core machine runs the ``ci`` profile):
at most :data:`MAX_EXAMPLES` per backend, of at most :data:`STEPS` steps.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from by_hand import Steps, kill_tests
from conftest import STORES, machine_settings, opener
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from turnkeeper import ANY_LEAF
from turnkeeper.fuzz.sessions import SessionsMachine, machine
from turnkeeper.storage.ops import appends, forks, session_rows

MAX_EXAMPLES = 15
STEPS = 20


def make_machine(backend: str) -> type[SessionsMachine]:
    """The machine on the test store configuration ``backend`` (``conftest.opener``)."""
    return machine(opener(backend))


@pytest.mark.parametrize("backend", STORES)
def test_sessions_and_forks_agree_with_the_model(backend: str) -> None:
    budget = machine_settings(backend, max_examples=MAX_EXAMPLES)
    run_state_machine_as_test(
        make_machine(backend),
        settings=settings(budget, stateful_step_count=min(budget.stateful_step_count, STEPS)),
    )


# -- the guards, patched out (test-only) ----------------------------------------------


def drop_the_expected_leaf_guard(mp: pytest.MonkeyPatch) -> None:
    """Appends (one, a batch; every path: the transaction, the one statement on
    PostgreSQL, a merged group) are made as if no ``expected_leaf`` were given."""
    real = appends.AppendRequest

    def unguarded(session_id: str, drafts: Any, expected_leaf: Any, *args: Any, **kw: Any) -> Any:
        return real(session_id, drafts, ANY_LEAF, *args, **kw)

    mp.setattr(appends, "AppendRequest", unguarded)


def drop_the_branch_expected_leaf_guard(mp: pytest.MonkeyPatch) -> None:
    """A branch moves the leaf as if no ``expected_leaf`` were given."""
    real = session_rows.move_leaf

    def unguarded(tx: Any, session_id: str, entry_id: Any, expected_leaf: Any, lease: Any) -> None:
        real(tx, session_id, entry_id, ANY_LEAF, lease)

    mp.setattr(session_rows, "move_leaf", unguarded)


def drop_the_fork_dedupe(mp: pytest.MonkeyPatch) -> None:
    """Every fork request is looked up under a digest of its own: a repeated
    request id finds no stored fork."""
    real, fresh = forks.fork, itertools.count()

    def unguarded(tx: Any, req: Any, new_id: Any) -> Any:
        return real(tx, dataclasses.replace(req, digest=f"{req.digest}-{next(fresh)}"), new_id)

    mp.setattr(forks, "fork", unguarded)


# -- the stored counterexamples (each a short replayable script) ---------------------


def append_on_a_stale_leaf(m: Steps) -> None:
    m.append(writer="w1", session="s1")
    m.append(writer="w3", session="s1")  # w3's leaf is stale (on PostgreSQL, through another store)


def append_many_on_a_stale_leaf(m: Steps) -> None:
    m.blind_append(session="s2")
    m.append_many(writer="w3", session="s2", size=2)


def compact_on_a_stale_leaf(m: Steps) -> None:
    m.title(session="s1")
    m.compact(writer="w1", session="s1", keep=1)


def branch_on_a_stale_leaf(m: Steps) -> None:
    m.append(writer="w1", session="s1")
    m.branch(writer="w2", session="s1", pick=0)


def retry_an_ambiguous_append(m: Steps) -> None:
    m.ambiguous_append(writer="w1", session="s2", size=1)
    m.ambiguous_append(writer="w1", session="s2", size=3)
    m.append(writer="w2", session="s2")  # w2 never saw the committed entry


def retry_an_ambiguous_branch(m: Steps) -> None:
    m.ambiguous_branch(writer="w3", session="s1", pick=0)
    m.ambiguous_branch(writer="w2", session="s1", pick=0)  # w2 never saw the move


def fork_twice(m: Steps) -> None:
    m.append(writer="w1", session="s1")  # the fifth entry, after the first turn's four
    m.branch(writer="w1", session="s1", pick=2)
    m.label(session="s1", pick=4, clear=False)  # names the abandoned branch: a fork copies it
    m.turn(session="s1")
    m.fork(session="s1", request="f1")
    m.append(writer="w1", session="s1")
    m.turn(session="s1")  # the source moved on: the same request is the same fork
    m.fork(session="s1", request="f1")


def retry_an_ambiguous_fork(m: Steps) -> None:
    m.ambiguous_fork(session="s2", request="f2")
    m.turn(session="s2")
    m.fork(session="s2", request="f2")


KILLS = {
    "expected-leaf-append": (drop_the_expected_leaf_guard, append_on_a_stale_leaf),
    "expected-leaf-append-many": (drop_the_expected_leaf_guard, append_many_on_a_stale_leaf),
    "expected-leaf-compaction": (drop_the_expected_leaf_guard, compact_on_a_stale_leaf),
    "expected-leaf-ambiguous-retry": (drop_the_expected_leaf_guard, retry_an_ambiguous_append),
    "expected-leaf-branch": (drop_the_branch_expected_leaf_guard, branch_on_a_stale_leaf),
    "expected-leaf-branch-ambiguous-retry": (
        drop_the_branch_expected_leaf_guard,
        retry_an_ambiguous_branch,
    ),
    "fork-dedupe": (drop_the_fork_dedupe, fork_twice),
    "fork-dedupe-ambiguous-retry": (drop_the_fork_dedupe, retry_an_ambiguous_fork),
}


(
    test_stored_counterexample_passes_on_the_real_store,
    test_stored_counterexample_fails_with_the_guard_patched_out,
) = kill_tests(KILLS, make_machine)
