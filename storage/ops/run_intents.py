"""Execution intents saved on their own (session seed SaveExecutionIntent).

An intent is the durable record of an accepted request. ``runs.admit`` writes
one with its first run, in one transaction; ``runs.save_intent`` writes one
before any run (a request accepted now, executed later), and
``runs.admit(intent_id=…)`` then admits that intent's first run. An intent is
immutable: saving the same one again returns it, and another under its id is
``ExecutionIntentConflictError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import uuid6

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import ExecutionIntent, Lease

from ..backend import Tx, present
from ..codec import check_id, check_text, from_json, to_json
from ..validate import check_session_lease
from . import leases, sealed_json, submissions
from .base import Area
from .run_records import REQUEST
from .run_records import intent as stored_intent

FIELDS = ("source", "model", "mode", "work_dir")
"""The intent's text fields besides its request and policy."""


def fields_of(
    request: Any, source: Any, model: Any, mode: Any, work_dir: Any, policy: Any
) -> dict[str, str]:
    """An intent's fields, checked: ``request`` and ``policy`` as stored JSON text.

    Raises:
        InvalidInputError: ``request`` or ``policy`` not a mapping (``policy``
            may be ``None``), a field that is not text, JSON that cannot be
            stored exactly.
    """
    if not isinstance(request, Mapping):
        raise errors.InvalidInputError("request", "expected a mapping")
    if policy is not None and not isinstance(policy, Mapping):
        raise errors.InvalidInputError("policy", "expected a mapping (or None)")
    out = {
        name: check_text(value, name)
        for name, value in zip(FIELDS, (source, model, mode, work_dir), strict=True)
    }
    out["request"] = to_json(dict(request), "request")
    out["policy"] = to_json(dict(policy or {}), "policy")
    return out


def same(found: ExecutionIntent, session_id: str, fields: Mapping[str, str]) -> bool:
    """Whether ``found`` is the intent of ``session_id`` with ``fields``."""
    return (
        found.session_id == session_id
        and all(getattr(found, name) == fields[name] for name in FIELDS)
        and found.request == from_json(fields["request"])
        and found.policy == from_json(fields["policy"])
    )


def save(
    tx: Tx, intent_id: str, session_id: str, fields: Mapping[str, str], lease: Lease | None
) -> ExecutionIntent:
    """Write the intent (see the module docstring).

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError, ExecutionIntentConflictError.
    """
    version = sealed_json.session_version(tx, session_id)
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    found = stored_intent(tx, intent_id)
    if found is not None:
        if same(found, session_id, fields):
            return found  # a retry after an unknown commit result
        raise errors.ExecutionIntentConflictError(intent_id, found.session_id)
    request = from_json(fields["request"])
    tx.exec(
        "INSERT INTO execution_intents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            intent_id,
            session_id,
            *(fields[name] for name in FIELDS),
            submissions.request_digest(request),
            sealed_json.seal_one(tx, session_id, intent_id, REQUEST, fields["request"], version),
            fields["policy"],
            tx.now,
        ],
    )
    return present(stored_intent(tx, intent_id), "the intent written just now")


def check_saved(tx: Tx, intent_id: str, session_id: str, fields: Mapping[str, str]) -> None:
    """The saved intent ``runs.admit(intent_id=…)`` admits: of this session,
    with the admission's request and fields, and no run yet.

    Raises:
        ExecutionIntentNotFoundError, InvalidInputError (the admission differs
        from the intent), RetryNotAllowedError (the intent has a run).
    """
    found = stored_intent(tx, intent_id)
    if found is None or found.session_id != session_id:
        raise errors.ExecutionIntentNotFoundError(intent_id, session_id)
    if not same(found, session_id, fields):
        raise errors.InvalidInputError(
            "intent_id",
            "the admission's request, source, model, mode, work dir or policy "
            "differs from the saved intent's",
        )
    run = tx.one("SELECT id FROM runs WHERE intent_id = ? LIMIT 1", [intent_id])
    if run is not None:
        raise errors.RetryNotAllowedError(
            str(run[0]), "the intent has a run: a retry follows its latest attempt"
        )


# -- the store's methods ------------------------------------------------------------


class IntentsPart(Area):
    """Save an execution intent."""

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
    ) -> ExecutionIntent:
        """Save an execution intent with no run yet (session seed
        SaveExecutionIntent): the durable record of a request accepted now and
        executed later; returns it as stored. ``runs.admit(session_id,
        request, intent_id=…)`` with the same request and fields admits its
        first run. An intent is immutable: the same ``intent_id`` (default: a
        new UUIDv7) with the same session, request and fields returns the
        stored intent (a retry after an unknown commit result).

        A session write: under the session's ``lease`` (fenced in the write's
        transaction) or while nobody holds a live lease on it.

        Raises:
            SessionNotFoundError: no such session.
            ExecutionIntentConflictError: ``intent_id`` names another intent.
            BusyError: no ``lease`` given and someone holds the session.
            LeaseLostError, InvalidInputError.
        On any error nothing is written.
        """
        check_id(session_id, "session_id")
        fields = fields_of(request, source, model, mode, work_dir, policy)
        given = str(uuid6.uuid7()) if intent_id is None else check_id(intent_id, "intent_id")
        check_session_lease(session_id, lease)
        return self._fenced(
            "save_intent", lease, lambda tx: save(tx, given, session_id, fields, lease)
        )
