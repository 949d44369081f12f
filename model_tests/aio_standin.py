"""TEMPORARY, tests only: a thin async stand-in for turnkeeper.aio until it lands on
main (then removed). Each area method runs the sync one in a thread; path_latest is
computed from the whole session until h/reads lands."""

from __future__ import annotations

import asyncio
from typing import Any

import turnkeeper


class _Area:
    def __init__(self, area: Any) -> None:
        self._area = area

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._area, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(fn, *args, **kwargs)

        return call


class _Sessions(_Area):
    async def path_latest(self, session_id: str, limit: int) -> list[Any]:
        def read() -> list[Any]:
            s = self._area
            row = s.get(session_id)
            if row is None:
                raise turnkeeper.SessionNotFoundError(session_id)
            by_id = {e.id: e for e in s.entries(session_id)}
            out = []
            node = row.leaf_id
            while node is not None and len(out) < limit:
                out.append(by_id[node])
                node = by_id[node].parent_id
            return out[::-1]

        return await asyncio.to_thread(read)


class AsyncStore:
    def __init__(self, sync: turnkeeper.BaseStore) -> None:
        self.sync = sync
        self.sessions = _Sessions(sync.sessions)
        self.bindings = _Area(sync.bindings)
        self.leases = _Area(sync.leases)

    @classmethod
    def wrap(cls, sync: turnkeeper.BaseStore) -> AsyncStore:
        return cls(sync)
