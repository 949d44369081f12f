"""What every audit check shares: the result record, the scope of sessions a
check looks at, and the query helpers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from turnkeeper.storage.store import Snapshot

SAMPLE = 5
"""How many offending ids a check quotes in its detail."""


@dataclass(frozen=True, slots=True)
class Check:
    """One audit result: ``violations`` offending items out of ``checked`` examined."""

    name: str
    description: str
    violations: int
    checked: int
    detail: str = ""

    @property
    def passed(self) -> bool:
        """Whether the check found no violation."""
        return self.violations == 0

    def as_dict(self) -> dict[str, Any]:
        """The result as a JSON-ready dict (with ``passed``)."""
        return {**asdict(self), "passed": self.passed}


class Scope:
    """SQL fragments restricting a query to some sessions (or to everything)."""

    def __init__(self, sessions: Sequence[str] | None) -> None:
        self.sessions = None if sessions is None else list(sessions)

    def cte(self) -> str:
        """A ``scope(sid)`` CTE body (takes one parameter when scoped)."""
        if self.sessions is None:
            return "scope AS (SELECT id AS sid FROM sessions)"
        return "scope AS (SELECT unnest(?::VARCHAR[]) AS sid)"

    def params(self) -> list[Any]:
        """The parameters :meth:`cte` needs."""
        return [] if self.sessions is None else [self.sessions]

    def sessions_in(self, column: str) -> str:
        """A predicate: ``column`` (a session id or thread key) is in scope."""
        return f"{column} IN (SELECT sid FROM scope)"

    def keys_in(self, column: str) -> str:
        """A predicate on thread keys: in scope, or anything when unscoped."""
        return "TRUE" if self.sessions is None else self.sessions_in(column)

    def targets_in(self, column: str) -> str:
        """A predicate on lease targets: ``session:<id>`` in scope, or anything."""
        if self.sessions is None:
            return "TRUE"
        return f"{column} IN (SELECT 'session:' || sid FROM scope)"


def one_line(text: str) -> str:
    """``text`` collapsed to a single line (backend messages can span several)."""
    return " ".join(text.split())


def rows(store: Snapshot, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = store.query(sql, params).to_pylist()
    return rows


def sample(ids: Sequence[Any]) -> str:
    shown = ", ".join(str(i) for i in list(ids)[:SAMPLE])
    more = len(ids) - SAMPLE
    return f"{shown} (+{more} more)" if more > 0 else shown
