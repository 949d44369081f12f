"""``store.sessions.rotate_key`` and ``store.sessions.encrypt``: a session's
payloads sealed again under a new data key version, or sealed for the first
time (``turnkeeper encrypt``), by the one walk of :mod:`.reseal`."""

from __future__ import annotations

from turnkeeper.spec.records import Lease

from ..codec import check_id
from ..validate import check_session_lease
from .base import Area
from .reseal import prepare, reseal

_VERSION = "SELECT key_version FROM sessions WHERE id = ?"


class RekeyingPart(Area):
    """``store.sessions.rotate_key`` and ``store.sessions.encrypt``."""

    def rotate_key(self, session_id: str, *, lease: Lease | None = None) -> int:
        """Give the session a new data key version and seal every sealed
        column of it (``storage/crypto/columns.py``) under it, in one
        transaction (issue 23, "rotating a session's data key"); returns the
        new version (1 for a session that was clear). A session write: under
        the session's ``lease``, or only while nobody holds a live one. In
        the same transaction ``sessions.key_version`` moves to the new
        version (an append judged at the old one loses its compare-and-set
        and is retried under the new one) and the old version's
        ``session_keys`` row is deleted: a copy of the session's payloads
        from before (a backup, the WAL) can no longer be opened with this
        store's keys. The session's stored replay snapshots are dropped.
        The store object must hold a key provider; its ``wrap`` of the new
        key runs before the transaction (inside it only when the session's
        key changed in between); an unwrap of the current key not yet
        cached runs inside it.

        Raises:
            SessionNotFoundError: no session has this id.
            BusyError: no ``lease`` given and a live lease holds the session.
            LeaseLostError: ``lease`` is no longer the held, unexpired one.
            KeyUnavailableError: the store object was opened without
                ``encryption=`` (``key_id`` ``None``), or the session's
                current data key cannot be had (``key_id`` named when the
                provider cannot unwrap it).
            PayloadAuthenticationError: a stored value fails to open (its
                session, record id and field named); nothing changes.
            InvalidInputError: a bad id, or a lease on another target.
        """
        version = self._reseal("rotate_session_key", session_id, lease, clear_only=False)
        assert version is not None  # (a rotation always makes one)
        return version

    def encrypt(self, session_id: str, *, lease: Lease | None = None) -> bool:
        """Seal a clear session (``key_version`` ``NULL``: created before the
        store was encrypted): give it data key version 1 and seal every
        sealed column of it, in one transaction, as :meth:`rotate_key` does
        (``turnkeeper encrypt`` runs it per session). Returns ``True``, or
        ``False`` for a session already sealed (nothing written: a second
        run resumes past it).

        Raises:
            As :meth:`rotate_key`.
        """
        return self._reseal("encrypt_session", session_id, lease, clear_only=True) is not None

    def _reseal(
        self, operation: str, session_id: str, lease: Lease | None, *, clear_only: bool
    ) -> int | None:
        check_id(session_id, "session_id")
        check_session_lease(session_id, lease)
        provider = self.db.keyring.provider
        prepared = None
        if provider is not None:  # the new key wrapped before the transaction
            row = self.db.read("read_key_version", lambda tx: tx.one(_VERSION, [session_id]))
            old = None if row is None or row[0] is None else int(row[0])
            if row is not None and not (clear_only and old is not None):
                prepared = prepare(provider, session_id, 1 if old is None else old + 1)
        version = self._fenced(
            operation,
            lease,
            lambda tx: reseal(tx, session_id, lease, clear_only=clear_only, prepared=prepared),
        )
        if version is not None:
            self.db.keyring.forget(session_id)  # it may hold "clear", or the old version
            self.db.keyring.encrypted = True
        return version
