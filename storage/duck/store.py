"""``DuckDBStore``: the embedded default backend.

One file, one writing process, many threads. Every public method validates
its input before touching the database (bad input raises
``InvalidInputError`` and writes nothing) and runs as one transaction through
:meth:`Database.run` (retries, error translation, statement counts).
"""

from __future__ import annotations

import os
import secrets
from typing import Any, TypeVar

from turnkeeper.spec import LeasePurpose, errors
from turnkeeper.spec.records import (
    FinalizeRequest,
    Lease,
    ThreadRecord,
)

from ..codec import check_id, check_text
from ..migrations import SCHEMA_VERSION, migrations, statements
from ..validate import (
    check_bool,
    check_lease,
    check_path,
    check_purpose,
    check_request,
    check_target,
    check_ttl,
)
from . import leases, threads
from .db import Clock, Database, Tx
from .query import check_read
from .store_delivery import DeliveryMixin
from .store_forks import ForksMixin
from .store_recovery import RecoveryMixin
from .store_runs import RunsMixin
from .store_sessions import SessionsMixin
from .store_tools import ToolsMixin

T = TypeVar("T")


class DuckDBStore(SessionsMixin, RunsMixin, RecoveryMixin, DeliveryMixin, ToolsMixin, ForksMixin):
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

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Clock | None = None, read_only: bool = False
    ) -> None:
        check_bool(read_only, "read_only")
        self.db = Database(check_path(path), clock, read_only=read_only)
        self._secret = secrets.token_bytes(32)
        try:
            self.db.write("migrate", self._check_schema if read_only else self._migrate)
        except BaseException:
            self.db.close()
            raise

    @property
    def path(self) -> str:
        """Absolute path of the database file (or ``":memory:"``)."""
        return self.db.path

    def _found_version(self, tx: Tx) -> int | None:
        """The file's schema version; ``None`` when it has no turnkeeper schema.

        Raises:
            ForeignDatabaseError: tables exist but no ``schema_migrations``
                (another application's database).
            SchemaVersionError: the version is newer than this turnkeeper's.
        """
        tables = sorted(r[0] for r in tx.rows("SELECT table_name FROM duckdb_tables()"))
        if "schema_migrations" not in tables:
            if tables:
                shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
                raise errors.ForeignDatabaseError(
                    self.path,
                    detail=f"it holds tables ({shown}) but no turnkeeper schema_migrations",
                )
            return None
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
        found = self._found_version(tx)
        if found is None:
            tx.exec(
                "CREATE TABLE schema_migrations "
                "(version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL)"
            )
            found = 0
        for version, sql in migrations():
            if version <= found:
                continue
            for stmt in statements(sql):
                tx.exec(stmt)
            tx.exec("INSERT INTO schema_migrations VALUES (?, now())", [version])

    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        row = self.db.read(
            "schema_version", lambda tx: tx.one("SELECT max(version) FROM schema_migrations")
        )
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Checkpoint and close the store; later calls raise ``InterfaceError``.
        Idempotent.

        Raises:
            CheckpointError: the final checkpoint failed (a full disk …): the
                store is closed all the same, and every committed write is
                kept in the ``.wal`` file, which the next open replays.
            OperationalError: DuckDB failed to close the file.
        """
        self.db.close()

    def __enter__(self) -> DuckDBStore:
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

    # -- leases ------------------------------------------------------------------

    def acquire_lease(
        self,
        target: str,
        owner: str,
        ttl_s: float,
        *,
        purpose: str = LeasePurpose.MUTATION,
    ) -> Lease:
        """Take ``target`` for ``owner`` for ``ttl_s`` seconds (threadstore AcquireLease).

        A free, released or expired target is granted with a fresh token and
        epoch + 1. The same owner re-acquiring with the same purpose from this
        store object while it holds the lease gets the same token and epoch
        with a new expiry.

        Raises:
            BusyError: another owner holds an unexpired lease (``holder`` names it).
            LeasePurposeError: this owner holds it under another purpose.
            InvalidInputError: empty target/owner or non-positive ``ttl_s``.
            DatabaseError: backend failure (never reported as busy).
        """
        check_target(target)
        check_id(owner, "owner")
        why = check_purpose(purpose)
        ttl = check_ttl(ttl_s)
        return self.db.write(
            "acquire_lease",
            lambda tx: leases.acquire(tx, self._secret, target, owner, ttl, why),
        )

    def renew_lease(self, lease: Lease, ttl_s: float) -> Lease:
        """Extend ``lease`` to now + ``ttl_s`` seconds (threadstore RenewLease).

        Raises:
            LeaseLostError: the lease expired, was released or taken over.
        """
        check_lease(lease)
        ttl = check_ttl(ttl_s)
        return self.db.write(
            "renew_lease", lambda tx: leases.renew(tx, lease, ttl), transaction=False
        )

    def release_lease(self, lease: Lease) -> bool:
        """Release ``lease`` (threadstore ReleaseLease); idempotent, ignores stale leases.

        Returns whether this call released a held lease.
        """
        check_lease(lease)
        return self.db.write(
            "release_lease", lambda tx: leases.release(tx, lease), transaction=False
        )

    def validate_lease(self, lease: Lease) -> None:
        """Check ``lease`` is still held, unexpired, with this token: the final
        fence a runtime calls right before a side effect.

        Raises:
            LeaseLostError: it is not.
        """
        check_lease(lease)
        self.db.write("validate_lease", lambda tx: leases.fence(tx, lease), transaction=False)

    # -- thread records --------------------------------------------------------

    def resolve(
        self, *, id: str | None = None, key: str | None = None, include_archived: bool = False
    ) -> ThreadRecord | None:
        """Look a record up by ``id`` or by ``key`` (threadstore Resolve).

        Exactly one of ``id`` and ``key`` is given. A missing record is
        ``None``; an archived one only with ``include_archived``.

        Raises:
            InvalidInputError: neither or both of ``id`` and ``key``.
        """
        if (id is None) == (key is None):
            raise errors.InvalidInputError("id", "give exactly one of id and key")
        if id is not None:
            check_id(id, "id")
        if key is not None:
            check_id(key, "key")
        check_bool(include_archived, "include_archived")
        return self.db.read("resolve", lambda tx: threads.resolve(tx, id, key, include_archived))

    def finalize(self, request: FinalizeRequest) -> ThreadRecord:
        """Persist post-run thread state atomically (threadstore Finalize).

        Validates every held lease, then saves the record (an upsert by id),
        archives ``previous_id`` when ``archive_old``, and rebinds the key when
        ``rebind_active`` (the record the key pointed at is archived). Without
        ``rebind_active``, a key bound to another record is refused.

        Raises:
            LeaseLostError: a held lease is no longer valid.
            AlreadyExistsError: ``require_key_absent`` and the key is bound, or
                the key is bound to another record and ``rebind_active`` is off.
            RecordNotFoundError / RecordNotActiveError: ``archive_old`` with a
                missing or archived ``previous_id``.
            InvalidTransitionError: the record id is archived.
            InvalidInputError: a malformed request.
        On any error nothing is written.
        """
        check_request(request)
        columns = threads.validate_request(request)
        rec = request.record

        def body(tx: Tx) -> ThreadRecord:
            threads.finalize(tx, request, columns)
            found = threads.resolve(tx, rec.id, None, True)
            assert found is not None
            return found

        try:
            result: ThreadRecord = self.db.write("finalize", body)
        except errors.LeaseLostError as exc:
            lost = next(h for h in request.held_leases if h.target == exc.target)
            self.db.write(
                "record_fenced",
                lambda tx: leases.record_fenced(tx, lost, "finalize"),
                transaction=False,
            )
            raise
        return result

    # -- analytics ---------------------------------------------------------------

    def query(self, sql: str, params: list[Any] | None = None) -> Any:
        """Run one read query over the store's tables (a ``SELECT``, ``WITH …
        SELECT``, ``DESCRIBE``, ``EXPLAIN [ANALYZE]`` of a ``SELECT`` …) and
        return a ``pyarrow.Table`` (analytics). ``params`` fill ``?`` placeholders.

        The query changes nothing and reaches nothing beyond the database,
        by three defences: the SQL is parsed and refused unless it is one read
        (no write anywhere in it, not in a CTE, not under ``EXPLAIN ANALYZE``,
        not through ``query(…)``); it runs in a transaction that is always
        rolled back; and the store's connection cannot reach files,
        extensions, secrets, the environment or Python objects.

        Raises:
            InvalidInputError: ``sql`` is not exactly one read statement
                (``UPDATE``, ``COPY … TO``, ``ATTACH``, ``SET``, a CTE that
                deletes, several statements …); nothing was run.
            ProgrammingError: the backend rejected the query (an unknown
                table, a file or function out of reach …).
        """
        check_text(sql, "sql", allow_empty=False)

        def body(tx: Tx) -> Any:
            check_read(tx.cursor, sql)
            return tx.arrow(sql, params or [])

        return self.db.read("query", body, snapshot=True)
