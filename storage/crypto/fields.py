"""Sealing one JSON or text column of a session's row beside its payloads
(capability and resource event ``data``, guidance text, a Responses turn's
summaries, a delivery intent's transport context): the column holds the
value's text, or its sealed text form (``enc1:``) in a session whose
payloads are sealed. Each such column is listed in ``columns.SEALED``.

Both run inside the writing or reading transaction (``tx.keys``). A writer
of these columns is a session write (under the session's lease, or while
nobody holds it) or, for guidance, writes the session's row: a change of the
session's data key made under its lease does not interleave with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..codec import from_json
from .keyring import UNREAD

if TYPE_CHECKING:
    from ..backend import Tx


def seal_value(
    tx: Tx,
    session_id: str,
    record_id: str,
    field: str,
    text: str | None,
    version: int | None = UNREAD,
) -> str | None:
    """``text`` as the column stores it: sealed under the session's data key
    (record ``record_id``, field ``field``) when its payloads are sealed,
    else as it is; ``None`` stays ``None``. ``version``: the session row's
    ``key_version`` as the writer read it in this transaction (no statement
    more), else :data:`~.keyring.UNREAD` (read here when the store is encrypted).

    Raises:
        KeyUnavailableError: as ``Keyring.sealing`` (nothing is written).
    """
    if text is None:
        return None
    key, _ = tx.keys.sealing(tx, session_id, version)
    return text if key is None else key.seal_text(record_id, field, text)


def open_value(
    tx: Tx, session_id: str, record_id: str, field: str, stored: str | None
) -> str | None:
    """The clear text a column made by :func:`seal_value` holds (``None`` stays).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: as ``Keyring.open_text``.
    """
    return None if stored is None else tx.keys.open_text(tx, session_id, record_id, field, stored)


def open_json_value(tx: Tx, session_id: str, record_id: str, field: str, stored: str | None) -> Any:
    """The decoded JSON value a column made by :func:`seal_value` holds
    (``None``: SQL ``NULL``; see :func:`open_value`)."""
    text = open_value(tx, session_id, record_id, field, stored)
    return None if text is None else from_json(text)
