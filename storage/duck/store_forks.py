"""Session forks of the DuckDB store (session seed ForkSession)."""

from __future__ import annotations

import hashlib

import orjson
import uuid6

from turnkeeper.spec import LeasePurpose, errors
from turnkeeper.spec.fork import Fork, check_request_id
from turnkeeper.spec.records import Lease

from ..codec import check_id
from ..validate import check_int, check_session_lease
from . import forks
from .db import Tx
from .store_base import StoreBase
from .store_sessions import new_entry_id


def _digest(request_id: str) -> str:
    return hashlib.sha256(request_id.encode("utf-8")).hexdigest()


class ForksMixin(StoreBase):
    """Forks: copy a session up to a completed turn into a new session, once per request id."""

    def fork_session(
        self,
        source_session_id: str,
        *,
        request_id: str,
        boundary_turn_id: str | None = None,
        at_seq: int | None = None,
        fork_session_id: str | None = None,
        lease: Lease | None = None,
    ) -> Fork:
        """Fork ``source_session_id`` at a completed turn into a new session
        (session seed ForkSession), in one transaction; returns the :class:`Fork`.

        The boundary is the source's latest completed turn (a ``session``
        fork), or, for a ``message`` fork, the completed turn named by
        ``boundary_turn_id`` or the one holding the entry with sequence
        number ``at_seq`` (seed ``ForkOptions.AtSeq``; that entry must be on
        the turn's branch). A turn is completed when it ended ``succeeded``.
        The new session (``fork_session_id``, or a UUIDv7) holds the branch
        from the root to the turn's ``turn_end`` entry, plus the branches of
        the entries a copied compaction (``firstKeptEntryId``), label
        (``targetId``) or branch summary (``fromId``) refers to, under new
        entry ids with parents and those references rewritten; kinds,
        timestamps and the other payload fields are kept, so its replay is
        the source's replay at the boundary apart from ids. Its leaf is the
        copied ``turn_end`` entry; its header records ``parentSession`` (the
        source id), ``forkBoundarySeq``, ``seedLength`` and ``forkKind``. The
        fork starts with no runs and no conversation turns of its own.

        ``request_id`` makes the fork idempotent: the same id with the same
        request (source, boundary arguments, ``fork_session_id``) returns
        the stored fork, even after the source moved on; only a sha256
        digest of the id is stored. ``lease``, if given, is a ``fork``
        lease on ``session:<source_session_id>`` (seed AcquireFork), fenced
        in the transaction; without one, a live lease on the source held by
        anyone makes it active.

        Raises:
            ForkRequestIDRequiredError: ``request_id`` is ``None``, empty or blank.
            ForkRequestIDTooLongError: ``request_id`` is over
                ``FORK_REQUEST_ID_MAX_BYTES`` UTF-8 bytes.
            ForkRequestConflictError: the id was used for a different request
                (``fork_session_id`` names the fork it made).
            ForkSessionNotFoundError: no session ``source_session_id``.
            ForkSessionActiveError: the source has a non-terminal run.
            ForkSessionBusyError: (a ``ForkSessionActiveError`` and a
                ``BusyError``) no ``lease`` given and someone holds the source.
            ForkNoCompletedTurnError: the source has no completed turn.
            ForkUnavailableError: the named turn is not the source's, no
                entry has sequence ``at_seq``, or the turn's ``turn_end``
                entry is missing from the transcript.
            ForkInvalidBoundaryError: the named turn is open or ended other
                than ``succeeded``, or ``at_seq`` is not inside a completed
                turn on its branch.
            ForkUnsupportedEntryError: a copied entry has a kind the seed does
                not define, or refers to an entry the source lacks or wrote
                after the boundary, or the replayed context at the boundary
                holds a ``toolResult`` without its ``toolCall`` (an imported
                transcript's; ``entry_id`` names the copied entry).
            SessionIDExistsError: ``fork_session_id`` is taken.
            LeaseLostError: ``lease`` is no longer held.
            LeasePurposeError: ``lease`` is not of purpose ``fork``.
            InvalidInputError: a malformed argument (both ``boundary_turn_id``
                and ``at_seq``, ``at_seq`` below 1, a lease on another target …).
        On any error nothing is written.
        """
        check_id(source_session_id, "source_session_id")
        request_id = check_id(check_request_id(source_session_id, request_id), "request_id")
        if boundary_turn_id is not None:
            check_id(boundary_turn_id, "boundary_turn_id")
        if at_seq is not None:
            check_int(at_seq, "at_seq", 1)
        if boundary_turn_id is not None and at_seq is not None:
            raise errors.InvalidInputError("at_seq", "name the boundary by turn id or by seq")
        fid = str(uuid6.uuid7()) if fork_session_id is None else fork_session_id
        check_id(fid, "fork_session_id")
        check_session_lease(source_session_id, lease)
        if lease is not None and lease.purpose != LeasePurpose.FORK:
            raise errors.LeasePurposeError(lease.target, lease.purpose, LeasePurpose.FORK.value)
        fingerprint = hashlib.sha256(
            orjson.dumps(
                {
                    "source": source_session_id,
                    "turn": boundary_turn_id,
                    "seq": at_seq,
                    "fork": fork_session_id,
                },
                option=orjson.OPT_SORT_KEYS,
            )
        ).hexdigest()
        req = forks.Request(
            request_id=request_id,
            digest=_digest(request_id),
            fingerprint=fingerprint,
            source_session_id=source_session_id,
            fork_session_id=fid,
            boundary_turn_id=boundary_turn_id,
            at_seq=at_seq,
            lease=lease,
        )

        def body(tx: Tx) -> Fork:
            return forks.fork(tx, req, new_entry_id)

        return self._fenced("fork_session", lease, body)

    def get_fork(self, request_id: str) -> Fork | None:
        """The fork made under ``request_id``, or ``None`` when there is none.

        Raises:
            InvalidInputError: ``request_id`` is not a non-empty string.
        """
        check_id(request_id, "request_id")
        digest = _digest(request_id)
        return self.db.read("get_fork", lambda tx: forks.get(tx, request_id, digest))
