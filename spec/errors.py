"""The error hierarchy: one root, typed per failure, with structured fields.

Every error carries the fields that identify what failed (``target``,
``session_id``, ``key`` …) as attributes and is picklable. Domain errors are
named for the condition of the resource (busy, lost, exists, modified).
Backend failures are translated once, at the transaction boundary, into the
PEP 249-style classes below with the backend's exception as ``__cause__``;
a backend failure is never reported as busy or lease lost. Cancellation
(``KeyboardInterrupt``, ``asyncio.CancelledError``) is never wrapped.
"""

from collections.abc import Sequence as _Sequence
from typing import Any as _Any


class TurnkeeperError(Exception):
    """Root of every error turnkeeper raises.

    Subclasses declare their identifying fields in ``fields``; the values are
    set as attributes and used for the message, equality in tests and pickling.
    """

    fields: tuple[str, ...] = ()

    def __init__(self, *args: _Any, **kwargs: _Any) -> None:
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

    def __reduce__(self) -> tuple[_Any, ...]:
        return (_rebuild, (type(self), self._values))


def _rebuild(cls: type[TurnkeeperError], values: dict[str, _Any]) -> TurnkeeperError:
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
    write-ahead log (``<path>.wal``); ``offset`` is where in ``file`` the
    damage starts (bytes from its start), when known (``None`` otherwise);
    ``detail`` says what the user can do (for a write-ahead log:
    ``turnkeeper repair``, which keeps every write before ``offset``).
    """

    fields = ("path", "file", "offset")
    path: str
    file: str
    offset: int | None


class CheckpointError(OperationalError):
    """The store closed, but its write-ahead log could not be folded into the file.

    Every committed write is still in ``<path>.wal``, which the next open
    replays; ``detail`` says why the checkpoint failed (a full disk …).
    """

    fields = ("path",)
    path: str


class StoreInvalidatedError(OperationalError):
    """The database was invalidated by a fatal error and must be reopened.

    DuckDB refuses every statement on a database after a fatal error (a
    checkpoint that hit a full disk …) until it is opened again. Nothing
    committed is lost: the write-ahead log holds every committed write, and
    reopening replays it. The store reopens the file by itself at the next
    call once it can; this error means that call could not (``detail`` says
    why: another process opened the file meanwhile …), or that the
    single-statement write it cut short committed (``detail`` says so). Call
    again (the store tries to reopen at each call), or close every store
    object on the file in this process and open it again.
    """

    fields = ("path",)
    path: str


class DiskFullError(OperationalError):
    """The disk (or quota) holding the database is full.

    Nothing of the failed operation is kept (a write was not committed) and
    nothing committed before it is lost; reads go on working. Free space and
    call again.
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


class SchemaNotFoundError(ProgrammingError):
    """The schema the store is to use does not exist, and its role may not create it.

    ``schema`` is the first schema of the connection's ``search_path`` (the
    URL's ``options``, or the role's or database's default); the store
    creates it at open where its role may (``CREATE`` on the database), and
    otherwise ``detail`` names the ``CREATE SCHEMA`` to run as a role that
    may. Nothing was written.
    """

    fields = ("path", "schema")
    path: str
    schema: str


class TemporarySchemaError(ProgrammingError):
    """The search_path puts the store in the session's temporary schema.

    ``schema`` is the first schema of the connection's ``search_path``
    (``pg_temp``, or the ``$user`` or name before it). Tables created there
    are dropped when the connection closes, so every write would be lost:
    the open is refused before anything is written; ``detail`` says what to
    name instead.
    """

    fields = ("path", "schema")
    path: str
    schema: str


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

    fields: tuple[str, ...] = ("machine", "trigger", "source")
    machine: str
    trigger: str
    source: str


# --- leases (threadstore AcquireLease / RenewLease / ReleaseLease) ---------


class BusyError(TurnkeeperError):
    """The target is held under a live lease that this call does not hold.

    ``holder`` is the owner named on that lease; ``detail`` says what the
    call did: an acquire by another owner (:meth:`another_owner`), an
    acquire under the holder's own name from another store object or
    process, whose lease this is not (:meth:`same_owner_elsewhere`), or a
    write without ``lease=`` while the lease is live (:meth:`unleased_write`:
    the store cannot tell whether the caller is the holder, so it never
    claims it is someone else).
    """

    fields: tuple[str, ...] = ("target", "holder")
    target: str
    holder: str | None

    @classmethod
    def another_owner(cls, target: str, holder: str | None) -> "BusyError":
        """An acquire refused: owner ``holder`` holds ``target`` under a live lease."""
        return cls(target, holder, detail=f"another owner ({holder!r}) holds a live lease on it")

    @classmethod
    def same_owner_elsewhere(cls, target: str, holder: str | None) -> "BusyError":
        """An acquire refused: the live lease on ``target`` carries the caller's
        owner name but was taken by another store object or process (a lease
        belongs to the store object that took it)."""
        return cls(
            target,
            holder,
            detail=(
                f"owner {holder!r} (this caller's name) holds a live lease on it taken by "
                "another store object or process, whose token this store object does not "
                "have: give each worker its own owner name, or wait until it expires"
            ),
        )

    @classmethod
    def unleased_write(cls, target: str, holder: str | None) -> "BusyError":
        """A write without ``lease=`` refused: ``target`` is held under a live lease."""
        return cls(
            target,
            holder,
            detail=(
                f"written without lease= while a live lease of owner {holder!r} is held on it; "
                "a write to a held target must pass that lease (if this caller holds it, "
                "pass it as lease=), or wait until it is released or expires"
            ),
        )


class LeasePurposeError(TurnkeeperError):
    """The lease's purpose does not allow this operation (ErrRuntimeLeasePurpose).

    ``held_purpose`` is the lease's purpose, ``requested_purpose`` the one the
    operation needs (or the one an owner asked for while holding the target
    under another)."""

    fields = ("target", "held_purpose", "requested_purpose")
    target: str
    held_purpose: str
    requested_purpose: str


class RuntimeSessionNotFoundError(TurnkeeperError):
    """A runtime lease names a session that does not exist (ErrRuntimeSessionNotFound).

    Raised by ``store.leases.acquire`` for a ``session:<id>`` target whose
    session was never created (or is gone); nothing is granted."""

    fields = ("session_id",)
    session_id: str


class SessionRecoveryRequiredError(TurnkeeperError):
    """The session has a non-terminal run with no live owner (ErrSessionRecoveryRequired).

    Raised by ``store.leases.acquire`` when an ``admission``, ``execution``,
    ``mutation`` or ``fork`` lease would be granted on a session whose run is
    still active: nobody held the session, so that run is an orphan, to
    recover first (a ``recovery`` lease, ``store.recovery``)."""

    fields = ("session_id", "run_id")
    session_id: str
    run_id: str


class RuntimeLeaseRunMismatchError(TurnkeeperError):
    """The lease is not bound to the session's active run (ErrRuntimeLeaseRunMismatch).

    ``run_id`` is the run the caller named, ``active_run_id`` the session's
    non-terminal run (``None``: it has none)."""

    fields = ("target", "run_id", "active_run_id")
    target: str
    run_id: str
    active_run_id: str | None


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


class ProjectNotFoundError(TurnkeeperError):
    """No project has this id (store.projects; the seed's DeleteProject,
    RenameProject and SetSessionMetadata fail on an unknown project id)."""

    fields = ("project_id",)
    project_id: str


class ProjectExistsError(TurnkeeperError):
    """A new project attempted to reuse an existing project's id (CreateProject)."""

    fields = ("project_id",)
    project_id: str


class ChannelBoundError(TurnkeeperError):
    """The channel identity is bound to another session (store.bindings).

    Raised by ``store.bindings.bind``, ``create_bound`` and ``transfer`` when
    ``(channel_type, channel_id)`` already names ``session_id``, another
    session than the one the call would bind: a channel has at most one
    session. Move it with ``store.bindings.transfer`` (the seed's
    TransferBinding) or ``rotate``. Nothing is written."""

    fields = ("channel_type", "channel_id", "session_id")
    channel_type: str
    channel_id: str
    session_id: str


class SessionBoundError(TurnkeeperError):
    """The session is bound to another channel identity (store.bindings).

    Raised by ``store.bindings.bind`` and ``transfer`` when session
    ``session_id`` is already bound to ``(channel_type, channel_id)``, another
    channel: a session has at most one binding (FindBindingBySessionID), and
    binding it elsewhere would leave that channel without its session.
    Unbind it first. Nothing is written."""

    fields = ("session_id", "channel_type", "channel_id")
    session_id: str
    channel_type: str
    channel_id: str


class BindingNotFoundError(TurnkeeperError):
    """The channel identity is not bound to the session the call names (store.bindings).

    Raised by ``store.bindings.transfer`` (TransferBinding's ``fromSessionID``)
    and ``rotate`` (RotateBoundSession's ``oldSessionID``): the move is a
    compare-and-set on the binding, and ``(channel_type, channel_id)`` is
    bound to ``bound_session_id`` now (``None``: to no session), not to
    ``session_id``. Nothing is written."""

    fields = ("channel_type", "channel_id", "session_id", "bound_session_id")
    channel_type: str
    channel_id: str
    session_id: str
    bound_session_id: str | None


class AmbiguousSessionIDError(TurnkeeperError):
    """More than one session's id starts with this prefix.

    Session seed OpenByID: "if sessionID matches multiple sessions, an error is
    returned".

    ``candidates`` holds the matching ids, sorted (at most
    ``storage.ops.open_ids.CANDIDATES`` of them: more may match).
    """

    fields = ("prefix", "candidates")
    prefix: str
    candidates: tuple[str, ...]


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
    """The write would break the tool-call pairing of the replayed context.

    A model provider rejects such a context; ``turnkeeper.storage.pairing``
    states the rule. ``reason`` says what the write would do, and the
    message says it in words:

    - ``"unpaired"``: the ``toolResult`` ``entry_id`` answers
      ``tool_call_id``, which no tool call in the replayed context makes;
    - ``"duplicate"``: it answers ``tool_call_id`` a second time (the call
      already has its result there);
    - ``"late"``: other messages followed the call before this result (a
      provider takes a call's results only right after the assistant message
      that made it);
    - ``"cut"``: a compaction would keep the ``toolResult`` ``entry_id`` but
      cut off its call (``firstKeptEntryId`` between them), or keep another
      fault;
    - ``"unanswered"``: the message ``entry_id`` would follow tool calls that
      have no result yet (raised as :class:`ToolCallsUnansweredError`, which
      names every such call).

    Nothing is written.
    """

    fields: tuple[str, ...] = ("session_id", "entry_id", "tool_call_id", "reason")
    session_id: str
    entry_id: str
    tool_call_id: str
    reason: str

    def _message(self) -> str:
        sid, eid, call = self.session_id, self.entry_id, self.tool_call_id
        says = {
            "unpaired": f"toolResult {eid!r} answers tool call {call!r}, which no tool call "
            "in the replayed context makes",
            "duplicate": f"toolResult {eid!r} answers tool call {call!r} a second time: the "
            "call already has its result in the replayed context",
            "late": f"toolResult {eid!r} answers tool call {call!r} too late: other messages "
            "followed the call, and a provider takes a call's results only right after the "
            "assistant message that made it",
            "cut": f"the compaction would keep toolResult {eid!r} but cut off its tool call "
            f"{call!r} (firstKeptEntryId lies between them)",
        }
        text = says.get(self.reason, f"entry {eid!r} breaks the pairing of tool call {call!r}")
        parts = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.fields)
        text = f"Session {sid!r}: {text} ({parts})"
        return f"{text}: {self.detail}" if self.detail else text


class ToolCallsUnansweredError(ToolCallPairingError):
    """A message would follow tool calls that have no result yet.

    A provider takes no other message between an assistant message's tool
    calls and their results, so ``entry_id`` (a user, assistant or any other
    message) is refused while ``tool_call_ids`` (in call order) are open in
    the session's replayed context. Answer each first: append each call's
    result, or let the store close them (``tools.interrupt``, or
    ``runs.finish`` at the run's end, closes every open call: the tool's own
    result from a completed record, an explicit interrupted one otherwise).
    ``reason`` is ``"unanswered"`` and ``tool_call_id`` the first open call.
    Nothing is written.
    """

    fields = ("session_id", "entry_id", "tool_call_ids")
    tool_call_ids: tuple[str, ...]
    reason = "unanswered"

    def __init__(
        self, session_id: str, entry_id: str, tool_call_ids: _Sequence[str], **kwargs: _Any
    ) -> None:
        ids = tuple(tool_call_ids)
        self.tool_call_id = ids[0] if ids else ""
        super().__init__(session_id, entry_id, ids, **kwargs)

    def _message(self) -> str:
        calls = ", ".join(repr(c) for c in self.tool_call_ids)
        text = (
            f"Session {self.session_id!r}: message {self.entry_id!r} would follow tool calls "
            f"that have no result yet ({calls}); answer each first (append its result), "
            "or close them all (tools.interrupt, or runs.finish at the run's end)"
        )
        return f"{text}: {self.detail}" if self.detail else text


class EntryExistsError(TurnkeeperError):
    """An entry with this id already exists in the session."""

    fields = ("session_id", "entry_id")
    session_id: str
    entry_id: str


class EntryIdReservedError(TurnkeeperError):
    """The entry id is not free for this write: the session refers to it.

    ``reason`` says how, and ``by`` names what refers to it:

    - ``"parent"``: entry ``by`` of the session names ``entry_id`` as its
      parent, and no entry has that id (an entry imported without its
      parent). An entry written under the id would become that parent and
      move ``by``'s branch (and every entry below it) under itself, where no
      write judged it. Choose another id; an import that holds the parent
      may supply it (an import judges the whole tree);
    - ``"run"``: run ``by`` of the session has not ended, and the store
      writes entries under ids derived from it (its reply
      ``<run>:assistant``, its turn end ``<run>:turn-end``, the results of
      calls its end closes ``<run>:<call>:interrupted``); an import may not
      take one, or hang an entry under one.

    Nothing is written.
    """

    fields = ("session_id", "entry_id", "reason", "by")
    session_id: str
    entry_id: str
    reason: str
    by: str


class ImportTailStoredError(TurnkeeperError):
    """An import that read only the lines appended to a file since its last
    import (``ImportStream.from_line`` above 1) met an entry id the session
    already holds. The line may repeat an id read before (an import of the
    whole file keeps such a line as an opaque record, with the issue
    "duplicate entry id") or name an entry stored another way (skipped):
    only the whole file tells which. Nothing is written;
    ``turnkeeper.formats`` then imports the file whole."""

    fields = ("session_id", "entry_id")
    session_id: str
    entry_id: str


class EntryCycleError(TurnkeeperError):
    """The entries' parents would form a cycle: no branch through them has a root.

    Each entry's parent chain would come back to it. ``entry_ids`` are the
    entries of the cycle, each the parent of the one before it (the last
    one's parent is the first). Replay walks a branch from its leaf through the
    parents; a cycle has no leaf and no root, and a context judged along it
    depends on where the walk starts. Nothing is written.
    """

    fields = ("session_id", "entry_ids")
    session_id: str
    entry_ids: tuple[str, ...]


class SessionFileError(TurnkeeperError):
    """A session file cannot be imported at all (no usable header)."""

    fields = ("path", "line")
    path: str
    line: int


class SessionFormatUnknownError(SessionFileError):
    """No importer knows this session file's format (pi, Claude Code, Codex).

    ``line`` is the line of the first record (0: the file has none);
    ``detail`` says what was found there.
    """


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


class ExecutionIntentConflictError(TurnkeeperError):
    """The intent id already names a different execution intent (session seed
    SaveExecutionIntent: an intent is immutable). ``session_id`` is the
    stored intent's session."""

    fields = ("intent_id", "session_id")
    intent_id: str
    session_id: str


class ExecutionIntentNotFoundError(TurnkeeperError):
    """No execution intent of this session has this id (``runs.admit(intent_id=…)``)."""

    fields = ("intent_id", "session_id")
    intent_id: str
    session_id: str


class RunEventConflictError(TurnkeeperError):
    """The run event id already names a different event (session seed
    SaveSessionRunEvent: a caller's own event id makes a retry after an
    unknown commit safe). ``run_id`` is the stored event's run."""

    fields = ("event_id", "run_id")
    event_id: str
    run_id: str


class ConversationTurnNotOpenError(TurnkeeperError):
    """The conversation turn is not open (ErrConversationTurnNotOpen).

    ``status`` is the turn's (it ended in another status), or ``None`` when
    no turn has this id; ``session_id`` is its session (``None``: no turn)."""

    fields = ("turn_id", "session_id", "status")
    turn_id: str
    session_id: str | None
    status: str | None


class ConversationTurnOpenError(TurnkeeperError):
    """The session already has an open conversation turn: a turn starts once
    the one before it ended (``runs.start_turn``; beyond the seed).

    ``turn_id`` names the open turn."""

    fields = ("session_id", "turn_id")
    session_id: str
    turn_id: str


class ConversationTurnExistsError(TurnkeeperError):
    """The turn id already names another turn (of another run, or one that
    ended): ``runs.start_turn`` returns only a still open turn of the same run
    (a retry) as stored. Beyond the seed. ``session_id`` is that turn's."""

    fields = ("turn_id", "session_id")
    turn_id: str
    session_id: str


class RecoveryNotNeededError(TurnkeeperError):
    """The run needs no recovery (ErrSessionRecoveryNotNeeded).

    It is terminal, not the session's active run, or its recovery is parked;
    ``reason`` says which."""

    fields = ("run_id", "reason")
    run_id: str
    reason: str


class RemoteRunNotRetainedError(TurnkeeperError):
    """No remote run record keeps the run recoverable, so its recovery cannot be
    detached (MarkSessionRunRecoveryDetached: the marker records that a
    canonical remote record was retained; the response record, not the marker,
    is the evidence that the provider execution is still recoverable).

    The run's session has no :class:`~turnkeeper.spec.records.ResponseRun`
    linked to it, or the newest one has no response id or provider, or has
    reached a terminal state (``reason`` says which): converge the run instead."""

    fields = ("run_id", "reason")
    run_id: str
    reason: str


# --- usage (session seed RecordUsage) ----------------------------------------------


class UsageConflictError(TurnkeeperError):
    """A usage id was recorded before with other figures (RecordUsage).

    Recording the same usage again under its id (a retry after an unknown
    commit) returns the stored record; other figures, names, run or time
    under that id are another request, refused."""

    fields = ("session_id", "usage_id")
    session_id: str
    usage_id: str


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


class CapabilityEventConflictError(TurnkeeperError):
    """The capability event id already names a different event (session seed
    SaveSessionCapabilityEvent: a deterministic id is for retrying the same
    event). ``session_id`` is the stored event's session."""

    fields = ("event_id", "session_id")
    event_id: str
    session_id: str


class GuidanceConflictError(TurnkeeperError):
    """The guidance id already names other guidance (session seed
    SaveESMGuidance: the same guidance again is a retry, written once).
    ``session_id`` is the stored guidance's session."""

    fields = ("guidance_id", "session_id")
    guidance_id: str
    session_id: str


class ResourceEventConflictError(TurnkeeperError):
    """The input resource event id already names a different event (session
    seed SaveInputResourceEvent: deterministic ids make a retry after an
    unknown commit safe). ``session_id`` is the stored event's session."""

    fields = ("event_id", "session_id")
    event_id: str
    session_id: str


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


class ToolExecutionNotReclaimableError(InvalidTransitionError):
    """The tool-execution record cannot be reopened to run its tool again
    (session seed ReclaimInterruptedToolExecution, which answers ``false``).

    ``source`` is the record's state, ``reason`` why:

    - ``"terminal"``: it is ``completed`` (use its stored result) or
      ``abandoned`` (a new run makes a new call): never reopened;
    - ``"needs_confirmation"``: its tool is side-effecting and the user has
      not confirmed a re-run (``tools.request_recovery``, which takes
      an ``interrupted`` record to ``retry_requested``; a ``running`` one is
      interrupted first, once its process is gone).

    ``machine`` is ``"tool_execution"`` and ``trigger`` ``"reclaim"``, as
    for any refused transition. Nothing is written.
    """

    fields = ("execution_key", "source", "reason", "machine", "trigger")
    execution_key: str
    reason: str

    def __init__(self, execution_key: str, source: str, reason: str, **kwargs: _Any) -> None:
        kwargs.setdefault("machine", "tool_execution")
        kwargs.setdefault("trigger", "reclaim")
        super().__init__(execution_key, source, reason, **kwargs)

    def _message(self) -> str:
        why = {
            "terminal": f"a {self.source} record is never reopened"
            + (
                ": use its stored result"
                if self.source == "completed"
                else ": a new run makes a new call"
            ),
            "needs_confirmation": "its tool has side effects, so it runs again only after the "
            "user confirms (tools.request_recovery"
            + (", once the record is interrupted)" if self.source == "running" else ")"),
        }.get(self.reason, self.reason)
        text = (
            f"Tool execution {self.execution_key!r} cannot be reclaimed from "
            f"{self.source!r}: {why} (execution_key={self.execution_key!r}, "
            f"source={self.source!r}, reason={self.reason!r})"
        )
        return f"{text}: {self.detail}" if self.detail else text


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


# --- the ledger (sessionstore seed: journal, replay, command log) -------------------


class NilLeaseError(TurnkeeperError):
    """A ledger writer was opened without a lease (sessionstore NilLeaseError).

    ``store.ledger.open`` (OpenJournal) requires the session's lease, taken with
    ``store.leases.acquire("session:<id>", …)``: the open fails closed rather
    than writing a fence record with no epoch. Nothing is written."""

    fields = ("session_id",)
    session_id: str


class OpeningFenceConflictError(TurnkeeperError):
    """The ledger's opening fence lost the ownership race (sessionstore
    OpeningFenceConflictError).

    The ledger's tip moved from ``expected_tip`` (read by the open) to
    ``found_tip`` before the open's compare-and-set planted its fence record.
    Not transient: the grant of ``epoch`` is spent and has been released; the
    caller takes a fresh lease (a strictly higher epoch) and opens a new
    writer. The open never rebases the grant onto the new tip."""

    fields = ("session_id", "epoch", "expected_tip", "found_tip")
    session_id: str
    epoch: int
    expected_tip: int
    found_tip: int


class LedgerIdempotencyConflictError(TurnkeeperError):
    """A ledger append reused an idempotency id with other content.

    The record first appended under ``idempotency_id`` is at ``seq`` with
    another kind or payload; the append writes nothing (a duplicate delivery
    of the same content returns ``seq`` instead)."""

    fields = ("session_id", "idempotency_id", "seq")
    session_id: str
    idempotency_id: str
    seq: int


class LedgerTipDamagedError(TurnkeeperError):
    """A ledger write found a record past the ledger's tip: the tip row was
    lowered or lost by something outside the store (a restore, a hand edit).

    ``tip`` is the tip the write read (0: no tip row), ``seq`` the first
    record found past it. The open or append writes nothing and is not
    retried (the record is damage, not a concurrent writer: the tip's row
    lock orders every writer). Replay fails closed on the same ledger
    (``ReplayReadError`` at ``tip + 1``), and ``turnkeeper ledger verify``
    reports it."""

    fields = ("session_id", "tip", "seq")
    session_id: str
    tip: int
    seq: int


class ReplayDecodeError(TurnkeeperError):
    """A replayed ledger record could not be decoded into its typed form
    (sessionstore ReplayDecodeError).

    ``seq`` is the record's sequence; ``detail`` says what failed (its payload
    does not hash to its stored sha256, the record does not match its record
    digest (its tenant, session, sequence, kind, idempotency id, epoch or
    payload changed, or copied from elsewhere), a blob pointer that does not
    decode, is not its own ledger's or misstates its size, a fence's epoch
    below an earlier fence's, a record stamped with another epoch than the
    fence before it …).
    Replay raises it rather than skipping or zero-valuing the record."""

    fields = ("session_id", "seq")
    session_id: str
    seq: int


class ReplayReadError(TurnkeeperError):
    """The next ledger record could not be read (sessionstore ReplayReadError).

    ``name`` is the ledger (``ledger:<session id>``), ``seq`` the sequence the
    replay expected next; the cause (a backend failure) is ``__cause__``, or
    ``detail`` says which record is missing from the sequence. Replay raises
    it rather than guessing the backlog is drained."""

    fields = ("name", "seq")
    name: str
    seq: int


class EmptySessionError(TurnkeeperError):
    """The session's ledger holds no record: nothing to replay or index
    (sessionstore EmptySessionError)."""

    fields = ("session_id",)
    session_id: str


class BlobNotFoundError(TurnkeeperError):
    """A blob store holds no blob under ``key`` (sessionstore storage.BlobNotFoundError)."""

    fields = ("key",)
    key: str


class BlobCondemnedError(TurnkeeperError):
    """An append's blob pointer names a blob that ledger GC has condemned
    (deleted, or its delete under way): the append is refused and writes nothing.

    The writer answers it itself, by writing the record's blob again under a
    new name (the next *generation* of its envelope) and appending again, so
    a caller sees it only when ``condemn.MAX_GENERATIONS`` generations of one
    record's blob are all condemned. ``session_id`` is the ledger's, ``key``
    the condemned blob's (see ``storage/ops/ledger/condemn.py``)."""

    fields = ("session_id", "key")
    session_id: str
    key: str


class BlobIntegrityError(TurnkeeperError):
    """An offloaded record's blob does not hash to the sha256 its pointer names
    (sessionstore BlobIntegrityError).

    The blob was corrupted or substituted; replay fails closed rather than
    decode it. ``seq`` is the pointer record's sequence, ``key`` the blob's,
    ``want`` the pointer's sha256 (hex), ``got`` the fetched bytes'."""

    fields = ("seq", "key", "want", "got")
    seq: int
    key: str
    want: str
    got: str


class BlobPointerIDMismatchError(TurnkeeperError):
    """An offloaded record's pointer and the blob it names carry different
    idempotency ids (sessionstore BlobPointerIDMismatchError).

    The writer stamps one id on both halves of an offload, so the pointer and
    blob have drifted apart; replay trusts neither. ``outer_id`` is the
    pointer record's id, ``inner_id`` the one inside the resolved blob."""

    fields = ("seq", "key", "outer_id", "inner_id")
    seq: int
    key: str
    outer_id: str
    inner_id: str


class BlobUnavailableError(TurnkeeperError):
    """An offloaded record's blob could not be fetched (sessionstore
    BlobUnavailableError): absent (``__cause__`` is ``BlobNotFoundError``) or
    a failed read (the store's error is ``__cause__``). Replay fails closed
    rather than yield the record without its body."""

    fields = ("seq", "key")
    seq: int
    key: str


class DurableBodyTooLargeError(TurnkeeperError):
    """A record's body is larger than the replay ceiling (sessionstore
    DurableBodyTooLargeError).

    A size refusal, not an integrity finding: nothing is known to be corrupt,
    so it is deliberately not a ``BlobIntegrityError``. The write side refuses
    such a body before storing anything (``seq`` 0: no sequence yet); replay
    refuses a pointer declaring one without fetching the blob. Carries the
    sequence, ``object_id`` (replay: the blob key; the write side: the
    record's idempotency id), the ``declared_bytes`` (bytes) and the
    ceiling ``max_bytes`` (bytes)."""

    fields = ("seq", "object_id", "declared_bytes", "max_bytes")
    seq: int
    object_id: str
    declared_bytes: int
    max_bytes: int


class EnvelopeError(TurnkeeperError):
    """A ledger frame could not be decoded (sessionstore EnvelopeError): a
    blob pointer's body, a blob's envelope, or a command application's body
    that is not the JSON of its shape. ``reason`` says which and what was
    wrong; the decoder's own error, when there is one, is ``__cause__``.
    Replay and the command log raise it as the ``__cause__`` of their own
    error (``ReplayDecodeError``, ``CommandApplicationNotFoundError``)."""

    fields = ("reason",)
    reason: str


class InvalidBackendError(TurnkeeperError):
    """A blob store handed to the ledger lacks a capability it needs
    (sessionstore InvalidBackendError): ``missing`` names the first absent
    or non-callable method of ``put``, ``get``, ``delete`` and ``list``, or
    ``"blobs"`` for no object at all. Refused when the ledger is configured,
    before any write."""

    fields = ("missing",)
    missing: str


class PersistencePathError(TurnkeeperError):
    """A local blob directory whose path cannot be made canonical without
    ambiguity (sessionstore PersistencePathError): it resolves through a
    symbolic-link loop, or names something that is not a directory. ``path``
    is the path given; the operating system's error, when there is one, is
    ``__cause__``."""

    fields = ("path",)
    path: str


class GCLeaseNotHeldError(TurnkeeperError):
    """Blob GC was refused: the session's writer lease is not held (sessionstore
    GCLeaseNotHeldError).

    GC deletes, so it runs only as the session's single writer (the lease
    held, and the ledger's newest fence its epoch); nothing is deleted. The
    ``LeaseLostError`` is ``__cause__``. ``epoch`` is the refused lease's."""

    fields = ("session_id", "epoch")
    session_id: str
    epoch: int


class GCScanError(TurnkeeperError):
    """Blob GC could not scan the ledger for the blobs its pointers reference
    (sessionstore GCScanError): a failed read or an undecodable pointer
    (``__cause__``). Without the whole live set GC deletes nothing. ``name``
    is the ledger (``ledger:<session id>``)."""

    fields = ("name",)
    name: str


class GCListError(TurnkeeperError):
    """Blob GC could not list the session's blob prefix (sessionstore
    GCListError); the store's error is ``__cause__``. Nothing is deleted."""

    fields = ("prefix",)
    prefix: str


class GCDeleteError(TurnkeeperError):
    """Blob GC failed to delete the orphaned blob ``key`` (sessionstore
    GCDeleteError); the store's error is ``__cause__``."""

    fields = ("key",)
    key: str


class WorkspaceJournalScanError(TurnkeeperError):
    """A session's ledger could not be scanned whole for its workspace records.

    Sessionstore WorkspaceJournalScanError: the workspace checkpoint lookups
    and the live references failed closed.

    ``session_id`` is the session, ``seq`` the sequence where the scan
    stopped (the damaged or unreadable record); the replay's typed error
    (``ReplayDecodeError``, ``ReplayReadError``, a blob error …) is
    ``__cause__``. A workspace GC must fail closed on it: an incomplete live
    set is unsafe to collect against."""

    fields = ("session_id", "seq")
    session_id: str
    seq: int


class CommandApplicationNotFoundError(TurnkeeperError):
    """The ledger record at ``seq`` is not a readable command application
    (sessionstore CommandApplicationNotFoundError).

    Raised instead of reporting "not applied": there is no record at ``seq``,
    it is another kind of record, or it does not decode (the decoding error
    is ``__cause__``). Reporting an unreadable record as not applied would let
    an applied command be applied twice."""

    fields = ("session_id", "seq")
    session_id: str
    seq: int


# --- the ledger's catalog (sessionstore Catalog) -------------------------------


class CatalogConflictError(TurnkeeperError):
    """A catalog update lost the revision compare-and-set on every attempt
    (sessionstore CatalogConflictError).

    ``attempts`` compare-and-sets of ``session_id``'s entry each found another
    writer's revision. The online update logs it (the append stands);
    ``repair`` raises it."""

    fields = ("session_id", "attempts")
    session_id: str
    attempts: int


class CatalogDecodeError(TurnkeeperError):
    """A stored catalog value is malformed or breaks an invariant
    (sessionstore CatalogDecodeError); ``__cause__`` says how.
    ``CatalogReadError`` wraps it with the session."""


class CatalogDuplicateFieldError(TurnkeeperError):
    """A stored catalog value repeats a JSON object member (sessionstore
    CatalogDuplicateFieldError): member ``field`` of an object in the value
    (``path`` is ``$``: the decoder does not track the depth).
    Raised as the cause of a ``CatalogDecodeError``, never last-value-wins."""

    fields = ("path", "field")
    path: str
    field: str


class CatalogEncodeError(TurnkeeperError):
    """A catalog entry could not be encoded for storage (sessionstore
    CatalogEncodeError), for example text that is not valid Unicode (a lone
    surrogate from a ``\\ud800`` escape in a record's JSON); ``__cause__`` is
    the encoder's error. ``CatalogWriteError`` wraps it."""


class CatalogHustleError(TurnkeeperError):
    """A hustle run's records do not fold (sessionstore CatalogHustleError):
    ``kind`` is one of ``duplicate_start``, ``terminal_without_start``,
    ``attribution_mismatch``, ``invalid_lifecycle``, ``runtime_mismatch``,
    ``usage_overflow``, ``run_count_overflow``; ``run_id`` names the run."""

    fields = ("kind", "run_id")
    kind: str
    run_id: str


class CatalogMetaValidationError(TurnkeeperError):
    """A catalog entry's loop projection breaks an invariant (sessionstore
    CatalogMetaValidationError): loop ``loop_index``'s ``field`` (a
    ``CatalogMetaField``) breaks ``rule`` (a ``CatalogMetaRule``)."""

    fields = ("loop_index", "field", "rule")
    loop_index: int
    field: str
    rule: str


class CatalogHustleMetaValidationError(TurnkeeperError):
    """A catalog entry's hustle aggregate ``index`` breaks ``rule``
    (sessionstore CatalogHustleMetaValidationError)."""

    fields = ("index", "rule")
    index: int
    rule: str


class CatalogOrderingError(TurnkeeperError):
    """An online catalog update delivered a record at ``sequence``, not after
    the entry's cursor ``last`` (sessionstore CatalogOrderingError): whether
    it is already folded cannot be told from the entry alone, so the online
    updater repairs from the ledger instead of guessing."""

    fields = ("event_type", "sequence", "last")
    event_type: str
    sequence: int
    last: int


class CatalogReadError(TurnkeeperError):
    """A catalog entry could not be read or decoded (sessionstore
    CatalogReadError); ``session_id`` names it when known (``""`` for a
    listing that failed whole), ``__cause__`` is the backend's error or a
    ``CatalogDecodeError``."""

    fields = ("session_id",)
    session_id: str


class CatalogUsageError(TurnkeeperError):
    """Loop ``loop_id``'s usage is invalid (not a count ≥ 0) or overflows a
    signed 64-bit count (sessionstore CatalogUsageError)."""

    fields = ("loop_id",)
    loop_id: str


class CatalogWriteError(TurnkeeperError):
    """A catalog entry could not be written (sessionstore CatalogWriteError):
    ``__cause__`` is the backend's error or a ``CatalogEncodeError``. The
    online update logs it; ``repair`` raises it."""

    fields = ("session_id",)
    session_id: str


class CatalogCompactionError(TurnkeeperError):
    """The ledger's compaction history contradicts itself (sessionstore
    CatalogCompactionError): ``kind`` ``duplicate_terminal`` is a second
    ``compaction_done`` of attempt ``attempt_id``."""

    fields = ("kind", "attempt_id")
    kind: str
    attempt_id: str


# --- encryption at rest (payloads sealed per session) ----------------------


class EncryptionError(TurnkeeperError):
    """A payload of an encrypted store could not be sealed or opened.

    Nothing is returned in place of a payload that cannot be opened: no
    garbage, no partial read presented as whole.
    """


class KeyUnavailableError(EncryptionError):
    """The key a session's payloads need is not available.

    The store was opened without ``encryption=`` (``key_id`` is ``None``),
    the key provider does not hold the master key ``key_id`` that wrapped the
    session's data key (retired, or a wrong key under that id), or the
    session has no data key left (it was deleted: crypto-shredded). Nothing
    is written by the call that raised it.
    """

    fields: tuple[str, ...] = ("session_id", "key_id")
    session_id: str
    key_id: str | None


class KeyUnwrapError(EncryptionError):
    """A key provider could not unwrap a data key: it does not hold the master
    key ``key_id``, or the wrapped bytes fail authentication under it.

    Raised by key providers (a KMS adapter raises it too); the store reports
    it as :class:`KeyUnavailableError` naming the session, with this error as
    ``__cause__``.
    """

    fields: tuple[str, ...] = ("key_id",)
    key_id: str


class PayloadAuthenticationError(EncryptionError):
    """A stored ciphertext failed authentication: a flipped byte, a value moved
    to another row, session or field, a value sealed under a data key the
    session does not hold, or a clear value where the session's payloads are
    sealed. ``record_id`` is the entry's (or record's) id, ``field`` the
    column's name (``payload``, ``result`` …)."""

    fields: tuple[str, ...] = ("session_id", "record_id", "field")
    session_id: str
    record_id: str
    field: str


__all__ = [
    "AlreadyExistsError",
    "AmbiguousSessionIDError",
    "BindingNotFoundError",
    "BlobCondemnedError",
    "BlobIntegrityError",
    "BlobNotFoundError",
    "BlobPointerIDMismatchError",
    "BlobUnavailableError",
    "BusyError",
    "CapabilityEventConflictError",
    "CatalogCompactionError",
    "CatalogConflictError",
    "CatalogDecodeError",
    "CatalogDuplicateFieldError",
    "CatalogEncodeError",
    "CatalogHustleError",
    "CatalogHustleMetaValidationError",
    "CatalogMetaValidationError",
    "CatalogOrderingError",
    "CatalogReadError",
    "CatalogUsageError",
    "CatalogWriteError",
    "ChannelBoundError",
    "CheckpointError",
    "CommandApplicationNotFoundError",
    "ConversationTurnExistsError",
    "ConversationTurnNotOpenError",
    "ConversationTurnOpenError",
    "CorruptDatabaseError",
    "DataError",
    "DatabaseError",
    "DeliveryLeaseLostError",
    "DeliveryOperationBusyError",
    "DeliveryOperationNotFoundError",
    "DeliveryPlanConflictError",
    "DiskFullError",
    "DurableBodyTooLargeError",
    "EmptySessionError",
    "EncryptionError",
    "EntryCycleError",
    "EntryExistsError",
    "EntryIdReservedError",
    "EntryNotFoundError",
    "EnvelopeError",
    "ExecutionIntentConflictError",
    "ExecutionIntentNotFoundError",
    "ForeignDatabaseError",
    "ForkError",
    "ForkInvalidBoundaryError",
    "ForkNoCompletedTurnError",
    "ForkRequestConflictError",
    "ForkRequestIDRequiredError",
    "ForkRequestIDTooLongError",
    "ForkSessionActiveError",
    "ForkSessionBusyError",
    "ForkSessionNotFoundError",
    "ForkUnavailableError",
    "ForkUnsupportedEntryError",
    "GCDeleteError",
    "GCLeaseNotHeldError",
    "GCListError",
    "GCScanError",
    "GuidanceConflictError",
    "ImportTailStoredError",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "InvalidBackendError",
    "InvalidInputError",
    "InvalidTransitionError",
    "KeyUnavailableError",
    "KeyUnwrapError",
    "LeaseLostError",
    "LeasePurposeError",
    "LedgerIdempotencyConflictError",
    "LedgerTipDamagedError",
    "NilLeaseError",
    "NotSupportedError",
    "OpeningFenceConflictError",
    "OperationalError",
    "PayloadAuthenticationError",
    "PersistencePathError",
    "PoolerError",
    "ProgrammingError",
    "ProjectExistsError",
    "ProjectNotFoundError",
    "ReadOnlyError",
    "RecordNotActiveError",
    "RecordNotFoundError",
    "RecoveryNotNeededError",
    "RemoteRunNotRetainedError",
    "ReplayDecodeError",
    "ReplayReadError",
    "ResourceEventConflictError",
    "RetryNotAllowedError",
    "RunEventConflictError",
    "RunNotFoundError",
    "RuntimeLeaseRunMismatchError",
    "RuntimeSessionNotFoundError",
    "SchemaNotFoundError",
    "SchemaVersionError",
    "SessionBoundError",
    "SessionFileError",
    "SessionFormatUnknownError",
    "SessionIDExistsError",
    "SessionModifiedError",
    "SessionNotFoundError",
    "SessionRecoveryRequiredError",
    "SessionRunActiveError",
    "StoreInvalidatedError",
    "StoreLockedError",
    "StoreNotFoundError",
    "SubmissionConflictError",
    "TemporarySchemaError",
    "ToolCallPairingError",
    "ToolCallsUnansweredError",
    "ToolExecutionConflictError",
    "ToolExecutionNotFoundError",
    "ToolExecutionNotReclaimableError",
    "TransactionConflictError",
    "TurnkeeperError",
    "UnexpectedResultError",
    "UsageConflictError",
    "WorkspaceJournalScanError",
]
"""Every error class: the hierarchy under :class:`TurnkeeperError` (each is also
exported by :mod:`turnkeeper`)."""
