"""``BaseStore``: the store over any backend, written once.

Its API is one object per area (``store.leases``, ``store.sessions`` …), each
a class of ``storage/ops/`` that holds the area's transactions and public
methods; a backend (``DuckDBStore``,
``PostgresStore``) only chooses the :class:`~turnkeeper.storage.backend.Backend`.
Every public method validates its input before touching the database (bad
input raises ``InvalidInputError`` and writes nothing) and runs as one
transaction through the backend's boundary (retries, error translation,
statement counts).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar

from turnkeeper.spec import errors
from turnkeeper.spec.records import Entry

from .backend import Backend, QueryFn, Tx
from .codec import check_text, from_json
from .crypto.columns import SealedColumn
from .crypto.keyring import Keyring
from .crypto.keys import KeyProvider
from .crypto.seal import TEXT_PREFIX
from .migrations import SCHEMA_VERSION, created_names, statements
from .ops.archives import Archives
from .ops.base import Shared
from .ops.bindings import Bindings
from .ops.capabilities import Capabilities
from .ops.entry_rows import clear_entry_row, entry_row, payload_of
from .ops.forks import Forks
from .ops.guidance import GuidanceQueue
from .ops.keys import Keys
from .ops.leases import Leases
from .ops.ledger import Ledger
from .ops.lineage import Lineage
from .ops.outbox import Outbox
from .ops.pairing_checks import OpeningCache
from .ops.projects import Projects
from .ops.recovery import Recoveries
from .ops.replays import REPLAY_CACHE_BYTES, BranchCache
from .ops.resources import Resources
from .ops.runs import Runs
from .ops.sessions import Sessions
from .ops.threads import Threads
from .ops.tools import Tools
from .ops.usage import Usage
from .wakeups import Subscription, Topic, check_topics

T = TypeVar("T")

BATCH_ROWS = 10_000
"""Rows per Arrow record batch of :meth:`BaseStore.query_batches`."""


def _params(params: Sequence[Any] | None) -> list[Any]:
    if params is not None and (isinstance(params, str) or not isinstance(params, Sequence)):
        raise errors.InvalidInputError("params", "expected a list of parameters")
    return list(params or [])


@dataclass(frozen=True)
class Unopened:
    """A sealed value that could not be opened (:meth:`Snapshot.opened_entries`,
    :meth:`Snapshot.unopened_values`): of session ``session_id``, record
    ``entry_id`` (an entry's id, or the record id the value is sealed for) of
    ``column`` (``table.column``); ``error`` is the
    ``PayloadAuthenticationError`` or ``KeyUnavailableError`` a read raises;
    ``keyless`` when the store was opened without a key provider (the
    value was not tried: nothing is known to be wrong with it)."""

    session_id: str
    entry_id: str
    error: errors.EncryptionError
    keyless: bool
    column: str = "entries.payload"


ValuesOpener = Callable[[SealedColumn, Sequence[Sequence[Any]]], list[Unopened]]
"""Opens ``(session id, record id, stored value)`` rows of a sealed column,
returning those that did not open."""


class Snapshot:
    """Analytics reads that all see one consistent state of the store (see
    :meth:`BaseStore.snapshot`); valid only inside that call, on its thread."""

    def __init__(
        self,
        run: QueryFn,
        entries: Callable[[list[Sequence[Any]]], list[Entry]],
        opened: Callable[[list[Sequence[Any]]], tuple[list[Entry], list[Unopened]]],
        values: ValuesOpener | None = None,
    ) -> None:
        self._run = run
        self._entries = entries
        self._opened = opened
        self._values = values
        self._thread = threading.get_ident()
        self.open = True

    def entries(self, rows: list[Sequence[Any]]) -> list[Entry]:
        """``entries`` rows read by :meth:`query` (columns as
        ``storage.ops.entry_rows.ENTRY_SELECT``) as :class:`Entry` values,
        sealed payloads opened with the store's keys (read outside the
        snapshot: a data key never changes once written).

        Raises:
            KeyUnavailableError, PayloadAuthenticationError: a sealed payload
                that cannot be opened.
        """
        return self._entries(rows)

    def opened_entries(self, rows: list[Sequence[Any]]) -> tuple[list[Entry], list[Unopened]]:
        """As :meth:`entries`, each row on its own: the entries whose
        payloads opened, and one :class:`Unopened` per row whose payload did
        not (an audit reports them and goes on)."""
        return self._opened(rows)

    def unopened_values(
        self, column: SealedColumn, rows: Sequence[Sequence[Any]]
    ) -> list[Unopened]:
        """Which of ``rows`` (``(session id, record id as text, stored value)``
        of the sealed column ``column``, read by :meth:`query`) do not open
        under their session's data key (read outside the snapshot): one per
        such row; a clear value in a sealed session is one (``Keyring.open_bytes``
        / ``open_text``). A clear store object opens every value as it is."""
        return [] if self._values is None else self._values(column, rows)

    def query(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        """As :meth:`BaseStore.query` (same checks, same errors), in the snapshot.

        Raises:
            InterfaceError: the snapshot's call has returned, or this is not the
                thread that opened it (a snapshot is one transaction).
        """
        if not self.open:
            raise errors.InterfaceError(detail="the snapshot ended when its call returned")
        if threading.get_ident() != self._thread:
            raise errors.InterfaceError(
                detail="a snapshot is read only by the thread that opened it"
            )
        check_text(sql, "sql", allow_empty=False)
        return self._run(sql, _params(params))


MIGRATIONS_COLUMNS = {("version", "integer"), ("applied_at", "timestamp with time zone")}
"""The columns of turnkeeper's ``schema_migrations`` (information_schema's names)."""


class BaseStore:
    """The turnkeeper store on ``backend`` (see the module docstring).

    Its API is grouped by area, one object each (see ``storage/protocol.py``
    for every area's contract):

    - :attr:`leases` (acquire, renew, release, validate);
    - :attr:`threads` (resolve, finalize: thread records);
    - :attr:`sessions` (create, append, replay, branch, list, import, delete,
      retain, metadata …);
    - :attr:`runs` (admit, start, finish, cancel requests, events …);
    - :attr:`lineage` (response state compare-and-set);
    - :attr:`recovery` (orphaned runs: begin, converge, fail, detach);
    - :attr:`outbox` (delivery plans and operations: claim, finish, requeue …);
    - :attr:`tools` (tool-execution records: claim, complete, interrupt …);
    - :attr:`forks` (fork a session);
    - :attr:`capabilities` (a session's runtime capability state and its events);
    - :attr:`guidance` (guidance queued for a session's runtime, consumed by it);
    - :attr:`resources` (lifecycle events of a run's input resources);
    - :attr:`projects` (create, list, rename, delete projects of sessions);
    - :attr:`usage` (usage records per model request: record, list …);
    - :attr:`bindings` (channel bindings of sessions and channel tool selections);
    - :attr:`archives` (a session's Responses runs, turns and output items);
    - :attr:`ledger` (a session's fenced journal: open a writer, append, replay,
      the command log);
    - :attr:`keys` (encryption at rest: master-key rotation, reclaiming pages);

    and the store itself: :meth:`query`, :meth:`snapshot`,
    :meth:`query_batches`, :meth:`json_sql`, :meth:`subscribe`,
    :meth:`wait_for`, :meth:`statement_stats`, :meth:`schema_version`,
    :attr:`path`, :meth:`close`.

    Opening applies pending schema migrations (one process at a time: the
    backend serializes concurrent openers), except with ``read_only``: then
    the schema must already be this turnkeeper's, nothing is changed, and
    writes raise ``ReadOnlyError``. ``replay_cache_bytes`` bounds the
    replay cache (bytes of cached message JSON; 0: none; see
    ``storage.ops.replays``). ``tenant`` is the tenant the ledger's records
    carry and its reads see (``store.ledger``; sessionstore WithTenant).
    ``secret`` is the key of the lease tokens the store object issues and
    accepts (default: random, its own; a twin shares it: :meth:`_twin_options`).
    ``encryption`` is a :class:`~turnkeeper.storage.crypto.KeyProvider`: entry
    payloads of sessions created from then on are sealed under per-session data
    keys it wraps, and the store is marked encrypted (``storage/crypto/keyring.py``).

    Raises (from the constructor):
        ForeignDatabaseError: the database holds another application's tables.
        SchemaVersionError: its schema is newer than this turnkeeper's, or
            older and the open is read-only.
        InvalidInputError: ``encryption`` is not a key provider.
        DatabaseError: any other failure reading the schema.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        replay_cache_bytes: int = REPLAY_CACHE_BYTES,
        tenant: str = "",
        secret: bytes | None = None,
        encryption: KeyProvider | None = None,
    ) -> None:
        self.db = backend
        backend.keyring = Keyring(encryption)
        key = secrets.token_bytes(32) if secret is None else secret
        shared = Shared(backend, key, OpeningCache())
        self.leases = Leases(shared)
        self.threads = Threads(shared)
        branches = BranchCache(replay_cache_bytes)
        self.sessions = Sessions(shared, branches)
        self.runs = Runs(shared)
        self.lineage = Lineage(shared)
        self.recovery = Recoveries(shared)
        self.outbox = Outbox(shared)
        self.tools = Tools(shared)
        self.forks = Forks(shared)
        self.capabilities = Capabilities(shared)
        self.guidance = GuidanceQueue(shared)
        self.resources = Resources(shared)
        self.projects = Projects(shared, branches)
        self.usage = Usage(shared)
        self.bindings = Bindings(shared)
        self.archives = Archives(shared)
        self.ledger = Ledger(shared, tenant)
        self.keys = Keys(shared)
        try:
            if backend.read_only:
                self.db.read("check_schema", self._check_schema, snapshot=True)
                self.db.read("check_encryption", self._adopt_keys, snapshot=True)
            else:
                self.db.migrate("migrate", self._migrate)
        except BaseException:
            self.db.close()
            raise

    def _twin_options(self) -> dict[str, Any]:
        """What a twin of this store object on the same database (the native
        async store's, ``storage/postgres/native.py``) is opened with to behave
        as this one: ``secret``, the key of the lease tokens it issues and
        accepts (so tokens of either are the other's), ``replay_cache_bytes``
        and ``tenant``."""
        return {
            "secret": self.leases._secret,
            "replay_cache_bytes": self.sessions._branches.max_bytes,
            "tenant": self.ledger.tenant,
            "encryption": self.db.keyring.provider,
        }

    @property
    def path(self) -> str:
        """The database: a file's absolute path, ``":memory:"``, or a server URL
        (without its password)."""
        return self.db.path

    # -- schema ------------------------------------------------------------------

    def _found_version(self, tx: Tx) -> int | None:
        """The database's schema version; ``None`` when it has no turnkeeper schema.

        Raises:
            ForeignDatabaseError: tables exist but no ``schema_migrations``
                (another application's database).
            SchemaVersionError: the version is newer than this turnkeeper's.
        """
        tables = sorted(self.db.tables(tx))
        if "schema_migrations" not in tables:
            if tables:
                shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
                raise errors.ForeignDatabaseError(
                    self.path,
                    detail=f"it holds tables ({shown}) but no turnkeeper schema_migrations",
                )
            clash = sorted(self.db.object_names(tx) & created_names(self.db.migrations()))
            if clash:
                shown = ", ".join(clash[:5]) + (", …" if len(clash) > 5 else "")
                raise errors.ForeignDatabaseError(
                    self.path,
                    detail=(
                        f"it holds objects named as turnkeeper's tables or indexes ({shown}: "
                        "views, sequences, types or an extension's): give the store a schema "
                        "of its own (search_path) or a file of its own"
                    ),
                )
            return None
        columns = {
            (str(name).lower(), str(kind).lower())
            for name, kind in tx.rows(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = 'schema_migrations'"
            )
        }
        if columns != MIGRATIONS_COLUMNS or (len(tables) > 1 and "leases" not in tables):
            raise errors.ForeignDatabaseError(
                self.path,
                detail="its schema_migrations table is another tool's, not turnkeeper's",
            )
        row = tx.one("SELECT coalesce(max(version), 0) FROM schema_migrations")
        found = int(row[0]) if row else 0
        if found > SCHEMA_VERSION:
            raise errors.SchemaVersionError(
                self.path,
                found,
                SCHEMA_VERSION,
                detail="it was written by a newer turnkeeper: upgrade turnkeeper to open it",
            )
        return found

    def _check_schema(self, tx: Tx) -> None:
        found = self._found_version(tx)
        if found != SCHEMA_VERSION:
            what = "no turnkeeper schema yet" if not found else "an older schema"
            raise errors.SchemaVersionError(
                self.path,
                found or 0,
                SCHEMA_VERSION,
                detail=f"it has {what} and a read-only open cannot migrate: "
                "open it writable once to migrate it",
            )

    def _migrate(self, tx: Tx) -> None:
        self.db.lock_migrations(tx)
        found = self._found_version(tx)
        if found is None:
            tx.exec(
                "CREATE TABLE schema_migrations "
                "(version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL)"
            )
            found = 0
        for version, sql in self.db.migrations():
            if version <= found:
                continue
            for stmt in statements(sql):
                tx.exec(stmt)
            tx.exec("INSERT INTO schema_migrations VALUES (?, now())", [version])
        self._adopt_keys(tx)

    def _adopt_keys(self, tx: Tx) -> None:
        """Read (and, opening with ``encryption=`` for the first time, write)
        the store's encryption marker (``storage/crypto/keyring.py``); a schema
        older than version 32 (a test's migrations stopped early) has none."""
        if "store_encryption" in self.db.tables(tx):
            self.db.keyring.adopt(tx, writable=not self.db.read_only)
        else:
            self.db.keyring.markable = False

    def schema_version(self) -> int:
        """The schema version recorded in the database."""
        row = self.db.read(
            "schema_version", lambda tx: tx.one("SELECT max(version) FROM schema_migrations")
        )
        return int(row[0]) if row else 0

    # -- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Close the store once the operations already running have finished;
        later calls raise ``InterfaceError``. Idempotent.

        Raises:
            CheckpointError: (DuckDB) the final checkpoint failed (a full disk
                …): the store is closed all the same, and every committed
                write is kept in the ``.wal`` file, which the next open replays.
            OperationalError: the backend failed to close.
        """
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """Close the store. When the block is already raising, a failure to close is
        added to that exception as a note instead of replacing it."""
        try:
            self.close()
        except errors.TurnkeeperError as err:
            if exc is None:
                raise
            exc.add_note(f"closing the store also failed: {type(err).__name__}: {err}")

    def statement_stats(self) -> dict[str, dict[str, float]]:
        """Per operation: calls, statements per call (BEGIN/COMMIT included), retries."""
        return self.db.statement_stats()

    # -- wake-ups ---------------------------------------------------------------------

    def subscribe(self, *topics: str) -> Subscription:
        """Subscribe to wake-ups of ``topics`` (:class:`~.wakeups.Topic` values:
        ``"run_ended"``, ``"delivery_due"``, ``"lease_released"``, ``"orphan"``;
        the session seed's runtime notifications). Subscribe, look for work in
        the store, then ``wait(timeout_s)`` on the subscription before looking
        again. Advisory: a wake-up may be lost or spurious and carries no
        state; on DuckDB they come from this process's store objects on the
        file, on PostgreSQL from every process (``LISTEN``/``NOTIFY``).

        Raises:
            InvalidInputError: an unknown topic, or none.
            InterfaceError: the store is closed.
        """
        return self.db.subscribe(check_topics(topics))

    def wait_for(self, *topics: str, timeout_s: float) -> list[Topic]:
        """Wait up to ``timeout_s`` seconds for a wake-up of ``topics`` from now on
        (``subscribe(*topics).wait(timeout_s)``); returns the topics that fired,
        empty after the timeout. Prefer :meth:`subscribe` in a loop: a wake-up
        between looking in the store and calling this is missed.

        Raises:
            InvalidInputError: an unknown topic, or a bad ``timeout_s``.
        """
        return self.subscribe(*topics).wait(timeout_s)

    # -- analytics -------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        """Run one read query over the store's tables, in the backend's SQL dialect
        (a ``SELECT``, ``WITH … SELECT``, ``EXPLAIN`` of one …), and return a
        ``pyarrow.Table`` (analytics). ``params`` fill ``?`` placeholders.

        The query changes nothing and reaches nothing beyond the database. On
        DuckDB: the SQL is parsed and refused unless it is one read (no write
        anywhere in it, not in a CTE, not under ``EXPLAIN ANALYZE``, not
        through ``query(…)``); it runs in a transaction that is always rolled
        back; and the store's connection cannot reach files, extensions,
        secrets, the environment or Python objects. On PostgreSQL: one
        statement that starts as a read, run in a ``READ ONLY`` transaction
        that is rolled back, under a role that may only read the store's
        tables when the server lets the store create one (see
        ``storage/postgres``).

        It reads stored values as they are: a column that encryption at rest
        seals (``entries.payload`` of an encrypted session …) comes back as its
        ciphertext (``enc1:…`` text), never decrypted. What analytics reads of
        a payload is kept in clear columns (``entries.role``, ``provider``,
        ``model``: :mod:`turnkeeper.spec.clear_facts`; the README's "What
        stays clear" lists every column the report reads).

        Raises:
            InvalidInputError: ``sql`` is not exactly one read statement
                (``UPDATE``, ``COPY … TO``, ``ATTACH``, ``SET``, a CTE that
                deletes, several statements …); nothing was run.
            ProgrammingError: the backend rejected the query (an unknown
                table, a file or function out of reach, a write refused by
                the read-only transaction …).
        """
        check_text(sql, "sql", allow_empty=False)
        return self.db.query(sql, _params(params))

    def _payloads(self, session_id: str, rows: Sequence[tuple[str, str]]) -> list[tuple[str, Any]]:
        """``(entry id, stored payload)`` pairs of ``session_id`` that a
        :meth:`query` read (an adapter's own lookup), decoded: sealed ones
        opened with the session's data key.

        Raises:
            KeyUnavailableError, PayloadAuthenticationError: a sealed payload
                that cannot be opened.
        """
        if not self.db.keyring.encrypted:
            return [(i, from_json(p)) for i, p in rows]
        return self.db.read(
            "open_payloads", lambda tx: [(i, payload_of(tx, session_id, i, p)) for i, p in rows]
        )

    def json_sql(self, expr: str) -> str:
        """SQL, in this backend's dialect, for the JSON text the store keeps in
        ``expr`` (a column: ``payload``, ``header``, ``request``, ``state``,
        ``result`` …) as the engine's JSON type, for :meth:`query`: apply
        ``->`` and ``->>`` to it. It reads every value the store accepts.

        On DuckDB it is ``CAST(expr AS JSON)``. On PostgreSQL ``expr::json``
        (and ``::jsonb``) fails on a document holding U+0000 anywhere (a read
        of any of its fields raises "unsupported Unicode escape sequence");
        this expression gives every ``\\u0000`` PostgreSQL's text code instead,
        which :meth:`query` decodes, so a field read with ``->>`` comes back
        exactly, U+0000 included (see ``storage/postgres/text.py``).

        ``expr`` is SQL, not a value: pass a column name or expression of your
        query, never text from outside. A value sealed by encryption at rest
        (``enc1:…``) is no JSON: a query that reads one through this fails
        (``DatabaseError``); read the clear columns instead (see :meth:`query`).

        In an encrypted store (``open_store(..., encryption=…)``) a sealed
        value (``enc1:…``, as :meth:`query` sees it) reads as SQL ``NULL``:
        SQL cannot open it, and a figure over it skips it instead of failing.

        Raises:
            InvalidInputError: ``expr`` is not a string, or is empty.
        """
        check_text(expr, "expr", allow_empty=False)
        if self.db.keyring.encrypted:  # a sealed value reads as SQL NULL, never a failed cast
            expr = f"(CASE WHEN strpos({expr}, '{TEXT_PREFIX}') = 1 THEN NULL ELSE {expr} END)"
        return self.db.dialect.json(expr)

    def snapshot(self, body: Callable[[Snapshot], T]) -> T:
        """Run ``body(snap)``, where every ``snap.query(sql, params)`` reads the same
        consistent snapshot of the store, whatever other writers (threads,
        processes) commit meanwhile: a report or an audit of several queries
        over a live store sees one state, never a session row from before an
        append and its entries from after. Returns what ``body`` returns.

        ``body`` may call the store's other methods meanwhile (they run outside
        the snapshot); ``snap`` is valid only during the call and on its thread.

        Raises:
            as :meth:`query`, from each ``snap.query``; InterfaceError from a
            ``snap.query`` after the call or on another thread; and whatever
            ``body`` raises.
        """

        def entries(rows: list[Sequence[Any]]) -> list[Entry]:
            if not self.db.keyring.encrypted:
                return [clear_entry_row(r) for r in rows]
            return self.db.read("open_entries", lambda tx: [entry_row(tx, r) for r in rows])

        def opened(rows: list[Sequence[Any]]) -> tuple[list[Entry], list[Unopened]]:
            if not self.db.keyring.encrypted:
                return [clear_entry_row(r) for r in rows], []
            keyless = self.db.keyring.provider is None

            def each(tx: Tx) -> tuple[list[Entry], list[Unopened]]:
                good: list[Entry] = []
                bad: list[Unopened] = []
                for r in rows:
                    try:
                        good.append(entry_row(tx, r))
                    except (errors.PayloadAuthenticationError, errors.KeyUnavailableError) as e:
                        bad.append(Unopened(str(r[0]), str(r[1]), e, keyless))
                return good, bad

            return self.db.read("open_entries", each)

        def values(column: SealedColumn, rows: Sequence[Sequence[Any]]) -> list[Unopened]:
            if not self.db.keyring.encrypted:
                return []
            keyless = self.db.keyring.provider is None
            where = f"{column.table}.{column.column}"

            def each(tx: Tx) -> list[Unopened]:
                bad: list[Unopened] = []
                for sid, rid, stored in rows:
                    try:
                        if column.binary:
                            tx.keys.open_bytes(tx, sid, rid, column.field, bytes(stored))
                        else:
                            tx.keys.open_text(tx, sid, rid, column.field, str(stored))
                    except (errors.PayloadAuthenticationError, errors.KeyUnavailableError) as e:
                        bad.append(Unopened(str(sid), str(rid), e, keyless, where))
                return bad

            return self.db.read("open_values", each)

        def run(query: QueryFn) -> T:
            snap = Snapshot(query, entries, opened, values)
            try:
                return body(snap)
            finally:
                snap.open = False

        return self.db.snapshot(run)

    def query_batches(
        self,
        sql: str,
        consume: Callable[[Any, Iterator[Any]], T],
        params: Sequence[Any] | None = None,
    ) -> T:
        """Run one read query as :meth:`query` does, and hand its result to
        ``consume(schema, batches)`` as it streams: a ``pyarrow.Schema`` and an
        iterator of ``pyarrow.RecordBatch`` of at most :data:`BATCH_ROWS` rows,
        valid only during the call (the read stays open meanwhile). Memory
        holds one batch at a time, however long the history. Returns what
        ``consume`` returns.

        Raises:
            as :meth:`query`; and whatever ``consume`` raises.
        """
        check_text(sql, "sql", allow_empty=False)
        return self.db.query_batches(sql, _params(params), consume, BATCH_ROWS)
