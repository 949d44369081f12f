"""A store object's session data keys: made, wrapped and stored with a new
session, loaded and unwrapped on first use inside the transaction that needs
them, cached (bounded, thread-safe), and forgotten when the session is
deleted (crypto-shredding: the ``session_keys`` rows go in the delete's
transaction).

Every transaction carries the store object's :class:`Keyring` as ``tx.keys``
(:data:`CLEAR` for a store opened without ``encryption=`` on a store never
encrypted: nothing here runs then). Sealing a column is a call:
:meth:`Keyring.writing_key` in the writing transaction, then
``key.seal_text(record_id, field, text)``; reading one is
:meth:`Keyring.open_text`.

Schema (version 32): ``session_keys(session_id, version, key_id, wrapped,
created_at)`` holds each session's data keys wrapped by the provider
(``provider.wrap(key, wrap_context(session_id, version))``), ``key_id``
naming the master key that wrapped it; ``store_encryption`` holds one row
once the store was first opened with ``encryption=``: the marker by which
a later open without a provider refuses what it cannot do (new sessions,
payload writes to sessions with a data key, payload reads of them) instead
of writing clear payloads into an encrypted store.

A writer reads the session's newest key row (``version``, ``key_id``,
``wrapped``) in its transaction: the cached data key is used only while
its version is still the newest, so a writer holding a key that a later
rotation replaced loses (it unwraps the new one), and a session whose keys
are gone (deleted) writes nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from turnkeeper.spec import errors

from ..codec import from_json
from .keys import KEY_BYTES, KeyProvider
from .seal import DataKey, is_sealed_text, key_version, text_bytes, wrap_context

if TYPE_CHECKING:
    from ..backend import Tx

CACHE_SESSIONS = 4096
"""How many sessions' unwrapped data keys a store object keeps (least
recently used evicted)."""

_NEWEST = (
    "SELECT version, key_id, wrapped FROM session_keys WHERE session_id = ? "
    "ORDER BY version DESC LIMIT 1"
)
_AT = "SELECT key_id, wrapped FROM session_keys WHERE session_id = ? AND version = ?"
_ANY = "SELECT 1 FROM session_keys WHERE session_id = ? LIMIT 1"
_MARKER = "SELECT key_id FROM store_encryption WHERE id = 1"

PREPARED = 256
"""Data keys wrapped ahead of their sessions' creation a store object keeps at most."""

PAYLOAD = "payload"
"""The field name an entry's payload is sealed under (``entries.payload``)."""


def check_provider(provider: object) -> KeyProvider | None:
    """``provider`` as ``open_store``'s ``encryption=`` takes it: ``None`` or a
    :class:`KeyProvider`.

    Raises:
        InvalidInputError: (field ``encryption``) anything else.
    """
    if provider is not None and not isinstance(provider, KeyProvider):
        raise errors.InvalidInputError(
            "encryption", "expected a key provider (key_id, wrap, unwrap), e.g. LocalKeyProvider"
        )
    return provider


class Keyring:
    """The data keys one store object uses (see the module docstring).

    ``provider`` is the store's :class:`KeyProvider` or ``None``;
    ``encrypted`` says whether the store is encrypted (opened with a
    provider, or marked so by an earlier open): only then are keys read.
    """

    def __init__(self, provider: KeyProvider | None, cache_sessions: int = CACHE_SESSIONS) -> None:
        self.provider = check_provider(provider)
        self.encrypted = provider is not None
        self._max = cache_sessions
        self._lock = threading.Lock()
        # session id -> {version: DataKey}; an empty dict: the session holds no key.
        self._cache: OrderedDict[str, dict[int, DataKey]] = OrderedDict()
        # session id -> (key id, wrapped key) made before the creating transaction.
        self._prepared: OrderedDict[str, tuple[str, bytes]] = OrderedDict()

    # -- the store marker -------------------------------------------------------

    def adopt(self, tx: Tx, *, writable: bool) -> None:
        """Read the store's marker (opening): a store marked encrypted is
        treated as encrypted with or without a provider; a store opened with
        a provider for the first time is marked (``writable``)."""
        found = tx.one(_MARKER)
        if found is not None:
            self.encrypted = True
        elif self.provider is not None and writable:
            tx.exec(
                "INSERT INTO store_encryption (id, key_id, enabled_at) VALUES (1, ?, now()) "
                "ON CONFLICT (id) DO NOTHING",
                [self.provider.key_id],
            )

    # -- writes -----------------------------------------------------------------

    def prepare(self, session_id: str) -> None:
        """Make and wrap the data key of a session about to be created, before
        its transaction (a KMS's wrap is a network call: never made while
        the transaction holds locks); :meth:`new_session` stores it. A
        prepared key the transaction did not use (it failed) is dropped with
        the oldest once :data:`PREPARED` are kept."""
        if not self.encrypted or self.provider is None:
            return
        key = DataKey.new(session_id, 1)
        wrapped = self.provider.wrap(key.key, wrap_context(session_id, 1))
        with self._lock:
            self._prepared[session_id] = (self.provider.key_id, wrapped)
            while len(self._prepared) > PREPARED:
                self._prepared.popitem(last=False)

    def new_session(self, tx: Tx, session_id: str) -> None:
        """Give a session being created in ``tx`` its data key (version 1),
        wrapped by the provider, when the store is encrypted.

        Raises:
            KeyUnavailableError: (``key_id`` ``None``) the store is encrypted
                and was opened without a provider: no session is created in
                it that would hold clear payloads.
        """
        if not self.encrypted:
            return
        if self.provider is None:
            raise errors.KeyUnavailableError(
                session_id,
                None,
                detail="the store is encrypted and was opened without encryption=",
            )
        with self._lock:  # a retried transaction wraps its own (the first took this one)
            prepared = self._prepared.pop(session_id, None)
        if prepared is None:  # a creation path that did not prepare (an import, a binding)
            key = DataKey.new(session_id, 1)
            wrapped = self.provider.wrap(key.key, wrap_context(session_id, 1))
            prepared = (self.provider.key_id, wrapped)
        tx.exec(
            "INSERT INTO session_keys (session_id, version, key_id, wrapped, created_at) "
            "VALUES (?, 1, ?, ?, coalesce(?::TIMESTAMPTZ, now()))",
            [session_id, prepared[0], prepared[1], tx.now],
        )
        # Not cached here: the transaction may yet roll back (a retry makes another key).

    def writing_key(self, tx: Tx, session_id: str) -> DataKey | None:
        """The data key a write of ``session_id``'s payloads in ``tx`` seals
        with (its newest version, read in ``tx``), or ``None`` when the store
        is not encrypted or the session holds no data key (clear).

        Raises:
            KeyUnavailableError: the session has a data key and the store was
                opened without a provider (``key_id`` ``None``), or the
                provider cannot unwrap it (``key_id`` named, the provider's
                ``KeyUnwrapError`` as ``__cause__``). Nothing is written.
        """
        if not self.encrypted:
            return None
        row = tx.one(_NEWEST, [session_id])
        if row is None:
            return None
        return self._key(session_id, int(row[0]), str(row[1]), row[2])

    # -- reads ------------------------------------------------------------------

    def open_json(self, tx: Tx, session_id: str, record_id: str, field: str, stored: str) -> Any:
        """The decoded JSON a column holds (sealed or clear).

        Raises:
            KeyUnavailableError: as :meth:`writing_key`.
            PayloadAuthenticationError: a sealed value that fails
                authentication (a flipped byte, moved from another row,
                session or field), names a key version the session does not
                hold, or a clear value in a session that has a data key.
        """
        if not self.encrypted:
            return from_json(stored)
        return from_json(self.open_text(tx, session_id, record_id, field, stored))

    def open_text(self, tx: Tx, session_id: str, record_id: str, field: str, stored: str) -> str:
        """The clear text of a column's value (see :meth:`open_json`)."""
        if not self.encrypted:
            return stored
        if not is_sealed_text(stored):
            if self._has_key(tx, session_id):
                raise errors.PayloadAuthenticationError(
                    session_id,
                    record_id,
                    field,
                    detail="a clear value in a session whose payloads are sealed",
                )
            return stored
        raw = text_bytes(stored)
        version = None if raw is None else key_version(raw)
        if version is None:
            raise errors.PayloadAuthenticationError(
                session_id, record_id, field, detail="not a well-formed sealed value"
            )
        return self._key_at(tx, session_id, version, record_id, field).open_text(
            record_id, field, stored
        )

    def forget(self, session_id: str) -> None:
        """Drop the cached keys of ``session_id`` (deleted: its rows are gone)."""
        with self._lock:
            self._cache.pop(session_id, None)

    # -- the cache ----------------------------------------------------------------

    def _cached(self, session_id: str) -> dict[int, DataKey] | None:
        with self._lock:
            found = self._cache.get(session_id)
            if found is not None:
                self._cache.move_to_end(session_id)
            return found

    def _remember(self, session_id: str, key: DataKey | None) -> None:
        with self._lock:
            held = self._cache.setdefault(session_id, {})
            if key is not None:
                held[key.version] = key
            self._cache.move_to_end(session_id)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)

    def _has_key(self, tx: Tx, session_id: str) -> bool:
        held = self._cached(session_id)
        if held:
            return True
        if held is not None:  # known clear
            return False
        if tx.one(_ANY, [session_id]) is None:
            self._remember(session_id, None)
            return False
        return True

    def _key_at(self, tx: Tx, session_id: str, version: int, record_id: str, field: str) -> DataKey:
        held = self._cached(session_id)
        if held and version in held:
            return held[version]
        row = tx.one(_AT, [session_id, version])
        if row is None:
            if self.provider is None:
                raise errors.KeyUnavailableError(
                    session_id, None, detail="the store was opened without encryption="
                )
            raise errors.PayloadAuthenticationError(
                session_id,
                record_id,
                field,
                detail=f"sealed under data key version {version}, which the session does not hold",
            )
        return self._key(session_id, version, str(row[0]), row[1])

    def _key(self, session_id: str, version: int, key_id: str, wrapped: Any) -> DataKey:
        held = self._cached(session_id)
        if held and version in held:
            return held[version]
        if self.provider is None:
            raise errors.KeyUnavailableError(
                session_id,
                None,
                detail="the session's payloads are sealed and the store was opened "
                "without encryption=",
            )
        try:
            plain = self.provider.unwrap(bytes(wrapped), key_id, wrap_context(session_id, version))
        except errors.KeyUnwrapError as exc:
            raise errors.KeyUnavailableError(session_id, key_id, detail=str(exc)) from exc
        if not isinstance(plain, bytes) or len(plain) != KEY_BYTES:  # a provider's fault
            raise errors.KeyUnavailableError(
                session_id, key_id, detail=f"the key provider's unwrap gave no {KEY_BYTES}-byte key"
            )
        key = DataKey(session_id, version, plain)
        self._remember(session_id, key)
        return key


CLEAR = Keyring(None)
"""The keyring of a store that is not encrypted (every transaction's default)."""
