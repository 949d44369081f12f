"""The second mutation net (issue 22): cosmic-ray over ``spec/`` and the
fence-bearing modules of ``storage/``, run against a temporary copy of the
installed package (nothing shipped changes).

``areas`` says which modules are mutated, by which operators, and which fixed
tests (DuckDB only, ``-x``) judge each area's mutants; ``survivors`` is the
maintained classification of every survivor (equivalent, with why, or killed
by a named fixed test); ``python -m mutation_net`` (from ``model_tests/``,
``make mutation-net``) runs cosmic-ray and writes ``reports/MUTATION_NET.md``
and ``reports/MUTATION_NET.json``. ``model_tests/checking/test_mutation_net.py`` is
its CI part. The fence-mutant catalog (``mutants/``) is the first net: it
breaks the SQL fences, which no AST operator can change usefully.
"""
