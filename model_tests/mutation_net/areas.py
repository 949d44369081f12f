"""What the second mutation net mutates, with which operators, judged by which tests.

An :class:`Area` is a group of modules of the installed package (paths inside
``turnkeeper/``) and the fixed tests that judge their mutants: node ids or
files relative to ``model_tests/``, run DuckDB only (no ``TURNKEEPER_TEST_PG``)
with ``-x``. Each storage area also gets the DuckDB cases of the killing tests
the fence-mutant catalog names for its modules (:func:`judging_tests`).

:data:`OPERATORS` are the cosmic-ray operators run: the ones that break a
guard (a comparison flipped to its neighbour, a condition negated, ``and`` and
``or`` swapped, a boolean constant flipped, a loop that runs no iteration, a
caught exception replaced). The arithmetic, number, unary, decorator and
variable operators are left out: on 2 cores each mutant costs a pytest start
(10 s or more), and those operators give mostly mutants of messages and
figures rather than of fences (the catalog and the conformance suite pin
those).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mutants.catalog import MUTANTS

OPERATORS: tuple[str, ...] = (
    "core/ReplaceComparisonOperator_Eq_NotEq",
    "core/ReplaceComparisonOperator_NotEq_Eq",
    "core/ReplaceComparisonOperator_Lt_LtE",
    "core/ReplaceComparisonOperator_LtE_Lt",
    "core/ReplaceComparisonOperator_Gt_GtE",
    "core/ReplaceComparisonOperator_GtE_Gt",
    "core/ReplaceComparisonOperator_In_NotIn",
    "core/ReplaceComparisonOperator_NotIn_In",
    "core/ReplaceComparisonOperator_Is_IsNot",
    "core/ReplaceComparisonOperator_IsNot_Is",
    "core/AddNot",
    "core/ReplaceAndWithOr",
    "core/ReplaceOrWithAnd",
    "core/ReplaceTrueWithFalse",
    "core/ReplaceFalseWithTrue",
    "core/ZeroIterationForLoop",
    "core/ExceptionReplacer",
)
"""The cosmic-ray operators run (every other operator's mutants are skipped)."""

DECORATOR_FLAG = re.compile(r"^\s*@")
"""A line that is a decorator: ``True``/``False`` flipped in its arguments
(``@dataclass(frozen=True)``) is skipped, not run (it changes no guard)."""


MACHINE_TESTS = (
    "test_transitions_library_agrees_with_every_edge",
    "test_machine_decision_equals_spec_over_every_fact_combination",
    "test_unknown_trigger_is_the_projects_error",
    "test_acquire_decision_matches_the_lease_machine_exhaustively",
    "test_transitions_the_store_accepts_equal_the_spec_edges",
    "test_check_constraints_list_exactly_the_spec_states",
    "test_save_decision_never_revives_an_archived_record",
)
"""The spec-checking tests of ``checking/test_machines.py`` (its report, layering and
benchmark tests left out: they check no guard and take most of its minute)."""


@dataclass(frozen=True)
class Area:
    """Modules mutated together and the fixed tests that judge their mutants."""

    name: str
    modules: tuple[str, ...]  # inside the installed turnkeeper package
    tests: tuple[str, ...]  # relative to model_tests/


_FORGED_RUNS = tuple(
    "guards/test_forged_tokens.py::test_a_forged_token_is_refused_by_every_fenced_write"
    f"[duckdb-runs.{call}]"
    for call in ("admit", "admit[intent]", "start", "wait", "resume", "finish", "finish[plan]")
)
"""The forged-token cases of the runs area's fenced writes (the whole test
takes half a minute: only these cases judge its mutants)."""

AREAS: tuple[Area, ...] = (
    # -- spec/ (all of it) ------------------------------------------------------------
    Area(
        "spec-lifecycles",
        (
            "spec/lifecycle.py",
            "spec/lease.py",
            "spec/thread_record.py",
            "spec/run.py",
            "spec/recovery.py",
        ),
        (
            *(f"checking/test_machines.py::{t}" for t in MACHINE_TESTS),
            "conformance/test_conformance_leases.py",
            "conformance/test_recovery.py",
        ),
    ),
    Area(
        "spec-delivery",
        ("spec/delivery.py",),
        (
            *(f"checking/test_machines.py::{t}" for t in MACHINE_TESTS),
            "conformance/test_delivery.py",
        ),
    ),
    Area("spec-tools", ("spec/tool_execution.py",), ("conformance/test_tool_executions.py",)),
    Area("spec-fork", ("spec/fork.py",), ("conformance/test_forks.py",)),
    Area(
        "spec-ledger",
        ("spec/ledger.py", "spec/catalog.py"),
        (
            "ledger/test_ledger_catalog.py",
            "ledger/test_ledger_entry_check.py",
            "ledger/test_ledger.py",
        ),
    ),
    Area("spec-clear-facts", ("spec/clear_facts.py",), ("encryption/test_clear_facts.py",)),
    Area("spec-entries", ("spec/entries.py",), ("conformance/test_conformance_sessions.py",)),
    Area("spec-records", ("spec/records.py",), ("conformance/test_conformance_values.py",)),
    Area("spec-usage", ("spec/usage.py",), ("conformance/test_usage_records.py",)),
    Area(
        "spec-errors",
        ("spec/errors.py", "spec/__init__.py"),
        ("suite/test_public_names.py", "checking/test_pinned_guards.py"),
    ),
    # -- storage/: the fence-bearing modules (the catalog's entries point into them) ---
    Area(
        "storage-leases",
        ("storage/ops/leases.py", "storage/validate.py"),
        ("conformance/test_conformance_leases.py", "conformance/test_lease_authority.py"),
    ),
    Area(
        "storage-threads",
        ("storage/ops/threads.py",),
        ("conformance/test_conformance_threads.py", "checking/test_thread_survivors.py"),
    ),
    Area(
        "storage-runs",
        (
            "storage/ops/run_lifecycle.py",
            "storage/ops/runs.py",
            "storage/ops/recovery.py",
            "storage/ops/run_admission.py",
            "storage/ops/submissions.py",
        ),
        (
            "conformance/test_conformance_runs.py",
            "conformance/test_recovery.py",
            "conformance/test_active_run_policy.py",
            "conformance/test_admission_resources.py",
            "conformance/test_recovery_remote.py",
            "conformance/test_saved_intents.py",
            "conformance/test_conversation_turns.py",
            "benchmarks/test_turn_statements.py::test_a_turn_costs_the_pinned_statements",
            *_FORGED_RUNS,
            "internals/test_upgrades.py::"
            "test_an_upgrade_keeps_every_retry_of_what_an_older_turnkeeper_stored",
            "checking/test_run_survivors.py",
        ),
    ),
    Area(
        "storage-delivery",
        ("storage/ops/outbox.py",),
        ("conformance/test_delivery.py", "checking/test_outbox_survivors.py"),
    ),
    Area(
        "storage-tools",
        ("storage/ops/tools.py", "storage/ops/tool_records.py"),
        ("conformance/test_tool_executions.py", "checking/test_tool_survivors.py"),
    ),
    Area(
        "storage-ledger",
        ("storage/ops/ledger/journal.py",),
        (
            "ledger/test_ledger.py",
            "ledger/test_ledger_redelivery_threshold.py",
            "ledger/test_ledger_blob_races.py",
        ),
    ),
    Area(
        "storage-deletes",
        ("storage/ops/deletes.py",),
        (
            "conformance/test_delete.py",
            "conformance/test_retention.py",
            "checking/test_delete_survivors.py",
        ),
    ),
    Area(
        "storage-forks",
        ("storage/ops/forks.py",),
        ("conformance/test_forks.py", "checking/test_fork_survivors.py"),
    ),
    Area(
        "storage-bindings",
        ("storage/ops/bindings.py",),
        ("conformance/test_bindings.py", "checking/test_binding_survivors.py"),
    ),
)
"""Every area, spec/ first (the order ``make mutation-net`` runs them in)."""


SPEC_KILLS = "checking/test_spec_survivors.py"
"""The fixed tests written for the net's survivors in ``spec/`` (pure, fast):
every spec area runs them first."""

STORAGE_KILLS = "checking/test_storage_survivors.py"
"""The fixed tests written for the net's survivors in ``storage/`` (the
argument checks, pure, and lease operations on a store): every storage area
runs them first."""


def judging_tests(area: Area) -> tuple[str, ...]:
    """The area's tests and the catalog's killing tests for its modules (their
    DuckDB cases: a PostgreSQL case would only be skipped), files first; a
    spec area's begin with :data:`SPEC_KILLS`, a storage area's with
    :data:`STORAGE_KILLS`."""
    caught = [
        t
        for m in MUTANTS
        if m.file in area.modules
        for t in m.tests
        if "postgres" not in t and t.split("::", 1)[0] not in area.tests
    ]
    first = tuple(
        kills
        for kills, top in ((SPEC_KILLS, "spec/"), (STORAGE_KILLS, "storage/"))
        if any(m.startswith(top) for m in area.modules)
    )
    return tuple(dict.fromkeys((*first, *area.tests, *caught)))


def by_name(names: list[str] | None) -> list[Area]:
    """The areas ``names`` names (all without any), in :data:`AREAS` order.

    Raises:
        SystemExit: an unknown name.
    """
    if not names:
        return list(AREAS)
    known = {a.name for a in AREAS}
    unknown = sorted(set(names) - known)
    if unknown:
        raise SystemExit(f"unknown areas: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return [a for a in AREAS if a.name in names]
