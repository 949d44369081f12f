"""Run a stateful machine's rules by hand: a stored counterexample, replayed.

A fence kill's counterexample is kept as the steps that found it and replayed
on a fresh machine (``Steps``), with every ``@invariant`` of the machine
checked after each step, as Hypothesis checks them. The replay is fast and
deterministic; the search that found it runs on demand (the ``search``
marker, ``conftest.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from hypothesis.stateful import (
    INITIALIZE_RULE_MARKER,
    INVARIANT_MARKER,
    RuleBasedStateMachine,
)


class Steps:
    """``steps.rule(**args)`` runs ``machine.rule(**args)`` and then every
    invariant of the machine; returns what the rule returned."""

    def __init__(self, machine: RuleBasedStateMachine) -> None:
        self.machine = machine
        self._invariants = [
            getattr(machine, name)
            for name, fn in inspect.getmembers(type(machine), inspect.isfunction)
            if getattr(fn, INVARIANT_MARKER, None) is not None
        ]
        assert self._invariants, f"{type(machine).__name__} declares no invariant"

    def check(self) -> None:
        for invariant in self._invariants:
            invariant()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        rule = getattr(self.machine, name)

        def step(**args: Any) -> Any:
            result = rule(**args)
            self.check()
            return result

        return step


def replay(machine_class: type[RuleBasedStateMachine], script: Callable[[Steps], None]) -> None:
    """Run ``script`` on a fresh ``machine_class`` (its ``@initialize`` rules
    first, as Hypothesis does), then tear the machine down."""
    machine = machine_class()
    try:
        steps = Steps(machine)
        for name, fn in inspect.getmembers(type(machine), inspect.isfunction):
            if getattr(fn, INITIALIZE_RULE_MARKER, None) is not None:
                getattr(steps, name)()
        steps.check()
        script(steps)
    finally:
        machine.teardown()
