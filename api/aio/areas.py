"""The areas of the async store (generated: ``model_tests/aio_facade.py`` writes
this file from ``storage/protocol.py``; do not edit it by hand).

Each class is one area of :class:`~turnkeeper.aio.AsyncStore`; each method awaits
the sync area's method of the same name through the store's runner, which runs
it on a worker thread (see :mod:`turnkeeper.aio.runner`): same arguments, same
result, same errors, one domain layer.
"""

from __future__ import annotations

from collections.abc import (
    Mapping,
    Sequence,
)
from datetime import datetime
from typing import Any

from turnkeeper.spec.delivery import (
    DeliveryIntent,
    DeliveryOperation,
    DeliveryPlan,
)
from turnkeeper.spec.fork import Fork
from turnkeeper.spec.ledger import (
    CheckpointSummary,
    CommandApplication,
    GCResult,
    LedgerEntry,
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
from turnkeeper.storage.ops.ledger.blobs import BlobStore
from turnkeeper.storage.protocol import (
    ArchivesAPI,
    BindingsAPI,
    CapabilitiesAPI,
    ForksAPI,
    GuidanceAPI,
    KeysAPI,
    LeasesAPI,
    LedgerAPI,
    LineageAPI,
    OutboxAPI,
    ProjectsAPI,
    RecoveryAPI,
    ResourcesAPI,
    RunsAPI,
    SessionsAPI,
    ThreadsAPI,
    ToolsAPI,
    UsageAPI,
)

from .runner import Call


class AsyncArchives:
    """``store.archives`` with ``async def`` methods (:class:`ArchivesAPI`)."""

    def __init__(self, area: ArchivesAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.archives`` this one awaits."""
        self._run = run

    async def save_run(self, run: ResponseRun, *, lease: Lease | None = None) -> ResponseRun:
        """The sync ``archives.save_run``, awaited (same arguments and errors)."""
        return await self._run(self.sync.save_run, run, lease=lease)

    async def save_turn(self, turn: ResponseTurn, *, lease: Lease | None = None) -> ResponseTurn:
        """The sync ``archives.save_turn``, awaited (same arguments and errors)."""
        return await self._run(self.sync.save_turn, turn, lease=lease)

    async def save_item(self, item: ResponseItem, *, lease: Lease | None = None) -> ResponseItem:
        """The sync ``archives.save_item``, awaited (same arguments and errors)."""
        return await self._run(self.sync.save_item, item, lease=lease)

    async def get_run(self, session_id: str, local_run_id: str) -> ResponseRun | None:
        """The sync ``archives.get_run``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get_run, session_id, local_run_id)

    async def get_turn(self, session_id: str, local_turn_id: str) -> ResponseTurn | None:
        """The sync ``archives.get_turn``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get_turn, session_id, local_turn_id)

    async def runs(self, session_id: str, *, limit: int = 100) -> list[ResponseRun]:
        """The sync ``archives.runs``, awaited (same arguments and errors)."""
        return await self._run(self.sync.runs, session_id, limit=limit)

    async def items(self, session_id: str, local_turn_id: str) -> list[ResponseItem]:
        """The sync ``archives.items``, awaited (same arguments and errors)."""
        return await self._run(self.sync.items, session_id, local_turn_id)

    async def replay_items(self, session_id: str, *, limit: int = 1000) -> list[Any]:
        """The sync ``archives.replay_items``, awaited (same arguments and errors)."""
        return await self._run(self.sync.replay_items, session_id, limit=limit)

    async def replay_turns(self, session_id: str, *, limit: int = 500) -> list[ResponseReplayTurn]:
        """The sync ``archives.replay_turns``, awaited (same arguments and errors)."""
        return await self._run(self.sync.replay_turns, session_id, limit=limit)


class AsyncBindings:
    """``store.bindings`` with ``async def`` methods (:class:`BindingsAPI`)."""

    def __init__(self, area: BindingsAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.bindings`` this one awaits."""
        self._run = run

    async def bind(
        self,
        session_id: str,
        channel_type: str,
        channel_id: str,
        *,
        lease: Lease | None = None,
    ) -> Binding:
        """The sync ``bindings.bind``, awaited (same arguments and errors)."""
        return await self._run(self.sync.bind, session_id, channel_type, channel_id, lease=lease)

    async def unbind(self, session_id: str, *, lease: Lease | None = None) -> Binding | None:
        """The sync ``bindings.unbind``, awaited (same arguments and errors)."""
        return await self._run(self.sync.unbind, session_id, lease=lease)

    async def transfer(
        self,
        channel_type: str,
        channel_id: str,
        from_session_id: str,
        to_session_id: str,
        *,
        leases: Sequence[Lease] = (),
    ) -> Binding:
        """The sync ``bindings.transfer``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.transfer,
            channel_type,
            channel_id,
            from_session_id,
            to_session_id,
            leases=leases,
        )

    async def find(self, channel_type: str, channel_id: str) -> Binding | None:
        """The sync ``bindings.find``, awaited (same arguments and errors)."""
        return await self._run(self.sync.find, channel_type, channel_id)

    async def find_by_session(self, session_id: str) -> Binding | None:
        """The sync ``bindings.find_by_session``, awaited (same arguments and errors)."""
        return await self._run(self.sync.find_by_session, session_id)

    async def create_bound(
        self,
        channel_type: str,
        channel_id: str,
        *,
        session_id: str | None = None,
        cwd: str = "",
        header: Mapping[str, Any] | None = None,
    ) -> Session:
        """The sync ``bindings.create_bound``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.create_bound,
            channel_type,
            channel_id,
            session_id=session_id,
            cwd=cwd,
            header=header,
        )

    async def rotate(
        self,
        channel_type: str,
        channel_id: str,
        old_session_id: str,
        *,
        session_id: str | None = None,
        cwd: str | None = None,
        header: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
    ) -> Session:
        """The sync ``bindings.rotate``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.rotate,
            channel_type,
            channel_id,
            old_session_id,
            session_id=session_id,
            cwd=cwd,
            header=header,
            lease=lease,
        )

    async def set_tools(
        self,
        session_id: str,
        tools: Sequence[ChannelToolConfig],
        *,
        lease: Lease | None = None,
    ) -> int:
        """The sync ``bindings.set_tools``, awaited (same arguments and errors)."""
        return await self._run(self.sync.set_tools, session_id, tools, lease=lease)

    async def tools(self, session_id: str) -> list[ChannelToolConfig]:
        """The sync ``bindings.tools``, awaited (same arguments and errors)."""
        return await self._run(self.sync.tools, session_id)

    async def tool_generation(self, session_id: str) -> int:
        """The sync ``bindings.tool_generation``, awaited (same arguments and errors)."""
        return await self._run(self.sync.tool_generation, session_id)

    async def list(self, *, channel_type: str | None = None) -> list[Binding]:
        """The sync ``bindings.list``, awaited (same arguments and errors)."""
        return await self._run(self.sync.list, channel_type=channel_type)


class AsyncCapabilities:
    """``store.capabilities`` with ``async def`` methods (:class:`CapabilitiesAPI`)."""

    def __init__(self, area: CapabilitiesAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.capabilities`` this one awaits."""
        self._run = run

    async def save(
        self,
        capabilities: SessionCapabilities,
        *,
        lease: Lease | None = None,
    ) -> SessionCapabilities:
        """The sync ``capabilities.save``, awaited (same arguments and errors)."""
        return await self._run(self.sync.save, capabilities, lease=lease)

    async def load(self, session_id: str) -> SessionCapabilities | None:
        """The sync ``capabilities.load``, awaited (same arguments and errors)."""
        return await self._run(self.sync.load, session_id)

    async def record_event(self, event: CapabilityEvent, *, lease: Lease | None = None) -> str:
        """The sync ``capabilities.record_event``, awaited (same arguments and errors)."""
        return await self._run(self.sync.record_event, event, lease=lease)

    async def events(
        self,
        session_id: str,
        *,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> list[SequencedCapabilityEvent]:
        """The sync ``capabilities.events``, awaited (same arguments and errors)."""
        return await self._run(self.sync.events, session_id, after_seq=after_seq, limit=limit)


class AsyncForks:
    """``store.forks`` with ``async def`` methods (:class:`ForksAPI`)."""

    def __init__(self, area: ForksAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.forks`` this one awaits."""
        self._run = run

    async def fork(
        self,
        source_session_id: str,
        *,
        request_id: str,
        boundary_turn_id: str | None = None,
        at_seq: int | None = None,
        fork_session_id: str | None = None,
        lease: Lease | None = None,
    ) -> Fork:
        """The sync ``forks.fork``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.fork,
            source_session_id,
            request_id=request_id,
            boundary_turn_id=boundary_turn_id,
            at_seq=at_seq,
            fork_session_id=fork_session_id,
            lease=lease,
        )

    async def get(self, request_id: str) -> Fork | None:
        """The sync ``forks.get``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get, request_id)


class AsyncGuidance:
    """``store.guidance`` with ``async def`` methods (:class:`GuidanceAPI`)."""

    def __init__(self, area: GuidanceAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.guidance`` this one awaits."""
        self._run = run

    async def save(self, guidance: Guidance) -> Guidance:
        """The sync ``guidance.save``, awaited (same arguments and errors)."""
        return await self._run(self.sync.save, guidance)

    async def consume(
        self,
        session_id: str,
        ids: Sequence[str],
        *,
        lease: Lease | None = None,
    ) -> int:
        """The sync ``guidance.consume``, awaited (same arguments and errors)."""
        return await self._run(self.sync.consume, session_id, ids, lease=lease)

    async def list(
        self,
        session_id: str,
        *,
        status: str = "",
        limit: int | None = None,
    ) -> list[Guidance]:
        """The sync ``guidance.list``, awaited (same arguments and errors)."""
        return await self._run(self.sync.list, session_id, status=status, limit=limit)


class AsyncKeys:
    """``store.keys`` with ``async def`` methods (:class:`KeysAPI`)."""

    def __init__(self, area: KeysAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.keys`` this one awaits."""
        self._run = run

    async def rotate(
        self,
        lease: Lease,
        *,
        limit: int | None = None,
        batch_rows: int = 500,
    ) -> KeyRotationReport:
        """The sync ``keys.rotate``, awaited (same arguments and errors)."""
        return await self._run(self.sync.rotate, lease, limit=limit, batch_rows=batch_rows)

    async def reclaim(self) -> list[str]:
        """The sync ``keys.reclaim``, awaited (same arguments and errors)."""
        return await self._run(self.sync.reclaim)


class AsyncLeases:
    """``store.leases`` with ``async def`` methods (:class:`LeasesAPI`)."""

    def __init__(self, area: LeasesAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.leases`` this one awaits."""
        self._run = run

    async def acquire(
        self,
        target: str,
        owner: str,
        ttl_s: float,
        *,
        purpose: str = "mutation",
        run_id: str | None = None,
    ) -> Lease:
        """The sync ``leases.acquire``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.acquire,
            target,
            owner,
            ttl_s,
            purpose=purpose,
            run_id=run_id,
        )

    async def renew(self, lease: Lease, ttl_s: float) -> Lease:
        """The sync ``leases.renew``, awaited (same arguments and errors)."""
        return await self._run(self.sync.renew, lease, ttl_s)

    async def release(self, lease: Lease) -> bool:
        """The sync ``leases.release``, awaited (same arguments and errors)."""
        return await self._run(self.sync.release, lease)

    async def validate(
        self,
        lease: Lease,
        *,
        run_id: str | None = None,
        purpose: str | None = None,
    ) -> None:
        """The sync ``leases.validate``, awaited (same arguments and errors)."""
        return await self._run(self.sync.validate, lease, run_id=run_id, purpose=purpose)

    async def bind_run(self, lease: Lease, run_id: str) -> Lease:
        """The sync ``leases.bind_run``, awaited (same arguments and errors)."""
        return await self._run(self.sync.bind_run, lease, run_id)


class AsyncLedgerBase:
    """``store.ledger`` with ``async def`` methods (:class:`LedgerAPI`)."""

    def __init__(self, area: LedgerAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.ledger`` this one awaits."""
        self._run = run

    @property
    def tenant(self) -> str:
        """``store.ledger.tenant``."""
        return self.sync.tenant

    @property
    def blobs(self) -> BlobStore:
        """``store.ledger.blobs``."""
        return self.sync.blobs

    @property
    def offload_threshold(self) -> int:
        """``store.ledger.offload_threshold``."""
        return self.sync.offload_threshold

    @property
    def max_body_bytes(self) -> int:
        """``store.ledger.max_body_bytes``."""
        return self.sync.max_body_bytes

    async def gc(
        self,
        session_id: str,
        lease: Lease | None,
        *,
        temp_grace_s: float = 3600.0,
    ) -> GCResult:
        """The sync ``ledger.gc``, awaited (same arguments and errors)."""
        return await self._run(self.sync.gc, session_id, lease, temp_grace_s=temp_grace_s)

    async def check_entries(
        self,
        entries: Sequence[LedgerEntry],
        *,
        opening: bool = False,
    ) -> list[LedgerEntry]:
        """The sync ``ledger.check_entries``, awaited (same arguments and errors)."""
        return await self._run(self.sync.check_entries, entries, opening=opening)

    async def tip(self, session_id: str) -> int:
        """The sync ``ledger.tip``, awaited (same arguments and errors)."""
        return await self._run(self.sync.tip, session_id)

    async def read_command_application_at(self, session_id: str, seq: int) -> CommandApplication:
        """The sync ``ledger.read_command_application_at``, awaited (same arguments and errors)."""
        return await self._run(self.sync.read_command_application_at, session_id, seq)

    async def workspace_checkpoint_by_seq(
        self,
        session_id: str,
        seq: int,
    ) -> CheckpointSummary | None:
        """The sync ``ledger.workspace_checkpoint_by_seq``, awaited (same arguments and errors)."""
        return await self._run(self.sync.workspace_checkpoint_by_seq, session_id, seq)

    async def workspace_checkpoint_by_turn(
        self,
        session_id: str,
        turn_id: str,
    ) -> CheckpointSummary | None:
        """The sync ``ledger.workspace_checkpoint_by_turn``, awaited (same arguments and errors)."""
        return await self._run(self.sync.workspace_checkpoint_by_turn, session_id, turn_id)

    async def workspace_live_refs(self, session_ids: Sequence[str] | None = None) -> frozenset[str]:
        """The sync ``ledger.workspace_live_refs``, awaited (same arguments and errors)."""
        return await self._run(self.sync.workspace_live_refs, session_ids)

    async def sweep_deleted(
        self,
        session_ids: Sequence[str] | None = None,
        *,
        temp_grace_s: float = 3600.0,
    ) -> GCResult:
        """The sync ``ledger.sweep_deleted``, awaited (same arguments and errors)."""
        return await self._run(self.sync.sweep_deleted, session_ids, temp_grace_s=temp_grace_s)

    async def persistence_paths(self) -> list[str]:
        """The sync ``ledger.persistence_paths``, awaited (same arguments and errors)."""
        return await self._run(self.sync.persistence_paths)


class AsyncLineage:
    """``store.lineage`` with ``async def`` methods (:class:`LineageAPI`)."""

    def __init__(self, area: LineageAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.lineage`` this one awaits."""
        self._run = run

    async def get(self, session_id: str) -> ResponseState | None:
        """The sync ``lineage.get``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get, session_id)

    async def compare_and_swap(
        self,
        state: ResponseState,
        expected_version: int,
        *,
        lease: Lease | None = None,
    ) -> bool:
        """The sync ``lineage.compare_and_swap``, awaited (same arguments and errors)."""
        return await self._run(self.sync.compare_and_swap, state, expected_version, lease=lease)


class AsyncOutbox:
    """``store.outbox`` with ``async def`` methods (:class:`OutboxAPI`)."""

    def __init__(self, area: OutboxAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.outbox`` this one awaits."""
        self._run = run

    async def create_plan(
        self,
        run_id: str,
        plan: DeliveryPlan,
        *,
        lease: Lease | None = None,
    ) -> DeliveryIntent:
        """The sync ``outbox.create_plan``, awaited (same arguments and errors)."""
        return await self._run(self.sync.create_plan, run_id, plan, lease=lease)

    async def get_plan(
        self,
        intent_id: str,
    ) -> tuple[DeliveryIntent, list[DeliveryOperation]] | None:
        """The sync ``outbox.get_plan``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get_plan, intent_id)

    async def get_operation(self, operation_id: str) -> DeliveryOperation | None:
        """The sync ``outbox.get_operation``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get_operation, operation_id)

    async def delivered_entry(self, operation_id: str) -> Entry | None:
        """The sync ``outbox.delivered_entry``, awaited (same arguments and errors)."""
        return await self._run(self.sync.delivered_entry, operation_id)

    async def list_due(self, *, limit: int = 100) -> list[DeliveryOperation]:
        """The sync ``outbox.list_due``, awaited (same arguments and errors)."""
        return await self._run(self.sync.list_due, limit=limit)

    async def claim(self, operation_id: str, owner: str, ttl_s: float) -> DeliveryOperation:
        """The sync ``outbox.claim``, awaited (same arguments and errors)."""
        return await self._run(self.sync.claim, operation_id, owner, ttl_s)

    async def update_progress(
        self,
        operation_id: str,
        owner: str,
        epoch: int,
        *,
        provider_asset_id: str | None = None,
        provider_message_id: str | None = None,
        provider_state: Mapping[str, Any] | None = None,
        failure_code: str | None = None,
    ) -> DeliveryOperation:
        """The sync ``outbox.update_progress``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.update_progress,
            operation_id,
            owner,
            epoch,
            provider_asset_id=provider_asset_id,
            provider_message_id=provider_message_id,
            provider_state=provider_state,
            failure_code=failure_code,
        )

    async def finish(
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
    ) -> DeliveryOperation:
        """The sync ``outbox.finish``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.finish,
            operation_id,
            owner,
            epoch,
            status,
            provider_asset_id=provider_asset_id,
            provider_message_id=provider_message_id,
            provider_state=provider_state,
            failure_code=failure_code,
        )

    async def requeue(
        self,
        operation_id: str,
        owner: str,
        epoch: int,
        *,
        delay_s: float = 0.0,
        failure_code: str = "",
    ) -> DeliveryOperation:
        """The sync ``outbox.requeue``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.requeue,
            operation_id,
            owner,
            epoch,
            delay_s=delay_s,
            failure_code=failure_code,
        )


class AsyncProjects:
    """``store.projects`` with ``async def`` methods (:class:`ProjectsAPI`)."""

    def __init__(self, area: ProjectsAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.projects`` this one awaits."""
        self._run = run

    async def create(self, name: str, *, project_id: str | None = None) -> Project:
        """The sync ``projects.create``, awaited (same arguments and errors)."""
        return await self._run(self.sync.create, name, project_id=project_id)

    async def get(self, project_id: str) -> Project | None:
        """The sync ``projects.get``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get, project_id)

    async def rename(self, project_id: str, name: str) -> Project:
        """The sync ``projects.rename``, awaited (same arguments and errors)."""
        return await self._run(self.sync.rename, project_id, name)

    async def delete(
        self,
        project_id: str,
        *,
        leases: Sequence[Lease] = (),
    ) -> list[DeletedSession]:
        """The sync ``projects.delete``, awaited (same arguments and errors)."""
        return await self._run(self.sync.delete, project_id, leases=leases)

    async def list(self) -> list[Project]:
        """The sync ``projects.list``, awaited (same arguments and errors)."""
        return await self._run(self.sync.list)


class AsyncRecovery:
    """``store.recovery`` with ``async def`` methods (:class:`RecoveryAPI`)."""

    def __init__(self, area: RecoveryAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.recovery`` this one awaits."""
        self._run = run

    async def list_orphans(self) -> list[Run]:
        """The sync ``recovery.list_orphans``, awaited (same arguments and errors)."""
        return await self._run(self.sync.list_orphans)

    async def get(self, run_id: str) -> Recovery | None:
        """The sync ``recovery.get``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get, run_id)

    async def begin(
        self,
        run_id: str,
        lease: Lease,
        *,
        trigger_source: str = "sweep",
        reason: str = "orphaned",
    ) -> Recovery:
        """The sync ``recovery.begin``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.begin,
            run_id,
            lease,
            trigger_source=trigger_source,
            reason=reason,
        )

    async def converge(
        self,
        run_id: str,
        lease: Lease,
        *,
        status: str = "interrupted",
        error: str | None = None,
        stop_reason: str | None = None,
        decisions: Sequence[Mapping[str, Any]] = (),
        delivery_plan: DeliveryPlan | None = None,
    ) -> Recovery:
        """The sync ``recovery.converge``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.converge,
            run_id,
            lease,
            status=status,
            error=error,
            stop_reason=stop_reason,
            decisions=decisions,
            delivery_plan=delivery_plan,
        )

    async def fail(
        self,
        run_id: str,
        lease: Lease,
        message: str,
        *,
        max_attempts: int = 5,
        base_delay_s: float = 1.0,
        max_delay_s: float = 300.0,
    ) -> Recovery:
        """The sync ``recovery.fail``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.fail,
            run_id,
            lease,
            message,
            max_attempts=max_attempts,
            base_delay_s=base_delay_s,
            max_delay_s=max_delay_s,
        )

    async def detach(self, run_id: str, lease: Lease) -> Recovery:
        """The sync ``recovery.detach``, awaited (same arguments and errors)."""
        return await self._run(self.sync.detach, run_id, lease)


class AsyncResources:
    """``store.resources`` with ``async def`` methods (:class:`ResourcesAPI`)."""

    def __init__(self, area: ResourcesAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.resources`` this one awaits."""
        self._run = run

    async def record_event(self, event: InputResourceEvent, *, lease: Lease | None = None) -> str:
        """The sync ``resources.record_event``, awaited (same arguments and errors)."""
        return await self._run(self.sync.record_event, event, lease=lease)

    async def events(self, session_id: str) -> list[InputResourceEvent]:
        """The sync ``resources.events``, awaited (same arguments and errors)."""
        return await self._run(self.sync.events, session_id)


class AsyncRuns:
    """``store.runs`` with ``async def`` methods (:class:`RunsAPI`)."""

    def __init__(self, area: RunsAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.runs`` this one awaits."""
        self._run = run

    async def admit(
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
    ) -> Run:
        """The sync ``runs.admit``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.admit,
            session_id,
            request,
            submission_key=submission_key,
            user_message=user_message,
            lease=lease,
            retry_of=retry_of,
            source=source,
            model=model,
            mode=mode,
            work_dir=work_dir,
            policy=policy,
            start=start,
            on_active=on_active,
            resource_events=resource_events,
            intent_id=intent_id,
        )

    async def turns(self, session_id: str) -> list[ConversationTurn]:
        """The sync ``runs.turns``, awaited (same arguments and errors)."""
        return await self._run(self.sync.turns, session_id)

    async def intent(self, intent_id: str) -> ExecutionIntent | None:
        """The sync ``runs.intent``, awaited (same arguments and errors)."""
        return await self._run(self.sync.intent, intent_id)

    async def submission(self, session_id: str, submission_key: str) -> RuntimeSubmission | None:
        """The sync ``runs.submission``, awaited (same arguments and errors)."""
        return await self._run(self.sync.submission, session_id, submission_key)

    async def latest_event_seq(self, run_id: str) -> int:
        """The sync ``runs.latest_event_seq``, awaited (same arguments and errors)."""
        return await self._run(self.sync.latest_event_seq, run_id)

    async def latest_for_intent(self, session_id: str, intent_id: str) -> Run | None:
        """The sync ``runs.latest_for_intent``, awaited (same arguments and errors)."""
        return await self._run(self.sync.latest_for_intent, session_id, intent_id)

    async def save_intent(
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
    ) -> ExecutionIntent:
        """The sync ``runs.save_intent``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.save_intent,
            session_id,
            request,
            intent_id=intent_id,
            source=source,
            model=model,
            mode=mode,
            work_dir=work_dir,
            policy=policy,
            lease=lease,
        )

    async def record_event(
        self,
        run_id: str,
        event_type: str,
        data: Mapping[str, Any] | None = None,
        *,
        event_id: str | None = None,
        lease: Lease | None = None,
    ) -> RunEvent:
        """The sync ``runs.record_event``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.record_event,
            run_id,
            event_type,
            data,
            event_id=event_id,
            lease=lease,
        )

    async def start_turn(
        self,
        run_id: str,
        turn_id: str,
        *,
        lease: Lease | None = None,
    ) -> ConversationTurn:
        """The sync ``runs.start_turn``, awaited (same arguments and errors)."""
        return await self._run(self.sync.start_turn, run_id, turn_id, lease=lease)

    async def end_turn(
        self,
        turn_id: str,
        status: str,
        *,
        stop_reason: str | None = None,
        lease: Lease | None = None,
    ) -> ConversationTurn:
        """The sync ``runs.end_turn``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.end_turn,
            turn_id,
            status,
            stop_reason=stop_reason,
            lease=lease,
        )

    async def start(self, run_id: str, *, lease: Lease | None = None) -> Run:
        """The sync ``runs.start``, awaited (same arguments and errors)."""
        return await self._run(self.sync.start, run_id, lease=lease)

    async def wait(self, run_id: str, *, lease: Lease | None = None) -> Run:
        """The sync ``runs.wait``, awaited (same arguments and errors)."""
        return await self._run(self.sync.wait, run_id, lease=lease)

    async def resume(self, run_id: str, *, lease: Lease | None = None) -> Run:
        """The sync ``runs.resume``, awaited (same arguments and errors)."""
        return await self._run(self.sync.resume, run_id, lease=lease)

    async def finish(
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
    ) -> Run:
        """The sync ``runs.finish``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.finish,
            run_id,
            status,
            assistant_message=assistant_message,
            error=error,
            stop_reason=stop_reason,
            lease=lease,
            delivery_plan=delivery_plan,
            entries=entries,
        )

    async def request_cancel(self, run_id: str) -> Run:
        """The sync ``runs.request_cancel``, awaited (same arguments and errors)."""
        return await self._run(self.sync.request_cancel, run_id)

    async def get(self, run_id: str) -> Run | None:
        """The sync ``runs.get``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get, run_id)

    async def active(self, session_id: str) -> Run | None:
        """The sync ``runs.active``, awaited (same arguments and errors)."""
        return await self._run(self.sync.active, session_id)

    async def events(
        self,
        session_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        latest: bool = False,
        limit: int = 100,
    ) -> list[RunEvent]:
        """The sync ``runs.events``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.events,
            session_id,
            after=after,
            before=before,
            latest=latest,
            limit=limit,
        )

    async def annotate_error(self, run_id: str, reason: str, *, lease: Lease | None = None) -> bool:
        """The sync ``runs.annotate_error``, awaited (same arguments and errors)."""
        return await self._run(self.sync.annotate_error, run_id, reason, lease=lease)

    async def update_usage(
        self,
        run_id: str,
        usage: Mapping[str, Any] | None,
        context_usage: Mapping[str, Any] | None = None,
        *,
        lease: Lease | None = None,
    ) -> Run:
        """The sync ``runs.update_usage``, awaited (same arguments and errors)."""
        return await self._run(self.sync.update_usage, run_id, usage, context_usage, lease=lease)

    async def update_progress(
        self,
        run_id: str,
        progress: Mapping[str, Any],
        *,
        lease: Lease | None = None,
    ) -> Run:
        """The sync ``runs.update_progress``, awaited (same arguments and errors)."""
        return await self._run(self.sync.update_progress, run_id, progress, lease=lease)

    async def update_error_info(
        self,
        run_id: str,
        info: Mapping[str, Any],
        *,
        lease: Lease | None = None,
    ) -> Run:
        """The sync ``runs.update_error_info``, awaited (same arguments and errors)."""
        return await self._run(self.sync.update_error_info, run_id, info, lease=lease)

    async def list(self, session_id: str) -> list[Run]:
        """The sync ``runs.list``, awaited (same arguments and errors)."""
        return await self._run(self.sync.list, session_id)


class AsyncSessions:
    """``store.sessions`` with ``async def`` methods (:class:`SessionsAPI`)."""

    def __init__(self, area: SessionsAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.sessions`` this one awaits."""
        self._run = run

    async def create(
        self,
        session_id: str | None = None,
        *,
        cwd: str = "",
        header: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> Session:
        """The sync ``sessions.create``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.create,
            session_id,
            cwd=cwd,
            header=header,
            created_at=created_at,
        )

    async def get(self, session_id: str) -> Session | None:
        """The sync ``sessions.get``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get, session_id)

    async def append(
        self,
        session_id: str,
        kind: str,
        payload: Mapping[str, Any],
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        entry_id: str | None = None,
        timestamp: datetime | None = None,
    ) -> Entry:
        """The sync ``sessions.append``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.append,
            session_id,
            kind,
            payload,
            expected_leaf=expected_leaf,
            lease=lease,
            entry_id=entry_id,
            timestamp=timestamp,
        )

    async def append_many(
        self,
        session_id: str,
        entries: Sequence[NewEntry | tuple[str, Mapping[str, Any]]],
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
    ) -> list[Entry]:
        """The sync ``sessions.append_many``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.append_many,
            session_id,
            entries,
            expected_leaf=expected_leaf,
            lease=lease,
        )

    async def set_label(
        self,
        session_id: str,
        target_id: str,
        label: str | None,
        *,
        lease: Lease | None = None,
    ) -> Entry:
        """The sync ``sessions.set_label``, awaited (same arguments and errors)."""
        return await self._run(self.sync.set_label, session_id, target_id, label, lease=lease)

    async def set_title(
        self,
        session_id: str,
        name: str,
        *,
        source: str | None = None,
        lease: Lease | None = None,
    ) -> Entry:
        """The sync ``sessions.set_title``, awaited (same arguments and errors)."""
        return await self._run(self.sync.set_title, session_id, name, source=source, lease=lease)

    async def branch(
        self,
        session_id: str,
        entry_id: str | None,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
    ) -> None:
        """The sync ``sessions.branch``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.branch,
            session_id,
            entry_id,
            expected_leaf=expected_leaf,
            lease=lease,
        )

    async def branch_with_summary(
        self,
        session_id: str,
        entry_id: str,
        summary: str,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        details: Any = None,
    ) -> Entry:
        """The sync ``sessions.branch_with_summary``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.branch_with_summary,
            session_id,
            entry_id,
            summary,
            expected_leaf=expected_leaf,
            lease=lease,
            details=details,
        )

    async def entries(self, session_id: str) -> list[Entry]:
        """The sync ``sessions.entries``, awaited (same arguments and errors)."""
        return await self._run(self.sync.entries, session_id)

    async def entries_after(
        self,
        session_id: str,
        after_seq: int = 0,
        *,
        offset: int = 0,
        limit: int = 100,
    ) -> list[Entry]:
        """The sync ``sessions.entries_after``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.entries_after,
            session_id,
            after_seq,
            offset=offset,
            limit=limit,
        )

    async def entry(self, session_id: str, entry_id: str) -> Entry | None:
        """The sync ``sessions.entry``, awaited (same arguments and errors)."""
        return await self._run(self.sync.entry, session_id, entry_id)

    async def replay(self, session_id: str) -> Replay:
        """The sync ``sessions.replay``, awaited (same arguments and errors)."""
        return await self._run(self.sync.replay, session_id)

    async def labels(self, session_id: str) -> dict[str, str]:
        """The sync ``sessions.labels``, awaited (same arguments and errors)."""
        return await self._run(self.sync.labels, session_id)

    async def import_batch(self, batch: ImportBatch, *, lease: Lease | None = None) -> ImportResult:
        """The sync ``sessions.import_batch``, awaited (same arguments and errors)."""
        return await self._run(self.sync.import_batch, batch, lease=lease)

    async def imported_source(self, session_id: str, source: str) -> ImportedSource | None:
        """The sync ``sessions.imported_source``, awaited (same arguments and errors)."""
        return await self._run(self.sync.imported_source, session_id, source)

    async def opaque_records(self, session_id: str) -> list[OpaqueRecord]:
        """The sync ``sessions.opaque_records``, awaited (same arguments and errors)."""
        return await self._run(self.sync.opaque_records, session_id)

    async def count(
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
    ) -> int:
        """The sync ``sessions.count``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.count,
            search=search,
            messages_only=messages_only,
            cwd=cwd,
            include_sub_agents=include_sub_agents,
            status=status,
            project_id=project_id,
            channel_type=channel_type,
            channel_id=channel_id,
        )

    async def continue_recent(
        self,
        cwd: str,
        *,
        header: Mapping[str, Any] | None = None,
    ) -> Session:
        """The sync ``sessions.continue_recent``, awaited (same arguments and errors)."""
        return await self._run(self.sync.continue_recent, cwd, header=header)

    async def open(self, value: str, *, cwd: str | None = None) -> Session:
        """The sync ``sessions.open``, awaited (same arguments and errors)."""
        return await self._run(self.sync.open, value, cwd=cwd)

    async def new_sub_agent(
        self,
        parent_id: str,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        header: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> Session:
        """The sync ``sessions.new_sub_agent``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.new_sub_agent,
            parent_id,
            session_id,
            cwd=cwd,
            header=header,
            created_at=created_at,
        )

    async def sub_agents(self, parent_id: str) -> list[Session]:
        """The sync ``sessions.sub_agents``, awaited (same arguments and errors)."""
        return await self._run(self.sync.sub_agents, parent_id)

    async def messages_after(
        self,
        session_id: str,
        after_seq: int,
        *,
        limit: int = 100,
    ) -> list[SequencedMessage]:
        """The sync ``sessions.messages_after``, awaited (same arguments and errors)."""
        return await self._run(self.sync.messages_after, session_id, after_seq, limit=limit)

    async def messages_before(
        self,
        session_id: str,
        before_seq: int,
        *,
        limit: int = 100,
    ) -> list[SequencedMessage]:
        """The sync ``sessions.messages_before``, awaited (same arguments and errors)."""
        return await self._run(self.sync.messages_before, session_id, before_seq, limit=limit)

    async def messages_latest(self, session_id: str, *, limit: int = 100) -> list[SequencedMessage]:
        """The sync ``sessions.messages_latest``, awaited (same arguments and errors)."""
        return await self._run(self.sync.messages_latest, session_id, limit=limit)

    async def messages_with_seq(self, session_id: str) -> list[SequencedMessage]:
        """The sync ``sessions.messages_with_seq``, awaited (same arguments and errors)."""
        return await self._run(self.sync.messages_with_seq, session_id)

    async def latest(self, session_id: str, kind: str) -> Entry | None:
        """The sync ``sessions.latest``, awaited (same arguments and errors)."""
        return await self._run(self.sync.latest, session_id, kind)

    async def header(self, session_id: str) -> Mapping[str, Any]:
        """The sync ``sessions.header``, awaited (same arguments and errors)."""
        return await self._run(self.sync.header, session_id)

    async def execution_facts(self, session_id: str) -> ExecutionFacts:
        """The sync ``sessions.execution_facts``, awaited (same arguments and errors)."""
        return await self._run(self.sync.execution_facts, session_id)

    async def path_after(
        self,
        session_id: str,
        after_seq: int = 0,
        *,
        leaf_id: str | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        """The sync ``sessions.path_after``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.path_after,
            session_id,
            after_seq,
            leaf_id=leaf_id,
            limit=limit,
        )

    async def path_latest(
        self,
        session_id: str,
        limit: int,
        *,
        leaf_id: str | None = None,
    ) -> list[Entry]:
        """The sync ``sessions.path_latest``, awaited (same arguments and errors)."""
        return await self._run(self.sync.path_latest, session_id, limit, leaf_id=leaf_id)

    async def custom_entry(self, session_id: str, custom_type: str, key: str) -> Entry | None:
        """The sync ``sessions.custom_entry``, awaited (same arguments and errors)."""
        return await self._run(self.sync.custom_entry, session_id, custom_type, key)

    async def custom_entries(
        self,
        session_id: str,
        custom_type: str,
        *,
        before_seq: int | None = None,
        key_prefix: str = "",
        limit: int = 100,
    ) -> list[Entry]:
        """The sync ``sessions.custom_entries``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.custom_entries,
            session_id,
            custom_type,
            before_seq=before_seq,
            key_prefix=key_prefix,
            limit=limit,
        )

    async def list(
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
    ) -> SessionPage:
        """The sync ``sessions.list``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.list,
            limit=limit,
            cursor=cursor,
            search=search,
            offset=offset,
            messages_only=messages_only,
            cwd=cwd,
            include_sub_agents=include_sub_agents,
            status=status,
            project_id=project_id,
            channel_type=channel_type,
            channel_id=channel_id,
        )

    async def delete(self, session_id: str, *, lease: Lease | None = None) -> DeletedSession:
        """The sync ``sessions.delete``, awaited (same arguments and errors)."""
        return await self._run(self.sync.delete, session_id, lease=lease)

    async def deleted(self, session_id: str) -> DeletedSession | None:
        """The sync ``sessions.deleted``, awaited (same arguments and errors)."""
        return await self._run(self.sync.deleted, session_id)

    async def retain(
        self,
        lease: Lease,
        *,
        max_age_s: float | None = None,
        keep_last: int | None = None,
        limit: int = 1000,
    ) -> RetentionReport:
        """The sync ``sessions.retain``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.retain,
            lease,
            max_age_s=max_age_s,
            keep_last=keep_last,
            limit=limit,
        )

    async def rotate_key(self, session_id: str, *, lease: Lease | None = None) -> int:
        """The sync ``sessions.rotate_key``, awaited (same arguments and errors)."""
        return await self._run(self.sync.rotate_key, session_id, lease=lease)

    async def encrypt(self, session_id: str, *, lease: Lease | None = None) -> bool:
        """The sync ``sessions.encrypt``, awaited (same arguments and errors)."""
        return await self._run(self.sync.encrypt, session_id, lease=lease)

    async def get_metadata(self, session_id: str) -> SessionMetadata:
        """The sync ``sessions.get_metadata``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get_metadata, session_id)

    async def set_metadata(
        self,
        session_id: str,
        metadata: SessionMetadata,
        *,
        lease: Lease | None = None,
    ) -> SessionMetadata:
        """The sync ``sessions.set_metadata``, awaited (same arguments and errors)."""
        return await self._run(self.sync.set_metadata, session_id, metadata, lease=lease)

    async def list_detailed(
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
    ) -> DetailPage:
        """The sync ``sessions.list_detailed``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.list_detailed,
            limit=limit,
            cursor=cursor,
            search=search,
            offset=offset,
            messages_only=messages_only,
            cwd=cwd,
            include_sub_agents=include_sub_agents,
            status=status,
            project_id=project_id,
            channel_type=channel_type,
            channel_id=channel_id,
        )


class AsyncThreads:
    """``store.threads`` with ``async def`` methods (:class:`ThreadsAPI`)."""

    def __init__(self, area: ThreadsAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.threads`` this one awaits."""
        self._run = run

    async def resolve(
        self,
        *,
        id: str | None = None,
        key: str | None = None,
        include_archived: bool = False,
    ) -> ThreadRecord | None:
        """The sync ``threads.resolve``, awaited (same arguments and errors)."""
        return await self._run(self.sync.resolve, id=id, key=key, include_archived=include_archived)

    async def finalize(self, request: FinalizeRequest) -> ThreadRecord:
        """The sync ``threads.finalize``, awaited (same arguments and errors)."""
        return await self._run(self.sync.finalize, request)


class AsyncTools:
    """``store.tools`` with ``async def`` methods (:class:`ToolsAPI`)."""

    def __init__(self, area: ToolsAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.tools`` this one awaits."""
        self._run = run

    async def claim(
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
    ) -> tuple[ToolExecution, bool]:
        """The sync ``tools.claim``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.claim,
            execution_key,
            session_id,
            local_turn_id=local_turn_id,
            provider_call_id=provider_call_id,
            tool_name=tool_name,
            side_effecting=side_effecting,
            arguments=arguments,
            run_id=run_id,
            provider=provider,
            api=api,
            response_id=response_id,
            tool_kind=tool_kind,
            provider_metadata=provider_metadata,
            lease=lease,
        )

    async def complete(
        self,
        execution_key: str,
        result: Any,
        *,
        is_error: bool = False,
        lease: Lease | None = None,
    ) -> ToolExecution:
        """The sync ``tools.complete``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.complete,
            execution_key,
            result,
            is_error=is_error,
            lease=lease,
        )

    async def interrupt(
        self,
        session_id: str,
        *,
        local_turn_id: str | None = None,
        reason: str = "process lost",
        lease: Lease | None = None,
    ) -> list[ToolExecution]:
        """The sync ``tools.interrupt``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.interrupt,
            session_id,
            local_turn_id=local_turn_id,
            reason=reason,
            lease=lease,
        )

    async def request_recovery(
        self,
        session_id: str,
        local_turn_id: str,
        provider_call_ids: Sequence[str],
    ) -> list[ToolExecution]:
        """The sync ``tools.request_recovery``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.request_recovery,
            session_id,
            local_turn_id,
            provider_call_ids,
        )

    async def reclaim(
        self,
        execution_key: str,
        *,
        run_id: str | None = None,
        lease: Lease | None = None,
    ) -> ToolExecution:
        """The sync ``tools.reclaim``, awaited (same arguments and errors)."""
        return await self._run(self.sync.reclaim, execution_key, run_id=run_id, lease=lease)

    async def abandon_interrupted(
        self,
        session_id: str,
        local_turn_id: str,
        *,
        reason: str = "abandoned after interruption",
        lease: Lease | None = None,
    ) -> int:
        """The sync ``tools.abandon_interrupted``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.abandon_interrupted,
            session_id,
            local_turn_id,
            reason=reason,
            lease=lease,
        )

    async def get(self, execution_key: str) -> ToolExecution | None:
        """The sync ``tools.get``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get, execution_key)

    async def list(self, session_id: str) -> list[ToolExecution]:
        """The sync ``tools.list``, awaited (same arguments and errors)."""
        return await self._run(self.sync.list, session_id)


class AsyncUsage:
    """``store.usage`` with ``async def`` methods (:class:`UsageAPI`)."""

    def __init__(self, area: UsageAPI, run: Call) -> None:
        self.sync = area
        """The sync ``store.usage`` this one awaits."""
        self._run = run

    async def record(
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
    ) -> UsageRecord:
        """The sync ``usage.record``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.record,
            session_id,
            provider=provider,
            model=model,
            protocol=protocol,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=total_tokens,
            cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens,
            cost_usd=cost_usd,
            duration_ms=duration_ms,
            run_id=run_id,
            entry_id=entry_id,
            usage_id=usage_id,
            recorded_at=recorded_at,
            lease=lease,
        )

    async def record_from_provider(
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
    ) -> UsageRecord:
        """The sync ``usage.record_from_provider``, awaited (same arguments and errors)."""
        return await self._run(
            self.sync.record_from_provider,
            session_id,
            usage,
            provider=provider,
            model=model,
            protocol=protocol,
            cost_usd=cost_usd,
            duration_ms=duration_ms,
            run_id=run_id,
            entry_id=entry_id,
            usage_id=usage_id,
            recorded_at=recorded_at,
            lease=lease,
        )

    async def get(self, session_id: str, usage_id: str) -> UsageRecord | None:
        """The sync ``usage.get``, awaited (same arguments and errors)."""
        return await self._run(self.sync.get, session_id, usage_id)

    async def list(self, session_id: str, *, run_id: str | None = None) -> list[UsageRecord]:
        """The sync ``usage.list``, awaited (same arguments and errors)."""
        return await self._run(self.sync.list, session_id, run_id=run_id)
