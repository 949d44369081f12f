"""Verifying a ledger: replay it whole and name the damage found
(``turnkeeper ledger verify`` and the audit's ``ledgers_verify`` check).

:func:`verify_ledger` replays one session's ledger through a
:class:`~turnkeeper.storage.ops.ledger.Ledger` (hashes, gapless sequence,
fences, blob pointers and blobs, a sealed ledger's values opened first) and
returns a :class:`Verified`: the counts, or the damage's error class,
sequence, blob key and message. It reads only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from turnkeeper.spec import errors
from turnkeeper.storage.ops.ledger import Ledger, sealing
from turnkeeper.storage.ops.ledger.blobs import BlobStore

from .base import one_line

DAMAGE = (
    errors.ReplayDecodeError,
    errors.ReplayReadError,
    errors.BlobIntegrityError,
    errors.BlobPointerIDMismatchError,
    errors.BlobUnavailableError,
    errors.DurableBodyTooLargeError,
    errors.PayloadAuthenticationError,
)
"""The replay failures ``verify`` reports as damage (exit 1: a sealed
payload or blob that fails authentication is one, and so is a
``KeyUnavailableError`` of a store opened with its key: the session's data
key row is gone); every other
error (an unknown session, an empty ledger, a store it cannot open) is a
refusal (exit 2)."""


class CountingBlobs:
    """A :class:`BlobStore` that counts the blobs (and their bytes) fetched
    through it: ``verify``'s blob figures."""

    def __init__(self, inner: BlobStore) -> None:
        self.inner = inner
        self.fetched = 0
        self.bytes = 0

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        data = self.inner.get(key, max_bytes)
        self.fetched += 1
        self.bytes += len(data)
        return data

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)


@dataclass
class Verified:
    """What ``verify`` found in one session's ledger: counts when clean, the
    damage (error class, sequence, blob key, message) when not."""

    session_id: str
    records: int = 0
    bytes: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    error: str | None = None
    seq: int | None = None
    key: str | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def damage_seq(exc: errors.TurnkeeperError) -> int | None:
    """The sequence a damage error names (``seq``), if any."""
    seq = getattr(exc, "seq", None)
    if isinstance(exc, errors.PayloadAuthenticationError) and exc.field == sealing.PAYLOAD:
        return int(exc.record_id) if exc.record_id.isdigit() else None
    return int(seq) if isinstance(seq, int) else None


def damage_key(exc: errors.TurnkeeperError) -> str | None:
    """The blob key a damage error names (``key``, or a too-large body's ``object_id``)."""
    if isinstance(exc, errors.PayloadAuthenticationError) and exc.field == sealing.DATA:
        return exc.record_id
    key = getattr(exc, "key", None) or getattr(exc, "object_id", None)
    return str(key) if key else None


def verify_ledger(
    ledger: Ledger,
    session_id: str,
    *,
    keyless: bool,
    tick: Callable[[int], None] = lambda n: None,
    every: int = 256,
) -> Verified:
    """Replay ``session_id``'s whole ledger in ``ledger``, verifying every
    record (hash, sequence, fences, blob pointers and blobs); the damage
    found, if any, as a :class:`Verified` (never raised). ``keyless``: the
    store was opened without its key (then a ``KeyUnavailableError`` is
    raised, not reported as damage). ``tick(n)`` is called every ``every``
    records.

    Raises:
        EmptySessionError, SessionNotFoundError: nothing to verify.
        KeyUnavailableError: a sealed ledger and ``keyless``.
    """
    counting = CountingBlobs(ledger.blobs)
    ledger = ledger.with_blobs(
        counting, offload_threshold=ledger.offload_threshold, max_body_bytes=ledger.max_body_bytes
    )
    found = Verified(session_id)
    try:
        for record in ledger.replay(session_id):
            found.records += 1
            found.bytes += len(record.payload)
            if found.records % every == 0:
                tick(found.records)
    except (*DAMAGE, errors.KeyUnavailableError) as exc:
        if isinstance(exc, errors.KeyUnavailableError) and keyless:
            raise  # opened without the key: nothing could be checked (a refusal)
        found.error = type(exc).__name__
        found.seq = damage_seq(exc)
        found.key = damage_key(exc)
        found.message = one_line(str(exc))
    found.blobs, found.blob_bytes = counting.fetched, counting.bytes
    return found


def describe_verified(v: Verified) -> str:
    """One ``verify`` line."""
    if v.ok:
        return (
            f"ok {v.session_id}: {v.records} records, {v.bytes} bytes, "
            f"{v.blobs} blobs ({v.blob_bytes} bytes)"
        )
    at = f" at seq {v.seq}" if v.seq is not None else ""
    key = f" (blob {v.key})" if v.key else ""
    return f"DAMAGED {v.session_id}: {v.error}{at}{key}: {v.message}"
