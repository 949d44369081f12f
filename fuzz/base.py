"""The base of every differential machine: its opener and its counts.

A machine class is bound to a :class:`~.opener.StoreOpener` (each machine
module's ``machine(opener)``); every example opens a store with it and closes
it in ``teardown``. :class:`Tally` counts what a run did: examples begun,
steps completed, and invariant checks (one per ``@checked`` invariant run,
after every step).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from hypothesis import settings as Settings
from hypothesis.stateful import RuleBasedStateMachine, invariant

from .clock import FakeClock
from .opener import StoreOpener

M = TypeVar("M", bound="FuzzMachine")


@dataclass
class Tally:
    """What a machine class ran: ``examples`` (machines made: stores opened),
    ``steps`` (rules completed; a failing rule is not counted) and
    ``invariants`` (invariant functions run)."""

    examples: int = 0
    steps: int = 0
    invariants: int = 0


def checked(fn: Callable[[M], None]) -> Callable[[M], None]:
    """``@invariant()`` that also counts each run in the class's :class:`Tally`."""

    @functools.wraps(fn)
    def counted(self: M) -> None:
        type(self).tally.invariants += 1
        fn(self)

    return invariant()(counted)


class FuzzMachine(RuleBasedStateMachine):
    """A ``RuleBasedStateMachine`` on an injected clock whose store comes from
    :attr:`opener`; subclasses open it with :meth:`open_store`."""

    opener: ClassVar[StoreOpener]
    tally: ClassVar[Tally] = Tally()
    """The counts; :func:`bound` gives each bound class its own."""

    def __init__(self) -> None:
        super().__init__()
        self._began = False
        self.clock = FakeClock()
        self.store = self.opener.open(self.clock)
        type(self).tally.examples += 1

    def teardown(self) -> None:
        self.opener.close(self.store)

    def check_invariants(
        self, settings: Settings, output: Callable[[str], object], runtimes: dict[str, float]
    ) -> None:
        """Hypothesis's check after the start and after each step: counts the step."""
        if self._began:
            type(self).tally.steps += 1
        self._began = True
        super().check_invariants(settings, output, runtimes)


def bound(cls: type[M], opener: StoreOpener, name: str) -> type[M]:
    """A subclass of ``cls`` named ``name`` whose stores come from ``opener``,
    with a :class:`Tally` of its own."""
    attrs: dict[str, Any] = {"opener": opener, "tally": Tally(), "__module__": cls.__module__}
    return type(name, (cls,), attrs)
