"""Workspace checkpoints of the ledger (sessionstore WorkspaceCheckpointBySeq,
WorkspaceCheckpointByTurn, WorkspaceLiveRefs, WorkspaceJournalScanError).

The runtime records its workspace transitions in the session's ledger through
its writer, as records of kind ``workspace_checkpoint`` (a snapshot taken)
and ``workspace_restore`` (the workspace rewound to a snapshot); their
payloads are described at :data:`turnkeeper.spec.ledger.WORKSPACE_CHECKPOINT_KIND`.
Everything here is derived from those records, read through the verified
replay (``replay.py``): no table of its own, memory bounded by the replay's
page (plus, for the live set, the refs found). A lookup reads the ledger
from its first record (up to ``seq`` for :func:`checkpoint_by_seq`), so its
cost is that many records, blobs of offloaded records included.

Fail closed: any record the scan cannot read, verify or decode (the
replay's typed errors, or a workspace record whose payload is not the shape
above) stops it with ``WorkspaceJournalScanError(session_id, seq)``, the
cause as ``__cause__``; never a shorter answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import (
    WORKSPACE_CHECKPOINT_KIND,
    WORKSPACE_KINDS,
    CheckpointSummary,
    LedgerRecord,
)

from . import records

Replay = Callable[[str], Iterator[LedgerRecord]]
"""A session's verified replay from its first record (``Ledger.replay``)."""


@dataclass(frozen=True, slots=True)
class _Mark:
    """A decoded workspace record."""

    kind: str
    summary: CheckpointSummary


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for name, value in pairs:
        if name in seen:
            raise ValueError(f"duplicate member {name!r}")
        seen[name] = value
    return seen


def decode(session_id: str, record: LedgerRecord) -> CheckpointSummary:
    """The checkpoint (or restore) ``record`` carries (:func:`decode_payload`).

    Raises:
        ReplayDecodeError: as :func:`decode_payload`.
    """
    return decode_payload(session_id, record.seq, record.kind, record.payload)


def decode_payload(session_id: str, seq: int, kind: str, payload: bytes) -> CheckpointSummary:
    """The checkpoint (or restore) a ``kind`` record at ``seq`` carries in
    ``payload``.

    Raises:
        ReplayDecodeError: the payload is not a JSON object with a non-empty
            text ``ref`` and a text ``event_id`` (``turn_id`` and
            ``consistency``, when present, text), or a member is duplicated;
            a payload nested too deeply to decode too (never a bare
            ``RecursionError``).
    """
    try:
        body: Any = records.loads_json(payload, object_pairs_hook=_no_duplicates)
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        ref, event_id = body["ref"], body["event_id"]
        turn_id, consistency = body.get("turn_id"), body.get("consistency", "")
        if not (isinstance(ref, str) and ref and isinstance(event_id, str)):
            raise ValueError("ref or event_id missing or not text")
        if not (turn_id is None or isinstance(turn_id, str)) or not isinstance(consistency, str):
            raise ValueError("turn_id or consistency not text")
    except (ValueError, KeyError, UnicodeDecodeError) as failure:
        raise errors.ReplayDecodeError(
            session_id, seq, detail=f"its {kind} payload does not decode"
        ) from failure
    return CheckpointSummary(ref, event_id, seq, consistency, turn_id)


def _marks(replay: Replay, session_id: str, upto: int | None = None) -> Iterator[_Mark]:
    """The workspace records of ``session_id``'s ledger, in sequence order, up
    to ``upto`` (inclusive; ``None``: the tip the replay read).

    Raises:
        WorkspaceJournalScanError: a record could not be read, verified or
            decoded (``__cause__``).
        EmptySessionError, SessionNotFoundError: no ledger (from the replay).
    """
    last = 0
    try:
        for record in replay(session_id):
            last = record.seq
            if record.kind in WORKSPACE_KINDS:
                yield _Mark(record.kind, decode(session_id, record))
            if upto is not None and record.seq >= upto:
                return  # the next record is never read, nor verified
    except (errors.EmptySessionError, errors.SessionNotFoundError, errors.InterfaceError):
        raise
    except errors.TurnkeeperError as failure:
        seq = getattr(failure, "seq", None)
        raise errors.WorkspaceJournalScanError(
            session_id, seq if isinstance(seq, int) and seq > 0 else last + 1
        ) from failure


def checkpoint_by_seq(replay: Replay, session_id: str, seq: int) -> CheckpointSummary | None:
    """The newest checkpoint at or before ``seq`` (``None``: none, or no
    ledger records). Records after ``seq`` are not read."""
    found: CheckpointSummary | None = None
    try:
        for mark in _marks(replay, session_id, seq):
            if mark.kind == WORKSPACE_CHECKPOINT_KIND:
                found = mark.summary
    except errors.EmptySessionError:
        return None
    return found


def checkpoint_by_turn(replay: Replay, session_id: str, turn_id: str) -> CheckpointSummary | None:
    """The newest checkpoint taken in turn ``turn_id`` (``None``: none, or no
    ledger records). The whole ledger is read, so damage after the turn's
    checkpoints is found too."""
    found: CheckpointSummary | None = None
    try:
        for mark in _marks(replay, session_id):
            if mark.kind == WORKSPACE_CHECKPOINT_KIND and mark.summary.turn_id == turn_id:
                found = mark.summary
    except errors.EmptySessionError:
        return None
    return found


def live_refs(replay: Replay, session_ids: Iterable[str]) -> frozenset[str]:
    """Every ``ref`` of a checkpoint or restore record in the ledgers of
    ``session_ids``. A session without ledger records (never written, or
    deleted) contributes nothing; any other failure raises
    ``WorkspaceJournalScanError`` for the first session that could not be
    scanned whole."""
    refs: set[str] = set()
    for session_id in session_ids:
        try:
            refs.update(mark.summary.ref for mark in _marks(replay, session_id))
        except (errors.EmptySessionError, errors.SessionNotFoundError):
            continue
    return frozenset(refs)
