"""Every fence and guard of the shipped package, how to break it, and the
fixed tests that kill the break.

One :class:`Mutant` per guard: the file of the installed package (a path
inside ``turnkeeper/``), the exact source text to replace (found exactly
once, else the entry is stale: ``checking/test_mutants.py`` checks that in CI) and
its replacement, Python or SQL text alike (``AND seq = ?`` becomes a
condition that keeps its parameter and compares nothing). ``tests`` are
pytest node ids relative to ``model_tests/``, never a Hypothesis search:
each names a fixed scenario that fails under the mutant. A test without a
backend parameter in its id runs over every backend its fixture has (both,
for ``store``).

:data:`KINDS` is the issue's list of fences (issue 22, "Fence mutants as a
maintained catalog"); every kind has at least one entry (a test checks it).
The spec's own guards, removed from the lifecycle data, are the model
checker's (``model_check/catalog.py``); these are the store's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """One guard broken by one source replacement (see the module docstring)."""

    id: str
    kind: str  # one of KINDS
    guards: str  # what the guard keeps from happening
    file: str  # inside the installed turnkeeper package
    old: str
    new: str
    tests: tuple[str, ...]


KINDS: dict[str, str] = {
    "token": "a lease's token (its digest) must be the held one's",
    "epoch": "a lease's epoch must be the held one's",
    "expiry": "a lease past its expiry fences nothing",
    "expiry-boundary": "a lease is live iff now < expires_at (at expires_at it is expired)",
    "owner": "the lease's owner must be the holder; without a lease nobody may hold one",
    "purpose": "the held lease's purpose decides, not the caller's copy",
    "lease-target": "a lease is authority over its own target only",
    "expected-leaf": "a stale expected leaf is SessionModifiedError, never a second child",
    "key-absent": "require_key_absent refuses a bound key",
    "one-active": "at most one active thread record per key, one non-terminal run per session",
    "submission-fingerprint": "the same submission key with another request conflicts",
    "retry-of-latest": "a retry only from the intent's latest attempt",
    "retry-session": "a retry only of a run of the same session",
    "claim-epoch": "a delivery update must carry the current claim's owner and epoch",
    "claim-expiry": "an expired delivery claim updates nothing; a live one is not reclaimed",
    "recovery-epoch": "only the recovery lease that began a recovery ends it",
    "recovery-supersede": "begin again under the same lease returns the recovery",
    "tool-claim": "a side-effecting tool is never re-run without a confirmed retry",
    "tool-binding": "an execution key bound to another call conflicts",
    "fork-dedupe": "one fork per request id; another request under it conflicts",
    "schema-newer": "a database of a newer schema is refused",
    "schema-older": "a read-only open refuses an older schema",
    "migration-lock": "concurrent openers migrate one after the other (PostgreSQL)",
    "pairing": "the tool-call pairing rule refuses a write that breaks it",
    "read-only-query": "store.query() runs reads only",
    "group-commit-isolation": "a failing or lapsed write in a DuckDB group keeps nothing alone",
    "ledger-writer-fence": "a ledger append needs the ledger's newest fence epoch",
    "ledger-gc-fence": "GC runs only under the writer's held lease",
    "ledger-blob-hash": "replay verifies a blob's sha256 and a payload's hash",
    "ledger-tip-seq": "the tip compare-and-set and replay's gapless sequence and fences",
    "bindings": "channel binding writes are fenced and one channel has one session",
    "deletes": "deletes are fenced, refuse active runs and never reuse an id",
}
"""The fence kinds of issue 22 (name → what the fence keeps), each with at least one entry."""


def _cases(test: str) -> tuple[str]:
    """Every case of the test function ``test``: both backends (and every
    facade, for the conformance tests' ``sync`` and ``aio``)."""
    return (test,)


_UNEXPIRED = (
    "    if expiry <= now:\n        raise lost\n    tx.valid_until(expiry, lost)\n    return now"
)
"""The end of ``leases.unexpired``: the fence's expiry check, then its re-check at COMMIT."""

_FORGED = "guards/test_forged_tokens.py::test_a_forged_token_is_refused_by_every_fenced_write"

MUTANTS: tuple[Mutant, ...] = (
    # -- leases (storage/ops/leases.py, storage/validate.py) ------------------------------
    Mutant(
        id="lease-fence-token",
        kind="token",
        guards="the fence's SQL compares the token digest (the column's comparison made true)",
        file="storage/ops/leases.py",
        old='    same = " AND ".join(f"leases.{c} = {value(c)}" for c in FENCED[1:])',
        new='    same = " AND ".join(f"leases.{c} = {value(c)}" if c != "token_digest" '
        'else f"CAST({value(c)} AS VARCHAR) IS NOT NULL" for c in FENCED[1:])',
        tests=(
            f"{_FORGED}[duckdb-sessions.append]",
            f"{_FORGED}[postgres-sessions.append]",
            f"{_FORGED}[duckdb-runs.finish]",
            f"{_FORGED}[postgres-runs.finish]",
        ),
    ),
    Mutant(
        id="lease-merged-fence-token",
        kind="token",
        guards="DuckDB's merged appends judge the fence in Python (fence_holds): any "
        "64-character value (a token digest) taken as equal",
        file="storage/ops/leases.py",
        old="        mine is not None and mine == theirs",
        new="        mine is not None and (mine == theirs or len(str(mine)) == 64)",
        tests=("guards/test_forged_tokens.py::test_a_forged_token_is_refused_by_a_merged_append",),
    ),
    Mutant(
        id="lease-acquire-token",
        kind="token",
        guards="a re-acquire needs the token this store object issued (another store "
        "object under the same owner name is another holder)",
        file="storage/ops/leases.py",
        old='            "token_matches": hmac.compare_digest(digest(mine), held_digest),',
        new='            "token_matches": True,',
        tests=_cases(
            "checking/test_pinned_guards.py::"
            "test_another_store_object_under_the_same_owner_name_does_not_get_the_live_lease"
        ),
    ),
    Mutant(
        id="lease-release-token",
        kind="token",
        guards="release compares the token: a stale or foreign lease releases nothing",
        file="storage/ops/leases.py",
        old="_HELD_BY = \"epoch = ? AND token_digest = ? AND owner = ? AND state = 'held'\"",
        new='_HELD_BY = "epoch = ? AND CAST(? AS VARCHAR) IS NOT NULL AND owner = ? '
        "AND state = 'held'\"",
        tests=(
            f"{_FORGED}[duckdb-leases.release]",
            f"{_FORGED}[postgres-leases.release]",
        ),
    ),
    Mutant(
        id="lease-fence-epoch",
        kind="epoch",
        guards="the fence's SQL compares the epoch",
        file="storage/ops/leases.py",
        old='    same = " AND ".join(f"leases.{c} = {value(c)}" for c in FENCED[1:])',
        new='    same = " AND ".join(f"leases.{c} = {value(c)}" if c != "epoch" '
        'else f"CAST({value(c)} AS BIGINT) IS NOT NULL" for c in FENCED[1:])',
        tests=_cases("guards/test_forged_tokens.py::test_a_lease_with_another_epoch_is_refused"),
    ),
    Mutant(
        id="lease-bound-run-epoch",
        kind="epoch",
        guards="validate(run_id=…) needs the run bound to this lease's epoch",
        file="storage/ops/leases.py",
        old="    if epoch != lease.epoch:",
        new="    if False:",
        tests=_cases(
            "conformance/test_lease_authority.py::"
            "test_a_run_admitted_under_an_earlier_epoch_is_not_bound_to_a_new_lease"
        ),
    ),
    Mutant(
        id="lease-fence-expiry",
        kind="expiry",
        guards="the fence refuses an expired lease (judged after the row's lock, and "
        "again at COMMIT: both left out)",
        file="storage/ops/leases.py",
        old=_UNEXPIRED,
        new="    return now",
        tests=_cases(
            "conformance/test_conformance_leases.py::"
            "test_renew_after_expiry_is_lease_lost_even_if_nobody_took_it"
        ),
    ),
    Mutant(
        id="lease-fence-expiry-boundary",
        kind="expiry-boundary",
        guards="at exactly expires_at the fence refuses (live iff now < expires_at): the "
        "instant counted live, at the fence and at COMMIT",
        file="storage/ops/leases.py",
        old=_UNEXPIRED,
        new="    if expiry < now:\n        raise lost\n    if expiry > now:\n"
        "        tx.valid_until(expiry, lost)\n    return now",
        tests=_cases(
            "conformance/test_conformance_leases.py::test_a_lease_at_its_expiry_instant_fences_nothing"
        ),
    ),
    Mutant(
        id="lease-acquire-expiry-boundary",
        kind="expiry-boundary",
        guards="at exactly expires_at another owner takes the lease over (not busy)",
        file="storage/ops/leases.py",
        old='            "expired": now >= expires_at,',
        new='            "expired": now > expires_at,',
        tests=_cases(
            "conformance/test_conformance_leases.py::test_a_lease_at_its_expiry_instant_is_taken_over"
        ),
    ),
    Mutant(
        id="lease-group-fence",
        kind="expiry",
        guards="fence_many, a ledger group's lease fence, judges every member's lease "
        "(token, epoch, purpose, expiry) as fence does alone: no member judged (only the "
        "ledger's own epoch fence is left, which an expired lease nobody took over passes)",
        file="storage/ops/leases.py",
        old="    out: list[datetime | Exception] = []\n    for i, lease in enumerate(held):",
        new="    out: list[datetime | Exception] = []\n    for i, lease in []:",
        tests=(
            *_cases(
                "checking/test_storage_survivors.py::test_fence_many_judges_each_lease_as_fence_does_alone"
            ),
            "ledger/test_ledger_group.py::"
            "test_one_members_lost_lease_or_bad_input_fails_only_that_member[duckdb]",
        ),
    ),
    Mutant(
        id="lease-commit-expiry-duckdb",
        kind="expiry",
        guards="DuckDB judges a fenced lease's expiry again right before COMMIT "
        "(a group runs other writes between a fence and its COMMIT)",
        file="storage/duck/tx.py",
        old="            if expires_at <= now:\n                return item, lost",
        new="            if False:\n                return item, lost",
        tests=(
            "guards/test_fence_after_lock.py::"
            "test_a_grouped_write_whose_lease_expired_before_the_commit_is_refused",
        ),
    ),
    Mutant(
        id="lease-commit-expiry-postgres",
        kind="expiry",
        guards="PostgreSQL judges a fenced lease's expiry again as it commits (a write "
        "that waited for a lock after its fence past the expiry is refused)",
        file="storage/postgres/db.py",
        old="            if expires_at <= check_clock(self._clock()):\n                raise lost",
        new="            if False:\n                raise lost",
        tests=(
            "guards/test_fence_after_lock.py::test_a_write_that_waited_after_its_fence_past_the_expiry_is_refused",
        ),
    ),
    Mutant(
        id="lease-fence-owner",
        kind="owner",
        guards="the fence's SQL compares the owner",
        file="storage/ops/leases.py",
        old='    same = " AND ".join(f"leases.{c} = {value(c)}" for c in FENCED[1:])',
        new='    same = " AND ".join(f"leases.{c} = {value(c)}" if c != "owner" '
        'else f"CAST({value(c)} AS VARCHAR) IS NOT NULL" for c in FENCED[1:])',
        tests=_cases("guards/test_forged_tokens.py::test_a_lease_with_another_owner_is_refused"),
    ),
    Mutant(
        id="lease-unheld-write",
        kind="owner",
        guards="a write without a lease is refused while another owner holds a live one",
        file="storage/ops/leases.py",
        old="    if utc(row[2]) > tx.clock_after_locks(row[3]):",
        new="    if False:",
        tests=_cases(
            "conformance/test_tool_executions.py::test_tool_writes_without_a_lease_wait_for_the_session_holder"
        ),
    ),
    Mutant(
        id="lease-fence-purpose",
        kind="purpose",
        guards="the fence's SQL compares the purpose (a lease relabelled in memory is refused)",
        file="storage/ops/leases.py",
        old='    same = " AND ".join(f"leases.{c} = {value(c)}" for c in FENCED[1:])',
        new='    same = " AND ".join(f"leases.{c} = {value(c)}" if c != "purpose" '
        'else f"CAST({value(c)} AS VARCHAR) IS NOT NULL" for c in FENCED[1:])',
        tests=(
            "guards/test_forged_tokens.py::"
            "test_a_lease_relabelled_with_another_purpose_is_refused[duckdb-begin_recovery]",
            "guards/test_forged_tokens.py::"
            "test_a_lease_relabelled_with_another_purpose_is_refused[postgres-begin_recovery]",
        ),
    ),
    Mutant(
        id="lease-target",
        kind="lease-target",
        guards="a lease on another session never fences a write to this one",
        file="storage/validate.py",
        old="    if lease.target != expected:",
        new="    if False:",
        tests=_cases(
            "guards/test_hardening.py::test_a_lease_on_one_session_never_fences_a_write_to_another"
        ),
    ),
    # -- sessions --------------------------------------------------------------------------
    Mutant(
        id="append-expected-leaf",
        kind="expected-leaf",
        guards="an append's expected leaf, in its transaction (the single path)",
        file="storage/ops/session_rows.py",
        old="    if expected_leaf is not ANY_LEAF and expected_leaf != leaf:",
        new="    if False:",
        tests=_cases(
            "conformance/test_conformance_sessions.py::"
            "test_stale_expected_leaf_is_session_modified_and_adds_no_child"
        ),
    ),
    Mutant(
        id="append-expected-leaf-merged",
        kind="expected-leaf",
        guards="an append's expected leaf in DuckDB's merged appends (a group commit)",
        file="storage/ops/appends.py",
        old="        elif r.expected_leaf is not ANY_LEAF and r.expected_leaf != head[0]:",
        new="        elif False:",
        tests=(
            "backends/test_merged_appends.py::test_a_stale_expected_leaf_in_a_group_is_refused",
        ),
    ),
    Mutant(
        id="append-expected-leaf-one-statement",
        kind="expected-leaf",
        guards="an append's expected leaf in PostgreSQL's one-statement append (SQL)",
        file="storage/ops/appends.py",
        old='" AND o.leaf_id IS NOT DISTINCT FROM ?"',
        new='" AND (o.leaf_id IS NOT DISTINCT FROM ? OR TRUE)"',
        tests=(
            "conformance/test_conformance_sessions.py::"
            "test_stale_expected_leaf_is_session_modified_and_adds_no_child[postgres-sync]",
        ),
    ),
    Mutant(
        id="branch-expected-leaf",
        kind="expected-leaf",
        guards="a branch's (leaf move's) expected leaf",
        file="storage/ops/session_rows.py",
        old="    if expected_leaf is not ANY_LEAF and expected_leaf != row[0]:",
        new="    if False:",
        tests=_cases(
            "conformance/test_conformance_sessions.py::test_branch_moves_leaf_and_next_append_forks"
        ),
    ),
    # -- thread records --------------------------------------------------------------------
    Mutant(
        id="thread-key-absent",
        kind="key-absent",
        guards="finalize with require_key_absent refuses a bound key",
        file="storage/ops/threads.py",
        old="    if req.require_key_absent and bound_id is not None:",
        new="    if False:",
        tests=_cases(
            "conformance/test_conformance_threads.py::test_require_key_absent_refuses_with_nothing_written"
        ),
    ),
    Mutant(
        id="thread-key-absent-default",
        kind="key-absent",
        guards="require_key_absent is off unless asked: on by default, a save of a record "
        "whose key is bound (to itself) would be refused (found by the mutation net)",
        file="spec/records.py",
        old="    require_key_absent: bool = False\n",
        new="    require_key_absent: bool = True\n",
        tests=(
            *_cases("conformance/test_conformance_threads.py::test_save_is_an_upsert_by_record_id"),
            "checking/test_spec_survivors.py::test_every_flag_a_caller_leaves_out_of_a_record_is_off",
        ),
    ),
    Mutant(
        id="thread-one-active",
        kind="one-active",
        guards="a key bound to another record is refused without rebind_active",
        file="storage/ops/threads.py",
        old="    key_available = req.rebind_active or bound_id in (None, rec.id)",
        new="    key_available = True",
        tests=_cases(
            "conformance/test_conformance_threads.py::test_key_bound_elsewhere_without_rebind_is_refused"
        ),
    ),
    Mutant(
        id="thread-finalize-fence",
        kind="token",
        guards="finalize fences every held lease in its transaction",
        file="storage/ops/threads.py",
        old="    for lease in req.held_leases:\n        leases.fence(tx, lease)",
        new="    for lease in req.held_leases:\n        pass",
        tests=(f"{_FORGED}[duckdb-threads.finalize]", f"{_FORGED}[postgres-threads.finalize]"),
    ),
    # -- runs -------------------------------------------------------------------------------
    Mutant(
        id="run-one-active",
        kind="one-active",
        guards="admission refuses while the session has a non-terminal run",
        file="storage/ops/run_admission.py",
        old='    facts = {"no_active_run": current is None, "retry_allowed": not why}',
        new='    facts = {"no_active_run": True, "retry_allowed": not why}',
        tests=_cases(
            "conformance/test_conformance_runs.py::test_at_most_one_non_terminal_run_per_session"
        ),
    ),
    Mutant(
        id="run-submission-fingerprint",
        kind="submission-fingerprint",
        guards="the same submission key with another request conflicts",
        file="storage/ops/run_admission.py",
        old="            if not submissions.same_admission(tx, sub[0], sub[1], admission):",
        new="            if False:",
        tests=_cases(
            "conformance/test_conformance_runs.py::test_same_key_different_request_conflicts_naming_the_run"
        ),
    ),
    Mutant(
        id="run-retry-of-latest",
        kind="retry-of-latest",
        guards="a retry of an attempt that is not the intent's latest is refused",
        file="storage/ops/run_admission.py",
        old="        if latest is None or latest[0] != prev.attempt:",
        new="        if latest is None:",
        tests=_cases(
            "conformance/test_conformance_runs.py::test_retry_only_from_the_latest_terminal_attempt"
        ),
    ),
    Mutant(
        id="run-retry-session",
        kind="retry-session",
        guards="a retry of another session's run is refused",
        file="storage/ops/run_admission.py",
        old="        if prev.session_id != session_id:",
        new="        if False:",
        tests=_cases(
            "checking/test_pinned_guards.py::test_admit_run_refuses_a_retry_of_another_sessions_run"
        ),
    ),
    Mutant(
        id="run-finish-again-plan-fence",
        kind="owner",
        guards="a repeated finish that writes the plan the first did not passes the fence first",
        file="storage/ops/run_lifecycle.py",
        old="                leases.fence_or_unheld(tx, session_target(run.session_id), lease)\n"
        "            outbox_plans.create_plan(tx, run, plan)",
        new="                pass\n            outbox_plans.create_plan(tx, run, plan)",
        tests=_cases(
            "checking/test_run_survivors.py::"
            "test_a_repeated_finish_that_adds_a_plan_passes_the_fence_and_one_that_has_it_returns"
        ),
    ),
    # -- recovery ---------------------------------------------------------------------------
    Mutant(
        id="recovery-epoch",
        kind="recovery-epoch",
        guards="converge/fail/detach need the epoch that began the recovery (equal, "
        "not merely not newer)",
        file="storage/ops/recovery.py",
        old="    if rec.lease_epoch != lease.epoch:",
        new="    if rec.lease_epoch > lease.epoch:",
        tests=(
            "checking/test_pinned_guards.py::"
            "test_a_newer_recovery_lease_cannot_end_a_recovery_it_never_began[duckdb-converge]",
            "checking/test_pinned_guards.py::"
            "test_a_newer_recovery_lease_cannot_end_a_recovery_it_never_began[postgres-converge]",
        ),
    ),
    Mutant(
        id="recovery-supersede",
        kind="recovery-supersede",
        guards="only a newer epoch supersedes a recovery; the same lease gets it back",
        file="storage/ops/recovery.py",
        old='        "superseded": rec is not None and rec.lease_epoch < lease.epoch,',
        new='        "superseded": rec is not None and rec.lease_epoch <= lease.epoch,',
        tests=_cases(
            "checking/test_pinned_guards.py::test_begin_recovery_again_under_the_same_lease_returns_the_recovery"
        ),
    ),
    # -- the outbox -------------------------------------------------------------------------
    Mutant(
        id="delivery-claim-epoch",
        kind="claim-epoch",
        guards="a delivery update under an old claim epoch of the same owner is refused",
        file="storage/ops/outbox.py",
        old="    if op.lease_owner != owner or op.lease_epoch != epoch:",
        new="    if op.lease_owner != owner:",
        tests=_cases(
            "checking/test_pinned_guards.py::"
            "test_a_delivery_update_under_an_old_claim_epoch_of_the_same_owner_is_refused"
        ),
    ),
    Mutant(
        id="delivery-claim-owner",
        kind="claim-epoch",
        guards="a delivery update by another owner is refused",
        file="storage/ops/outbox.py",
        old="    if op.lease_owner != owner or op.lease_epoch != epoch:",
        new="    if op.lease_epoch != epoch:",
        tests=_cases(
            "conformance/test_delivery.py::test_an_update_by_another_owner_under_the_current_epoch_is_refused"
        ),
    ),
    Mutant(
        id="delivery-claim-expiry",
        kind="claim-expiry",
        guards="an update under an expired claim is refused (at its fence and again at "
        "COMMIT: both left out)",
        file="storage/ops/outbox.py",
        old="    if op.lease_expires_at is None or op.lease_expires_at <= tx.clock_after_locks():\n"
        "        raise lost\n    tx.valid_until(op.lease_expires_at, lost)",
        new="    if op.lease_expires_at is None:\n        raise lost",
        tests=_cases(
            "conformance/test_delivery.py::test_terminal_results_are_fenced_and_idempotent"
        ),
    ),
    Mutant(
        id="delivery-claim-expiry-boundary",
        kind="claim-expiry",
        guards="at exactly its expiry a claim updates nothing (the instant counted live at "
        "the fence and at COMMIT)",
        file="storage/ops/outbox.py",
        old="    if op.lease_expires_at is None or op.lease_expires_at <= tx.clock_after_locks():\n"
        "        raise lost\n    tx.valid_until(op.lease_expires_at, lost)",
        new="    if op.lease_expires_at is None or op.lease_expires_at < tx.clock_after_locks():\n"
        "        raise lost\n    if op.lease_expires_at > tx.clock_after_locks():\n"
        "        tx.valid_until(op.lease_expires_at, lost)",
        tests=_cases("conformance/test_delivery.py::test_a_claim_at_its_expiry_instant_is_expired"),
    ),
    Mutant(
        id="delivery-reclaim-live",
        kind="claim-expiry",
        guards="a live claim is not claimed again (busy)",
        file="storage/ops/outbox.py",
        old='        "claim_expired": op.lease_expires_at is not None '
        "and op.lease_expires_at <= now,",
        new='        "claim_expired": op.lease_expires_at is not None,',
        tests=_cases("conformance/test_delivery.py::test_an_expired_claim_is_listed_as_due"),
    ),
    # -- tool records -----------------------------------------------------------------------
    Mutant(
        id="tool-binding",
        kind="tool-binding",
        guards="an execution key bound to another call (scope, arguments) conflicts",
        file="storage/ops/tools.py",
        old="        differs = next((f for f in BINDING if getattr(found, f) != columns[f]), None)",
        new="        differs = None",
        tests=(
            "conformance/test_tool_executions.py::test_a_claim_from_another_session_is_refused[duckdb]",
            "conformance/test_tool_executions.py::test_a_claim_from_another_session_is_refused[postgres]",
        ),
    ),
    Mutant(
        id="tool-claim-confirmation",
        kind="tool-claim",
        guards="a side-effecting call is reclaimed only after a confirmed retry request",
        file="storage/ops/tool_records.py",
        old='    return {"side_effecting": rec.side_effecting}',
        new='    return {"side_effecting": False}',
        tests=_cases(
            "conformance/test_tool_executions.py::"
            "test_a_side_effecting_call_is_never_rerun_without_an_explicit_request"
        ),
    ),
    Mutant(
        id="tool-claim-run-session",
        kind="tool-claim",
        guards="a claim names a run of its own session",
        file="storage/ops/tools.py",
        old="        if run.session_id != session_id:",
        new="        if False:",
        tests=_cases(
            "conformance/test_tool_executions.py::test_claim_needs_the_session_and_a_run_of_that_session"
        ),
    ),
    # -- forks ------------------------------------------------------------------------------
    Mutant(
        id="fork-dedupe",
        kind="fork-dedupe",
        guards="the same request id returns the same fork",
        file="storage/ops/forks.py",
        old="    if stored is not None:\n        if stored[0] != req.fingerprint:",
        new="    if False:\n        if stored[0] != req.fingerprint:",
        tests=_cases("conformance/test_forks.py::test_the_same_request_id_returns_the_same_fork"),
    ),
    Mutant(
        id="fork-request-conflict",
        kind="fork-dedupe",
        guards="another request under the same fork request id conflicts",
        file="storage/ops/forks.py",
        old="        if stored[0] != req.fingerprint:",
        new="        if False:",
        tests=("conformance/test_forks.py::test_a_different_request_under_the_same_id_conflicts",),
    ),
    # -- schema -----------------------------------------------------------------------------
    Mutant(
        id="schema-newer",
        kind="schema-newer",
        guards="a database written by a newer turnkeeper is refused",
        file="storage/store.py",
        old="        if found > SCHEMA_VERSION:",
        new="        if False:",
        tests=("stateful/test_scenarios.py::test_newer_schema_is_refused_naming_both_versions",),
    ),
    Mutant(
        id="schema-older-read-only",
        kind="schema-older",
        guards="a read-only open refuses an older schema (it cannot migrate)",
        file="storage/store.py",
        old="        if found != SCHEMA_VERSION:",
        new="        if not found:",
        tests=("checking/test_pinned_guards.py::test_a_read_only_open_refuses_an_older_schema",),
    ),
    Mutant(
        id="migration-lock",
        kind="migration-lock",
        guards="PostgreSQL migrations take an advisory lock: two openers migrate in turn",
        file="storage/postgres/db.py",
        old='        tx.exec("SELECT pg_advisory_xact_lock(?)", [MIGRATION_LOCK])',
        new='        tx.exec("SELECT CAST(? AS BIGINT)", [MIGRATION_LOCK])',
        tests=(
            "backends/test_postgres_migration_lock.py::"
            "test_a_second_opener_waits_for_the_first_openers_migration",
        ),
    ),
    # -- pairing ----------------------------------------------------------------------------
    Mutant(
        id="pairing-refuse",
        kind="pairing",
        guards="a write whose entries break the tool-call pairing rule is refused",
        file="storage/ops/pairing_checks.py",
        old="    if not faults:\n        return",
        new="    if True:\n        return",
        tests=_cases(
            "guards/test_transcript_pairing.py::"
            "test_issue_example_a_message_while_a_call_is_unanswered_is_refused"
        ),
    ),
    # -- store.query() ----------------------------------------------------------------------
    Mutant(
        id="query-duckdb-one-select",
        kind="read-only-query",
        guards="DuckDB: one SELECT statement, nothing else (a SELECT among others refused)",
        file="storage/duck/query.py",
        old="    if kinds != [duckdb.StatementType.SELECT]:",
        new="    if duckdb.StatementType.SELECT not in kinds:",
        tests=(
            "conformance/test_query_readonly.py::"
            "test_every_statement_kind_but_a_read_is_refused[SELECT 1; DELETE FROM sessions]",
            "conformance/test_query_readonly.py::"
            "test_every_statement_kind_but_a_read_is_refused[SELECT 1; SELECT 2]",
        ),
    ),
    Mutant(
        id="query-duckdb-write-nodes",
        kind="read-only-query",
        guards="DuckDB: a SELECT holding a write node is refused",
        file="storage/duck/query.py",
        old="    writes = _nodes(tree) - READ_NODES",
        new="    writes = set()",
        tests=(
            "conformance/test_query_readonly.py::test_a_write_inside_a_read_is_refused"
            "[WITH d AS (DELETE FROM sessions RETURNING *) SELECT * FROM d]",
        ),
    ),
    Mutant(
        id="query-postgres-read-only",
        kind="read-only-query",
        guards="PostgreSQL: store.query() runs in a READ ONLY transaction (a locking read refused)",
        file="storage/postgres/db.py",
        old='        ro = ", READ ONLY" if self.read_only or not (commit or locking) else ""',
        new='        ro = ", READ ONLY" if self.read_only else ""',
        tests=(
            "backends/test_postgres_query.py::test_a_locking_read_is_refused_by_the_read_only_transaction",
        ),
    ),
    Mutant(
        id="query-postgres-one-statement",
        kind="read-only-query",
        guards="PostgreSQL: one statement (no ';' outside literals and comments)",
        file="storage/postgres/query.py",
        old='    if ";" in body:',
        new="    if False:",
        tests=("guards/test_hardening.py::test_query_only_reads",),
    ),
    # -- DuckDB group commit ----------------------------------------------------------------
    Mutant(
        id="group-failing-write-alone",
        kind="group-commit-isolation",
        guards="a write failing in a group keeps nothing and fails no other",
        file="storage/duck/group.py",
        old="                    failed = at\n                    break",
        new="                    outcomes = [exc] * (end - at)",
        tests=(
            "backends/test_group_commit.py::test_a_failing_write_in_a_group_fails_alone_and_keeps_nothing",
        ),
    ),
    Mutant(
        id="group-lapsed-lease",
        kind="group-commit-isolation",
        guards="a grouped write whose lease expired before the group's COMMIT runs alone "
        "(and is refused)",
        file="storage/duck/group.py",
        old="            if failed is None and (late := tx.lapsed()) is not None:",
        new="            if False and (late := tx.lapsed()) is not None:",
        tests=(
            "guards/test_fence_after_lock.py::"
            "test_a_grouped_write_whose_lease_expired_before_the_commit_is_refused",
        ),
    ),
    # -- the ledger -------------------------------------------------------------------------
    Mutant(
        id="ledger-writer-epoch",
        kind="ledger-writer-fence",
        guards="an append needs the ledger's newest fence to be the writer's epoch",
        file="storage/ops/ledger/journal.py",
        old="    if ledger_epoch != lease.epoch:",
        new="    if False:",
        tests=_cases(
            "ledger/test_ledger.py::test_the_ledger_epoch_fence_refuses_a_writer_another_epoch_fenced_out"
        ),
    ),
    Mutant(
        id="ledger-open-tip",
        kind="ledger-tip-seq",
        guards="opening a writer compares the tip it read (a lost race is a conflict)",
        file="storage/ops/ledger/journal.py",
        old='        "open", "opening", {"lease_held": True, '
        '"tip_unmoved": tip_unmoved(expected, found)}',
        new='        "open", "opening", {"lease_held": True, "tip_unmoved": True}',
        tests=_cases(
            "ledger/test_ledger.py::test_an_opening_fence_whose_tip_moved_conflicts_and_releases_the_grant"
        ),
    ),
    Mutant(
        id="ledger-replay-gap",
        kind="ledger-tip-seq",
        guards="replay's gap fence: a missing record fails the replay closed",
        file="storage/ops/ledger/replay.py",
        old="    return seq == expected",
        new="    return True",
        tests=_cases(
            "ledger/test_ledger.py::"
            "test_replay_of_a_missing_record_or_a_lost_tail_or_a_failed_read_is_a_read_error"
        ),
    ),
    Mutant(
        id="ledger-replay-epoch",
        kind="ledger-tip-seq",
        guards="replay refuses a record stamped with another epoch than its fence's",
        file="storage/ops/ledger/replay.py",
        old="    if epoch != fence_epoch:",
        new="    if False:",
        tests=_cases(
            "ledger/test_ledger.py::"
            "test_control_both_append_fences_patched_out_a_stale_append_lands_and_replay_refuses_it"
        ),
    ),
    Mutant(
        id="ledger-replay-fence-order",
        kind="ledger-tip-seq",
        guards="replay refuses a fence below an earlier fence's epoch",
        file="storage/ops/ledger/replay.py",
        old="        if epoch < fence_epoch:",
        new="        if False:",
        tests=_cases(
            "ledger/test_ledger.py::test_replay_refuses_a_fence_below_an_earlier_fences_epoch"
        ),
    ),
    Mutant(
        id="ledger-gc-lease",
        kind="ledger-gc-fence",
        guards="GC's condemn transaction fences the lease (held, unexpired)",
        file="storage/ops/ledger/gc.py",
        old="    leases.fence(tx, lease)\n    _, ledger_epoch = journal.read_tip("
        "tx, tenant, session_id, lock=True)",
        new="    _, ledger_epoch = journal.read_tip(tx, tenant, session_id, lock=True)",
        tests=(f"{_FORGED}[duckdb-ledger.gc]", f"{_FORGED}[postgres-ledger.gc]"),
    ),
    Mutant(
        id="ledger-blob-hash",
        kind="ledger-blob-hash",
        guards="replay verifies a blob's sha256 against its pointer",
        file="storage/ops/ledger/blobs.py",
        old="    if not blob_hash_ok(want, got):",
        new="    if False:",
        tests=(
            "ledger/test_ledger_blobs.py::"
            "test_a_flipped_blob_byte_is_an_integrity_error_and_the_hash_fence_can_fail",
        ),
    ),
    Mutant(
        id="ledger-blob-pointer-id",
        kind="ledger-blob-hash",
        guards="a blob carrying another idempotency id than its pointer is refused",
        file="storage/ops/ledger/blobs.py",
        old="    if inner_id != outer_id:",
        new="    if False:",
        tests=(
            "ledger/test_ledger_blobs.py::"
            "test_a_blob_carrying_another_id_than_its_pointer_is_a_pointer_id_mismatch",
        ),
    ),
    Mutant(
        id="ledger-payload-hash",
        kind="ledger-blob-hash",
        guards="replay verifies a record's payload against its stored sha256",
        file="storage/ops/ledger/records.py",
        old="    if not (isinstance(digest, str) and "
        "hmac.compare_digest(sha256(bytes(payload)), digest)):",
        new="    if False:",
        tests=_cases(
            "ledger/test_ledger.py::"
            "test_replay_of_a_flipped_or_truncated_payload_is_a_decode_error_at_its_sequence"
        ),
    ),
    # -- channel bindings -------------------------------------------------------------------
    Mutant(
        id="binding-fence",
        kind="bindings",
        guards="binding writes fence the session's lease (or find it unheld)",
        file="storage/ops/bindings.py",
        old="    channel = binding_of(tx, session_id)\n"
        "    leases.fence_or_unheld(tx, session_target(session_id), lease)",
        new="    channel = binding_of(tx, session_id)",
        tests=_cases(
            "conformance/test_bindings.py::test_binding_writes_obey_the_session_write_rule"
        ),
    ),
    Mutant(
        id="binding-channel-taken",
        kind="bindings",
        guards="a channel bound to another session is refused",
        file="storage/ops/bindings.py",
        old="    other = bound_to(tx, channel)\n    if other is not None:\n",
        new="    other = bound_to(tx, channel)\n    if False:\n",
        tests=_cases("conformance/test_bindings.py::test_the_typed_checks_hold"),
    ),
    Mutant(
        id="binding-transfer-compare",
        kind="bindings",
        guards="a transfer moves the binding only from the session it is bound to",
        file="storage/ops/bindings.py",
        old="    if bound != from_id:",
        new="    if bound is None:",
        tests=_cases("conformance/test_bindings.py::test_the_typed_checks_hold"),
    ),
    # -- deletes and retention --------------------------------------------------------------
    Mutant(
        id="delete-fence",
        kind="deletes",
        guards="a delete fences the session's lease (or finds it unheld)",
        file="storage/ops/deletes.py",
        old="        raise errors.SessionNotFoundError(session_id)\n"
        "    leases.fence_or_unheld(tx, session_target(session_id), lease)",
        new="        raise errors.SessionNotFoundError(session_id)",
        tests=_cases("conformance/test_delete.py::test_a_stale_or_foreign_lease_deletes_nothing"),
    ),
    Mutant(
        id="delete-active-run",
        kind="deletes",
        guards="a session with a non-terminal run is not deleted",
        file="storage/ops/deletes.py",
        old="    if active is not None:\n"
        "        raise errors.SessionRunActiveError(session_id, active[0])",
        new="    if False:\n        raise errors.SessionRunActiveError(session_id, active[0])",
        tests=_cases(
            "conformance/test_delete.py::test_a_session_with_a_run_not_terminal_is_refused"
        ),
    ),
    Mutant(
        id="delete-id-reuse",
        kind="deletes",
        guards="a deleted session's id is never reused",
        file="storage/ops/deletes.py",
        old='    if tx.one("SELECT 1 FROM deleted_sessions WHERE session_id = ?", '
        "[session_id]) is not None:",
        new="    if False:",
        tests=_cases(
            "conformance/test_delete.py::"
            "test_a_deleted_session_is_gone_for_every_write_and_its_id_is_never_reused"
        ),
    ),
    Mutant(
        id="retention-lease-fence",
        kind="deletes",
        guards="each retention delete fences the pass's lease (a pass whose lease expired "
        "meanwhile deletes nothing more)",
        file="storage/ops/deletes.py",
        old="    leases.fence(tx, lease)\n    heads = _family_heads(tx, session_id)",
        new="    heads = _family_heads(tx, session_id)",
        tests=_cases("conformance/test_retention.py::test_a_pass_stops_when_its_lease_is_lost"),
    ),
    Mutant(
        id="retention-changed",
        kind="deletes",
        guards="retention keeps a session written since its pass read it",
        file="storage/ops/deletes.py",
        old="    if heads != expect:",
        new="    if False:",
        tests=_cases(
            "conformance/test_retention.py::test_a_session_written_after_the_choice_is_kept"
        ),
    ),
)
"""The catalog, grouped by area."""

EQUIVALENT: dict[str, str] = {
    "leases.unexpired: the fence's own expiry check alone": (
        "the same expiry is judged again at COMMIT (Tx.valid_until: DuckDB's Tx.lapsed, "
        "PostgreSQL's commit check), which refuses with the same LeaseLostError and "
        "nothing written; mutant lease-fence-expiry removes both, and "
        "lease-commit-expiry-duckdb and lease-commit-expiry-postgres the second alone"
    ),
    "ledger journal._move_tip: the tip's compare-and-set (AND seq = ?)": (
        "the tip row is read locked in the same transaction (read_tip(lock=True): FOR "
        "UPDATE on PostgreSQL; DuckDB's writes of a file are serialized in process), and a "
        "record at a taken sequence violates ledger_records' primary key: no interleaving "
        "reaches the comparison with another tip (a lowered tip is LedgerTipDamagedError "
        "first: journal.refuse_past_tip, ledger/test_ledger.py)"
    ),
}
"""Guards looked at and left without a mutant: no fixed test can tell the
mutant from the shipped code (another guard refuses the same thing first or
as well). Each says why."""
