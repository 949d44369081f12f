"""Re-sealing a session: every sealed column of it (``crypto/columns.py``
:data:`~turnkeeper.storage.crypto.columns.SEALED`) opened under the data key
it is sealed under (or read clear, for a session without one) and sealed
again under a new data key version, in one transaction. One walk serves
both callers: ``sessions.rotate_key`` (version *v* to *v + 1*) and
``sessions.encrypt`` (clear to version 1, what ``turnkeeper encrypt`` runs
per session).

The walk takes the session row first (PostgreSQL ``FOR UPDATE``: a writer
of the session waits for it; DuckDB serializes writes), reads each column's
values of the session in pages of :data:`PAGE_ROWS` ordered by record id,
and writes each page back as one ``UPDATE … FROM`` a list of (record id,
value) pairs. Python holds one page at a time; the database holds what the
transaction writes. It then moves ``sessions.key_version`` to the new
version with the head's compare-and-set (``session_rows.HEAD_IS``: the leaf,
next seq and key version it read), deletes the old version's
``session_keys`` row and the session's stored replay snapshots (clear
copies of its payloads, written while the store was clear), all in the same
transaction. An append judged at the old version loses its compare-and-set
and is retried under the new one; nothing sealed under the old version
outlives the transaction.

A sealed column's ``(session, record)`` names one row (every column of
``SEALED`` is keyed so): the walk pages by record id.
"""

from __future__ import annotations

from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import Lease

from ..backend import Conflict, Tx, keyed
from ..crypto.columns import SEALED, SealedColumn
from ..crypto.keyring import Keyring
from ..crypto.keys import KeyProvider
from ..crypto.seal import DataKey, is_sealed, is_sealed_text, wrap_context
from . import leases
from .session_rows import HEAD_IS, HEAD_READ

PAGE_ROWS = 5000
"""Values of one sealed column the walk reads, re-seals and writes back at a time."""


Prepared = tuple[DataKey, str, bytes]
"""A new data key made and wrapped before the transaction (a KMS's wrap is a
network call, never made while the transaction holds the session row): the
key (its version the one the caller expects to make), the master key id
that wrapped it, the wrapped bytes."""


def prepare(provider: KeyProvider, session_id: str, version: int) -> Prepared:
    """A new data key of ``session_id`` at ``version``, wrapped by ``provider``."""
    key = DataKey.new(session_id, version)
    return key, provider.key_id, provider.wrap(key.key, wrap_context(session_id, version))


def reseal(
    tx: Tx,
    session_id: str,
    lease: Lease | None,
    *,
    clear_only: bool,
    prepared: Prepared | None = None,
) -> int | None:
    """Seal every sealed column of ``session_id`` under a new data key
    version inside ``tx`` (see the module docstring); returns the new
    version, or ``None`` when ``clear_only`` and the session is already
    sealed (nothing written: ``turnkeeper encrypt`` resumes past it).

    ``lease``: the session's lease (fenced), else nobody may hold a live one.
    ``prepared``: the new key made before the transaction (:func:`prepare`),
    used when its version is the one the session row calls for (else a key
    is made and wrapped here).

    Raises:
        SessionNotFoundError: no such session.
        LeaseLostError, BusyError: the fence (as every session write).
        KeyUnavailableError: the store object has no key provider
            (``key_id`` ``None``), or the session's current data key cannot
            be had (its row is gone, the provider cannot unwrap it).
        PayloadAuthenticationError: a stored value fails to open under the
            session's current key, or a clear session holds a sealed value:
            nothing is re-sealed, the transaction rolls back.
        NotSupportedError: the session's ledger has records under more
            than one tenant (their record ids, the sequences, collide); or,
            sealing a clear session, its ledger has blobs outside the
            database (an ``FsspecBlobs`` store the walk cannot reach: they
            would stay clear in a sealed session). Nothing is written.
        Conflict: the session row moved under the walk (retried).
    """
    keys = tx.keys
    head = _lock_head(tx, session_id)
    if head is None:
        raise errors.SessionNotFoundError(session_id)
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    leaf, seq, old = head[0], head[1], None if head[2] is None else int(head[2])
    if old is not None and clear_only:
        return None
    tenants = tx.one(_TENANTS, [session_id])
    if tenants is not None and int(tenants[0]) > 1:
        raise errors.NotSupportedError(
            detail=f"session {session_id!r} has ledger records under {int(tenants[0])} tenants: "
            "their sequences share record ids, which the walk cannot tell apart; nothing "
            "was re-sealed"
        )
    if old is None and tx.one(_EXTERNAL_BLOBS, [session_id]) is not None:
        raise errors.NotSupportedError(
            detail=f"session {session_id!r} has ledger blob pointers whose blobs are not in the "
            "database (kept in a blob store of files or objects, or lost), which sealing a "
            "session cannot reach: nothing was sealed; the session stays clear"
        )
    provider = _provider(keys, session_id)
    opener = None if old is None else keys.sealing(tx, session_id, old)[0]
    version = 1 if old is None else old + 1
    if prepared is None or prepared[0].version != version:
        prepared = prepare(provider, session_id, version)
    key, key_id, wrapped = prepared
    keys.store_key(tx, session_id, version, key_id, wrapped)
    tx.made_keys[(session_id, version)] = key
    for column in SEALED:
        _reseal_column(tx, column, session_id, opener, key)
    moved = tx.count(
        f"UPDATE sessions SET key_version = ? WHERE {keyed('id', HEAD_IS)}",
        [version, session_id, seq, leaf, old],
    )
    if moved != 1:
        raise Conflict(f"session {session_id!r} moved while its payloads were re-sealed")
    if old is not None and tx.one(_EXTERNAL_BLOBS, [session_id]) is None:
        tx.exec("DELETE FROM session_keys WHERE session_id = ? AND version = ?", [session_id, old])
    tx.exec("DELETE FROM replay_snapshots WHERE session_id = ?", [session_id])
    return version


_TENANTS = "SELECT count(DISTINCT tenant) FROM ledger_records WHERE session_id = ?"
"""How many tenants hold a ledger of the session (a ledger record is sealed for
its sequence alone: two tenants' records of one session share record ids)."""

_EXTERNAL_BLOBS = (
    "SELECT 1 FROM ledger_records AS r WHERE r.session_id = ? AND r.blob_key IS NOT NULL "
    "AND NOT EXISTS (SELECT 1 FROM ledger_blobs AS b WHERE b.key = r.blob_key) LIMIT 1"
)
"""A ledger blob of the session kept outside the database (an fsspec blob
store: a directory, S3), which the walk cannot reach: its file stays sealed
under the old data key version, so that version's key row is kept (a delete
of the session still removes every version: crypto-shredding holds); a clear
session with one is not sealed (its files would stay clear)."""


def _lock_head(tx: Tx, session_id: str) -> tuple[Any, ...] | None:
    """The session's head, its row locked until the transaction ends
    (PostgreSQL ``FOR UPDATE``: a writer of the session waits for the walk)."""
    return tx.one(HEAD_READ + tx.dialect.update_lock(), [session_id])


def _provider(keys: Keyring, session_id: str) -> KeyProvider:
    if keys.provider is None:
        raise errors.KeyUnavailableError(
            session_id,
            None,
            detail="sealing a session's payloads needs the store opened with encryption=",
        )
    return keys.provider


def _reseal_column(
    tx: Tx, column: SealedColumn, session_id: str, opener: DataKey | None, key: DataKey
) -> None:
    """Re-seal ``column``'s values of ``session_id`` page by page."""
    t, c, s = column.table, column.column, column.session
    # the record id as text, as the associated data names it (a numeric id too:
    # pages are in text order, which the text comparison below follows)
    r = f"CAST({t}.{column.record} AS VARCHAR)"
    page = f"{r} > ? AND {c} IS NOT NULL"
    # DuckDB reaches the session's rows through its index only by the one-filter
    # form (``keyed``), and sorts them for each page; PostgreSQL walks the
    # (session, record) key from the page's start with plain conditions.
    where = keyed(s, page) if tx.dialect.name == "duckdb" else f"{s} = ? AND {page}"
    select = f"SELECT {r}, {c} FROM {t} WHERE {where} ORDER BY {r} LIMIT {PAGE_ROWS}"
    array = "BYTEA[]" if column.binary else "VARCHAR[]"
    update = (
        f"UPDATE {t} SET {c} = v.val FROM (SELECT unnest({tx.dialect.typed('VARCHAR[]')}) AS rid, "
        f"unnest({tx.dialect.typed(array)}) AS val) AS v "
        f"WHERE {t}.{s} = ? AND {r} = v.rid"
    )
    after = ""
    while True:
        rows = tx.rows(select, [session_id, after], binary=column.binary)
        if not rows:
            return
        ids = [str(row[0]) for row in rows]
        values = [
            _resealed(column, session_id, rid, row[1], opener, key)
            for rid, row in zip(ids, rows, strict=True)
        ]
        tx.exec(update, [ids, values, session_id])
        after = ids[-1]
        if len(rows) < PAGE_ROWS:
            return


def _resealed(
    column: SealedColumn,
    session_id: str,
    record_id: str,
    stored: Any,
    opener: DataKey | None,
    key: DataKey,
) -> str | bytes:
    """``stored`` opened under ``opener`` (``None``: it must be clear) and
    sealed under ``key``, in the column's form."""
    field = column.field
    if column.binary:
        raw = bytes(stored)
        if opener is None:
            if is_sealed(raw):
                raise _sealed_in_clear(session_id, record_id, field)
            return key.seal(record_id, field, raw)
        return key.seal(record_id, field, opener.open(record_id, field, raw))
    text = str(stored)
    if opener is None:
        if is_sealed_text(text):
            raise _sealed_in_clear(session_id, record_id, field)
        return key.seal_text(record_id, field, text)
    return key.seal_text(record_id, field, opener.open_text(record_id, field, text))


def _sealed_in_clear(session_id: str, record_id: str, field: str) -> errors.TurnkeeperError:
    return errors.PayloadAuthenticationError(
        session_id,
        record_id,
        field,
        detail="a sealed value in a session whose row names no data key",
    )
