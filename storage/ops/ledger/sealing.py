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
through ``storage/crypto/columns.py``. A blob is sealed before its pointer's
append, so the append checks it against the version it seals under
(:func:`current_blobs`). Limits: blob files outside the database
(``FsspecBlobs``) are not walked by the rotation, which therefore keeps the
old key version's row while such a blob exists (``reseal._EXTERNAL_BLOBS``),
and are not sealed by ``sessions.encrypt``, which refuses such a session
(an envelope, a per-blob key wrapped in the sealed pointer, would lift both).
And the rotation's walk keys a column by (session, record id): a session
whose ledger exists under several tenants has one sequence number per
tenant, which that walk does not tell apart, so it refuses such a session
(``NotSupportedError``).
Crypto-shredding reaches blob files: a deleted session's key is gone, so
its blob files do not open even before the sweep deletes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import BLOB_POINTER_KIND, LedgerEntry

from ...backend import Backend, Tx
from ...crypto import seal
from ...crypto.seal import DataKey
from . import blobs, condemn

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


def session_key(tx: Tx, session_id: str) -> tuple[DataKey | None, int | None]:
    """The data key and version a ledger write of ``session_id`` in ``tx``
    seals under (``Keyring.sealing``), its ``key_version`` read in ``tx``
    whatever this store object took the store for: a ledger write does not
    compare-and-set the session row, so a store object opened before the
    store was marked encrypted (which takes every session for clear) must
    still see that this one is sealed. ``(None, None)``: a clear session.

    Raises:
        KeyUnavailableError: the session is sealed and this store object has
            no key for it (opened without ``encryption=``, or its key row is
            gone); nothing is written.
    """
    row = tx.one(_VERSION, [session_id])
    version = None if row is None or row[0] is None else int(row[0])
    return tx.keys.sealing(tx, session_id, version)


_VERSION = "SELECT key_version FROM sessions WHERE id = ?"


def sealer(tx: Tx, session_id: str) -> Sealer:
    """What seals ``session_id``'s record payloads written in ``tx``: under
    the session's data key (:func:`session_key`), or as they are for a clear
    session.

    Raises:
        KeyUnavailableError: as :func:`session_key`; nothing is written.
    """
    key, _ = session_key(tx, session_id)
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
    session's data key (:func:`session_key`, read in a read transaction of
    its own, before the put), or as it is for a clear session. The version
    may move before the pointer's append: that append checks it
    (:func:`current_blobs`).

    Raises:
        KeyUnavailableError: as :func:`session_key`; nothing is written.
    """
    key_now = db.read("ledger_blob_key", lambda tx: session_key(tx, session_id)[0])
    return blob if key_now is None else key_now.seal(key, DATA, blob)


def stored_version(stored: bytes) -> int | None:
    """The data key version a stored blob (or its first 8 bytes) is sealed
    under; ``None``: clear (a clear envelope starts with its own magic line,
    never with ``seal.MAGIC``)."""
    if len(stored) < _HEAD or not seal.is_sealed(stored):
        return None
    return int.from_bytes(stored[len(seal.MAGIC) : _HEAD], "big")


_HEAD = len(seal.MAGIC) + 4
"""Bytes of a stored blob that name its key version (``seal.MAGIC`` and the version)."""


def current_blobs(
    tx: Tx,
    session_id: str,
    new: Sequence[tuple[int, LedgerEntry]],
    logical: Sequence[LedgerEntry],
    written: Mapping[str, int | None],
) -> None:
    """An append's blob check, in its transaction (after its fences): every
    blob a new pointer names is sealed under the data key version the
    append seals its records under (:func:`session_key`), or clear in a
    clear session. A blob is sealed before its pointer's append, in a
    transaction of its own (:func:`seal_blob`); a key rotation or an
    encrypt of the session committed in between leaves it under a version
    whose key row is gone, or clear in a sealed session (attack finding on
    issue 23). A blob in the database's ``ledger_blobs`` is read here (the
    stored one: a put of a key already there writes nothing) and one under
    another version is sealed again in place, from the entry's envelope
    (``logical``: the entries as given); no committed pointer names such a
    blob (this check ran before each one, and a rotation re-seals every
    blob row of the session), so nothing else reads it. A blob kept outside
    the database is judged by the version its writer sealed it under
    (``written``: blob key to version, ``None`` clear).

    Raises:
        condemn.StaleBlob: a blob outside the database sealed under another version
            (nothing is written; the writer puts it again).
        KeyUnavailableError: as :func:`session_key`.
    """
    pointers = {condemn.pointer_key(e.payload): e for _, e in new if e.kind == BLOB_POINTER_KIND}
    if not pointers:
        return
    key, version = session_key(tx, session_id)
    if key is None:  # a clear session: every blob put clear (a session never turns clear)
        return
    head = tx.dialect.bytes_head("data")
    stored = {
        str(r[0]): stored_version(bytes(r[1]))
        for r in tx.rows(
            f"SELECT key, {head} FROM ledger_blobs WHERE key = ANY(?::VARCHAR[])",
            [_HEAD, sorted(pointers)],
        )
    }
    by_id = {e.idempotency_id: e for e in logical}
    for blob_key, pointer in pointers.items():
        if blob_key not in stored:
            if written.get(blob_key, version) != version:
                raise condemn.StaleBlob(session_id, blob_key)
            continue
        if stored[blob_key] == version:
            continue
        entry = by_id[pointer.idempotency_id]
        gen = condemn.generation_of(entry, BLOB_POINTER_KIND, blob_key)
        if gen is None:  # not this entry's blob: its digest fence refuses it at replay
            continue
        sealed = key.seal(blob_key, DATA, blobs.envelope(entry, gen))
        tx.exec(
            "UPDATE ledger_blobs SET data = ?, size = ? WHERE key = ?",
            [sealed, len(sealed), blob_key],
        )


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
