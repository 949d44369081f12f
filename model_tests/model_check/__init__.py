"""A bounded model checker over the lifecycles in ``spec/`` (issue 22).

``explorer`` is the breadth-first search; ``leases``, ``runs``, ``delivery`` and
``ledger`` (writers, blob GC and deleters; ``ledger`` and ``ledger_gc`` in the
bounds) are models built from the spec's
:class:`~turnkeeper.spec.lifecycle.Lifecycle` data;
``replay`` runs a model's steps against a real store; ``mutations`` removes one
guard from an edge (a test-only copy of the lifecycle) and finds the shortest
counterexample; ``counterexamples/`` holds the ones found, replayed in CI.
Run ``python -m model_check`` (from ``model_tests/``) for the figures.
"""
