"""The differential state machine: simulated owners race for leases and
finalize thread records against the store and the oracle, on an injected clock.

Each rule is one explicit step Hypothesis can shrink ("A acquires t1",
"clock +2 s", "A finalizes with its lost lease"). After every step the
invariants are checked against the store's own tables:

- at most one unexpired holder per target (among every lease any owner was
  ever given, at most one per target still passes the store's fence);
- epochs strictly increase per grant;
- no finalize or append commits under a lost lease (the oracle agrees with
  every outcome, and a success under an invalid lease fails the step);
- at most one active thread record per key.

``machine(opener)`` returns the machine class with its stores from
``opener``; the fence kill tests run the same class with one fence patched out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, MultipleResults, consumes, initialize, multiple, rule

import turnkeeper
from turnkeeper import (
    AlreadyExistsError,
    BusyError,
    FinalizeRequest,
    InvalidInputError,
    InvalidTransitionError,
    LeaseLostError,
    LeasePurposeError,
    RecordNotActiveError,
    RecordNotFoundError,
    ThreadRecord,
)

from .ambiguous import ambiguously, replayable
from .base import FuzzMachine, bound, checked
from .opener import StoreOpener
from .oracle import Oracle, Outcome

OWNERS = ("A", "B", "C")
TARGETS = ("session:s1", "session:s2")
SESSIONS = {"session:s1": "s1", "session:s2": "s2"}
KEYS = ("k1", "k2")
RECORDS = ("r1", "r2", "r3", "r4")
TTLS = (1.0, 2.0, 5.0)
PURPOSES = ("execution", "mutation")


@dataclass(frozen=True)
class Held:
    """A lease some owner was given (possibly long lost)."""

    lease: turnkeeper.Lease

    @property
    def ident(self) -> tuple[str, str, int]:
        return (self.lease.target, self.lease.owner, self.lease.epoch)


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """Run a store call and express its result the oracle's way: ``("ok",
    value)`` or the refusal's kind and field; other errors propagate."""
    try:
        return ("ok", fn(*args, **kwargs))
    except BusyError as e:
        return ("busy", e.holder)
    except LeasePurposeError as e:
        return ("purpose", e.held_purpose)
    except LeaseLostError as e:
        return ("lost", e.target)
    except AlreadyExistsError as e:
        return ("exists", e.key)
    except RecordNotFoundError as e:
        return ("not_found", e.record_id)
    except RecordNotActiveError as e:
        return ("not_active", e.record_id)
    except InvalidTransitionError:
        return ("transition", None)
    except InvalidInputError as e:
        return ("invalid", e.field)


class LeaseAndThreadMachine(FuzzMachine):
    """Owners A, B, C racing for two session leases and finalizing thread records."""

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.oracle = Oracle()
        self.given: list[Held] = []
        self.grants: dict[str, list[int]] = {t: [] for t in TARGETS}

    @initialize()
    def sessions(self) -> None:
        for sid in SESSIONS.values():
            self.store.sessions.create(sid)

    # -- steps -------------------------------------------------------------

    @rule(
        target=leases,
        owner=st.sampled_from(OWNERS),
        tgt=st.sampled_from(TARGETS),
        ttl=st.sampled_from(TTLS),
        purpose=st.sampled_from(PURPOSES),
    )
    def acquire(
        self, owner: str, tgt: str, ttl: float, purpose: str
    ) -> Held | MultipleResults[Held]:
        expected = self.oracle.acquire(tgt, owner, ttl, purpose, self.clock())
        got = outcome(self.store.leases.acquire, tgt, owner, ttl, purpose=purpose)
        if got[0] == "ok":
            lease = got[1]
            kind = "granted" if expected[0] == "granted" else "reacquired"
            assert (kind, lease.epoch) == expected, (got, expected)
            if kind == "granted":
                assert all(lease.epoch > e for e in self.grants[tgt]), "epoch reused"
                self.grants[tgt].append(lease.epoch)
            held = Held(lease)
            self.given.append(held)
            return held
        assert got == expected, (got, expected)
        return multiple()

    @rule(held=leases, ttl=st.sampled_from(TTLS))
    def renew(self, held: Held, ttl: float) -> None:
        expected = self.oracle.renew(*held.ident, ttl, self.clock())
        got = outcome(self.store.leases.renew, held.lease, ttl)
        if got[0] == "ok":
            got = ("renewed", got[1].epoch)
        assert got == expected, (got, expected)

    @rule(held=consumes(leases))
    def release(self, held: Held) -> None:
        expected = self.oracle.release(*held.ident, self.clock())
        got = ("released", self.store.leases.release(held.lease))
        assert got == expected, (got, expected)

    @rule(
        target=leases,
        owner=st.sampled_from(OWNERS),
        tgt=st.sampled_from(TARGETS),
        ttl=st.sampled_from(TTLS),
        purpose=st.sampled_from(PURPOSES),
    )
    def acquire_ambiguously(
        self, owner: str, tgt: str, ttl: float, purpose: str
    ) -> Held | MultipleResults[Held]:
        """An acquire that commits while its caller sees a lost connection,
        then the runtime's retry: the same owner and purpose re-acquire the
        lease it was granted (the same epoch, no second grant); a refusal
        commits nothing and is the oracle's."""
        replayable("acquire_ambiguously", owner=owner, tgt=tgt, ttl=ttl, purpose=purpose)
        expected = self.oracle.acquire(tgt, owner, ttl, purpose, self.clock())
        got = ambiguously(
            self.store, outcome, self.store.leases.acquire, tgt, owner, ttl, purpose=purpose
        )
        if expected[0] not in ("granted", "reacquired"):
            assert got == expected, (got, expected)
            return multiple()
        assert got == ("ambiguous", ("acquire_lease",)), (got, expected)
        if expected[0] == "granted":
            self.grants[tgt].append(expected[1])
        retry = self.oracle.acquire(tgt, owner, ttl, purpose, self.clock())
        assert retry == ("reacquired", expected[1]), (retry, expected)
        got = outcome(self.store.leases.acquire, tgt, owner, ttl, purpose=purpose)
        assert got[0] == "ok", f"the retry of a committed acquire: {got}, oracle {retry}"
        assert ("reacquired", got[1].epoch) == retry, (got, retry)
        held = Held(got[1])
        self.given.append(held)
        return held

    @rule(held=leases, ttl=st.sampled_from(TTLS))
    def renew_ambiguously(self, held: Held, ttl: float) -> None:
        """A renewal committed but reported lost to its caller, then retried:
        the retry renews the same epoch again."""
        replayable("renew_ambiguously", held=held.ident, ttl=ttl)
        expected = self.oracle.renew(*held.ident, ttl, self.clock())
        got = ambiguously(self.store, outcome, self.store.leases.renew, held.lease, ttl)
        if expected[0] != "renewed":
            assert got == expected, (got, expected)
            return
        assert got == ("ambiguous", ("renew_lease",)), (got, expected)
        retry = self.oracle.renew(*held.ident, ttl, self.clock())
        got = outcome(self.store.leases.renew, held.lease, ttl)
        if got[0] == "ok":
            got = ("renewed", got[1].epoch)
        assert got == retry, (got, retry)

    @rule(held=consumes(leases))
    def release_ambiguously(self, held: Held) -> None:
        """A release committed but reported lost, then retried: the retry is
        a no-op (``False``: nothing held to release), never an error."""
        replayable("release_ambiguously", held=held.ident)
        expected = self.oracle.release(*held.ident, self.clock())
        got = ambiguously(self.store, outcome, self.store.leases.release, held.lease)
        assert got == ("ambiguous", ("release_lease",)), (got, expected)
        retry = self.oracle.release(*held.ident, self.clock())
        assert retry == ("released", False), retry
        got = outcome(self.store.leases.release, held.lease)
        assert got == ("ok", False), (got, retry)

    @rule(seconds=st.sampled_from((0.5, 1.0, 2.0, 3.0)))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(held=leases, session=st.sampled_from(sorted(SESSIONS.values())))
    def append_under_lease(self, held: Held, session: str) -> None:
        if SESSIONS[held.lease.target] != session:
            expected: Outcome = ("invalid", "lease")  # a lease fences its own target only
        else:
            expected = self.oracle.append(session, held.ident, self.clock())
        payload = {"message": {"role": "user", "content": "x"}}
        got = outcome(self.store.sessions.append, session, "message", payload, lease=held.lease)
        if got[0] == "ok":
            assert expected[0] == "appended", f"append committed under a lost lease {held}"
            got = ("appended", got[1].seq)
        assert got == expected, (got, expected)

    @rule(
        held=leases,
        session=st.sampled_from(sorted(SESSIONS.values())),
        n=st.integers(min_value=1, max_value=4),
    )
    def append_many_under_lease(self, held: Held, session: str, n: int) -> None:
        """A batch: all ``n`` entries under one fence, or none of them."""
        if SESSIONS[held.lease.target] != session:
            expected: Outcome = ("invalid", "lease")
        else:
            expected = self.oracle.append(session, held.ident, self.clock(), n)
        batch = [("message", {"message": {"role": "user", "content": c}}) for c in "abcd"[:n]]
        got = outcome(self.store.sessions.append_many, session, batch, lease=held.lease)
        if got[0] == "ok":
            assert expected[0] == "appended", f"batch committed under a lost lease {held}"
            seqs = [e.seq for e in got[1]]
            assert seqs == list(range(seqs[0], seqs[0] + n)), seqs
            got = ("appended", seqs[-1])
        assert got == expected, (got, expected)

    @rule(
        held=st.lists(leases, max_size=2, unique_by=lambda h: h.lease.target),
        rid=st.sampled_from(RECORDS),
        key=st.sampled_from(KEYS),
        previous=st.sampled_from((None, *RECORDS)),
        rebind=st.booleans(),
        require_absent=st.booleans(),
    )
    def finalize(
        self,
        held: list[Held],
        rid: str,
        key: str,
        previous: str | None,
        rebind: bool,
        require_absent: bool,
    ) -> None:
        archive_old = previous is not None and previous != rid
        req = FinalizeRequest(
            ThreadRecord(rid, key, state={"step": len(self.given)}),
            previous_id=previous if archive_old else None,
            held_leases=[h.lease for h in held],
            archive_old=archive_old,
            rebind_active=rebind,
            require_key_absent=require_absent,
        )
        expected = self.oracle.finalize(
            rid,
            key,
            [h.ident for h in held],
            req.previous_id,
            archive_old,
            rebind,
            require_absent,
            self.clock(),
        )
        got = outcome(self.store.threads.finalize, req)
        if got[0] == "ok":
            assert expected[0] == "saved", f"finalize committed, oracle says {expected}"
            got = ("saved", got[1].id)
        elif got[0] == "transition":
            got = ("transition", rid)
        assert got == expected, (got, expected)

    @rule(
        rid=st.sampled_from(RECORDS),
        key=st.sampled_from(KEYS),
        by_key=st.booleans(),
        include_archived=st.booleans(),
    )
    def resolve(self, rid: str, key: str, by_key: bool, include_archived: bool) -> None:
        q = {"key": key} if by_key else {"id": rid}
        expected = self.oracle.resolve(q.get("id"), q.get("key"), include_archived)
        found = self.store.threads.resolve(include_archived=include_archived, **q)
        got = ("none",) if found is None else ("record", found.id, found.key, found.status)
        assert got == expected, (got, expected)

    # -- invariants ----------------------------------------------------------

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self.store.db.read("test-query", lambda tx: tx.rows(sql))

    @checked
    def at_most_one_unexpired_holder_per_target(self) -> None:
        passing: dict[str, set[int]] = {}
        for ident, held in {h.ident: h for h in self.given}.items():
            try:
                self.store.leases.validate(held.lease)
            except LeaseLostError:
                continue
            passing.setdefault(ident[0], set()).add(ident[2])
        for target, epochs in passing.items():
            assert len(epochs) <= 1, f"{target}: several live holders {sorted(epochs)}"

    @checked
    def epochs_increase_and_one_active_record_per_key(self) -> None:
        grants: dict[str, list[int]] = {}
        for target, epoch in self.rows(
            "SELECT target, epoch FROM lease_events "
            "WHERE edge IN ('grant', 'regrant', 'takeover') ORDER BY occurred_at, epoch"
        ):
            grants.setdefault(target, []).append(epoch)
        for target, epochs in grants.items():
            assert epochs == list(range(1, len(epochs) + 1)), (target, epochs)
        doubled = self.rows(
            "SELECT key, count(*) FROM thread_records WHERE status = 'active' "
            "GROUP BY key HAVING count(*) > 1"
        )
        assert doubled == [], f"several active records per key: {doubled}"
        unbound = self.rows(
            "SELECT r.key, r.id FROM thread_records r WHERE r.status = 'active' "
            "AND NOT EXISTS (SELECT 1 FROM active_thread_keys k "
            "WHERE k.key = r.key AND k.record_id = r.id)"
        )
        assert unbound == [], f"active records the key does not point at: {unbound}"


def machine(opener: StoreOpener) -> type[LeaseAndThreadMachine]:
    """The machine with its stores from ``opener``."""
    return bound(LeaseAndThreadMachine, opener, f"LeaseAndThreadMachine[{opener.name}]")
