"""Encryption at rest of a ledger's payloads (issue 23): the sealing and
opening of ``ledger_records.payload``, ``ledger_blobs.data`` and the blob
files of a :class:`~.blob_files.FsspecBlobs` store.

A ledger is a session's: its open plants a fence only in a session that
exists (``journal.plant_fence`` checks the ``sessions`` row), so its values
are sealed under the data key of its session (``sessions.key_version``,
``storage/crypto/keyring.py``); a ledger never holds a key of its own, and a
session delete shreds its ledger with it.

- A record's payload is sealed for record id ``str(seq)`` and field
  ``payload`` (every record of a sealed session's ledger, fences and blob
  pointers included). Its digests stay over the CLEAR bytes:
  ``payload_sha256`` and the record digest (``records.record_digest``)
  keep their meaning, every reader opens the payload first and then checks
  them (so ``ledger verify`` checks content), and an idempotent redelivery
  compares digests, never ciphertexts (two seals of one value differ). The
  tenant is not in the associated data: a value moved to another tenant's
  record at the same sequence opens, and then fails that record's digest
  (which binds the tenant and the clear payload's sha256).
- A blob is sealed for record id = its key (``blob_prefix`` + the sha256 of
  its clear envelope) and field ``data``, in the database's table and in
  blob files alike. Its key, its pointer's ``sha256`` and ``size`` are the
  clear envelope's (a replay opens, then hashes and measures). A put of the
  same key again (a redelivery) stores another seal of the same envelope:
  either one opens to it.
- ``ledger_records.blob_key`` holds a pointer record's blob key in clear
  (schema 35): what GC's condemn checks, the redelivery check and the
  report's orphan figures read instead of the sealed pointer payload.

A blob is sealed directly under the session's data key (no per-blob key).
Rotating a session's data key (``sessions.rotate_key``, ``storage/ops/reseal.py``)
reaches ``ledger_records.payload`` and the database's ``ledger_blobs.data``
through ``storage/crypto/columns.py``. Known gaps (issue 23, for the next
part): blob files outside the database (``FsspecBlobs``) are not walked by
the rotation, which therefore keeps the old key version's row while such a
blob exists (``reseal._EXTERNAL_BLOBS``); the fix is an envelope (a
per-blob key wrapped in the sealed pointer, which the rotation re-seals).
And the rotation's walk keys a column by (session, record id): a session
whose ledger exists under several tenants has one sequence number per
tenant, which that walk does not tell apart, so it refuses such a session
(``NotSupportedError``).
Crypto-shredding reaches blob files: a deleted session's key is gone, so
its blob files do not open even before the sweep deletes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from turnkeeper.spec import errors

from ...backend import Backend, Tx

PAYLOAD = "payload"
"""The field name a record's payload is sealed under (``ledger_records.payload``)."""

DATA = "data"
"""The field name a blob is sealed under (``ledger_blobs.data`` and blob files)."""

Sealer = Callable[[int, bytes], bytes]
"""``seal(seq, payload)``: a record's payload as stored."""


def record_id(seq: int) -> str:
    """The record id a ledger record's payload is sealed for: its sequence, decimal."""
    return str(seq)


def _clear(seq: int, payload: bytes) -> bytes:
    return payload


def sealer(tx: Tx, session_id: str) -> Sealer:
    """What seals ``session_id``'s record payloads written in ``tx``: under
    the session's data key (its ``key_version`` read in ``tx``), or as they
    are for a clear session.

    Raises:
        KeyUnavailableError: the session is sealed and this store object has
            no key for it (opened without ``encryption=``, or its key row is
            gone); nothing is written.
    """
    key, _ = tx.keys.sealing(tx, session_id)
    if key is None:
        return _clear
    return lambda seq, payload: key.seal(record_id(seq), PAYLOAD, payload)


def open_row(tx: Tx, session_id: str, row: Sequence[Any]) -> tuple[Any, ...]:
    """``row`` (``replay.RECORD_COLUMNS``: ``seq`` first, ``payload`` fourth)
    with its payload opened (``Keyring.open_bytes``), read in ``tx``.

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: as ``Keyring.open_bytes``
            (record id the sequence, field ``payload``).
    """
    stored = bytes(row[3])
    if not tx.keys.encrypted:  # a clear store: the caller's bytes, whatever they start with
        return tuple(row)
    clear = tx.keys.open_bytes(tx, session_id, record_id(int(row[0])), PAYLOAD, stored)
    return (*row[:3], clear, *row[4:])


def open_rows(tx: Tx, session_id: str, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Each of ``rows`` opened (:func:`open_row`) in ``tx``, a row that does
    not open carrying its error in its payload's place: raised when a reader
    reaches it (``records.check_record``), so a replay still yields every
    record before it, and none from it on."""
    opened: list[tuple[Any, ...]] = []
    for row in rows:
        try:
            opened.append(open_row(tx, session_id, row))
        except (errors.PayloadAuthenticationError, errors.KeyUnavailableError) as failure:
            opened.append((*row[:3], failure, *row[4:]))
    return opened


def seal_blob(db: Backend, session_id: str, key: str, blob: bytes) -> bytes:
    """``blob`` (a clear envelope) as stored under ``key``: sealed under the
    session's data key (read in a read transaction of its own, before the
    put), or as it is for a clear session or a clear store.

    Raises:
        KeyUnavailableError: as :func:`sealer`; nothing is written.
    """
    if not db.keyring.encrypted:
        return blob
    key_now = db.read("ledger_blob_key", lambda tx: tx.keys.sealing(tx, session_id)[0])
    return blob if key_now is None else key_now.seal(key, DATA, blob)


def open_blob(db: Backend, session_id: str, key: str, stored: bytes) -> bytes:
    """The clear envelope of the blob stored under ``key`` (``Keyring.open_bytes``,
    record id ``key``, field ``data``).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: as ``Keyring.open_bytes``.
    """
    if not db.keyring.encrypted:
        return stored
    opened: bytes = db.read(
        "ledger_blob_open", lambda tx: tx.keys.open_bytes(tx, session_id, key, DATA, stored)
    )
    return opened
