"""Columns of a session's records, JSON or text, sealed and opened: entry
payloads, tool-execution results and provider metadata, run requests, run
event data, guidance text (``storage/crypto/columns.py`` lists each with its
field name).

A column's value is sealed under the session's data key, with the record's
id and the column's name as associated data (``Keyring.sealing`` then
``DataKey.seal_text``), when the session has one; else it is stored as
given. Opening checks a sealed value's authentication and refuses a clear
value in a sealed session (``Keyring.open_json``). Only the store's own
reads open these values: ``query()`` sees the ciphertext.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnkeeper.spec import errors

from ..backend import Tx
from ..codec import from_json
from ..crypto.keyring import UNREAD
from ..crypto.seal import is_sealed_text


def session_version(tx: Tx, session_id: str) -> int | None:
    """The session's data key version (``sessions.key_version``; ``None``: its
    payloads are clear), for a writer to seal under (:func:`seal`): read by
    every store object, so one that took the store for clear refuses to
    write a clear value into a sealed session.

    Raises:
        SessionNotFoundError: no such session.
    """
    # (No lock needed against a rotation of the session's key: every sealed
    # write is a session write, fenced by the session's lease or made while
    # none is held, as the rotation is: on a server both then write the
    # lease's or the session's row, and the second to commit is retried.)
    sql = "SELECT key_version FROM sessions WHERE id = ?"
    row = tx.one(sql, [session_id])
    if row is None:
        raise errors.SessionNotFoundError(session_id)
    return None if row[0] is None else int(row[0])


def seal(
    tx: Tx, session_id: str, values: Sequence[tuple[str, str, str]], version: int | None = UNREAD
) -> list[str]:
    """The stored form of ``(record id, field, JSON text)`` triples of
    ``session_id``: sealed (``enc1:…``) under the data key version
    ``version`` names (the session row's ``key_version`` as the writer read
    it; :data:`UNREAD`: read here when the store is encrypted), else as given.

    Raises:
        KeyUnavailableError: the session's payloads are sealed and the key
            cannot be had (the store object was opened without a provider,
            the key row is gone, the provider cannot unwrap it); nothing is
            written.
    """
    key, _ = tx.keys.sealing(tx, session_id, version)
    if key is None:
        return [text for _, _, text in values]
    return [key.seal_text(record_id, field, text) for record_id, field, text in values]


def seal_one(
    tx: Tx, session_id: str, record_id: str, field: str, text: str, version: int | None = UNREAD
) -> str:
    """:func:`seal` of one value."""
    return seal(tx, session_id, [(record_id, field, text)], version)[0]


def open_json(tx: Tx, session_id: str, record_id: str, field: str, stored: str) -> Any:
    """A stored JSON column's value decoded, opened first when sealed.

    Raises:
        KeyUnavailableError: (``key_id`` ``None``) the value is sealed and the
            store object holds no keys (opened without ``encryption=``), or
            see ``Keyring.open_json``.
        PayloadAuthenticationError: (``session_id``, ``record_id``, ``field``)
            a sealed value that fails authentication (a flipped byte, moved
            from another row, session or column), or a clear value in a
            session whose payloads are sealed.
    """
    return from_json(open_text(tx, session_id, record_id, field, stored))


def open_text(tx: Tx, session_id: str, record_id: str, field: str, stored: str) -> str:
    """A stored text column's clear text, opened first when sealed (raises as
    :func:`open_json`)."""
    keys = tx.keys
    if not keys.encrypted:
        if is_sealed_text(stored):  # marked encrypted since this store object opened
            raise errors.KeyUnavailableError(
                session_id, None, detail="a sealed value, and the store was opened without keys"
            )
        return stored
    return keys.open_text(tx, session_id, record_id, field, stored)
