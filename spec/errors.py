"""The error hierarchy: one root, typed per failure, with structured fields.

Every error carries the fields that identify what failed (``target``,
``session_id``, ``key`` …) as attributes and is picklable. Domain errors are
named for the condition of the resource (busy, lost, exists, modified).
Backend failures are translated once, at the transaction boundary, into the
PEP 249-style classes below with the backend's exception as ``__cause__``;
a backend failure is never reported as busy or lease lost. Cancellation
(``KeyboardInterrupt``, ``asyncio.CancelledError``) is never wrapped.
"""

from __future__ import annotations

from typing import Any


class TurnkeeperError(Exception):
    """Root of every error turnkeeper raises.

    Subclasses declare their identifying fields in ``fields``; the values are
    set as attributes and used for the message, equality in tests and pickling.
    """

    fields: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        values = dict(zip(self.fields, args, strict=False))
        overlap = values.keys() & kwargs.keys()
        if overlap:
            raise TypeError(f"{type(self).__name__}: duplicate field(s) {sorted(overlap)}")
        values.update(kwargs)
        unknown = values.keys() - set(self.fields) - {"detail"}
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown field(s) {sorted(unknown)}")
        for name in self.fields:
            setattr(self, name, values.get(name))
        self.detail: str | None = values.get("detail")
        self._values = values
        super().__init__(self._message())

    def _message(self) -> str:
        doc = (type(self).__doc__ or type(self).__name__).strip().splitlines()[0].rstrip(".")
        parts = [f"{name}={getattr(self, name)!r}" for name in self.fields]
        text = f"{doc} ({', '.join(parts)})" if parts else doc
        return f"{text}: {self.detail}" if self.detail else text

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._values))


def _rebuild(cls: type[TurnkeeperError], values: dict[str, Any]) -> TurnkeeperError:
    return cls(**values)


# --- PEP 249-style classes for backend failures -----------------------------


class InterfaceError(TurnkeeperError):
    """The store object was misused (for example used after close)."""


class DatabaseError(TurnkeeperError):
    """The database backend failed; the backend's exception is ``__cause__``."""


class OperationalError(DatabaseError):
    """The database could not carry out the operation (I/O, locks, resources)."""


class StoreLockedError(OperationalError):
    """The database file is held by another process."""

    fields = ("path",)
    path: str


class ReadOnlyError(OperationalError):
    """The store was opened read-only and the operation writes."""

    fields = ("path",)
    path: str


class StoreNotFoundError(OperationalError):
    """No database file exists at the path (a read-only open never creates one)."""

    fields = ("path",)
    path: str


class CorruptDatabaseError(OperationalError):
    """The database cannot be opened: one of its files is corrupt.

    ``file`` is the damaged file: the database file itself, or its
    write-ahead log (``<path>.wal``); ``detail`` says what the user can do.
    """

    fields = ("path", "file")
    path: str
    file: str


class CheckpointError(OperationalError):
    """The store closed, but its write-ahead log could not be folded into the file.

    Every committed write is still in ``<path>.wal``, which the next open
    replays; ``detail`` says why the checkpoint failed (a full disk …).
    """

    fields = ("path",)
    path: str


class TransactionConflictError(OperationalError):
    """A write kept losing write-write conflicts after every retry."""

    fields = ("operation", "attempts")
    operation: str
    attempts: int


class IntegrityError(DatabaseError):
    """A database constraint rejected the write."""


class DataError(DatabaseError):
    """The backend could not store or convert a value."""


class ProgrammingError(DatabaseError):
    """The backend rejected a statement (schema or SQL fault)."""


class InternalError(DatabaseError):
    """The backend reported an internal fault."""


class UnexpectedResultError(InternalError):
    """The database answered a statement with a result that statement cannot have.

    ``expected`` names the result the statement always has (the row its
    ``INSERT … RETURNING`` wrote, an aggregate's one row, a row the same
    transaction read or wrote before). Seen when a connection pooler in
    transaction mode ran another statement's prepared plan under the same
    name (open the store with ``pooler="transaction"``), or when the
    database is damaged. The operation's transaction was rolled back:
    nothing of it was written.
    """

    fields = ("expected",)
    expected: str


class NotSupportedError(DatabaseError):
    """The backend does not support the requested feature."""


class PoolerError(NotSupportedError):
    """A connection pooler between the store and the server cannot give what is asked.

    ``feature`` is what it cannot give: ``"LISTEN"`` (wake-ups need a
    session of their own, which a transaction-mode pooler does not keep:
    give the store a direct ``listen_url``), ``"listen_url"`` (that URL goes
    through a transaction-mode pooler too, or reaches another server or
    database than the store's), ``"search_path"`` (the pooler's server
    connections are not in the schema the URL's ``options`` name: it
    dropped them) or ``"options"`` (it refused them). ``detail`` says what
    to do; nothing was written.
    """

    fields = ("path", "feature")
    path: str
    feature: str


class SchemaVersionError(DatabaseError):
    """The database's schema version is not one this turnkeeper can open as it is.

    ``found`` is newer than ``supported`` (upgrade turnkeeper), or older and
    the open was read-only (open it writable once to migrate); ``detail``
    says which.
    """

    fields = ("path", "found", "supported")
    path: str
    found: int
    supported: int


class ForeignDatabaseError(DatabaseError):
    """The file is not a turnkeeper database.

    It is not a DuckDB database at all, or it is another application's
    (tables, but no turnkeeper schema); nothing in it was changed.
    """

    fields = ("path",)
    path: str


# --- input ------------------------------------------------------------------


class InvalidInputError(TurnkeeperError, ValueError):
    """An argument was refused before anything was written."""

    fields = ("field", "reason")
    field: str
    reason: str


class InvalidTransitionError(TurnkeeperError):
    """A lifecycle machine has no edge for this trigger from this state."""

    fields = ("machine", "trigger", "source")
    machine: str
    trigger: str
    source: str


# --- leases (threadstore AcquireLease / RenewLease / ReleaseLease) ---------


class BusyError(TurnkeeperError):
    """The target is held by another owner whose lease has not expired."""

    fields: tuple[str, ...] = ("target", "holder")
    target: str
    holder: str | None


class LeasePurposeError(TurnkeeperError):
    """The owner already holds the target under a different purpose."""

    fields = ("target", "held_purpose", "requested_purpose")
    target: str
    held_purpose: str
    requested_purpose: str


class LeaseLostError(TurnkeeperError):
    """The caller no longer owns the lease (expired, released or taken over)."""

    fields = ("target",)
    target: str


# --- thread records (threadstore Resolve / Finalize) ------------------------


class AlreadyExistsError(TurnkeeperError):
    """The thread key already has an active record (require_key_absent)."""

    fields = ("key",)
    key: str


class RecordNotFoundError(TurnkeeperError):
    """No thread record has this id."""

    fields = ("record_id",)
    record_id: str


class RecordNotActiveError(TurnkeeperError):
    """The thread record is not active, so it cannot be archived or replaced."""

    fields = ("record_id", "status")
    record_id: str
    status: str


# --- sessions (session seed) -------------------------------------------------


class SessionIDExistsError(TurnkeeperError):
    """A new session tried to reuse an existing session id (ErrSessionIDExists)."""

    fields = ("session_id",)
    session_id: str


class SessionNotFoundError(TurnkeeperError):
    """No session has this id."""

    fields = ("session_id",)
    session_id: str


class SessionModifiedError(TurnkeeperError):
    """The session's leaf moved since the caller read it (ErrSessionModified)."""

    fields = ("session_id", "expected_leaf", "actual_leaf")
    session_id: str
    expected_leaf: str | None
    actual_leaf: str | None


class EntryNotFoundError(TurnkeeperError):
    """No entry with this id exists in the session."""

    fields = ("session_id", "entry_id")
    session_id: str
    entry_id: str


class ToolCallPairingError(TurnkeeperError):
    """The write would leave a toolResult in the replayed context without its toolCall.

    A model provider rejects such a context. ``entry_id`` names the
    ``toolResult``: the one being appended, or the kept one a compaction would
    cut its call from. ``reason`` is ``"unpaired"`` (no ``toolCall`` with
    ``tool_call_id`` is in the context), ``"duplicate"`` (the call was already
    answered there), ``"late"`` (other messages followed the call before this
    result: a provider takes results only right after the call's assistant
    message) or ``"cut"``. Nothing is written.
    """

    fields = ("session_id", "entry_id", "tool_call_id", "reason")
    session_id: str
    entry_id: str
    tool_call_id: str
    reason: str


class EntryExistsError(TurnkeeperError):
    """An entry with this id already exists in the session."""

    fields = ("session_id", "entry_id")
    session_id: str
    entry_id: str


class SessionFileError(TurnkeeperError):
    """A session file cannot be imported at all (no usable header)."""

    fields = ("path", "line")
    path: str
    line: int


# --- runs (session seed) -------------------------------------------------------


class RunNotFoundError(TurnkeeperError):
    """No run has this id."""

    fields = ("run_id",)
    run_id: str


class SessionRunActiveError(TurnkeeperError):
    """The session already has a non-terminal run (ErrSessionRunActive)."""

    fields = ("session_id", "run_id")
    session_id: str
    run_id: str


class SubmissionConflictError(TurnkeeperError):
    """The submission key was used for a different request (ErrRuntimeSubmissionConflict).

    ``run_id`` is the run the key admitted first.
    """

    fields = ("session_id", "run_id")
    session_id: str
    run_id: str


class RetryNotAllowedError(TurnkeeperError):
    """A retry must follow the intent's latest attempt, once it is terminal."""

    fields = ("run_id", "reason")
    run_id: str
    reason: str


class RecoveryNotNeededError(TurnkeeperError):
    """The run needs no recovery (ErrSessionRecoveryNotNeeded).

    It is terminal, not the session's active run, or its recovery is parked;
    ``reason`` says which."""

    fields = ("run_id", "reason")
    run_id: str
    reason: str


# --- delivery outbox (session seed, DESIGN machine 4) ---------------------------


class DeliveryOperationNotFoundError(TurnkeeperError):
    """No delivery operation (or intent) has this id (ErrDeliveryOperationAbsent)."""

    fields = ("operation_id",)
    operation_id: str


class DeliveryOperationBusyError(TurnkeeperError):
    """The delivery operation is claimed or not ready (ErrDeliveryOperationBusy).

    It is claimed by a live claim, not due yet, terminal, or waiting on its
    dependency; ``reason`` says which."""

    fields = ("operation_id", "reason")
    operation_id: str
    reason: str


class DeliveryLeaseLostError(TurnkeeperError):
    """The caller's claim on the delivery operation is lost (ErrDeliveryLeaseLost).

    Another claim raised the epoch, the claim expired, or it was released or
    ended by a result."""

    fields = ("operation_id", "owner", "epoch")
    operation_id: str
    owner: str
    epoch: int


class DeliveryPlanConflictError(TurnkeeperError):
    """The run already has a different delivery plan (one intent per run)."""

    fields = ("run_id", "intent_id")
    run_id: str
    intent_id: str


# --- tool-execution records (session seed ToolExecutionRecord, DESIGN machine 5) ---


class ToolExecutionNotFoundError(TurnkeeperError):
    """No tool-execution record has this execution key."""

    fields = ("execution_key",)
    execution_key: str


class ToolExecutionConflictError(TurnkeeperError):
    """The execution key is bound to another tool call than this claim's.

    The first claim binds a key to its session, run, turn, provider call id,
    tool name, side-effecting flag and argument digest; ``field`` names the
    first of them this claim differs in, ``run_id`` the run that owns the
    record. Another call's record (and result) is never returned as this one's.
    """

    fields = ("execution_key", "field", "run_id")
    execution_key: str
    field: str
    run_id: str | None


# --- forks (session seed ForkSession) ---------------------------------------------


class ForkError(TurnkeeperError):
    """A session fork was refused; subclasses name why (session seed ErrFork*)."""

    fields: tuple[str, ...] = ("session_id",)
    session_id: str


class ForkSessionNotFoundError(ForkError):
    """The fork's source session was not found (ErrForkSessionNotFound)."""


class ForkSessionActiveError(ForkError):
    """The fork's source session has a non-terminal run or a live lease (ErrForkSessionActive)."""


class ForkSessionBusyError(ForkSessionActiveError, BusyError):
    """The fork's source session is held by a live lease and the fork has none
    (ErrForkSessionActive); a ``BusyError`` like every lease-less session write."""

    fields = ("session_id", "target", "holder")


class ForkNoCompletedTurnError(ForkError):
    """The source session has no completed conversation turn (ErrForkNoCompletedTurn)."""


class ForkUnavailableError(ForkError):
    """The fork boundary is unavailable (ErrForkUnavailable)."""


class ForkInvalidBoundaryError(ForkError):
    """The fork boundary is invalid (ErrForkInvalidBoundary)."""


class ForkUnsupportedEntryError(ForkError):
    """The fork would copy an entry it cannot copy (ErrForkUnsupportedEntry)."""

    fields = ("session_id", "entry_id")
    entry_id: str


class ForkRequestIDRequiredError(ForkError):
    """A fork needs a request id (ErrForkIdempotencyRequired)."""


class ForkRequestIDTooLongError(ForkError):
    """The fork request id is too long (ErrForkIdempotencyTooLong)."""

    fields = ("session_id", "length", "limit")
    length: int
    limit: int


class ForkRequestConflictError(ForkError):
    """The fork request id was used for a different fork (ErrForkIdempotencyConflict).

    ``fork_session_id`` is the session the id created first.
    """

    fields = ("session_id", "request_id", "fork_session_id")
    request_id: str
    fork_session_id: str
