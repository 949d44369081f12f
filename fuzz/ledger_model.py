"""The ledger machine's model (:mod:`.ledger`): what was acknowledged, and the
blob store the machine's writers offload to, with its injected faults.

:class:`LedgerOracle` holds the records a single session's ledger
acknowledged, in order, with their idempotency ids; it says what an append
by the current writer must return. :class:`FaultyBlobs` is a
:class:`~turnkeeper.BlobStore` over the store's own blob table (public API,
``store.ledger.blobs``) that can kill a put after its blob is written (a
process dying between an offloaded record's blob and its pointer's append)
and run a step inside GC's first delete (a lease lapsing mid-delete).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from hypothesis import strategies as st

from turnkeeper import (
    AppendResult,
    BlobStore,
    LeaseLostError,
    LedgerEntry,
    LedgerIdempotencyConflictError,
    LedgerWriter,
    OperationalError,
)

SESSION = "s"
"""The one session whose ledger the machine writes."""

TTL = 20.0
"""Each writer's lease, seconds."""

IDS = ("a", "b", "c", "d", "e")
PAYLOADS = (b"", b"x", b"\x00\xff", b"long" * 50, b"big\x00" * 30)
THRESHOLD = 16
"""Payloads longer than this (bytes) are offloaded: the last two of :data:`PAYLOADS`."""
KINDS = ("turn", "step")
CRASH_IDS = ("x1", "x2", "x3")
"""The ids of the appends killed mid-offload (never acknowledged by them)."""

KILLED = "killed between the blob and its pointer (injected by the fuzz machine)"
"""The detail of the ``OperationalError`` a killed put raises."""

Row = tuple[int, str, str, bytes, int]
"""An acknowledged record: (seq, kind, idempotency id, payload, epoch)."""

Entries = list[tuple[str, bytes, str]]
"""A batch as drawn: (kind, payload, idempotency id) per entry."""

entry = st.tuples(st.sampled_from(KINDS), st.sampled_from(PAYLOADS), st.sampled_from(IDS))
"""An entry, inline or offloaded."""

inline = st.tuples(st.sampled_from(KINDS), st.sampled_from(PAYLOADS[:3]), st.sampled_from(IDS))
"""An entry stored inline: its append is the call's one write (an offloaded
one writes its blob first)."""


@dataclass
class Handle:
    """A writer and what the oracle knows of it: its lease's ``epoch``, when
    the lease expires (an aware UTC ``datetime``), and whether the store has
    fenced it out (every later append is refused)."""

    writer: LedgerWriter
    epoch: int
    expires_at: datetime
    fenced: bool = False


@dataclass
class LedgerOracle:
    """The acknowledged records in sequence order (fence records included),
    by idempotency id too, and the current writer's epoch."""

    rows: list[Row] = field(default_factory=list)
    ids: dict[str, Row] = field(default_factory=dict)
    epoch: int = 0

    def expect(self, entries: Entries) -> list[tuple[int, bool]] | str:
        """What appending ``entries`` by the current writer returns: ``(seq,
        duplicate)`` per entry, or ``"conflict"`` (an id already naming other
        content, earlier in the batch included: nothing is written)."""
        seen = dict(self.ids)
        tip = len(self.rows)
        out: list[tuple[int, bool]] = []
        for kind, payload, key in entries:
            first = seen.get(key)
            if first is not None:
                if (first[1], first[3]) != (kind, payload):
                    return "conflict"
                out.append((first[0], True))
                continue
            tip += 1
            seen[key] = (tip, kind, key, payload, self.epoch)
            out.append((tip, False))
        return out

    def commit(self, entries: Entries) -> None:
        """Record ``entries`` as acknowledged (a redelivered id: nothing new)."""
        for kind, payload, key in entries:
            if key not in self.ids:
                row = (len(self.rows) + 1, kind, key, payload, self.epoch)
                self.rows.append(row)
                self.ids[key] = row

    def fence(self, seq: int, epoch: int) -> None:
        """A writer of ``epoch`` opened: its fence record at ``seq``."""
        self.epoch = epoch
        self.rows.append((seq, "fence", f"fence:{epoch}:{seq}", b"", epoch))

    def offloaded(self) -> list[Row]:
        """The acknowledged records whose payloads live in blobs."""
        return [r for r in self.rows if r[1] != "fence" and len(r[3]) > THRESHOLD]


def outcome(
    fn: Callable[[list[LedgerEntry]], list[AppendResult]], batch: list[LedgerEntry]
) -> tuple[object, ...]:
    """A writer's ``append_many(batch)``, the way :func:`.ambiguous.ambiguously`
    reports it: ``("ok", [(seq, duplicate), …])``, ``("lost",)`` or
    ``("conflict",)``; other errors propagate."""
    try:
        return ("ok", [(r.seq, r.duplicate) for r in fn(batch)])
    except LeaseLostError:
        return ("lost",)
    except LedgerIdempotencyConflictError:
        return ("conflict",)


class FaultyBlobs:
    """A :class:`~turnkeeper.BlobStore` that passes every call to ``inner``,
    except while a fault is armed:

    - ``kill_puts``: each put writes its blob to ``inner`` and then raises
      ``OperationalError`` (detail :data:`KILLED`), so the pointer is never
      appended; the keys put so are in ``killed``;
    - ``before_delete``: run once, before the first delete reaches ``inner``
      (then disarmed).
    """

    def __init__(self, inner: BlobStore) -> None:
        self.inner = inner
        self.kill_puts = False
        self.killed: list[str] = []
        self.before_delete: Callable[[], None] | None = None

    def put(self, key: str, data: bytes) -> None:
        """``inner.put``; armed, it then raises ``OperationalError``."""
        self.inner.put(key, data)
        if self.kill_puts:
            self.killed.append(key)
            raise OperationalError(detail=KILLED)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """``inner.get``: raises ``BlobNotFoundError`` for an absent key."""
        return bytes(self.inner.get(key, max_bytes))

    def delete(self, key: str) -> None:
        """``inner.delete``, after ``before_delete`` if armed."""
        hook, self.before_delete = self.before_delete, None
        if hook is not None:
            hook()
        self.inner.delete(key)

    def list(self, prefix: str) -> list[str]:
        """``inner.list``: the keys under ``prefix``, sorted."""
        return list(self.inner.list(prefix))
