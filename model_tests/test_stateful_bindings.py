"""Run the differential bindings machine (``stateful_bindings``: binds, unbinds,
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

from typing import Any

import pytest
from by_hand import Steps, kill_tests
from conftest import STORES, machine_settings
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from stateful_bindings import make_machine

MAX_EXAMPLES = 30
STEPS = 25

SEARCH = settings(
    max_examples=2000,
    derandomize=True,
    database=None,
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.generate),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("backend", STORES)
def test_bindings_agree_with_the_model(backend: str) -> None:
    budget = machine_settings(backend, max_examples=MAX_EXAMPLES)
    run_state_machine_as_test(
        make_machine(backend),
        settings=settings(budget, stateful_step_count=min(budget.stateful_step_count, STEPS)),
    )
