"""Build ``transitions`` machines from the lifecycles in ``turnkeeper.spec``.

Each lifecycle's machine is built once per process (:func:`machine_for`) and
shared by every thread; nothing per operation constructs a machine. The store
asks :meth:`LifecycleMachine.decide` which edge a trigger takes from a row's
stored state given the facts it read in the same transaction, then writes the
destination with a compare-and-set. The machine never performs I/O and keeps
no per-object state, so sharing it across threads is safe.
"""

from __future__ import annotations

import threading
from typing import Any

from transitions import Machine
from transitions.core import MachineError

from turnkeeper.spec.errors import InvalidTransitionError
from turnkeeper.spec.lifecycle import Edge, Facts, Lifecycle


class LifecycleMachine:
    """A ``transitions.Machine`` built from a :class:`Lifecycle`, used as an edge oracle.

    Built with ``auto_transitions=False``, ``ignore_invalid_triggers=False``
    and ``queued=False``. Guards are named conditions; their truth comes from
    the facts the caller read, evaluated with the spec's guard functions.
    """

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle
        self.machine: Any = Machine(
            model=None,
            states=list(lifecycle.states),
            initial=lifecycle.initial,
            transitions=[
                {
                    "trigger": e.trigger,
                    "source": e.source,
                    "dest": e.dest,
                    "conditions": list(e.guards),
                    "unless": list(e.unless),
                }
                for e in lifecycle.edges
            ],
            auto_transitions=False,
            ignore_invalid_triggers=False,
            queued=False,
            send_event=True,
        )
        self._edges: dict[tuple[str, str, str, tuple[str, ...], tuple[str, ...]], Edge] = {
            (e.trigger, e.source, e.dest, e.guards, e.unless): e for e in lifecycle.edges
        }

    def decide(self, trigger: str, source: str, facts: Facts) -> Edge | None:
        """The edge ``trigger`` takes from ``source`` under ``facts``.

        Returns ``None`` when the lifecycle has edges for ``trigger`` from
        ``source`` but no guard set admits one (the caller raises the
        condition's own error: busy, lease lost …).

        Raises:
            InvalidTransitionError: no edge exists for ``trigger`` from ``source``.
        """
        if trigger not in self.machine.events:
            raise InvalidTransitionError(self.lifecycle.name, trigger, source)
        candidates = self.machine.get_transitions(trigger=trigger, source=source)
        if not candidates:
            raise InvalidTransitionError(self.lifecycle.name, trigger, source)
        guards = self.lifecycle.guards
        for t in candidates:
            if all(guards[c.func][0](facts) is c.target for c in t.conditions):
                conds = tuple(c.func for c in t.conditions if c.target)
                unless = tuple(c.func for c in t.conditions if not c.target)
                return self._edges[(trigger, t.source, t.dest, conds, unless)]
        return None

    def require(self, trigger: str, source: str, facts: Facts) -> Edge:
        """Like :meth:`decide`, but an unadmitted trigger is an error too.

        Raises:
            InvalidTransitionError: no edge exists or none is admitted.
        """
        edge = self.decide(trigger, source, facts)
        if edge is None:
            raise InvalidTransitionError(
                self.lifecycle.name, trigger, source, detail="no guard admits it"
            )
        return edge

    def check_machine_agrees(self, edge: Edge) -> None:
        """Fire ``edge`` on a throwaway model to confirm ``transitions`` reaches ``edge.dest``.

        Used by tests: the hand-evaluated decision and the library's own
        trigger handling must agree.
        """
        facts_true = set(edge.guards)

        class _Model:
            pass

        model = _Model()
        for guard in self.lifecycle.guards:
            setattr(model, guard, lambda _ev, g=guard: g in facts_true)
        self.machine.add_model(model, initial=edge.source)
        try:
            fired = getattr(model, edge.trigger)()
        except MachineError as exc:  # pragma: no cover - a spec/library disagreement
            raise InvalidTransitionError(self.lifecycle.name, edge.trigger, edge.source) from exc
        finally:
            self.machine.remove_model(model)
        if not fired or model.state != edge.dest:  # type: ignore[attr-defined]
            raise InvalidTransitionError(
                self.lifecycle.name, edge.trigger, edge.source, detail="library disagrees"
            )


_lock = threading.Lock()
_built: dict[str, LifecycleMachine] = {}


def machine_for(lifecycle: Lifecycle) -> LifecycleMachine:
    """The process-wide machine for ``lifecycle``, built on first use."""
    m = _built.get(lifecycle.name)
    if m is None:
        with _lock:
            m = _built.get(lifecycle.name)
            if m is None:
                m = LifecycleMachine(lifecycle)
                _built[lifecycle.name] = m
    return m
