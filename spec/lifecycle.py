"""Lifecycles as data: states, triggers, edges, guards and invariants.

A :class:`Lifecycle` is the one source for a machine: ``turnkeeper.machines``
builds a ``transitions`` machine from it, the diagrams in ``reports/`` are
drawn from it, and the store's accepted transitions are checked against it.

Guards are pure predicates over a :class:`Facts` mapping that the store reads
inside the transaction that will write (for example ``expired`` is computed
against the store's clock). An edge fires when all of its ``guards`` are true
and none of its ``unless`` guards is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

Facts = Mapping[str, object]
"""Named facts a guard reads: booleans and values observed in one transaction."""

Guard = Callable[[Facts], bool]


@dataclass(frozen=True, slots=True)
class Edge:
    """One transition: ``trigger`` moves ``source`` to ``dest`` when the guards allow.

    ``name`` identifies the edge to the store (which SQL effect it applies)
    and in event rows; names are unique within a lifecycle.
    """

    name: str
    trigger: str
    source: str
    dest: str
    guards: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """A state machine as data.

    ``states`` lists every state, ``initial`` is where a new object starts
    (a pseudo-state such as ``absent`` when the object has no row yet),
    ``edges`` the legal transitions, ``guards`` the named predicates the
    edges use with a one-line description each, and ``invariants`` the
    properties that must hold after every step (checked by the model tests).
    """

    name: str
    states: tuple[str, ...]
    initial: str
    edges: tuple[Edge, ...]
    guards: Mapping[str, tuple[Guard, str]]
    invariants: tuple[str, ...]

    def __post_init__(self) -> None:
        names = [e.name for e in self.edges]
        if len(names) != len(set(names)):
            raise ValueError(f"{self.name}: edge names must be unique")
        for edge in self.edges:
            if edge.source not in self.states or edge.dest not in self.states:
                raise ValueError(f"{self.name}: edge {edge.name} uses an unknown state")
            for guard in (*edge.guards, *edge.unless):
                if guard not in self.guards:
                    raise ValueError(f"{self.name}: edge {edge.name} uses unknown guard {guard}")
        if self.initial not in self.states:
            raise ValueError(f"{self.name}: unknown initial state {self.initial}")

    @property
    def triggers(self) -> tuple[str, ...]:
        """Every trigger, in first-use order."""
        return tuple(dict.fromkeys(e.trigger for e in self.edges))

    def edge(self, name: str) -> Edge:
        """The edge called ``name``; ``KeyError`` when there is none."""
        for e in self.edges:
            if e.name == name:
                return e
        raise KeyError(name)

    def allowed(self, edge: Edge, facts: Facts) -> bool:
        """Whether ``edge``'s guards admit it under ``facts``."""
        return all(self.guards[g][0](facts) for g in edge.guards) and not any(
            self.guards[g][0](facts) for g in edge.unless
        )

    def select(self, trigger: str, source: str, facts: Facts) -> Edge | None:
        """The first edge for ``trigger`` from ``source`` whose guards admit it.

        Returns ``None`` when edges exist but none is admitted; the caller
        turns that into the condition's own error (busy, lease lost …).
        """
        for e in self.edges:
            if e.trigger == trigger and e.source == source and self.allowed(e, facts):
                return e
        return None


def fact(name: str) -> Guard:
    """A guard that reads the boolean fact ``name`` (missing means false)."""

    def guard(facts: Facts) -> bool:
        return facts.get(name) is True

    guard.__name__ = name
    return guard
