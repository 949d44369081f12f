"""A breadth-first explicit-state explorer with state hashing and a parent map.

A model gives ``initial()`` (a hashable state), ``actions(state)`` (an
iterable of ``(label, next_state)``: every step any actor can take from
``state``, in a fixed order) and ``invariants`` (name -> predicate over a
state, true when the state is fine). :func:`explore` visits every state
reachable within the bound (each state once, by its hash), checks every
invariant in every state, and on the first violation returns the shortest
list of step labels that reaches it (breadth-first order: no shorter path
exists; ties go to the first action in ``actions`` order, so the result is
deterministic). The bounds (actors, targets, clock ticks) are the model's:
its state space is finite; ``max_depth`` cuts the search further.

Why it is written here and not taken from PyPI: the issue names two small
checkers. ``musil`` (PyPI, single maintainer, "beta", dozens of 0.x releases
in a few months) requires Python 3.12, and turnkeeper supports 3.11 (this
checkout's virtualenv is 3.11), so it cannot be a test dependency at all.
``minicheck`` is not on PyPI (its README says to install it from GitHub,
"PyPI release pending"), so it cannot go in the ``test`` extra either. What
this project needs of either is a breadth-first search with a parent map
(under a hundred lines, below), with a step vocabulary the replayer turns into
store calls; nothing else of theirs (LTL, fairness, probabilities) is used.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

S = TypeVar("S", bound=Hashable)
Label = tuple[str, ...]
"""A step: the action's name, then its arguments (actor, target …), all text."""


class Model(Protocol[S]):
    """What :func:`explore` needs of a model."""

    name: str
    invariants: Mapping[str, Callable[[S], bool]]

    def initial(self) -> S: ...

    def actions(self, state: S) -> Iterable[tuple[Label, S]]: ...


class Stepped(Generic[S]):
    """A model given as its candidate steps (:meth:`labels`) and a step
    function (:meth:`step`): its actions are the candidates the step accepts."""

    def labels(self, state: S) -> Iterable[Label]:
        """Every step to try from ``state`` (a refused one is dropped)."""
        raise NotImplementedError

    def step(self, state: S, label: Label) -> tuple[bool, S]:
        """``(accepted, next state)``; a refused step leaves the state as it was."""
        raise NotImplementedError

    def actions(self, state: S) -> Iterator[tuple[Label, S]]:
        """The accepted steps from ``state`` and the states they reach."""
        for label in self.labels(state):
            ok, nxt = self.step(state, label)
            if ok:
                yield label, nxt


@dataclass(frozen=True)
class Violation:
    """An invariant false in a reachable state: ``steps`` is the shortest path to it."""

    invariant: str
    steps: tuple[Label, ...]


@dataclass(frozen=True)
class Result:
    """One exploration: ``states`` distinct states visited, ``depth`` the
    longest shortest path among them (steps), ``seconds`` wall time,
    ``complete`` whether every reachable state within ``max_depth`` was
    visited (false when it stopped at a violation), ``violation`` the first
    one found (``None``: every invariant held in every visited state)."""

    model: str
    states: int
    transitions: int
    depth: int
    seconds: float
    complete: bool
    violation: Violation | None

    def summary(self) -> str:
        """One line: the model, states, transitions, depth, time and the verdict."""
        verdict = (
            "no violation"
            if self.violation is None
            else f"VIOLATION of {self.violation.invariant!r} in {len(self.violation.steps)} steps"
        )
        return (
            f"{self.model}: {self.states} states, {self.transitions} transitions, "
            f"depth {self.depth}, {self.seconds:.2f} s: {verdict}"
        )


def _path(parents: dict[S, tuple[S, Label] | None], state: S) -> tuple[Label, ...]:
    steps: list[Label] = []
    link = parents[state]
    while link is not None:
        state, label = link
        steps.append(label)
        link = parents[state]
    return tuple(reversed(steps))


def _broken(model: Model[S], state: S) -> str | None:
    for name, holds in model.invariants.items():
        if not holds(state):
            return name
    return None


def explore(model: Model[S], max_depth: int | None = None) -> Result:
    """Visit every state of ``model`` reachable in at most ``max_depth`` steps
    (all of them when ``None``), breadth first; stop at the first state that
    breaks an invariant and return the shortest step list to it."""
    started = time.perf_counter()
    start = model.initial()
    parents: dict[S, tuple[S, Label] | None] = {start: None}
    depths = {start: 0}
    queue = deque([start])
    transitions, deepest = 0, 0

    def result(violation: Violation | None) -> Result:
        return Result(
            model.name,
            len(parents),
            transitions,
            deepest,
            time.perf_counter() - started,
            violation is None,
            violation,
        )

    broken = _broken(model, start)
    if broken is not None:
        return result(Violation(broken, ()))
    while queue:
        state = queue.popleft()
        depth = depths[state]
        if max_depth is not None and depth >= max_depth:
            continue
        for label, nxt in model.actions(state):
            transitions += 1
            if nxt in parents:
                continue
            parents[nxt] = (state, label)
            depths[nxt] = depth + 1
            deepest = max(deepest, depth + 1)
            broken = _broken(model, nxt)
            if broken is not None:
                return result(Violation(broken, _path(parents, nxt)))
            queue.append(nxt)
    return result(None)
