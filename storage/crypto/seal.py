"""One stored value sealed with AES-256-GCM under a session's data key.

A sealed value is bound to where it is stored: its associated data is the
session id, the record id (an entry's id …), the field name and the data
key's version, so a ciphertext copied to another row, session or column
fails authentication. Its bytes are::

    b"TKE1" | key version (4 bytes, big-endian) | nonce (12 bytes) | ciphertext + tag (16 bytes)

Binary columns hold those bytes; text columns hold ``enc1:`` and their
base64 (no JSON text starts with ``e``, so a sealed value is never taken
for a clear one). A sealed value is 36 bytes longer than its clear bytes
(base64 then adds a third).
"""

from __future__ import annotations

import base64
import binascii
import secrets
import struct
from dataclasses import dataclass, field
from typing import Any

from turnkeeper.spec.errors import PayloadAuthenticationError

from ._aead import aesgcm, invalid_tag

MAGIC = b"TKE1"
TEXT_PREFIX = "enc1:"
_HEADER = struct.Struct(">4sI12s")
OVERHEAD = _HEADER.size + 16
"""Bytes a sealed value adds to its clear bytes (header and tag): 36."""


def _aad(session_id: str, record_id: str, field_name: str, version: int) -> bytes:
    parts = [p.encode("utf-8", "surrogatepass") for p in (session_id, record_id, field_name)]
    return (
        b"turnkeeper-value/1"
        + b"".join(struct.pack(">I", len(p)) + p for p in parts)
        + (struct.pack(">I", version))
    )


def is_sealed(value: bytes) -> bool:
    """Whether stored bytes are a sealed value (start with :data:`MAGIC`)."""
    return value[:4] == MAGIC


def is_sealed_text(value: str) -> bool:
    """Whether stored text is a sealed value (starts with :data:`TEXT_PREFIX`)."""
    return value.startswith(TEXT_PREFIX)


def key_version(sealed: bytes) -> int | None:
    """The data key version a sealed value names, or ``None`` when the bytes
    are too short to be one."""
    if len(sealed) < OVERHEAD or not is_sealed(sealed):
        return None
    return int(_HEADER.unpack_from(sealed)[1])


def text_bytes(text: str) -> bytes | None:
    """The sealed bytes a text column's value holds, or ``None`` when it is not
    well-formed base64 after :data:`TEXT_PREFIX`."""
    try:
        return base64.b64decode(text[len(TEXT_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        return None


@dataclass(frozen=True)
class DataKey:
    """A session's data key, unwrapped, at one version.

    ``seal`` and ``open`` work on bytes; ``seal_text`` and ``open_text`` on
    the text form a ``VARCHAR``/``TEXT`` column holds.
    """

    session_id: str
    version: int
    key: bytes = field(repr=False)
    _aead: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_aead", aesgcm(self.key))

    @staticmethod
    def new(session_id: str, version: int = 1) -> DataKey:
        """A fresh random 256-bit data key."""
        return DataKey(session_id, version, secrets.token_bytes(32))

    def seal(self, record_id: str, field_name: str, plain: bytes) -> bytes:
        """``plain`` sealed for (this session, ``record_id``, ``field_name``)."""
        nonce = secrets.token_bytes(12)
        body: bytes = self._aead.encrypt(
            nonce, plain, _aad(self.session_id, record_id, field_name, self.version)
        )
        return _HEADER.pack(MAGIC, self.version, nonce) + body

    def seal_text(self, record_id: str, field_name: str, plain: str) -> str:
        """Text ``plain`` sealed, in text form (``enc1:`` and base64)."""
        sealed = self.seal(record_id, field_name, plain.encode("utf-8"))
        return TEXT_PREFIX + base64.b64encode(sealed).decode("ascii")

    def open(self, record_id: str, field_name: str, sealed: bytes) -> bytes:
        """The clear bytes of a value :meth:`seal` made for (this session,
        ``record_id``, ``field_name``).

        Raises:
            PayloadAuthenticationError: the bytes are not a sealed value of
                this key's version, or fail authentication (altered, or
                sealed for another row, session, field or key).
        """
        if key_version(sealed) != self.version:
            raise self._refused(record_id, field_name, "not a value sealed by this data key")
        _, _, nonce = _HEADER.unpack_from(sealed)
        aad = _aad(self.session_id, record_id, field_name, self.version)
        try:
            plain: bytes = self._aead.decrypt(nonce, sealed[_HEADER.size :], aad)
        except invalid_tag():
            raise self._refused(
                record_id, field_name, "the ciphertext fails authentication"
            ) from None
        return plain

    def open_text(self, record_id: str, field_name: str, text: str) -> str:
        """The clear text of a value :meth:`seal_text` made.

        Raises:
            PayloadAuthenticationError: as :meth:`open`, or not the text form.
        """
        sealed = text_bytes(text) if is_sealed_text(text) else None
        if sealed is None:
            raise self._refused(record_id, field_name, "not a sealed value")
        try:
            return self.open(record_id, field_name, sealed).decode("utf-8")
        except UnicodeDecodeError:  # pragma: no cover - authenticated bytes are ours
            raise self._refused(record_id, field_name, "not UTF-8") from None

    def _refused(self, record_id: str, field_name: str, reason: str) -> PayloadAuthenticationError:
        return PayloadAuthenticationError(self.session_id, record_id, field_name, detail=reason)


def wrap_context(session_id: str, version: int) -> bytes:
    """The ``context`` a key provider binds a session's wrapped data key to."""
    return session_id.encode("utf-8", "surrogatepass") + struct.pack(">I", version)
