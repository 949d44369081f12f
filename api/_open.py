"""``open_store``: the one way in (re-exported by :mod:`turnkeeper`)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import datetime

from turnkeeper.spec.errors import InvalidInputError, NotSupportedError
from turnkeeper.storage import BaseStore, DuckDBStore
from turnkeeper.storage.crypto import KeyProvider
from turnkeeper.storage.ops.replays import REPLAY_CACHE_BYTES

DEFAULT_PATH = "turnkeeper.duckdb"
"""The embedded default database file, in the current directory."""

DB_ENV = "TURNKEEPER_DB"
"""The environment variable the CLI's ``--db`` defaults to: a DuckDB file path
or a PostgreSQL URL."""

_LIBPQ_KEYWORD = re.compile(
    r"^\s*(host|hostaddr|port|dbname|user|password|service|pooler|listen_url)\s*="
)


def is_postgres(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` names a PostgreSQL database (a ``postgresql://`` or
    ``postgres://`` URL, or a libpq ``key=value`` connection string) rather
    than a DuckDB file."""
    text = os.fspath(target)
    if not isinstance(text, str):
        return False
    return text.startswith(("postgresql://", "postgres://")) or bool(_LIBPQ_KEYWORD.match(text))


def open_store(
    path: str | os.PathLike[str] = DEFAULT_PATH,
    *,
    clock: Callable[[], datetime] | None = None,
    read_only: bool = False,
    replay_cache_bytes: int = REPLAY_CACHE_BYTES,
    pooler: str | None = None,
    listen_url: str | None = None,
    pool_timeout_s: float | None = None,
    reconnect_delay_s: float | None = None,
    reconnect_max_delay_s: float | None = None,
    tenant: str = "",
    encryption: KeyProvider | None = None,
) -> BaseStore:
    """Open (creating if needed) the store at ``path``: a DuckDB file (the
    embedded default; ``":memory:"`` for a private one), or a PostgreSQL
    database given as a ``postgresql://`` URL or a libpq connection string
    (``pip install 'turnkeeper[postgres]'``; its ``options`` may set
    ``search_path`` for a schema of its own).

    ``clock`` replaces the database clock (tests); it returns aware datetimes.
    ``read_only`` opens an existing store for inspection: no migrations, and
    every write raises ``ReadOnlyError``. ``replay_cache_bytes`` bounds the
    store object's replay cache, in bytes of cached message JSON (default
    64 MiB; 0 turns it off): a replay of a session unchanged since its last
    replay decodes the cached messages without reading an entry, and one
    that grew along its branch reads only the new entries.

    ``tenant`` is the tenant this store files ledger records under and the
    only one its ledger reads (``store.ledger``, the sessionstore seed's
    WithTenant; ``""`` by default; ``store.ledger.with_tenant`` serves
    another one through the same store).

    ``encryption`` turns on encryption at rest (``pip install
    'turnkeeper[encryption]'``): a :class:`~turnkeeper.KeyProvider` such as
    ``turnkeeper.LocalKeyProvider.from_env()`` (the master key in
    ``TURNKEEPER_MASTER_KEY``). Each session created from then on gets a
    random data key, wrapped by the provider and stored beside it; its entry
    payloads are sealed with AES-256-GCM under that key. The first such open
    marks the store encrypted: opened later without a provider it still
    serves metadata, but payload reads and writes of sealed sessions, and new
    sessions, raise ``KeyUnavailableError`` (README "Encryption at rest").

    PostgreSQL behind a connection pooler (PgBouncer …): ``pooler`` is
    ``"transaction"`` (the pooler lends a server connection per transaction:
    the store prepares no statements and keeps no session state),
    ``"session"``, or ``None`` to detect one at open (a detected pooler is
    taken to pool transactions); ``listen_url`` is a direct URL to the same
    server and database for wake-ups (``LISTEN``), which a transaction
    pooler cannot carry. Both may instead be parameters of the URL
    (``?pooler=transaction&listen_url=…``, the latter percent-encoded).

    PostgreSQL's lost connections (a restart, a failover; ``None`` keeps the
    default): ``pool_timeout_s`` is how long an operation waits for a
    connection before ``OperationalError`` (30 s); a lost connection is made
    again ``reconnect_delay_s`` after a failed attempt (0.1 s), doubling per
    failure up to ``reconnect_max_delay_s`` (0.5 s), so writes resume at most
    about that long after the server takes connections again.

    Raises:
        StoreLockedError: (DuckDB) another process has the file open.
        StoreNotFoundError: (DuckDB) ``read_only`` and no file exists at ``path``.
        InvalidInputError: ``path`` is not a usable path (a directory, a new
            file in a folder that does not exist, or a URL of another scheme);
            a PostgreSQL option given for a DuckDB file, or out of range; or
            ``tenant`` is neither ``""`` nor an id (no control or invisible
            characters, at most 512 bytes); ``encryption`` is not a key provider.
        ForeignDatabaseError: not a turnkeeper database (not a DuckDB file, or
            another application's tables).
        SchemaVersionError: the store was written by a newer turnkeeper, or
            (read-only) needs a migration.
        CorruptDatabaseError: (DuckDB) the file or its write-ahead log is
            corrupt (the message says which and what to do).
        OperationalError: (PostgreSQL) the server cannot be reached.
        PoolerError: (PostgreSQL) a pooler refused the URL's ``options``, or
            its connections are not in the schema they name.
        NotSupportedError: a PostgreSQL URL, and ``psycopg`` is not installed.
        DatabaseError: any other failure opening the store.
    """
    if isinstance(path, str) and is_postgres(path):
        try:
            from turnkeeper.storage.postgres import PostgresStore
        except ImportError as exc:
            raise NotSupportedError(
                detail="PostgreSQL needs psycopg: pip install 'turnkeeper[postgres]'"
            ) from exc
        from turnkeeper.storage.postgres import pool

        return PostgresStore(
            path,
            clock=clock,
            read_only=read_only,
            replay_cache_bytes=replay_cache_bytes,
            pooler=pooler,
            listen_url=listen_url,
            pool_timeout_s=pool.POOL_TIMEOUT_S if pool_timeout_s is None else pool_timeout_s,
            reconnect_delay_s=(
                pool.RECONNECT_DELAY_S if reconnect_delay_s is None else reconnect_delay_s
            ),
            reconnect_max_delay_s=(
                pool.RECONNECT_MAX_DELAY_S
                if reconnect_max_delay_s is None
                else reconnect_max_delay_s
            ),
            tenant=tenant,
            encryption=encryption,
        )
    for name, value in (("pooler", pooler), ("listen_url", listen_url)):
        if value is not None:
            raise InvalidInputError(name, "only a PostgreSQL store connects through a pooler")
    for name, timing in (
        ("pool_timeout_s", pool_timeout_s),
        ("reconnect_delay_s", reconnect_delay_s),
        ("reconnect_max_delay_s", reconnect_max_delay_s),
    ):
        if timing is not None:
            raise InvalidInputError(name, "only a PostgreSQL store has a connection pool")
    if isinstance(path, str) and _URL_SCHEME.match(path):
        scheme = path.split(":", 1)[0]
        raise InvalidInputError(
            "path",
            f"{scheme}:// is not a store turnkeeper opens: a DuckDB file path, "
            "or a postgresql:// URL",
        )
    return DuckDBStore(
        path,
        clock=clock,
        read_only=read_only,
        replay_cache_bytes=replay_cache_bytes,
        tenant=tenant,
        encryption=encryption,
    )


_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
"""A URL of some scheme (``mysql://``, ``postgresql+psycopg://`` …): never a file path
to create, since a DuckDB file named after it would be a silent surprise."""
