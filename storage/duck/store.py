"""``DuckDBStore``: the store on the embedded default backend.

One file, one writing process, many threads. The domain logic is
``BaseStore``'s (``storage/store.py``, over ``storage/ops/``); this module
only opens the DuckDB :class:`~.db.Database`.
"""

from __future__ import annotations

import os

from ..backend import Clock
from ..codec import check_tenant
from ..crypto.keyring import check_provider
from ..crypto.keys import KeyProvider
from ..ops.replays import REPLAY_CACHE_BYTES
from ..store import BaseStore
from ..validate import check_bool, check_int, check_path
from .db import Database


class DuckDBStore(BaseStore):
    """A turnkeeper store in one DuckDB file (``":memory:"`` for a private one).

    ``clock`` overrides the store's clock (default: the database's clock);
    it must return aware datetimes. Opening applies pending schema
    migrations, except with ``read_only``: then the file must already have
    this turnkeeper's schema, nothing is changed, and writes raise
    ``ReadOnlyError`` (for inspecting a database; DuckDB lets several
    read-only processes share a file no writer holds).

    Raises (from the constructor):
        StoreLockedError: another process has the file open.
        StoreNotFoundError: ``read_only`` and there is no file at ``path``.
        InvalidInputError: ``path`` is not a usable path (a directory, or a new
            file in a folder that does not exist).
        ForeignDatabaseError: the file is not a DuckDB database, or holds
            another application's tables (no turnkeeper schema).
        SchemaVersionError: the file's schema is newer than this turnkeeper's,
            or older and the open is read-only.
        CorruptDatabaseError: the file or its write-ahead log is corrupt.
        DatabaseError: any other failure opening the file.
    """

    db: Database

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        read_only: bool = False,
        replay_cache_bytes: int = REPLAY_CACHE_BYTES,
        tenant: str = "",
        encryption: KeyProvider | None = None,
    ) -> None:
        check_bool(read_only, "read_only")
        cache = check_int(replay_cache_bytes, "replay_cache_bytes", 0)
        check_tenant(tenant)
        check_provider(encryption)
        super().__init__(
            Database(check_path(path), clock, read_only=read_only),
            replay_cache_bytes=cache,
            tenant=tenant,
            encryption=encryption,
        )
