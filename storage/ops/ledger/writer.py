"""A ledger writer (sessionstore SessionJournal) and the command log bound to
it (sessionstore RuntimeCommandLog). Their lifecycle is
:data:`turnkeeper.spec.ledger.LEDGER_WRITER`."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from turnkeeper.spec import errors
from turnkeeper.spec.catalog import CATALOG_KINDS, SessionMeta
from turnkeeper.spec.ledger import (
    COMMAND_APPLICATION_KIND,
    FENCE_ID_PREFIX,
    MAX_PAYLOAD_DEPTH,
    RESERVED_KINDS,
    AppendResult,
    CommandApplication,
    LedgerEntry,
)
from turnkeeper.spec.records import Lease

from ... import bridge
from ...codec import check_id, to_json
from ...validate import check_list
from . import blobs as blob_ops
from . import catalog_fold, journal, records

if TYPE_CHECKING:
    from . import Ledger

_CHECKED_AT = datetime(2000, 1, 1, tzinfo=UTC)
"""The time a catalog kind's payload is folded at when an append checks it."""

MAX_BATCH = 1000
"""The most records one ``append_many`` takes (one transaction, one insert)."""


def check_entry(entry: object, field: str) -> LedgerEntry:
    """``entry`` as a storable :class:`LedgerEntry`: the one entry check, run
    by every write path before anything is written (through
    :func:`check_entries`: ``LedgerWriter.append``/``append_many``, the group
    commit they queue into, ``store.ledger.open(..., opening=[...])``, the
    command log and ``turnkeeper ledger append``).

    Raises:
        InvalidInputError: not a LedgerEntry, an empty or reserved kind, a
            payload that is not ``bytes``, an empty idempotency id or one
            starting with :data:`~turnkeeper.spec.ledger.FENCE_ID_PREFIX`
            (the store's fence records'), or a payload of a catalog kind
            (:data:`~turnkeeper.spec.catalog.CATALOG_KINDS`) the catalog
            could never fold (:func:`check_catalog_payload`).
    """
    if not isinstance(entry, LedgerEntry):
        raise errors.InvalidInputError(field, f"expected a LedgerEntry, got {type(entry).__name__}")
    check_id(entry.kind, f"{field}.kind")
    if entry.kind in RESERVED_KINDS:
        raise errors.InvalidInputError(f"{field}.kind", f"{entry.kind!r} is written by the store")
    if not isinstance(entry.payload, bytes):
        raise errors.InvalidInputError(
            f"{field}.payload", f"expected bytes, got {type(entry.payload).__name__}"
        )
    check_id(entry.idempotency_id, f"{field}.idempotency_id")
    if entry.idempotency_id.startswith(FENCE_ID_PREFIX):
        raise errors.InvalidInputError(
            f"{field}.idempotency_id",
            f"ids starting {FENCE_ID_PREFIX!r} are the store's (its fence records')",
        )
    if entry.kind in CATALOG_KINDS:
        check_catalog_payload(entry.kind, entry.payload, f"{field}.payload")
    return entry


def check_catalog_payload(kind: str, payload: bytes, field: str) -> None:
    """Refuse a catalog kind's ``payload`` the catalog could never fold: the
    catalog's own fold (``catalog_fold.fold``) run on a fresh entry, so a
    payload the fold refuses (one that does not decode, an id missing, a
    usage that is not a count in 0 … ``MAX_COUNT``, a hustle's unknown source
    or status …) is refused here by the same code. What only a session's
    history can refuse (a cumulative usage past ``MAX_COUNT``, a hustle
    started twice) stays the catalog's to report. The payload also nests at
    most :data:`~turnkeeper.spec.ledger.MAX_PAYLOAD_DEPTH` deep.

    Raises:
        InvalidInputError: ``field``, the fold's error as ``__cause__`` (its
            ``detail`` names the payload's member, e.g. ``usage.input_tokens``).
    """
    try:
        catalog_fold.fold(SessionMeta("-"), 1, kind, payload, _CHECKED_AT)
        depth = records.json_depth(records.loads_json(payload))
    except (errors.TurnkeeperError, ValueError) as bad:
        cause = bad.__cause__ if isinstance(bad, errors.TurnkeeperError) else None
        said = "; ".join(_said(e) for e in (bad, cause) if e is not None)
        raise errors.InvalidInputError(
            field, f"a {kind!r} record's payload the catalog cannot fold: {said}"
        ) from bad
    if depth > MAX_PAYLOAD_DEPTH:
        raise errors.InvalidInputError(
            field,
            f"a {kind!r} record's payload nests at most {MAX_PAYLOAD_DEPTH} deep "
            f"(this one {depth})",
        )


def _said(failure: BaseException) -> str:
    """``failure`` in a few words: its class, its fields and detail."""
    if not isinstance(failure, errors.TurnkeeperError):
        return f"{type(failure).__name__}: {failure}"
    parts = [f"{name}={getattr(failure, name)!r}" for name in failure.fields]
    parts += [failure.detail] if failure.detail else []
    return f"{type(failure).__name__} ({', '.join(parts)})"


def check_entries(
    entries: object,
    field: str,
    *,
    offload_threshold: int,
    max_body_bytes: int,
    opening: bool = False,
) -> list[LedgerEntry]:
    """``entries`` checked for one write (``Ledger.check_entries``): each by
    :func:`check_entry`, then its body against the ceiling ``max_body_bytes``
    (bytes; an offloaded entry's blob, envelope included, else its payload),
    then, for an ``opening`` (never offloaded), against ``offload_threshold``.
    An append takes 1 to :data:`MAX_BATCH` entries, an opening 0 to it.

    Raises:
        InvalidInputError: not a list of entries, too many (or none, for an
            append), a malformed entry, or an opening entry over the threshold.
        DurableBodyTooLargeError: a body over the ceiling (``seq`` 0, the
            entry's idempotency id).
    """
    given = check_list(entries, field, "LedgerEntry")
    if not (0 if opening else 1) <= len(given) <= MAX_BATCH:
        least = "0" if opening else "1"
        raise errors.InvalidInputError(field, f"expected {least} to {MAX_BATCH} entries")
    checked = [check_entry(e, f"{field}[{i}]") for i, e in enumerate(given)]
    for i, e in enumerate(checked):
        offloaded = not opening and len(e.payload) > offload_threshold
        size = len(blob_ops.envelope(e)) if offloaded else len(e.payload)
        if size > max_body_bytes:
            raise errors.DurableBodyTooLargeError(0, e.idempotency_id, size, max_body_bytes)
        if opening and size > offload_threshold:
            raise errors.InvalidInputError(
                f"{field}[{i}].payload",
                f"an opening record is at most the offload threshold "
                f"({offload_threshold} bytes; this one is {size})",
            )
    return checked


class LedgerWriter:
    """The single writer of one session's ledger under one lease (sessionstore
    SessionJournal), made by ``store.ledger.open``. Thread-safe; ``state`` is
    ``open``, ``fenced`` or ``closed`` (:data:`~turnkeeper.spec.ledger.LEDGER_WRITER`).

    ``session_id``, ``lease`` and ``epoch`` (the lease's) identify it;
    ``fence_seq`` is the sequence of its fence record, ``opening`` the
    results of the entries its open appended with it."""

    def __init__(self, ledger: Ledger, session_id: str, lease: Lease, fence_seq: int) -> None:
        self._ledger = ledger
        self.session_id = session_id
        self.lease = lease
        self.epoch = lease.epoch
        self.fence_seq = fence_seq
        self.opening: list[AppendResult] = []
        """The results of the entries appended with the opening fence."""
        self.state = "open"
        # held across the append's I/O: a bridge.Lock, which a native async
        # store's greenlets wait for on the event loop (storage/bridge.py)
        self._lock = bridge.Lock()

    @property
    def tenant(self) -> str:
        """The tenant whose ledger this writer appends to (``""`` by default)."""
        return self._ledger.tenant

    def append(self, kind: str, payload: bytes, idempotency_id: str) -> AppendResult:
        """Append one record (sessionstore SessionJournal.Append): ``kind``
        (text), ``payload`` (bytes, stored exactly) under ``idempotency_id``.
        Fenced by the writer's epoch in the append's own transaction: the lease
        fence, judged at a clock read after the lease row's lock, and the
        ledger's newest fence, judged with its tip locked.

        Returns the record's sequence; for an idempotency id already in the
        ledger with the same kind and payload, the original's sequence with
        ``duplicate=True`` (a redelivery), writing nothing.

        Raises:
            LeaseLostError: the lease expired, was released or taken over, or
                the ledger was fenced by another epoch; the writer is then
                ``fenced`` and every later append raises it too.
            LedgerIdempotencyConflictError: the id names other content.
            InvalidInputError: a bad kind, payload or id (see :class:`LedgerEntry`).
            InterfaceError: the writer was closed.
        On any error nothing is written.
        """
        return self.append_many([LedgerEntry(kind, payload, idempotency_id)])[0]

    def append_many(self, entries: Sequence[LedgerEntry]) -> list[AppendResult]:
        """Append ``entries`` (at most :data:`MAX_BATCH`) in order, in one
        transaction, fenced as :meth:`append` is: all are written, or none.
        Returns one :class:`AppendResult` per entry (a duplicate, also of an
        earlier entry of the same call, gives the original's sequence).

        Raises:
            as :meth:`append`; InvalidInputError for an empty or too long list;
            DurableBodyTooLargeError for a body over the ledger's
            ``max_body_bytes`` (every entry is checked before anything is
            written: ``Ledger.check_entries``).
        """
        checked = self._ledger.check_entries(entries)
        with self._lock:
            self._usable()
            try:
                return self._ledger._write_entries(self, checked)
            except errors.LeaseLostError:
                journal.MACHINE.require("append", "open", {"lease_held": False})
                self.state = "fenced"
                raise

    def close(self) -> None:
        """Close the writer (idempotent); the lease stays the holder's to release."""
        with self._lock:
            if self.state == "open":
                journal.MACHINE.require("close", "open", {})
                self.state = "closed"

    def _usable(self) -> None:
        if self.state == "fenced":
            raise errors.LeaseLostError(
                self.lease.target, detail="this ledger writer was fenced out earlier"
            )
        if self.state == "closed":
            raise errors.InterfaceError(detail="the ledger writer is closed")

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def command_id_key(command_id: str) -> str:
    """The idempotency id of command ``command_id``'s application record."""
    return f"command:{command_id}"


def encode_application(app: object) -> bytes:
    """``app`` as its ledger payload: canonical JSON (sorted keys) as UTF-8.

    Raises:
        InvalidInputError: not a CommandApplication, or an ``applied`` value
            JSON does not hold exactly.
    """
    if not isinstance(app, CommandApplication):
        raise errors.InvalidInputError(
            "app", f"expected a CommandApplication, got {type(app).__name__}"
        )
    check_id(app.command_id, "app.command_id")
    if not isinstance(app.applied, dict):
        raise errors.InvalidInputError("app.applied", "expected a JSON object")
    to_json(app.applied, "app.applied")
    body = {"command_id": app.command_id, "applied": app.applied}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_application(session_id: str, seq: int, kind: str, payload: bytes) -> CommandApplication:
    """The application stored at ``seq``.

    Raises:
        CommandApplicationNotFoundError: another kind of record, or one that
            does not decode (``__cause__`` an ``EnvelopeError``, whose own
            ``__cause__`` is the decoder's error).
    """
    if kind != COMMAND_APPLICATION_KIND:
        raise errors.CommandApplicationNotFoundError(
            session_id, seq, detail=f"the record is a {kind!r}, not a command application"
        )
    try:
        body: Any = records.loads_json(payload)
        command_id, applied = body["command_id"], body["applied"]
        if not isinstance(command_id, str) or not isinstance(applied, dict):
            raise ValueError("command_id or applied of the wrong type")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as failure:
        raise errors.CommandApplicationNotFoundError(
            session_id, seq, detail="the record does not decode"
        ) from records.envelope_error("a command application's body is not its JSON", failure)
    return CommandApplication(command_id, applied)


class RuntimeCommandLog:
    """The command log of one session (sessionstore RuntimeCommandLog), bound to
    its writer: appends go through the writer (fenced), reads through the store."""

    def __init__(self, writer: LedgerWriter, read_at: Callable[[int], CommandApplication]) -> None:
        self.writer = writer
        self.session_id = writer.session_id
        self._read_at = read_at

    def append_command_application(self, app: CommandApplication) -> AppendResult:
        """Make the application ``app`` durable (sessionstore
        AppendCommandApplication), under idempotency id ``command:<command_id>``.
        A second delivery of the command returns the original's sequence with
        ``duplicate=True``, whatever it would have applied: read the original
        with :meth:`read_command_application_at`.

        Raises:
            LeaseLostError, InterfaceError: as ``LedgerWriter.append``.
            InvalidInputError: a malformed application.
        """
        payload = encode_application(app)
        try:
            return self.writer.append(
                COMMAND_APPLICATION_KIND, payload, command_id_key(app.command_id)
            )
        except errors.LedgerIdempotencyConflictError as dup:
            return AppendResult(dup.seq, duplicate=True)

    def read_command_application_at(self, seq: int) -> CommandApplication:
        """The application at ``seq`` (sessionstore ReadCommandApplicationAt).

        Raises:
            CommandApplicationNotFoundError: as ``store.ledger.read_command_application_at``.
        """
        return self._read_at(seq)
