"""Response lineage compare-and-swap (session seed CompareAndSwapResponseSessionState).

One statement per swap: an insert when the caller saw no state (version 0),
else an update guarded by the version it saw. Two concurrent turns that saw
the same version cannot both advance the lineage.
"""

from __future__ import annotations

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import Lease, ResponseState

from ..backend import Tx, keyed, utc
from ..codec import check_id, check_text
from ..validate import check_int, check_session_lease
from . import leases
from .base import Area

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
            f"WHERE {keyed('session_id', 'version = ?')} RETURNING version",
            [*values, tx.now, state.session_id, expected_version],
        )
    return row is not None


# -- the store's methods ------------------------------------------------------------


class Lineage(Area):
    """Response lineage compare-and-swap (session seed CompareAndSwapResponseSessionState)."""

    def get(self, session_id: str) -> ResponseState | None:
        """The session's remote response lineage, or ``None`` (use the default mode)."""
        check_id(session_id, "session_id")
        return self.db.read("get_response_state", lambda tx: get(tx, session_id))

    def compare_and_swap(
        self, state: ResponseState, expected_version: int, *, lease: Lease | None = None
    ) -> bool:
        """Advance the session's lineage only if its version is still
        ``expected_version`` (``0``: none yet); returns whether it did (session
        seed CompareAndSwapResponseSessionState). Two concurrent turns that read
        the same version cannot both swap, so a ``previous_response_id`` chain
        never branches silently. A session write: under the session's
        ``lease``, or while nobody holds it.

        Raises:
            SessionNotFoundError, InvalidInputError.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        """
        if not isinstance(state, ResponseState):
            raise errors.InvalidInputError("state", "expected a ResponseState")
        check_id(state.session_id, "session_id")
        for name in (
            "state_mode",
            "previous_response_id",
            "conversation_id",
            "provider",
            "api",
            "model",
        ):
            check_text(getattr(state, name), name)
        check_int(expected_version, "expected_version", 0)
        check_session_lease(state.session_id, lease)
        return self._fenced(
            "compare_and_swap_response_state",
            lease,
            lambda tx: swap(tx, state, expected_version, lease),
        )
