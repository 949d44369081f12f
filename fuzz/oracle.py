"""A plain-Python oracle for leases and thread records (what the store must answer).

It states what the store must answer, with no SQL and no concurrency: the
stateful tests apply every step to the store and to the oracle and require
the same outcome. Outcomes are tuples like ``("granted", epoch)`` or
``("busy", holder)`` so that a disagreement prints readably.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

Outcome = tuple[Any, ...]
"""An outcome: its kind first (``"granted"``, ``"busy"``, ``"lost"`` …), then its values."""


@dataclass
class OracleLease:
    """A lease as the oracle holds it (``expires_at``: an aware datetime)."""

    owner: str
    epoch: int
    purpose: str
    expires_at: datetime
    held: bool = True


@dataclass
class Oracle:
    """Leases by target, thread records by id, the active record per key and
    the entry count per session. Each method applies one store call to the
    model and returns its :data:`Outcome`; none raises."""

    leases: dict[str, OracleLease] = field(default_factory=dict)
    records: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (key, status)
    bound: dict[str, str] = field(default_factory=dict)  # key -> active record id
    entries: dict[str, int] = field(default_factory=dict)  # session -> entry count
    times: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)
    """record id -> (created_at, updated_at), as the store stamps them."""

    def live(self, target: str, now: datetime) -> OracleLease | None:
        """The unexpired, held lease on ``target`` at ``now``, else ``None``."""
        cur = self.leases.get(target)
        return cur if cur is not None and cur.held and now < cur.expires_at else None

    def acquire(
        self, target: str, owner: str, ttl_s: float, purpose: str, now: datetime
    ) -> Outcome:
        """``("granted", epoch)``, ``("reacquired", epoch)``, ``("busy", holder)``
        or ``("purpose", held)``; ``ttl_s`` in seconds."""
        cur = self.leases.get(target)
        expiry = now + timedelta(seconds=ttl_s)
        live = self.live(target, now)
        if live is not None:
            if live.owner != owner:
                return ("busy", live.owner)
            if live.purpose != purpose:
                return ("purpose", live.purpose)
            live.expires_at = expiry
            return ("reacquired", live.epoch)
        epoch = (cur.epoch if cur else 0) + 1
        self.leases[target] = OracleLease(owner, epoch, purpose, expiry)
        return ("granted", epoch)

    def valid(self, target: str, owner: str, epoch: int, now: datetime) -> bool:
        """Whether ``owner``'s lease of ``epoch`` on ``target`` passes the fence at ``now``."""
        live = self.live(target, now)
        return live is not None and live.owner == owner and live.epoch == epoch

    def renew(self, target: str, owner: str, epoch: int, ttl_s: float, now: datetime) -> Outcome:
        """``("renewed", epoch)`` or ``("lost", target)``; ``ttl_s`` in seconds."""
        if not self.valid(target, owner, epoch, now):
            return ("lost", target)
        self.leases[target].expires_at = now + timedelta(seconds=ttl_s)
        return ("renewed", epoch)

    def release(self, target: str, owner: str, epoch: int, now: datetime) -> Outcome:
        """``("released", True)`` when the lease was held, else ``("released", False)``."""
        cur = self.leases.get(target)
        if cur is None or not cur.held or cur.owner != owner or cur.epoch != epoch:
            return ("released", False)
        cur.held = False
        cur.expires_at = min(cur.expires_at, now)
        return ("released", True)

    def append(
        self, session: str, lease: tuple[str, str, int] | None, now: datetime, n: int = 1
    ) -> Outcome:
        """An append of ``n`` entries in one write: all under a valid lease, or none."""
        if lease is not None and not self.valid(*lease, now):
            return ("lost", lease[0])
        self.entries[session] = self.entries.get(session, 0) + n
        return ("appended", self.entries[session])

    def finalize(
        self,
        rid: str,
        key: str,
        held: list[tuple[str, str, int]],
        previous: str | None,
        archive_old: bool,
        rebind: bool,
        require_absent: bool,
        now: datetime,
    ) -> Outcome:
        """A thread record saved (``("saved", rid)``) under every lease in
        ``held``, or the refusal the store gives."""
        for target, owner, epoch in held:
            if not self.valid(target, owner, epoch, now):
                return ("lost", target)
        bound = self.bound.get(key)
        if require_absent and bound is not None:
            return ("exists", key)
        archived: list[str] = []
        if archive_old:
            assert previous is not None
            prev = self.records.get(previous)
            if prev is None:
                return ("not_found", previous)
            if prev[1] != "active":
                return ("not_active", previous)
            archived.append(previous)
            if prev[0] == key and bound == previous:
                bound = None
        current = self.records.get(rid)
        if current is not None and current[0] != key:
            return ("invalid", "record.key")
        if current is not None and current[1] == "archived":
            return ("transition", rid)
        if not (rebind or bound in (None, rid)):
            return ("exists", key)
        # commit
        for old in archived:
            okey = self.records[old][0]
            self.records[old] = (okey, "archived")
            self.times[old] = (self.times[old][0], now)
            if self.bound.get(okey) == old:
                del self.bound[okey]
        if bound is not None and bound != rid:
            self.records[bound] = (key, "archived")
            self.times[bound] = (self.times[bound][0], now)
        self.records[rid] = (key, "active")
        self.times[rid] = (self.times.get(rid, (now, now))[0], now)
        self.bound[key] = rid
        return ("saved", rid)

    def resolve(self, rid: str | None, key: str | None, include_archived: bool) -> Outcome:
        """``("record", id, key, status)`` or ``("none",)``."""
        if key is not None:
            rid = self.bound.get(key)
            if rid is None and include_archived:
                # every record of the key archived: the one archived last
                # (updated_at, then created_at, then the greatest id)
                mine = [r for r, (k, _) in self.records.items() if k == key]
                rid = max(mine, key=lambda r: (*self.times[r][::-1], r), default=None)
            if rid is None:
                return ("none",)
        assert rid is not None
        rec = self.records.get(rid)
        if rec is None or (rec[1] == "archived" and not include_archived):
            return ("none",)
        return ("record", rid, rec[0], rec[1])
