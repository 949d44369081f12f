"""``PostgresStore``: the store on PostgreSQL, for many worker processes and hosts.

The domain logic is ``BaseStore``'s (``storage/store.py``, over
``storage/ops/``); this module only opens the PostgreSQL
:class:`~.db.Database` (a pool of connections to one server and schema).
"""

from __future__ import annotations

from ...spec.errors import InvalidInputError
from ..backend import Clock
from ..codec import check_tenant, check_text
from ..crypto.keyring import check_provider
from ..crypto.keys import KeyProvider
from ..ops.replays import REPLAY_CACHE_BYTES
from ..store import BaseStore
from ..validate import check_bool, check_int, check_seconds
from .db import Database
from .pool import POOL_TIMEOUT_S, RECONNECT_DELAY_S, RECONNECT_MAX_DELAY_S


class PostgresStore(BaseStore):
    """A turnkeeper store in a PostgreSQL database (one schema of it).

    ``url`` is a ``postgresql://`` URL or a libpq connection string (the
    ``options`` parameter may set ``search_path`` to use another schema than
    ``public``). ``clock`` overrides the store's clock (default: the server's,
    never a client's); ``read_only`` runs no migrations and refuses writes
    with ``ReadOnlyError``; ``pool_size`` bounds the connections this store
    object opens (threads beyond it wait for one).

    Lost connections (a restart, a failover): an operation waits up to
    ``pool_timeout_s`` seconds for a connection (default 30) before
    ``OperationalError``; the pool makes a lost connection again
    ``reconnect_delay_s`` seconds after a failed attempt (default 0.1),
    doubling per failure up to ``reconnect_max_delay_s`` (default 0.5), so
    writes resume at most about that long after the server takes
    connections again.

    Behind a connection pooler: ``pooler="transaction"`` (PgBouncer's
    ``pool_mode = transaction``) prepares no statements and keeps no session
    state; ``pooler="session"`` uses the pooler as it would the server; left
    out, a pooler is detected at open and taken to pool transactions.
    ``listen_url`` is a direct URL to the same server and database for
    ``LISTEN`` (wake-ups), which a transaction pooler cannot carry. Both may
    be parameters of ``url`` instead (``?pooler=transaction&listen_url=…``,
    the latter percent-encoded). :attr:`pooler` is the mode in force.

    Raises (from the constructor):
        InvalidInputError: ``pooler`` is not ``"transaction"``, ``"session"``
            or ``None``; ``listen_url`` is empty; the URL and the arguments
            disagree; a duration is not positive finite seconds, or
            ``reconnect_max_delay_s`` is below ``reconnect_delay_s``.
        OperationalError: the server cannot be reached or refused the login.
        PoolerError: behind a pooler, it refused the URL's ``options``
            (``feature="options"``), or its connections are not in the schema
            they name (``feature="search_path"``).
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
        pooler: str | None = None,
        listen_url: str | None = None,
        pool_timeout_s: float = POOL_TIMEOUT_S,
        reconnect_delay_s: float = RECONNECT_DELAY_S,
        reconnect_max_delay_s: float = RECONNECT_MAX_DELAY_S,
        tenant: str = "",
        encryption: KeyProvider | None = None,
    ) -> None:
        check_text(url, "url", allow_empty=False)
        check_tenant(tenant)
        check_bool(read_only, "read_only")
        check_int(pool_size, "pool_size", 1)
        timeout = check_seconds(pool_timeout_s, "pool_timeout_s", allow_zero=False)
        first = check_seconds(reconnect_delay_s, "reconnect_delay_s", allow_zero=False)
        most = check_seconds(reconnect_max_delay_s, "reconnect_max_delay_s", allow_zero=False)
        if most < first:
            raise InvalidInputError(
                "reconnect_max_delay_s",
                f"must be at least reconnect_delay_s ({first}), got {most}",
            )
        cache = check_int(replay_cache_bytes, "replay_cache_bytes", 0)
        check_provider(encryption)
        super().__init__(
            Database(
                url,
                clock,
                read_only=read_only,
                pool_size=pool_size,
                pooler=pooler,
                listen_url=listen_url,
                pool_timeout_s=timeout,
                reconnect_delay_s=first,
                reconnect_max_delay_s=most,
            ),
            replay_cache_bytes=cache,
            tenant=tenant,
            encryption=encryption,
        )

    @property
    def pooler(self) -> str | None:
        """The pooler mode in force: ``"transaction"`` (given, or a pooler was
        detected at open), ``"session"`` (given), or ``None`` (a direct
        connection)."""
        return self.db.pooler
