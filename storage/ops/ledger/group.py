"""Group commit of ledger appends: the appends of many writers (one per
session, each under its own lease) that queue up together commit in one
transaction, with one read of their tips, one read of their idempotency
ids, one multi-row insert (DuckDB: ``unnest`` lists or an Arrow table;
PostgreSQL: ``COPY``) and one compare-and-set of their tips.

Each member of a group is judged on its own, with the single path's rules
and error order (:func:`.journal.append`): its lease fence
(:func:`.leases.fence`, the very fence of the single path, judged after its
lease row's lock), its ledger's tip read with the row locked, then its
ledger's epoch fence (:func:`.journal.check_epoch`), then its idempotency
ids, then its new blob pointers against GC's condemned blobs
(:func:`.condemn.refuse_condemned`). A member that fails any of them gets
its own error as its outcome and writes nothing (the writes come after
every check and touch only the members that passed); the others are
written. An unexpected failure of the group's transaction (a database
error, a lease that lapsed before the COMMIT, a conflict) commits nothing:
every member then runs alone, with the single path's retries, so its
outcome is its own. Every caller is answered only after the COMMIT that
holds its records (or after its own failure).

Who groups:

- DuckDB: the backend's own group commit (``storage/duck/group.py``)
  queues the writes of every thread of the process; consecutive ledger
  appends carry the same :class:`~turnkeeper.storage.backend.Merge`, whose
  ``many`` is :func:`append_group`.
- PostgreSQL: processes cannot share a transaction, so the appends of the
  threads of one store object (one process) are grouped by a
  :class:`Batcher`: while one group's transaction runs, the appends that
  arrive queue, and the next leader takes them all (up to
  :data:`GROUP_MAX`). Across processes, each process's groups are separate
  transactions, and the server's WAL flushes shared by concurrent commits
  (``commit_delay``/``commit_siblings``) are what groups them.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import AppendResult, LedgerEntry
from turnkeeper.spec.records import Lease

from ...backend import Backend, Conflict, Tx
from .. import leases
from ..capabilities import session_exists
from . import catalog_group, condemn, journal, sealing
from .catalog import Catalog
from .catalog_group import CatalogUpdate

GROUP_MAX = 64
"""Most calls one :class:`Batcher` group takes."""

COMMIT_DELAY_S = 0.001
"""Longest a :class:`Batcher` leader waits (seconds) for as many calls as its
previous group ran (see :meth:`Batcher._gather`)."""


@dataclass(frozen=True, slots=True)
class LedgerAppend:
    """One writer's queued append: its ledger (``tenant``, ``session_id``), its
    lease, and its entries as stored (offloaded payloads already pointers).

    With ``catalog``, the transaction that writes its records also folds
    them into the session's catalog entry (:func:`catalog_in_tx`):
    ``logical`` are the entries as given (an offloaded payload's bytes, not
    its pointer), and ``catalogued[0]`` says, once the append returned,
    whether the committed transaction did (else the caller updates the
    entry after it). ``blob_versions``: the data key version each blob
    of its pointers was sealed under when it was put (``None``: clear;
    ``sealing.current_blobs``)."""

    tenant: str
    session_id: str
    lease: Lease
    entries: Sequence[LedgerEntry]
    catalog: Catalog | None = None
    logical: Sequence[LedgerEntry] = ()
    catalogued: list[bool] = field(default_factory=lambda: [False])
    blob_versions: Mapping[str, int | None] = field(default_factory=dict)


def catalog_in_tx(tx: Tx, done: list[tuple[LedgerAppend, list[AppendResult]]]) -> None:
    """Fold the records each append of ``done`` (its request and results,
    sessions distinct) wrote into its session's catalog entry, in ``tx``
    (:func:`.catalog_group.fold_in`); sets each request's ``catalogued``."""
    updates: list[CatalogUpdate] = []
    for request, results in done:
        request.catalogued[0] = False
        if request.catalog is not None:
            written = [
                (r.seq, e.kind, e.payload)
                for e, r in zip(request.logical, results, strict=True)
                if not r.duplicate
            ]
            updates.append(CatalogUpdate(request.catalog, request.session_id, written))
    folded = iter(catalog_group.fold_in(tx, updates))
    for request, _ in done:
        if request.catalog is not None:
            request.catalogued[0] = next(folded)


def _rounds(requests: Sequence[LedgerAppend]) -> list[list[int]]:
    """Request indexes in rounds of distinct sessions (so distinct lease
    targets, whichever tenant's ledger), each session's in queue order."""
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, r in enumerate(requests):
        k = seen.get(r.session_id, 0)
        seen[r.session_id] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(i)
    return rounds


def append_group(tx: Tx, requests: list[LedgerAppend]) -> list[Any]:
    """The outcome of each request, in order: its ``list[AppendResult]``, or
    the exception its append alone would raise (nothing written for it).
    Two appends to one session run in queue order, the second in a later
    round that sees the first's records.

    Raises:
        Conflict: a tip moved under the group (nothing of it is kept; each
            member then runs alone).
    """
    outcomes: list[Any] = [None] * len(requests)
    for members in _rounds(requests):
        for i, out in zip(members, _round(tx, [requests[i] for i in members]), strict=True):
            outcomes[i] = out
    return outcomes


def _fenced(tx: Tx, requests: list[LedgerAppend], out: list[Any]) -> list[Any]:
    """Each request's lease fence (:func:`.leases.fence_many`, the single
    path's fence for a set); a refused one gets its error in ``out``.
    Returns the clock reading each passing fence judged at."""
    now: list[Any] = [None] * len(requests)
    for i, judged in enumerate(leases.fence_many(tx, [r.lease for r in requests])):
        if isinstance(judged, Exception):
            out[i] = judged
        else:
            now[i] = judged
    return now


def _tips(tx: Tx, requests: list[LedgerAppend]) -> dict[tuple[str, str], tuple[int, int]]:
    """The ``(tip, epoch)`` of each request's ledger that has a tip row, read
    with the rows locked (PostgreSQL), in key order (one lock order for all
    groups)."""
    rows = tx.rows(
        "SELECT tenant, session_id, seq, epoch FROM ledger_tips "
        "WHERE tenant = ANY(?::VARCHAR[]) AND session_id = ANY(?::VARCHAR[]) "
        "ORDER BY tenant, session_id" + tx.dialect.update_lock(),
        [sorted({r.tenant for r in requests}), sorted({r.session_id for r in requests})],
    )
    return {(str(t), str(s)): (int(seq), int(ep)) for t, s, seq, ep in rows}


def _known(
    tx: Tx, requests: list[LedgerAppend], writing: list[int]
) -> dict[tuple[str, str], dict[str, journal.Known]]:
    """The records already stored under the idempotency ids of the ``writing``
    requests, and the record past each one's tip if one is there (damage:
    :func:`.journal.sequence` refuses it): per ledger (tenant, session), by
    id, a :data:`.journal.Known`."""
    wanted = {(requests[i].tenant, requests[i].session_id) for i in writing}
    tenants, sessions = sorted({t for t, _ in wanted}), sorted({s for _, s in wanted})
    rows = tx.rows(
        "SELECT tenant, session_id, idempotency_id, seq, kind, payload_sha256, "
        f"{journal.known_pointer()} "
        "FROM ledger_records WHERE tenant = ANY(?::VARCHAR[]) "
        "AND session_id = ANY(?::VARCHAR[]) AND idempotency_id = ANY(?::VARCHAR[]) "
        "UNION ALL SELECT r.tenant, r.session_id, r.idempotency_id, r.seq, r.kind, "
        f"r.payload_sha256, {journal.known_pointer('r')} "
        "FROM ledger_tips t JOIN ledger_records r "
        "ON r.tenant = t.tenant AND r.session_id = t.session_id AND r.seq = t.seq + 1 "
        "WHERE t.tenant = ANY(?::VARCHAR[]) AND t.session_id = ANY(?::VARCHAR[])",
        [
            tenants,
            sessions,
            sorted({e.idempotency_id for i in writing for e in requests[i].entries}),
            tenants,
            sessions,
        ],
    )
    known: dict[tuple[str, str], dict[str, journal.Known]] = {}
    for t, s, k, seq, kind, h, pointer in rows:
        if (t, s) in wanted:
            found = (int(seq), str(kind), str(h), None if pointer is None else str(pointer))
            known.setdefault((str(t), str(s)), {})[str(k)] = found
    return known


def _round(tx: Tx, requests: list[LedgerAppend]) -> list[Any]:
    """:func:`append_group` for requests to distinct sessions."""
    out: list[Any] = [None] * len(requests)
    now = _fenced(tx, requests, out)
    tips = _tips(tx, requests)
    for i, r in enumerate(requests):
        if out[i] is not None:
            continue
        tip, ledger_epoch = tips.get((r.tenant, r.session_id), (0, 0))
        try:
            if tip == 0:  # no fence of this writer's: its session is gone, or it never opened
                session_exists(tx, r.session_id)
            journal.check_epoch(r.session_id, r.lease, ledger_epoch)
        except (errors.LeaseLostError, errors.SessionNotFoundError) as refused:
            out[i] = refused
            continue
        journal.MACHINE.require("append", "open", {"lease_held": True})
    writing = [i for i in range(len(requests)) if out[i] is None]
    if not writing:
        return out
    known = _known(tx, requests, writing)
    marked = condemn.condemned(
        tx, condemn.new_pointer_keys([(0, e) for i in writing for e in requests[i].entries])
    )
    rows: list[tuple[Any, ...]] = []
    moves: list[tuple[str, str, int, int, int]] = []
    for i in writing:
        r = requests[i]
        tip, ledger_epoch = tips[(r.tenant, r.session_id)]
        try:
            results, new = journal.sequence(
                r.session_id, tip, r.entries, known.get((r.tenant, r.session_id), {}), r.logical
            )
            condemn.refuse_condemned(r.session_id, new, marked)
        except (
            errors.LedgerIdempotencyConflictError,
            errors.LedgerTipDamagedError,
            errors.BlobCondemnedError,
        ) as refused:
            out[i] = refused
            continue
        try:
            sealing.current_blobs(tx, r.session_id, new, r.logical or r.entries, r.blob_versions)
            seal = sealing.sealer(tx, r.session_id)
        except (errors.KeyUnavailableError, condemn.StaleBlob) as refused:
            out[i] = refused
            continue
        out[i] = results
        for seq, e in new:
            rows.append(
                journal.record_row(r.tenant, r.session_id, r.lease.epoch, now[i], seq, e, seal)
            )
        if new:
            moves.append((r.tenant, r.session_id, tip, new[-1][0], ledger_epoch))
    if rows:
        tx.insert_rows("ledger_records", journal.COLUMNS, rows)
    if moves:
        _move_tips(tx, moves)
    catalog_in_tx(tx, [(requests[i], out[i]) for i in writing if isinstance(out[i], list)])
    return out


def _move_tips(tx: Tx, moves: list[tuple[str, str, int, int, int]]) -> None:
    """One compare-and-set of every moved tip: ``(tenant, session, old, new, epoch)``.

    Raises:
        Conflict: a tip was not where its member read it (nothing is kept).
    """
    moved = tx.count(
        "UPDATE ledger_tips SET seq = v.new_seq, epoch = v.new_epoch FROM ("
        "SELECT unnest(?::VARCHAR[]) AS t, unnest(?::VARCHAR[]) AS s, "
        "unnest(?::BIGINT[]) AS old_seq, unnest(?::BIGINT[]) AS new_seq, "
        "unnest(?::BIGINT[]) AS new_epoch) AS v "
        "WHERE ledger_tips.tenant = v.t AND ledger_tips.session_id = v.s "
        "AND ledger_tips.seq = v.old_seq",
        [[m[k] for m in moves] for k in range(5)],
    )
    if moved != len(moves):
        raise Conflict("a ledger tip moved during a group commit")


@dataclass(eq=False)
class _Item:
    """A queued append and, once ``done``, its outcome."""

    request: Any
    done: bool = False
    outcome: Any = None
    error: BaseException | None = field(default=None)


class Batcher:
    """Group commit for a backend that does not group writes (PostgreSQL):
    the appends of one store object's threads. A caller queues its append
    and waits; the first caller to find no group running leads: it takes
    every queued append (up to :data:`GROUP_MAX`), runs them with
    ``run_group`` (one transaction: :func:`append_group`), or a lone one
    with ``run_one`` (the single path, so one caller pays what it did
    without grouping), and answers each once that transaction ended; it
    leads again until its own append is answered. When ``run_group`` raises
    (nothing committed), each member runs alone with ``run_one``.

    A leader cancelled (``BaseException``) puts the appends it had not
    answered back in the queue for the next leader: a group whose COMMIT
    took effect before the cancellation then runs them again, and their
    idempotency ids make that run answer the original sequences
    (``duplicate=True``) without writing twice."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._grew = threading.Condition(self._lock)
        self._queue: list[_Item] = []
        self._leading = False
        self._last = 1
        self._gathering = 0

    def submit(
        self,
        request: Any,
        run_group: Callable[[list[Any]], list[Any]],
        run_one: Callable[[Any], Any],
    ) -> Any:
        """Queue ``request`` and return its results once the transaction that
        holds its records committed (``run_group`` and ``run_one`` run the
        groups this caller leads, if it leads).

        Raises:
            whatever its append alone raises (its own error, never another's).
        """
        item = _Item(request)
        with self._lock:
            self._queue.append(item)
            if self._gathering and len(self._queue) >= self._gathering:
                self._grew.notify()
            while not item.done and self._leading:
                self._changed.wait(1.0)
            lead = not item.done
            if lead:
                self._leading = True
        if lead:
            try:
                self._lead(item, run_group, run_one)
            finally:
                with self._lock:
                    self._leading = False
                    if item in self._queue:
                        self._queue.remove(item)
                    self._changed.notify_all()
        if item.error is not None:
            raise item.error
        return item.outcome

    def _lead(
        self,
        item: _Item,
        run_group: Callable[[list[Any]], list[Any]],
        run_one: Callable[[Any], Any],
    ) -> None:
        while not item.done:
            with self._lock:
                self._gather()
                batch = self._queue[:GROUP_MAX]
                del self._queue[:GROUP_MAX]
                self._last = len(batch)
            try:
                _run(batch, run_group, run_one)
            except BaseException:
                with self._lock:
                    self._queue[:0] = [q for q in batch if not q.done and q is not item]
                item.done = True
                raise
            with self._lock:
                self._changed.notify_all()

    def _gather(self) -> None:
        """With the lock held: wait until as many calls are queued as the
        previous group ran, or for :data:`COMMIT_DELAY_S` (the writers a group
        answered come back together; PostgreSQL's ``commit_delay`` with
        ``commit_siblings``); not at all after a group of one, so a lone
        writer never waits. It only shapes groups: no outcome depends on it."""
        expected = min(self._last, GROUP_MAX)
        if expected <= 1:
            return
        deadline = time.monotonic() + COMMIT_DELAY_S
        self._gathering = expected
        try:
            while len(self._queue) < expected:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._grew.wait(remaining)
        finally:
            self._gathering = 0


_BATCHERS: weakref.WeakKeyDictionary[Backend, dict[str, Batcher]] = weakref.WeakKeyDictionary()
_BATCHERS_LOCK = threading.Lock()


def batcher(db: Backend, name: str) -> Batcher:
    """The :class:`Batcher` ``name`` (``"append"``) of store
    backend ``db`` (one per store object, shared by its ledger areas of every
    tenant), made on first use."""
    with _BATCHERS_LOCK:
        return _BATCHERS.setdefault(db, {}).setdefault(name, Batcher())


def run_group(db: Backend, requests: list[LedgerAppend]) -> list[Any]:
    """``requests`` as one group commit on ``db``: :func:`append_group` in one transaction."""
    return db.write("ledger_append_group", lambda tx: append_group(tx, requests))


def _run(
    batch: list[_Item],
    run_group: Callable[[list[Any]], list[Any]],
    run_one: Callable[[Any], Any],
) -> None:
    """Run ``batch``: as one group, else (one member, or a group that failed
    and committed nothing) each member alone."""
    if len(batch) > 1:
        try:
            outcomes = run_group([q.request for q in batch])
        except Exception:
            outcomes = None  # nothing committed: each runs alone
        if outcomes is not None:
            for q, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    q.error = outcome
                else:
                    q.outcome = outcome
                q.done = True
            return
    for q in batch:
        try:
            q.outcome = run_one(q.request)
        except Exception as failure:
            q.error = failure
        q.done = True
