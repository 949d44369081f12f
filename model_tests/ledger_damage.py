"""The ledger machine the test suite runs: the shipped one
(``turnkeeper.fuzz.ledger``, what ``turnkeeper fuzz --machine ledger`` races
through the public API) plus damage rules that forge raw writes to the
store's tables (``conftest.forge``: test-only, never shipped).

Each damage rule breaks one stored thing, checks that replay fails closed
at it, yielding only the records before it, and repairs it:

- a flipped payload byte is a ``ReplayDecodeError`` at its sequence (a
  sealed store: ``PayloadAuthenticationError`` naming it);
- a record cut short by a byte is ``ReplayDecodeError``, a record taken out
  of the ledger (the tail's too) ``ReplayReadError``, at its sequence;
- a flipped blob byte is ``BlobIntegrityError`` and a deleted blob
  ``BlobUnavailableError`` at the record's sequence.

``machine(opener)`` returns the class with its stores from ``opener``;
``make_machine(backend)`` on the test store configuration ``backend``.
"""

from __future__ import annotations

from conftest import forge, opener
from hypothesis import strategies as st
from hypothesis.stateful import rule

from turnkeeper import (
    BlobIntegrityError,
    BlobUnavailableError,
    PayloadAuthenticationError,
    ReplayDecodeError,
    ReplayReadError,
)
from turnkeeper.fuzz.base import bound
from turnkeeper.fuzz.ledger import LedgerMachine
from turnkeeper.fuzz.ledger_model import THRESHOLD
from turnkeeper.fuzz.opener import StoreOpener


class DamagedLedgerMachine(LedgerMachine):
    """:class:`~turnkeeper.fuzz.ledger.LedgerMachine` with the test suite's
    damage rules (raw SQL through ``conftest.forge``)."""

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
        moved = "UPDATE ledger_records SET session_id = ? " + where
        cut = "UPDATE ledger_records SET payload = ? " + where
        if drop:
            forge(self.store, moved, ["s-moved", "s", seq], rows=1)
        else:
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

    @rule(data=st.data(), delete=st.booleans())
    def damage_a_blob(self, data: st.DataObject, delete: bool) -> None:
        """Flip a byte of (or delete) a live record's blob: replay fails
        closed at its sequence; then the damage is repaired."""
        offloaded = self.oracle.offloaded()
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


def machine(opener: StoreOpener) -> type[DamagedLedgerMachine]:
    """The damaged machine with its stores from ``opener``."""
    return bound(DamagedLedgerMachine, opener, f"DamagedLedgerMachine[{opener.name}]")


def make_machine(backend: str = "duckdb") -> type[DamagedLedgerMachine]:
    """The damaged machine on the test store configuration ``backend``."""
    return machine(opener(backend))
