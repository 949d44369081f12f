"""The ledger model: K ledger writers, blob GC and session deleters on
bounded sessions, the clock ticking (leases expire, at the boundary too) and
workers crashing (forgetting their leases, writers, puts and GC passes).

Actors and their steps, each the store's code cut where another actor can
come between (the function each step stands for in brackets):

- a writer (a worker ``A``, ``B`` … with a ``mutation`` lease on
  ``session:<id>``) opens a writer handle in one of its ``handles`` slots:
  ``open`` reads the tip (``Ledger.open``'s read), ``plant`` is the opening
  transaction (``journal.plant_fence``: the lease fence, the tip's
  compare-and-set, the fence record at the tip read + 1; a conflict
  releases the grant, ``Ledger.open``); ``append`` writes one record
  (``journal.append``: the lease fence, the session check when the tip is
  gone, the ledger's own fence ``journal.check_epoch``); ``put`` writes the
  worker's one offloaded record's blob (``blobs.offload``: no fence, the key
  is its generation's) and ``append_ptr`` appends its pointer (as
  ``append``, then ``condemn.check_append``: a condemned key is refused and
  the record moves to its next generation, ``condemn.write_offloaded``);
  ``close`` closes the handle; ``acquire`` and ``release`` its lease;
- blob GC under a worker's lease (``gc.collect``): ``gc_scan`` is the first
  fence (``gc.writer_fence``), the scan of the pointers up to the tip
  (``gc.referenced_keys``) and the listing; ``gc_condemn`` the condemn
  transaction (``gc.condemn_orphans``: the fence again, less the keys of
  pointers appended since the scan, ``gc.referenced_since``, marks them);
  ``gc_delete`` deletes the condemned blobs (no fence: ``condemn.py`` says why);
- a deleter: ``delete`` by ``D`` without a lease (``deletes.delete``,
  ``leases.fence_or_unheld``: refused while anyone holds a live lease) or by
  a worker under its lease (fenced); it removes the session's ledger, tip,
  condemned marks and its blobs in the database's blob table
  (``deletes.REMOVED``; the lease rows stay), and a deleted session is never
  leased again (``leases.admission_check``); ``sweep`` by ``D`` deletes the
  blobs of deleted sessions with no ledger records or tip
  (``sweep.deleted_sessions``, ``sweep.sweep``): a blob put after the delete.

Every writer decision comes from the ``LEDGER_WRITER`` lifecycle given
(``Lifecycle.select`` over the facts ``lease_held``, from ``LEASE`` through
``leasing`` and ``journal.check_epoch``, and ``tip_unmoved``,
``journal.tip_unmoved``); the condemn fence is ``condemn.refuse_condemned``
itself. Left out: the temporary files of puts killed mid-write (their grace
is a wall-clock age, ``gc.reclaim_temps``), renewals (the leases model has
them), and a second delivery of an acknowledged offloaded record (a
duplicate writes nothing: ``journal.sequence``).

Invariants (``LEDGER_WRITER``'s, then GC's and the deleter's, checked when
the model has those actors):

- ``sequences gapless``: each ledger's sequences are 1, 2, 3 … without gaps
  or duplicates;
- ``records follow their fence``: every record carries the epoch of the
  newest fence record before it (its writer's);
- ``fence epochs never fall``: along the ledger;
- ``no stale write``: a fenced or closed writer writes nothing: no record is
  written under a lease that expired (as told) or was superseded;
- ``no dangling pointer``: every pointer record of a live ledger names a
  blob in the blob store (GC and sweeps never delete a referenced blob);
- ``no stale GC``: no condemn commits under a lease that expired (as told),
  was superseded, or is not the ledger's newest fence's epoch;
- ``deleted stays empty``: nothing is written to a deleted session's ledger.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import NamedTuple

from model_check import leasing
from model_check.explorer import Label, Stepped
from model_check.leasing import Row, put
from turnkeeper.spec import errors
from turnkeeper.spec.lease import GRANTING_EDGES, LEASE
from turnkeeper.spec.ledger import BLOB_POINTER_KIND, LEDGER_WRITER, LedgerEntry
from turnkeeper.spec.lifecycle import Lifecycle
from turnkeeper.spec.records import Lease
from turnkeeper.storage.ops.ledger import condemn, journal

PURPOSE = "mutation"
"""The purpose every writer's lease has (``session:`` leases on idle sessions)."""

DELETER = "D"
"""The lease-less deleter (``store.sessions.delete`` without a lease, ``sweep_deleted``)."""

Mem = tuple[int, int] | None
"""A worker's lease on a session as told: (epoch, expiry), or none."""


class Handle(NamedTuple):
    """A writer handle: its ``LEDGER_WRITER`` state, its lease's epoch and the tip its open read."""

    state: str
    epoch: int
    expected: int


class Rec(NamedTuple):
    """A ledger record: ``kind`` ``F`` (fence), ``R`` (inline) or ``P`` (pointer to ``key``)."""

    seq: int
    epoch: int
    kind: str
    key: str = ""


class Pend(NamedTuple):
    """A worker's offloaded record in flight through handle ``slot``: its
    blob's generation, and whether the blob is put."""

    slot: int
    gen: int
    put: bool


class Pass(NamedTuple):
    """A GC pass of a worker: under ``epoch``, scanned to ``tip``; ``orphans``
    before the condemn, then the condemned keys still to delete (``doomed``)."""

    epoch: int
    tip: int
    orphans: frozenset[str]
    doomed: tuple[str, ...] | None = None


class State(NamedTuple):
    clock: int
    rows: tuple[Row | None, ...]
    mem: tuple[tuple[Mem, ...], ...]
    top: tuple[int, ...]
    handles: tuple[tuple[tuple[Handle | None, ...], ...], ...]
    ledgers: tuple[tuple[Rec, ...], ...]
    tips: tuple[tuple[int, int], ...]
    deleted: tuple[bool, ...]
    blobs: frozenset[tuple[int, str]] = frozenset()
    condemned: frozenset[tuple[int, str]] = frozenset()
    pend: tuple[tuple[Pend | None, ...], ...] = ()
    passes: tuple[tuple[Pass | None, ...], ...] = ()
    stale_write: bool = False
    stale_gc: bool = False
    written_deleted: bool = False


_AT = datetime(2000, 1, 1, tzinfo=UTC)


@functools.cache
def lease_of(session: str, owner: str, epoch: int) -> Lease:
    """The lease a worker presents, as ``journal.check_epoch`` reads it (target and epoch)."""
    return Lease(f"session:{session}", owner, "-", epoch, PURPOSE, _AT)


def epoch_fenced(session: str, owner: str, epoch: int, ledger_epoch: int) -> bool:
    """The ledger's own fence (``journal.check_epoch``): the newest fence is ``epoch``'s."""
    try:
        journal.check_epoch(session, lease_of(session, owner, epoch), ledger_epoch)
    except errors.LeaseLostError:
        return False
    return True


def pointer(key: str) -> LedgerEntry:
    """A pointer entry naming blob ``key`` (``blobs.offload``'s payload shape)."""
    return LedgerEntry(BLOB_POINTER_KIND, json.dumps({"key": key}).encode(), "big")


def condemn_refuses(session: str, seq: int, key: str, marked: set[str]) -> bool:
    """Whether the append's condemn fence refuses a new pointer to ``key``
    (``condemn.refuse_condemned`` over the session's marked keys)."""
    try:
        condemn.refuse_condemned(session, [(seq, pointer(key))], marked)
    except errors.BlobCondemnedError:
        return True
    return False


def referenced_since(ledger: tuple[Rec, ...], after: int) -> frozenset[str]:
    """The keys of the pointers appended after sequence ``after`` (``gc.referenced_since``)."""
    return frozenset(r.key for r in ledger if r.kind == "P" and r.seq > after)


def session_exists(s: State, t: int) -> bool:
    """The write paths' session check (``capabilities.session_exists``: the
    opening transaction's first read, an append's when the tip is gone)."""
    return not s.deleted[t]


def sweepable(s: State, t: int) -> bool:
    """The sweep's guard (``sweep.deleted_sessions``): a tombstone, and no
    ledger record or tip of the session."""
    return s.deleted[t] and not s.ledgers[t] and s.tips[t] == (0, 0)


class LedgerModel(Stepped[State]):
    """Writers ``workers`` on sessions ``sessions``, ``handles`` writer
    handles each per session, the clock from 0 to ``ticks``, leases for
    ``ttl`` ticks, at most ``grants`` lease epochs per session, ``length``
    records per ledger and ``gens`` generations of an offloaded record's
    blob; the first ``gc`` workers also put blobs and run GC passes (0: no
    blobs), ``deleter`` adds the deleter."""

    def __init__(
        self,
        workers: tuple[str, ...] = ("A", "B"),
        sessions: tuple[str, ...] = ("s1",),
        ticks: int = 3,
        ttl: int = 2,
        grants: int = 3,
        length: int = 3,
        handles: int = 1,
        gens: int = 2,
        gc: int = 1,
        deleter: bool = True,
        lease: Lifecycle = LEASE,
        ledger: Lifecycle = LEDGER_WRITER,
    ) -> None:
        self.workers, self.sessions, self.ticks, self.ttl = workers, sessions, ticks, ttl
        self.grants, self.length, self.slots, self.gens = grants, length, handles, gens
        self.gc, self.deleter = gc, deleter
        self.lease, self.ledger = lease, ledger
        actors = [f"{len(workers)} writers"] + [f"{gc} GC"] * bool(gc) + ["deleter"] * deleter
        self.name = (
            f"{'ledger_gc' if gc else 'ledger'}[{' + '.join(actors)} x {len(sessions)} sessions"
            f" x {ticks} ticks x {grants} grants x {length} records x {handles} handles]"
        )
        invariants: dict[str, Callable[[State], bool]] = {
            "sequences gapless": lambda s: all(
                [r.seq for r in led] == list(range(1, len(led) + 1)) for led in s.ledgers
            ),
            "records follow their fence": self._follow_fence,
            "fence epochs never fall": self._fences_rise,
            "no stale write": lambda s: not s.stale_write,
        }
        if gc:  # without GC no blob is put: nothing for these to see
            invariants["no dangling pointer"] = self._no_dangling
            invariants["no stale GC"] = lambda s: not s.stale_gc
        if deleter:
            invariants["deleted stays empty"] = lambda s: not s.written_deleted
        self.invariants: Mapping[str, Callable[[State], bool]] = invariants

    def initial(self) -> State:
        n, k = len(self.sessions), len(self.workers)
        return State(
            clock=0,
            rows=(None,) * n,
            mem=((None,) * n,) * k,
            top=(0,) * n,
            handles=(((None,) * self.slots,) * n,) * k,
            ledgers=((),) * n,
            tips=((0, 0),) * n,
            deleted=(False,) * n,
            pend=((None,) * n,) * k,
            passes=((None,) * n,) * k,
        )

    # -- invariants -------------------------------------------------------------

    @staticmethod
    def _follow_fence(s: State) -> bool:
        for led in s.ledgers:  # each kept sorted by sequence (_write)
            fence = None
            for r in led:
                if r.kind == "F":
                    fence = r.epoch
                elif r.epoch != fence:
                    return False
        return True

    @staticmethod
    def _fences_rise(s: State) -> bool:
        for led in s.ledgers:
            epochs = [r.epoch for r in led if r.kind == "F"]
            if epochs != sorted(epochs):
                return False
        return True

    @staticmethod
    def _no_dangling(s: State) -> bool:
        return all(
            (t, r.key) in s.blobs for t, led in enumerate(s.ledgers) for r in led if r.kind == "P"
        )

    # -- steps ------------------------------------------------------------------

    def labels(self, s: State) -> Iterator[Label]:
        """Every step an actor can try from ``s`` (some are refused)."""
        if s.clock < self.ticks:
            yield ("tick",)
        for w, name in enumerate(self.workers):
            for t, session in enumerate(self.sessions):
                yield ("acquire", name, session)
                if s.mem[w][t] is not None:
                    yield ("release", name, session)
                for i, h in enumerate(s.handles[w][t]):
                    slot = f"h{i}"
                    if h is None or h.state in ("fenced", "closed"):
                        if s.mem[w][t] is not None:
                            yield ("open", name, session, slot)
                        continue
                    if h.state == "opening":
                        yield ("plant", name, session, slot)
                        continue
                    yield ("append", name, session, slot)
                    if w < self.gc:
                        pend = s.pend[w][t]
                        if pend is None or (pend.slot == i and not pend.put):
                            yield ("put", name, session, slot)
                        elif pend.slot == i:
                            yield ("append_ptr", name, session, slot)
                    yield ("close", name, session, slot)
                if w < self.gc:
                    gc = s.passes[w][t]
                    if gc is None and s.mem[w][t] is not None:
                        yield ("gc_scan", name, session)
                    elif gc is not None and gc.doomed is None:
                        yield ("gc_condemn", name, session)
                    elif gc is not None:
                        yield ("gc_delete", name, session)
                if self.deleter and s.mem[w][t] is not None:
                    yield ("delete", name, session)
            if any(m is not None for m in s.mem[w]) or any(
                h is not None for hs in s.handles[w] for h in hs
            ):
                yield ("crash", name)
        if self.deleter:
            for session in self.sessions:
                yield ("delete", DELETER, session)
            yield ("sweep", DELETER)

    def step(self, s: State, label: Label) -> tuple[bool, State]:
        """``(accepted, next state)``; a refused step leaves the state as it was."""
        kind = label[0]
        if kind == "tick":
            return True, s._replace(clock=s.clock + 1)
        if kind == "sweep":
            return self._sweep(s)
        if label[1] == DELETER:
            return self._delete(s, None, self.sessions.index(label[2]))
        w = self.workers.index(label[1])
        if kind == "crash":
            n = len(self.sessions)
            return True, s._replace(
                mem=put(s.mem, w, (None,) * n),
                handles=put(s.handles, w, ((None,) * self.slots,) * n),
                pend=put(s.pend, w, (None,) * n),
                passes=put(s.passes, w, (None,) * n),
            )
        t = self.sessions.index(label[2])
        if kind == "acquire":
            return self._acquire(s, w, t)
        if kind == "release":
            return self._release(s, w, t)
        if kind == "delete":
            return self._delete(s, w, t)
        if kind.startswith("gc_"):
            return self._gc(s, w, t, kind)
        i = int(label[3][1:])
        h = s.handles[w][t][i]
        if kind == "open":
            mine = s.mem[w][t]
            if mine is None or (h is not None and h.state not in ("fenced", "closed")):
                return False, s
            return True, self._handle(s, w, t, i, Handle("opening", mine[0], s.tips[t][0]))
        if h is None:
            return False, s
        if kind == "plant":
            return self._plant(s, w, t, i, h)
        if kind == "close":
            edge = self.ledger.select("close", h.state, {})
            if edge is None:
                return False, s
            return True, self._handle(s, w, t, i, h._replace(state=edge.dest))
        if kind == "put":
            return self._put(s, w, t, i, h)
        return self._append(s, w, t, i, h, kind == "append_ptr")

    # -- helpers ----------------------------------------------------------------

    def _handle(self, s: State, w: int, t: int, i: int, h: Handle | None) -> State:
        return s._replace(
            handles=put(s.handles, w, put(s.handles[w], t, put(s.handles[w][t], i, h)))
        )

    def _lease_ok(self, s: State, w: int, t: int, epoch: int) -> bool:
        """The lease fence (``leases.fence``, the ``renew`` edge's guards) for ``epoch``."""
        return leasing.fenced(self.lease, s.rows[t], self.workers[w], epoch, PURPOSE, s.clock)

    def _stale(self, s: State, w: int, t: int, epoch: int) -> bool:
        """A write under ``epoch`` is stale: not the session's newest, or expired as told."""
        mine = s.mem[w][t]
        told = mine[1] if mine is not None and mine[0] == epoch else -1
        return epoch != s.top[t] or s.clock >= told

    def _acquire(self, s: State, w: int, t: int) -> tuple[bool, State]:
        if s.deleted[t]:
            return False, s  # admission_check: the session does not exist
        got = leasing.acquire(self.lease, s.rows[t], self.workers[w], PURPOSE, s.clock, self.ttl)
        if got is None:
            return False, s
        edge, new = got
        if edge in GRANTING_EDGES and new.epoch > self.grants:
            return False, s  # beyond the bound: not explored
        return True, s._replace(
            rows=put(s.rows, t, new),
            mem=put(s.mem, w, put(s.mem[w], t, (new.epoch, new.expires))),
            top=put(s.top, t, max(s.top[t], new.epoch)),
        )

    def _release(self, s: State, w: int, t: int, epoch: int | None = None) -> tuple[bool, State]:
        mine, row = s.mem[w][t], s.rows[t]
        if epoch is None:
            if mine is None:
                return False, s
            epoch = mine[0]
        args = (row, self.workers[w], epoch, PURPOSE, s.clock)
        if not leasing.passes(self.lease, "release", *args):
            return False, s
        assert row is not None
        new = row._replace(state="released", expires=min(row.expires, s.clock))
        forget = mine is not None and mine[0] == epoch
        mem = put(s.mem, w, put(s.mem[w], t, None)) if forget else s.mem
        return True, s._replace(rows=put(s.rows, t, new), mem=mem)

    def _write(
        self, s: State, w: int, t: int, recs: tuple[Rec, ...], tip: tuple[int, int]
    ) -> State:
        return s._replace(
            ledgers=put(s.ledgers, t, tuple(sorted((*s.ledgers[t], *recs)))),
            tips=put(s.tips, t, tip),
            stale_write=s.stale_write or self._stale(s, w, t, recs[0].epoch),
            written_deleted=s.written_deleted or s.deleted[t],
        )

    # -- the writer -------------------------------------------------------------

    def _plant(self, s: State, w: int, t: int, i: int, h: Handle) -> tuple[bool, State]:
        if not session_exists(s, t):
            return False, s  # plant_fence: session_exists refuses first
        facts = {
            "lease_held": self._lease_ok(s, w, t, h.epoch),
            "tip_unmoved": journal.tip_unmoved(h.expected, s.tips[t][0]),
        }
        edge = self.ledger.select("open", h.state, facts)
        if edge is None:
            return False, s
        nxt = self._handle(s, w, t, i, h._replace(state=edge.dest))
        if edge.name == "opening_conflict":  # Ledger.open releases the grant
            return True, self._release(nxt, w, t, h.epoch)[1]
        if edge.dest != "open":
            return True, nxt
        seq = h.expected + 1
        if seq > self.length:
            return False, s  # beyond the bound: not explored
        return True, self._write(nxt, w, t, (Rec(seq, h.epoch, "F"),), (seq, h.epoch))

    def _append(
        self, s: State, w: int, t: int, i: int, h: Handle, offloaded: bool
    ) -> tuple[bool, State]:
        pend = s.pend[w][t]
        if offloaded and (pend is None or pend.slot != i or not pend.put):
            return False, s
        tip, ledger_epoch = s.tips[t]
        lease_ok = self._lease_ok(s, w, t, h.epoch)
        if lease_ok and tip == 0 and not session_exists(s, t):
            return False, s  # journal.append: the tip is gone with its session
        held = lease_ok and epoch_fenced(self.sessions[t], self.workers[w], h.epoch, ledger_epoch)
        edge = self.ledger.select("append", h.state, {"lease_held": held})
        if edge is None:
            return False, s
        nxt = self._handle(s, w, t, i, h._replace(state=edge.dest))
        if edge.name != "append":
            return True, nxt
        if tip + 1 > self.length:
            return False, s  # beyond the bound: not explored
        if not offloaded:
            return True, self._write(
                nxt, w, t, (Rec(tip + 1, h.epoch, "R"),), (tip + 1, ledger_epoch)
            )
        assert pend is not None
        key = f"{self.workers[w]}{pend.gen}"
        marked = {k for u, k in s.condemned if u == t}
        if condemn_refuses(self.sessions[t], tip + 1, key, marked):
            if pend.gen + 1 >= self.gens:
                return False, s  # beyond the bound: not explored
            # condemn.write_offloaded: the next generation, put again
            return True, s._replace(
                pend=put(s.pend, w, put(s.pend[w], t, Pend(i, pend.gen + 1, False)))
            )
        nxt = nxt._replace(pend=put(s.pend, w, put(s.pend[w], t, None)))
        return True, self._write(
            nxt, w, t, (Rec(tip + 1, h.epoch, "P", key),), (tip + 1, ledger_epoch)
        )

    def _put(self, s: State, w: int, t: int, i: int, h: Handle) -> tuple[bool, State]:
        if h.state != "open":
            return False, s  # LedgerWriter._usable comes before the put
        if any(r.kind == "P" and r.key.startswith(self.workers[w]) for r in s.ledgers[t]):
            return False, s  # acknowledged: a second delivery is a duplicate (not modelled)
        pend = s.pend[w][t]
        gen = 0 if pend is None else pend.gen
        if pend is not None and (pend.slot != i or pend.put):
            return False, s
        return True, s._replace(
            blobs=s.blobs | {(t, f"{self.workers[w]}{gen}")},
            pend=put(s.pend, w, put(s.pend[w], t, Pend(i, gen, True))),
        )

    # -- GC ---------------------------------------------------------------------

    def _gc_fenced(self, s: State, w: int, t: int, epoch: int) -> bool:
        """``gc.writer_fence``: the lease fence, then the ledger's (``journal.check_epoch``)."""
        return self._lease_ok(s, w, t, epoch) and epoch_fenced(
            self.sessions[t], self.workers[w], epoch, s.tips[t][1]
        )

    def _gc(self, s: State, w: int, t: int, kind: str) -> tuple[bool, State]:
        gc = s.passes[w][t]

        def pass_(p: Pass | None) -> State:
            return s._replace(passes=put(s.passes, w, put(s.passes[w], t, p)))

        if kind == "gc_scan":
            mine = s.mem[w][t]
            if gc is not None or mine is None or not self._gc_fenced(s, w, t, mine[0]):
                return False, s
            tip = s.tips[t][0]
            live = {r.key for r in s.ledgers[t] if r.kind == "P" and r.seq <= tip}
            listed = {k for u, k in s.blobs if u == t}
            return True, pass_(Pass(mine[0], tip, frozenset(listed - live)))
        if gc is None:
            return False, s
        if kind == "gc_condemn":
            if gc.doomed is not None:
                return False, s
            if not self._gc_fenced(s, w, t, gc.epoch):
                return False, s  # GCLeaseNotHeldError: nothing marked
            since = referenced_since(s.ledgers[t], gc.tip)
            doomed = tuple(sorted(gc.orphans - since))
            nxt = pass_(gc._replace(doomed=doomed) if doomed else None)
            return True, nxt._replace(
                condemned=s.condemned | {(t, k) for k in doomed},
                stale_gc=s.stale_gc or self._stale(s, w, t, gc.epoch) or s.tips[t][1] != gc.epoch,
            )
        if not gc.doomed:
            return False, s
        return True, pass_(None)._replace(blobs=s.blobs - {(t, k) for k in gc.doomed})

    # -- deleters ---------------------------------------------------------------

    def _delete(self, s: State, w: int | None, t: int) -> tuple[bool, State]:
        if s.deleted[t]:
            return False, s  # SessionNotFoundError
        if w is None:  # leases.fence_or_unheld: nobody holds a live lease
            row = s.rows[t]
            if row is not None and row.state == "held" and s.clock < row.expires:
                return False, s
        else:
            mine = s.mem[w][t]
            if mine is None or not self._lease_ok(s, w, t, mine[0]):
                return False, s
        return True, s._replace(
            ledgers=put(s.ledgers, t, ()),
            tips=put(s.tips, t, (0, 0)),
            deleted=put(s.deleted, t, True),
            condemned=frozenset(c for c in s.condemned if c[0] != t),
            blobs=frozenset(b for b in s.blobs if b[0] != t),  # ledger_blobs
        )

    def _sweep(self, s: State) -> tuple[bool, State]:
        gone = {b for b in s.blobs if sweepable(s, b[0])}
        if not gone:
            return False, s
        return True, s._replace(blobs=s.blobs - gone)

    # -- the replay's view --------------------------------------------------------

    def outcome(self, label: Label, accepted: bool, after: State) -> str:
        """What the store says to ``label``: ``ok``, or ``refused`` (the
        opening and append edges into ``fenced`` raise, and a condemned
        pointer is written again by the same call: ``ok:regen``)."""
        if not accepted:
            return "refused"
        if label[0] in ("plant", "append", "append_ptr"):
            w, t = self.workers.index(label[1]), self.sessions.index(label[2])
            h = after.handles[w][t][int(label[3][1:])]
            if h is None or h.state != "open":
                return "refused"
            if label[0] == "append_ptr" and after.pend[w][t] is not None:
                return "ok:regen"
        return "ok"
