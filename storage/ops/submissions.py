"""Submission keys: the digest a key's row keeps of what it admitted, and how a
later admission under the same key is compared with it, whichever turnkeeper
wrote the row.

``submissions.request_fingerprint`` has held two definitions:

- since commit 651f01c (schema version 8) the whole admission
  (:func:`admission_digest`: request, user message, retry target, source,
  model, mode, work dir and policy);
- before it (schema versions 2 to 8) the request alone
  (:func:`request_digest`, the definition ``execution_intents`` keeps).

A migration cannot rewrite all the older rows: a retry's own request is kept
nowhere else (a retry reuses its first attempt's intent, which holds that
attempt's request), nor are a retry's source, model, mode, work dir and policy,
so an older retry whose request was not its first attempt's (the demo's are
not) cannot be told from a later one by what is stored. The comparison
(:func:`same_admission`) therefore knows both definitions. Rows keep being
written in the current one, which a turnkeeper of schema 12 still running
beside a migrated PostgreSQL database (a rolling upgrade) reads as it always
did.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..backend import Tx, present
from . import entry_rows
from .run_reads import get

FIELDS = ("source", "model", "mode", "work_dir", "policy")
"""The intent's fields an admission names besides its request (``policy`` as
its stored JSON text)."""

_BODY = frozenset({"request", "user_message", "retry_of", *FIELDS})
"""The keys of the JSON object :func:`admission_digest` hashes."""


def key_digest(session_id: str, submission_key: str) -> str:
    """sha256 hex digest of a session's submission key: the only form the store
    keeps of it (the same definition since schema version 2)."""
    return hashlib.sha256(f"{session_id}\x00{submission_key}".encode()).hexdigest()


def request_digest(request: Mapping[str, Any]) -> str:
    """sha256 hex digest of ``request`` as canonical JSON (sorted keys): the
    intent's request fingerprint, and what a submission row held before
    651f01c."""
    return hashlib.sha256(orjson.dumps(dict(request), option=orjson.OPT_SORT_KEYS)).hexdigest()


def admission_digest(
    request: Mapping[str, Any],
    user_message: Any,
    retry_of: str | None,
    fields: Mapping[str, str],
) -> str:
    """sha256 hex digest of the whole admission as canonical JSON (sorted keys):
    what a submission row holds since 651f01c. ``user_message`` is a pi
    message (a mapping) or ``None``; ``fields`` holds :data:`FIELDS`."""
    body = {
        "request": dict(request),
        "user_message": dict(user_message) if isinstance(user_message, Mapping) else user_message,
        "retry_of": retry_of,
        **{name: fields[name] for name in FIELDS},
    }
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True, slots=True)
class Admission:
    """What ``runs.admit`` was asked to admit, with its two digests
    (:func:`admission`)."""

    request: Mapping[str, Any]
    user_message: Mapping[str, Any] | None
    retry_of: str | None
    fields: Mapping[str, str]
    fingerprint: str
    """:func:`request_digest` of the request (kept on the intent)."""
    digest: str
    """:func:`admission_digest` of the whole admission (kept on the submission)."""


def admission(
    request: Mapping[str, Any],
    user_message: Mapping[str, Any] | None,
    retry_of: str | None,
    fields: Mapping[str, str],
) -> Admission:
    """The :class:`Admission` of these arguments (already checked as storable
    JSON and text)."""
    return Admission(
        request,
        user_message,
        retry_of,
        fields,
        request_digest(request),
        admission_digest(request, user_message, retry_of, fields),
    )


def same_admission(tx: Tx, run_id: str, stored: str, new: Admission) -> bool:
    """Whether ``new`` is the admission the submission row of ``run_id``, which
    holds the digest ``stored``, was written for.

    A row of the current definition is compared by its digest alone. A row
    written before 651f01c holds :func:`request_digest` of its request, which
    ``new``'s equals only when the request is the same (a request that is
    itself a JSON object of an admission digest's keys could equal one of
    those instead, so it is never taken for an older row). For such a row the
    rest of the admission is compared with what the store kept of it: the
    run's user entry and retry target and, for a first attempt, its intent's
    source, model, mode, work dir and policy. A retry's own were never kept
    (it reuses its first attempt's intent, and they change nothing a retry
    writes), so ``new``'s stand for them.
    """
    if stored == new.digest:
        return True
    if stored != new.fingerprint or set(new.request) == _BODY:
        return False
    run = present(get(tx, run_id), "the run a submission row is written with")
    entry = entry_rows.entry(tx, run.session_id, f"{run_id}:user")
    message = None if entry is None else entry.payload["message"]
    fields = new.fields
    if run.retry_of is None:
        row = present(
            tx.one(
                f"SELECT {', '.join(FIELDS)} FROM execution_intents WHERE id = ?", [run.intent_id]
            ),
            "the intent a run is written with",
        )
        fields = dict(zip(FIELDS, row, strict=True))
    return admission_digest(new.request, message, run.retry_of, fields) == new.digest
