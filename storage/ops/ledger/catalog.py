"""``store.ledger.catalog``: one summary per session derived from its ledger
(sessionstore Catalog: ListSessions, ReadMeta, RepairCatalog, UpdateOnEvent).

- After every append (and every writer's open), the ledger area folds the
  new records into the session's entry (:meth:`Catalog.after_append`),
  best-effort: a failure is handed to the catalog's logger and never fails
  the append. The write is a compare-and-set on the entry's ``revision``
  (:func:`store_meta`), retried up to :data:`MAX_CAS_RETRIES` times on a
  concurrent writer's revision.
- :meth:`Catalog.list_sessions` and :meth:`Catalog.read_meta` read the
  catalog table only, never a ledger.
- :meth:`Catalog.repair` rebuilds an entry from the whole ledger.

An online update that finds records before its own missing from the entry
(an update lost to a crash between an append's commit and its update, or to
a failed write) catches up from the entry's cursor (:meth:`Catalog.catch_up`:
the records it missed, not the whole ledger). A failure that would recur on
every later append (a record that does not fold, a title that does not
encode, a ledger that cannot be rebuilt) is reported once and stops the
online updates of that session in this store object until a repair
succeeds (``CatalogOptions.stuck``): before, every later append of the
session replayed its whole ledger and failed again (0.5–1.1 s an append at
30–60k records).

The record kinds folded and their payloads: :mod:`turnkeeper.spec.catalog`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from turnkeeper.spec import errors
from turnkeeper.spec.catalog import CATALOG_KINDS, SessionMeta
from turnkeeper.spec.ledger import LedgerRecord

from ...backend import STORE_NOW, Backend, Tx
from ...codec import check_id
from . import catalog_codec, catalog_fold

MAX_CAS_RETRIES = 8
"""How many compare-and-sets one catalog update tries before
``CatalogConflictError`` (sessionstore catalogMaxCASRetries)."""

LOG = logging.getLogger("turnkeeper.ledger.catalog")


def _log(failure: Exception) -> None:
    LOG.warning("ledger catalog update failed: %s", failure, exc_info=failure)


@dataclass
class CatalogOptions:
    """The catalog's seams, shared by every tenant's handle of one store:
    ``clock`` stamps ``last_active_at`` at an online update (sessionstore
    CatalogClock), ``on_update_failed`` receives each error an online update
    swallows (sessionstore CatalogLogger; by default a warning on the
    ``turnkeeper.ledger.catalog`` logger)."""

    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    on_update_failed: Callable[[Exception], None] = _log
    stuck: set[tuple[str, str]] = field(default_factory=set)
    """The (tenant, session) keys whose online updates stopped after a
    failure that recurs (:func:`recurs`), until a repair succeeds."""


def recurs(failure: Exception) -> bool:
    """Whether an online update's ``failure`` would recur on every later
    append of the session: a record that does not fold (or a ledger without
    ``session_started`` to rebuild from), or an entry that does not encode.
    A backend failure or a lost compare-and-set does not."""
    if isinstance(failure, errors.CatalogWriteError):
        return isinstance(failure.__cause__, errors.CatalogEncodeError)
    return isinstance(
        failure,
        (
            errors.ReplayDecodeError,
            errors.CatalogUsageError,
            errors.CatalogHustleError,
            errors.CatalogCompactionError,
            errors.CatalogOrderingError,
            errors.EmptySessionError,
        ),
    )


NewRecord = tuple[int, str, bytes]
"""A record just appended: (seq, kind, payload)."""


class _Stale(Exception):
    """The stored entry folded more of the ledger than a repair's replay."""


def store_meta(
    tx: Tx,
    tenant: str,
    session_id: str,
    revision: int,
    text: str,
    now: datetime | None,
    folded: int,
) -> bool:
    """Write ``text`` as the entry, and ``folded`` (its ``last_journal_seq``)
    as its cursor column, if its revision is still ``revision`` (0: no entry
    yet) and move the revision on; ``False`` when another writer's revision
    is there (the revision compare-and-set)."""
    if revision == 0:
        # ON CONFLICT: a concurrent first insert (PostgreSQL, read committed:
        # both saw no row) loses the compare-and-set instead of failing.
        inserted = tx.count(
            "INSERT INTO ledger_catalog (tenant, session_id, revision, meta, updated_at, "
            f"folded_seq) VALUES (?, ?, 1, ?, {STORE_NOW}, ?) "
            "ON CONFLICT (tenant, session_id) DO NOTHING",
            [tenant, session_id, text, now, folded],
        )
        return inserted == 1
    changed = tx.count(
        "UPDATE ledger_catalog SET revision = revision + 1, meta = ?, folded_seq = ?, "
        f"updated_at = {STORE_NOW} WHERE tenant = ? AND session_id = ? AND revision = ?",
        [text, folded, now, tenant, session_id, revision],
    )
    return changed == 1


def fold_new(
    session_id: str, meta: SessionMeta | None, records: Sequence[NewRecord], now: datetime
) -> SessionMeta:
    """``meta`` (``None``: no entry yet) with ``records`` folded at ``now``.

    Raises:
        CatalogOrderingError: the records do not follow the entry's cursor.
        ReplayDecodeError, CatalogUsageError, CatalogHustleError: a record
            does not fold.
    """
    meta = meta or SessionMeta(session_id)
    if records and meta.last_journal_seq < records[0][0] - 1:
        seq, kind, _ = records[0]
        raise errors.CatalogOrderingError(
            kind, seq, meta.last_journal_seq, detail="records before it were not folded"
        )
    skipped = 0  # the last of a run of records of other kinds: they only move the cursor
    for seq, kind, payload in records:
        if kind in CATALOG_KINDS:
            if skipped:
                meta = replace(meta, last_journal_seq=skipped)
                skipped = 0
            meta = catalog_fold.fold(meta, seq, kind, payload, now)
            continue
        if seq <= max(skipped, meta.last_journal_seq):
            raise errors.CatalogOrderingError(kind, seq, max(skipped, meta.last_journal_seq))
        skipped = seq
    return replace(meta, last_journal_seq=skipped) if skipped else meta


def stored_ahead(stored_seq: int, replayed_seq: int) -> bool:
    """Whether the stored entry folded records past a repair's replay (then
    the repair replays again rather than overwrite that fold)."""
    return stored_seq > replayed_seq


class Catalog:
    """The ledger's catalog for one tenant (see the module docstring)."""

    def __init__(
        self,
        db: Backend,
        tenant: str,
        replay: Callable[[str, int], Iterator[LedgerRecord]],
        options: CatalogOptions,
    ) -> None:
        self.db = db
        self.tenant = tenant
        self._replay = replay
        self.options = options

    def configure(
        self,
        *,
        clock: Callable[[], datetime] | None = None,
        on_update_failed: Callable[[Exception], None] | None = None,
    ) -> None:
        """Set the catalog's clock (sessionstore WithCatalogClock: returns an
        aware datetime) and logger (WithCatalogLogger: called with each error
        an online update swallows; it must not raise) for every tenant's handle."""
        if clock is not None:
            self.options.clock = clock
        if on_update_failed is not None:
            self.options.on_update_failed = on_update_failed

    # -- reads -------------------------------------------------------------------

    def _row(self, session_id: str) -> tuple[int, str, int] | None:
        """``(revision, meta text, folded_seq)`` of the entry, or ``None``."""
        try:
            row = self.db.read(
                "ledger_catalog_read",
                lambda tx: tx.one(
                    "SELECT revision, meta, folded_seq FROM ledger_catalog "
                    "WHERE tenant = ? AND session_id = ?",
                    [self.tenant, session_id],
                ),
            )
        except errors.DatabaseError as failure:
            raise errors.CatalogReadError(session_id, detail="the read failed") from failure
        return None if row is None else (int(row[0]), row[1], int(row[2]))

    def read_meta(self, session_id: str) -> SessionMeta | None:
        """``session_id``'s entry, or ``None`` when it has none (sessionstore ReadMeta).

        Raises:
            CatalogReadError: the read failed (a ``DatabaseError`` as
                ``__cause__``) or the value is malformed (a ``CatalogDecodeError``).
            InvalidInputError: a malformed id.
        """
        check_id(session_id, "session_id")
        row = self._row(session_id)
        return None if row is None else catalog_codec.decode(session_id, row[1], row[2])

    def list_sessions(
        self, *, on_unreadable: Callable[[errors.CatalogReadError], None] | None = None
    ) -> list[SessionMeta]:
        """Every entry of this tenant, by session id, read from the catalog
        alone: no ledger is read (sessionstore ListSessions).

        A malformed entry raises ``CatalogReadError``; with ``on_unreadable``
        it is passed there instead and the others are listed.

        Raises:
            CatalogReadError: the read failed (``session_id`` ``""``), or an
                entry is malformed (its session, ``CatalogDecodeError`` as cause).
        """
        try:
            rows = self.db.read(
                "ledger_catalog_list",
                lambda tx: tx.rows(
                    "SELECT session_id, meta, folded_seq FROM ledger_catalog "
                    "WHERE tenant = ? ORDER BY session_id",
                    [self.tenant],
                ),
            )
        except errors.DatabaseError as failure:
            raise errors.CatalogReadError("", detail="the listing failed") from failure
        found = []
        for session_id, text, folded in rows:
            try:
                found.append(catalog_codec.decode(session_id, text, int(folded)))
            except errors.CatalogReadError as bad:
                if on_unreadable is None:
                    raise
                on_unreadable(bad)
        return found

    # -- writes ------------------------------------------------------------------

    def _update(
        self,
        session_id: str,
        change: Callable[[SessionMeta | None], SessionMeta],
        *,
        replace_value: bool = False,
    ) -> SessionMeta:
        """Apply ``change`` to the entry under the revision compare-and-set,
        retried up to ``MAX_CAS_RETRIES`` times; with ``replace_value`` the
        stored value is not decoded (a repair replaces even a malformed one)."""
        for _ in range(MAX_CAS_RETRIES):
            row = self._row(session_id)
            revision = 0 if row is None else row[0]
            current = None
            if row is not None and not replace_value:
                current = catalog_codec.decode(session_id, row[1], row[2])
            meta = change(current)
            try:
                text = catalog_codec.encode(meta)
            except errors.CatalogEncodeError as bad:
                raise errors.CatalogWriteError(session_id, detail="it does not encode") from bad

            def write(
                tx: Tx, text: str = text, revision: int = revision, seq: int = meta.last_journal_seq
            ) -> bool:
                return store_meta(tx, self.tenant, session_id, revision, text, tx.now, seq)

            try:
                won = self.db.write("ledger_catalog_write", write)
            except errors.DatabaseError as failure:
                raise errors.CatalogWriteError(session_id, detail="the write failed") from failure
            if won:
                return meta
        raise errors.CatalogConflictError(session_id, MAX_CAS_RETRIES)

    def update_on_event(self, session_id: str, records: Sequence[NewRecord]) -> SessionMeta:
        """Fold ``records`` (``(seq, kind, payload)``, in sequence order, just
        appended) into ``session_id``'s entry (sessionstore UpdateOnEvent),
        without reading the ledger.

        Raises:
            CatalogOrderingError: a record is not after the entry's cursor, or
                records between the cursor and the first record are missing.
            CatalogReadError, CatalogWriteError, CatalogConflictError: the
                entry could not be read or written.
            ReplayDecodeError, CatalogUsageError, CatalogHustleError: a record
                does not fold.
        """
        check_id(session_id, "session_id")
        now = self.options.clock()
        return self._update(session_id, lambda meta: fold_new(session_id, meta, records, now))

    def after_append(self, session_id: str, records: Sequence[NewRecord]) -> None:
        """The best-effort update after an append: :meth:`update_on_event`; on
        a gap before the new records, a :meth:`catch_up`; on a malformed
        stored value, a :meth:`repair`. Any failure goes to
        ``on_update_failed`` and is not raised; one that would recur
        (:func:`recurs`) stops this session's online updates until a repair
        succeeds."""
        key = (self.tenant, session_id)
        if not records or key in self.options.stuck:
            return
        try:
            try:
                try:
                    self.update_on_event(session_id, records)
                except errors.CatalogOrderingError:
                    self.catch_up(session_id)
            except errors.CatalogReadError as bad:
                if not isinstance(bad.__cause__, errors.CatalogDecodeError):
                    raise
                self.repair(session_id)
        except Exception as failure:
            if recurs(failure):
                self.options.stuck.add(key)
            self.options.on_update_failed(failure)

    def is_stuck(self, session_id: str) -> bool:
        """Whether this session's online updates stopped (see :meth:`after_append`)."""
        return (self.tenant, session_id) in self.options.stuck

    def catch_up(self, session_id: str) -> SessionMeta:
        """Fold the records past the entry's cursor into ``session_id``'s entry
        (no entry: from the first record), read from the ledger, verified;
        activity is stamped with the records' ``written_at``, as a repair
        does. Reads the records the entry missed, never the ones before.

        Raises:
            ReplayReadError, ReplayDecodeError: the records do not replay.
            CatalogUsageError, CatalogHustleError: a record does not fold.
            CatalogReadError, CatalogWriteError, CatalogConflictError: the
                entry could not be read or written.
        """
        check_id(session_id, "session_id")
        for _ in range(MAX_CAS_RETRIES):
            row = self._row(session_id)
            meta = SessionMeta(session_id)
            if row is not None:
                meta = catalog_codec.decode(session_id, row[1], row[2])
            cursor = meta.last_journal_seq
            for record in self._replay(session_id, cursor + 1):
                meta = catalog_fold.fold(
                    meta, record.seq, record.kind, record.payload, record.written_at
                )

            def change(
                current: SessionMeta | None, built: SessionMeta = meta, cursor: int = cursor
            ) -> SessionMeta:
                if (0 if current is None else current.last_journal_seq) != cursor:
                    raise _Stale
                return built

            try:
                return self._update(session_id, change)
            except _Stale:
                continue  # an update folded newer records meanwhile: read again
        raise errors.CatalogConflictError(
            session_id, MAX_CAS_RETRIES, detail="newer records kept landing during the catch-up"
        )

    def repair(self, session_id: str) -> SessionMeta:
        """Rebuild ``session_id``'s entry from its whole ledger and store it
        (sessionstore RepairCatalog); ``last_active_at`` is the ``written_at``
        of the last record that marks activity.

        Raises:
            EmptySessionError: the ledger has no ``session_started`` record.
            SessionNotFoundError: the session does not exist.
            ReplayReadError, ReplayDecodeError: the ledger does not replay
                (the entry is left as it was).
            CatalogUsageError, CatalogHustleError, CatalogCompactionError:
                its records contradict themselves.
            CatalogWriteError, CatalogConflictError: the entry could not be stored.
        """
        check_id(session_id, "session_id")
        for _ in range(MAX_CAS_RETRIES):
            built = self._rebuild(session_id)

            def change(_current: SessionMeta | None, built: SessionMeta = built) -> SessionMeta:
                stored = self._row(session_id)
                if stored is not None:
                    try:
                        ahead = catalog_codec.decode(
                            session_id, stored[1], stored[2]
                        ).last_journal_seq
                    except errors.CatalogReadError:
                        ahead = 0  # a malformed value is replaced
                    if stored_ahead(ahead, built.last_journal_seq):
                        raise _Stale
                return built

            try:
                repaired = self._update(session_id, change, replace_value=True)
            except _Stale:
                continue  # an update folded newer records meanwhile: replay again
            self.options.stuck.discard((self.tenant, session_id))
            return repaired
        raise errors.CatalogConflictError(
            session_id, MAX_CAS_RETRIES, detail="newer records kept landing during the repair"
        )

    def _rebuild(self, session_id: str) -> SessionMeta:
        state = catalog_fold.RepairState()
        meta = SessionMeta(session_id)
        for record in self._replay(session_id, 1):
            meta = catalog_fold.fold(
                meta, record.seq, record.kind, record.payload, record.written_at, state
            )
        if not state.session_started:
            raise errors.EmptySessionError(
                session_id, detail="its ledger has no session_started record"
            )
        return meta
