"""``DuckDBStore``: the embedded default backend.

One file, one writing process, many threads. Every public method validates
its input before touching the database (bad input raises
``InvalidInputError`` and writes nothing) and runs as one transaction through
:meth:`Database.run` (retries, error translation, statement counts).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import uuid6

from turnkeeper.spec import LeasePurpose, errors
from turnkeeper.spec.entries import EntryKind, validate_payload
from turnkeeper.spec.records import (
    ANY_LEAF,
    Entry,
    FinalizeRequest,
    ImportBatch,
    ImportResult,
    Lease,
    OpaqueRecord,
    Replay,
    Session,
    SessionPage,
    ThreadRecord,
)

from ..codec import check_text, from_json, to_json
from ..migrations import SCHEMA_VERSION, migrations, statements
from ..validate import (
    check_bool,
    check_expected_leaf,
    check_header,
    check_lease,
    check_limit,
    check_path,
    check_purpose,
    check_request,
    check_session_lease,
    check_ttl,
)
from . import leases, sessions, threads
from .db import Clock, Database, Tx

T = TypeVar("T")


def _aware(value: datetime | None, field: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise errors.InvalidInputError(field, "must be an aware datetime (with a time zone)")
    return value


def new_entry_id() -> str:
    """A random 16-hex entry id (64 bits, as the session seed's GenerateID)."""
    return secrets.token_hex(8)


class DuckDBStore:
    """A turnkeeper store in one DuckDB file (``":memory:"`` for a private one).

    ``clock`` overrides the store's clock (default: the database's clock);
    it must return aware datetimes. Opening applies pending schema
    migrations, except with ``read_only``: then the file must already have
    this turnkeeper's schema, nothing is changed, and writes raise
    ``ReadOnlyError`` (for inspecting a database; DuckDB lets several
    read-only processes share a file no writer holds).

    Raises (from the constructor):
        StoreLockedError: another process has the file open.
        SchemaVersionError: the file's schema is newer than this turnkeeper's,
            older (read-only), or it is not a turnkeeper database.
        InvalidInputError: ``path`` is not a usable path.
        DatabaseError: any other failure opening the file.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Clock | None = None, read_only: bool = False
    ) -> None:
        check_bool(read_only, "read_only")
        self.db = Database(check_path(path), clock, read_only=read_only)
        self._secret = secrets.token_bytes(32)
        try:
            self.db.run("migrate", self._check_schema if read_only else self._migrate)
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
            SchemaVersionError: tables exist but no ``schema_migrations``
                (another application's database), or the version is newer.
        """
        tables = {r[0] for r in tx.rows("SELECT table_name FROM duckdb_tables()")}
        if "schema_migrations" not in tables:
            if tables:
                raise errors.SchemaVersionError(
                    self.path, 0, SCHEMA_VERSION, detail="not a turnkeeper database"
                )
            return None
        row = tx.one("SELECT coalesce(max(version), 0) FROM schema_migrations")
        found = int(row[0]) if row else 0
        if found > SCHEMA_VERSION:
            raise errors.SchemaVersionError(self.path, found, SCHEMA_VERSION)
        return found

    def _check_schema(self, tx: Tx) -> None:
        found = self._found_version(tx)
        if found != SCHEMA_VERSION:
            raise errors.SchemaVersionError(
                self.path, found or 0, SCHEMA_VERSION, detail="read-only: cannot migrate"
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
        row = self.db.run(
            "schema_version",
            lambda tx: tx.one("SELECT max(version) FROM schema_migrations"),
            transaction=False,
        )
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Close the store; later calls raise ``InterfaceError``."""
        self.db.close()

    def __enter__(self) -> DuckDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        check_text(target, "target", allow_empty=False)
        check_text(owner, "owner", allow_empty=False)
        why = check_purpose(purpose)
        ttl = check_ttl(ttl_s)
        return self.db.run(
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
        return self.db.run(
            "renew_lease", lambda tx: leases.renew(tx, lease, ttl), transaction=False
        )

    def release_lease(self, lease: Lease) -> bool:
        """Release ``lease`` (threadstore ReleaseLease); idempotent, ignores stale leases.

        Returns whether this call released a held lease.
        """
        check_lease(lease)
        return self.db.run("release_lease", lambda tx: leases.release(tx, lease), transaction=False)

    def validate_lease(self, lease: Lease) -> None:
        """Check ``lease`` is still held, unexpired, with this token: the final
        fence a runtime calls right before a side effect.

        Raises:
            LeaseLostError: it is not.
        """
        check_lease(lease)
        self.db.run("validate_lease", lambda tx: leases.fence(tx, lease), transaction=False)

    def _fenced(self, operation: str, lease: Lease | None, body: Callable[[Tx], T]) -> T:
        try:
            return self.db.run(operation, body)
        except errors.LeaseLostError:
            if lease is not None:
                self.db.run(
                    "record_fenced",
                    lambda tx: leases.record_fenced(tx, lease, operation),
                    transaction=False,
                )
            raise

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
            check_text(id, "id", allow_empty=False)
        if key is not None:
            check_text(key, "key", allow_empty=False)
        check_bool(include_archived, "include_archived")
        return self.db.run(
            "resolve", lambda tx: threads.resolve(tx, id, key, include_archived), transaction=False
        )

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
            result: ThreadRecord = self.db.run("finalize", body)
        except errors.LeaseLostError as exc:
            lost = next(h for h in request.held_leases if h.target == exc.target)
            self.db.run(
                "record_fenced",
                lambda tx: leases.record_fenced(tx, lost, "finalize"),
                transaction=False,
            )
            raise
        return result

    # -- sessions ----------------------------------------------------------------

    def create_session(
        self,
        session_id: str | None = None,
        *,
        cwd: str = "",
        header: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> Session:
        """Create an empty session (a UUIDv7 id when ``session_id`` is None).

        ``header`` holds extra header fields kept verbatim.

        Raises:
            SessionIDExistsError: the id is taken; the existing session is untouched.
            InvalidInputError: bad id, cwd, header or naive ``created_at``.
        """
        sid = str(uuid6.uuid7()) if session_id is None else session_id
        check_text(sid, "session_id", allow_empty=False)
        check_text(cwd, "cwd")
        header_json = to_json(check_header(header), "header")
        _aware(created_at, "created_at")
        return self.db.run(
            "create_session", lambda tx: sessions.create(tx, sid, cwd, header_json, created_at)
        )

    def get_session(self, session_id: str) -> Session | None:
        """The session, or ``None`` when there is none with this id."""
        check_text(session_id, "session_id", allow_empty=False)
        return self.db.run(
            "get_session", lambda tx: sessions.get(tx, session_id), transaction=False
        )

    def append(
        self,
        session_id: str,
        kind: str,
        payload: Mapping[str, Any],
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        entry_id: str | None = None,
        timestamp: datetime | None = None,
    ) -> Entry:
        """Append an entry under the current leaf; it becomes the leaf (as in pi).

        ``kind`` is one of the seed's entry kinds and ``payload`` its fields
        (``{"message": {...}}`` for a message …). With ``expected_leaf`` the
        append is a compare-and-set on the leaf; without it the leaf is read
        and written in one transaction. With ``lease`` the lease is validated
        in that transaction and its epoch stored on the entry.

        Raises:
            SessionModifiedError: the leaf is not ``expected_leaf``.
            LeaseLostError: ``lease`` is no longer valid.
            SessionNotFoundError, EntryExistsError (``entry_id`` taken),
            EntryNotFoundError (a label's target is missing),
            InvalidInputError (kind, payload, id or naive timestamp).
        On any error nothing is written.
        """
        check_text(session_id, "session_id", allow_empty=False)
        if not isinstance(payload, Mapping):
            raise errors.InvalidInputError("payload", "expected a mapping")
        validate_payload(kind, payload)
        payload_json = to_json(dict(payload), "payload")
        stored = from_json(payload_json)
        chose = entry_id is not None
        eid = entry_id if entry_id is not None else new_entry_id()
        check_text(eid, "entry_id", allow_empty=False)
        check_expected_leaf(expected_leaf)
        ts = _aware(timestamp, "timestamp")
        check_session_lease(session_id, lease)
        return self._fenced(
            "append",
            lease,
            lambda tx: sessions.append(
                tx,
                session_id,
                kind,
                payload_json,
                stored,
                entry_id=eid,
                caller_chose_id=chose,
                timestamp=ts,
                expected_leaf=expected_leaf,
                lease=lease,
            ),
        )

    def branch(
        self,
        session_id: str,
        entry_id: str | None,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
    ) -> None:
        """Move the leaf to ``entry_id`` (pi ``branch``); ``None`` resets it (``resetLeaf``).

        With ``lease`` (on ``session:<session_id>``) the move is fenced like an append.

        Raises:
            SessionNotFoundError, EntryNotFoundError, SessionModifiedError,
            LeaseLostError, InvalidInputError.
        """
        check_text(session_id, "session_id", allow_empty=False)
        if entry_id is not None:
            check_text(entry_id, "entry_id", allow_empty=False)
        check_expected_leaf(expected_leaf)
        check_session_lease(session_id, lease)
        self._fenced(
            "branch",
            lease,
            lambda tx: sessions.move_leaf(tx, session_id, entry_id, expected_leaf, lease),
        )

    def branch_with_summary(
        self,
        session_id: str,
        entry_id: str,
        summary: str,
        *,
        expected_leaf: str | None = ANY_LEAF,
        lease: Lease | None = None,
        details: Any = None,
    ) -> Entry:
        """Branch to ``entry_id`` and append a ``branch_summary`` of the abandoned path
        (pi ``branchWithSummary``): its parent is ``entry_id`` and its ``fromId``
        the leaf it leaves. One transaction.

        Raises:
            as :meth:`append`, plus EntryNotFoundError when ``entry_id`` is missing.
        """
        check_text(session_id, "session_id", allow_empty=False)
        check_text(summary, "summary")
        check_text(entry_id, "entry_id", allow_empty=False)
        check_expected_leaf(expected_leaf)
        check_session_lease(session_id, lease)
        to_json(details, "details")

        def body(tx: Tx) -> Entry:
            head = sessions.get(tx, session_id)
            if head is None:
                raise errors.SessionNotFoundError(session_id)
            payload: dict[str, Any] = {"summary": summary, "fromId": head.leaf_id or "root"}
            if details is not None:
                payload["details"] = details
            payload_json = to_json(payload, "details")
            return sessions.append(
                tx,
                session_id,
                EntryKind.BRANCH_SUMMARY,
                payload_json,
                payload,
                entry_id=new_entry_id(),
                caller_chose_id=False,
                timestamp=None,
                expected_leaf=expected_leaf,
                lease=lease,
                parent_override=entry_id,
            )

        return self._fenced("branch_with_summary", lease, body)

    def set_label(
        self,
        session_id: str,
        target_id: str,
        label: str | None,
        *,
        lease: Lease | None = None,
    ) -> Entry:
        """Label ``target_id`` (``None`` clears), as a ``label`` entry under the leaf."""
        payload: dict[str, Any] = {"targetId": target_id}
        if label is not None:
            payload["label"] = label
        return self.append(session_id, EntryKind.LABEL, payload, lease=lease)

    def set_title(
        self, session_id: str, name: str, *, source: str | None = None, lease: Lease | None = None
    ) -> Entry:
        """Title the session with a ``session_info`` entry (the latest one wins)."""
        payload: dict[str, Any] = {"name": name}
        if source is not None:
            payload["source"] = source
        return self.append(session_id, EntryKind.SESSION_INFO, payload, lease=lease)

    def entries(self, session_id: str) -> list[Entry]:
        """Every entry of the session, in sequence (append) order."""
        check_text(session_id, "session_id", allow_empty=False)
        return self.db.run(
            "entries", lambda tx: sessions.entries(tx, session_id), transaction=False
        )

    def entry(self, session_id: str, entry_id: str) -> Entry | None:
        """One entry, or ``None``."""
        check_text(session_id, "session_id", allow_empty=False)
        check_text(entry_id, "entry_id", allow_empty=False)
        return self.db.run(
            "entry", lambda tx: sessions.entry(tx, session_id, entry_id), transaction=False
        )

    def replay(self, session_id: str) -> Replay:
        """The current branch with compaction applied (session seed GetReplayState).

        Raises:
            SessionNotFoundError: no such session.
        """
        check_text(session_id, "session_id", allow_empty=False)
        return self.db.run("replay", lambda tx: sessions.replay(tx, session_id))

    def labels(self, session_id: str) -> dict[str, str]:
        """Current labels: target entry id → label."""
        check_text(session_id, "session_id", allow_empty=False)
        return self.db.run("labels", lambda tx: sessions.labels(tx, session_id), transaction=False)

    def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, search: str | None = None
    ) -> SessionPage:
        """Sessions newest first; ``search`` matches id, cwd, title and message text.

        Pass the page's ``next_cursor`` to continue; pages are stable under
        concurrent appends (keyset on creation time and id).

        Raises:
            InvalidInputError: ``limit`` below 1 or a foreign cursor.
        """
        check_limit(limit)
        if search is not None:
            check_text(search, "search")
        if cursor is not None:
            check_text(cursor, "cursor", allow_empty=False)
        return self.db.run(
            "list_sessions",
            lambda tx: sessions.list_page(tx, limit, cursor, search),
            transaction=False,
        )

    def count_sessions(self, *, search: str | None = None) -> int:
        """Number of sessions (matching ``search`` when given)."""
        if search is not None:
            check_text(search, "search")
        return self.db.run(
            "count_sessions", lambda tx: sessions.count(tx, search), transaction=False
        )

    # -- imports -----------------------------------------------------------------

    def import_batch(self, batch: ImportBatch) -> ImportResult:
        """Store a parsed session file: creates the session if needed and adds only
        entries it lacks (by entry id); the leaf moves to ``batch.leaf_id`` when
        anything is added. Re-importing the same file changes nothing.

        Raises:
            InvalidInputError: an entry or header is not storable.
        """
        check_text(batch.session_id, "session_id", allow_empty=False)
        header_json = to_json(dict(batch.header), "header")
        rows = []
        for e in batch.entries:
            check_text(e.id, "entry.id", allow_empty=False)
            validate_payload(e.kind, e.payload, strict=False)
            rows.append(
                (e.id, e.parent_id, e.kind, e.timestamp, to_json(dict(e.payload), "payload"))
            )
        opaque = [(o.line, check_text(o.raw, "raw"), o.reason) for o in batch.opaque]
        source = batch.source or (batch.opaque[0].source if batch.opaque else "")

        def body(tx: Tx) -> ImportResult:
            created, added, opaque_added = sessions.import_rows(
                tx,
                batch.session_id,
                batch.cwd,
                header_json,
                batch.created_at,
                rows,
                batch.leaf_id,
                opaque,
                source,
            )
            return ImportResult(batch.session_id, created, added, len(rows) - added, opaque_added)

        return self.db.run("import", body)

    def opaque_records(self, session_id: str) -> list[OpaqueRecord]:
        """Unparseable lines kept from imports of this session, by line."""
        rows = self.db.run(
            "opaque_records", lambda tx: sessions.opaque(tx, session_id), transaction=False
        )
        return [OpaqueRecord(*r) for r in rows]

    # -- analytics ---------------------------------------------------------------

    def query(self, sql: str, params: list[Any] | None = None) -> Any:
        """Run a read query and return a ``pyarrow.Table`` (analytics)."""
        return self.db.run("query", lambda tx: tx.arrow(sql, params or []), transaction=False)
