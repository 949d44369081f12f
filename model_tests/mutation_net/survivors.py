"""Every survivor of the second mutation net, classified.

A survivor is a mutant whose area's tests all passed. Each gets an entry here,
keyed by :class:`Site`: its file (inside the installed ``turnkeeper/``), the
cosmic-ray operator and the text of the mutated source line, stripped (found
in the file at least once, else the entry is stale: ``checking/test_mutation_net.py``
checks it). Its :class:`Verdict` is either

- ``equivalent``: no test can tell the mutant from the shipped code; ``why``
  says why; or
- ``killed``: a real hole, closed since by the fixed tests ``tests`` (node ids
  relative to ``model_tests/``; they fail with the mutant applied and pass on
  the real code). When it is a fence or guard, the fence-mutant catalog
  (``mutants/catalog.py``) carries it too, under ``catalog``.

The report (``reports/MUTATION_NET.md``) reads this list; a survivor without
an entry makes ``make mutation-net`` fail.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Site:
    """Where a mutant is: file inside ``turnkeeper/``, operator, stripped source line."""

    file: str
    operator: str
    line: str


@dataclass(frozen=True)
class Verdict:
    """What a survivor is: ``equivalent`` (with ``why``) or ``killed`` (by ``tests``)."""

    kind: str  # "equivalent" or "killed"
    why: str
    tests: tuple[str, ...] = ()
    catalog: str = ""  # the fence-mutant catalog's id, for a fence or guard


KINDS = ("equivalent", "killed")

_TOOLS = "spec/tool_execution.py"
_LIFECYCLE = "spec/lifecycle.py"
_ENTRIES = "spec/entries.py"
_RECORDS = "spec/records.py"
_ERRORS = "spec/errors.py"
_USAGE = "spec/usage.py"
_TOTAL = "total = sum(known) if len(known) == len(parts) and sum(known) <= MAX_TOKENS else None"
_RUNNING = '+ (", once the record is interrupted)" if self.source == "running" else ")"),'
_NO_KIND = 'if not isinstance(kind, str) or not kind or kind == "session":'
_LABEL = 'if kind == EntryKind.LABEL and not isinstance(payload.get("label", ""), str):'
_SPEC_KILLS = "checking/test_spec_survivors.py::"
_EDGES = f"{_SPEC_KILLS}test_usage_at_the_edges_a_total_at_the_bound_and_a_prompt_all_cached"
_FLAGS = f"{_SPEC_KILLS}test_every_flag_a_caller_leaves_out_of_a_record_is_off"
_REBUILT = (
    f"{_SPEC_KILLS}test_a_rebuilt_result_keeps_in_details_only_a_value_without_content_form",
    "conformance/test_recovery.py::test_a_recorded_result_keeps_every_value_it_was_given",
)
_OPENAI = (
    f"{_SPEC_KILLS}test_an_openai_tool_message_carries_text_and_blocks_as_they_are_other_values_as_json",
)
_LEASES = "storage/ops/leases.py"
_VALIDATE = "storage/validate.py"
_STORAGE_KILLS = "checking/test_storage_survivors.py::"
_HOLDS = f"{_STORAGE_KILLS}test_fence_holds_on_the_held_row_of_exactly_this_lease"
_MANY = f"{_STORAGE_KILLS}test_fence_many_judges_each_lease_as_fence_does_alone"
_TTL = (
    f"{_STORAGE_KILLS}test_a_ttl_that_is_no_such_duration_is_refused",
    f"{_STORAGE_KILLS}test_seconds_out_of_zero_to_ten_years_are_refused",
)
_SECONDS = (
    f"{_STORAGE_KILLS}test_seconds_take_zero_by_default",
    f"{_STORAGE_KILLS}test_seconds_out_of_zero_to_ten_years_are_refused",
)
_REQUEST = (
    f"{_STORAGE_KILLS}test_a_finalize_request_has_real_flags_and_a_list_of_well_formed_leases",
)
_HEADER = (f"{_STORAGE_KILLS}test_a_header_is_a_mapping_with_string_keys_or_none",)
_PLAN = (
    f"{_STORAGE_KILLS}test_a_plan_with_well_formed_steps_each_depending_on_an_earlier_one_is_taken",
    f"{_STORAGE_KILLS}test_a_malformed_plan_is_refused_naming_its_field",
)
_FLAGS_WHY = (
    "a real hole: how the lease operations ask for their writes (exclusive=False: on "
    "DuckDB a heartbeat skips the write lock and never waits behind another thread's long "
    "write; transaction=False: one autocommit statement) changes no result a "
    "single-threaded test reads; a store test now reads the flags each one passes to "
    "db.write"
)
_WRITE_FLAGS = (
    f"{_STORAGE_KILLS}test_a_heartbeat_skips_the_write_lock_and_a_release_or_check_is_one_statement",
)
_THREADS = "storage/ops/threads.py"
_THREAD_KILLS = "checking/test_thread_survivors.py::"
_UNBIND = "if prev[0] == rec.key and bound_id == req.previous_id:"
_UNBIND_WHY = (
    "a real hole: every test that archived the key's active record rebound the key too; "
    "a store test now archives it without rebind_active and the new record takes the key"
)
_FREES = (f"{_THREAD_KILLS}test_archiving_the_keys_active_record_frees_the_key_without_a_rebind",)
_OUTBOX = "storage/ops/outbox.py"
_OUTBOX_KILLS = "checking/test_outbox_survivors.py::"
_PROBE = "if locked is None and outbox_plans.get_operation(tx, operation_id) is not None:"
_PROBE_WHY = (
    "a real hole on PostgreSQL only: the SKIP LOCKED probe exists on the server alone (DuckDB "
    "has no row locks, and the net runs DuckDB only, so it survives there); no test claimed "
    "an operation whose row another transaction held. Two PostgreSQL tests now kill it "
    "(checked with the mutant applied against a test server)"
)
_BUSY_AT_ONCE = (
    f"{_OUTBOX_KILLS}test_a_claim_of_an_operation_another_transaction_holds_is_busy_at_once",
    f"{_OUTBOX_KILLS}test_a_claim_of_no_such_operation_is_not_found_on_the_server",
)
_CLAIM_EXPIRY = "if op.lease_expires_at is None or op.lease_expires_at <= tx.clock_after_locks():"
_RECHECKED_WHY = (
    "the fence's expiry check is judged again right before COMMIT (Tx.valid_until, with <=, "
    "at a clock read then, never earlier): a write the mutant lets past the fence under an "
    "expired claim (or one at its expiry instant) is refused there with the same "
    "DeliveryLeaseLostError and nothing of it commits; every trigger after the fence is an "
    "edge from both claimed states, so no other error can come first. The catalog's "
    "delivery-claim-expiry entries break both checks together; a claimed operation always "
    "has an expiry, so the None case is never met"
)
_JOURNAL = "storage/ops/ledger/journal.py"
_TIP_LOCKED = (
    "ledger/test_ledger.py::test_records_round_trip_in_a_gapless_one_based_sequence_after_the_fence",
)
_TIP_LOCKED_WHY = (
    "killed on PostgreSQL by the area's own test (its PostgreSQL case: a replay's snapshot "
    "read is READ ONLY, where a locking read of the tip is an error; checked with the "
    "mutant applied against a test server); it survives the net only because the net runs "
    "DuckDB, where update_lock() is empty"
)
_TIP_ORDERED_WHY = (
    "every writer of a ledger's tip (open, append, GC) first passes leases.fence on the "
    "session's lease, which on PostgreSQL row-locks the lease row (UPDATE … fenced_writes) "
    "until COMMIT, so no two of them interleave; the tip's own FOR UPDATE is a second lock "
    "on an order already fixed, and _move_tip is a compare-and-set whose failure retries "
    "besides. On DuckDB update_lock() is empty. (Checked on both engines: the ledger, group "
    "and GC-fence tests pass with the mutant)"
)
_KNOWN_KEY_WHY = (
    "a hole in the net's test choice: an inline redelivery of an offloaded original is "
    "judged by the original pointer's blob key, pinned by "
    "ledger/test_ledger_redelivery_threshold.py, now among storage-ledger's tests"
)
_KNOWN_KEY = (
    "ledger/test_ledger_redelivery_threshold.py::"
    "test_an_inline_redelivery_of_an_offloaded_original_is_a_duplicate",
)
_STALE_BLOB = "sealing.current_blobs(tx, session_id, new, logical or entries, blob_versions or {})"
_STALE_BLOB_WHY = (
    "a hole in the net's test choice: a key rotation between a blob's put and its "
    "pointer's append, pinned by ledger/test_ledger_blob_races.py (the blob is sealed "
    "again from the entry as given, and one outside the database is judged by the version "
    "it was put under), now among storage-ledger's tests"
)
_RACES = (
    "ledger/test_ledger_blob_races.py::"
    "test_a_rotation_between_a_blobs_put_and_its_append_leaves_it_readable",
)
_FORKS = "storage/ops/forks.py"
_FORK_KILLS = "checking/test_fork_survivors.py::"
_TAKEN = 'fid, detail=None if taken[0] == 1 else "a deleted session\'s id is never reused"'
_TAKEN_WHY = (
    "a real hole: no test read why a fork into a taken id was refused; a store test now "
    "forks into a live session's id and into a deleted one's"
)
_TAKEN_KILLS = (f"{_FORK_KILLS}test_a_fork_into_a_taken_id_says_whether_a_deleted_session_held_it",)
_DELETES = "storage/ops/deletes.py"
_DELETE_KILLS = "checking/test_delete_survivors.py::"
_RECOVERY = "storage/ops/recovery.py"
_SUBMISSIONS = "storage/ops/submissions.py"
_REMOTE = (
    "conformance/test_recovery_remote.py::test_a_detached_run_whose_remote_run_ended_is_an_orphan_again",
)
_REMOTE_WHY = (
    "a hole in the net's test choice: a detached run whose remote run ended is an orphan "
    "again and may be begun, pinned by conformance/test_recovery_remote.py, now among "
    "storage-runs' tests"
)
_OLDER_ROW = (
    "internals/test_upgrades.py::test_an_upgrade_keeps_every_retry_of_what_an_older_turnkeeper_stored",
)
_OLDER_ROW_WHY = (
    "a hole in the net's test choice: a submission row an older turnkeeper wrote (its request's "
    "digest, compared with what the store kept of the admission) is pinned by "
    "internals/test_upgrades.py, whose test of it is now among storage-runs' tests"
)
_RECOVERY_ARGS = (
    "checking/test_run_survivors.py::"
    "test_a_converge_to_no_run_status_and_a_fail_without_a_delay_are_refused",
)
_RECOVERY_ARGS_WHY = (
    "a real hole: no test converged a recovery to a status that is no run status or with an "
    "error or stop reason that is no text, or failed one with a zero backoff base or cap, "
    "or with the base equal to the cap; a store test now does each (a refusal is "
    "InvalidInputError naming the field, nothing written)"
)
_PARKED = (
    "checking/test_run_survivors.py::test_a_begin_on_a_dead_lettered_recovery_is_not_needed",
)
_PARKED_WHY = (
    "a real hole: no test began or converged a recovery the machine has no such edge from "
    "(a dead-lettered one, under the lease that parked it and under another; a run never "
    "begun); a store test now does: RecoveryNotNeededError or InvalidTransitionError naming "
    "the state, nothing written"
)
_STRICT_WHY = (
    "equivalent: both sides of the zip always have len(FENCED) items ({}), so "
    "strict=True never raises and strict=False drops nothing"
)
_REBUILT_WHY = (
    "a hole in the net's test choice: conformance/test_recovery.py pins it (not among spec-tools' "
    "tests then); a pure test of recorded_result now pins it in spec-tools' tests too"
)

_LIFE = "storage/ops/run_lifecycle.py"
_ADMIT = "storage/ops/run_admission.py"
_RUN_KILLS = "checking/test_run_survivors.py::"
_STATEMENTS = ("benchmarks/test_turn_statements.py::test_a_turn_costs_the_pinned_statements",)
_STATEMENTS_WHY = (
    "a hole in the net's test choice and in what was counted: benchmarks/"
    "test_turn_statements.py held the bench's turn to its statement ceilings but was not among "
    "storage-runs' tests, and no test counted the turns that return a stored run, repeat a "
    "finish or give a finish its entries; its new test pins each call's statements exactly, "
    "per engine, and storage-runs runs it (a held write is one statement with the next only "
    "on a server: that mutant is killed by the PostgreSQL case, and is equivalent on DuckDB, "
    "which runs each write at once)"
)
_FORGED_RUN_STEPS = tuple(
    "guards/test_forged_tokens.py::test_a_forged_token_is_refused_by_every_fenced_write"
    f"[duckdb-runs.{call}]"
    for call in ("start", "wait", "resume")
)
_SAVED = (
    "conformance/test_saved_intents.py::test_a_saved_intent_is_admitted_later_as_its_first_run",
)
_TURNS = (
    "conformance/test_conversation_turns.py::"
    "test_a_runtime_ends_a_turn_and_opens_the_next_which_the_runs_end_closes",
)
_ENTRIES_ONCE = (f"{_RUN_KILLS}test_an_unleased_finish_writes_its_entries_once",)
_ENTRIES_ONCE_WHY = (
    "a real hole: no test finished a run with entries and no lease (written at once, no head "
    "read with a fence to judge them at, so never deferred to go with the reply); a store "
    "test now does, with and without a lease, and finds each entry once"
)
_AGAIN = (
    f"{_RUN_KILLS}"
    "test_a_repeated_finish_that_adds_a_plan_passes_the_fence_and_one_that_has_it_returns",
)
_AGAIN_WHY = (
    "a real hole, a fence: no test repeated a finish that brings a plan the run has none "
    "of (a session write: it passes the fence first) or one it has (nothing written, no "
    "fence); a store test now does both under a forged lease, none and the holder's, and the "
    "fence-mutant catalog carries it"
)
_OWN_IDS = (f"{_RUN_KILLS}test_an_own_id_a_forged_entry_holds_refuses_the_finish",)
_TURN_ROW = (f"{_RUN_KILLS}test_a_run_whose_turn_row_is_gone_ends_without_a_turn_end",)

SURVIVORS: dict[Site, Verdict] = {
    # -- spec/tool_execution.py: how a tool's stored result becomes a message ---------
    Site(_TOOLS, "core/AddNot", "if not isinstance(result, str) and not is_content(result):"): (
        Verdict("killed", _REBUILT_WHY, _REBUILT)
    ),
    Site(
        _TOOLS,
        "core/ReplaceAndWithOr",
        "if not isinstance(result, str) and not is_content(result):",
    ): Verdict("killed", _REBUILT_WHY, _REBUILT),
    Site(_TOOLS, "core/AddNot", "if isinstance(result, str) or is_content(result):"): Verdict(
        "killed",
        "a real hole: no test read an OpenAI tool message's content for a text result "
        "(openai_content); a pure test now does",
        _OPENAI,
    ),
    Site(_TOOLS, "core/ReplaceOrWithAnd", "if isinstance(result, str) or is_content(result):"): (
        Verdict(
            "killed",
            "a real hole: no test gave openai_content content blocks or a text alone; "
            "a pure test now does",
            _OPENAI,
        )
    ),
    Site(
        _TOOLS,
        "core/ReplaceFalseWithTrue",
        'return json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)',
    ): Verdict(
        "killed",
        "a real hole: no test stored a non-ASCII value without content form; a pure test "
        "of result_json now does",
        (f"{_SPEC_KILLS}test_result_json_sorts_keys_drops_spaces_and_keeps_non_ascii",),
    ),
    Site(
        _TOOLS,
        "core/ReplaceAndWithOr",
        'isinstance(b, dict) and isinstance(b.get("type"), str) for b in value',
    ): Verdict(
        "killed",
        "a real hole: no test gave is_content a list whose items are not objects, or "
        "objects without a string type; a pure test now does",
        (f"{_SPEC_KILLS}test_content_blocks_are_a_list_of_objects_each_with_a_string_type",),
    ),
    Site(
        _TOOLS,
        "core/ReplaceFalseWithTrue",
        '"details": {"executionState": ToolExecutionState.INTERRUPTED.value, "recorded": False},',
    ): Verdict(
        "killed",
        "a real hole: no test read the details of an interrupted result that has no "
        "record; a pure test now does",
        (f"{_SPEC_KILLS}test_an_interrupted_result_without_a_record_says_it_has_none",),
    ),
    Site(_TOOLS, "core/ReplaceAndWithOr", "return isinstance(value, list) and all("): Verdict(
        "killed",
        "a real hole: no test gave is_content an object that is not a list; a pure test now does",
        (f"{_SPEC_KILLS}test_content_blocks_are_a_list_of_objects_each_with_a_string_type",),
    ),
    Site(
        _TOOLS,
        "core/ReplaceTrueWithFalse",
        'return json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)',
    ): Verdict(
        "killed",
        "a real hole: no test stored a result whose keys were out of order; a pure test "
        "of result_json now does",
        (f"{_SPEC_KILLS}test_result_json_sorts_keys_drops_spaces_and_keeps_non_ascii",),
    ),
    # -- spec/lifecycle.py: a lifecycle's own well-formedness checks ---------------------
    Site(_LIFECYCLE, "core/ZeroIterationForLoop", "for edge in self.edges:"): Verdict(
        "killed",
        "a real hole: every shipped lifecycle is well formed, so no test met the checks "
        "of an edge's states and guards; a pure test builds one flawed lifecycle per check",
        (f"{_SPEC_KILLS}test_a_lifecycle_refuses_malformed_data",),
    ),
    # -- spec/entries.py: validate_payload, the guard of every appended payload ----------
    Site(_ENTRIES, "core/ReplaceOrWithAnd", _NO_KIND): Verdict(
        "killed",
        "a real hole: with strict=True the unknown-kind check refuses the same kinds (same "
        "InvalidInputError field), so only strict=False (imports) tells them apart, and no "
        "test gave an import a non-string, empty or session kind; a pure test now does",
        (
            f"{_SPEC_KILLS}test_an_entry_kind_that_is_no_kind_is_refused_even_when_unknown_kinds_pass",
        ),
    ),
    Site(_ENTRIES, "core/AddNot", _LABEL): Verdict(
        "killed",
        "a real hole: no test appended a label entry whose label is not a string, nor "
        "another kind with a label field; a pure test now does both",
        (f"{_SPEC_KILLS}test_only_a_label_entry_needs_its_label_to_be_a_string",),
    ),
    Site(_ENTRIES, "core/ReplaceComparisonOperator_Eq_NotEq", _LABEL): Verdict(
        "killed",
        "a real hole (as the AddNot mutant of the same line); the same pure test",
        (f"{_SPEC_KILLS}test_only_a_label_entry_needs_its_label_to_be_a_string",),
    ),
    # -- spec/records.py: the defaults of the records' flags --------------------------
    Site(_RECORDS, "core/ReplaceFalseWithTrue", "require_key_absent: bool = False"): Verdict(
        "killed",
        "a real hole, and a guard: FinalizeRequest's require_key_absent defaulting to on "
        "refuses a save of a record whose key is bound to itself; the net's spec-records "
        "tests never finalized (test_conformance_threads does); a pure test now pins every "
        "flag's default",
        (_FLAGS, "conformance/test_conformance_threads.py::test_save_is_an_upsert_by_record_id"),
        catalog="thread-key-absent-default",
    ),
    **{
        Site(_RECORDS, "core/ReplaceFalseWithTrue", f"{flag}: bool = False"): Verdict(
            "killed",
            f"a real hole: no test built the record without {flag} and read it back; a pure "
            "test now pins every flag's default (off)",
            (_FLAGS,),
        )
        for flag in ("multi_agent", "cancel_requested", "pinned")
    },
    # -- spec/errors.py: what an error tells its reader ---------------------------------
    Site(_ERRORS, "core/ReplaceComparisonOperator_Eq_NotEq", 'if self.source == "completed"'): (
        Verdict(
            "killed",
            "a real hole: no test read a refused reclaim's advice per state (a completed "
            "record's result is kept, an abandoned one's run makes a new call); a pure test "
            "now does",
            (f"{_SPEC_KILLS}test_a_refused_reclaim_says_what_to_do_for_each_state",),
        )
    ),
    Site(_ERRORS, "core/ReplaceComparisonOperator_Eq_NotEq", _RUNNING): Verdict(
        "killed",
        "a real hole: no test read the advice for a running side-effecting record (it is "
        "interrupted first); the same pure test",
        (f"{_SPEC_KILLS}test_a_refused_reclaim_says_what_to_do_for_each_state",),
    ),
    Site(_ERRORS, "core/AddNot", 'return f"{text}: {self.detail}" if self.detail else text'): (
        Verdict(
            "killed",
            "a real hole: no test read a pairing error without a detail (its own _message, "
            "not the root's); pure tests now read, with and without a detail, each error "
            "whose _message has this line (the root, pairing, unanswered calls, reclaim)",
            (
                f"{_SPEC_KILLS}test_a_pairing_error_names_the_first_open_call_and_keeps_its_detail",
                f"{_SPEC_KILLS}test_a_refused_reclaim_says_what_to_do_for_each_state",
                f"{_SPEC_KILLS}test_an_error_sets_its_fields_from_positions_and_names_and_refuses_others",
            ),
        )
    ),
    Site(_ERRORS, "core/AddNot", 'self.tool_call_id = ids[0] if ids else ""'): Verdict(
        "killed",
        "a real hole: no test read ToolCallsUnansweredError.tool_call_id (the first open "
        "call); a pure test now does",
        (f"{_SPEC_KILLS}test_a_pairing_error_names_the_first_open_call_and_keeps_its_detail",),
    ),
    # -- spec/usage.py: usage figures (its run met the bounds tests written after a
    # -- partial run that found them; these four remained) -------------------------
    Site(_USAGE, "core/ReplaceComparisonOperator_LtE_Lt", _TOTAL): Verdict(
        "killed",
        "a real hole: no test gave an Anthropic usage whose parts sum to exactly MAX_TOKENS "
        "(a total at the bound is kept); a pure test now does",
        (_EDGES,),
    ),
    Site(_USAGE, "core/AddNot", 'return value if isinstance(value, str) else ""'): Verdict(
        "killed",
        "a real hole: no test of the net's choice read text_of; a pure test now does",
        (f"{_SPEC_KILLS}test_text_of_is_a_string_field_or_empty",),
    ),
    Site(_USAGE, "core/ReplaceComparisonOperator_Gt_GtE", "if cached > prompt:"): Verdict(
        "killed",
        "a real hole: no test gave a prompt whose every token was cached (allowed: none "
        "new); a pure test now does, and one with more cached than prompt tokens",
        (_EDGES,),
    ),
    Site(_USAGE, "core/AddNot", 'found = " and ".join(shapes) if shapes else "none"'): Verdict(
        "killed",
        "a real hole: no test read which shapes a usage object of two shapes (or none) "
        "showed; a pure test now does",
        (f"{_SPEC_KILLS}test_a_usage_object_of_no_shape_or_two_says_which_it_found",),
    ),
    # -- storage/ops/leases.py (area storage-leases) ----------------------------------
    Site(
        _LEASES,
        "core/ReplaceOrWithAnd",
        'run_id or "", f"session {session_id!r} has no active run"',
    ): (
        Verdict(
            "killed",
            "a real hole: no test read the run id of a refused recovery lease (the run named, "
            "or empty: the mutant gives None or empty); a store test now does",
            (
                f"{_STORAGE_KILLS}test_a_recovery_lease_on_an_idle_session_names_the_run_it_was_asked_for",
            ),
        )
    ),
    Site(
        _LEASES, "core/ReplaceComparisonOperator_IsNot_Is", "mine is not None and mine == theirs"
    ): (
        Verdict(
            "killed",
            "a real hole: the net's tests only saw fence_holds refuse (a forged token in a "
            "merged append); the mutant refuses every row, so no merged append could pass. "
            "A pure test now reads fence_holds on the held row of the lease and on each "
            "column changed or NULL",
            (_HOLDS,),
        )
    ),
    Site(
        _LEASES,
        "core/ReplaceTrueWithFalse",
        "for mine, theirs in zip(fenced, fence_values(lease), strict=True)",
    ): (
        Verdict(
            "equivalent",
            _STRICT_WHY.format(
                "row[:len(FENCED)] and fence_values; a row shorter than len(FENCED) + 1 "
                "raises IndexError at row[len(FENCED)] before the zip"
            ),
        )
    ),
    Site(_LEASES, "core/ZeroIterationForLoop", "for i, lease in enumerate(held):"): Verdict(
        "killed",
        "a real hole in the net's test choice, and a fence: fence_many answered no lease, so "
        "a ledger group judged none of its members by its lease fence; the area's tests "
        "never call it (ledger/test_ledger_group.py, outside them, kills it on DuckDB: a released "
        "member's append goes through). A store test now reads its answer per lease "
        "(taken over, relabelled, at its expiry instant, live), on both engines",
        (
            _MANY,
            "ledger/test_ledger_group.py::test_one_members_lost_lease_or_bad_input_fails_only_that_member[duckdb]",
        ),
        catalog="lease-group-fence",
    ),
    Site(
        _LEASES,
        "core/ReplaceTrueWithFalse",
        'values = [v for c, v in zip(FENCED, fence_values(lease), strict=True) if c != "purpose"]',
    ): Verdict("equivalent", _STRICT_WHY.format("FENCED and fence_values(lease)")),
    Site(
        _LEASES, "core/ReplaceComparisonOperator_Eq_NotEq", "mine is not None and mine == theirs"
    ): (
        Verdict(
            "killed",
            "a real hole (as the IsNot_Is mutant of the same line: the net's tests only saw "
            "fence_holds refuse); the same pure test",
            (_HOLDS,),
        )
    ),
    Site(
        _LEASES,
        "core/ReplaceFalseWithTrue",
        'return self._fenced("renew_lease", lease, lambda tx: renew(tx, lease, ttl), '
        "exclusive=False)",
    ): Verdict("killed", _FLAGS_WHY, _WRITE_FLAGS),
    # -- storage/validate.py (area storage-leases): argument checks ---------------------
    Site(
        _VALIDATE,
        "core/ReplaceComparisonOperator_LtE_Lt",
        "if isinstance(value, bool) or not isinstance(value, int) "
        "or not minimum <= value <= MAX_INT:",
    ): Verdict(
        "killed",
        "a real hole: no test of the net's choice gave check_int its bounds (the minimum, "
        "2**63 - 1: both taken); a pure test now does (either comparison made strict)",
        (f"{_STORAGE_KILLS}test_check_int_takes_an_int_from_its_minimum_to_a_bigints_largest",),
    ),
    Site(_VALIDATE, "core/AddNot", "if step.entry_id is not None:"): Verdict(
        "killed",
        "a real hole in the net's test choice: no lease test writes a delivery plan; pure "
        "tests of check_plan now take a step without an entry id and refuse an empty one",
        _PLAN,
    ),
    Site(
        _VALIDATE,
        "core/AddNot",
        "if not isinstance(header, Mapping) or not all(isinstance(k, str) for k in header):",
    ): Verdict(
        "killed",
        "a real hole in the net's test choice: no lease test passes a header; a pure test "
        "of check_header now does",
        _HEADER,
    ),
    Site(
        _VALIDATE,
        "core/ReplaceOrWithAnd",
        "if not isinstance(held, Sequence) or isinstance(held, str | Lease):",
    ): Verdict(
        "killed",
        "a real hole: no test gave a finalize request text for held_leases (refused as "
        "not a list, not item by item); a pure test of check_request now does",
        _REQUEST,
    ),
    Site(
        _VALIDATE,
        "core/ReplaceComparisonOperator_GtE_Gt",
        "low_ok = isinstance(value, int | float) and (value >= 0 if allow_zero else value > 0)",
    ): Verdict(
        "killed",
        "a real hole in the net's test choice: the lease tests check only ttl_s (zero "
        "refused); a pure test now gives check_seconds zero (taken by default)",
        _SECONDS,
    ),
    Site(_VALIDATE, "core/AddNot", 'low = "0 <=" if allow_zero else "0 <"'): Verdict(
        "killed",
        "a real hole: no test read the bound a refused duration states; pure tests now do, "
        "for ttl_s (0 <) and a duration that may be zero (0 <=)",
        _TTL,
    ),
    Site(_VALIDATE, "core/ZeroIterationForLoop", "for i, lease in enumerate(held):"): Verdict(
        "killed",
        "a real hole: no test of the net's choice gave a finalize request a malformed held "
        "lease (the fence would refuse it later, as another error); a pure test of "
        "check_request now does",
        _REQUEST,
    ),
    Site(_VALIDATE, "core/AddNot", "if not isinstance(step, DeliveryStep):"): Verdict(
        "killed",
        "a real hole in the net's test choice: no lease test writes a delivery plan; pure "
        "tests of check_plan now take well-formed steps and refuse a step that is none",
        _PLAN,
    ),
    Site(
        _VALIDATE,
        "core/ReplaceComparisonOperator_LtE_Lt",
        "if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:",
    ): Verdict(
        "killed",
        "a real hole in the net's test choice: no lease test reads a page; a pure test of "
        "check_limit now takes 1 and MAX_LIMIT (either comparison made strict refuses one)",
        (f"{_STORAGE_KILLS}test_check_limit_takes_an_int_from_one_to_the_largest_page",),
    ),
    # -- storage/ops/threads.py: thread-record finalize and resolve --------------------
    Site(_THREADS, "core/ReplaceAndWithOr", "if row is None and include_archived:"): Verdict(
        "killed",
        "a real hole: no test resolved a key with include_archived while an archived record "
        "of the key sorted before its active one; a store test now does (the same instant, "
        "a greater id)",
        (
            f"{_THREAD_KILLS}test_by_key_the_active_record_comes_before_an_archived_one_that_sorts_first",
        ),
    ),
    Site(_THREADS, "core/AddNot", "if req.archive_old and req.previous_id == rec.id:"): Verdict(
        "killed",
        "a real hole: no test asked a finalize to archive the record it saves, nor named it "
        "previous_id without archive_old; a store test now does both",
        (
            f"{_THREAD_KILLS}test_archiving_the_record_being_saved_is_refused_and_naming_it_alone_is_not",
        ),
    ),
    Site(
        _THREADS,
        "core/ZeroIterationForLoop",
        'for name in ("driver_type", "fingerprint", "compatibility_fingerprint", "session_codec"):',
    ): Verdict(
        "killed",
        "a real hole: no test gave a thread record a text field that is no storable text; a "
        "store test now gives each of the four a number and a lone surrogate",
        (f"{_THREAD_KILLS}test_each_text_field_of_a_record_is_checked_before_anything_is_written",),
    ),
    Site(_THREADS, "core/AddNot", _UNBIND): Verdict("killed", _UNBIND_WHY, _FREES),
    Site(_THREADS, "core/ReplaceComparisonOperator_Eq_NotEq", _UNBIND): Verdict(
        "killed", _UNBIND_WHY, _FREES
    ),
    Site(_THREADS, "core/ReplaceAndWithOr", _UNBIND): Verdict(
        "equivalent",
        "the two conditions are one: the key's mapping (bound_id, read before the archive) "
        "points at previous_id exactly when that active record is of rec.key, since every "
        "active record is mapped from its own key and a record never changes key (finalize "
        "refuses it); only rows forged past the store make them differ",
    ),
    Site(_THREADS, "core/ReplaceTrueWithFalse", "found = resolve(tx, rec.id, None, True)"): Verdict(
        "equivalent",
        "the record a finalize wrote is active when it is read back in the same transaction "
        "(validate_request refuses archiving the record being saved, and a rebind archives "
        "the other record), so resolve with or without archived records returns the same row",
    ),
    Site(_THREADS, "core/ReplaceFalseWithTrue", "transaction=False,"): Verdict(
        "killed",
        "a real hole: how a refused finalize notes its fence event (one autocommit statement, "
        "as every lease refusal) changes no result a single-threaded test reads; a store test "
        "now reads the flags finalize passes to db.write",
        (
            f"{_THREAD_KILLS}test_a_finalize_refused_for_a_lost_lease_notes_the_refusal_as_one_statement",
        ),
    ),
    # -- storage/ops/outbox.py: claims and results ------------------------------------
    Site(
        _OUTBOX,
        "core/AddNot",
        "if tx.dialect.skip_locked:  # another worker's claim in flight: busy at once, no wait",
    ): Verdict("killed", _PROBE_WHY, _BUSY_AT_ONCE),
    Site(_OUTBOX, "core/AddNot", _PROBE): Verdict("killed", _PROBE_WHY, _BUSY_AT_ONCE),
    Site(_OUTBOX, "core/ReplaceComparisonOperator_Is_IsNot", _PROBE): Verdict(
        "killed", _PROBE_WHY, _BUSY_AT_ONCE
    ),
    Site(_OUTBOX, "core/ReplaceAndWithOr", _PROBE): Verdict("killed", _PROBE_WHY, _BUSY_AT_ONCE),
    Site(_OUTBOX, "core/ReplaceComparisonOperator_IsNot_Is", _PROBE): Verdict(
        "killed", _PROBE_WHY, _BUSY_AT_ONCE
    ),
    Site(
        _OUTBOX,
        "core/ReplaceComparisonOperator_LtE_Lt",
        '"due": op.next_attempt_at is None or op.next_attempt_at <= now,',
    ): Verdict(
        "killed",
        "a real hole: every test claimed a requeued operation well past its next attempt "
        "time; a store test now claims it at the instant itself (and is refused a "
        "millisecond before)",
        (f"{_OUTBOX_KILLS}test_an_operation_is_due_at_exactly_its_next_attempt_time",),
    ),
    Site(_OUTBOX, "core/ReplaceOrWithAnd", _CLAIM_EXPIRY): Verdict("equivalent", _RECHECKED_WHY),
    Site(_OUTBOX, "core/ReplaceComparisonOperator_LtE_Lt", _CLAIM_EXPIRY): Verdict(
        "equivalent", _RECHECKED_WHY
    ),
    Site(
        _OUTBOX,
        "core/ReplaceComparisonOperator_Eq_NotEq",
        "and (state is None or dict(state) == dict(op.provider_state))",
    ): Verdict(
        "killed",
        "a real hole: no test retried a finish that carried a provider state; a store test "
        "now retries it with the same state (idempotent) and with another (refused)",
        (f"{_OUTBOX_KILLS}test_a_finish_retried_is_idempotent_only_with_the_same_provider_state",),
    ),
    # -- storage/ops/ledger/journal.py: open, append, sequence ---------------------------
    Site(
        _JOURNAL,
        "core/ReplaceFalseWithTrue",
        "def read_tip(tx: Tx, tenant: str, session_id: str, *, lock: bool = False) "
        "-> tuple[int, int]:",
    ): Verdict("killed", _TIP_LOCKED_WHY, _TIP_LOCKED),
    Site(_JOURNAL, "core/AddNot", '+ (tx.dialect.update_lock() if lock else ""),'): Verdict(
        "killed", _TIP_LOCKED_WHY, _TIP_LOCKED
    ),
    Site(
        _JOURNAL,
        "core/ReplaceTrueWithFalse",
        "found, _ = read_tip(tx, tenant, session_id, lock=True)",
    ): Verdict("equivalent", _TIP_ORDERED_WHY),
    Site(
        _JOURNAL,
        "core/ReplaceTrueWithFalse",
        "tip, ledger_epoch = read_tip(tx, tenant, session_id, lock=True)",
    ): Verdict("equivalent", _TIP_ORDERED_WHY),
    Site(
        _JOURNAL,
        "core/ReplaceTrueWithFalse",
        'MACHINE.require("append", "open", {"lease_held": True})',
    ): Verdict(
        "equivalent",
        "the call ties the code to the spec's edge and its result is unused: the lease fence "
        "before it already raised for a lost lease, and with lease_held False require finds "
        "the spec's overtaken edge (which exists too) instead of append, and returns it",
    ),
    Site(
        _JOURNAL,
        "core/AddNot",
        "str(r[0]): (int(r[1]), str(r[2]), str(r[3]), None if r[4] is None else str(r[4]))",
    ): Verdict("killed", _KNOWN_KEY_WHY, _KNOWN_KEY),
    Site(
        _JOURNAL,
        "core/ReplaceComparisonOperator_Is_IsNot",
        "str(r[0]): (int(r[1]), str(r[2]), str(r[3]), None if r[4] is None else str(r[4]))",
    ): Verdict("killed", _KNOWN_KEY_WHY, _KNOWN_KEY),
    Site(_JOURNAL, "core/ReplaceOrWithAnd", _STALE_BLOB): Verdict(
        "killed", _STALE_BLOB_WHY, _RACES
    ),
    Site(
        _JOURNAL,
        "core/ReplaceTrueWithFalse",
        "for entry, given in zip(entries, logical or entries, strict=True):",
    ): Verdict(
        "equivalent",
        "logical is empty or made one for one from entries (the ledger's _write_entries: "
        "each entry as stored beside the same entry as given), so the two sides always have "
        "the same length and strict=True never raises",
    ),
    Site(_JOURNAL, "core/AddNot", "if tx.dialect.serialized_writes:"): Verdict(
        "equivalent",
        "both paths insert the same rows in one statement inside the append's transaction; "
        "the dialect only picks the cheaper (DuckDB's column lists through insert_rows, "
        "PostgreSQL's multi-row INSERT where a COPY costs two round trips)",
    ),
    # -- storage/ops/forks.py: boundary, copy plan, taken ids -------------------------
    Site(
        _FORKS,
        "core/ReplaceComparisonOperator_Gt_GtE",
        "if target is None or target.seq > boundary_seq:",
    ): Verdict(
        "equivalent",
        "an entry's seq is unique in its session, so a target at boundary_seq is the "
        "boundary entry itself, which the copy plan takes first (take(boundary_id)): it is in "
        "parent_of, and the check is never reached for it",
    ),
    Site(
        _FORKS, "core/ReplaceOrWithAnd", 'or from_json(boundary.payload).get("turnId") != turn_id'
    ): Verdict(
        "killed",
        "a real hole: no test gave a completed turn an end that is not its own turn_end (only "
        "a damaged or forged row does); a store test now forges one at another turn's "
        "turn_end and one at its own turn_start, and the fork is unavailable",
        (f"{_FORK_KILLS}test_a_turn_whose_end_names_another_entry_is_no_fork_boundary",),
    ),
    Site(_FORKS, "core/AddNot", _TAKEN): Verdict("killed", _TAKEN_WHY, _TAKEN_KILLS),
    Site(_FORKS, "core/ReplaceComparisonOperator_Eq_NotEq", _TAKEN): Verdict(
        "killed", _TAKEN_WHY, _TAKEN_KILLS
    ),
    Site(
        _FORKS,
        "core/ReplaceTrueWithFalse",
        "for i, (c, text) in enumerate(zip(copied, sealed, strict=True), start=1)",
    ): Verdict(
        "equivalent",
        "sealed is made from copied one for one (seal_payloads of every copied entry's "
        "payload), so strict=True never raises and strict=False drops nothing",
    ),
    # -- storage/ops/bindings.py: transfer ---------------------------------------------
    Site("storage/ops/bindings.py", "core/ReplaceFalseWithTrue", "transaction=False,"): Verdict(
        "killed",
        "a real hole: how a refused transfer notes its fence event (one autocommit statement, "
        "as every lease refusal) changes no result a single-threaded test reads; a store test "
        "now reads the flags transfer passes to db.write",
        (
            "checking/test_binding_survivors.py::"
            "test_a_transfer_refused_for_a_lost_lease_notes_the_refusal_as_one_statement",
        ),
    ),
    # -- storage/ops/deletes.py: retention -----------------------------------------------
    Site(
        _DELETES, "core/ReplaceComparisonOperator_LtE_Lt", "or not 0 <= max_age_s <= MAX_AGE_S"
    ): Verdict(
        "killed",
        "a real hole: no test gave max_age_s an end of its range (two mutants, one per "
        "comparison); a store test now passes 0 and MAX_AGE_S, and refuses the next value "
        "out on either side",
        (f"{_DELETE_KILLS}test_retention_takes_max_age_from_zero_to_its_bound_inclusive",),
    ),
    Site(_DELETES, "core/ReplaceTrueWithFalse", "snapshot=True,"): Verdict(
        "killed",
        "a real hole: the tests wrote to a chosen session only after the pass chose; a store "
        "test now writes while the pass reads its candidates' heads, and the session is kept "
        "as changed only when the choice and the heads come from one snapshot",
        (f"{_DELETE_KILLS}test_a_session_written_while_the_pass_chooses_is_kept",),
    ),
    Site(_DELETES, "core/ZeroIterationForLoop", "for gone in done:"): Verdict(
        "killed",
        "a real hole: no test read this store object's caches after a retention pass (the "
        "delete's own forget is pinned by test_delete.py); a store test now does",
        (f"{_DELETE_KILLS}test_a_pass_forgets_its_caches_of_each_session_it_removed",),
    ),
    # -- storage/ops/tools.py: reclaim, arguments digest --------------------------------
    Site(
        "storage/ops/tools.py",
        "core/ReplaceOrWithAnd",
        "if run is None or run.session_id != rec.session_id or run.status in TERMINAL:",
    ): Verdict(
        "killed",
        "a real hole: every reclaim that named a run named one of the record's own session; "
        "a store test now names an unknown run and a live run of another session (refused, "
        "nothing written) and then a live run of its own",
        (
            "checking/test_tool_survivors.py::"
            "test_a_reclaim_names_only_a_live_run_of_the_records_own_session",
        ),
    ),
    Site(
        "storage/ops/tools.py",
        "core/ExceptionReplacer",
        "except (orjson.JSONEncodeError, TypeError) as exc:",
    ): Verdict(
        "equivalent",
        "orjson.JSONEncodeError is a subclass of TypeError and every failure of orjson.dumps "
        "is one (a type it cannot hold, a non-string key, an integer past 64 bits), so the "
        "tuple catches the same with TypeError replaced",
    ),
    # -- storage/ops/recovery.py and submissions.py ------------------------------------
    Site(
        _RECOVERY,
        "core/ReplaceOrWithAnd",
        'if run is not None and (state != "detached" or remote_ended(tx, run))',
    ): Verdict("killed", _REMOTE_WHY, _REMOTE),
    Site(
        _RECOVERY,
        "core/ReplaceComparisonOperator_Eq_NotEq",
        '"remote_ended": rec is not None and rec.state == "detached" and remote_ended(tx, run),',
    ): Verdict("killed", _REMOTE_WHY, _REMOTE),
    Site(
        _RECOVERY,
        "core/ReplaceAndWithOr",
        '"remote_ended": rec is not None and rec.state == "detached" and remote_ended(tx, run),',
    ): Verdict(
        "killed",
        "a hole in the net's test choice: a detached run whose remote run is still live is "
        "not begun again, pinned by conformance/test_recovery_remote.py, now among "
        "storage-runs' tests",
        (
            "conformance/test_recovery_remote.py::"
            "test_detach_needs_a_live_remote_run_record_and_then_parks_the_run",
        ),
    ),
    Site(_RECOVERY, "core/ExceptionReplacer", "except errors.InvalidTransitionError:"): Verdict(
        "killed", _PARKED_WHY, _PARKED
    ),
    Site(
        _SUBMISSIONS,
        "core/ReplaceComparisonOperator_Eq_NotEq",
        "if stored != new.fingerprint or set(new.request) == _BODY:",
    ): Verdict("killed", _OLDER_ROW_WHY, _OLDER_ROW),
    Site(
        _SUBMISSIONS,
        "core/ReplaceComparisonOperator_Is_IsNot",
        'message = None if entry is None else entry.payload["message"]',
    ): Verdict("killed", _OLDER_ROW_WHY, _OLDER_ROW),
    Site(
        _SUBMISSIONS,
        "core/ReplaceComparisonOperator_Eq_NotEq",
        "return admission_digest(new.request, message, run.retry_of, fields) == new.digest",
    ): Verdict("killed", _OLDER_ROW_WHY, _OLDER_ROW),
    Site(
        _RECOVERY,
        "core/ReplaceComparisonOperator_Gt_GtE",
        'if base > check_seconds(max_delay_s, "max_delay_s", allow_zero=False):',
    ): Verdict("killed", _RECOVERY_ARGS_WHY, _RECOVERY_ARGS),
    Site(
        _RECOVERY,
        "core/ReplaceFalseWithTrue",
        'if base > check_seconds(max_delay_s, "max_delay_s", allow_zero=False):',
    ): Verdict("killed", _RECOVERY_ARGS_WHY, _RECOVERY_ARGS),
    Site(
        _RECOVERY,
        "core/ZeroIterationForLoop",
        'for name, value in (("error", error), ("stop_reason", stop_reason)):',
    ): Verdict("killed", _RECOVERY_ARGS_WHY, _RECOVERY_ARGS),
    Site(
        _RECOVERY,
        "core/ReplaceAndWithOr",
        'if rec is not None and rec.state == "recovering" and rec.lease_epoch == lease.epoch:',
    ): Verdict("killed", _PARKED_WHY, _PARKED),
    Site(_RECOVERY, "core/AddNot", 'state = "absent" if rec is None else rec.state'): Verdict(
        "killed", _PARKED_WHY, _PARKED
    ),
    Site(
        _RECOVERY,
        "core/ReplaceComparisonOperator_Is_IsNot",
        'state = "absent" if rec is None else rec.state',
    ): Verdict("killed", _PARKED_WHY, _PARKED),
    Site(_RECOVERY, "core/ExceptionReplacer", "except ValueError:"): Verdict(
        "killed", _RECOVERY_ARGS_WHY, _RECOVERY_ARGS
    ),
    Site(
        _RECOVERY,
        "core/ReplaceFalseWithTrue",
        'base = check_seconds(base_delay_s, "base_delay_s", allow_zero=False)',
    ): Verdict("killed", _RECOVERY_ARGS_WHY, _RECOVERY_ARGS),
    Site(
        _SUBMISSIONS, "core/AddNot", 'message = None if entry is None else entry.payload["message"]'
    ): Verdict("killed", _OLDER_ROW_WHY, _OLDER_ROW),
    Site(_SUBMISSIONS, "core/AddNot", "if run.retry_of is None:"): Verdict(
        "killed", _OLDER_ROW_WHY, _OLDER_ROW
    ),
    Site(
        _SUBMISSIONS, "core/ReplaceComparisonOperator_Is_IsNot", "if run.retry_of is None:"
    ): Verdict("killed", _OLDER_ROW_WHY, _OLDER_ROW),
    Site(
        _SUBMISSIONS, "core/ReplaceTrueWithFalse", "fields = dict(zip(FIELDS, row, strict=True))"
    ): Verdict(
        "equivalent",
        "row is the SELECT of exactly the FIELDS columns, so both sides have the same length "
        "and strict=True never raises",
    ),
    # -- storage/ops/run_lifecycle.py and run_admission.py --------------------------------
    Site(_ADMIT, "core/ReplaceTrueWithFalse", "return run, True, chain.opening"): Verdict(
        "killed", _STATEMENTS_WHY, _STATEMENTS
    ),
    Site(_ADMIT, "core/ReplaceFalseWithTrue", "return found, False, None"): Verdict(
        "killed", _STATEMENTS_WHY, _STATEMENTS
    ),
    Site(
        _ADMIT,
        "core/ReplaceTrueWithFalse",
        "hold=True,  # with the writes above (none writes the session, entries or events)",
    ): Verdict("killed", _STATEMENTS_WHY, _STATEMENTS),
    Site(
        _LIFE,
        "core/ReplaceTrueWithFalse",
        "hold=True,  # with the writes held above and below (none writes the session)",
    ): Verdict("killed", _STATEMENTS_WHY, _STATEMENTS),
    Site(
        _LIFE,
        "core/ReplaceTrueWithFalse",
        "outbox_plans.create_plan(tx, moved, plan, first=True, version=version)",
    ): Verdict("killed", _STATEMENTS_WHY, _STATEMENTS),
    Site(
        _LIFE,
        "core/ReplaceComparisonOperator_IsNot_Is",
        "if fence is not None and lease is not None:  # a stale holder learns it lost",
    ): Verdict(
        "killed",
        "a real hole in what the tests pinned: with the fence read apart from the run (a second "
        "fence of the same lease) every outcome is the same and a statement more is spent; the "
        "pinned statements of a turn now catch it",
        _STATEMENTS,
    ),
    Site(
        _LIFE,
        "core/AddNot",
        "if lease is not None:  # a stale holder learns it lost, whatever the run did since",
    ): Verdict(
        "killed",
        "a hole in the net's test choice: a start, wait or resume under a lease would pass no "
        "fence at all; guards/test_forged_tokens.py's cases of them (a forged token is "
        "LeaseLostError) kill it, and are now among storage-runs' tests",
        _FORGED_RUN_STEPS,
    ),
    Site(_ADMIT, "core/ReplaceComparisonOperator_IsNot_Is", "if retry_of is not None:"): Verdict(
        "killed",
        "a hole in the net's test choice: an admission of a saved intent (intent_id, no "
        "retry_of) would be refused; conformance/test_saved_intents.py, now among "
        "storage-runs' tests, admits one",
        _SAVED,
    ),
    Site(_ADMIT, "core/AddNot", "if retry_of is not None:"): Verdict(
        "killed",
        "a hole in the net's test choice, as the IsNot_Is mutant of the same line",
        _SAVED,
    ),
    Site(
        _ADMIT,
        "core/AddNot",
        'model = "?" if fresh else "(SELECT model FROM execution_intents WHERE id = ?)"',
    ): Verdict(
        "killed",
        "a real hole: no test read the model a run row keeps (what turnkeeper report groups "
        "runs by); a store test now reads it for a first attempt, a retry and a saved intent's run",
        (f"{_RUN_KILLS}test_each_run_stores_the_model_its_intent_names",),
    ),
    Site(_LIFE, "core/ReplaceAndWithOr", "and not opening.calls"): Verdict(
        "killed",
        "a real hole: no test finished with entries that are no context message at a head the "
        "store object does not know (no opening after them: the mutant reads its calls); a "
        "store test now does",
        (f"{_RUN_KILLS}test_a_finish_with_entries_that_are_no_messages_at_an_unknown_head",),
    ),
    Site(_LIFE, "core/AddNot", "if judged and _closed(chain.opening, after):"): Verdict(
        "killed", _ENTRIES_ONCE_WHY, _ENTRIES_ONCE
    ),
    Site(_LIFE, "core/ReplaceAndWithOr", "if judged and _closed(chain.opening, after):"): Verdict(
        "killed", _ENTRIES_ONCE_WHY, _ENTRIES_ONCE
    ),
    Site(
        _LIFE,
        "core/ReplaceComparisonOperator_NotEq_Eq",
        "if first is None or first[0] != TURN_OPEN:",
    ): Verdict(
        "killed",
        "a hole in the net's test choice: a run whose runtime ended its first turn and opened "
        "another ends that one; conformance/test_conversation_turns.py, now among storage-runs' "
        "tests, does it",
        _TURNS,
    ),
    Site(_LIFE, "core/ReplaceOrWithAnd", "if first is None or first[0] != TURN_OPEN:"): Verdict(
        "killed",
        "a real hole: no test ended a run whose first turn has no row (forged away: no open "
        "turn); a store test now does, leased and not, and finds no turn_end written",
        _TURN_ROW,
    ),
    Site(
        _LIFE,
        "core/ReplaceTrueWithFalse",
        "session_rows.own_draft(EntryKind.MESSAGE, p, run.assistant_entry_id, chosen=True)",
    ): Verdict(
        "killed",
        "a real hole: no test finished a run whose reply id an entry the store did not write "
        "holds (an import, damage; forged); a store test now does (and for the turn end's id): "
        "EntryExistsError naming it, nothing written",
        _OWN_IDS,
    ),
    Site(
        _LIFE,
        "core/ReplaceTrueWithFalse",
        'args: dict[str, Any] = {"expected_leaf": ANY_LEAF, "lease": None, "checked": True}',
    ): Verdict("killed", _ENTRIES_ONCE_WHY, _ENTRIES_ONCE),
    Site(
        _LIFE,
        "core/ReplaceOrWithAnd",
        "after = (last.id, last.seq + 1, *(head or ())[2:])  # (the key version: unchanged)",
    ): Verdict("killed", _ENTRIES_ONCE_WHY, _ENTRIES_ONCE),
    Site(
        _LIFE,
        "core/ZeroIterationForLoop",
        'for name, value in (("error", error), ("stop_reason", stop_reason)):',
    ): Verdict(
        "killed",
        "a real hole: no test finished a run with an error or stop reason that is no text; a "
        "store test now does: InvalidInputError naming the field, nothing written",
        (f"{_RUN_KILLS}test_a_finish_with_an_error_or_stop_reason_that_is_no_text_is_refused",),
    ),
    Site(_ADMIT, "core/AddNot", 'intent["model"] if fresh else intent_id,'): Verdict(
        "killed",
        "a real hole: no test read the model a run row keeps; a store test now reads it for a "
        "first attempt, a retry and a saved intent's run",
        (f"{_RUN_KILLS}test_each_run_stores_the_model_its_intent_names",),
    ),
    Site(
        _LIFE,
        "core/ReplaceComparisonOperator_Is_IsNot",
        "None if read is None or read[1] is None else (read[0], read[1], read[5])",
    ): Verdict("killed", _STATEMENTS_WHY, _STATEMENTS),
    Site(
        _LIFE,
        "core/ReplaceComparisonOperator_IsNot_Is",
        "judged = head is not None  # else written at once (a judging call would read the head)",
    ): Verdict("killed", _STATEMENTS_WHY, _STATEMENTS),
    Site(_LIFE, "core/AddNot", "head=start if deferred else head,"): Verdict(
        "killed", _ENTRIES_ONCE_WHY, _ENTRIES_ONCE
    ),
    Site(_LIFE, "core/AddNot", "known=start_known if deferred else opening,"): Verdict(
        "killed", _STATEMENTS_WHY, _STATEMENTS
    ),
    Site(_LIFE, "core/ReplaceTrueWithFalse", "return moved, True, ended.opening"): Verdict(
        "killed", _STATEMENTS_WHY, _STATEMENTS
    ),
    Site(
        _LIFE,
        "core/ReplaceComparisonOperator_Is_IsNot",
        "if lease is not None and fenced_epoch is None:  # the reads and the fence as one",
    ): Verdict("killed", _STATEMENTS_WHY, _STATEMENTS),
    Site(
        _LIFE,
        "core/ReplaceComparisonOperator_Eq_NotEq",
        "and (opening.leaf_id, opening.next_seq) == head[:2]",
    ): Verdict("killed", _STATEMENTS_WHY, _STATEMENTS),
    Site(
        _LIFE,
        "core/AddNot",
        "if fenced_epoch is None and outbox_plans.get_intent(tx, intent_id) is None:",
    ): Verdict("killed", _AGAIN_WHY, _AGAIN, "run-finish-again-plan-fence"),
    Site(
        _LIFE,
        "core/ReplaceAndWithOr",
        "if fenced_epoch is None and outbox_plans.get_intent(tx, intent_id) is None:",
    ): Verdict("killed", _AGAIN_WHY, _AGAIN, "run-finish-again-plan-fence"),
    Site(
        _LIFE,
        "core/ReplaceComparisonOperator_Is_IsNot",
        "if fenced_epoch is None and outbox_plans.get_intent(tx, intent_id) is None:",
    ): Verdict("killed", _AGAIN_WHY, _AGAIN, "run-finish-again-plan-fence"),
    Site(_ADMIT, "core/ReplaceComparisonOperator_Is_IsNot", "fresh = intent_id is None"): Verdict(
        "killed",
        "a real hole: no test read the model a run row keeps, nor retried with intent fields "
        "other than the intent's (a retry's run keeps its intent's model); a store test now does",
        (f"{_RUN_KILLS}test_each_run_stores_the_model_its_intent_names",),
    ),
    Site(
        _ADMIT,
        "core/ZeroIterationForLoop",
        'for name, value in (("source", source), ("model", model), ("mode", mode)):',
    ): Verdict(
        "killed",
        "a real hole: no test admitted a run with a source, model or mode that is no text; a "
        "store test now does: InvalidInputError naming the field, nothing written",
        (f"{_RUN_KILLS}test_an_intent_field_that_is_no_text_is_refused",),
    ),
    Site(
        _LIFE,
        "core/AddNot",
        "if fence is not None and lease is not None:  # a stale holder learns it lost",
    ): Verdict("killed", _STATEMENTS_WHY, _STATEMENTS),
    Site(
        _LIFE,
        "core/ReplaceComparisonOperator_Is_IsNot",
        "if first is None or first[0] != TURN_OPEN:",
    ): Verdict("killed", _STATEMENTS_WHY, _STATEMENTS),
    Site(_LIFE, "core/AddNot", "wrote[:] = [opening] if finished_now else []"): Verdict(
        "killed", _STATEMENTS_WHY, _STATEMENTS
    ),
    Site(_LIFE, "core/ReplaceComparisonOperator_IsNot_Is", "opening is not None"): Verdict(
        "killed", _STATEMENTS_WHY, _STATEMENTS
    ),
    Site(
        _LIFE,
        "core/ReplaceTrueWithFalse",
        "session_rows.own_draft(EntryKind.TURN_END, end, turn_id + run_turns.END, chosen=True)",
    ): Verdict(
        "killed",
        "a real hole: no test finished a run whose turn end id an entry the store did not write "
        "holds (forged); a store test now does: EntryExistsError naming it, nothing written",
        _OWN_IDS,
    ),
    Site(
        _LIFE, "core/ReplaceAndWithOr", "and (opening.leaf_id, opening.next_seq) == head[:2]"
    ): Verdict(
        "killed",
        "a real hole: no test finished with entries that leave a call open (they are written "
        "first and the call answered before the reply, never deferred); a store test now does, "
        "leased and not",
        (f"{_RUN_KILLS}test_a_finish_whose_entries_leave_a_call_open_answers_it_before_the_reply",),
    ),
    Site(_LIFE, "core/AddNot", "if first is None or first[0] != TURN_OPEN:"): Verdict(
        "killed", _STATEMENTS_WHY, _STATEMENTS
    ),
    Site(_ADMIT, "core/AddNot", "wrote[:] = [opening] if admitted_now else []"): Verdict(
        "killed", _STATEMENTS_WHY, _STATEMENTS
    ),
    Site(_LIFE, "core/ReplaceFalseWithTrue", "return run, False, None"): Verdict(
        "killed", _STATEMENTS_WHY, _STATEMENTS
    ),
    Site(
        _LIFE,
        "core/ReplaceComparisonOperator_IsNot_Is",
        "if lease is not None:  # a stale holder learns it lost, whatever the run did since",
    ): Verdict(
        "killed",
        "a hole in the net's test choice, as the AddNot mutant of the same line",
        _FORGED_RUN_STEPS,
    ),
    Site(_LIFE, "core/AddNot", 'done = "finished_at = ?, " if edge.dest in TERMINAL else ""'): (
        Verdict(
            "killed",
            "a real hole: no test read a run's finish time; a store test now reads it after "
            "every step (empty) and after the finish (its updated_at), returned and stored",
            (f"{_RUN_KILLS}test_a_run_has_a_finish_time_exactly_once_it_is_terminal",),
        )
    ),
    Site(
        _LIFE,
        "core/ReplaceAndWithOr",
        "if fence is not None and lease is not None:  # a stale holder learns it lost",
    ): Verdict(
        "equivalent",
        "fence is set (a tuple: leases.fenced_read never returns None for it) exactly when a "
        "lease is given and fenced_epoch is not, and no caller passes both (recovery passes "
        "its epoch and no lease; the store's finish and a cancel_existing admission a lease "
        "and no epoch): fence and lease are both None or both set, so `or` picks what `and` "
        "does (the lease half is there for the type checker)",
    ),
}
"""Every survivor the runs found, with its classification."""
