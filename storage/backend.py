"""What a backend gives the domain layer: one small transaction interface.

The domain operations (``storage/ops/``) are written once against :class:`Tx`
in the SQL both engines speak (``?`` placeholders, ``= ANY(?::VARCHAR[])``,
``INSERT … ON CONFLICT``, data-modifying CTEs, ``coalesce(?::TIMESTAMPTZ,
now())`` for the store's now); a backend (``storage/duck/``,
``storage/postgres/``) supplies only what really differs: connections,
the transaction boundary with its retries and error translation, bulk
loading, the few dialect fragments in :class:`Dialect`, its migrations, the
analytics query defences and wake-ups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from turnkeeper.spec import errors

if TYPE_CHECKING:
    from .crypto.keyring import Keyring
    from .crypto.seal import DataKey
    from .wakeups import Subscription, Topic

T = TypeVar("T")

QueryFn = Callable[[str, Sequence[Any]], Any]
"""One analytics read inside a snapshot: ``(sql, params)`` → ``pyarrow.Table``."""

Clock = Callable[[], datetime]
"""Returns the store's now as an aware ``datetime``."""

STORE_NOW = "coalesce(?::TIMESTAMPTZ, now())"
"""SQL for the store's now: the transaction's ``Tx.now`` (a parameter), else the
database's ``now()`` (an autocommit statement's start)."""


def keyed(key: str, conditions: str, value: str = "?") -> str:
    """A ``WHERE`` clause for the rows of one key that also meet ``conditions``:
    ``{key} = {value} AND {conditions}``, parameters in that order (the key's,
    then the conditions').

    Written so that DuckDB finds the rows through ``key``'s index: DuckDB
    turns each column a ``WHERE`` compares to a parameter into a filter of
    the table scan, and it scans an index only when the scan has exactly one
    filter (and the index a single column), so ``id = ? AND status = ?``
    reads every row of the table, and a turn would cost more with every other
    session's rows. The conditions are therefore one ``CASE`` over the key's
    column and theirs, an expression DuckDB cannot push into the scan; it
    filters the rows the index found. PostgreSQL plans either form through
    an index led by ``key`` (a two-column key led by another column does not
    serve it: schema version 12 adds those PostgreSQL lacked); the rows
    selected are the same. ``model_tests/internals/test_index_paths.py`` holds every
    hot statement to an index scan, on both backends.
    """
    return f"{key} = {value} AND CASE WHEN {conditions} THEN {key} END IS NOT NULL"


class Conflict(Exception):
    """A lost race that the transaction boundary retries from the start.

    Raised by a backend for a write-write conflict, a serialization failure,
    a deadlock or a duplicate key the transaction's snapshot could not see,
    and by an operation whose compare-and-set found the row moved under it.
    """


@dataclass(frozen=True, slots=True)
class Merge:
    """How a write may be merged with others queued beside it (DuckDB's group
    commit): ``many(tx, requests)`` runs the requests of every queued write
    with the same ``many``, in queue order, as set-based statements, and
    returns one outcome per request: its result, or the exception the write
    alone would raise, having written nothing for it. ``request`` is this
    write's. ``many`` runs only under the backend's in-process write
    serialization (no other write transaction commits beside it), so its
    checks may be reads. A backend that does not group writes runs the
    write's own body."""

    many: Callable[[Tx, list[Any]], list[Any]]
    request: Any


def check_changes(sql: str, changes: int | None, changed: int) -> None:
    """Judge a held write (``Tx.later``) by the rows it changed: ``changes``
    (``None``: any number) is what its compare-and-set must change.

    Raises:
        Conflict: it changed another number (a row moved since it was read;
            the transaction is retried).
    """
    if changes is not None and changed != changes:
        raise Conflict(f"a held write changed {changed} rows, not {changes}: {sql[:60]}")


def present(value: T | None, expected: str) -> T:
    """``value``, a result the database always gives: a row an ``INSERT …
    RETURNING`` wrote, an aggregate's one row, a row this transaction read or
    wrote before. Every such check in ``storage/`` goes through here, never
    through ``assert`` (which ``python -O`` drops, and whose bare
    ``AssertionError`` names nothing).

    Raises:
        UnexpectedResultError: ``value`` is ``None`` (``expected`` names what
            was missing); the operation's transaction is rolled back.
    """
    if value is None:
        raise errors.UnexpectedResultError(
            expected,
            detail="the database answered with nothing; a connection pooler in transaction "
            "mode running another statement's prepared plan does this (open the store with "
            "pooler='transaction'), or a damaged database",
        )
    return value


def utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime (backends return their own zone objects)."""
    return value.astimezone(UTC)


_PG_NUL_ESCAPE = r"E'\\u0000'"
"""PostgreSQL: the six characters ``\\u0000`` (an ``E''`` literal, whatever
``standard_conforming_strings`` says)."""

_PG_NUL_PATTERN = r"E'(?<!\\\\)((?:\\\\\\\\)*)\\\\u0000'"
"""PostgreSQL: a regular expression for a ``\\u0000`` escape of JSON text, with
the escaped backslashes before it (group 1): not preceded by another backslash,
then pairs of backslashes, then the escape."""

_PG_NUL_CODE = r"E'\\1' || chr(57344) || chr(57345)"
"""PostgreSQL: the replacement: the backslash pairs, then U+E000 U+E001 (the
text code of U+0000)."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """The few statements that differ between the engines, named and kept together.

    ``name`` is ``"duckdb"`` or ``"postgres"``. ``skip_locked``: rows another
    transaction is writing can be skipped (PostgreSQL's ``FOR UPDATE SKIP
    LOCKED``) by claims and scans, instead of waiting for it and then losing
    the race; DuckDB has no row locks (its writes are serialized in process).
    ``one_statement_appends``: a plain append runs as one autocommit
    statement of data-modifying CTEs (on a server every statement is a round
    trip); DuckDB, whose cost is per row operation, not per statement, runs
    it in a transaction its group commit can merge with others.
    ``serialized_writes``: every write transaction runs under one in-process
    lock (DuckDB), which orders a grant with a lease-less write; on a server
    they must meet on a row instead (see ``leases.touch_session``).
    """

    name: str
    skip_locked: bool = False
    one_statement_appends: bool = False
    serialized_writes: bool = False

    def epoch_us(self, expr: str) -> str:
        """SQL for the timestamp ``expr`` as integer microseconds since the Unix
        epoch (exact; far cheaper for the driver to hand over than a datetime)."""
        if self.name == "duckdb":
            return f"epoch_us({expr})"
        return f"(extract(epoch FROM {expr}) * 1000000)::BIGINT"

    def typed(self, sql_type: str) -> str:
        """A parameter of ``sql_type`` (``VARCHAR``, ``BIGINT[]`` …) where nothing
        else gives its type (a ``SELECT`` list, ``unnest``): PostgreSQL needs it
        spelled (``?::VARCHAR[]``); DuckDB binds a parameter by its value
        (``?``; a cast there costs about a tenth of a small insert)."""
        return "?" if self.name == "duckdb" else f"?::{sql_type}"

    def any_row(self, table: str, column: str, n: int) -> str:
        """SQL for whether a row of ``table`` (any of them, all sessions) has
        ``column`` equal to one of ``n`` parameters (``?``), each found through
        ``column``'s index. DuckDB: one ``IN`` list, one statement's lookup.
        PostgreSQL: one ``EXISTS`` per value: the generic plan a prepared
        statement keeps, made on a new store's tables before any ``ANALYZE``,
        guesses that an ``IN`` list matches many rows and reads the table
        whole (a finish's read grew from 0.9 to 7.4 ms over 2,200 turns of one
        session), and looks one value up through the index."""
        if self.name == "duckdb":
            return f"EXISTS (SELECT 1 FROM {table} WHERE {column} IN ({', '.join('?' * n)}))"
        return " OR ".join(f"EXISTS (SELECT 1 FROM {table} WHERE {column} = ?)" for _ in range(n))

    def bytes_head(self, expr: str) -> str:
        """SQL for the first ``?`` bytes (the one parameter, an integer) of the
        binary ``expr``; all of it when shorter. Only those bytes are read out."""
        if self.name == "duckdb":
            return f"{expr}[1:?]"
        return f"substring({expr} FROM 1 FOR ?)"

    def json(self, expr: str) -> str:
        """SQL for the stored JSON text ``expr`` (a column such as ``payload``) as
        the engine's JSON type, for every value the store holds: apply ``->``
        and ``->>`` to it.

        DuckDB's ``JSON`` takes every stored text as it is. PostgreSQL's
        ``json`` and ``jsonb`` refuse a string holding U+0000 (``\\u0000``:
        "unsupported Unicode escape sequence") as soon as any field of the
        document is read, so there each ``\\u0000`` escape (one not itself
        escaped: an odd number of backslashes before the ``u``) is replaced by
        the text code of U+0000 (:mod:`turnkeeper.storage.postgres.text`),
        which a read decodes back to U+0000; documents without one are cast
        unchanged.
        """
        if self.name == "duckdb":
            return f"CAST({expr} AS JSON)"
        return (
            f"(CASE WHEN strpos({expr}, {_PG_NUL_ESCAPE}) = 0 THEN {expr} "
            f"ELSE regexp_replace({expr}, {_PG_NUL_PATTERN}, {_PG_NUL_CODE}, 'g') END)::json"
        )

    def share_lock(self) -> str:
        """The clause that ends a ``SELECT`` of rows that must not change until
        the statement's transaction ends (PostgreSQL ``FOR SHARE``: a writer of
        them waits; one that committed first is re-read). DuckDB has no row
        locks: its writes are serialized in process."""
        return " FOR SHARE" if self.name == "postgres" else ""

    def update_lock(self) -> str:
        """The clause that ends a ``SELECT`` of a row this transaction decides
        on and then writes (PostgreSQL ``FOR UPDATE``: it waits for a writer
        of the row, so a guard judged after it sees the row as it stays until
        COMMIT, at a clock read after the wait). DuckDB has no row locks: its
        writes are serialized in process."""
        return " FOR UPDATE" if self.name == "postgres" else ""

    def skip_locked_of(self, alias: str) -> str:
        """The clause that ends a claim's or scan's ``SELECT``: lock the rows of
        ``alias`` it returns, skipping rows another transaction holds."""
        return f" FOR UPDATE OF {alias} SKIP LOCKED" if self.skip_locked else ""


class Tx(Protocol):
    """One open transaction (or one autocommit statement) of a backend.

    ``now`` is the store's now for this transaction (the injected clock's
    value, or the database server's clock read once the transaction's
    snapshot exists), or ``None`` in an autocommit statement, whose SQL then
    uses ``now()``. SQL spells it ``coalesce(?::TIMESTAMPTZ, now())``.
    ``keys`` is the store object's keyring (sessions' data keys: what seals
    and opens payloads in this transaction; ``storage/crypto/keyring.py``).
    """

    dialect: Dialect
    keys: Keyring
    made_keys: dict[tuple[str, int], DataKey]
    """The data keys this transaction made (a new session's, a rotation's),
    by session id and version: used in it, and remembered by the keyring
    only once read back from committed rows (a rolled-back transaction's
    key is never taken for the stored one)."""

    @property
    def now(self) -> datetime | None: ...

    def rows(
        self, sql: str, params: Sequence[Any] = (), *, binary: bool = False, replan: bool = False
    ) -> list[tuple[Any, ...]]:
        """Execute one statement and return all rows; ``binary`` asks for the
        results in binary form (PostgreSQL: a ``BYTEA`` value arrives as its
        bytes, not as hex text the driver decodes at a tenth of the speed;
        DuckDB has one form). ``replan``: plan the statement for its values on
        every run, for a lookup whose best plan depends on them (a list of
        ids): PostgreSQL never prepares it, so it keeps no generic plan, made
        for the tables as they were (on a new store, before any ``ANALYZE``,
        one that reads the table whole); DuckDB plans every run anyway."""
        ...

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """Execute one statement and return its first row, or ``None``."""
        ...

    def exec(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Execute one statement, ignoring any rows."""
        ...

    def count(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute one ``UPDATE``, ``INSERT`` or ``DELETE`` and return how many
        rows it changed (without ``RETURNING``: on DuckDB a ``RETURNING``
        update rewrites the whole row, and its commit costs several times more)."""
        ...

    def insert_rows(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """Insert ``rows`` (values in ``columns`` order) in bulk."""
        ...

    def later(self, sql: str, params: Sequence[Any] = (), *, changes: int | None = None) -> None:
        """Execute one ``INSERT``, ``UPDATE`` or ``DELETE`` (without ``RETURNING``)
        whose outcome nothing reads before the transaction's next other
        statement: a backend may hold it and send the writes held so far as
        one statement (PostgreSQL: data-modifying ``WITH``, one round trip
        instead of one per write) right before that next statement, or
        before COMMIT. So a held write must read no row that another one
        held since the last other statement writes (held together, they all
        read the transaction's state before any of them, and no two may
        change one row). ``changes``: the number of rows it must change (a
        compare-and-set); another number raises ``Conflict`` when it is
        sent (the transaction is retried). A database error it meets is
        raised when it is sent; either way the transaction rolls back whole.
        DuckDB (no data-modifying ``WITH``) runs it at once."""
        ...

    def notify(self, topic: str) -> None:
        """Publish the wake-up ``topic`` once this transaction commits (advisory:
        see ``storage/wakeups.py``)."""
        ...

    def clock_after_locks(self, server_now: datetime | None = None) -> datetime:
        """The store's clock read now, after every lock this transaction holds
        so far: what a guard compares an expiry with before it lets a write
        through (``now``, fixed once per transaction, may predate a wait for
        a lock). The injected clock is read again; else ``server_now``, the
        server's ``clock_timestamp()`` as the locking statement returned it
        (PostgreSQL evaluates ``RETURNING`` after the row is locked), else
        the database clock read now (a round trip on a server). Inside a
        transaction whose ``now`` was not read yet, this reading becomes it."""
        ...

    def valid_until(self, expires_at: datetime, lost: Exception) -> None:
        """Keep this write valid only until ``expires_at`` (a lease's or a
        claim's expiry its guard just judged unexpired at
        :meth:`clock_after_locks`): the expiry is judged again as the write
        commits, and the write fails with ``lost`` instead of committing if
        it passed meanwhile. After its guard a write may still wait: on a
        server for another lock (a row or table another transaction holds),
        on DuckDB for the other writes of its group commit. Nothing can move
        the expiry meanwhile: the guard holds the row (or its target)."""
        ...

    def hold(self, target: str) -> None:
        """Keep every other write that holds lease ``target`` out until this
        transaction ends: a lease-less write's check or a merged append's
        fence and a renewal or release of the target never interleave.
        DuckDB: an in-process lock (its renewals and releases skip the write
        lock, and its fences are reads), and a conflict when one of them
        committed after this transaction's snapshot; PostgreSQL: nothing (the
        lease row's lock does it)."""
        ...


class Backend(Protocol):
    """A database the store runs on (see the module docstring)."""

    dialect: Dialect
    path: str
    """The file's absolute path, ``":memory:"``, or the server URL without its password."""
    read_only: bool
    clock: Clock | None
    keyring: Keyring
    """The store object's data keys, handed to every transaction as ``Tx.keys``."""

    def write(
        self,
        operation: str,
        body: Callable[[Tx], T],
        *,
        transaction: bool = True,
        retry: bool = True,
        exclusive: bool = True,
        merge: Merge | None = None,
        serializable: bool = False,
    ) -> T:
        """Run ``body`` as one write (retried as a lost race on conflict);
        ``exclusive=False`` lets a backend that serializes its writes in
        process run this one (one autocommit statement) beside them; with
        ``merge`` a backend that groups writes may run it merged with others
        (see :class:`Merge`); ``serializable`` asks for serializable isolation
        where a write's decision rests on a row it found absent (no key to
        conflict on): a backend that serializes its writes has it anyway."""
        ...

    def read(self, operation: str, body: Callable[[Tx], T], *, snapshot: bool = False) -> T:
        """Run ``body`` as a read (one statement, or one rolled-back snapshot)."""
        ...

    def scan(self, operation: str, body: Callable[[Tx], T]) -> T:
        """Run ``body`` as a read in one snapshot that may take row locks to skip
        rows other transactions are writing (see :class:`Dialect`); it writes
        nothing and is rolled back, which releases the locks."""
        ...

    def query(self, sql: str, params: Sequence[Any]) -> Any:
        """Run one analytics read and return a ``pyarrow.Table`` (see ``Store.query``)."""
        ...

    def snapshot(self, body: Callable[[QueryFn], T]) -> T:
        """Run ``body(query)`` where every ``query(sql, params)`` call (checked and
        defended as :meth:`query`) reads the same snapshot (see ``Store.snapshot``)."""
        ...

    def subscribe(self, topics: tuple[Topic, ...]) -> Subscription:
        """A subscription to the wake-ups of ``topics`` (see ``storage/wakeups.py``)."""
        ...

    def query_batches(
        self,
        sql: str,
        params: Sequence[Any],
        consume: Callable[[Any, Iterator[Any]], T],
        batch_rows: int,
    ) -> T:
        """Run one analytics read and hand ``consume`` its Arrow schema and record
        batches as they stream (see ``Store.query_batches``)."""
        ...

    def migrations(self) -> list[tuple[int, str]]:
        """This dialect's numbered migrations, ``(version, sql)`` in order."""
        ...

    def migrate(self, operation: str, body: Callable[[Tx], T]) -> T:
        """Run the migration ``body`` as one write that sees what another opener
        committed while it waited for :meth:`lock_migrations`."""
        ...

    def lock_migrations(self, tx: Tx) -> None:
        """Serialize migrations of several processes opening the store at once."""
        ...

    def tables(self, tx: Tx) -> set[str]:
        """The names of the tables in the store's schema."""
        ...

    def object_names(self, tx: Tx) -> set[str]:
        """The names of every relation (table, view, sequence, index …) and
        type in the store's schema, an extension's too: what a name of the
        store's own would clash with."""
        ...

    def close(self) -> None:
        """Close the database once running operations finished."""
        ...

    def statement_stats(self) -> dict[str, dict[str, float]]:
        """Per operation: calls, statements per call and retries."""
        ...
