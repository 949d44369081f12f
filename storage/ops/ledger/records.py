"""A ledger record's digests and checks, shared by its writers and readers:
the payload's sha256, the record digest that binds a record to its ledger,
sequence and epoch (``ledger_records.record_sha256``), the check every reader
runs on a record read, the ledger's JSON decoding of record bytes
(:func:`loads_json`, :func:`json_depth`), and the ``EnvelopeError`` a
decoder's failure becomes.
Pure functions: no transaction, no store.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any

from turnkeeper.spec import errors


def sha256(payload: bytes) -> str:
    """The hex sha256 of ``payload``: what a record stores and replay checks."""
    return hashlib.sha256(payload).hexdigest()


RECORD_DIGEST_MAGIC = "turnkeeper-ledger-record/1"
"""The first line of a record digest's canonical text (its format's version)."""


def record_digest(
    tenant: str,
    session_id: str,
    seq: int,
    kind: str,
    idempotency_id: str,
    epoch: int,
    payload_sha256: str,
) -> str:
    """A record's digest (``ledger_records.record_sha256``, hex): the sha256 of
    the UTF-8 text of eight lines joined by ``\\n`` (no final newline):
    :data:`RECORD_DIGEST_MAGIC`, the sha256 hex of ``tenant``, of
    ``session_id``, ``seq`` in decimal, the sha256 hex of ``kind``, of
    ``idempotency_id``, ``epoch`` in decimal, and the payload's sha256 hex as
    stored (``payload_sha256``). Each text field is hashed so that no value can
    run into the next (every line is fixed-width hex or a plain decimal); the
    schema migration 25 computes the same digest in SQL for the records written
    before it. It binds everything replay yields or acts on except
    ``written_at`` (informational): a record changed, moved to another
    sequence, session or tenant, or relabelled no longer matches it."""
    lines = (
        RECORD_DIGEST_MAGIC, _text_sha256(tenant), _text_sha256(session_id), str(seq),
        _text_sha256(kind), sha256(idempotency_id.encode()), str(epoch), payload_sha256,
    )  # fmt: skip
    return sha256("\n".join(lines).encode())


@functools.lru_cache(maxsize=4096)
def _text_sha256(text: str) -> str:
    """The hex sha256 of ``text``'s UTF-8, remembered: a ledger's tenant,
    session id and kinds repeat on every record (an idempotency id does not)."""
    return sha256(text.encode())


def record_sealed(
    stored: object,
    tenant: str,
    session_id: str,
    seq: int,
    kind: str,
    idempotency_id: str,
    epoch: int,
    payload_sha256: str,
) -> bool:
    """Replay's record fence: ``stored`` (the row's ``record_sha256``) is the
    digest of the record as read, for the ledger (tenant, session) it was
    read for (:func:`record_digest`). Every reader of the ledger checks it."""
    want = record_digest(tenant, session_id, seq, kind, idempotency_id, epoch, payload_sha256)
    return isinstance(stored, str) and hmac.compare_digest(want, stored)


def check_record(tenant: str, session_id: str, row: tuple[Any, ...]) -> None:
    """Check a record read as ``(seq, kind, idempotency id, payload,
    payload_sha256, epoch, written_at, record_sha256)`` for ``tenant``'s
    ``session_id``: its payload against its sha256, then the record against
    its digest (:func:`record_sealed`).

    A row whose sealed payload did not open (``sealing.open_rows``) carries
    the error in the payload's place: it is raised here.

    Raises:
        ReplayDecodeError: either does not match (``seq`` the row's).
        PayloadAuthenticationError, KeyUnavailableError: the payload did not open.
    """
    seq, kind, rid, payload, digest, epoch, _, sealed = row[:8]
    if isinstance(payload, errors.TurnkeeperError):
        raise payload
    if not (isinstance(digest, str) and hmac.compare_digest(sha256(bytes(payload)), digest)):
        raise errors.ReplayDecodeError(
            session_id, int(seq), detail="its payload does not hash to its stored sha256"
        )
    if not record_sealed(
        sealed, tenant, session_id, int(seq), str(kind), str(rid), int(epoch), digest
    ):
        raise errors.ReplayDecodeError(
            session_id,
            int(seq),
            detail="it does not match its record digest (its tenant, session, sequence, "
            "kind, idempotency id, epoch or payload was changed, or it was copied)",
        )


def envelope_error(reason: str, failure: BaseException) -> errors.EnvelopeError:
    """An ``EnvelopeError`` for ``reason`` whose ``__cause__`` is the decoder's
    ``failure``: raised as the cause of the caller's own error (replay's
    ``ReplayDecodeError``, the command log's ``CommandApplicationNotFoundError``)."""
    error = errors.EnvelopeError(reason, detail=str(failure))
    error.__cause__ = failure
    return error


def loads_json(
    data: bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None
) -> Any:
    """The JSON document ``data`` (UTF-8) holds: every place the ledger
    decodes a record's bytes (a catalog kind's payload, a workspace record, a
    command application, a blob pointer or envelope) decodes through it.

    Raises:
        UnicodeDecodeError: not UTF-8.
        ValueError: not JSON, or nested too deeply for the decoder (its
            ``RecursionError`` is ``__cause__``: never raised bare, so each
            caller's typed error for a payload that does not decode covers it).
    """
    text = data.decode("utf-8")
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except RecursionError as deep:
        raise ValueError("the JSON is nested too deeply to decode") from deep


def json_depth(value: Any) -> int:
    """How deeply decoded JSON ``value`` nests: 0 for a scalar, 1 for an
    object or array of scalars, one more per level. Iterative (no recursion,
    so any depth is measured at any stack depth)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            inner: Any = item.values()
        elif isinstance(item, list):
            inner = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((v, depth + 1) for v in inner)
    return deepest
