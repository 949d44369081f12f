"""The ledger's catalog (sessionstore Catalog, SessionMeta): one summary per
session, derived from its ledger, listed without reading any ledger.

The catalog folds the ledger records of the kinds below (``CATALOG_KINDS``);
each payload is a UTF-8 JSON object. Every other kind (``fence``,
``command_application``, the caller's own) only advances
``last_journal_seq``. Fields marked ``?`` are optional; ids are text;
``usage`` is ``{"input_tokens": int, "output_tokens": int}`` (tokens, ≥ 0);
``context`` is ``{"tokens": int, "window": int}`` or ``null`` (an
invalidation). A payload of these kinds the fold refuses (not such an
object, a usage that is not a count in 0 … ``MAX_COUNT``, a hustle's unknown
source or status …) or nested deeper than ``MAX_PAYLOAD_DEPTH`` is refused
at the append (``InvalidInputError``, the fold's error as ``__cause__``); one
stored before that check is a ``ReplayDecodeError`` (or ``CatalogUsageError``,
``CatalogHustleError``) at its sequence.

- ``session_started`` ``{"created_at": ISO-8601, "agent_kind"?, "config_fingerprint"?}``:
  created time, status ``active``, state ``idle``, residency ``resident``, loop count 1.
- ``turn_started`` ``{"turn_id", "user_text"?}``: the title (the text's first
  non-empty line, at most :data:`TITLE_MAX` characters; kept when the text
  has none), the active turn, state ``running``, last active.
- ``turn_done`` / ``turn_failed`` / ``turn_interrupted`` ``{"turn_id", "summary"?}``:
  the last turn summary, no active turn, state ``idle`` / ``failed`` / ``interrupted``.
- ``step_done`` ``{"loop_id", "turn_id"?, "summary"?, "usage"?, "runtime"?, "context"?}``:
  the last step summary, the loop's cumulative usage, runtime and context, last active.
- ``loop_started`` ``{"loop_id", "runtime"?}``: one more loop.
- ``gate_opened`` / ``gate_resolved`` ``{"gate_id"}``: the open gate; state
  ``waiting_on_gate``, then ``running`` (a turn is active) or ``idle``.
- ``session_stopped`` ``{}``: status and state ``stopped`` (which wins over every
  later state), residency ``cold``; ``residency_released`` ``{}``: residency
  ``cold``; ``restore_done`` ``{}``: residency ``resident``, last active.
- ``hustle_started`` ``{"run_id", "name", "model_source", "named_model_key"?, "runtime"?}``
  and ``hustle_done`` (the same, plus ``"status"`` and ``"usage"?``): a
  terminal run is added to its aggregate bucket (name, model source, named
  model key, status; sessionstore catalogHustleKey). The runtime is not
  part of the bucket: ``current_loop`` work records none (however many
  runtimes the loop resolved, one bucket); ``named`` work records the one
  runtime its named model key resolved to, on each of its buckets, and a
  terminal naming another is ``CatalogHustleError`` ``runtime_mismatch``.
  Starts are matched only by ``repair`` (which replays the whole ledger);
  the online update folds terminals alone.
- ``compaction_started`` / ``compaction_done`` ``{"attempt_id"}``: checked by
  ``repair`` (one terminal per attempt), not projected.
- ``workspace_checkpoint`` ``{"ref", "event_id", "turn_id"?, "consistency"?}``
  (:data:`~turnkeeper.spec.ledger.WORKSPACE_CHECKPOINT_KIND`): the last
  checkpoint, and the current workspace (source ``checkpoint``);
  ``workspace_restore`` ``{"ref", "event_id"}``: the current workspace
  (source ``restore``; the last checkpoint stays).

Timestamps: ``created_at`` is the payload's; ``last_active_at`` is the
catalog's clock at an online update, or the record's ``written_at`` in a
repair (sessionstore CatalogClock).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from .ledger import WORKSPACE_KINDS, CheckpointSummary

# SessionStatus
STATUS_ACTIVE: Final = "active"
STATUS_STOPPED: Final = "stopped"
SESSION_STATUSES: Final = frozenset({STATUS_ACTIVE, STATUS_STOPPED})

# SessionState
STATE_RUNNING: Final = "running"
STATE_WAITING_ON_GATE: Final = "waiting_on_gate"
STATE_IDLE: Final = "idle"
STATE_FAILED: Final = "failed"
STATE_INTERRUPTED: Final = "interrupted"
STATE_STOPPED: Final = "stopped"
SESSION_STATES: Final = frozenset(
    {
        STATE_RUNNING,
        STATE_WAITING_ON_GATE,
        STATE_IDLE,
        STATE_FAILED,
        STATE_INTERRUPTED,
        STATE_STOPPED,
    }
)

# SessionResidency
RESIDENCY_RESIDENT: Final = "resident"
RESIDENCY_COLD: Final = "cold"
SESSION_RESIDENCIES: Final = frozenset({RESIDENCY_RESIDENT, RESIDENCY_COLD})

# hustle.ModelSource and hustle.TerminalStatus
MODEL_SOURCES: Final = frozenset({"current_loop", "named"})
HUSTLE_STATUSES: Final = frozenset({"succeeded", "failed", "cancelled"})

# CatalogMetaField
FIELD_LOOP_ID: Final = "Loops.LoopID"
FIELD_LOOP_ORDER: Final = "Loops"
FIELD_RUNTIME: Final = "Loops.Runtime"
FIELD_RUNTIME_SEQ: Final = "Loops.RuntimeValueSeq"
FIELD_CUMULATIVE_USAGE: Final = "Loops.CumulativeUsage"
FIELD_CURRENT_CONTEXT: Final = "Loops.CurrentContext"
FIELD_CONTEXT_SEQ: Final = "Loops.ContextSeq"
FIELD_CONTEXT_VALUE_SEQ: Final = "Loops.ContextValueSeq"

# CatalogMetaRule
RULE_REQUIRED: Final = "must be set"
RULE_SORTED_UNIQUE: Final = "must be sorted and unique"
RULE_INVALID: Final = "is invalid"
RULE_EXCEEDS_RUNTIME: Final = "must not exceed RuntimeSeq"
RULE_LEGACY_VALUE: Final = "must be zero when Runtime is absent"
RULE_EXCEEDS_CONTEXT: Final = "must not exceed ContextSeq"
RULE_CONTEXT_ABSENT: Final = "must be zero when CurrentContext is absent"
RULE_CONTEXT_CURRENT: Final = "must equal ContextSeq when CurrentContext is set"

# CatalogHustleErrorKind
HUSTLE_DUPLICATE_START: Final = "duplicate_start"
HUSTLE_TERMINAL_WITHOUT_START: Final = "terminal_without_start"
HUSTLE_ATTRIBUTION_MISMATCH: Final = "attribution_mismatch"
HUSTLE_INVALID_LIFECYCLE: Final = "invalid_lifecycle"
HUSTLE_RUNTIME_MISMATCH: Final = "runtime_mismatch"
HUSTLE_USAGE_OVERFLOW: Final = "usage_overflow"
HUSTLE_RUN_COUNT_OVERFLOW: Final = "run_count_overflow"

# CatalogCompactionErrorKind
COMPACTION_DUPLICATE_TERMINAL: Final = "duplicate_terminal"

CATALOG_KINDS: Final = frozenset(
    {
        "session_started",
        "turn_started",
        "turn_done",
        "turn_failed",
        "turn_interrupted",
        "step_done",
        "loop_started",
        "gate_opened",
        "gate_resolved",
        "session_stopped",
        "residency_released",
        "restore_done",
        "hustle_started",
        "hustle_done",
        "compaction_started",
        "compaction_done",
    }
    | WORKSPACE_KINDS
)
"""The ledger record kinds the catalog folds (see the module docstring)."""

# WorkspacePointerSource
SOURCE_UNKNOWN: Final = ""
"""A current workspace stored before its source was recorded (sessionstore
WorkspacePointerSourceUnknown)."""
SOURCE_CHECKPOINT: Final = "checkpoint"
"""Selected by a workspace checkpoint (WorkspacePointerSourceCheckpoint)."""
SOURCE_RESTORE: Final = "restore"
"""Selected by a workspace restore (WorkspacePointerSourceRestore)."""
WORKSPACE_SOURCES: Final = frozenset({SOURCE_UNKNOWN, SOURCE_CHECKPOINT, SOURCE_RESTORE})

TITLE_MAX: Final = 80
"""The longest title, in characters."""

MAX_COUNT: Final = 2**63 - 1
"""The largest usage token count or run count a catalog entry holds (a
signed 64-bit integer); a fold past it is an overflow error."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage (sessionstore content.Usage): counts ≥ 0."""

    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ContextMeasurement:
    """A loop's measured context (sessionstore event.ContextMeasurement):
    ``tokens`` used of ``window`` (tokens)."""

    tokens: int
    window: int


@dataclass(frozen=True, slots=True)
class EventSummary:
    """A codec-safe summary of one ledger record: its ``kind``, ``seq``, the
    turn it belongs to and the caller's ``summary`` text."""

    kind: str
    seq: int
    turn_id: str = ""
    summary: str = ""


@dataclass(frozen=True, slots=True)
class LoopUsageMeta:
    """The catalog's bounded projection of one loop (sessionstore LoopUsageMeta).

    ``runtime_seq`` is the latest sequence that could select a runtime,
    ``runtime_value_seq`` the one that supplied ``runtime`` (≤ ``runtime_seq``;
    0 when there is none). ``cumulative_usage`` sums the loop's ``step_done``
    usage only. ``context_seq`` is the latest context-bearing sequence,
    ``context_value_seq`` the one that supplied ``current_context`` (equal to
    ``context_seq`` when set; 0 after an invalidation)."""

    loop_id: str
    runtime: str = ""
    runtime_seq: int = 0
    runtime_value_seq: int = 0
    cumulative_usage: Usage = Usage()
    context_seq: int = 0
    context_value_seq: int = 0
    current_context: ContextMeasurement | None = None


@dataclass(frozen=True, slots=True)
class HustleUsageAggregate:
    """One terminal bucket (sessionstore HustleUsageAggregate): ``runs``
    terminal runs of ``name`` with ``status`` and their summed usage, keyed
    by (``name``, ``model_source``, ``named_model_key``, ``status``).
    ``named_model_key`` and ``runtime`` are empty for ``current_loop`` work,
    so the runtimes it resolves cannot grow the catalog; ``named`` work keeps
    the runtime its key resolved to (the same on each status's bucket).
    The number of buckets grows with the distinct names a session's runs
    carry: the seed's names are its hustle definitions' (a fixed set),
    here they are the caller's text (docs/ledger-status.md, limits)."""

    name: str
    model_source: str
    status: str
    runs: int
    named_model_key: str = ""
    runtime: str = ""
    cumulative_usage: Usage = Usage()


@dataclass(frozen=True, slots=True)
class WorkspacePointer:
    """The session's current workspace (sessionstore WorkspacePointer): ``ref``
    its snapshot's content identity, ``event_id`` and ``seq`` the ledger
    transition that selected it, ``source`` which kind of transition
    (:data:`SOURCE_CHECKPOINT`, :data:`SOURCE_RESTORE`, or
    :data:`SOURCE_UNKNOWN` for an entry stored without it)."""

    ref: str
    event_id: str
    seq: int
    source: str = SOURCE_UNKNOWN


@dataclass(frozen=True, slots=True)
class SessionMeta:
    """A session's catalog entry (sessionstore SessionMeta), derived from its
    ledger and never the source of truth: rebuilt by ``repair``. Empty
    strings and ``None`` mean "not seen yet"; times are aware datetimes."""

    session_id: str
    title: str = ""
    created_at: datetime | None = None
    last_active_at: datetime | None = None
    status: str = ""
    agent_kind: str = ""
    loop_count: int = 0
    config_fingerprint: str = ""
    residency: str = ""
    state: str = ""
    last_journal_seq: int = 0
    active_turn_id: str = ""
    waiting_gate_id: str = ""
    last_turn: EventSummary | None = None
    last_step: EventSummary | None = None
    loops: tuple[LoopUsageMeta, ...] = field(default=())
    hustles: tuple[HustleUsageAggregate, ...] = field(default=())
    last_checkpoint: CheckpointSummary | None = None
    current_workspace: WorkspacePointer | None = None
