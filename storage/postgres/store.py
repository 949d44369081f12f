"""``PostgresStore``: the store on PostgreSQL, for many worker processes and hosts.

The domain logic is ``BaseStore``'s (``storage/store.py``, over
``storage/ops/``); this module only opens the PostgreSQL
:class:`~.db.Database` (a pool of connections to one server and schema).
"""

from __future__ import annotations

from ..backend import Clock
from ..codec import check_text
from ..ops.replays import REPLAY_CACHE_BYTES
from ..store import BaseStore
from ..validate import check_bool, check_int
from .db import Database


class PostgresStore(BaseStore):
    """A turnkeeper store in a PostgreSQL database (one schema of it).

    ``url`` is a ``postgresql://`` URL or a libpq connection string (the
    ``options`` parameter may set ``search_path`` to use another schema than
    ``public``). ``clock`` overrides the store's clock (default: the server's,
    never a client's); ``read_only`` runs no migrations and refuses writes
    with ``ReadOnlyError``; ``pool_size`` bounds the connections this store
    object opens (threads beyond it wait for one).

    Raises (from the constructor):
        OperationalError: the server cannot be reached or refused the login.
        ForeignDatabaseError: the schema holds another application's tables.
        SchemaVersionError: the schema is newer than this turnkeeper's, or
            older and the open is read-only.
        DatabaseError: any other failure opening the store.
    """

    db: Database

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        read_only: bool = False,
        pool_size: int = 8,
        replay_cache_bytes: int = REPLAY_CACHE_BYTES,
    ) -> None:
        check_text(url, "url", allow_empty=False)
        check_bool(read_only, "read_only")
        check_int(pool_size, "pool_size", 1)
        cache = check_int(replay_cache_bytes, "replay_cache_bytes", 0)
        super().__init__(
            Database(url, clock, read_only=read_only, pool_size=pool_size),
            replay_cache_bytes=cache,
        )
