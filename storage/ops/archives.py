"""``store.archives``: the durable records of a session's Responses API work
(session seed SaveResponseRun, SaveResponseTurn, SaveResponseItem,
GetResponseRun, GetResponseTurn, ListResponseRuns, ListResponseItems,
ListResponseReplayItems, ListResponseReplayTurns).

Three kinds of record, each keyed by the caller's local ids within its
session: a background run (:class:`ResponseRun`), a turn's lineage and
summaries (:class:`ResponseTurn`) and a turn's sanitized output items
(:class:`ResponseItem`). A save is an upsert, as the seed's are: saving a
record again replaces what was saved under its key (its ``id`` and
``created_at`` stay), so a retry after an unknown commit is safe. A record's
``id`` is its number within its session and kind, taken when it is first
written from the session's counter row of the stream (:func:`.capabilities.next_seq`,
locked by the writing transaction), so numbers follow commit order.

Every save is a session write (storage/protocol.py): under the session's
lease, or while nobody holds one. A run's remote record is how recovery
decides whether a provider execution still owns the run
(:func:`linked_run`; ``store.recovery.detach``, ``ExecutionFacts.remote_run``).
The input checks are in ``archive_checks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import (
    Lease,
    ResponseItem,
    ResponseReplayTurn,
    ResponseRun,
    ResponseTurn,
)

from ..backend import Conflict, Tx, keyed, present, utc
from ..codec import check_id
from ..crypto.columns import SEALED
from ..validate import check_limit, check_session_lease
from . import leases, sealed_json
from .archive_checks import check_item, check_run, check_turn
from .base import Area
from .capabilities import next_seq, session_exists

REPLAYED = ("completed", "incomplete")
"""The turn statuses whose items are replayed (ListResponseReplayItems)."""

REMOTE_TERMINAL = frozenset(
    ("completed", "failed", "incomplete", "cancelled", "canceled", "expired")
)
"""Remote run states (case and surrounding blanks aside) in which the provider
execution has ended: it no longer owns its session run."""

_RUN_COLS = (
    "id",
    "session_id",
    "local_run_id",
    "local_turn_id",
    "message_id",
    "response_id",
    "provider",
    "api",
    "state",
    "polling_url",
    "last_event_sequence",
    "cancel_requested",
    "created_at",
    "updated_at",
)
_TURN_COLS = (
    "id",
    "session_id",
    "local_turn_id",
    "message_id",
    "request_id",
    "response_id",
    "previous_response_id",
    "conversation_id",
    "provider",
    "api",
    "model",
    "state_mode",
    "status",
    "incomplete_reason",
    "request_summary",
    "response_summary",
    "created_at",
    "completed_at",
)
_ITEM_COLS = (
    "id",
    "session_id",
    "local_turn_id",
    "response_id",
    "item_id",
    "output_index",
    "item_type",
    "item_status",
    "item_key",
    "sanitized",
    "created_at",
)


def remote_terminal(state: str) -> bool:
    """Whether a remote run in ``state`` has ended (:data:`REMOTE_TERMINAL`)."""
    return state.strip().lower() in REMOTE_TERMINAL


SEALED_TURN = tuple(c.column for c in SEALED if c.table == "response_turns")
"""The sealed columns of ``response_turns`` (record id: the row's ``id``;
each column's name is its field name)."""

SEALED_ITEM = tuple(c.column for c in SEALED if c.table == "response_items")
"""The sealed column of ``response_items`` (record id: the row's ``id``)."""


def _upsert(
    tx: Tx,
    table: str,
    keys: Sequence[str],
    values: dict[str, Any],
    keep: Sequence[str],
    stream: str,
    cols: Sequence[str],
    sealed: tuple[Sequence[str], int | None] = ((), None),
) -> Sequence[Any]:
    """Insert the row ``values`` (every column but ``id``) or, when a row has its
    ``keys`` already, replace its other columns but ``id`` and ``keep``; returns
    the stored row as ``cols``. A new row's ``id`` is the next number of its
    session's ``stream``; a row inserted concurrently under the same key wins
    and keeps its number (the upsert then updates it). ``sealed``: the columns
    of ``values`` (JSON text or ``None``) sealed with the row's ``id`` as
    record id, and the session's key version (``sealed_json.seal``).

    Raises:
        Conflict: a value was sealed for a number the row did not keep (a
            concurrent insert won): the transaction retries.
    """
    rest = " AND ".join(f"{k} = ?" for k in keys[1:])
    found = tx.one(
        f"SELECT id FROM {table} WHERE {keyed(keys[0], rest)}", [values[k] for k in keys]
    )
    number = found[0] if found is not None else next_seq(tx, values["session_id"], stream)
    names_sealed, version = sealed
    given = [n for n in names_sealed if values[n] is not None]
    texts = [(str(number), n, values[n]) for n in given]
    stored = sealed_json.seal(tx, values["session_id"], texts, version) if texts else []
    moved = any(s != t for s, (_, _, t) in zip(stored, texts, strict=True))
    values = {**values, **dict(zip(given, stored, strict=True))}
    names = ["id", *values]
    sets = ", ".join(f"{c} = excluded.{c}" for c in values if c not in keys and c not in keep)
    row = tx.one(
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)}) "
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets} RETURNING {', '.join(cols)}",
        [number, *values.values()],
    )
    row = present(row, f"the {table} row its upsert returns")
    if moved:
        kept(table, values["session_id"], number, row[cols.index("id")])
    return row


def kept(table: str, session_id: str, number: int, stored: int) -> None:
    """Check that the row an upsert sealed values for as number ``number``
    kept that number (``stored``): a row inserted under its key by a
    concurrent transaction, unseen by the upsert's read, keeps its own, and
    the values sealed for ``number`` would not open there.

    Raises:
        Conflict: it did not (the transaction retries, and reads that row).
    """
    if stored != number:
        raise Conflict(f"a {table} row of session {session_id!r} was inserted meanwhile")


def _write_guard(tx: Tx, session_id: str, lease: Lease | None) -> int | None:
    """The session-write rule, inside the write's transaction; returns the
    session's data key version (``None``: clear).

    Raises:
        SessionNotFoundError, LeaseLostError, BusyError.
    """
    version = sealed_json.session_version(tx, session_id)
    leases.fence_or_unheld(tx, session_target(session_id), lease)
    return version


def _run(row: Sequence[Any]) -> ResponseRun:
    named = dict(zip(_RUN_COLS, row, strict=True))
    named["cancel_requested"] = bool(named["cancel_requested"])
    named["created_at"] = utc(named["created_at"])
    named["updated_at"] = utc(named["updated_at"])
    return ResponseRun(**named)


def _opened(tx: Tx, named: dict[str, Any], name: str) -> Any:
    """A row's sealed column ``name`` opened (record id: the row's ``id``).

    Raises:
        KeyUnavailableError, PayloadAuthenticationError: see ``sealed_json.open_json``.
    """
    stored = named[name]
    if stored is None:
        return None
    return sealed_json.open_json(tx, named["session_id"], str(named["id"]), name, stored)


def _turn(tx: Tx, row: Sequence[Any]) -> ResponseTurn:
    named = dict(zip(_TURN_COLS, row, strict=True))
    for name in SEALED_TURN:
        named[name] = _opened(tx, named, name)
    named["created_at"] = utc(named["created_at"])
    if named["completed_at"] is not None:
        named["completed_at"] = utc(named["completed_at"])
    return ResponseTurn(**named)


def _item(tx: Tx, row: Sequence[Any]) -> ResponseItem:
    named = dict(zip(_ITEM_COLS, row, strict=True))
    named["sanitized"] = _opened(tx, named, "sanitized")
    named["created_at"] = utc(named["created_at"])
    return ResponseItem(**named)


def save_run(tx: Tx, run: ResponseRun, lease: Lease | None) -> ResponseRun:
    _write_guard(tx, run.session_id, lease)
    created = run.created_at or tx.now
    values = {
        "session_id": run.session_id,
        "local_run_id": run.local_run_id,
        "local_turn_id": run.local_turn_id,
        "message_id": run.message_id,
        "response_id": run.response_id,
        "provider": run.provider,
        "api": run.api,
        "state": run.state,
        "polling_url": run.polling_url,
        "last_event_sequence": run.last_event_sequence,
        "cancel_requested": run.cancel_requested,
        "created_at": created,
        "updated_at": run.updated_at or (created if run.created_at else tx.now),
    }
    keys = ("session_id", "local_run_id")
    row = _upsert(tx, "response_runs", keys, values, ("created_at",), "response_run", _RUN_COLS)
    return _run(row)


def save_turn(
    tx: Tx, turn: ResponseTurn, summaries: tuple[str | None, str | None], lease: Lease | None
) -> ResponseTurn:
    version = _write_guard(tx, turn.session_id, lease)
    values = {
        "session_id": turn.session_id,
        "local_turn_id": turn.local_turn_id,
        "message_id": turn.message_id,
        "request_id": turn.request_id,
        "response_id": turn.response_id,
        "previous_response_id": turn.previous_response_id,
        "conversation_id": turn.conversation_id,
        "provider": turn.provider,
        "api": turn.api,
        "model": turn.model,
        "state_mode": turn.state_mode,
        "status": turn.status,
        "incomplete_reason": turn.incomplete_reason,
        "request_summary": summaries[0],
        "response_summary": summaries[1],
        "created_at": turn.created_at or tx.now,
        "completed_at": turn.completed_at,
    }
    keys = ("session_id", "local_turn_id")
    row = _upsert(
        tx,
        "response_turns",
        keys,
        values,
        ("created_at",),
        "response_turn",
        _TURN_COLS,
        (SEALED_TURN, version),
    )
    return _turn(tx, row)


def save_item(tx: Tx, item: ResponseItem, sanitized: str, lease: Lease | None) -> ResponseItem:
    version = _write_guard(tx, item.session_id, lease)
    created = item.created_at or tx.now
    values = {
        "session_id": item.session_id,
        "local_turn_id": item.local_turn_id,
        "item_key": item.item_key,
        "response_id": item.response_id,
        "item_id": item.item_id,
        "output_index": item.output_index,
        "item_type": item.item_type,
        "item_status": item.item_status,
        "sanitized": sanitized,
        "created_at": created,
        "updated_at": created,
    }
    keys = ("session_id", "local_turn_id", "item_key")
    row = _upsert(
        tx,
        "response_items",
        keys,
        values,
        ("created_at",),
        "response_item",
        _ITEM_COLS,
        (SEALED_ITEM, version),
    )
    return _item(tx, row)


def get_run(tx: Tx, session_id: str, local_run_id: str) -> ResponseRun | None:
    session_exists(tx, session_id)
    row = tx.one(
        f"SELECT {', '.join(_RUN_COLS)} FROM response_runs "
        f"WHERE {keyed('session_id', 'local_run_id = ?')}",
        [session_id, local_run_id],
    )
    return None if row is None else _run(row)


def linked_run(tx: Tx, session_id: str, run_id: str) -> ResponseRun | None:
    """The remote run record of session run ``run_id``: the newest (by
    ``updated_at``, then ``id``) of the session's response runs whose
    ``local_turn_id`` is ``run_id`` or starts with ``run_id:`` (session seed
    readLinkedResponseRun), or ``None``."""
    prefix = f"{run_id}:"
    row = tx.one(
        f"SELECT {', '.join(_RUN_COLS)} FROM response_runs WHERE "
        f"{keyed('session_id', '(local_turn_id = ? OR substr(local_turn_id, 1, ?) = ?)')} "
        "ORDER BY updated_at DESC, id DESC LIMIT 1",
        [session_id, run_id, len(prefix), prefix],
    )
    return None if row is None else _run(row)


def list_runs(tx: Tx, session_id: str, limit: int) -> list[ResponseRun]:
    session_exists(tx, session_id)
    rows = tx.rows(
        f"SELECT {', '.join(_RUN_COLS)} FROM response_runs WHERE session_id = ? "
        "ORDER BY created_at, id LIMIT ?",
        [session_id, limit],
    )
    return [_run(r) for r in rows]


def get_turn(tx: Tx, session_id: str, local_turn_id: str) -> ResponseTurn | None:
    session_exists(tx, session_id)
    row = tx.one(
        f"SELECT {', '.join(_TURN_COLS)} FROM response_turns "
        f"WHERE {keyed('session_id', 'local_turn_id = ?')}",
        [session_id, local_turn_id],
    )
    return None if row is None else _turn(tx, row)


def list_items(tx: Tx, session_id: str, local_turn_id: str) -> list[ResponseItem]:
    session_exists(tx, session_id)
    rows = tx.rows(
        f"SELECT {', '.join(_ITEM_COLS)} FROM response_items "
        f"WHERE {keyed('session_id', 'local_turn_id = ?')} ORDER BY id",
        [session_id, local_turn_id],
    )
    return [_item(tx, r) for r in rows]


_REPLAY = (
    "SELECT t.local_turn_id, i.sanitized, i.id FROM response_turns t "
    "JOIN response_items i ON i.session_id = t.session_id AND i.local_turn_id = t.local_turn_id "
    f"WHERE t.session_id = ? AND t.status IN ({', '.join(repr(s) for s in REPLAYED)}) "
    "ORDER BY t.created_at, t.id, i.output_index, i.id"
)


def replay_items(tx: Tx, session_id: str, limit: int) -> list[Any]:
    session_exists(tx, session_id)
    rows = tx.rows(f"{_REPLAY} LIMIT ?", [session_id, limit])
    return [_replayed(tx, session_id, r) for r in rows]


def _replayed(tx: Tx, session_id: str, row: Sequence[Any]) -> Any:
    """An item of :data:`_REPLAY`'s row (turn id, sanitized, id), opened."""
    return sealed_json.open_json(tx, session_id, str(row[2]), "sanitized", row[1])


def _call_identity(item: Any) -> str | None:
    """A function or custom tool call's identity (its type and call id, else its
    id), or ``None`` for any other item."""
    if not isinstance(item, dict) or item.get("type") not in ("function_call", "custom_tool_call"):
        return None
    call = item.get("call_id") or item.get("id")
    return f"{item['type']}\0{call}" if isinstance(call, str) and call else None


def replay_turns(tx: Tx, session_id: str, limit: int) -> list[ResponseReplayTurn]:
    session_exists(tx, session_id)
    grouped: dict[str, list[Any]] = {}
    seen: dict[str, set[str]] = {}
    for row in tx.rows(_REPLAY, [session_id]):
        turn_id, item = row[0], _replayed(tx, session_id, row)
        # An archive may hold both the streamed item and the completed
        # response's copy of one call: replay each call once per turn.
        call = _call_identity(item)
        if call is not None:
            calls = seen.setdefault(turn_id, set())
            if call in calls:
                continue
            calls.add(call)
        if turn_id not in grouped:
            if len(grouped) >= limit:
                break
            grouped[turn_id] = []
        grouped[turn_id].append(item)
    return [ResponseReplayTurn(t, tuple(items)) for t, items in grouped.items()]


# -- the store's methods ------------------------------------------------------------


class Archives(Area):
    """``store.archives``: see the module docstring."""

    def save_run(self, run: ResponseRun, *, lease: Lease | None = None) -> ResponseRun:
        """Save a Responses background run's durable state (session seed
        SaveResponseRun), replacing what was saved under ``(session_id,
        local_run_id)`` (its ``id`` and ``created_at`` stay); returns it as
        stored. ``created_at`` defaults to the store's now, ``updated_at`` to
        ``created_at`` when that is given, else the store's now. A session
        write: under the session's ``lease``, or while nobody holds it.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: not a ResponseRun, a bad id, an empty provider,
                api or state, a negative number, a bad time; nothing is written.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        """
        check_run(run)
        check_session_lease(run.session_id, lease)
        return self._fenced("save_response_run", lease, lambda tx: save_run(tx, run, lease))

    def save_turn(self, turn: ResponseTurn, *, lease: Lease | None = None) -> ResponseTurn:
        """Save one Responses turn's lineage and summaries (session seed
        SaveResponseTurn), replacing what was saved under ``(session_id,
        local_turn_id)`` (its ``id`` and ``created_at`` stay); returns it as
        stored. A session write: under the session's ``lease``, or while nobody
        holds it.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: not a ResponseTurn, a bad id, an empty provider,
                api, model, state mode or status, a summary not storable as JSON
                exactly or over 128 KiB, a bad time; nothing is written.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        """
        checked, summaries = check_turn(turn)
        check_session_lease(checked.session_id, lease)
        return self._fenced(
            "save_response_turn", lease, lambda tx: save_turn(tx, checked, summaries, lease)
        )

    def save_item(self, item: ResponseItem, *, lease: Lease | None = None) -> ResponseItem:
        """Archive one sanitized output item of a turn (session seed
        SaveResponseItem), replacing what was saved under ``(session_id,
        local_turn_id, item_key)`` (its ``id`` and ``created_at`` stay); an
        empty ``item_key`` is derived from ``item_id`` and ``output_index``
        (see :class:`ResponseItem`). Returns it as stored. Never pass a raw
        provider request or response body. A session write: under the
        session's ``lease``, or while nobody holds it.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: not a ResponseItem, a bad id, an empty item type,
                a negative output index, no ``sanitized`` value, one not storable
                as JSON exactly or over 128 KiB; nothing is written.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session.
        """
        checked, sanitized = check_item(item)
        check_session_lease(checked.session_id, lease)
        return self._fenced(
            "save_response_item", lease, lambda tx: save_item(tx, checked, sanitized, lease)
        )

    def get_run(self, session_id: str, local_run_id: str) -> ResponseRun | None:
        """The saved run, or ``None`` (session seed GetResponseRun).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad id.
        """
        check_id(session_id, "session_id")
        check_id(local_run_id, "local_run_id")
        return self.db.read("get_response_run", lambda tx: get_run(tx, session_id, local_run_id))

    def get_turn(self, session_id: str, local_turn_id: str) -> ResponseTurn | None:
        """The saved turn, or ``None`` (session seed GetResponseTurn).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad id.
        """
        check_id(session_id, "session_id")
        check_id(local_turn_id, "local_turn_id")
        return self.db.read("get_response_turn", lambda tx: get_turn(tx, session_id, local_turn_id))

    def runs(self, session_id: str, *, limit: int = 100) -> list[ResponseRun]:
        """The session's saved runs, oldest (``created_at``, then ``id``) first, at
        most ``limit`` (session seed ListResponseRuns).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad id or ``limit``.
        """
        check_id(session_id, "session_id")
        check_limit(limit)
        return self.db.read("list_response_runs", lambda tx: list_runs(tx, session_id, limit))

    def items(self, session_id: str, local_turn_id: str) -> list[ResponseItem]:
        """The turn's archived items in the order first saved (by ``id``)
        (session seed ListResponseItems).

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad id.
        """
        check_id(session_id, "session_id")
        check_id(local_turn_id, "local_turn_id")
        return self.db.read(
            "list_response_items", lambda tx: list_items(tx, session_id, local_turn_id)
        )

    def replay_items(self, session_id: str, *, limit: int = 1000) -> list[Any]:
        """The sanitized items (JSON values) of the session's completed and
        incomplete turns, in order: turns by ``created_at`` (then ``id``), items
        by ``output_index`` (then ``id``); at most ``limit`` (session seed
        ListResponseReplayItems), for a provider's native replay.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad id or ``limit``.
        """
        check_id(session_id, "session_id")
        check_limit(limit)
        return self.db.read("response_replay_items", lambda tx: replay_items(tx, session_id, limit))

    def replay_turns(self, session_id: str, *, limit: int = 500) -> list[ResponseReplayTurn]:
        """The items of :meth:`replay_items` grouped by turn, at most ``limit``
        turns (session seed ListResponseReplayTurns); a function or custom tool
        call archived twice in one turn (same type and ``call_id``, else ``id``)
        is replayed once.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad id or ``limit``.
        """
        check_id(session_id, "session_id")
        check_limit(limit)
        return self.db.read("response_replay_turns", lambda tx: replay_turns(tx, session_id, limit))
