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

import pytest
from conftest import BACKENDS
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    INITIALIZE_RULE_MARKER,
    INVARIANT_MARKER,
    RuleBasedStateMachine,
    run_state_machine_as_test,
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


Kill = tuple[Callable[[pytest.MonkeyPatch], None], Callable[[Steps], None]]
"""A fence kill: what patches the fence out, and the stored counterexample."""


def kill_tests(
    kills: dict[str, Kill], machine: Callable[[str], type[RuleBasedStateMachine]]
) -> tuple[Callable[..., None], Callable[..., None]]:
    """The two tests of a machine's fence kills, over every backend: each stored
    counterexample passes on the real store, and fails (an ``AssertionError``)
    with its fence patched out. ``machine(backend)`` is the machine class."""

    @pytest.mark.parametrize("backend", BACKENDS)
    @pytest.mark.parametrize("fence", sorted(kills))
    def passes_on_the_real_store(fence: str, backend: str) -> None:
        replay(machine(backend), kills[fence][1])

    @pytest.mark.parametrize("backend", BACKENDS)
    @pytest.mark.parametrize("fence", sorted(kills))
    def fails_with_the_fence_patched_out(
        fence: str, backend: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        patch, script = kills[fence]
        patch(monkeypatch)
        with pytest.raises(AssertionError):
            replay(machine(backend), script)

    return passes_on_the_real_store, fails_with_the_fence_patched_out


def search_settings(max_examples: int) -> settings:
    """A fence kill's search from scratch: derandomized (the same examples on
    every run), no example database, no shrinking (a kill needs none), at most
    ``max_examples`` examples."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        report_multiple_bugs=False,
        phases=(Phase.explicit, Phase.generate),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def search_test(
    kills: dict[str, Kill],
    machine: Callable[[str], type[RuleBasedStateMachine]],
    *,
    examples: int,
    backends: list[str],
) -> Callable[..., None]:
    """The test (``search`` marker: on demand) that each fence kill is also
    found from scratch: with the fence patched out, the machine's own search
    (:func:`search_settings`, at most ``examples`` examples) fails on an
    assertion (an invariant or an oracle comparison; one inside an exception
    group counts), on each of ``backends``."""

    @pytest.mark.search
    @pytest.mark.parametrize("backend", backends)
    @pytest.mark.parametrize("fence", sorted(kills))
    def finds_a_counterexample_with_the_fence_patched_out(
        fence: str, backend: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        kills[fence][0](monkeypatch)
        with pytest.raises(Exception) as caught:
            run_state_machine_as_test(machine(backend), settings=search_settings(examples))
        pending: list[BaseException] = [caught.value]
        while pending and not isinstance(pending[0], AssertionError):
            head = pending.pop(0)
            if isinstance(head, BaseExceptionGroup):
                pending.extend(head.exceptions)
        assert pending, f"the machine failed, but not on an assertion: {caught.value!r}"

    return finds_a_counterexample_with_the_fence_patched_out
