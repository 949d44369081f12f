"""The differential machine for the ledger's journal (issue 19): writers
opened under successive leases, appends and batches by current and stale
writers, redeliveries, ambiguous appends, lease expiry, takeovers, blob
offload with crashes mid-offload, and GC (its lease lapsing mid-delete too),
run against an oracle of what was acknowledged, through the public API only.

What it shows after every step (``@checked``): replay yields exactly the
acknowledged records (sequence, kind, id, payload, epoch), so no stale
writer's append landed and nothing acknowledged was lost. Each step checks
its own outcome: a writer whose lease expired or was taken over is refused
with ``LeaseLostError`` and writes nothing; a redelivery returns the original
sequence and other content under its id conflicts; an append that committed
while its writer saw a lost connection is retried as duplicates.

Blob offload (payloads over :data:`~.ledger_model.THRESHOLD` bytes): a crash
mid-offload (the blob written, the pointer's append never run:
:class:`~.ledger_model.FaultyBlobs`) leaves an orphan replay never sees; GC
by the current writer deletes exactly the blobs no acknowledged record
references (``scanned == referenced + deleted``) and never a referenced one;
GC by a stale writer is ``GCLeaseNotHeldError`` and deletes nothing.

GC whose lease lapses mid-delete (attack finding F6): the current writer's
append of a fresh id is killed after its blob (an orphan); its GC, in its
first delete, sees its lease lapse, another owner take over and redeliver
that id (acknowledged); then the delete goes on. Every acknowledged record's
blob is still there, whatever generation its pointer names.

Damage to stored records and blobs (a flipped byte, a cut or missing record,
a deleted blob: replay must fail closed at it) needs raw writes to the
store's tables, so it is not here: the test suite adds those rules in a
subclass (``model_tests/ledger_damage.py``).

``machine(opener)`` returns the machine class with its stores from ``opener``.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, rule

from turnkeeper import GCLeaseNotHeldError, LeaseLostError, LedgerEntry, OperationalError
from turnkeeper.storage.ops.ledger import blobs as blob_ops
from turnkeeper.storage.ops.ledger import records

from .ambiguous import ambiguously, replayable
from .base import FuzzMachine, bound, checked
from .ledger_model import (
    CRASH_IDS,
    KILLED,
    PAYLOADS,
    SESSION,
    THRESHOLD,
    TTL,
    Entries,
    FaultyBlobs,
    Handle,
    LedgerOracle,
    entry,
    inline,
    outcome,
)
from .opener import StoreOpener

PREFIX = blob_ops.blob_prefix("", SESSION)
"""Where the session's blobs are listed."""


def blob_key(kind: str, payload: bytes, key: str) -> str:
    """The key of the blob an offloaded entry is first written under (the
    sha256 of its clear envelope, under :data:`PREFIX`)."""
    return PREFIX + records.sha256(blob_ops.envelope(LedgerEntry(kind, payload, key)))


class LedgerMachine(FuzzMachine):
    """Writers of one session's ledger, one lease after another, racing
    appends, offloads and GC against :class:`~.ledger_model.LedgerOracle`."""

    writers = Bundle("writers")

    def __init__(self) -> None:
        super().__init__()
        self.oracle = LedgerOracle()
        self.owners = 0
        self.blobs = FaultyBlobs(self.store.ledger.blobs)
        self.ledger = self.store.ledger.with_blobs(self.blobs, offload_threshold=THRESHOLD)
        self.current: Handle | None = None

    @initialize(target=writers)
    def first_writer(self) -> Handle:
        self.store.sessions.create(SESSION)
        return self._open()

    def _open(self) -> Handle:
        """A new owner's lease on the session (the last one's expired) and its writer."""
        self.owners += 1
        lease = self.store.leases.acquire(f"session:{SESSION}", f"w{self.owners}", TTL)
        assert lease.epoch > self.oracle.epoch, "an epoch was granted twice"
        writer = self.ledger.open(SESSION, lease)
        self.oracle.fence(writer.fence_seq, lease.epoch)
        assert writer.fence_seq == len(self.oracle.rows), "the fence record is not at the tip"
        self.current = Handle(writer, lease.epoch, lease.expires_at)
        return self.current

    def _stale(self, handle: Handle) -> bool:
        """Whether ``handle``'s writer must be refused: fenced out, of an old
        epoch, or its lease expired."""
        return (
            handle.fenced or handle.epoch != self.oracle.epoch or self.clock() >= handle.expires_at
        )

    @property
    def sealed(self) -> bool:
        """Whether the store seals the ledger (an encrypted configuration)."""
        return bool(self.store.db.keyring.encrypted)

    # -- steps -------------------------------------------------------------

    @rule(target=writers)
    def take_over(self) -> Handle:
        """The current lease expires; another owner takes the session over."""
        return self._take_over()

    def _take_over(self) -> Handle:
        self.clock.advance(TTL + 1)
        return self._open()

    @rule(seconds=st.sampled_from((1.0, 5.0, TTL)))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(handle=writers, entries=st.lists(entry, min_size=1, max_size=3))
    def append(self, handle: Handle, entries: Entries) -> None:
        """A batch by ``handle``'s writer: the oracle's sequences (duplicates
        for redelivered ids), a conflict, or refused when stale; a refusal
        writes nothing."""
        stale = self._stale(handle)
        before = list(self.oracle.rows)
        got = outcome(handle.writer.append_many, [LedgerEntry(k, p, i) for k, p, i in entries])
        if stale:
            assert got == ("lost",), f"a stale writer's append was taken: {got}"
            handle.fenced = True
        else:
            expected = self.oracle.expect(entries)
            want = ("conflict",) if expected == "conflict" else ("ok", expected)
            assert got == want, (got, expected)
            if got != ("conflict",):
                self.oracle.commit(entries)
        if got in (("lost",), ("conflict",)):
            assert self.oracle.rows == before

    @rule(handle=writers, entries=st.lists(inline, min_size=1, max_size=3))
    def append_ambiguously(self, handle: Handle, entries: Entries) -> None:
        """An append that commits while its writer sees a lost connection,
        then the writer's retry of the same entries: each is a duplicate
        with the sequence the lost reply would have given (nothing is
        written twice); a stale writer's is refused, a conflict too."""
        replayable("append_ambiguously", handle=f"epoch {handle.epoch}", entries=entries)
        batch = [LedgerEntry(k, p, i) for k, p, i in entries]
        got = ambiguously(self.store, outcome, handle.writer.append_many, batch)
        if self._stale(handle):
            assert got == ("lost",), f"a stale writer's append was taken: {got}"
            handle.fenced = True
            return
        expected = self.oracle.expect(entries)
        if isinstance(expected, str):
            assert got == ("conflict",), (got, expected)
            return
        assert got[0] == "ambiguous", (got, expected)
        assert got[1][0] in ("ledger_append", "ledger_append_group"), got
        self.oracle.commit(entries)
        retried = outcome(handle.writer.append_many, batch)
        again = [(seq, True) for seq, _ in expected]
        assert retried == ("ok", again), f"the retry of a committed append: {retried}, {again}"

    def _killed_append(self, handle: Handle, payload: bytes, key: str) -> bool:
        """``handle``'s writer appends an offloaded ``payload`` under ``key``
        and dies after the blob's put: the blob is an orphan. ``False`` when
        the writer was refused before its put (fenced out earlier)."""
        was_fenced = handle.fenced  # a writer refused before writes no blob
        self.blobs.kill_puts, self.blobs.killed = True, []
        try:
            handle.writer.append("turn", payload, key)
        except LeaseLostError:
            assert was_fenced, "a killed append was refused before its blob"
            return False
        except OperationalError as error:
            assert error.detail == KILLED, f"a real backend failure: {error!r}"
        else:
            raise AssertionError("the killed append was acknowledged")
        finally:
            self.blobs.kill_puts = False
        orphan = blob_key("turn", payload, key)
        assert self.blobs.killed == [orphan], (self.blobs.killed, orphan)
        assert orphan in self.ledger.blobs.list(PREFIX), "the killed put left no blob"
        return True

    @rule(handle=writers, payload=st.sampled_from(PAYLOADS[3:]), key=st.sampled_from(CRASH_IDS))
    def crash_mid_offload(self, handle: Handle, payload: bytes, key: str) -> None:
        """The blob is written, then the writer dies before its pointer's
        append: an orphan (unless that blob is already a live record's)."""
        replayable("crash_mid_offload", handle=f"epoch {handle.epoch}", payload=payload, key=key)
        self._killed_append(handle, payload, key)

    def _pointer_keys(self) -> dict[int, str]:
        """The blob key each stored pointer names, by sequence (a pointer
        names its blob's first generation unless GC had condemned it), read
        with the store's read-only ``query``."""
        sql = (
            "SELECT seq, blob_key, payload FROM ledger_records "
            "WHERE session_id = ? AND kind = 'blobptr' ORDER BY seq"
        )
        rows = self.store.query(sql, [SESSION]).to_pylist()
        keys = {int(r["seq"]): str(r["blob_key"]) for r in rows}
        if not self.sealed:  # the clear payload names the same key
            for r in rows:
                assert json.loads(bytes(r["payload"]))["key"] == keys[int(r["seq"])]
        return keys

    def _live_keys(self) -> set[str]:
        """The blob keys the acknowledged offloaded records name."""
        named = self._pointer_keys()
        offloaded = {row[0] for row in self.oracle.offloaded()}
        assert set(named) == offloaded, "an offloaded record has no pointer"
        return set(named.values())

    @rule(handle=writers)
    def gc(self, handle: Handle) -> None:
        """GC under ``handle``'s lease: the current writer's deletes exactly
        the orphans; a stale writer's is refused and deletes nothing."""
        listed = self.ledger.blobs.list(PREFIX)
        live = self._live_keys()
        assert live <= set(listed), "a referenced blob is missing"
        if self._stale(handle):
            try:
                self.ledger.gc(SESSION, handle.writer.lease)
            except GCLeaseNotHeldError:
                pass
            else:
                raise AssertionError("a stale writer's GC ran")
            assert self.ledger.blobs.list(PREFIX) == listed, "a refused GC deleted"
            return
        result = self.ledger.gc(SESSION, handle.writer.lease)
        assert result.deleted_keys == tuple(sorted(set(listed) - live))
        assert result.scanned == result.referenced + result.deleted == len(listed)
        assert result.referenced == len(live) and result.unreclaimable == 0
        assert self.ledger.blobs.list(PREFIX) == sorted(live), "GC deleted a referenced blob"

    @rule(target=writers, payload=st.sampled_from(PAYLOADS[3:]))
    def gc_lapses_mid_delete(self, payload: bytes) -> Handle:
        """The report's interleaving (F6): an orphan of a fresh id, then the
        current writer's GC, in whose first delete the lease lapses and
        the next owner redelivers that id, acknowledged."""
        replayable("gc_lapses_mid_delete", payload=payload)
        handle = self.current
        assert handle is not None
        if self._stale(handle):
            handle = self._take_over()
        key = f"lapse-{handle.epoch}"
        self._killed_append(handle, payload, key)
        taken: list[Handle] = []

        def lapse() -> None:
            taken.append(self._take_over())
            expected = self.oracle.expect([("turn", payload, key)])
            got = taken[0].writer.append("turn", payload, key)
            assert [(got.seq, got.duplicate)] == expected, (got, expected)
            self.oracle.commit([("turn", payload, key)])

        self.blobs.before_delete = lapse
        try:
            result = self.ledger.gc(SESSION, handle.writer.lease)
        finally:
            self.blobs.before_delete = None
        assert taken and result.deleted >= 1, (taken, result)
        listed = set(self.ledger.blobs.list(PREFIX))
        assert self._live_keys() <= listed, "GC deleted an acknowledged record's blob"
        return taken[0]

    # -- invariants ----------------------------------------------------------

    @checked
    def replay_is_what_was_acknowledged(self) -> None:
        got = [
            (r.seq, r.kind, r.idempotency_id, r.payload, r.epoch)
            for r in self.ledger.replay(SESSION, page_rows=3)
        ]
        assert got == self.oracle.rows, (got, self.oracle.rows)


def machine(opener: StoreOpener) -> type[LedgerMachine]:
    """The machine with its stores from ``opener``."""
    return bound(LedgerMachine, opener, f"LedgerMachine[{opener.name}]")
