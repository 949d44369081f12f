"""The fence-mutant catalog (issue 22): every fence and guard of the shipped
package, how to break it, and the fixed tests that kill the break.

``catalog`` lists the mutants (one source replacement each, Python or SQL
text); ``apply`` copies the installed package to a temporary folder and
applies one there (nothing shipped changes, and nothing shipped can disable
a fence); ``python -m mutants`` (from ``model_tests/``, ``make mutants``)
runs each mutant's killing tests against its copy and requires them to fail.
``model_tests/checking/test_mutants.py`` keeps the catalog from going stale in CI.
"""
