"""The ledger's journal writer (sessionstore OpenJournal, SessionJournal) and its records.

A session's ledger is an append-only journal with a 1-based sequence. One
writer at a time appends to it, under the session's lease (``session:<id>``):
opening the writer plants a *fence record* carrying the lease's epoch with a
compare-and-set on the tip the open read, and every append is fenced by
that epoch in its own transaction (``storage/ops/ledger/``).

The writer's lifecycle, states held by the writer object (a writer is a
handle, not a row: the ledger's rows are its records):

- ``opening``: made by ``store.ledger.open``, its fence not yet planted;
- ``open``: its fence record is in the ledger; it appends;
- ``fenced``: its grant is spent: the opening compare-and-set found the tip
  moved (the grant was released), or a fence refused it (its lease expired,
  was released or taken over). It never writes again: a fresh lease (a
  strictly higher epoch) opens a new writer;
- ``closed``: its holder closed it (the lease is the holder's to release).

Facts the guards read, observed in the transaction that writes:

- ``lease_held``: the writer's lease passed the lease fence (held, this
  token and epoch, unexpired at a clock read after the lease row's lock);
- ``tip_unmoved``: the ledger's tip is the one the open read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .lifecycle import Edge, Lifecycle, fact

LEDGER_WRITER = Lifecycle(
    name="ledger_writer",
    states=("opening", "open", "fenced", "closed"),
    initial="opening",
    edges=(
        Edge("plant_fence", "open", "opening", "open", guards=("lease_held", "tip_unmoved")),
        Edge(
            "opening_conflict",
            "open",
            "opening",
            "fenced",
            guards=("lease_held",),
            unless=("tip_unmoved",),
        ),
        Edge("opening_lost", "open", "opening", "fenced", unless=("lease_held",)),
        Edge("append", "append", "open", "open", guards=("lease_held",)),
        Edge("overtaken", "append", "open", "fenced", unless=("lease_held",)),
        Edge("close", "close", "open", "closed"),
    ),
    guards={
        "lease_held": (
            fact("lease_held"),
            "the writer's lease passed the fence, judged after the lease row's lock",
        ),
        "tip_unmoved": (fact("tip_unmoved"), "the ledger's tip is the one the open read"),
    },
    invariants=(
        "sequences are 1, 2, 3 … per session, without gaps or duplicates",
        "every writer's records follow its own fence record, which carries its epoch",
        "fence epochs never fall along the ledger (a grant is never rebased onto a new tip)",
        "a fenced or closed writer writes nothing",
    ),
)
"""``plant_fence`` writes the fence record at the tip + 1; ``opening_conflict``
releases the grant and raises ``OpeningFenceConflictError``; ``opening_lost``
and ``overtaken`` raise ``LeaseLostError``; ``append`` writes the records."""

FENCE_KIND = "fence"
"""The kind of a writer's opening fence record (empty payload, the writer's epoch)."""

COMMAND_APPLICATION_KIND = "command_application"
"""The kind of a command log record (sessionstore RuntimeCommandLog)."""

BLOB_POINTER_KIND = "blobptr"
"""The kind of an offloaded record's pointer (its payload names the blob:
key, sha256, size); replay resolves it to the record's own kind and payload."""

RESERVED_KINDS = frozenset({FENCE_KIND, BLOB_POINTER_KIND})
"""Kinds only the store writes: an append of one is refused."""

FENCE_ID_PREFIX = "fence:"
"""The idempotency ids of the store's fence records start with it
(:func:`fence_id`); an entry whose id starts with it is refused at every
write path (``InvalidInputError``): it could take the id of a later fence,
whose open would then collide with it."""

MAX_PAYLOAD_DEPTH = 100
"""The deepest nesting (JSON objects and arrays, the payload's own object
counting 1) of a catalog kind's payload an append takes: deeper is refused
(``InvalidInputError``), so that no fold of it later runs out of stack,
however deep the call that folds it."""


def fence_id(epoch: int, seq: int) -> str:
    """The idempotency id of the fence record a writer of ``epoch`` plants at
    ``seq``: ``fence:<epoch>:<seq>`` (:data:`FENCE_ID_PREFIX`).

    The id names one fence: it carries the prefix every write path refuses
    from callers, and reads back as exactly its epoch and sequence.

    pre: epoch >= 1 and seq >= 1
    post: __return__.startswith(FENCE_ID_PREFIX)
    post: __return__[len(FENCE_ID_PREFIX) :].split(":") == [str(epoch), str(seq)]
    """
    return f"{FENCE_ID_PREFIX}{epoch}:{seq}"


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A record to append: ``kind`` (non-empty text, not a reserved kind),
    ``payload`` (bytes, stored exactly) and ``idempotency_id`` (non-empty text;
    a second append under it returns the first one's sequence)."""

    kind: str
    payload: bytes
    idempotency_id: str


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One record of a session's ledger, as replay yields it.

    ``seq`` is 1-based and gapless; ``epoch`` is the lease epoch of the
    writer that appended it (a fence record's epoch is its writer's);
    ``payload`` is the stored bytes, verified against their sha256 on read;
    ``written_at`` is by the store's clock; ``tenant`` is the store's tenant
    (sessionstore WithTenant; ``""`` by default)."""

    session_id: str
    seq: int
    kind: str
    idempotency_id: str
    payload: bytes
    epoch: int
    written_at: datetime
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append did (sessionstore journal.AppendResult): ``seq`` is the
    record's sequence; ``duplicate`` is true when its idempotency id was
    already in the ledger with the same content, and ``seq`` is then the
    original's (nothing was written)."""

    seq: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class CommandApplication:
    """An application prefix of the command log (sessionstore
    runtimecommand.Application): the command ``command_id`` was applied as
    ``applied`` (a JSON object: what the applier made of it). Stored as a
    ledger record of kind ``command_application`` under idempotency id
    ``command:<command_id>``."""

    command_id: str
    applied: dict[str, object]


@dataclass(frozen=True)
class GCResult:
    """One blob GC pass over a session's blob prefix (sessionstore GCResult).

    ``scanned``: blobs of the ledger's shape (``<prefix><sha256 hex>``) listed;
    ``referenced``: those a pointer record of the ledger names (kept);
    ``deleted``: the orphans reaped, ``deleted_keys`` their keys, sorted;
    ``unreclaimable``: other keys under the prefix, left untouched (a put's
    temporary file younger than the temp grace among them);
    ``temps_deleted``: the temporary files of puts that can no longer finish
    (``<sha256 hex>.tmp-<32 hex>``, older than the temp grace, seconds:
    a put killed mid-write) reaped, ``temps_deleted_keys`` their keys,
    sorted. On a pass that returns, ``scanned == referenced + deleted``; a
    failing pass raises instead of returning a partial result."""

    scanned: int
    referenced: int
    deleted: int
    deleted_keys: tuple[str, ...]
    unreclaimable: int
    temps_deleted: int = 0
    temps_deleted_keys: tuple[str, ...] = ()


WORKSPACE_CHECKPOINT_KIND = "workspace_checkpoint"
"""The kind of a workspace checkpoint record (sessionstore CheckpointSummary,
WorkspacePointerSourceCheckpoint): the runtime appends one through its writer
after it has snapshotted the session's workspace. Its payload is a UTF-8 JSON
object ``{"ref": text, "event_id": text, "turn_id"?: text, "consistency"?: text}``:
``ref`` the snapshot's content identity in the workspace store
(workspacestore.Ref), ``event_id`` the transition's id, ``turn_id`` the turn
it was taken in, ``consistency`` the runtime's label for how consistent the
snapshot is (event.SnapshotConsistency; stored as given)."""

WORKSPACE_RESTORE_KIND = "workspace_restore"
"""The kind of a workspace restore record (sessionstore
WorkspacePointerSourceRestore): the runtime rewound the workspace to the
snapshot ``ref``. Payload ``{"ref": text, "event_id": text}``. A restore is not
a checkpoint (the checkpoint lookups skip it) but its ``ref`` is live."""

WORKSPACE_KINDS = frozenset({WORKSPACE_CHECKPOINT_KIND, WORKSPACE_RESTORE_KIND})
"""The kinds whose ``ref`` a workspace GC must keep (``workspace_live_refs``)."""


@dataclass(frozen=True, slots=True)
class CheckpointSummary:
    """One workspace checkpoint of a session's ledger (sessionstore
    CheckpointSummary): ``ref`` the snapshot's content identity, ``event_id``
    and ``seq`` the ledger transition that recorded it, ``consistency`` its
    label (``""``: none given), ``turn_id`` the turn it was taken in (``None``:
    none). It names the checkpoint as recorded, whatever restores followed."""

    ref: str
    event_id: str
    seq: int
    consistency: str = ""
    turn_id: str | None = None
