"""Thread records on DuckDB (threadstore Resolve / Finalize).

Finalize is one transaction: fence every held lease (each fence writes its
lease row, so a concurrent takeover conflicts), check ``require_key_absent``,
archive the previous record, save the new one (upsert by record id), rebind
the key's active mapping, and append an event row per record transition.
Any refusal raises before COMMIT, so nothing is written.
"""

from __future__ import annotations

from typing import Any

from turnkeeper.machines import machine_for
from turnkeeper.spec import THREAD_RECORD, RecordStatus, errors
from turnkeeper.spec.records import FinalizeRequest, ThreadRecord

from ..backend import Tx, keyed, present, utc
from ..codec import check_id, check_text, from_json, to_json
from ..validate import (
    check_bool,
    check_request,
)
from . import leases
from .base import Area, record_fenced

_MACHINE = machine_for(THREAD_RECORD)

_COLUMNS = (
    "id, key, status, driver_type, agent, fingerprint, compatibility_fingerprint, "
    "session_codec, state, created_at, updated_at"
)


def _record(row: tuple[Any, ...]) -> ThreadRecord:
    return ThreadRecord(
        id=row[0],
        key=row[1],
        status=RecordStatus(row[2]),
        driver_type=row[3],
        agent=from_json(row[4]),
        fingerprint=row[5],
        compatibility_fingerprint=row[6],
        session_codec=row[7],
        state=from_json(row[8]),
        created_at=utc(row[9]),
        updated_at=utc(row[10]),
    )


def resolve(
    tx: Tx, record_id: str | None, key: str | None, include_archived: bool
) -> ThreadRecord | None:
    """Look a record up by id or by key's active mapping; ``None`` when missing.

    By key with ``include_archived`` and no active record for the key, the
    key's most recently updated archived record (ties: newest ``created_at``,
    then greatest id).
    """
    if key is not None:
        row = tx.one(
            f"SELECT {', '.join('r.' + c.strip() for c in _COLUMNS.split(','))} "
            "FROM active_thread_keys k JOIN thread_records r ON r.id = k.record_id "
            "WHERE k.key = ?",
            [key],
        )
        if row is None and include_archived:
            # Every record of the key is archived (an archive_old that moved to
            # another key removes the mapping): the seed still returns the
            # record, the one archived last.
            row = tx.one(
                f"SELECT {_COLUMNS} FROM thread_records WHERE key = ? "
                "ORDER BY updated_at DESC, created_at DESC, id DESC LIMIT 1",
                [key],
            )
    else:
        row = tx.one(f"SELECT {_COLUMNS} FROM thread_records WHERE id = ?", [record_id])
    if row is None:
        return None
    record = _record(row)
    if record.status is RecordStatus.ARCHIVED and not include_archived:
        return None
    return record


def validate_request(req: FinalizeRequest) -> tuple[str, str, str, str, str, str]:
    """Check every field before the transaction; returns the JSON/text column values.

    Raises:
        InvalidInputError: a field is missing, mistyped or not storable.
    """
    rec = req.record
    check_id(rec.id, "record.id")
    check_id(rec.key, "record.key")
    if req.key is not None and req.key != rec.key:
        raise errors.InvalidInputError("key", "must equal record.key")
    if rec.status != RecordStatus.ACTIVE:
        raise errors.InvalidInputError("record.status", "finalize saves the active record")
    if req.archive_old and not req.previous_id:
        raise errors.InvalidInputError("previous_id", "archive_old needs previous_id")
    if req.previous_id is not None:
        check_id(req.previous_id, "previous_id")
        if req.archive_old and req.previous_id == rec.id:
            raise errors.InvalidInputError("previous_id", "cannot archive the record being saved")
    for name in ("driver_type", "fingerprint", "compatibility_fingerprint", "session_codec"):
        check_text(getattr(rec, name), f"record.{name}")
    return (
        to_json(rec.agent, "record.agent"),
        to_json(rec.state, "record.state"),
        rec.driver_type,
        rec.fingerprint,
        rec.compatibility_fingerprint,
        rec.session_codec,
    )


def _event(tx: Tx, record_id: str, key: str, edge_name: str) -> None:
    edge = THREAD_RECORD.edge(edge_name)
    tx.exec(
        f"INSERT INTO thread_record_events VALUES (?, ?, ?, ?, ?, ?, {leases.NOW})",
        [record_id, key, edge.name, edge.trigger, edge.source, edge.dest, tx.now],
    )


_ACTIVE = "status = 'active'"
"""A record still active: what archiving it compares."""


def _archive(tx: Tx, record_id: str, key: str) -> None:
    _MACHINE.require("archive", "active", {})
    tx.exec(
        f"UPDATE thread_records SET status = 'archived', updated_at = {leases.NOW} "
        f"WHERE {keyed('id', _ACTIVE)}",
        [tx.now, record_id],
    )
    _event(tx, record_id, key, "archive")


def finalize(tx: Tx, req: FinalizeRequest, columns: tuple[str, str, str, str, str, str]) -> None:
    """Apply ``req`` inside the caller's transaction (see module docstring)."""
    rec = req.record
    bound = tx.one("SELECT record_id FROM active_thread_keys WHERE key = ?", [rec.key])
    for lease in req.held_leases:
        leases.fence(tx, lease)
    bound_id = bound[0] if bound else None
    if req.require_key_absent and bound_id is not None:
        raise errors.AlreadyExistsError(rec.key)
    if req.archive_old:
        assert req.previous_id is not None
        prev = tx.one("SELECT key, status FROM thread_records WHERE id = ?", [req.previous_id])
        if prev is None:
            raise errors.RecordNotFoundError(req.previous_id)
        if prev[1] != RecordStatus.ACTIVE:
            raise errors.RecordNotActiveError(req.previous_id, prev[1])
        _archive(tx, req.previous_id, prev[0])
        tx.exec(
            f"DELETE FROM active_thread_keys WHERE {keyed('key', 'record_id = ?')}",
            [prev[0], req.previous_id],
        )
        if prev[0] == rec.key and bound_id == req.previous_id:
            bound_id = None
    current = tx.one("SELECT status, key FROM thread_records WHERE id = ?", [rec.id])
    if current is not None and current[1] != rec.key:
        raise errors.InvalidInputError("record.key", f"record {rec.id!r} belongs to another key")
    source = "absent" if current is None else current[0]
    key_available = req.rebind_active or bound_id in (None, rec.id)
    edge = _MACHINE.decide("save", source, {"key_available": key_available})
    if edge is None:
        raise errors.AlreadyExistsError(rec.key, detail=f"active record is {bound_id!r}")
    if bound_id is not None and bound_id != rec.id:
        # Rebinding: the record the key pointed at can no longer be active.
        _archive(tx, bound_id, rec.key)
    agent, state, driver_type, fingerprint, compat, codec = columns
    tx.exec(
        f"INSERT INTO thread_records ({_COLUMNS}) VALUES (?, ?, 'active', ?, ?, ?, ?, ?, ?, "
        f"{leases.NOW}, {leases.NOW}) ON CONFLICT (id) DO UPDATE SET "
        "key = excluded.key, driver_type = excluded.driver_type, agent = excluded.agent, "
        "fingerprint = excluded.fingerprint, "
        "compatibility_fingerprint = excluded.compatibility_fingerprint, "
        "session_codec = excluded.session_codec, state = excluded.state, "
        "updated_at = excluded.updated_at",
        [rec.id, rec.key, driver_type, agent, fingerprint, compat, codec, state, tx.now, tx.now],
    )
    if bound_id != rec.id:
        tx.exec(
            "INSERT INTO active_thread_keys VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET record_id = excluded.record_id",
            [rec.key, rec.id],
        )
    _event(tx, rec.id, rec.key, edge.name)


# -- the store's methods ------------------------------------------------------------


class Threads(Area):
    """Thread records (threadstore Resolve / Finalize)."""

    def resolve(
        self, *, id: str | None = None, key: str | None = None, include_archived: bool = False
    ) -> ThreadRecord | None:
        """Look a record up by ``id`` or by ``key`` (threadstore Resolve).

        Exactly one of ``id`` and ``key`` is given. A missing record is
        ``None``; an archived one only with ``include_archived``. By key, the
        key's active record; with ``include_archived`` and every record of the
        key archived, the one archived last (most recent ``updated_at``, then
        ``created_at``, then greatest id).

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
        return self.db.read("resolve", lambda tx: resolve(tx, id, key, include_archived))

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
        columns = validate_request(request)
        rec = request.record

        def body(tx: Tx) -> ThreadRecord:
            finalize(tx, request, columns)
            found = resolve(tx, rec.id, None, True)
            found = present(found, "the thread record finalize wrote")
            return found

        try:
            result: ThreadRecord = self.db.write("finalize", body)
        except errors.LeaseLostError as exc:
            lost = next(h for h in request.held_leases if h.target == exc.target)
            self.db.write(
                "record_fenced",
                lambda tx: record_fenced(tx, lost, "finalize"),
                transaction=False,
            )
            raise
        return result
