"""The store protocol every backend implements and the conformance suite tests.

Synchronous and thread-safe: many threads may share one store object.
Errors are those of :mod:`turnkeeper.spec.errors`; each method's docstring in
its area's class (``storage/ops/<area>.py``; the store's own in
``storage/store.py``) lists them and what remains stored after a failure.

Session writes and leases (one rule). Every write to an existing session's state
— its transcript (``sessions.append``, ``sessions.branch``,
``sessions.branch_with_summary``, ``sessions.set_label``,
``sessions.set_title``, compactions, ``sessions.import_batch`` into it), its
deletion (``sessions.delete``, a project's delete) and metadata
(``sessions.set_metadata``), its channel binding and channel tools
(``bindings.bind``, ``bindings.unbind``, ``bindings.transfer`` (both
sessions), ``bindings.rotate`` (the old session), ``bindings.set_tools``), its
runs (``runs.admit`` … ``runs.finish``, ``runs.annotate_error``,
``runs.update_usage``, ``runs.update_progress``, ``runs.update_error_info``,
``runs.record_event``, ``runs.save_intent``), its conversation turns
(``runs.start_turn``, ``runs.end_turn``),
its usage records (``usage.record``, ``usage.record_from_provider``), its
tool-execution records, its response lineage, a delivery plan made outside a
termination, and a fork of it — is made either

- under the session's lease (``lease=``, a lease on ``session:<id>``), fenced
  in the write's own transaction: ``LeaseLostError`` once it is lost; or
- without a lease, only while nobody holds a live lease on the session:
  otherwise ``BusyError(target, holder)`` (for a fork, ``ForkSessionBusyError``,
  which is both a ``BusyError`` and the seed's ``ForkSessionActiveError``).

Either way a refused write writes nothing. A grant committed meanwhile
never goes through beside the check: on PostgreSQL the check writes the
lease row (and a grant the session row), so the two conflict; on DuckDB
both run under the file's write lock. Not session writes, so outside the rule: creating a
session (``sessions.create``, ``bindings.create_bound``, a fork's new session, an import
that creates one); the requests addressed to the holder, which it honours
(``runs.request_cancel``, ``tools.request_recovery``); recovery, which
needs its own ``recovery`` lease; and outbox claims and updates, fenced by
their own claim epoch. A lease given to any write is fenced all the same (an
import that creates its session too): a stale or forged one writes nothing.

Reads of a missing thing (one rule). A lookup of one thing by its id or key
(``sessions.get``, ``sessions.entry``, ``runs.get``, ``recovery.get``,
``forks.get``, ``tools.get``, ``outbox.get_plan``, ``outbox.get_operation``,
``sessions.deleted``, ``projects.get``, ``usage.get``, ``bindings.find``,
``lineage.get``, ``threads.resolve``) returns ``None`` when there is none, as
the threadstore seed's Resolve does. A read of what is inside a session
(``sessions.entries``, ``sessions.replay``, ``sessions.labels``,
``sessions.get_metadata``, ``bindings.find_by_session``, ``bindings.tools``,
``bindings.tool_generation``,
``sessions.opaque_records``, ``runs.list``, ``runs.active``, ``runs.events``,
``runs.turns``, ``runs.latest_for_intent``,
``tools.list``, ``usage.list``) raises ``SessionNotFoundError`` when the session does not exist,
so an empty answer always means an existing, empty session.

Values. Payloads and other JSON arguments hold only what JSON holds exactly
(dicts with string keys, lists, strings, 64-bit integers, finite floats,
booleans, ``None``); anything that would come back as something else (a
``datetime``, ``UUID``, ``Enum``, dataclass, tuple …) is refused with
``InvalidInputError``, never converted. Identifiers hold no control
characters; payload text keeps every character, NUL included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, Self, TypeVar

from turnkeeper.spec.delivery import DeliveryIntent, DeliveryOperation, DeliveryPlan
from turnkeeper.spec.fork import Fork
from turnkeeper.spec.ledger import (
    CheckpointSummary,
    CommandApplication,
    GCResult,
    LedgerEntry,
    LedgerRecord,
)
from turnkeeper.spec.records import (
    ANY_LEAF,
    Binding,
    CapabilityEvent,
    ChannelToolConfig,
    ConversationTurn,
    DeletedSession,
    DetailPage,
    Entry,
    ExecutionFacts,
    ExecutionIntent,
    FinalizeRequest,
    Guidance,
    ImportBatch,
    ImportedSource,
    ImportResult,
    InputResourceEvent,
    KeyRotationReport,
    Lease,
    NewEntry,
    OpaqueRecord,
    Project,
    Recovery,
    Replay,
    ResponseItem,
    ResponseReplayTurn,
    ResponseRun,
    ResponseState,
    ResponseTurn,
    RetentionReport,
    Run,
    RunEvent,
    RuntimeSubmission,
    SequencedCapabilityEvent,
    SequencedMessage,
    Session,
    SessionCapabilities,
    SessionMetadata,
    SessionPage,
    ThreadRecord,
)
from turnkeeper.spec.tool_execution import ToolExecution
from turnkeeper.spec.usage import UsageRecord

from .ops.ledger.blobs import BlobStore
from .ops.ledger.writer import LedgerWriter, RuntimeCommandLog
from .wakeups import Subscription, Topic

T = TypeVar("T")


class LeasesAPI(Protocol):
    """``store.leases``: leases with fencing epochs (session seed AcquireSessionLease …)."""

    def acquire(
        self, target: str, owner: str, ttl_s: float, *, purpose: str = ..., run_id: str | None = ...
    ) -> Lease: ...
    def renew(self, lease: Lease, ttl_s: float) -> Lease: ...
    def release(self, lease: Lease) -> bool: ...
    def validate(
        self, lease: Lease, *, run_id: str | None = ..., purpose: str | None = ...
    ) -> None: ...
    def bind_run(self, lease: Lease, run_id: str) -> Lease: ...


class ThreadsAPI(Protocol):
    """``store.threads``: thread records (threadstore seed Resolve, Finalize)."""

    def resolve(
        self, *, id: str | None = None, key: str | None = None, include_archived: bool = False
    ) -> ThreadRecord | None: ...
    def finalize(self, request: FinalizeRequest) -> ThreadRecord: ...


class SessionsAPI(Protocol):
    """``store.sessions``: sessions, their transcripts, replay, listing and imports."""

    def create(
        self,
        session_id: str | None = None,
        *,
        cwd: str = "",
        header: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> Session: ...
    def get(self, session_id: str) -> Session | None: ...
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
    def set_label(
        self, session_id: str, target_id: str, label: str | None, *, lease: Lease | None = None
    ) -> Entry: ...
    def set_title(
        self, session_id: str, name: str, *, source: str | None = None, lease: Lease | None = None
    ) -> Entry: ...
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
    def entries_after(
        self, session_id: str, after_seq: int = 0, *, offset: int = 0, limit: int = 100
    ) -> list[Entry]: ...
    def entry(self, session_id: str, entry_id: str) -> Entry | None: ...
    def replay(self, session_id: str) -> Replay: ...
    def labels(self, session_id: str) -> dict[str, str]: ...
    def import_batch(self, batch: ImportBatch, *, lease: Lease | None = None) -> ImportResult: ...
    def imported_source(self, session_id: str, source: str) -> ImportedSource | None: ...
    def opaque_records(self, session_id: str) -> list[OpaqueRecord]: ...
    def count(
        self,
        *,
        search: str | None = None,
        messages_only: bool = False,
        cwd: str | None = None,
        include_sub_agents: bool = False,
        status: str | None = None,
        project_id: str | None = None,
        channel_type: str | None = None,
        channel_id: str | None = None,
    ) -> int: ...
    def continue_recent(self, cwd: str, *, header: Mapping[str, Any] | None = None) -> Session: ...
    def open(self, value: str, *, cwd: str | None = None) -> Session: ...
    def new_sub_agent(
        self,
        parent_id: str,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        header: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> Session: ...
    def sub_agents(self, parent_id: str) -> list[Session]: ...
    def messages_after(
        self, session_id: str, after_seq: int, *, limit: int = 100
    ) -> list[SequencedMessage]: ...
    def messages_before(
        self, session_id: str, before_seq: int, *, limit: int = 100
    ) -> list[SequencedMessage]: ...
    def messages_latest(self, session_id: str, *, limit: int = 100) -> list[SequencedMessage]: ...
    def messages_with_seq(self, session_id: str) -> list[SequencedMessage]: ...
    def latest(self, session_id: str, kind: str) -> Entry | None: ...
    def header(self, session_id: str) -> Mapping[str, Any]: ...
    def execution_facts(self, session_id: str) -> ExecutionFacts: ...
    def path_after(
        self,
        session_id: str,
        after_seq: int = 0,
        *,
        leaf_id: str | None = None,
        limit: int | None = None,
    ) -> list[Entry]: ...
    def path_latest(
        self, session_id: str, limit: int, *, leaf_id: str | None = None
    ) -> list[Entry]: ...
    def custom_entry(self, session_id: str, custom_type: str, key: str) -> Entry | None: ...
    def custom_entries(
        self,
        session_id: str,
        custom_type: str,
        *,
        before_seq: int | None = None,
        key_prefix: str = "",
        limit: int = 100,
    ) -> list[Entry]: ...
    def list(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        search: str | None = None,
        offset: int = 0,
        messages_only: bool = False,
        cwd: str | None = None,
        include_sub_agents: bool = False,
        status: str | None = None,
        project_id: str | None = None,
        channel_type: str | None = None,
        channel_id: str | None = None,
    ) -> SessionPage: ...
    def delete(self, session_id: str, *, lease: Lease | None = None) -> DeletedSession: ...
    def deleted(self, session_id: str) -> DeletedSession | None: ...
    def retain(
        self,
        lease: Lease,
        *,
        max_age_s: float | None = None,
        keep_last: int | None = None,
        limit: int = 1000,
    ) -> RetentionReport: ...
    def rotate_key(self, session_id: str, *, lease: Lease | None = None) -> int: ...
    def encrypt(self, session_id: str, *, lease: Lease | None = None) -> bool: ...
    def get_metadata(self, session_id: str) -> SessionMetadata: ...
    def set_metadata(
        self, session_id: str, metadata: SessionMetadata, *, lease: Lease | None = None
    ) -> SessionMetadata: ...
    def list_detailed(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        search: str | None = None,
        offset: int = 0,
        messages_only: bool = False,
        cwd: str | None = None,
        include_sub_agents: bool = False,
        status: str | None = None,
        project_id: str | None = None,
        channel_type: str | None = None,
        channel_id: str | None = None,
    ) -> DetailPage: ...


class RunsAPI(Protocol):
    """``store.runs``: run admission, steps, termination, cancel requests, reads, events."""

    def admit(
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
        on_active: str = "refuse",
        resource_events: Sequence[InputResourceEvent] = (),
        intent_id: str | None = None,
    ) -> Run: ...
    def turns(self, session_id: str) -> list[ConversationTurn]: ...
    def intent(self, intent_id: str) -> ExecutionIntent | None: ...
    def submission(self, session_id: str, submission_key: str) -> RuntimeSubmission | None: ...
    def latest_event_seq(self, run_id: str) -> int: ...
    def latest_for_intent(self, session_id: str, intent_id: str) -> Run | None: ...
    def save_intent(
        self,
        session_id: str,
        request: Mapping[str, Any],
        *,
        intent_id: str | None = None,
        source: str = "",
        model: str = "",
        mode: str = "",
        work_dir: str = "",
        policy: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
    ) -> ExecutionIntent: ...
    def record_event(
        self,
        run_id: str,
        event_type: str,
        data: Mapping[str, Any] | None = None,
        *,
        event_id: str | None = None,
        lease: Lease | None = None,
    ) -> RunEvent: ...
    def start_turn(
        self, run_id: str, turn_id: str, *, lease: Lease | None = None
    ) -> ConversationTurn: ...
    def end_turn(
        self,
        turn_id: str,
        status: str,
        *,
        stop_reason: str | None = None,
        lease: Lease | None = None,
    ) -> ConversationTurn: ...
    def start(self, run_id: str, *, lease: Lease | None = None) -> Run: ...
    def wait(self, run_id: str, *, lease: Lease | None = None) -> Run: ...
    def resume(self, run_id: str, *, lease: Lease | None = None) -> Run: ...
    def finish(
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
    def get(self, run_id: str) -> Run | None: ...
    def active(self, session_id: str) -> Run | None: ...
    def events(
        self,
        session_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        latest: bool = False,
        limit: int = 100,
    ) -> list[RunEvent]: ...
    def annotate_error(self, run_id: str, reason: str, *, lease: Lease | None = None) -> bool: ...
    def update_usage(
        self,
        run_id: str,
        usage: Mapping[str, Any] | None,
        context_usage: Mapping[str, Any] | None = None,
        *,
        lease: Lease | None = None,
    ) -> Run: ...
    def update_progress(
        self, run_id: str, progress: Mapping[str, Any], *, lease: Lease | None = None
    ) -> Run: ...
    def update_error_info(
        self, run_id: str, info: Mapping[str, Any], *, lease: Lease | None = None
    ) -> Run: ...
    def list(self, session_id: str) -> list[Run]: ...


class LineageAPI(Protocol):
    """``store.lineage``: a session's response lineage, by compare-and-set."""

    def get(self, session_id: str) -> ResponseState | None: ...
    def compare_and_swap(
        self, state: ResponseState, expected_version: int, *, lease: Lease | None = None
    ) -> bool: ...


class RecoveryAPI(Protocol):
    """``store.recovery``: recovery of orphaned runs under a ``recovery`` lease."""

    def list_orphans(self) -> list[Run]: ...
    def get(self, run_id: str) -> Recovery | None: ...
    def begin(
        self, run_id: str, lease: Lease, *, trigger_source: str = ..., reason: str = ...
    ) -> Recovery: ...
    def converge(
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
    def fail(
        self,
        run_id: str,
        lease: Lease,
        message: str,
        *,
        max_attempts: int = 5,
        base_delay_s: float = 1.0,
        max_delay_s: float = 300.0,
    ) -> Recovery: ...
    def detach(self, run_id: str, lease: Lease) -> Recovery: ...


class OutboxAPI(Protocol):
    """``store.outbox``: delivery plans and their operations, claimed by epoch."""

    def create_plan(
        self, run_id: str, plan: DeliveryPlan, *, lease: Lease | None = None
    ) -> DeliveryIntent: ...
    def get_plan(self, intent_id: str) -> tuple[DeliveryIntent, list[DeliveryOperation]] | None: ...
    def get_operation(self, operation_id: str) -> DeliveryOperation | None: ...
    def delivered_entry(self, operation_id: str) -> Entry | None: ...
    def list_due(self, *, limit: int = 100) -> list[DeliveryOperation]: ...
    def claim(self, operation_id: str, owner: str, ttl_s: float) -> DeliveryOperation: ...
    def update_progress(
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
    def finish(
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
    def requeue(
        self,
        operation_id: str,
        owner: str,
        epoch: int,
        *,
        delay_s: float = 0.0,
        failure_code: str = "",
    ) -> DeliveryOperation: ...


class ToolsAPI(Protocol):
    """``store.tools``: tool-execution records (session seed ToolExecutionRecord)."""

    def claim(
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
    def complete(
        self,
        execution_key: str,
        result: Any,
        *,
        is_error: bool = False,
        lease: Lease | None = None,
    ) -> ToolExecution: ...
    def interrupt(
        self,
        session_id: str,
        *,
        local_turn_id: str | None = None,
        reason: str = ...,
        lease: Lease | None = None,
    ) -> list[ToolExecution]: ...
    def request_recovery(
        self, session_id: str, local_turn_id: str, provider_call_ids: Sequence[str]
    ) -> list[ToolExecution]: ...
    def reclaim(
        self, execution_key: str, *, run_id: str | None = None, lease: Lease | None = None
    ) -> ToolExecution: ...
    def abandon_interrupted(
        self,
        session_id: str,
        local_turn_id: str,
        *,
        reason: str = ...,
        lease: Lease | None = None,
    ) -> int: ...
    def get(self, execution_key: str) -> ToolExecution | None: ...
    def list(self, session_id: str) -> list[ToolExecution]: ...


class ForksAPI(Protocol):
    """``store.forks``: forks of a session (session seed ForkSession)."""

    def fork(
        self,
        source_session_id: str,
        *,
        request_id: str,
        boundary_turn_id: str | None = None,
        at_seq: int | None = None,
        fork_session_id: str | None = None,
        lease: Lease | None = None,
    ) -> Fork: ...
    def get(self, request_id: str) -> Fork | None: ...


class CapabilitiesAPI(Protocol):
    """``store.capabilities``: a session's runtime capability state and its
    transitions (session seed SessionCapabilities, SessionCapabilityEvent)."""

    def save(
        self, capabilities: SessionCapabilities, *, lease: Lease | None = None
    ) -> SessionCapabilities: ...
    def load(self, session_id: str) -> SessionCapabilities | None: ...
    def record_event(self, event: CapabilityEvent, *, lease: Lease | None = None) -> str: ...
    def events(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[SequencedCapabilityEvent]: ...


class GuidanceAPI(Protocol):
    """``store.guidance``: guidance queued for a session's runtime (session seed ESMGuidance)."""

    def save(self, guidance: Guidance) -> Guidance: ...
    def consume(
        self, session_id: str, ids: Sequence[str], *, lease: Lease | None = None
    ) -> int: ...
    def list(
        self, session_id: str, *, status: str = "", limit: int | None = None
    ) -> list[Guidance]: ...


class ResourcesAPI(Protocol):
    """``store.resources``: input resource lifecycle events (session seed InputResourceEvent)."""

    def record_event(self, event: InputResourceEvent, *, lease: Lease | None = None) -> str: ...
    def events(self, session_id: str) -> list[InputResourceEvent]: ...


class LedgerAPI(Protocol):
    """``store.ledger``: a session's fenced journal (sessionstore OpenJournal,
    OpenInternalRecordReplayer, OpenRuntimeCommandLog, ReadCommandApplicationAt,
    WithTenant, WithOffloadThreshold, OpenObjectGC, WorkspaceCheckpointBySeq,
    WorkspaceCheckpointByTurn, WorkspaceLiveRefs, PersistencePaths); see ``storage/ops/ledger``."""

    tenant: str
    blobs: BlobStore
    offload_threshold: int
    max_body_bytes: int

    def with_tenant(self, tenant: str) -> LedgerAPI: ...
    def with_blobs(
        self,
        blobs: BlobStore | None = None,
        *,
        offload_threshold: int = ...,
        max_body_bytes: int = ...,
    ) -> LedgerAPI: ...
    def gc(
        self, session_id: str, lease: Lease | None, *, temp_grace_s: float = ...
    ) -> GCResult: ...
    def open(
        self, session_id: str, lease: Lease | None, *, opening: Sequence[LedgerEntry] = ...
    ) -> LedgerWriter: ...
    def check_entries(
        self, entries: Sequence[LedgerEntry], *, opening: bool = False
    ) -> list[LedgerEntry]: ...
    def tip(self, session_id: str) -> int: ...
    def replay(
        self, session_id: str, from_seq: int = 1, *, page_rows: int = ...
    ) -> Iterator[LedgerRecord]: ...
    def command_log(self, session_id: str, writer: LedgerWriter) -> RuntimeCommandLog: ...
    def read_command_application_at(self, session_id: str, seq: int) -> CommandApplication: ...
    def workspace_checkpoint_by_seq(
        self, session_id: str, seq: int
    ) -> CheckpointSummary | None: ...
    def workspace_checkpoint_by_turn(
        self, session_id: str, turn_id: str
    ) -> CheckpointSummary | None: ...
    def workspace_live_refs(self, session_ids: Sequence[str] | None = None) -> frozenset[str]: ...
    def sweep_deleted(
        self, session_ids: Sequence[str] | None = None, *, temp_grace_s: float = ...
    ) -> GCResult: ...
    def persistence_paths(self) -> list[str]: ...


class ArchivesAPI(Protocol):
    """``store.archives``: a session's Responses API records (session seed
    ResponseRun, ResponseTurn, ResponseItemArchive, ResponseReplayTurn)."""

    def save_run(self, run: ResponseRun, *, lease: Lease | None = None) -> ResponseRun: ...
    def save_turn(self, turn: ResponseTurn, *, lease: Lease | None = None) -> ResponseTurn: ...
    def save_item(self, item: ResponseItem, *, lease: Lease | None = None) -> ResponseItem: ...
    def get_run(self, session_id: str, local_run_id: str) -> ResponseRun | None: ...
    def get_turn(self, session_id: str, local_turn_id: str) -> ResponseTurn | None: ...
    def runs(self, session_id: str, *, limit: int = 100) -> list[ResponseRun]: ...
    def items(self, session_id: str, local_turn_id: str) -> list[ResponseItem]: ...
    def replay_items(self, session_id: str, *, limit: int = 1000) -> list[Any]: ...
    def replay_turns(self, session_id: str, *, limit: int = 500) -> list[ResponseReplayTurn]: ...


class SnapshotAPI(Protocol):
    """The reads of :meth:`Store.snapshot`'s body: one consistent state."""

    def query(self, sql: str, params: Sequence[Any] | None = None) -> Any: ...


class ProjectsAPI(Protocol):
    """``store.projects``: projects grouping sessions (session seed CreateProject …)."""

    def create(self, name: str, *, project_id: str | None = None) -> Project: ...
    def get(self, project_id: str) -> Project | None: ...
    def rename(self, project_id: str, name: str) -> Project: ...
    def delete(self, project_id: str, *, leases: Sequence[Lease] = ()) -> list[DeletedSession]: ...
    def list(self) -> list[Project]: ...


class BindingsAPI(Protocol):
    """``store.bindings``: channel bindings and channel tools (session seed
    BindSession, TransferBinding, FindBinding, CreateBound, RotateBoundSession,
    SetChannelTools …)."""

    def bind(
        self, session_id: str, channel_type: str, channel_id: str, *, lease: Lease | None = None
    ) -> Binding: ...
    def unbind(self, session_id: str, *, lease: Lease | None = None) -> Binding | None: ...
    def transfer(
        self,
        channel_type: str,
        channel_id: str,
        from_session_id: str,
        to_session_id: str,
        *,
        leases: Sequence[Lease] = (),
    ) -> Binding: ...
    def find(self, channel_type: str, channel_id: str) -> Binding | None: ...
    def find_by_session(self, session_id: str) -> Binding | None: ...
    def create_bound(
        self,
        channel_type: str,
        channel_id: str,
        *,
        session_id: str | None = None,
        cwd: str = "",
        header: Mapping[str, Any] | None = None,
    ) -> Session: ...
    def rotate(
        self,
        channel_type: str,
        channel_id: str,
        old_session_id: str,
        *,
        session_id: str | None = None,
        cwd: str | None = None,
        header: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
    ) -> Session: ...
    def set_tools(
        self,
        session_id: str,
        tools: Sequence[ChannelToolConfig],
        *,
        lease: Lease | None = None,
    ) -> int: ...
    def tools(self, session_id: str) -> list[ChannelToolConfig]: ...
    def tool_generation(self, session_id: str) -> int: ...
    def list(self, *, channel_type: str | None = None) -> list[Binding]: ...


class UsageAPI(Protocol):
    """``store.usage``: usage records, one per model request (session seed
    RecordUsage, RecordUsageFromProviderUsage)."""

    def record(
        self,
        session_id: str,
        *,
        provider: str,
        model: str,
        protocol: str = "",
        input_tokens: int = 0,
        output_tokens: int = 0,
        total_tokens: int | None = None,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cost_usd: float | None = None,
        duration_ms: int | None = None,
        run_id: str | None = None,
        entry_id: str | None = None,
        usage_id: str | None = None,
        recorded_at: datetime | None = None,
        lease: Lease | None = None,
    ) -> UsageRecord: ...
    def record_from_provider(
        self,
        session_id: str,
        usage: Mapping[str, Any],
        *,
        provider: str,
        model: str,
        protocol: str = "",
        cost_usd: float | None = None,
        duration_ms: int | None = None,
        run_id: str | None = None,
        entry_id: str | None = None,
        usage_id: str | None = None,
        recorded_at: datetime | None = None,
        lease: Lease | None = None,
    ) -> UsageRecord: ...
    def get(self, session_id: str, usage_id: str) -> UsageRecord | None: ...
    def list(self, session_id: str, *, run_id: str | None = None) -> list[UsageRecord]: ...


class KeysAPI(Protocol):
    """``store.keys``: master-key rotation and reclaiming pages (``storage/ops/keys.py``)."""

    def rotate(
        self, lease: Lease, *, limit: int | None = None, batch_rows: int = ...
    ) -> KeyRotationReport: ...
    def reclaim(self) -> list[str]: ...


class Store(Protocol):
    """The store: one object per area (threadstore Store + session seed Store),
    the analytics reads, the wake-ups and the store's own life (a context
    manager that closes it)."""

    @property
    def path(self) -> str: ...
    def schema_version(self) -> int: ...
    def statement_stats(self) -> dict[str, dict[str, float]]: ...
    def query(self, sql: str, params: Sequence[Any] | None = None) -> Any: ...
    def json_sql(self, expr: str) -> str: ...
    def snapshot(self, body: Callable[[SnapshotAPI], T]) -> T: ...
    def query_batches(
        self,
        sql: str,
        consume: Callable[[Any, Iterator[Any]], T],
        params: Sequence[Any] | None = None,
    ) -> T: ...
    def subscribe(self, *topics: str) -> Subscription: ...
    def wait_for(self, *topics: str, timeout_s: float) -> list[Topic]: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None: ...

    @property
    def leases(self) -> LeasesAPI: ...
    @property
    def threads(self) -> ThreadsAPI: ...
    @property
    def sessions(self) -> SessionsAPI: ...
    @property
    def runs(self) -> RunsAPI: ...
    @property
    def lineage(self) -> LineageAPI: ...
    @property
    def recovery(self) -> RecoveryAPI: ...
    @property
    def outbox(self) -> OutboxAPI: ...
    @property
    def tools(self) -> ToolsAPI: ...
    @property
    def forks(self) -> ForksAPI: ...
    @property
    def capabilities(self) -> CapabilitiesAPI: ...
    @property
    def guidance(self) -> GuidanceAPI: ...
    @property
    def resources(self) -> ResourcesAPI: ...
    @property
    def projects(self) -> ProjectsAPI: ...
    @property
    def usage(self) -> UsageAPI: ...
    @property
    def bindings(self) -> BindingsAPI: ...
    @property
    def archives(self) -> ArchivesAPI: ...
    @property
    def ledger(self) -> LedgerAPI: ...
    @property
    def keys(self) -> KeysAPI: ...

    def close(self) -> None: ...
