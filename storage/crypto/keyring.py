"""A store object's session data keys: made, wrapped and stored with a new
session, loaded and unwrapped on first use inside the transaction that needs
them, cached (bounded, thread-safe), and forgotten when the session is
deleted (crypto-shredding: the ``session_keys`` rows go in the delete's
transaction).

Every transaction carries the store object's :class:`Keyring` as ``tx.keys``
(:data:`CLEAR` for a store opened without ``encryption=`` on a store never
encrypted: nothing here runs then). Sealing a column is a call:
:meth:`Keyring.sealing` in the writing transaction, then
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

Schema (version 34): ``sessions.key_version`` names the data key version
a session's payloads are sealed under (``NULL``: clear). A writer seals
under the version it read with the session's head (or reads it) and names
that version in the head's compare-and-set: a writer that raced a rotation
loses, a store object opened without keys (before the store was marked)
refuses to write a clear payload into a sealed session, and a session whose
key row is gone refuses writes instead of writing clear. The marker holds a
check value the master key wrapped: an open with a provider that cannot
unwrap it (a wrong key under the right id) is refused before it wraps
anything.

A data key a transaction made (a new session's) is used from
``tx.made_keys`` in that transaction and cached only once unwrapped from
its committed row: a retried transaction makes a key of its own, and none
is ever taken for the stored one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from turnkeeper.spec import errors

from ..backend import STORE_NOW, Conflict
from ..codec import check_id, from_json
from .keys import KEY_BYTES, KeyProvider
from .seal import DataKey, is_sealed, is_sealed_text, key_version, text_bytes, wrap_context

if TYPE_CHECKING:
    from ..backend import Tx

CACHE_SESSIONS = 4096
"""How many sessions' unwrapped data keys a store object keeps (least
recently used evicted)."""

_AT = "SELECT key_id, wrapped FROM session_keys WHERE session_id = ? AND version = ?"
_VERSION = "SELECT key_version FROM sessions WHERE id = ?"
_MARKER = "SELECT * FROM store_encryption WHERE id = 1"

CHECK_UNMOVED = "NOT EXISTS (SELECT 1 FROM store_encryption WHERE id = 1 AND check_key_id <> ?)"
"""The condition a new data key is stored on (:meth:`Keyring.store_key`): the
store's check value is wrapped by the master key this object verified (its
parameter; ``NULL``: none verified, no condition)."""

UNREAD = -1
"""A session's key version its writer has not read (``Keyring.sealing``
reads it when the store is encrypted; a clear store object writes clear,
and its compare-and-set checks that the session is clear)."""

CHECK_CONTEXT = b"turnkeeper-store-check/1"
"""The wrap context of the marker's check value."""

CHECK_PLAIN = b"turnkeeper: the store's master key".ljust(KEY_BYTES, b"\0")
"""The 32 bytes the marker's check value wraps."""

PREPARED = 256
"""Data keys wrapped ahead of their sessions' creation a store object keeps at most."""

PAYLOAD = "payload"
"""The field name an entry's payload is sealed under (``entries.payload``)."""


def check_provider(provider: object) -> KeyProvider | None:
    """``provider`` as ``open_store``'s ``encryption=`` takes it: ``None`` or a
    :class:`KeyProvider`.

    Raises:
        InvalidInputError: (field ``encryption``) anything else, or a
            provider whose ``key_id`` is not an identifier (empty, a line
            break, …: it is stored beside every data key it wraps).
    """
    if provider is not None and not isinstance(provider, KeyProvider):
        raise errors.InvalidInputError(
            "encryption", "expected a key provider (key_id, wrap, unwrap), e.g. LocalKeyProvider"
        )
    if provider is not None:  # stored beside each wrapped key: an identifier, as the store's ids
        key_id = provider.key_id
        if not isinstance(key_id, str):
            raise errors.InvalidInputError("encryption", "the provider's key_id is not a string")
        check_id(key_id, "encryption")
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
        self.markable = True
        """Whether the schema holds the marker (version 32 on; a test holding a
        store at an older version sets it ``False``: nothing is read)."""
        self._max = cache_sessions
        self._lock = threading.Lock()
        # The master key id of the store's check value this object verified
        # (``None``: none read, a marker written before schema 34).
        self._check_id: str | None = None
        # session id -> {version: DataKey}; an empty dict: the session holds no key.
        self._cache: OrderedDict[str, dict[int, DataKey]] = OrderedDict()
        # session id -> (key id, wrapped key, key) made before the creating transaction.
        self._prepared: OrderedDict[str, tuple[str, bytes, DataKey]] = OrderedDict()

    # -- the store marker -------------------------------------------------------

    def adopt(self, tx: Tx, *, writable: bool) -> None:
        """Read the store's marker (opening): a store marked encrypted is
        treated as encrypted with or without a provider; a store opened with
        a provider for the first time is marked (``writable``), with the
        check value the provider's current key wraps.

        Raises:
            KeyUnavailableError: (``session_id`` ``""``, ``key_id`` the
                check's) the provider cannot unwrap the marker's check
                value: it lacks that master key, or holds another key under
                its id (a mistyped key file, another store's key). Nothing
                is written.
        """
        found = tx.one(_MARKER)
        provider = self.provider
        if found is None:
            if provider is not None and writable:
                key_id, wrapped = provider.key_id, provider.wrap(CHECK_PLAIN, CHECK_CONTEXT)
                tx.exec(
                    "INSERT INTO store_encryption (id, key_id, enabled_at, check_key_id, "
                    "check_wrapped) VALUES (1, ?, now(), ?, ?) ON CONFLICT (id) DO NOTHING",
                    [key_id, key_id, wrapped],
                )
                self._check_id = key_id
            return
        self.encrypted = True
        if provider is None or len(found) < 5:  # (a schema before version 34: no check)
            return
        check_key_id, check_wrapped = found[3], found[4]
        if check_wrapped is None:  # marked before version 34: the first provider's sets it
            if writable:
                tx.exec(
                    "UPDATE store_encryption SET check_key_id = ?, check_wrapped = ? "
                    "WHERE id = 1 AND check_wrapped IS NULL",
                    [provider.key_id, provider.wrap(CHECK_PLAIN, CHECK_CONTEXT)],
                )
                self._check_id = provider.key_id
            return
        self._verify_check(provider, "", str(check_key_id), bytes(check_wrapped))

    def _verify_check(
        self, provider: KeyProvider, session_id: str, check_key_id: str, check_wrapped: bytes
    ) -> None:
        """The provider unwraps the marker's check value (wrapped by master
        key ``check_key_id``) to :data:`CHECK_PLAIN`; that key id is then
        the one this object's new data keys are stored against
        (:meth:`store_key`).

        Raises:
            KeyUnavailableError: (``session_id``, ``key_id`` the check's) it
                cannot: it does not hold that master key, or holds another
                key under its id.
        """
        try:
            plain = provider.unwrap(check_wrapped, check_key_id, CHECK_CONTEXT)
        except errors.KeyUnwrapError as exc:
            raise errors.KeyUnavailableError(
                session_id,
                check_key_id,
                detail="the key provider cannot open the store's check value: it does not "
                f"hold the master key {check_key_id!r} the store's keys are wrapped with "
                "(rotated by `turnkeeper keys rotate` since this store object opened? "
                "restart it with the new key text), or holds another key under that id "
                f"({exc.detail or exc}); nothing was written",
            ) from exc
        if plain != CHECK_PLAIN:
            raise errors.KeyUnavailableError(
                session_id,
                check_key_id,
                detail="the key provider's unwrap of the check value gave other bytes",
            )
        self._check_id = check_key_id

    def store_key(self, tx: Tx, session_id: str, version: int, key_id: str, wrapped: bytes) -> None:
        """Insert data key ``version`` of ``session_id`` (wrapped by master key
        ``key_id``) in ``tx``, on the condition that the store's check value
        is still wrapped by the master key this object verified at open (one
        statement). After ``turnkeeper keys rotate`` moved it, the marker is
        read again and the provider must open the new check value: a process
        still running with the old key text only would otherwise wrap new
        data keys under a master key the operator is about to retire (attack
        finding on issue 23, part 2); one given the new key text (and the
        old, during a rollout) goes on.

        Raises:
            KeyUnavailableError: (``key_id`` the store's current one) this
                object's provider does not hold the store's current master
                key; nothing is written.
            Conflict: the marker moved again meanwhile (the transaction retries).
        """
        sql = (
            "INSERT INTO session_keys (session_id, version, key_id, wrapped, created_at) "
            f"SELECT ?, ?, ?, ?, {STORE_NOW} WHERE {CHECK_UNMOVED}"
        )
        params = [session_id, version, key_id, wrapped, tx.now]
        if tx.count(sql, [*params, self._check_id]) == 1:
            return
        found = tx.one(_MARKER)
        if found is None or len(found) < 5 or found[4] is None or self.provider is None:
            raise Conflict("the store's marker moved while a data key was stored")
        self._verify_check(self.provider, session_id, str(found[3]), bytes(found[4]))
        if tx.count(sql, [*params, self._check_id]) != 1:
            raise Conflict("the store's check value moved while a data key was stored")

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
            self._prepared[session_id] = (self.provider.key_id, wrapped, key)
            while len(self._prepared) > PREPARED:
                self._prepared.popitem(last=False)

    def new_session(self, tx: Tx, session_id: str) -> int | None:
        """Give a session being created in ``tx`` its data key (version 1),
        wrapped by the provider, when the store is encrypted (the session
        row's ``key_version`` set to it, the key in ``tx.made_keys``); the
        version, or ``None`` (clear). A store object that took the store for
        clear reads the marker first (marked since it opened: encrypted now).

        Raises:
            KeyUnavailableError: (``key_id`` ``None``) the store is encrypted
                and was opened without a provider: no session is created in
                it that would hold clear payloads.
        """
        if not self.encrypted:
            if not self.markable or tx.one(_MARKER) is None:
                return None
            self._marked()
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
            prepared = (self.provider.key_id, wrapped, key)
        self.store_key(tx, session_id, 1, prepared[0], prepared[1])
        tx.exec("UPDATE sessions SET key_version = 1 WHERE id = ?", [session_id])
        # Not cached: the transaction may yet roll back (a retry makes another key).
        tx.made_keys[(session_id, 1)] = prepared[2]
        return 1

    def sealing(
        self, tx: Tx, session_id: str, version: int | None = UNREAD
    ) -> tuple[DataKey | None, int | None]:
        """The data key a write of ``session_id``'s payloads in ``tx`` seals
        with, and its version: the one ``version`` names (the session row's
        ``key_version`` as the writer read it with its head; :data:`UNREAD`:
        read here when the store is encrypted, taken for clear otherwise),
        or ``(None, None)`` for a clear session. The writer names the
        version in its compare-and-set of the session row.

        Raises:
            KeyUnavailableError: the session's payloads are sealed and the
                store was opened without a provider (``key_id`` ``None``),
                its key row is gone, or the provider cannot unwrap it
                (``key_id`` named, the provider's ``KeyUnwrapError`` as
                ``__cause__``). Nothing is written.
        """
        if version == UNREAD:
            if not self.encrypted:
                return None, None  # the compare-and-set checks the session is clear
            # (the writer names it in its compare-and-set of the session row)
            row = tx.one(_VERSION, [session_id])
            version = None if row is None or row[0] is None else int(row[0])
        if version is None:
            return None, None
        if self.provider is None:
            self._marked()
            raise errors.KeyUnavailableError(
                session_id,
                None,
                detail="the session's payloads are sealed and the store was opened "
                "without encryption=",
            )
        made = tx.made_keys.get((session_id, version))
        if made is not None:
            return made, version
        held = self._cached(session_id)
        if held and version in held:
            return held[version], version
        row = tx.one(_AT, [session_id, version])
        if row is None:
            raise errors.KeyUnavailableError(
                session_id,
                None,
                detail=f"the session's data key (version {version}) is gone: its key row "
                "was removed",
            )
        return self._key(session_id, version, str(row[0]), row[1]), version

    # -- reads ------------------------------------------------------------------

    def open_json(self, tx: Tx, session_id: str, record_id: str, field: str, stored: str) -> Any:
        """The decoded JSON a column holds (sealed or clear).

        Raises:
            KeyUnavailableError: as :meth:`sealing`.
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
        assert raw is not None  # (a version was read from it)
        plain = self._key_at(tx, session_id, version, record_id, field).open(record_id, field, raw)
        try:  # (the bytes decoded once: DataKey.open_text would decode the base64 again)
            return plain.decode("utf-8")
        except UnicodeDecodeError:  # pragma: no cover - authenticated bytes are ours
            raise errors.PayloadAuthenticationError(
                session_id, record_id, field, detail="not UTF-8"
            ) from None

    def open_bytes(
        self, tx: Tx, session_id: str, record_id: str, field: str, stored: bytes
    ) -> bytes:
        """The clear bytes of a binary column's value (sealed: starts with
        ``TKE1``; clear bytes are returned as they are), by the rules of
        :meth:`open_json`. A sealed value is opened (or refused) also by a
        store object that took the store for clear.

        Raises:
            KeyUnavailableError, PayloadAuthenticationError: as :meth:`open_json`.
        """
        if not is_sealed(stored):
            if self.encrypted and self._has_key(tx, session_id):
                raise errors.PayloadAuthenticationError(
                    session_id,
                    record_id,
                    field,
                    detail="a clear value in a session whose payloads are sealed",
                )
            return stored
        version = key_version(stored)
        if version is None:
            raise errors.PayloadAuthenticationError(
                session_id, record_id, field, detail="not a well-formed sealed value"
            )
        self._marked()
        return self._key_at(tx, session_id, version, record_id, field).open(
            record_id, field, stored
        )

    def forget(self, session_id: str) -> None:
        """Drop the cached keys of ``session_id`` (deleted: its rows are gone)."""
        with self._lock:
            self._cache.pop(session_id, None)

    def _marked(self) -> None:
        """The store was marked encrypted since this store object opened."""
        if self is not CLEAR:  # (the default of a transaction outside a store)
            self.encrypted = True

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
        row = tx.one(_VERSION, [session_id])
        if row is None or row[0] is None:  # (no such session: nothing to remember)
            if row is not None:
                self._remember(session_id, None)
            return False
        return True

    def _key_at(self, tx: Tx, session_id: str, version: int, record_id: str, field: str) -> DataKey:
        made = tx.made_keys.get((session_id, version))
        if made is not None:
            return made
        held = self._cached(session_id)
        if held and version in held:
            return held[version]
        row = tx.one(_AT, [session_id, version])
        if row is None:
            if self.provider is None:
                raise errors.KeyUnavailableError(
                    session_id, None, detail="the store was opened without encryption="
                )
            newest = tx.one(_VERSION, [session_id])
            current = None if newest is None or newest[0] is None else int(newest[0])
            if version == current:  # the session's own key row is gone
                raise errors.KeyUnavailableError(
                    session_id,
                    None,
                    detail=f"the session's data key (version {version}) is gone: its key "
                    "row was removed (crypto-shredded by a delete, or lost)",
                )
            # another version (a flipped header, a value left from before a rotation):
            # this value is damaged, not the session's key
            raise errors.PayloadAuthenticationError(
                session_id,
                record_id,
                field,
                detail=f"sealed under data key version {version}, which the session does not "
                f"hold (its payloads are sealed under version {current})",
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
