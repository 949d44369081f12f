"""Test-only copies of a lifecycle with one guard taken off one edge.

Nothing shipped can disable a guard: :func:`without` returns a new
:class:`Lifecycle` (``dataclasses.replace``) whose edge ``edge`` lacks
``guard`` in its ``guards`` (the edge then fires without it) or its
``unless`` (the edge then fires even when it holds). The models take the
lifecycle as an argument, so the checker explores the mutant's state space.
"""

from __future__ import annotations

from dataclasses import replace

from turnkeeper.spec.lifecycle import Lifecycle


def guard_pairs(lifecycle: Lifecycle) -> list[tuple[str, str]]:
    """Every ``(edge name, guard name)`` of ``lifecycle``, ``guards`` and ``unless`` alike."""
    return [(e.name, g) for e in lifecycle.edges for g in (*e.guards, *e.unless)]


def without(lifecycle: Lifecycle, edge: str, guard: str) -> Lifecycle:
    """``lifecycle`` with ``guard`` removed from edge ``edge``.

    Raises:
        KeyError: no such edge, or the edge has no such guard.
    """
    target = lifecycle.edge(edge)
    if guard not in (*target.guards, *target.unless):
        raise KeyError(f"{lifecycle.name}.{edge} has no guard {guard}")
    mutated = replace(
        target,
        guards=tuple(g for g in target.guards if g != guard),
        unless=tuple(g for g in target.unless if g != guard),
    )
    edges = tuple(mutated if e.name == edge else e for e in lifecycle.edges)
    return replace(lifecycle, name=f"{lifecycle.name}-{edge}.{guard}", edges=edges)
