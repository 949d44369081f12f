"""The rows of ``entries`` read as :class:`~turnkeeper.spec.records.Entry`
values: the columns, one entry by its id, and a branch walked from its leaf
(shared by the session writes, ``sessions.py``, and the pairing checks,
``pairing_checks.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from turnkeeper.spec import errors
from turnkeeper.spec.clear_facts import ClearFacts
from turnkeeper.spec.records import Entry

from ..backend import Tx, keyed, utc
from ..codec import from_json
from ..crypto.keyring import PAYLOAD, UNREAD
from ..crypto.seal import TEXT_PREFIX, is_sealed_text
from . import sealed_json

CLEAR_COLUMNS = ClearFacts._fields
"""The columns of ``entries`` that keep what analytics reads of a payload in
clear (``role``, ``provider``, ``model``; :mod:`turnkeeper.spec.clear_facts`)."""

ENTRY_COLUMNS = (
    "session_id",
    "id",
    "parent_id",
    "kind",
    "seq",
    "ts",
    "payload",
    "lease_epoch",
    "written_at",
    *CLEAR_COLUMNS,
)
"""Every column of ``entries``, in table order (bulk inserts give them all): the
last ones the clear facts of its payload (:func:`turnkeeper.spec.clear_facts.clear_facts`)."""
ENTRY_SELECT = "session_id, id, parent_id, kind, seq, ts, payload, lease_epoch"
"""The columns :func:`entry_row` reads, in its order."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def entry_columns(tx: Tx) -> str:
    """:data:`ENTRY_SELECT` with ``ts`` read as epoch microseconds (see
    ``Dialect.epoch_us``), which :func:`entry_row` turns back into a datetime."""
    return ENTRY_SELECT.replace(" ts,", f" {tx.dialect.epoch_us('ts')},")


OF_SESSION = "session_id = ?"
"""An entry found by its id (``entries_by_id`` on DuckDB) that is the session's."""


def custom_type_text(custom_type: str) -> str:
    """The text a custom entry's stored payload holds for its type,
    ``"customType":"<type>"`` as the store encodes JSON (orjson, compact): what
    a statement looks for with ``strpos`` before the decoded payload is checked."""
    return '"customType":' + orjson.dumps(custom_type).decode("utf-8")


def entry_row(tx: Tx, row: Sequence[Any]) -> Entry:
    """An :class:`Entry` from a row of :data:`ENTRY_SELECT` (``ts`` a datetime, or
    epoch microseconds as :func:`entry_columns` reads it), its payload opened
    with the session's data key when sealed (``tx.keys``).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: a sealed payload
            that cannot be opened (see ``Keyring.open_json``).
    """
    ts = row[5]
    when = _EPOCH + timedelta(microseconds=ts) if isinstance(ts, int) else utc(ts)
    payload = payload_of(tx, row[0], row[1], row[6])
    return Entry(row[0], row[1], row[2], row[3], row[4], when, payload, row[7])


def or_sealed(tx: Tx, condition: str) -> str:
    """``condition``, a filter on the payload's JSON text (``strpos(payload, ?)
    > 0`` …), widened in an encrypted store to every sealed payload too (whose
    text hides what it holds): the caller checks the opened payloads, as it
    does already for a text match that sits deeper in another field."""
    if not tx.keys.encrypted:
        return condition
    return f"({condition} OR strpos(payload, '{TEXT_PREFIX}') = 1)"


def clear_entry_row(row: Sequence[Any]) -> Entry:
    """:func:`entry_row` outside a transaction (an analytics read: ``turnkeeper
    audit``), for clear payloads only.

    Raises:
        KeyUnavailableError: (``key_id`` ``None``) the payload is sealed: an
            analytics read holds no data keys.
    """
    if isinstance(row[6], str) and is_sealed_text(row[6]):
        raise errors.KeyUnavailableError(
            row[0], None, detail="a sealed payload is opened only by the store's own reads"
        )
    ts = row[5]
    when = _EPOCH + timedelta(microseconds=ts) if isinstance(ts, int) else utc(ts)
    return Entry(row[0], row[1], row[2], row[3], row[4], when, from_json(row[6]), row[7])


def payload_of(tx: Tx, session_id: str, entry_id: str, stored: str) -> Any:
    """An entry's stored payload decoded (opened first when sealed).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: see ``sealed_json.open_json``.
    """
    return sealed_json.open_json(tx, session_id, entry_id, PAYLOAD, stored)


def seal_payloads(
    tx: Tx, session_id: str, payloads: Sequence[tuple[str, str]], version: int | None = UNREAD
) -> tuple[list[str], int | None]:
    """The stored form of ``(entry id, payload JSON)`` pairs of ``session_id``
    (sealed under the session's data key, ``enc1:…``, when it has one, else
    as given) and the key version they are sealed under (``None``: clear),
    which the writer names in its compare-and-set of the session row.
    ``version``: the session row's ``key_version`` as the writer read it
    (see ``Keyring.sealing``).

    Raises:
        KeyUnavailableError: the session's key cannot be had (see
            ``Keyring.sealing``); nothing is written.
    """
    key, version = tx.keys.sealing(tx, session_id, version)
    if key is None:
        return [text for _, text in payloads], None
    return [key.seal_text(entry_id, PAYLOAD, text) for entry_id, text in payloads], version


def entry(tx: Tx, session_id: str, entry_id: str) -> Entry | None:
    """One entry, or ``None``."""
    row = tx.one(
        f"SELECT {entry_columns(tx)} FROM entries WHERE {keyed('id', OF_SESSION)}",
        [entry_id, session_id],
    )
    return None if row is None else entry_row(tx, row)


def path_to_leaf(tx: Tx, session_id: str, leaf: str | None) -> list[Entry]:
    """Root → ``leaf`` path of the session: its rows read flat in one scan and the
    tree walked in memory (a recursive query cost most of a replay). Memory
    holds the session's stored rows once (about their stored bytes) while the
    path is decoded; a corrupt cycle or a missing parent ends the walk."""
    if leaf is None:
        return []
    rows = tx.rows(f"SELECT {entry_columns(tx)} FROM entries WHERE session_id = ?", [session_id])
    return walk_rows(tx, rows, leaf)


def walk_rows(tx: Tx, rows: list[tuple[Any, ...]], leaf: str | None) -> list[Entry]:
    """Root → ``leaf`` through ``rows`` (``entries`` rows by :data:`ENTRY_SELECT`),
    decoding only the path; ends at a parent not among them or a cycle.
    Consumes ``rows`` (the list is emptied, and each row let go once decoded,
    so a long session's rows and its decoded path are not held twice)."""
    by_id = {row[1]: row for row in rows}
    rows.clear()
    ids: list[str] = []
    seen: set[str] = set()
    node: str | None = leaf
    while node is not None and node not in seen and node in by_id:
        seen.add(node)
        ids.append(node)
        node = by_id[node][2]
    del seen
    return [entry_row(tx, by_id.pop(i)) for i in reversed(ids)]
