"""Session forks (session seed ForkSession, ForkKind, ForkResult): vocabulary and checks.

A fork copies a session's transcript up to a completed conversation turn
into a new session, once per fork request id. Pure: no I/O; the store
imports these names.

- **Kinds** (seed ForkKind): a ``session`` fork is taken at the source's
  latest completed turn; a ``message`` fork at a turn the caller names, by
  its turn id or by the sequence number of one of its entries (seed
  ``ForkOptions.AtSeq``).
- **Completed**: a turn whose boundary row ended with status ``succeeded``
  (:data:`COMPLETED_TURN_STATUSES`). The seed keeps ``failed``,
  ``cancelled`` and incomplete outcomes as terminal turn states *distinct*
  from completed, and a turn that ended that way can leave an unanswered
  tool call that a fork would start from, so those are not boundaries.
- **References** between entries (:data:`ENTRY_REFERENCES`) are rewritten
  to the copy's new entry ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from .entries import EntryKind
from .errors import ForkRequestIDRequiredError, ForkRequestIDTooLongError, InvalidInputError

FORK_REQUEST_ID_MAX_BYTES = 256
"""The longest fork request id accepted, in UTF-8 bytes (seed ErrForkIdempotencyTooLong)."""

COMPLETED_TURN_STATUSES = frozenset({"succeeded"})
"""Turn statuses that make a turn a fork boundary (seed ErrForkNoCompletedTurn)."""

ROOT_SENTINEL = "root"
"""``branch_summary.fromId`` for a summary of a path that started at the root (pi);
it names no entry and is copied as is."""

ENTRY_REFERENCES: Mapping[str, str] = {
    EntryKind.COMPACTION: "firstKeptEntryId",
    EntryKind.LABEL: "targetId",
    EntryKind.BRANCH_SUMMARY: "fromId",
}
"""Per entry kind, the payload field that names another entry of the same session
(besides ``parentId``): pi's compaction first-kept pointer, label target and
branch-summary source (``corpus/FORMATS.md`` §1.3)."""


class ForkKind(StrEnum):
    """How the fork boundary was chosen (session seed ForkKind)."""

    SESSION = "session"
    """At the source's latest completed turn."""
    MESSAGE = "message"
    """At a completed turn the caller named (turn id or entry sequence)."""


@dataclass(frozen=True, slots=True)
class Fork:
    """A fork of a session (session seed ForkResult plus the request it answers).

    ``boundary_turn_id`` is the completed turn the copy ends with;
    ``boundary_entry_id`` and ``boundary_seq`` are that turn's ``turn_end``
    entry in the source (seed ``ForkBoundarySeq``). ``leaf_id`` is the copy
    of that entry, the fork's leaf when it was made. ``entries_copied`` is
    the number of entries the fork was seeded with (seed ``SeedLength``);
    ``created_at`` is by the store's clock. The same ``request_id`` always
    answers with the same fork.
    """

    request_id: str
    source_session_id: str
    fork_session_id: str
    kind: ForkKind
    boundary_turn_id: str
    boundary_entry_id: str
    boundary_seq: int
    leaf_id: str
    entries_copied: int
    created_at: datetime


def check_request_id(session_id: str, request_id: object) -> str:
    """``request_id`` if it can name a fork request of source ``session_id``.

    Raises:
        ForkRequestIDRequiredError: ``None``, empty or only whitespace.
        ForkRequestIDTooLongError: over :data:`FORK_REQUEST_ID_MAX_BYTES` UTF-8 bytes
            (``length`` is its byte length).
        InvalidInputError: not a string, or text UTF-8 cannot hold.

    raises: ForkRequestIDRequiredError, ForkRequestIDTooLongError, InvalidInputError
    post: __return__ is request_id and __return__.strip() != ""
    post: len(__return__.encode("utf-8")) <= FORK_REQUEST_ID_MAX_BYTES
    """
    if request_id is None or (isinstance(request_id, str) and not request_id.strip()):
        raise ForkRequestIDRequiredError(session_id)
    if not isinstance(request_id, str):
        raise InvalidInputError("request_id", f"expected a string, got {type(request_id).__name__}")
    try:
        size = len(request_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidInputError("request_id", f"not storable as UTF-8: {exc.reason}") from None
    if size > FORK_REQUEST_ID_MAX_BYTES:
        raise ForkRequestIDTooLongError(session_id, size, FORK_REQUEST_ID_MAX_BYTES)
    return request_id


def referenced_id(kind: str, payload: Mapping[str, Any]) -> str | None:
    """The entry id ``payload`` refers to (see :data:`ENTRY_REFERENCES`), or ``None``.

    ``None`` also for a null first-kept pointer and for ``fromId == "root"``.

    post: __return__ is None or __return__ == payload[ENTRY_REFERENCES[kind]]
    post: not (kind == EntryKind.BRANCH_SUMMARY and __return__ == ROOT_SENTINEL)
    """
    name = ENTRY_REFERENCES.get(kind)
    if name is None:
        return None
    value = payload.get(name)
    if not isinstance(value, str) or (kind == EntryKind.BRANCH_SUMMARY and value == ROOT_SENTINEL):
        return None
    return value


def remap_reference(
    kind: str, payload: Mapping[str, Any], new_ids: Mapping[str, str]
) -> dict[str, Any] | None:
    """A copy of ``payload`` whose reference names the new id, or ``None`` if unchanged.

    Key order is kept. The caller guarantees the referenced id is in ``new_ids``.

    pre: referenced_id(kind, payload) in (None, *new_ids)
    post: (__return__ is None) == (referenced_id(kind, payload) is None)
    post: __return__ is None or list(__return__) == list(payload)
    post: __return__ is None or __return__[n := ENTRY_REFERENCES[kind]] == new_ids[payload[n]]
    post: __return__ is None or sum(__return__[k] is not payload[k] for k in payload) <= 1
    """
    old = referenced_id(kind, payload)
    if old is None:
        return None
    name = ENTRY_REFERENCES[kind]
    return {k: (new_ids[old] if k == name else v) for k, v in payload.items()}
