"""The store protocol every backend implements and the conformance suite tests.

Synchronous and thread-safe: many threads may share one store object.
Errors are those of :mod:`turnkeeper.spec.errors`; each method's docstring in
the DuckDB backend lists them and what remains stored after a failure.

Session writes and leases (one rule). Every write to an existing session's
state — its transcript (``append``, ``branch``, ``branch_with_summary``,
``set_label``, ``set_title``, compactions, ``import_batch`` into it), its runs
(``admit_run`` … ``finish_run``, ``annotate_run_error``), its tool-execution
records, its response lineage, a delivery plan made outside a termination,
and a fork of it — is made either

- under the session's lease (``lease=``, a lease on ``session:<id>``), fenced
  in the write's own transaction: ``LeaseLostError`` once it is lost; or
- without a lease, only while nobody holds a live lease on the session:
  otherwise ``BusyError(target, holder)`` (for a fork, ``ForkSessionBusyError``,
  which is both a ``BusyError`` and the seed's ``ForkSessionActiveError``).

Either way a refused write writes nothing. A grant committed meanwhile
never goes through beside the check: on PostgreSQL the check writes the
lease row (and a grant the session row), so the two conflict; on DuckDB
both run under the file's write lock. Not session writes, so outside the rule: creating a
session (``create_session``, a fork's new session, an import that creates
one); the requests addressed to the holder, which it honours
(``request_cancel``, ``request_tool_execution_recovery``); recovery, which
needs its own ``recovery`` lease; and outbox claims and updates, fenced by
their own claim epoch. A lease given to any write is fenced all the same (an
import that creates its session too): a stale or forged one writes nothing.

Reads of a missing thing (one rule). A lookup of one thing by its id or key
(``get_session``, ``entry``, ``get_run``, ``get_recovery``, ``get_fork``,
``get_tool_execution``, ``get_delivery_plan``, ``get_delivery_operation``,
``get_response_state``, ``resolve``) returns ``None`` when there is none, as
the threadstore seed's Resolve does. A read of what is inside a session
(``entries``, ``replay``, ``labels``, ``opaque_records``, ``session_runs``,
``active_run``, ``run_events``, ``session_tool_executions``) raises
``SessionNotFoundError`` when the session does not exist, so an empty answer
always means an existing, empty session.

Values. Payloads and other JSON arguments hold only what JSON holds exactly
(dicts with string keys, lists, strings, 64-bit integers, finite floats,
booleans, ``None``); anything that would come back as something else (a
``datetime``, ``UUID``, ``Enum``, dataclass, tuple …) is refused with
``InvalidInputError``, never converted. Identifiers hold no control
characters; payload text keeps every character, NUL included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from turnkeeper.spec.delivery import DeliveryIntent, DeliveryOperation, DeliveryPlan
from turnkeeper.spec.fork import Fork
from turnkeeper.spec.records import (
    ANY_LEAF,
    Entry,
    FinalizeRequest,
    ImportBatch,
    ImportResult,
    Lease,
    NewEntry,
    OpaqueRecord,
    Recovery,
    Replay,
    ResponseState,
    Run,
    RunEvent,
    Session,
    SessionPage,
    ThreadRecord,
)
from turnkeeper.spec.tool_execution import ToolExecution


class Store(Protocol):
    """Leases, thread records, sessions, runs, recovery and the delivery outbox
    (threadstore Store + session seed Store)."""

    # leases
    def acquire_lease(
        self, target: str, owner: str, ttl_s: float, *, purpose: str = ...
    ) -> Lease: ...
    def renew_lease(self, lease: Lease, ttl_s: float) -> Lease: ...
    def release_lease(self, lease: Lease) -> bool: ...
    def validate_lease(self, lease: Lease) -> None: ...

    # thread records
    def resolve(
        self, *, id: str | None = None, key: str | None = None, include_archived: bool = False
    ) -> ThreadRecord | None: ...
    def finalize(self, request: FinalizeRequest) -> ThreadRecord: ...

    # sessions
    def create_session(
        self,
        session_id: str | None = None,
        *,
        cwd: str = "",
        header: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> Session: ...
    def get_session(self, session_id: str) -> Session | None: ...
    def append(
        self,
        session_id: str,
        kind: str,
        payload: Mapping[str, Any],
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        entry_id: str | None = None,
        timestamp: datetime | None = None,
    ) -> Entry: ...
    def append_many(
        self,
        session_id: str,
        entries: Sequence[NewEntry | tuple[str, Mapping[str, Any]]],
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
    ) -> list[Entry]: ...
    def branch(
        self,
        session_id: str,
        entry_id: str | None,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
    ) -> None: ...
    def branch_with_summary(
        self,
        session_id: str,
        entry_id: str,
        summary: str,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        details: Any = None,
    ) -> Entry: ...
    def entries(self, session_id: str) -> list[Entry]: ...
    def entry(self, session_id: str, entry_id: str) -> Entry | None: ...
    def replay(self, session_id: str) -> Replay: ...
    def labels(self, session_id: str) -> dict[str, str]: ...
    def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, search: str | None = None
    ) -> SessionPage: ...
    def count_sessions(self, *, search: str | None = None) -> int: ...

    # imports
    def import_batch(self, batch: ImportBatch, *, lease: Lease | None = None) -> ImportResult: ...
    def opaque_records(self, session_id: str) -> list[OpaqueRecord]: ...

    # runs and recovery
    def admit_run(
        self,
        session_id: str,
        request: Mapping[str, Any],
        *,
        submission_key: str | None = None,
        user_message: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
        retry_of: str | None = None,
        source: str = "",
        model: str = "",
        mode: str = "",
        work_dir: str = "",
        policy: Mapping[str, Any] | None = None,
        start: bool = False,
    ) -> Run: ...
    def start_run(self, run_id: str, *, lease: Lease | None = None) -> Run: ...
    def wait_run(self, run_id: str, *, lease: Lease | None = None) -> Run: ...
    def resume_run(self, run_id: str, *, lease: Lease | None = None) -> Run: ...
    def finish_run(
        self,
        run_id: str,
        status: str,
        *,
        assistant_message: Mapping[str, Any] | None = None,
        error: str | None = None,
        stop_reason: str | None = None,
        lease: Lease | None = None,
        delivery_plan: DeliveryPlan | None = None,
        entries: Sequence[NewEntry | tuple[str, Mapping[str, Any]]] = (),
    ) -> Run: ...
    def request_cancel(self, run_id: str) -> Run: ...
    def get_run(self, run_id: str) -> Run | None: ...
    def active_run(self, session_id: str) -> Run | None: ...
    def session_runs(self, session_id: str) -> list[Run]: ...
    def run_events(
        self,
        session_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        latest: bool = False,
        limit: int = 100,
    ) -> list[RunEvent]: ...
    def list_orphaned_runs(self) -> list[Run]: ...
    def get_recovery(self, run_id: str) -> Recovery | None: ...
    def begin_recovery(
        self, run_id: str, lease: Lease, *, trigger_source: str = ..., reason: str = ...
    ) -> Recovery: ...
    def converge_recovery(
        self,
        run_id: str,
        lease: Lease,
        *,
        status: str = ...,
        error: str | None = None,
        stop_reason: str | None = None,
        decisions: Sequence[Mapping[str, Any]] = (),
        delivery_plan: DeliveryPlan | None = None,
    ) -> Recovery: ...
    def fail_recovery(
        self,
        run_id: str,
        lease: Lease,
        message: str,
        *,
        max_attempts: int = 5,
        base_delay_s: float = 1.0,
        max_delay_s: float = 300.0,
    ) -> Recovery: ...
    def detach_recovery(self, run_id: str, lease: Lease) -> Recovery: ...

    # response lineage
    def get_response_state(self, session_id: str) -> ResponseState | None: ...
    def compare_and_swap_response_state(
        self, state: ResponseState, expected_version: int, *, lease: Lease | None = None
    ) -> bool: ...

    # delivery outbox
    def create_delivery_plan(
        self, run_id: str, plan: DeliveryPlan, *, lease: Lease | None = None
    ) -> DeliveryIntent: ...
    def get_delivery_plan(
        self, intent_id: str
    ) -> tuple[DeliveryIntent, list[DeliveryOperation]] | None: ...
    def get_delivery_operation(self, operation_id: str) -> DeliveryOperation | None: ...
    def list_due_deliveries(self, *, limit: int = 100) -> list[DeliveryOperation]: ...
    def claim_delivery(self, operation_id: str, owner: str, ttl_s: float) -> DeliveryOperation: ...
    def update_delivery_progress(
        self,
        operation_id: str,
        owner: str,
        epoch: int,
        *,
        provider_asset_id: str | None = None,
        provider_message_id: str | None = None,
        provider_state: Mapping[str, Any] | None = None,
        failure_code: str | None = None,
    ) -> DeliveryOperation: ...
    def finish_delivery(
        self,
        operation_id: str,
        owner: str,
        epoch: int,
        status: str,
        *,
        provider_asset_id: str | None = None,
        provider_message_id: str | None = None,
        provider_state: Mapping[str, Any] | None = None,
        failure_code: str | None = None,
    ) -> DeliveryOperation: ...
    def requeue_delivery(
        self,
        operation_id: str,
        owner: str,
        epoch: int,
        *,
        delay_s: float = 0.0,
        failure_code: str = "",
    ) -> DeliveryOperation: ...

    # tool-execution records
    def claim_tool_execution(
        self,
        execution_key: str,
        session_id: str,
        *,
        local_turn_id: str,
        provider_call_id: str,
        tool_name: str,
        side_effecting: bool,
        arguments: Any = None,
        run_id: str | None = None,
        provider: str = "",
        api: str = "",
        response_id: str = "",
        tool_kind: str = "",
        provider_metadata: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
    ) -> tuple[ToolExecution, bool]: ...
    def complete_tool_execution(
        self,
        execution_key: str,
        result: Any,
        *,
        is_error: bool = False,
        lease: Lease | None = None,
    ) -> ToolExecution: ...
    def interrupt_tool_executions(
        self,
        session_id: str,
        *,
        local_turn_id: str | None = None,
        reason: str = ...,
        lease: Lease | None = None,
    ) -> list[ToolExecution]: ...
    def request_tool_execution_recovery(
        self, session_id: str, local_turn_id: str, provider_call_ids: Sequence[str]
    ) -> list[ToolExecution]: ...
    def reclaim_tool_execution(
        self, execution_key: str, *, run_id: str | None = None, lease: Lease | None = None
    ) -> ToolExecution: ...
    def abandon_interrupted_tool_executions(
        self,
        session_id: str,
        local_turn_id: str,
        *,
        reason: str = ...,
        lease: Lease | None = None,
    ) -> int: ...
    def annotate_run_error(
        self, run_id: str, reason: str, *, lease: Lease | None = None
    ) -> bool: ...
    def get_tool_execution(self, execution_key: str) -> ToolExecution | None: ...
    def session_tool_executions(self, session_id: str) -> list[ToolExecution]: ...

    # forks
    def fork_session(
        self,
        source_session_id: str,
        *,
        request_id: str,
        boundary_turn_id: str | None = None,
        at_seq: int | None = None,
        fork_session_id: str | None = None,
        lease: Lease | None = None,
    ) -> Fork: ...
    def get_fork(self, request_id: str) -> Fork | None: ...

    def close(self) -> None: ...
