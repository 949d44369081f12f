"""Run the differential lease/thread-record machine over every backend."""

from __future__ import annotations

import pytest
from conftest import BACKENDS
from hypothesis.stateful import run_state_machine_as_test
from stateful_leases import make_machine


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_agrees_with_oracle_and_invariants_hold(backend: str) -> None:
    run_state_machine_as_test(make_machine(backend))
