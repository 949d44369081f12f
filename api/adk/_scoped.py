"""App and user state (ADK's ``app:`` and ``user:`` scopes) as thread records.

ADK keeps one state per app and one per (app, user), shared by every session
of that scope and outliving each of them. Of what the store holds, a thread
record (``store.threads``, the threadstore seed's Record) is the one that
fits: a JSON ``state`` found by a key of the host's choosing
(:func:`._codec.app_state_key`, :func:`._codec.user_state_key`) that belongs
to no session, so a ``sessions.delete`` leaves it, as ADK's services leave
their app and user state rows. (Session metadata and projects hold no state;
a session's own entries go with the session.)

A change is a compare-and-set: the merged state is saved as a new active
record while the one read is archived in the same ``threads.finalize``
transaction (``archive_old``; the first record with ``require_key_absent``).
A writer that lost the race (``RecordNotActiveError``, ``AlreadyExistsError``)
reads again and merges its delta into the winner's state, so two sessions of
one user writing different ``user:`` keys at once both land. Each change
leaves the record it replaced archived: the scope's history.
"""

from __future__ import annotations

import uuid
from typing import Any

from turnkeeper.aio import AsyncStore
from turnkeeper.spec import errors
from turnkeeper.spec.records import FinalizeRequest, ThreadRecord

DRIVER = "google-adk"
"""The ``driver_type`` of the thread records holding ADK state."""

ATTEMPTS = 64
"""How many lost races one update retries before it raises the last one."""


async def read(store: AsyncStore, key: str) -> dict[str, Any]:
    """The state kept under ``key``, ``{}`` when none was ever written."""
    record = await store.threads.resolve(key=key)
    if record is None or not isinstance(record.state, dict):
        return {}
    return dict(record.state)


async def update(store: AsyncStore, key: str, delta: dict[str, Any]) -> None:
    """Merge ``delta`` (JSON values) into the state under ``key``.

    Raises:
        RecordNotActiveError, AlreadyExistsError: lost :data:`ATTEMPTS` races in
            a row (the state holds another writer's change, not this one).
    """
    if not delta:
        return
    for attempt in range(ATTEMPTS):
        current = await store.threads.resolve(key=key)
        base = current.state if current is not None and isinstance(current.state, dict) else {}
        record = ThreadRecord(uuid.uuid4().hex, key, driver_type=DRIVER, state={**base, **delta})
        request = FinalizeRequest(
            record,
            previous_id=None if current is None else current.id,
            archive_old=current is not None,
            require_key_absent=current is None,
        )
        try:
            await store.threads.finalize(request)
            return
        except (errors.RecordNotActiveError, errors.AlreadyExistsError):
            if attempt == ATTEMPTS - 1:
                raise
