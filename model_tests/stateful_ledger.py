"""A differential machine for the ledger's journal core (issue 19): writers
opened under successive leases, appends and batches by current and stale
writers, redeliveries, lease expiry, takeovers, and a damaged payload, run
against an oracle of what was acknowledged.

What it shows after every step: replay yields exactly the acknowledged
records (sequence, kind, id, payload, epoch), so no stale writer's append
landed and nothing acknowledged was lost; a writer whose lease expired or was
taken over is refused with ``LeaseLostError`` and writes nothing; a
redelivery returns the original sequence and other content under its id
conflicts; a flipped payload byte is a ``ReplayDecodeError`` at its sequence,
and nothing from it on is yielded.

Blob offload (payloads over :data:`THRESHOLD` bytes): crashes mid-offload (the
blob written, the pointer's append killed) leave orphans replay never sees;
GC by the current writer deletes exactly the blobs no acknowledged record
references (``scanned == referenced + deleted``) and never a referenced one,
GC by a stale writer is ``GCLeaseNotHeldError`` and deletes nothing; a
flipped blob byte is ``BlobIntegrityError`` and a deleted blob
``BlobUnavailableError`` at the record's sequence, nothing from it on yielded.
A record cut short by a byte is ``ReplayDecodeError`` and a record taken out
of the ledger (the tail's too) ``ReplayReadError`` at its sequence, likewise.

GC whose lease lapses mid-delete (attack finding F6): the current writer's
append of a fresh id is killed after its blob (an orphan); its GC, in its
first delete, sees its lease lapse, another owner take over and redeliver
that id (acknowledged); then the delete goes on. Every acknowledged
record's blob is still there (``condemn.py``), whatever generation its
pointer names.

``make_machine(backend)`` returns the machine class for a backend.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from conftest import close_backend, forge, open_backend
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from turnkeeper import (
    BlobIntegrityError,
    BlobUnavailableError,
    GCLeaseNotHeldError,
    LeaseLostError,
    LedgerEntry,
    LedgerIdempotencyConflictError,
    PayloadAuthenticationError,
    ReplayDecodeError,
    ReplayReadError,
)
from turnkeeper.fuzz import FakeClock
from turnkeeper.fuzz.ambiguous import ambiguously, replayable
from turnkeeper.storage.ops.ledger import blobs as blob_ops
from turnkeeper.storage.ops.ledger import journal, records

TTL = 20.0
IDS = ("a", "b", "c", "d", "e")
PAYLOADS = (b"", b"x", b"\x00\xff", b"long" * 50, b"big\x00" * 30)
THRESHOLD = 16
"""Payloads longer than this are offloaded: the last two of :data:`PAYLOADS`."""
PREFIX = blob_ops.blob_prefix("", "s")
KINDS = ("turn", "step")

Row = tuple[int, str, str, bytes, int]
"""(seq, kind, idempotency id, payload, epoch)"""


@dataclass
class Handle:
    """A writer and what the oracle knows of it."""

    writer: Any
    epoch: int
    expires_at: Any
    fenced: bool = False


@dataclass
class Oracle:
    rows: list[Row] = field(default_factory=list)
    ids: dict[str, Row] = field(default_factory=dict)
    epoch: int = 0

    def expect(self, entries: list[tuple[str, bytes, str]]) -> list[tuple[int, bool]] | str:
        """What appending ``entries`` by the current writer does: (seq, duplicate)
        per entry, or ``"conflict"`` (nothing written)."""
        seen = dict(self.ids)
        tip = len(self.rows)
        out: list[tuple[int, bool]] = []
        for kind, payload, key in entries:
            first = seen.get(key)
            if first is not None:
                if (first[1], first[3]) != (kind, payload):
                    return "conflict"
                out.append((first[0], True))
                continue
            tip += 1
            seen[key] = (tip, kind, key, payload, self.epoch)
            out.append((tip, False))
        return out

    def commit(self, entries: list[tuple[str, bytes, str]]) -> None:
        for kind, payload, key in entries:
            if key not in self.ids:
                row = (len(self.rows) + 1, kind, key, payload, self.epoch)
                self.rows.append(row)
                self.ids[key] = row


entry = st.tuples(st.sampled_from(KINDS), st.sampled_from(PAYLOADS), st.sampled_from(IDS))
inline = st.tuples(st.sampled_from(KINDS), st.sampled_from(PAYLOADS[:3]), st.sampled_from(IDS))
"""An entry stored inline: its append is the call's one write (an offloaded
one writes its blob first)."""


def outcome(fn: Any, *args: Any) -> tuple[Any, ...]:
    """A writer's append, the way :func:`ambiguous.ambiguously` reports it."""
    try:
        return ("ok", [(r.seq, r.duplicate) for r in fn(*args)])
    except LeaseLostError:
        return ("lost",)
    except LedgerIdempotencyConflictError:
        return ("conflict",)


def make_machine(backend: str = "duckdb") -> type[RuleBasedStateMachine]:
    class LedgerMachine(RuleBasedStateMachine):
        writers = Bundle("writers")

        def __init__(self) -> None:
            super().__init__()
            self.clock = FakeClock()
            self.store = open_backend(backend, None, self.clock)
            self.oracle = Oracle()
            self.owners = 0
            self.ledger = self.store.ledger.with_blobs(offload_threshold=THRESHOLD)
            self.current: Handle | None = None

        def teardown(self) -> None:
            close_backend(self.store)

        @initialize(target=writers)
        def first_writer(self) -> Handle:
            self.store.sessions.create("s")
            return self._open()

        def _open(self) -> Handle:
            self.owners += 1
            lease = self.store.leases.acquire("session:s", f"w{self.owners}", TTL)
            assert lease.epoch > self.oracle.epoch, "an epoch was granted twice"
            writer = self.ledger.open("s", lease)
            self.oracle.epoch = lease.epoch
            fence_id = f"fence:{lease.epoch}:{writer.fence_seq}"
            self.oracle.rows.append((writer.fence_seq, "fence", fence_id, b"", lease.epoch))
            assert writer.fence_seq == len(self.oracle.rows)
            self.current = Handle(writer, lease.epoch, lease.expires_at)
            return self.current

        @rule(target=writers)
        def take_over(self) -> Handle:
            """The current lease expires; another owner takes the session over."""
            self.clock.advance(TTL + 1)
            return self._open()

        @rule(seconds=st.sampled_from((1.0, 5.0, TTL)))
        def advance_clock(self, seconds: float) -> None:
            self.clock.advance(seconds)

        @rule(handle=writers, entries=st.lists(entry, min_size=1, max_size=3))
        def append(self, handle: Handle, entries: list[tuple[str, bytes, str]]) -> None:
            stale = (
                handle.fenced
                or handle.epoch != self.oracle.epoch
                or self.clock() >= handle.expires_at
            )
            before = list(self.oracle.rows)
            batch = [LedgerEntry(k, p, i) for k, p, i in entries]
            try:
                got: Any = [(r.seq, r.duplicate) for r in handle.writer.append_many(batch)]
            except LeaseLostError:
                got = "lost"
            except LedgerIdempotencyConflictError:
                got = "conflict"
            if stale:
                assert got == "lost", f"a stale writer's append was taken: {got}"
                handle.fenced = True
            else:
                expected = self.oracle.expect(entries)
                assert got == expected, (got, expected)
                if got != "conflict":
                    self.oracle.commit(entries)
            if got in ("lost", "conflict"):
                assert self.oracle.rows == before

        @rule(handle=writers, entries=st.lists(inline, min_size=1, max_size=3))
        def append_ambiguously(self, handle: Handle, entries: list[tuple[str, bytes, str]]) -> None:
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
            if expected == "conflict":
                assert got == ("conflict",), (got, expected)
                return
            assert got[0] == "ambiguous", (got, expected)
            assert got[1][0] in ("ledger_append", "ledger_append_group"), got
            self.oracle.commit(entries)
            retried = outcome(handle.writer.append_many, batch)
            again = [(seq, True) for seq, _ in expected]
            assert retried == ("ok", again), f"the retry of a committed append: {retried}, {again}"

        @rule(data=st.data())
        def flip_a_payload_byte(self, data: st.DataObject) -> None:
            """Damage one record's payload: replay fails closed at it, yielding
            only the records before it; then the damage is repaired."""
            damaged = [r for r in self.oracle.rows if r[3] and len(r[3]) <= THRESHOLD]
            if not damaged:
                return
            seq, _, _, _, _ = data.draw(st.sampled_from(damaged))
            payload = self._stored(seq)  # a sealed store's: the sealed bytes
            flipped = bytes([payload[0] ^ 0x01]) + payload[1:]
            sql = "UPDATE ledger_records SET payload = ? WHERE session_id = 's' AND seq = ?"
            forge(self.store, sql, [flipped, seq], rows=1)
            seen: list[int] = []
            try:
                for record in self.store.ledger.replay("s"):
                    seen.append(record.seq)
            except (ReplayDecodeError, PayloadAuthenticationError) as failure:
                self._failed_at(failure, seq)
            else:
                raise AssertionError(f"replay yielded a damaged record at {seq}")
            assert seen == list(range(1, seq))
            forge(self.store, sql, [payload, seq], rows=1)

        @property
        def sealed(self) -> bool:
            """Whether the store seals the ledger (an encrypted configuration)."""
            return bool(self.store.db.keyring.encrypted)

        def _stored(self, seq: int) -> bytes:
            """Record ``seq``'s payload as stored (sealed in a sealed store)."""
            rows = self.store.query(
                "SELECT payload FROM ledger_records WHERE session_id = 's' AND seq = ?", [seq]
            ).to_pylist()
            return bytes(rows[0]["payload"])

        def _failed_at(self, failure: Exception, seq: int) -> None:
            """A damaged payload at ``seq`` failed the replay there: its digest
            (clear store) or its authentication (sealed store, where every
            record is sealed: record id the sequence, field ``payload``)."""
            if self.sealed:
                assert isinstance(failure, PayloadAuthenticationError), repr(failure)
                assert (failure.session_id, failure.record_id, failure.field) == (
                    "s", str(seq), "payload",
                )  # fmt: skip
            else:
                assert isinstance(failure, ReplayDecodeError), repr(failure)
                assert failure.seq == seq, f"the wrong sequence: {failure!r}"

        @rule(data=st.data(), drop=st.booleans())
        def truncate_a_record(self, data: st.DataObject, drop: bool) -> None:
            """Cut a record's payload short by one byte, or take the record out
            of the ledger (moved to another session's key, the tail's too):
            replay fails closed at its sequence (``ReplayDecodeError`` for the
            cut payload, ``ReplayReadError`` for the missing record), yielding
            only the records before it; then the damage is repaired."""
            cuttable = [r for r in self.oracle.rows if drop or (r[3] and len(r[3]) <= THRESHOLD)]
            if not cuttable:
                return
            seq = data.draw(st.sampled_from(cuttable))[0]
            payload = self._stored(seq)
            where = "WHERE session_id = ? AND seq = ?"
            if drop:
                moved = "UPDATE ledger_records SET session_id = ? " + where
                forge(self.store, moved, ["s-moved", "s", seq], rows=1)
            else:
                cut = "UPDATE ledger_records SET payload = ? " + where
                forge(self.store, cut, [payload[:-1], "s", seq], rows=1)
            seen: list[int] = []
            try:
                for record in self.ledger.replay("s", page_rows=3):
                    seen.append(record.seq)
            except (ReplayDecodeError, ReplayReadError, PayloadAuthenticationError) as failure:
                assert isinstance(failure, ReplayReadError) == drop, (
                    f"a truncated record gave the wrong error: {failure!r}"
                )
                if drop:
                    assert failure.seq == seq, f"a dropped record gave the wrong error: {failure!r}"
                else:
                    self._failed_at(failure, seq)
            else:
                raise AssertionError(f"replay yielded past a truncated record at {seq}")
            assert seen == list(range(1, seq))
            if drop:
                forge(self.store, moved, ["s", "s-moved", seq], rows=1)
            else:
                forge(self.store, cut, [payload, "s", seq], rows=1)

        def _stale(self, handle: Handle) -> bool:
            return (
                handle.fenced
                or handle.epoch != self.oracle.epoch
                or self.clock() >= handle.expires_at
            )

        def _pointer_keys(self) -> dict[int, str]:
            """The blob key each stored pointer names, by sequence (a pointer
            names its blob's first generation unless GC had condemned it)."""
            rows = self.store.query(
                "SELECT seq, blob_key FROM ledger_records "
                "WHERE session_id = 's' AND kind = 'blobptr' ORDER BY seq"
            ).to_pylist()
            keys = {int(r["seq"]): str(r["blob_key"]) for r in rows}
            if not self.sealed:  # the clear column is the pointer's key
                for r in self.store.query(
                    "SELECT seq, payload FROM ledger_records "
                    "WHERE session_id = 's' AND kind = 'blobptr' ORDER BY seq"
                ).to_pylist():
                    assert json.loads(bytes(r["payload"]))["key"] == keys[int(r["seq"])]
            return keys

        def _live_keys(self) -> set[str]:
            """The blob keys the acknowledged offloaded records name."""
            named = self._pointer_keys()
            offloaded = {
                seq
                for seq, kind, _, payload, _ in self.oracle.rows
                if kind != "fence" and len(payload) > THRESHOLD
            }
            assert set(named) == offloaded, "an offloaded record has no pointer"
            return set(named.values())

        @rule(
            handle=writers,
            payload=st.sampled_from(PAYLOADS[3:]),
            key=st.sampled_from(("x1", "x2", "x3")),
        )
        def crash_mid_offload(self, handle: Handle, payload: bytes, key: str) -> None:
            """The blob is written, then the pointer's append is killed: an
            orphan (unless that blob is already a live record's)."""
            was_fenced = handle.fenced  # a writer refused before writes no blob
            real = journal.append

            def killed(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("killed between the blob and its pointer")

            journal.append = killed  # type: ignore[assignment]
            try:
                handle.writer.append("turn", payload, key)
            except LeaseLostError:
                assert was_fenced, "a killed append was refused before its blob"
                return
            except RuntimeError:
                pass
            else:
                raise AssertionError("the killed append was acknowledged")
            finally:
                journal.append = real  # type: ignore[assignment]
            orphan = PREFIX + records.sha256(blob_ops.envelope(LedgerEntry("turn", payload, key)))
            assert orphan in self.ledger.blobs.list(PREFIX)

        @rule(handle=writers)
        def gc(self, handle: Handle) -> None:
            listed = self.ledger.blobs.list(PREFIX)
            live = self._live_keys()
            assert live <= set(listed), "a referenced blob is missing"
            if self._stale(handle):
                try:
                    self.ledger.gc("s", handle.writer.lease)
                except GCLeaseNotHeldError:
                    pass
                else:
                    raise AssertionError("a stale writer's GC ran")
                assert self.ledger.blobs.list(PREFIX) == listed, "a refused GC deleted"
                return
            result = self.ledger.gc("s", handle.writer.lease)
            assert result.deleted_keys == tuple(sorted(set(listed) - live))
            assert result.scanned == result.referenced + result.deleted == len(listed)
            assert result.referenced == len(live) and result.unreclaimable == 0
            assert self.ledger.blobs.list(PREFIX) == sorted(live), "GC deleted a referenced blob"

        @rule(target=writers, payload=st.sampled_from(PAYLOADS[3:]))
        def gc_lapses_mid_delete(self, payload: bytes) -> Handle:
            """The report's interleaving (F6): an orphan of a fresh id, then the
            current writer's GC, in whose first delete the lease lapses and
            the next owner redelivers that id, acknowledged."""
            handle = self.current
            assert handle is not None
            if self._stale(handle):
                handle = self.take_over()
            key = f"lapse-{handle.epoch}"
            real = journal.append

            def killed(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("killed between the blob and its pointer")

            journal.append = killed  # type: ignore[assignment]
            try:
                handle.writer.append("turn", payload, key)
            except RuntimeError:
                pass
            finally:
                journal.append = real  # type: ignore[assignment]
            machine, taken = self, []

            class Lapsing:
                def put(self, k: str, data: bytes) -> None:
                    machine.ledger.blobs.put(k, data)

                def get(self, k: str) -> bytes:
                    return bytes(machine.ledger.blobs.get(k))

                def list(self, prefix: str) -> list[str]:
                    return list(machine.ledger.blobs.list(prefix))

                def delete(self, k: str) -> None:
                    if not taken:
                        taken.append(machine.take_over())
                        expected = machine.oracle.expect([("turn", payload, key)])
                        got = taken[0].writer.append("turn", payload, key)
                        assert [(got.seq, got.duplicate)] == expected, (got, expected)
                        machine.oracle.commit([("turn", payload, key)])
                    machine.ledger.blobs.delete(k)

            gc_ledger = self.store.ledger.with_blobs(Lapsing(), offload_threshold=THRESHOLD)
            result = gc_ledger.gc("s", handle.writer.lease)
            assert taken and result.deleted >= 1
            listed = set(self.ledger.blobs.list(PREFIX))
            assert self._live_keys() <= listed, "GC deleted an acknowledged record's blob"
            return taken[0]

        @rule(data=st.data(), delete=st.booleans())
        def damage_a_blob(self, data: st.DataObject, delete: bool) -> None:
            """Flip a byte of (or delete) a live record's blob: replay fails
            closed at its sequence; then the damage is repaired."""
            offloaded = [r for r in self.oracle.rows if r[1] != "fence" and len(r[3]) > THRESHOLD]
            if not offloaded:
                return
            seq = data.draw(st.sampled_from(offloaded))[0]
            name = self._pointer_keys()[seq]
            blob = self.ledger.blobs.get(name)
            if delete:
                forge(self.store, "DELETE FROM ledger_blobs WHERE key = ?", [name], rows=1)
            else:
                flipped = blob[:-1] + bytes([blob[-1] ^ 0x01])
                sql = "UPDATE ledger_blobs SET data = ? WHERE key = ?"
                forge(self.store, sql, [flipped, name], rows=1)
            seen: list[int] = []
            try:
                for record in self.ledger.replay("s", page_rows=3):
                    seen.append(record.seq)
            except (
                BlobIntegrityError,
                BlobUnavailableError,
                PayloadAuthenticationError,
            ) as failure:
                assert isinstance(failure, BlobUnavailableError) == delete, repr(failure)
                if isinstance(failure, PayloadAuthenticationError):  # a sealed blob flipped
                    assert self.sealed and not delete
                    assert (failure.record_id, failure.field) == (name, "data")
                else:
                    assert not self.sealed or delete, repr(failure)
                    assert (failure.seq, failure.key) == (seq, name)
            else:
                raise AssertionError(f"replay yielded a damaged blob at {seq}")
            assert seen == list(range(1, seq))
            self.ledger.blobs.delete(name)
            self.ledger.blobs.put(name, blob)

        @invariant()
        def replay_is_what_was_acknowledged(self) -> None:
            got = [
                (r.seq, r.kind, r.idempotency_id, r.payload, r.epoch)
                for r in self.ledger.replay("s", page_rows=3)
            ]
            assert got == self.oracle.rows

    LedgerMachine.__name__ = f"LedgerMachine_{backend}"
    return LedgerMachine
