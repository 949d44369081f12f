"""Key providers: the master key the user holds, which wraps each session's
data key (envelope encryption).

A provider is anything with the three members of :class:`KeyProvider`; a KMS
plugs in by implementing them (``wrap`` as the KMS's encrypt with
``context`` as its encryption context, ``unwrap`` as its decrypt).
:class:`LocalKeyProvider` holds the keys itself, read from an environment
variable or a file.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from turnkeeper.spec.errors import InvalidInputError, KeyUnwrapError

from ..codec import check_id
from ._aead import aesgcm, invalid_tag

KEY_ENV = "TURNKEEPER_MASTER_KEY"
"""The environment variable :meth:`LocalKeyProvider.from_env` reads by default
(the CLI reads it too)."""

KEY_BYTES = 32
"""The size of every key, master and data: 256 bits (AES-256)."""

_WRAP_LABEL = b"turnkeeper-data-key/1\x00"
_NONCE_BYTES = 12
_TAG_BYTES = 16


@runtime_checkable
class KeyProvider(Protocol):
    """What the store needs of the key the user holds.

    ``key_id`` names the current master key: new data keys are wrapped by it,
    and rotation (``turnkeeper keys rotate``) rewraps older ones to it.
    ``wrap`` returns the wrapped form of a 32-byte data key, bound to
    ``context`` (the session id and the data key's version, as bytes); the
    store keeps it beside the ``key_id`` that wrapped it. ``unwrap`` gives
    the data key back for that ``key_id`` and ``context``, or raises
    ``KeyUnwrapError`` when it does not hold that key or the bytes fail
    authentication. Both may be called from several threads at once.
    """

    @property
    def key_id(self) -> str: ...

    def wrap(self, data_key: bytes, context: bytes) -> bytes: ...

    def unwrap(self, wrapped: bytes, key_id: str, context: bytes) -> bytes: ...


class LocalKeyProvider:
    """Master keys held in this process: AES-256-GCM wraps each data key.

    Args:
        keys: key id -> 32 key bytes. Ids are identifiers (``check_id``)
            without ``:``.
        current: the id of the key that wraps new data keys; the others are
            kept only to unwrap data keys not yet rotated to it.

    The text form (:meth:`from_text`, :meth:`from_env`, :meth:`from_file`)
    is one key per line (or comma), ``<key id>:<base64 of 32 bytes>``, the
    current key first; :meth:`generate` makes one line. To rotate: put a new
    line first, run ``turnkeeper keys rotate``, then drop the old line (the
    old key retired: copies of the store from before, backups included, can
    no longer be read for sessions deleted since).

    Raises:
        InvalidInputError: (field ``encryption``) an id that is not an
            identifier or holds ``:``, a key that is not 32 bytes, no keys,
            or ``current`` not among them.
    """

    def __init__(self, keys: Mapping[str, bytes], current: str) -> None:
        if not keys:
            raise InvalidInputError("encryption", "a key provider needs at least one key")
        checked: dict[str, bytes] = {}
        for key_id, key in keys.items():
            check_id(key_id, "encryption")
            if ":" in key_id:
                raise InvalidInputError("encryption", f"a key id holds no ':' ({key_id!r})")
            if not isinstance(key, bytes) or len(key) != KEY_BYTES:
                raise InvalidInputError("encryption", f"key {key_id!r} must be {KEY_BYTES} bytes")
            checked[key_id] = key
        if current not in checked:
            raise InvalidInputError("encryption", f"the current key {current!r} is not given")
        self._current = current
        self._aeads = {key_id: aesgcm(key) for key_id, key in checked.items()}

    @property
    def key_id(self) -> str:
        """The current master key's id."""
        return self._current

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id held, the current first."""
        return (self._current, *(k for k in self._aeads if k != self._current))

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        """``data_key`` sealed by the current key: a 12-byte nonce, then the
        AES-GCM ciphertext and tag (60 bytes for a 32-byte key)."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        aad = _WRAP_LABEL + self._current.encode() + b"\x00" + context
        sealed: bytes = self._aeads[self._current].encrypt(nonce, data_key, aad)
        return nonce + sealed

    def unwrap(self, wrapped: bytes, key_id: str, context: bytes) -> bytes:
        """The data key ``wrap`` sealed under ``key_id`` for ``context``.

        Raises:
            KeyUnwrapError: ``key_id`` is not held, or the bytes fail
                authentication (another key under that id, another session's
                or version's wrapped key, a flipped byte).
        """
        aead = self._aeads.get(key_id)
        if len(wrapped) <= _NONCE_BYTES + _TAG_BYTES:  # AESGCM refuses a short nonce untyped
            raise KeyUnwrapError(key_id, detail="the wrapped data key is too short")
        if aead is None:
            raise KeyUnwrapError(key_id, detail="this provider does not hold that key")
        aad = _WRAP_LABEL + key_id.encode() + b"\x00" + context
        try:
            key: bytes = aead.decrypt(wrapped[:_NONCE_BYTES], wrapped[_NONCE_BYTES:], aad)
        except invalid_tag():
            raise KeyUnwrapError(
                key_id, detail="the wrapped data key fails authentication"
            ) from None
        return key

    @classmethod
    def from_text(cls, text: str) -> LocalKeyProvider:
        """Keys from their text form (see the class); the first is current.

        Raises:
            InvalidInputError: (field ``encryption``) text that is not that form.
        """
        keys: dict[str, bytes] = {}
        current: str | None = None
        for line in text.replace(",", "\n").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key_id, sep, encoded = line.partition(":")
            if not sep:
                raise InvalidInputError("encryption", "a key line is '<key id>:<base64 key>'")
            try:
                key = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise InvalidInputError(
                    "encryption", f"key {key_id.strip()!r} is not base64"
                ) from None
            key_id = key_id.strip()
            if key_id in keys:
                raise InvalidInputError("encryption", f"key id {key_id!r} is given twice")
            keys[key_id] = key
            current = current or key_id
        if current is None:
            raise InvalidInputError("encryption", "no key given")
        return cls(keys, current)

    @classmethod
    def from_env(cls, name: str = KEY_ENV) -> LocalKeyProvider:
        """Keys from the environment variable ``name`` (text form).

        Raises:
            InvalidInputError: (field ``encryption``) the variable is unset
                or not that form.
        """
        text = os.environ.get(name)
        if not text:
            raise InvalidInputError("encryption", f"the environment variable {name} is not set")
        return cls.from_text(text)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> LocalKeyProvider:
        """Keys from a file (text form). Keep it readable by its owner only.

        Raises:
            InvalidInputError: (field ``encryption``) the file cannot be read
                or is not that form.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInputError("encryption", f"cannot read key file {path}: {exc}") from None
        return cls.from_text(text)

    @staticmethod
    def generate(key_id: str | None = None) -> str:
        """One line of the text form: a new random 32-byte key under
        ``key_id`` (default ``key-<UTC date>-<8 hex digits>``)."""
        if key_id is None:
            key_id = f"key-{datetime.now(UTC):%Y%m%d}-{secrets.token_hex(4)}"
        key = secrets.token_bytes(KEY_BYTES)
        line = f"{key_id}:{base64.b64encode(key).decode()}"
        LocalKeyProvider.from_text(line)  # the id is checked as a reader will
        return line
