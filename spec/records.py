"""Record types the store returns and accepts: frozen dataclasses.

Times are aware UTC ``datetime`` values. JSON-shaped fields (payloads,
checkpoint state, agent identity) are plain ``dict``/``list``/scalar values.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .thread_record import RecordStatus

JSON = Any
"""A JSON-compatible value (dict, list, str, int, float, bool or None)."""


class _AnyLeaf:
    """The type of :data:`ANY_LEAF`."""

    def __repr__(self) -> str:
        return "ANY_LEAF"

    def __reduce__(self) -> str:
        return "ANY_LEAF"


ANY_LEAF: Any = _AnyLeaf()
"""``expected_leaf`` default: append under whatever the current leaf is, read and
written in one transaction. Pass a leaf id (or ``None`` for an empty session)
to make the append a compare-and-set on the leaf instead."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lease (threadstore Lease, plus epoch, purpose and expiry).

    ``token`` is the secret the holder presents on every fenced write; the
    store keeps only its sha256 digest. ``epoch`` strictly increases with each
    grant on ``target``. ``expires_at`` is by the store's clock.
    """

    target: str
    owner: str
    token: str = field(repr=False)
    epoch: int
    purpose: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class ThreadRecord:
    """The durable per-conversation record (threadstore Record).

    ``state`` is the driver-owned resume checkpoint and ``agent`` the caller
    identity captured at persist time, both opaque JSON. ``created_at`` and
    ``updated_at`` are set by the store (UTC); values passed in are ignored.
    """

    id: str
    key: str
    status: RecordStatus = RecordStatus.ACTIVE
    driver_type: str = ""
    agent: JSON = None
    fingerprint: str = ""
    compatibility_fingerprint: str = ""
    session_codec: str = ""
    state: JSON = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class FinalizeRequest:
    """How to persist post-run thread state (threadstore FinalizeRequest).

    Validate every lease in ``held_leases``; then, atomically: save
    ``record``; when ``archive_old``, archive ``previous_id``; when
    ``rebind_active``, point ``key``'s active mapping at ``record.id``. With
    ``require_key_absent`` the whole finalize fails with ``AlreadyExistsError``
    when ``key`` already has an active mapping. ``key`` defaults to
    ``record.key``.
    """

    record: ThreadRecord
    previous_id: str | None = None
    key: str | None = None
    held_leases: Sequence[Lease] = ()
    archive_old: bool = False
    rebind_active: bool = False
    require_key_absent: bool = False


@dataclass(frozen=True, slots=True)
class Session:
    """One session: header facts plus the current leaf and derived summary.

    ``header`` keeps the imported header's fields verbatim (version, cwd,
    parentSession, unknown fields). ``title`` is the latest ``session_info``
    name. ``entry_count`` counts tree entries; ``next_seq`` is the sequence
    the next entry will get.
    """

    id: str
    cwd: str
    created_at: datetime
    updated_at: datetime
    leaf_id: str | None
    title: str | None
    entry_count: int
    next_seq: int
    header: Mapping[str, JSON]
    sub_agent_of: str | None = None
    """The parent session of a sub-agent (``store.sessions.new_sub_agent``), else ``None``."""
    channel_type: str | None = None
    """The channel identity the session is bound to (session seed Header and
    SessionInfo ``ChannelType``; ``store.bindings``), ``None`` for a local session."""
    channel_id: str | None = None
    """The bound channel identity's id (seed ``ChannelID``), ``None`` for a local session."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored session entry (session seed EntryBase plus payload).

    ``kind`` is the entry type string (``message``, ``compaction`` …; unknown
    kinds from imports are kept verbatim). ``payload`` holds every field of
    the entry except ``type``, ``id``, ``parentId`` and ``timestamp``, in its
    original order. ``seq`` is the per-session monotonic sequence that orders
    entries; timestamps never do. ``lease_epoch`` is the epoch of the lease
    the entry was appended under, if any.
    """

    session_id: str
    id: str
    parent_id: str | None
    kind: str
    seq: int
    timestamp: datetime
    payload: Mapping[str, JSON]
    lease_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class NewEntry:
    """An entry to append with ``sessions.append_many``: ``kind`` and ``payload`` as for
    ``sessions.append``; ``entry_id`` (``None``: a random 16-hex id) and ``timestamp``
    (an aware datetime; ``None``: the store's now) as ``sessions.append`` takes them."""

    kind: str
    payload: Mapping[str, JSON]
    entry_id: str | None = None
    timestamp: datetime | None = None


@dataclass(frozen=True, slots=True)
class Replay:
    """The current branch as model context (session seed ReplayState).

    ``messages[i]`` came from entry ``entry_ids[i]``; a compaction contributes
    a ``compactionSummary`` message, a branch summary a ``branchSummary``
    message, a custom message a ``custom`` message. ``model`` is the latest
    model change or assistant model on the path (``{"provider", "modelId"}``)
    and ``thinking_level`` the latest thinking-level change (default ``off``).
    """

    messages: tuple[Mapping[str, JSON], ...]
    entry_ids: tuple[str, ...]
    model: Mapping[str, JSON] | None = None
    thinking_level: str = "off"


@dataclass(frozen=True, slots=True)
class SessionPage:
    """One page of a session listing; pass ``next_cursor`` to get the next."""

    sessions: tuple[Session, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class SessionDetail:
    """A session with what a resume picker shows (session seed SessionDetail):
    ``message_count`` counts its ``message`` entries (every branch), ``preview``
    is its first user message's text, cut to ``storage.ops.listing.PREVIEW_CHARS``
    characters (``""`` when it has none)."""

    session: Session
    message_count: int
    preview: str


@dataclass(frozen=True, slots=True)
class DetailPage:
    """One page of ``store.sessions.list_detailed``; pass ``next_cursor`` to get the next."""

    details: tuple[SessionDetail, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class SequencedMessage:
    """A stored conversation message with its entry's sequence number, the cursor of
    message paging (session seed SequencedMessage): ``message`` is the entry's
    ``message`` payload field (for ``store.sessions.messages_with_seq``, the
    replayed model-context message, a compaction's summary included)."""

    seq: int
    entry_id: str
    message: Mapping[str, JSON]


@dataclass(frozen=True, slots=True)
class LeaseSnapshot:
    """A lease row as stored, without its token (session seed RuntimeLeaseSnapshot):
    ``live`` when it is held and unexpired at the read's ``now``."""

    target: str
    owner: str
    epoch: int
    purpose: str
    state: str
    expires_at: datetime
    live: bool


@dataclass(frozen=True, slots=True)
class ExecutionFacts:
    """A session's durable execution facts, read in one snapshot at one clock sample
    (session seed SessionExecutionFacts): whether the session exists, the store's
    ``now``, its non-terminal runs (normally at most one; more is an inconsistency
    the caller can see), its lease row, the recovery record of each active run
    and the remote run record of the active run (``remote_run``).
    """

    session_id: str
    session_exists: bool
    now: datetime
    active_runs: tuple[Run, ...]
    lease: LeaseSnapshot | None
    recoveries: tuple[Recovery, ...]
    remote_run: ResponseRun | None = None
    """The remote (Responses) run record linked to the session's one active run
    (session seed SessionExecutionFacts.RemoteRun): the newest saved
    :class:`ResponseRun` of the session whose ``local_turn_id`` is that run's
    id or starts with it and ``:``; ``None`` without one, or unless exactly one
    run is active."""


@dataclass(frozen=True, slots=True)
class ImportEntry:
    """One tree entry from an imported file; ``payload`` as in :class:`Entry`."""

    id: str
    parent_id: str | None
    kind: str
    timestamp: datetime
    payload: Mapping[str, JSON]


@dataclass(frozen=True, slots=True)
class OpaqueRecord:
    """A line of an imported file that could not be parsed, kept verbatim.

    ``line`` is the 1-based line number in ``source``.
    """

    source: str
    line: int
    raw: str
    reason: str


@dataclass(frozen=True, slots=True)
class ImportedSource:
    """What an import read of one session file (``sessions.imported_source``):
    ``source`` is the file's resolved path, ``bytes`` how many bytes of it were
    read, ``sha256`` their digest (64 hex digits) and ``entries`` the entries
    the file held then (stored or skipped)."""

    source: str
    bytes: int
    sha256: str
    entries: int


class ImportStream(ABC):
    """A session file's entries read while they are imported, never all held
    (``ImportBatch.entries``; ``turnkeeper.formats.pi`` makes one per file).

    The store iterates it once per attempt of the import's transaction, in
    chunks (``storage/ops/import_chunks.py``), and each iteration reads the
    file again from its start. Once an iteration has ended, :attr:`leaf_id`,
    :attr:`opaque` and :attr:`read` say what that iteration read; the store
    takes them in place of the batch's own fields. An iteration that cannot
    go on raises (``SessionFileError``, ``OSError``): the import's
    transaction is rolled back and nothing is written."""

    @abstractmethod
    def __iter__(self) -> Iterator[ImportEntry]:
        """The entries, in file order, read from the file's start."""

    @property
    @abstractmethod
    def leaf_id(self) -> str | None:
        """The leaf the last whole iteration found (pi: its last entry)."""

    @property
    @abstractmethod
    def opaque(self) -> Sequence[OpaqueRecord]:
        """The unparseable lines the last whole iteration kept."""

    @property
    @abstractmethod
    def read(self) -> ImportedSource | None:
        """What the last whole iteration read of the file (``ImportBatch.read``),
        or ``None`` when the file changed meanwhile."""

    @property
    def from_line(self) -> int:
        """The first line of the file it reads (1; more when it reads only what
        was appended since an import that read the lines before): the opaque
        lines of the file stored before it are kept."""
        return 1


@dataclass(frozen=True, slots=True)
class ImportBatch:
    """A whole session file, parsed: header facts, entries in file order, the leaf.

    ``entries`` is a sequence, or an :class:`ImportStream` read as it is
    imported (its ``leaf_id``, ``opaque`` and ``read`` then replace the
    batch's, which are left empty)."""

    session_id: str
    cwd: str
    created_at: datetime
    header: Mapping[str, JSON]
    entries: Sequence[ImportEntry] | ImportStream
    leaf_id: str | None
    opaque: Sequence[OpaqueRecord] = ()
    source: str = ""
    """The file the batch was read from; a re-import of the same ``source``
    drops its opaque lines that now parse."""
    sub_agent_of: str | None = None
    """The parent session of a sub-agent's transcript (as ``sessions.new_sub_agent``
    links one): set when the import creates the session, which is then left
    out of listings and found through ``sessions.sub_agents(parent)``. The
    parent need not be stored yet (a sub-agent file imported before, or
    without, its parent's)."""
    read: ImportedSource | None = None
    """What was read of the file (its bytes and their digest): recorded with the
    import, in its transaction, so a re-import of the unchanged file can be
    skipped unparsed (``sessions.imported_source``)."""


@dataclass(frozen=True, slots=True)
class ImportResult:
    """What an import changed: ``added`` new entries, ``skipped`` already stored,
    ``opaque_added`` new opaque lines, ``usage_added`` new usage records (of
    assistant messages' usage)."""

    session_id: str
    created: bool
    added: int
    skipped: int
    opaque_added: int
    usage_added: int = 0


@dataclass(frozen=True, slots=True)
class Run:
    """One agent execution of an execution intent (session seed SessionRun).

    ``attempt`` counts runs of the same intent from 1; ``retry_of`` is the
    run this one retries. ``status`` is a :class:`~turnkeeper.spec.run.RunStatus`
    value. ``user_entry_id``/``assistant_entry_id`` are the transcript entries
    the run wrote (ids derived from the run id).

    ``usage`` and ``context_usage`` (token and context-window usage),
    ``progress`` (the latest non-terminal retry/recovery projection) and
    ``error_info`` (the structured terminal or recovery error, beside the
    ``error`` summary) are JSON values a runtime stores with
    ``store.runs.update_usage``, ``update_progress`` and
    ``update_error_info`` (session seed SessionRun Usage, ContextUsage,
    Progress, ErrorInfo); ``None`` until first set.
    """

    id: str
    session_id: str
    intent_id: str
    retry_of: str | None
    attempt: int
    status: str
    cancel_requested: bool
    error: str | None
    started_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    turn_id: str
    usage: JSON = None
    context_usage: JSON = None
    progress: JSON = None
    error_info: JSON = None

    @property
    def user_entry_id(self) -> str:
        """The admitted user entry's id (session seed RunUserEntryID)."""
        return f"{self.id}:user"

    @property
    def assistant_entry_id(self) -> str:
        """The final assistant entry's id (session seed RunAssistantEntryID)."""
        return f"{self.id}:assistant"


@dataclass(frozen=True, slots=True)
class RunEvent:
    """A run lifecycle event; ``seq`` is the session's event cursor (1, 2, 3 …)."""

    session_id: str
    seq: int
    id: str
    run_id: str
    edge: str
    source: str
    dest: str
    data: Mapping[str, JSON]
    occurred_at: datetime


@dataclass(frozen=True, slots=True)
class Recovery:
    """The durable recovery record of an orphaned run (session seed SessionRunRecovery).

    It never grants ownership: the ``recovery``-purpose lease on the run's
    session (epoch ``lease_epoch``) is the only authority. ``attempt`` counts
    recovery attempts; ``next_retry_at`` is set after a failure.
    """

    run_id: str
    session_id: str
    state: str
    trigger_source: str
    reason: str
    attempt: int
    lease_epoch: int
    previous_lease_epoch: int | None
    last_error: str | None
    next_retry_at: datetime | None
    started_at: datetime
    updated_at: datetime
    completed_at: datetime | None


@dataclass(frozen=True, slots=True)
class ResponseState:
    """A session's remote response lineage (session seed ResponseSessionState).

    ``version`` counts swaps from 1; ``0`` in a compare-and-swap means
    "no state yet". ``updated_at`` is set by the store.
    """

    session_id: str
    state_mode: str = ""
    previous_response_id: str = ""
    conversation_id: str = ""
    provider: str = ""
    api: str = ""
    model: str = ""
    version: int = 0
    updated_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class SessionCapabilities:
    """A session's persisted runtime capability state (session seed
    SessionCapabilities): its mode and display mode, and which runtime
    features are on. ``updated_at`` is set by the store when it saves them."""

    session_id: str
    mode: str = ""
    display_mode: str = ""
    delegate_mode: bool = False
    multi_agent: bool = False
    workflows: bool = False
    web_search: bool = False
    browser: bool = False
    a2a_master: bool = False
    updated_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class CapabilityEvent:
    """One capability state transition (session seed SessionCapabilityEvent).

    ``id`` identifies the event: given by the caller (a deterministic id, so a
    retry after an unknown commit is safe) or, when empty, a new UUIDv7 chosen
    by the store. ``timestamp`` defaults to the store's now; ``data`` is any
    JSON value (``None``: none).
    """

    session_id: str
    capability: str
    event_type: str = ""
    id: str = ""
    run_id: str = ""
    source: str = ""
    actor: str = ""
    old_value: str = ""
    new_value: str = ""
    timestamp: datetime | None = None
    data: Any = None


@dataclass(frozen=True, slots=True)
class SequencedCapabilityEvent:
    """A capability event with its cursor (session seed
    SequencedSessionCapabilityEvent): ``seq`` counts the session's capability
    events from 1, in commit order, so ``events(session_id, after_seq=seq)``
    resumes where a reader stopped."""

    seq: int
    event: CapabilityEvent


@dataclass(frozen=True, slots=True)
class Guidance:
    """One piece of guidance queued for a session's runtime (session seed
    ESMGuidance): ``status`` is ``"pending"`` until the runtime consumes it
    (``"consumed"``, ``consumed_at`` set). ``created_at`` defaults to the
    store's now; ``consumed_at`` is set by the store."""

    id: str
    session_id: str
    guidance: str
    objective_version: str = ""
    status: str = "pending"
    created_at: datetime | None = None
    consumed_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class InputResourceEvent:
    """One lifecycle event of a resource a runtime materialized for a run
    (session seed InputResourceEvent): no transport references, only the
    resource's id, the event and its status. ``id`` is the caller's
    deterministic id (a retry after an unknown commit is then safe) or, when
    empty, a new UUIDv7; ``timestamp`` defaults to the store's now; ``data`` is
    any JSON value."""

    session_id: str
    resource_id: str
    event_type: str
    id: str = ""
    run_id: str = ""
    status: str = ""
    timestamp: datetime | None = None
    data: Any = None


@dataclass(frozen=True, slots=True)
class ResponseRun:
    """The durable state of a Responses background run (session seed
    ResponseRun), keyed by ``(session_id, local_run_id)``: saving it again
    replaces what was saved (``id`` and ``created_at`` stay). ``local_turn_id``
    links it to the session run it serves: the run's id, or the run's id and
    ``:`` and more (``run.turn_id`` is one), is how recovery finds a run's
    remote record (``store.recovery.detach``, ``ExecutionFacts.remote_run``).
    ``message_id`` and ``last_event_sequence`` are the caller's numbers;
    ``created_at``/``updated_at`` default to the store's now. ``id`` is set by
    the store: the record's number within its session (1, 2, … in the order
    records were first saved)."""

    session_id: str
    local_run_id: str
    provider: str
    api: str
    state: str
    local_turn_id: str = ""
    message_id: int | None = None
    response_id: str = ""
    polling_url: str = ""
    last_event_sequence: int | None = None
    cancel_requested: bool = False
    created_at: datetime | None = None
    updated_at: datetime | None = None
    id: int = 0


@dataclass(frozen=True, slots=True)
class ResponseTurn:
    """The lineage and lifecycle summary of one Responses API turn (session seed
    ResponseTurn): summaries, not a second transcript. Keyed by ``(session_id,
    local_turn_id)``; saving it again replaces what was saved (``id`` and
    ``created_at`` stay). ``request_summary``/``response_summary`` are JSON
    values (at most 128 KiB each as JSON text). A turn whose ``status`` is
    ``completed`` or ``incomplete`` is replayed (``store.archives.replay_items``).
    ``created_at`` defaults to the store's now; ``id`` is set by the store."""

    session_id: str
    local_turn_id: str
    provider: str
    api: str
    model: str
    state_mode: str
    status: str
    message_id: int | None = None
    request_id: str = ""
    response_id: str = ""
    previous_response_id: str = ""
    conversation_id: str = ""
    incomplete_reason: str = ""
    request_summary: Any = None
    response_summary: Any = None
    created_at: datetime | None = None
    completed_at: datetime | None = None
    id: int = 0


@dataclass(frozen=True, slots=True)
class ResponseItem:
    """One sanitized, normalized output item of a Responses turn (session seed
    ResponseItemArchive; never a raw provider request or response body).
    ``sanitized`` is the item as a JSON value (required; at most 128 KiB as
    JSON text). Keyed by ``(session_id, local_turn_id, item_key)``; an empty
    ``item_key`` becomes ``"<item_id>:<output_index>"``, or
    ``"output:<output_index>"`` without an item id, so saving the same item
    again replaces it. ``created_at`` defaults to the store's now; ``id`` is
    set by the store (the item's number within its session)."""

    session_id: str
    local_turn_id: str
    item_type: str
    sanitized: Any
    response_id: str = ""
    item_id: str = ""
    output_index: int = 0
    item_status: str = ""
    item_key: str = ""
    created_at: datetime | None = None
    id: int = 0


@dataclass(frozen=True, slots=True)
class ResponseReplayTurn:
    """The native output items of one completed local Responses turn, in order
    (session seed ResponseReplayTurn), to place at that turn's assistant
    position when rebuilding a conversation."""

    local_turn_id: str
    items: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class DeletedSession:
    """What remains of a deleted session (the ``deleted_sessions`` row): its id,
    why it went (``reason``: ``"delete"``, ``"project"`` for a project's delete,
    ``"retention"``; a sub-agent deleted with its parent: the parent's), its
    creation and last-update times, when it was deleted, how many entries,
    runs, run events, tool-execution records and delivery operations it had,
    and the epoch of the lease it was deleted under (``None``: deleted without
    one). No content."""

    session_id: str
    reason: str
    created_at: datetime
    last_updated_at: datetime
    deleted_at: datetime
    entries: int
    runs: int
    run_events: int
    tool_executions: int
    delivery_operations: int
    lease_epoch: int | None


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What one retention pass (``store.sessions.retain``) did.

    ``removed``: the sessions it deleted, oldest first; ``skipped``: session id →
    why a session it chose was kept (``"busy"``: a live lease holds it;
    ``"active"``: it has a run that is not terminal; ``"changed"``: it was
    written after the pass chose it; ``"gone"``: another deleted it first);
    ``lease_lost``: the pass's lease was lost, and it stopped there."""

    removed: list[DeletedSession]
    skipped: dict[str, str]
    lease_lost: bool = False


@dataclass(frozen=True, slots=True)
class KeyRotationReport:
    """What one master-key rotation (``store.keys.rotate``, ``turnkeeper keys
    rotate``) did: ``rewrapped``: data keys it rewrapped under the current
    master key; ``already_current``: data keys wrapped by it before the call
    (skipped); ``remaining``: data keys not wrapped by it after the call
    (``limit`` reached, or rewritten meanwhile: run it again; 0: the old
    master keys can be retired); ``check_rewrapped``: the store's check
    value was rewrapped by this call."""

    rewrapped: int
    already_current: int
    remaining: int
    check_rewrapped: bool


@dataclass(frozen=True, slots=True)
class Project:
    """A project (session seed Project): ``id``, display ``name``, times."""

    id: str
    name: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Binding:
    """A current external channel binding (session seed Binding): channel
    identity ``(channel_type, channel_id)`` is bound to session ``session_id``.
    A channel has at most one session and a session at most one channel."""

    session_id: str
    channel_type: str
    channel_id: str


@dataclass(frozen=True, slots=True)
class ChannelToolConfig:
    """One persisted tool selection of a channel session (session seed
    ChannelToolConfig): tool ``tool_name`` is ``enabled`` or not."""

    tool_name: str
    enabled: bool


@dataclass(frozen=True, slots=True)
class SessionMetadata:
    """A session's metadata (session seed SessionMetadata): the project it
    belongs to (``project_id``; ``None``: none) and whether it is ``pinned``."""

    project_id: str | None = None
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class ConversationTurn:
    """A run's conversation turn boundary (session seed ConversationTurn):
    ``start_seq`` is the seq of its ``turn_start`` entry, ``end_seq`` of its
    ``turn_end`` (``None`` while ``status`` is ``open``; else the status it
    ended in: the run's terminal status, or the one ``runs.end_turn`` gave
    it). Opened by ``runs.admit`` (a run's first turn) and ``runs.start_turn``,
    closed by ``runs.end_turn`` and ``runs.finish``."""

    id: str
    session_id: str
    intent_id: str
    run_id: str
    attempt: int
    status: str
    start_seq: int
    end_seq: int | None
    started_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class ExecutionIntent:
    """An accepted request (session seed ExecutionIntent), written by
    ``runs.admit`` for a first attempt: ``request`` and ``policy`` as given,
    ``request_fingerprint`` the sha256 hex digest of the request."""

    id: str
    session_id: str
    source: str
    model: str
    mode: str
    work_dir: str
    request_fingerprint: str
    request: dict[str, Any]
    policy: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RuntimeSubmission:
    """The admission a submission key made (session seed RuntimeSubmission):
    only ``key_digest``, a sha256 hex digest of the session and the key, is
    stored; ``admission_digest`` is the digest of the whole admission the key
    is compared with."""

    session_id: str
    key_digest: str
    admission_digest: str
    intent_id: str
    run_id: str
    created_at: datetime
