"""TEMPORARY, tests only, until ``sessions.path_latest`` (branch h/reads) lands on main:
``wrap`` is ``turnkeeper.aio.AsyncStore.wrap`` plus an interim ``path_latest`` read from
the whole session. Removed when the real read lands."""

from __future__ import annotations

from typing import Any

import turnkeeper
import turnkeeper.aio


def wrap(sync: turnkeeper.BaseStore) -> turnkeeper.aio.AsyncStore:
    store = turnkeeper.aio.AsyncStore.wrap(sync)
    if not hasattr(store.sessions, "path_latest"):

        def read(session_id: str, limit: int, leaf_id: str | None) -> list[Any]:
            row = sync.sessions.get(session_id)
            if row is None:
                raise turnkeeper.SessionNotFoundError(session_id)
            by_id = {e.id: e for e in sync.sessions.entries(session_id)}
            out = []
            node = row.leaf_id if leaf_id is None else leaf_id
            while node is not None and len(out) < limit:
                out.append(by_id[node])
                node = by_id[node].parent_id
            return out[::-1]

        async def path_latest(
            session_id: str, limit: int, *, leaf_id: str | None = None
        ) -> list[Any]:
            return await store.runner(read, session_id, limit, leaf_id)

        store.sessions.path_latest = path_latest  # type: ignore[attr-defined]
    return store
