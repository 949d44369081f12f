"""Response lineage compare-and-swap on DuckDB (session seed CompareAndSwapResponseSessionState).

One statement per swap: an insert when the caller saw no state (version 0),
else an update guarded by the version it saw. Two concurrent turns that saw
the same version cannot both advance the lineage.
"""

from __future__ import annotations

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import Lease, ResponseState

from . import leases
from .db import Tx, utc

_COLS = (
    "session_id, state_mode, previous_response_id, conversation_id, provider, api, model, "
    "version, updated_at"
)
_FIELDS = ("state_mode", "previous_response_id", "conversation_id", "provider", "api", "model")


def get(tx: Tx, session_id: str) -> ResponseState | None:
    """The session's lineage, or ``None``."""
    row = tx.one(f"SELECT {_COLS} FROM response_states WHERE session_id = ?", [session_id])
    if row is None:
        return None
    names = ("session_id", *_FIELDS, "version")
    return ResponseState(**dict(zip(names, row[:8], strict=True)), updated_at=utc(row[8]))


def swap(tx: Tx, state: ResponseState, expected_version: int, lease: Lease | None) -> bool:
    """Write ``state`` as version ``expected_version + 1`` if the stored version is
    ``expected_version``; returns whether it did.

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError (no lease, and the
        session is held).
    """
    if tx.one("SELECT 1 FROM sessions WHERE id = ?", [state.session_id]) is None:
        raise errors.SessionNotFoundError(state.session_id)
    leases.fence_or_unheld(tx, session_target(state.session_id), lease)
    values = [getattr(state, f) for f in _FIELDS]
    if expected_version == 0:
        row = tx.one(
            f"INSERT INTO response_states ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?) "
            "ON CONFLICT (session_id) DO NOTHING RETURNING version",
            [state.session_id, *values, tx.now],
        )
    else:
        sets = ", ".join(f"{f} = ?" for f in _FIELDS)
        row = tx.one(
            f"UPDATE response_states SET {sets}, version = version + 1, updated_at = ? "
            "WHERE session_id = ? AND version = ? RETURNING version",
            [*values, tx.now, state.session_id, expected_version],
        )
    return row is not None
