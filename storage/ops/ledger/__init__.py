"""``store.ledger``: a session's durable journal (the sessionstore seed's
OpenJournal, SessionJournal, OpenInternalRecordReplayer, RuntimeCommandLog,
ReadCommandApplicationAt, WithTenant).

A session's ledger is an append-only journal with a 1-based, gapless
sequence, written by one writer at a time under the session's lease:

- :meth:`Ledger.open` returns a :class:`~.writer.LedgerWriter`, after
  planting its fence record (the lease epoch) with a compare-and-set on the
  tip it read (``journal.plant_fence``);
- its appends are fenced by that epoch and idempotent by their
  idempotency ids (``journal.append``); concurrent writers' appends are
  group-committed, each member judged on its own (``group``), and the
  catalog entries of their sessions updated in the same transaction
  (``catalog_group``);
- :meth:`Ledger.replay` streams the records, verified, in bounded pages
  (``replay``);
- :meth:`Ledger.command_log` and :meth:`Ledger.read_command_application_at`
  are the command log over it (``writer.RuntimeCommandLog``);
- :meth:`Ledger.workspace_checkpoint_by_seq`, :meth:`Ledger.workspace_checkpoint_by_turn`
  and :meth:`Ledger.workspace_live_refs` read its workspace checkpoints
  (``workspace``);
- :meth:`Ledger.sweep_deleted` reclaims the blobs of deleted sessions (``sweep``).

Records carry the tenant the area serves (:meth:`Ledger.with_tenant`,
``""`` by default); a reader for another tenant sees none of them. The
writer's lifecycle is :data:`turnkeeper.spec.ledger.LEDGER_WRITER`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import (
    BLOB_POINTER_KIND,
    FENCE_KIND,
    AppendResult,
    CheckpointSummary,
    CommandApplication,
    GCResult,
    LedgerEntry,
    LedgerRecord,
)
from turnkeeper.spec.records import Lease

from ... import bridge
from ...backend import Merge, Tx
from ...codec import check_id, check_tenant, check_text
from ...validate import check_int, check_seconds, check_session_lease
from .. import leases
from ..base import Area, Shared
from . import blobs as blob_ops
from . import catalog_group, condemn, journal, records, sealing
from . import gc as gc_ops
from . import group as group_ops
from . import sweep as sweep_ops
from . import workspace as workspace_ops
from .blob_files import FsspecBlobs
from .blobs import (
    DEFAULT_OFFLOAD_THRESHOLD,
    DEFAULT_TEMP_GRACE_S,
    MAX_BODY_BYTES,
    BlobStore,
    DatabaseBlobs,
)
from .catalog import Catalog, CatalogOptions
from .catalog_group import CatalogUpdate
from .group import LedgerAppend
from .replay import PAGE_ROWS, RECORD_COLUMNS, ledger_name, replay
from .writer import LedgerWriter, RuntimeCommandLog, check_entries, decode_application

__all__ = [
    "DEFAULT_OFFLOAD_THRESHOLD",
    "DEFAULT_TEMP_GRACE_S",
    "MAX_BODY_BYTES",
    "PAGE_ROWS",
    "BlobStore",
    "Catalog",
    "DatabaseBlobs",
    "Ledger",
    "LedgerWriter",
    "RuntimeCommandLog",
    "ledger_name",
]


def _append_alone(request: LedgerAppend, tx: Tx) -> list[AppendResult]:
    """``journal.append`` of ``request`` in ``tx``, and its catalog update."""
    results = journal.append(
        tx,
        request.tenant,
        request.session_id,
        request.lease,
        request.entries,
        request.logical,
        request.blob_versions,
    )
    group_ops.catalog_in_tx(tx, [(request, results)])
    return results


class Ledger(Area):
    """The ledger area of a store, for one tenant (see the module docstring)."""

    def __init__(
        self,
        shared: Shared,
        tenant: str = "",
        blobs: BlobStore | None = None,
        offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD,
        max_body_bytes: int = MAX_BODY_BYTES,
        options: CatalogOptions | None = None,
    ) -> None:
        super().__init__(shared)
        self._shared = shared
        self.tenant = tenant
        self.blobs: BlobStore = DatabaseBlobs(shared.db) if blobs is None else blobs
        self.offload_threshold = offload_threshold
        self.max_body_bytes = max_body_bytes
        self._catalog_options = options or CatalogOptions()
        self.catalog = Catalog(
            shared.db, tenant, lambda sid, start: self.replay(sid, start), self._catalog_options
        )
        """This tenant's catalog of sessions (``catalog``), updated after each
        append and each writer's open."""

    def with_tenant(self, tenant: str) -> Ledger:
        """This store's ledger for ``tenant`` (sessionstore WithTenant): its
        writers stamp their records with it and its reads see only its records.
        The blob and catalog settings are kept.

        Raises:
            InvalidInputError: ``tenant`` is neither ``""`` nor an id (no
                control or invisible characters, at most 512 bytes).
        """
        return Ledger(
            self._shared,
            check_tenant(tenant),
            self.blobs,
            self.offload_threshold,
            self.max_body_bytes,
            self._catalog_options,
        )

    def with_blobs(
        self,
        blobs: BlobStore | None = None,
        *,
        offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> Ledger:
        """This ledger with its blob offload configured (sessionstore
        WithOffloadThreshold): payloads longer than ``offload_threshold``
        bytes are stored as sha256-named blobs in ``blobs`` (default: the
        store's own table, :class:`DatabaseBlobs`; or a
        :class:`~.blob_files.FsspecBlobs` directory or object store) with a pointer
        record in the ledger; a blob over ``max_body_bytes`` (the replay
        ceiling, bytes) is refused. Writers, replays and GC made from the
        returned ledger use these settings.

        Raises:
            InvalidInputError: a threshold < 0 or a ceiling < 1.
            InvalidBackendError: ``blobs`` lacks a callable ``put``, ``get``,
                ``delete`` or ``list`` (``missing`` names the first).
        """
        if blobs is not None:
            blob_ops.check_blob_store(blobs)
        return Ledger(
            self._shared,
            self.tenant,
            blobs,
            check_int(offload_threshold, "offload_threshold", 0),
            check_int(max_body_bytes, "max_body_bytes", 1),
            self._catalog_options,
        )

    def open(
        self,
        session_id: str,
        lease: Lease | None,
        *,
        opening: Sequence[LedgerEntry] = (),
    ) -> LedgerWriter:
        """Open the single writer of ``session_id``'s ledger under ``lease``, a
        lease on ``session:<session_id>`` (sessionstore OpenJournal; with
        ``opening``, OpenJournalWithOpeningAppend).

        Reads the ledger's tip, then in one transaction fences ``lease``,
        compares the tip with the one read and writes a fence record carrying
        the lease's epoch at the tip + 1. A tip that moved in between means
        another writer owns the ledger now: the open fails, releases the
        grant, and is never retried under it (a grant is never rebased onto a
        newer tip); take a fresh lease, whose epoch is strictly higher.

        ``opening`` (at most 1000 entries, each payload at most the offload
        threshold in bytes, each checked as an append's: :meth:`check_entries`)
        is appended right after the fence record in that same transaction,
        as an append would (idempotency ids included): the writer exists
        with its first records, or not at all (a
        ``session_started`` record that must never be missing from a ledger
        its writer opened). The writer's ``opening`` holds their results.

        Raises:
            NilLeaseError: ``lease`` is ``None``.
            OpeningFenceConflictError: the tip moved; the lease is released.
            LeaseLostError: the lease is not held (expired, released, taken over).
            LeasePurposeError: the lease row is held under another purpose.
            LedgerIdempotencyConflictError: an opening entry's id names other content.
            InvalidInputError: a malformed id, a lease on another target, or
                an opening entry that is malformed or over the offload threshold.
            DurableBodyTooLargeError: an opening entry over ``max_body_bytes``.
        On any error nothing is written.
        """
        check_id(session_id, "session_id")
        if lease is None:
            raise errors.NilLeaseError(session_id)
        check_session_lease(session_id, lease)
        first = self.check_entries(opening, opening=True)
        expected = self.db.read(
            "ledger_tip", lambda tx: journal.read_tip(tx, self.tenant, session_id)
        )[0]

        def planted(tx: Tx) -> tuple[int, list[AppendResult], bool]:
            seq = journal.plant_fence(tx, self.tenant, session_id, lease, expected)
            results = journal.append(tx, self.tenant, session_id, lease, first) if first else []
            records = [(seq, FENCE_KIND, b"")] + [
                (r.seq, e.kind, e.payload)
                for e, r in zip(first, results, strict=True)
                if not r.duplicate
            ]
            update = CatalogUpdate(self.catalog, session_id, records)
            return seq, results, catalog_group.fold_in(tx, [update])[0]

        try:
            seq, results, catalogued = self._fenced("ledger_open", lease, planted)
        except errors.OpeningFenceConflictError:
            journal.MACHINE.require("open", "opening", {"lease_held": True, "tip_unmoved": False})
            self.db.write(
                "release_lease",
                lambda tx: leases.release(tx, lease),
                transaction=False,
                exclusive=False,
            )
            raise
        if not catalogued:
            self.catalog.after_append(
                session_id,
                [(seq, FENCE_KIND, b"")]
                + [
                    (r.seq, e.kind, e.payload)
                    for e, r in zip(first, results, strict=True)
                    if not r.duplicate
                ],
            )
        writer = LedgerWriter(self, session_id, lease, seq)
        writer.opening = results
        return writer

    def persistence_paths(self) -> list[str]:
        """The paths of this machine that hold this ledger's data (sessionstore
        PersistencePaths), absolute: a DuckDB store's database file and its
        write-ahead log (``<file>.wal``, listed whether or not it exists at
        this moment), and the root directory of blobs kept in a local
        directory (``FsspecBlobs``). A PostgreSQL server's data and an object
        store's blobs are not paths here: not listed; an in-memory store has
        none. A backup copies them together, with the store closed."""
        paths: list[str] = []
        where = getattr(self.db, "path", None)
        if not self.db.dialect.serialized_writes or where in (None, ":memory:"):
            where = None
        if where is not None:
            paths += [str(where), f"{where}.wal"]
        if isinstance(self.blobs, FsspecBlobs) and self.blobs.local:
            paths.append(self.blobs.root)
        return paths

    def check_entries(
        self, entries: Sequence[LedgerEntry], *, opening: bool = False
    ) -> list[LedgerEntry]:
        """``entries`` checked as this ledger's writes check them, before
        anything is written (the one entry check every write path runs:
        ``LedgerWriter.append``/``append_many`` and the group commit they
        queue into, :meth:`open`'s ``opening``, the command log, ``turnkeeper
        ledger append``); a caller may run it before it takes a lease. Each
        entry: a kind that is not reserved, ``bytes``, an idempotency id not
        starting ``fence:``, a catalog kind's payload the catalog can fold
        (decoded, ids present, usage counts in 0 … 2**63-1, at most
        ``MAX_PAYLOAD_DEPTH`` deep), a body (an offloaded entry's blob) at
        most ``max_body_bytes`` bytes; an append takes 1 to 1000 entries, an
        ``opening`` 0 to 1000, each at most the offload threshold (bytes).
        Returns them as a list.

        Raises:
            InvalidInputError: a malformed entry or list (``field`` names it:
                ``entries[i].kind``, ``opening[i].payload`` …).
            DurableBodyTooLargeError: a body over ``max_body_bytes``.
        """
        return check_entries(
            entries,
            "opening" if opening else "entries",
            offload_threshold=self.offload_threshold,
            max_body_bytes=self.max_body_bytes,
            opening=opening,
        )

    def _write_entries(
        self, writer: LedgerWriter, entries: Sequence[LedgerEntry]
    ) -> list[AppendResult]:
        """The fenced append transaction of ``writer`` (``LedgerWriter.append_many``),
        after offloading each payload over the threshold (its blob first, then
        its pointer in the transaction: a failed append leaves an orphan blob,
        which GC reclaims; a blob GC condemned is written again under its next
        generation, one sealed under a key version a rotation or an encrypt
        replaced meanwhile is put again, ``condemn.write_offloaded``,
        ``sealing.current_blobs``), then the catalog's
        best-effort update with the records it wrote (their logical kinds and
        payloads, not the pointers)."""
        sid = writer.session_id
        made: list[LedgerAppend] = []
        versions: dict[str, int | None] = {}  # each blob put: the key version it is sealed under

        def seal(key: str, blob: bytes) -> bytes:
            stored = sealing.seal_blob(self.db, sid, key, blob)
            versions[key] = sealing.stored_version(stored)
            return stored

        def append(stored: list[LedgerEntry]) -> list[AppendResult]:
            request = LedgerAppend(
                self.tenant, sid, writer.lease, stored, self.catalog, entries, [False], versions
            )
            made[:] = [request]
            return self._append(request)

        results = condemn.write_offloaded(
            entries,
            self.offload_threshold,
            lambda e, gen: blob_ops.offload(
                self.blobs, self.tenant, sid, e, self.max_body_bytes, gen, seal
            ),
            append,
        )
        if not (made and made[0].catalogued[0]):
            written = [
                (r.seq, e.kind, e.payload)
                for e, r in zip(entries, results, strict=True)
                if not r.duplicate
            ]
            self.catalog.after_append(sid, written)
        return results

    def _append(self, request: LedgerAppend) -> list[AppendResult]:
        """``request``'s fenced append, group-committed with the appends queued
        beside it (``group``): on DuckDB through the backend's group commit (a
        :class:`~turnkeeper.storage.backend.Merge`), on a server through this
        store object's :class:`~.group.Batcher`. A refused lease is recorded in
        ``fence_events`` by its own caller."""
        if self.db.dialect.serialized_writes:
            return self._fenced(
                "ledger_append",
                request.lease,
                partial(_append_alone, request),
                Merge(group_ops.append_group, request),
            )
        if bridge.in_bridge():
            # a native async store's greenlets share the event loop's thread: a
            # follower waiting on the Batcher's Condition for its leader would stop
            # the loop the leader's I/O needs, so each append commits itself there
            try:
                return self._append_alone(request)
            except errors.LeaseLostError:
                self._record_fenced(request.lease, "ledger_append")
                raise
        try:
            results: list[AppendResult] = group_ops.batcher(self.db, "append").submit(
                request, partial(group_ops.run_group, self.db), self._append_alone
            )
            return results
        except errors.LeaseLostError:
            self._record_fenced(request.lease, "ledger_append")
            raise

    def _append_alone(self, request: LedgerAppend) -> list[AppendResult]:
        """The single path: ``request`` in a transaction of its own (the fence
        event of a refusal is recorded by :meth:`_append`)."""
        return self.db.write("ledger_append", partial(_append_alone, request))

    def _resolve(
        self, session_id: str, seq: int, outer_id: str, payload: bytes
    ) -> tuple[str, bytes]:
        """A pointer record's verified ``(kind, payload)`` (``blobs.resolve``)."""
        return blob_ops.resolve(
            self.blobs,
            self.tenant,
            session_id,
            seq,
            outer_id,
            payload,
            self.max_body_bytes,
            partial(sealing.open_blob, self.db, session_id),
        )

    def gc(
        self,
        session_id: str,
        lease: Lease | None,
        *,
        temp_grace_s: float = DEFAULT_TEMP_GRACE_S,
    ) -> GCResult:
        """Reclaim ``session_id``'s blobs that no pointer record of its ledger
        references (sessionstore OpenObjectGC + ObjectGC.GC), as its single
        writer: ``lease`` must be held and be the epoch of the ledger's newest
        fence (checked before the scan and again in the transaction that
        condemns the orphans before their deletes: ``condemn.py``). A pass
        whose lease lapses while it deletes, a writer of a newer epoch, or an
        append of the same writer never loses an acknowledged record's blob:
        an append refuses a pointer to a condemned blob and writes the blob
        again under another name. Then the temporary files of puts that can
        no longer finish (a put killed mid-write: ``<key>.tmp-<32 hex>``) older
        than ``temp_grace_s`` seconds (default one hour; a put in progress
        keeps its file) are deleted. Returns a
        :class:`~turnkeeper.spec.ledger.GCResult`: ``scanned == referenced +
        deleted``, ``temps_deleted`` the temporary files; keys of another
        shape under the prefix are ``unreclaimable`` and left alone.

        Raises:
            NilLeaseError: ``lease`` is ``None``.
            GCLeaseNotHeldError: the lease is not the writer's (the
                ``LeaseLostError`` is ``__cause__``); nothing is deleted.
            GCScanError: the ledger's pointers could not all be read and
                decoded; nothing is deleted.
            GCListError: the blob prefix could not be listed (nothing is
                deleted), or the temporary files' ages could not be read (the
                orphans are deleted, no temporary file).
            GCDeleteError: an orphan's or a temporary file's delete failed
                (those before it in key order are deleted; the next pass
                deletes the rest).
            DatabaseError: the condemned marks could not be written (nothing
                deleted).
            InvalidInputError: a malformed id, a lease on another target, or
                ``temp_grace_s`` not finite seconds in [0, ten years].
        """
        check_id(session_id, "session_id")
        grace = check_seconds(temp_grace_s, "temp_grace_s")
        if lease is None:
            raise errors.NilLeaseError(session_id)
        check_session_lease(session_id, lease)
        return gc_ops.collect(
            self.db,
            self.blobs,
            self.tenant,
            session_id,
            lease,
            lambda body: self._fenced("ledger_gc", lease, body),
            grace,
        )

    def tip(self, session_id: str) -> int:
        """The sequence of the last record of ``session_id``'s ledger (0: none).

        Raises:
            InvalidInputError: a malformed id.
        """
        check_id(session_id, "session_id")
        return int(
            self.db.read("ledger_tip", lambda tx: journal.read_tip(tx, self.tenant, session_id))[0]
        )

    def replay(
        self, session_id: str, from_seq: int = 1, *, page_rows: int = PAGE_ROWS
    ) -> Iterator[LedgerRecord]:
        """Stream ``session_id``'s ledger from ``from_seq`` (inclusive; 0 and 1
        both start at the first record) up to the tip read when it starts
        (sessionstore OpenInternalRecordReplayer with ReplayRequest.FromSeq).

        Reads pages of ``page_rows`` records and holds one at a time: memory
        is bounded by ``page_rows`` records (``page_rows`` × the largest
        payload's bytes, plus about 512 bytes a record), plus about 256 KiB
        whatever the ledger's length (measured by ``make bench``). Each record is
        verified before it is yielded: its payload against its sha256, the
        record against its record digest (tenant, session, sequence, kind,
        idempotency id, epoch and payload: ``records.record_digest``), its
        sequence against the one expected, its epoch against its fence's, a
        blob pointer's fields and its blob.

        Raises (from the iteration; the arguments are checked at the call):
            ReplayReadError: a page read failed (``__cause__``), or a record
                is missing before the tip.
            ReplayDecodeError: a record fails its verification.
            EmptySessionError: the ledger holds no record.
            SessionNotFoundError: nor does the session exist.
            InvalidInputError: a malformed id, ``from_seq`` < 0 or
                ``page_rows`` < 1.
        """
        check_id(session_id, "session_id")
        start = max(1, check_int(from_seq, "from_seq", 0))
        rows = check_int(page_rows, "page_rows", 1)
        return replay(
            self.db,
            self.tenant,
            session_id,
            start,
            rows,
            partial(self._inside, session_id, None),
            partial(self._resolve, session_id),
        )

    def command_log(self, session_id: str, writer: LedgerWriter) -> RuntimeCommandLog:
        """The command log of ``session_id`` over ``writer`` (sessionstore
        OpenRuntimeCommandLog).

        Raises:
            InvalidInputError: ``writer`` is not an open writer of this
                session's ledger for this tenant (one of another tenant would
                append to its ledger and read back this one's).
        """
        check_id(session_id, "session_id")
        if not isinstance(writer, LedgerWriter) or writer.session_id != session_id:
            raise errors.InvalidInputError("writer", f"expected a ledger writer of {session_id!r}")
        if writer.tenant != self.tenant:
            raise errors.InvalidInputError(
                "writer",
                f"a writer of tenant {writer.tenant!r}, but this ledger serves {self.tenant!r}",
            )
        return RuntimeCommandLog(
            writer, lambda seq: self.read_command_application_at(session_id, seq)
        )

    def read_command_application_at(self, session_id: str, seq: int) -> CommandApplication:
        """The command application at ``seq`` of ``session_id``'s ledger
        (sessionstore ReadCommandApplicationAt). Fails closed: never "not applied".

        Raises:
            CommandApplicationNotFoundError: no record at ``seq``, another kind
                of record, or one whose payload does not hash to its sha256,
                that does not match its record digest (another seq's, session's
                or tenant's, relabelled …) or does not decode (the
                ``ReplayDecodeError`` or decoding error is ``__cause__``), or
                a sealed payload that fails to open (the
                ``PayloadAuthenticationError`` is ``__cause__``).
            KeyUnavailableError: a sealed session and no key to open it.
            InvalidInputError: a malformed id or ``seq`` < 1.
            DatabaseError: the read failed.
        """
        check_id(session_id, "session_id")
        at = check_int(seq, "seq", 1)

        def read(tx: Tx) -> tuple[Any, ...] | None:
            row = tx.one(
                f"SELECT {RECORD_COLUMNS} FROM ledger_records "
                "WHERE tenant = ? AND session_id = ? AND seq = ?",
                [self.tenant, session_id, at],
            )
            if row is None:
                return None
            try:
                return sealing.open_row(tx, session_id, row)
            except errors.PayloadAuthenticationError as cause:
                raise errors.CommandApplicationNotFoundError(
                    session_id, at, detail="its sealed payload does not open"
                ) from cause

        row = self.db.read("ledger_command_at", read)
        if row is None:
            raise errors.CommandApplicationNotFoundError(
                session_id, at, detail="the ledger holds no record at this sequence"
            )
        try:
            records.check_record(self.tenant, session_id, row)
        except errors.ReplayDecodeError as cause:
            raise errors.CommandApplicationNotFoundError(
                session_id, at, detail="the record does not verify"
            ) from cause
        kind, payload = str(row[1]), bytes(row[3])
        if kind == BLOB_POINTER_KIND:
            try:
                kind, payload = self._resolve(session_id, at, str(row[2]), payload)
            except errors.TurnkeeperError as failure:
                raise errors.CommandApplicationNotFoundError(
                    session_id, at, detail="its offloaded body does not resolve"
                ) from failure
        return decode_application(session_id, at, kind, payload)

    def workspace_checkpoint_by_seq(self, session_id: str, seq: int) -> CheckpointSummary | None:
        """The newest workspace checkpoint of ``session_id``'s ledger at or
        before ``seq`` (sessionstore WorkspaceCheckpointBySeq): a record of kind
        ``workspace_checkpoint`` (see
        :data:`~turnkeeper.spec.ledger.WORKSPACE_CHECKPOINT_KIND`); ``None``
        when there is none or the ledger holds no record. Reads the verified
        replay from the first record to ``seq`` (memory: one replay page).

        Raises:
            WorkspaceJournalScanError: a record up to ``seq`` could not be read,
                verified or decoded (the replay's error is ``__cause__``).
            SessionNotFoundError: no such session.
            InvalidInputError: a malformed id or ``seq`` < 1.
        """
        check_id(session_id, "session_id")
        at = check_int(seq, "seq", 1)
        return workspace_ops.checkpoint_by_seq(self.replay, session_id, at)

    def workspace_checkpoint_by_turn(
        self, session_id: str, turn_id: str
    ) -> CheckpointSummary | None:
        """The newest workspace checkpoint of ``session_id``'s ledger taken in
        turn ``turn_id`` (its payload's ``turn_id``; sessionstore
        WorkspaceCheckpointByTurn); ``None`` when there is none. Reads the
        whole verified replay (memory: one replay page).

        Raises:
            WorkspaceJournalScanError: a record could not be read, verified or
                decoded (the replay's error is ``__cause__``).
            SessionNotFoundError: no such session.
            InvalidInputError: a malformed id.
        """
        check_id(session_id, "session_id")
        check_text(turn_id, "turn_id")
        return workspace_ops.checkpoint_by_turn(self.replay, session_id, turn_id)

    def workspace_live_refs(self, session_ids: Sequence[str] | None = None) -> frozenset[str]:
        """The workspace refs still referenced by the retained sessions
        (sessionstore WorkspaceLiveRefs): every ``ref`` of a
        ``workspace_checkpoint`` or ``workspace_restore`` record in the ledgers
        of ``session_ids`` (default: every session with a ledger for this
        tenant). A workspace GC may drop a snapshot not in the set that was
        created before the call (with a grace period): the set is as of each
        ledger's tip when the scan read it, so a checkpoint appended during the
        scan, or in a session first written after it began, is not in it. A
        session without ledger records (never written, or deleted)
        contributes nothing; memory: one replay page plus the refs.

        Raises:
            WorkspaceJournalScanError: a retained session's ledger could not be
                scanned whole (the first one found; ``__cause__`` the replay's
                error): no partial set is returned.
            InvalidInputError: a malformed id.
            DatabaseError: listing the sessions failed.
        """
        if session_ids is None:
            ids = self.db.read(
                "ledger_sessions",
                lambda tx: [
                    str(r[0])
                    for r in tx.rows(
                        "SELECT session_id FROM ledger_tips WHERE tenant = ? UNION "
                        "SELECT DISTINCT session_id FROM ledger_records WHERE tenant = ? "
                        "ORDER BY 1",
                        [self.tenant, self.tenant],
                    )
                ],
            )
        else:
            ids = self._ids(session_ids)
        return workspace_ops.live_refs(self.replay, ids)

    def sweep_deleted(
        self,
        session_ids: Sequence[str] | None = None,
        *,
        temp_grace_s: float = DEFAULT_TEMP_GRACE_S,
    ) -> GCResult:
        """Delete the blobs of deleted sessions from this ledger's blob store:
        an object store cannot join a session delete's transaction, so its
        blobs outlive the delete (the store's own table is cleared by the
        delete itself). A session counts as deleted when the database holds
        its ``deleted_sessions`` tombstone (a deleted id is never reused) and
        no ledger record of it for this tenant; a live session's blobs are
        never swept, and no lease is needed. ``session_ids`` limits the sweep
        to those sessions' prefixes (default: list every session prefix of
        this tenant; memory: the keys listed). Returns a
        :class:`~turnkeeper.spec.ledger.GCResult`: ``scanned == deleted``
        (``referenced`` 0), ``temps_deleted`` the temporary files of puts
        there older than ``temp_grace_s`` seconds (default one hour),
        ``unreclaimable`` the keys of another shape left there. Safe to run
        at any time and again; see ``sweep.py``.

        Raises:
            GCListError: a listing failed (nothing is deleted), or the
                temporary files' ages could not be read.
            GCDeleteError: a delete failed (the blobs before it in key order
                are deleted).
            InvalidInputError: a malformed id, or ``temp_grace_s`` not finite
                seconds in [0, ten years].
            DatabaseError: the tombstones could not be read; nothing is deleted.
        """
        ids = None if session_ids is None else self._ids(session_ids)
        grace = check_seconds(temp_grace_s, "temp_grace_s")
        return sweep_ops.sweep(self.db, self.blobs, self.tenant, ids, grace)

    @staticmethod
    def _ids(session_ids: Sequence[str]) -> list[str]:
        if isinstance(session_ids, str | bytes):
            raise errors.InvalidInputError("session_ids", "expected a sequence of session ids")
        return [check_id(s, "session_id") for s in session_ids]
