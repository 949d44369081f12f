"""GC's condemned blobs: the fence between ledger GC's deletes and a writer's
blob pointers (attack finding F6 on issue 19; sessionstore ObjectGC's
lease guard, made to hold for the whole pass).

A blob store's delete cannot join a database transaction (an object store
least of all), and it can land long after GC's lease was checked: a slow
store, a paused process, a request still in flight after a timeout. A lease
check before each delete narrows that window but cannot close it. So GC
never deletes a blob it has not first *condemned* in the database, and no
pointer to a condemned blob is ever appended:

1. GC scans its ledger's pointers (noting the tip it scanned to) and lists
   the session's blobs (``gc.py``);
2. the *condemn* transaction, fenced by GC's lease (``gc.writer_fence``:
   ``leases.fence``, then the ledger's newest fence is the lease's epoch,
   read with the tip's row locked), drops from the orphans every key named
   by a pointer appended since the scan, marks the rest in
   ``ledger_blob_condemned`` and rewrites the tip row (:func:`mark`);
3. GC deletes the marked blobs;
4. an append's transaction, after its own fences (the tip's row locked),
   refuses a new pointer whose key is marked (:func:`refuse_condemned`:
   ``BlobCondemnedError``, nothing written); the writer then writes the
   record's blob again as its next *generation* (the same envelope with
   ``gen`` in its head, so another sha256 and key) and appends again
   (:func:`write_offloaded`).

A mark is permanent (a tombstone; a session delete removes its session's).
Clearing it after the delete returned would reopen the hole: a writer whose
put of the key ran before GC's delete and whose append runs after the clear
would point at the deleted body, and how long a writer sits between its put
and its append is unbounded. A condemned key is an orphan's, so a mark costs
one row per blob GC reclaimed.

Why no interleaving of GC and a writer (of any epoch, GC's own included)
ends with an acknowledged pointer whose blob is gone, on
:class:`~.blobs.DatabaseBlobs` and :class:`~.blob_files.FsspecBlobs` alike:

- GC deletes only keys marked by a committed condemn transaction (step 3
  follows step 2's commit).
- The condemn transaction and every append transaction that writes records
  serialize: DuckDB runs writes one at a time; on PostgreSQL (``REPEATABLE
  READ``) both write the session's lease row (``leases.fence``:
  ``fenced_writes + 1``) and both lock and write the ledger's tip row (the
  append's compare-and-set, the condemn's rewrite), so the later one waits,
  fails with a serialization conflict and runs again on a snapshot holding
  the earlier one's commit. So of a condemn of key K and an append of a
  pointer to K, one sees the other:

  - the append committed first: K is not condemned, because the pointer was
    there at the scan (K is live, not an orphan) or was appended since (the
    condemn transaction reads it and leaves K alone); and if that append was
    by a newer epoch, its writer planted its fence before it, so GC's fence
    refuses the whole pass (``GCLeaseNotHeldError``; nothing marked,
    nothing deleted);
  - the condemn committed first: the append sees the mark and is refused,
    as is every later one (the mark is permanent).

  So no pointer ever names a condemned key, and GC never deletes a key a
  pointer names.
- A pointer's writer put its blob before appending the pointer, and blob
  content never changes under a key (content-addressed; a put of an existing
  key writes the same bytes or nothing), so the body an acknowledged pointer
  names is there, with its sha256, until its session is deleted.

A pass that fails or is cancelled mid-delete leaves its marks: the next pass
lists the blobs still there and deletes them.

Idempotency across generations: a redelivery whose pointer differs from the
stored one only by the generation is the same record. The append's
idempotency check compares logical content (:func:`same_record`): a stored
pointer is matched against every generation of the entry's envelope
(:func:`generation_of`), so the redelivery gets the original's sequence
(``duplicate=True``); so is an inline redelivery of an offloaded original
and an offloaded redelivery of an inline one (attack finding F5). A blob
such a redelivery put before its append found the original is referenced
by no pointer: GC reclaims it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Sequence
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import BLOB_POINTER_KIND, AppendResult, LedgerEntry

from ...backend import STORE_NOW, Tx
from . import blobs as blob_ops
from . import records

MAX_GENERATIONS = 16
"""The most generations of one record's blob a writer tries (each one
condemned by a GC pass) before it raises ``BlobCondemnedError``."""

MAX_RESEALS = 8
"""The most times a writer puts one blob again because the session's data key
moved between its put and its append (:class:`StaleBlob`)."""

TABLE = "ledger_blob_condemned"


class StaleBlob(Exception):
    """A new pointer's blob, kept outside the database, was sealed under
    another data key version than the one its append seals under (a
    ``sessions.rotate_key`` or ``sessions.encrypt`` committed between the
    put and the append): the writer puts it again and appends again
    (:func:`write_offloaded`; ``sealing.current_blobs`` raises it)."""

    def __init__(self, session_id: str, key: str) -> None:
        super().__init__(f"blob {key!r} of session {session_id!r} was sealed under a stale key")
        self.session_id = session_id
        self.key = key


def pointer_key(payload: bytes) -> str:
    """The blob key a pointer payload made by ``blobs.offload`` names."""
    key: Any = json.loads(payload.decode())["key"]
    return str(key)


def condemned(tx: Tx, keys: Sequence[str]) -> set[str]:
    """Which of ``keys`` a GC pass has marked (read in the caller's transaction)."""
    if not keys:
        return set()
    rows = tx.rows(
        f"SELECT DISTINCT key FROM {TABLE} WHERE key = ANY(?::VARCHAR[])", [sorted(set(keys))]
    )
    return {str(r[0]) for r in rows}


def new_pointer_keys(new: Sequence[tuple[int, LedgerEntry]]) -> list[str]:
    """The blob keys of the pointer records among ``new`` (``(seq, entry)``)."""
    return [pointer_key(e.payload) for _, e in new if e.kind == BLOB_POINTER_KIND]


def refuse_condemned(
    session_id: str, new: Sequence[tuple[int, LedgerEntry]], marked: set[str]
) -> None:
    """The writer's half of the fence: no new pointer names a marked key.

    Raises:
        BlobCondemnedError: the first new pointer naming one (nothing is written).
    """
    for key in new_pointer_keys(new):
        if key in marked:
            raise errors.BlobCondemnedError(session_id, key)


def check_append(tx: Tx, session_id: str, new: Sequence[tuple[int, LedgerEntry]]) -> None:
    """:func:`refuse_condemned` of one append's new records, in its transaction
    (after its fences, the tip's row locked)."""
    refuse_condemned(session_id, new, condemned(tx, new_pointer_keys(new)))


def mark(tx: Tx, tenant: str, session_id: str, epoch: int, gc_id: str, keys: Sequence[str]) -> None:
    """GC's half, in its fenced condemn transaction: mark ``keys`` condemned
    (pass ``gc_id`` under ``epoch``; a key already marked keeps its mark) and
    rewrite the ledger's tip row (unchanged), so that on PostgreSQL an append
    that locks or moves the tip concurrently conflicts with this transaction,
    whatever lease row it wrote (see the module docstring)."""
    tx.exec(
        "UPDATE ledger_tips SET seq = seq WHERE tenant = ? AND session_id = ?",
        [tenant, session_id],
    )
    if keys:
        tx.exec(
            f"INSERT INTO {TABLE} (key, gc_id, tenant, session_id, epoch, condemned_at) "
            f"SELECT unnest(?::VARCHAR[]), ?, ?, ?, ?, {STORE_NOW} "
            "ON CONFLICT (key) DO NOTHING",
            [list(keys), gc_id, tenant, session_id, epoch, tx.now],
        )


def generation_of(entry: LedgerEntry, kind: str, key: str) -> int | None:
    """The generation at which the stored record of kind ``kind`` whose blob
    key (``ledger_records.blob_key``, clear also in a sealed ledger) is
    ``key`` is the pointer of ``entry``'s blob (``entry`` as given, its
    payload not offloaded); ``None`` when it is not one. A key ends with the
    sha256 of its clear envelope: each generation's envelope is hashed, the
    first that matches is the one (at most :data:`MAX_GENERATIONS`)."""
    if kind != BLOB_POINTER_KIND:
        return None
    want = key[-64:]
    for gen in range(MAX_GENERATIONS):
        digest = hashlib.sha256(blob_ops.envelope_head(entry, gen))
        digest.update(entry.payload)
        if hmac.compare_digest(digest.hexdigest(), want):
            return gen
    return None


def same_record(
    found: tuple[int, str, str, str | None],
    stored: LedgerEntry,
    digest: str,
    logical: LedgerEntry,
) -> bool:
    """Whether the record ``found`` under an idempotency id (``(seq, kind,
    payload sha256, blob key when it is a blob pointer)``, digests over the
    clear payload) is the entry about to be stored: ``stored`` as it would be
    written (a pointer when offloaded; ``digest`` its clear payload's
    sha256), ``logical`` as given. Digests are compared, never stored
    payloads (two seals of one value differ). The same logical content
    (kind and payload bytes) is the same record whichever side of the
    offload threshold each was written on (attack finding F5 on issue 19)
    and whatever generation its blob took: an inline record and the pointer
    of a blob of the same kind and payload, or two pointers to generations
    of one envelope (:func:`generation_of`)."""
    _, kind, sha, key = found
    if (kind, sha) == (stored.kind, digest):
        return True
    if kind == BLOB_POINTER_KIND:
        return key is not None and generation_of(logical, kind, key) is not None
    return (kind, sha) == (logical.kind, records.sha256(logical.payload))


def write_offloaded(
    entries: Sequence[LedgerEntry],
    threshold: int,
    offload: Callable[[LedgerEntry, int], LedgerEntry],
    append: Callable[[list[LedgerEntry]], list[AppendResult]],
) -> list[AppendResult]:
    """Append ``entries`` through ``append`` (one fenced transaction), each
    payload longer than ``threshold`` bytes first offloaded by
    ``offload(entry, generation)``; on ``BlobCondemnedError`` the condemned
    blob's entry moves to its next generation and the append runs again. A
    redelivery is recognised in the append itself (:func:`same_record`),
    whichever generation or side of the threshold the original took.

    On :class:`StaleBlob` (a blob kept outside the database sealed under a
    key version a rotation or an encrypt of the session replaced before the
    append) that entry's blob is put again, sealed under the version then
    current, and the append runs again.

    Raises:
        BlobCondemnedError: an entry's :data:`MAX_GENERATIONS` generations are
            all condemned.
        TransactionConflictError: the session's key moved under
            :data:`MAX_RESEALS` puts in a row.
        LedgerIdempotencyConflictError: the stored record is other content.
        whatever ``offload`` and ``append`` raise.
    """
    gens = [0] * len(entries)
    made: dict[tuple[int, int], LedgerEntry] = {}

    def stored(i: int) -> LedgerEntry:
        entry = entries[i]
        if len(entry.payload) <= threshold:
            return entry
        if (i, gens[i]) not in made:
            made[(i, gens[i])] = offload(entry, gens[i])
        return made[(i, gens[i])]

    stale = 0
    while True:
        batch = [stored(i) for i in range(len(entries))]
        try:
            return append(batch)
        except StaleBlob as refused:
            stale += 1
            hit = [i for i, e in enumerate(batch) if e.kind == BLOB_POINTER_KIND
                   and pointer_key(e.payload) == refused.key]  # fmt: skip
            if not hit or stale >= MAX_RESEALS:
                raise errors.TransactionConflictError(
                    "ledger_append",
                    stale,
                    detail=f"the data key of session {refused.session_id!r} moved "
                    f"{stale} times while blob {refused.key!r} was put",
                ) from refused
            for i in hit:
                made.pop((i, gens[i]), None)  # put again, sealed under the current version
        except errors.BlobCondemnedError as refused:
            hit = [i for i, e in enumerate(batch) if e.kind == BLOB_POINTER_KIND
                   and pointer_key(e.payload) == refused.key]  # fmt: skip
            if not hit or gens[hit[0]] + 1 >= MAX_GENERATIONS:
                raise
            gens[hit[0]] += 1
