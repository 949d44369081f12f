"""``store.usage``: usage records, one per model request (session seed RecordUsage,
RecordUsageFromProviderUsage), and the usage imported assistant messages carry.

A record is a session write (``storage/protocol.py``): under the session's
lease, fenced in the write's own transaction, or while nobody holds the
session. Its id is unique within the session, so recording the same request
again (a retry after an unknown commit) under its ``usage_id`` writes nothing
twice; the usage of an assistant entry is keyed ``entry:<entry id>``, whether
a runtime recorded it (``entry_id=``) or an import read it from the message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import uuid6

from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import Lease
from turnkeeper.spec.usage import (
    UsageFigures,
    UsageRecord,
    check_cost,
    check_count,
    from_anthropic_message,
    from_pi_message,
    from_provider,
    text_of,
)

from ..backend import Tx, keyed, utc
from ..codec import check_id, check_instant, check_text, derived_id
from ..validate import check_session_lease
from . import leases, run_reads
from .base import Area

USAGE_COLUMNS = (
    "session_id",
    "id",
    "run_id",
    "entry_id",
    "provider",
    "protocol",
    "model",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "total_tokens",
    "cost_usd",
    "duration_ms",
    "source",
    "recorded_at",
)
"""The columns of ``usage_records``, in table order (a bulk insert names them all)."""

USAGE_COLS = ", ".join(USAGE_COLUMNS)

ENTRY_PREFIX = "entry:"
"""The prefix of the usage id of an assistant entry's usage."""


def entry_usage_id(entry_id: str) -> str:
    """The usage id of the usage of assistant entry ``entry_id``."""
    return derived_id(ENTRY_PREFIX, entry_id)


def usage_row(row: Sequence[Any]) -> UsageRecord:
    """The record of a row of :data:`USAGE_COLUMNS`."""
    values = dict(zip(USAGE_COLUMNS, row, strict=True))
    values["recorded_at"] = utc(values["recorded_at"])
    return UsageRecord(**values)


def _values(record: UsageRecord) -> list[Any]:
    """The row of ``record``, in :data:`USAGE_COLUMNS` order."""
    return [getattr(record, name) for name in USAGE_COLUMNS]


def _same(stored: UsageRecord, asked: UsageRecord, timed: bool) -> bool:
    """Whether ``asked`` repeats ``stored`` (its time only when the caller gave one)."""
    keep = {"recorded_at": stored.recorded_at} if not timed else {}
    return stored == _replace(asked, **keep)


def _replace(record: UsageRecord, **changes: Any) -> UsageRecord:
    return dataclasses.replace(record, **changes)


def get(tx: Tx, session_id: str, usage_id: str) -> UsageRecord | None:
    row = tx.one(
        f"SELECT {USAGE_COLS} FROM usage_records WHERE {keyed('id', 'session_id = ?')}",
        [usage_id, session_id],
    )
    return None if row is None else usage_row(row)


def record(tx: Tx, asked: UsageRecord, timed: bool, lease: Lease | None) -> UsageRecord:
    """Store ``asked`` (its ``recorded_at`` the store's clock unless ``timed``),
    or return the record stored under its id when it repeats it.

    Raises:
        SessionNotFoundError, RunNotFoundError, EntryNotFoundError,
        UsageConflictError, InvalidInputError (a run of another session),
        LeaseLostError, BusyError.
    """
    sid = asked.session_id
    if tx.one("SELECT 1 FROM sessions WHERE id = ?", [sid]) is None:
        raise errors.SessionNotFoundError(sid)
    found = get(tx, sid, asked.id)
    if found is not None:  # a retry returns what it stored, busy or not (as admission does)
        if not _same(found, asked, timed):
            raise errors.UsageConflictError(sid, asked.id)
        return found
    leases.fence_or_unheld(tx, session_target(sid), lease)
    if asked.run_id is not None:
        run = run_reads.get(tx, asked.run_id)
        if run is None:
            raise errors.RunNotFoundError(asked.run_id)
        if run.session_id != sid:
            raise errors.InvalidInputError("run_id", f"run {run.id!r} is not of session {sid!r}")
    if asked.entry_id is not None and (
        tx.one(
            f"SELECT 1 FROM entries WHERE {keyed('id', 'session_id = ?')}", [asked.entry_id, sid]
        )
        is None
    ):
        raise errors.EntryNotFoundError(sid, asked.entry_id)
    if not timed:
        assert tx.now is not None  # always set inside a transaction
        asked = _replace(asked, recorded_at=utc(tx.now))
    tx.exec(
        f"INSERT INTO usage_records ({USAGE_COLS}) VALUES ({', '.join('?' * 16)})",
        _values(asked),
    )
    return asked


def import_usage(
    tx: Tx,
    session_id: str,
    entries: Iterable[tuple[str, str, datetime, Mapping[str, Any]]],
    responses: set[str] | None = None,
) -> int:
    """Record the usage of every assistant message among ``entries`` (``(id,
    kind, timestamp, payload)`` as the session holds them, in file order)
    that has none yet under ``entry:<id>``; returns how many it recorded.
    Figures are read leniently (:func:`turnkeeper.spec.usage.from_pi_message`,
    else :func:`~turnkeeper.spec.usage.from_anthropic_message`): an import
    never fails on them, an odd figure is unknown (``None``).

    An Anthropic response is recorded once, not once per row: Claude Code
    writes one row per content block, each with the same ``message.id`` and
    the response's usage so far. The record is the last row's (its figures
    the response's whole), unless a row of that response has a record
    already (a file imported while the response was being written keeps the
    figures it was recorded with: never two records of one response).

    ``responses``: an import that calls this once per chunk of its entries
    passes the same set each time; it holds the responses recorded (or found
    recorded) by the calls before, so a response whose rows two chunks share
    is recorded once, with the figures of its rows in the first chunk."""
    found: list[tuple[str, UsageRecord]] = []  # (what is recorded once, the record)
    for entry_id, kind, ts, payload in entries:
        if kind != EntryKind.MESSAGE:
            continue
        message = payload.get("message")
        figures = from_pi_message(message)
        once = f"entry:{entry_id}"
        if figures is not None:
            assert isinstance(message, Mapping)
            names = (
                text_of(message, "provider"),
                text_of(message, "api"),
                text_of(message, "model"),
            )
        else:
            figures = from_anthropic_message(message)
            if figures is None:
                continue
            assert isinstance(message, Mapping)
            names = (ANTHROPIC, ANTHROPIC_MESSAGES, text_of(message, "model"))
            response = text_of(message, "id")
            once = f"response:{response}" if response else once
        record = _make(
            session_id,
            entry_usage_id(entry_id),
            names,
            figures,
            duration_ms=None,
            recorded_at=utc(ts),
            run_id=None,
            entry_id=entry_id,
            source="import",
        )
        found.append((once, record))
    if not found:
        return 0
    have = {
        r[0]
        for r in tx.rows(
            "SELECT entry_id FROM usage_records WHERE session_id = ? "
            "AND entry_id = ANY(?::VARCHAR[])",
            [session_id, sorted({r.entry_id for _, r in found if r.entry_id is not None})],
        )
    }
    last: dict[str, UsageRecord] = {}
    recorded: set[str] = set() if responses is None else set(responses)
    for once, record in found:
        last[once] = record
        if record.entry_id in have:
            recorded.add(once)
    fresh = [r for once, r in last.items() if once not in recorded]
    if responses is not None:
        responses.update(once for once in last if once.startswith("response:"))
    if fresh:
        tx.insert_rows("usage_records", USAGE_COLUMNS, [_values(r) for r in fresh])
    return len(fresh)


ANTHROPIC = "anthropic"
"""The ``provider`` of usage imported from an Anthropic response (Claude Code)."""

ANTHROPIC_MESSAGES = "anthropic-messages"
"""The ``protocol`` of usage imported from an Anthropic response (pi's ``api`` name for it)."""


def _make(
    session_id: str,
    usage_id: str,
    names: tuple[str, str, str],
    f: UsageFigures,
    *,
    duration_ms: int | None,
    recorded_at: datetime,
    run_id: str | None,
    entry_id: str | None,
    source: str,
) -> UsageRecord:
    """A record of ``names`` (provider, protocol, model) and figures ``f``."""
    return UsageRecord(
        session_id=session_id,
        id=usage_id,
        provider=names[0],
        protocol=names[1],
        model=names[2],
        input_tokens=f.input_tokens,
        output_tokens=f.output_tokens,
        cache_read_tokens=f.cache_read_tokens,
        cache_write_tokens=f.cache_write_tokens,
        total_tokens=f.total_tokens,
        cost_usd=f.cost_usd,
        duration_ms=duration_ms,
        recorded_at=recorded_at,
        run_id=run_id,
        entry_id=entry_id,
        source=source,
    )


# -- the store's methods ------------------------------------------------------------


class Usage(Area):
    """``store.usage``: usage records (session seed RecordUsage,
    RecordUsageFromProviderUsage), written per request and read per session."""

    def record(
        self,
        session_id: str,
        *,
        provider: str,
        model: str,
        protocol: str = "",
        input_tokens: int = 0,
        output_tokens: int = 0,
        total_tokens: int | None = None,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cost_usd: float | None = None,
        duration_ms: int | None = None,
        run_id: str | None = None,
        entry_id: str | None = None,
        usage_id: str | None = None,
        recorded_at: datetime | None = None,
        lease: Lease | None = None,
    ) -> UsageRecord:
        """Record one model request's usage in session ``session_id`` (session
        seed RecordUsage): ``provider``, ``protocol`` (the API spoken, pi's
        ``api``) and ``model``; tokens (``input_tokens`` not read from a
        cache, ``output_tokens``, ``cache_read_tokens``,
        ``cache_write_tokens``; ``total_tokens`` defaults to their sum);
        ``cost_usd`` in US dollars (``None``: unknown); ``duration_ms`` in
        milliseconds. ``run_id`` names the run of the session that made the
        request, ``entry_id`` the session's assistant entry it answered with.

        The record's id is ``usage_id``, or ``entry:<entry_id>`` with
        ``entry_id`` (so an import of that entry later records nothing
        twice), else a new UUIDv7. The same id with the same figures returns
        the stored record (a retry after an unknown commit; its time is
        compared only when ``recorded_at`` is given); other figures raise
        ``UsageConflictError``. ``recorded_at`` (aware) defaults to the
        store's clock.

        A session write: under the session's ``lease``, or while nobody holds
        the session.

        Raises:
            SessionNotFoundError: no session has this id.
            RunNotFoundError: ``run_id`` names no run.
            EntryNotFoundError: ``entry_id`` names no entry of the session.
            UsageConflictError: ``usage_id`` (or the entry's usage) was
                recorded with other figures.
            InvalidInputError: a count that is not an int from 0 to
                ``turnkeeper.spec.usage.MAX_TOKENS``, a cost that is not a
                finite number from 0, a run of another session, both
                ``usage_id`` and ``entry_id``, a usage id starting with
                ``entry:``, or a lease on another session.
            LeaseLostError: ``lease`` is no longer valid.
            BusyError: no ``lease`` given and someone holds the session (a
                repeated ``usage_id`` still returns its record).
        On any error nothing is written.
        """
        counts = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_read_tokens": cache_read_tokens,
            "cache_write_tokens": cache_write_tokens,
        }
        checked = {name: check_count(value, name) for name, value in counts.items()}
        total = (
            sum(checked.values()) if total_tokens is None else check_count(total_tokens, "total")
        )
        figures = UsageFigures(
            checked["input_tokens"],
            checked["output_tokens"],
            checked["cache_read_tokens"],
            checked["cache_write_tokens"],
            total,
            None if cost_usd is None else check_cost(cost_usd, "cost_usd"),
        )
        return self._record(
            session_id,
            provider=provider,
            protocol=protocol,
            model=model,
            figures=figures,
            duration_ms=duration_ms,
            run_id=run_id,
            entry_id=entry_id,
            usage_id=usage_id,
            recorded_at=recorded_at,
            lease=lease,
        )

    def record_from_provider(
        self,
        session_id: str,
        usage: Mapping[str, Any],
        *,
        provider: str,
        model: str,
        protocol: str = "",
        cost_usd: float | None = None,
        duration_ms: int | None = None,
        run_id: str | None = None,
        entry_id: str | None = None,
        usage_id: str | None = None,
        recorded_at: datetime | None = None,
        lease: Lease | None = None,
    ) -> UsageRecord:
        """Record one model request's usage from the provider's own usage object
        (session seed RecordUsageFromProviderUsage): OpenAI Chat Completions
        (``prompt_tokens`` …), OpenAI Responses (``input_tokens`` with
        ``input_tokens_details``), Anthropic Messages (``input_tokens`` with
        ``cache_read_input_tokens`` …), Google Gemini (``promptTokenCount`` …,
        or snake_case) or pi (``input``, ``cacheRead`` …, with ``cost``),
        recognised by its keys and mapped as ``turnkeeper.spec.usage`` says
        (input tokens exclude cache reads). ``cost_usd`` (US dollars) is the
        given one, else pi's ``cost.total``, else unknown. Everything else is
        as :meth:`record`.

        Raises:
            InvalidInputError: ``usage`` has no known shape (or two), a count
                that is not an int from 0, more cached than prompt tokens, or
                as :meth:`record`.
            SessionNotFoundError, RunNotFoundError, EntryNotFoundError,
            UsageConflictError, LeaseLostError, BusyError: as :meth:`record`.
        On any error nothing is written.
        """
        figures = from_provider(usage)
        if cost_usd is not None:
            figures = dataclasses.replace(figures, cost_usd=check_cost(cost_usd, "cost_usd"))
        return self._record(
            session_id,
            provider=provider,
            protocol=protocol,
            model=model,
            figures=figures,
            duration_ms=duration_ms,
            run_id=run_id,
            entry_id=entry_id,
            usage_id=usage_id,
            recorded_at=recorded_at,
            lease=lease,
        )

    def _record(
        self,
        session_id: str,
        *,
        provider: str,
        protocol: str,
        model: str,
        figures: UsageFigures,
        duration_ms: int | None,
        run_id: str | None,
        entry_id: str | None,
        usage_id: str | None,
        recorded_at: datetime | None,
        lease: Lease | None,
    ) -> UsageRecord:
        check_id(session_id, "session_id")
        for name, text in (("provider", provider), ("protocol", protocol), ("model", model)):
            check_text(text, name)
        if duration_ms is not None:
            check_count(duration_ms, "duration_ms")
        if run_id is not None:
            check_id(run_id, "run_id")
        if usage_id is not None and entry_id is not None:
            raise errors.InvalidInputError("usage_id", "give usage_id or entry_id, not both")
        if usage_id is not None:
            check_id(usage_id, "usage_id")
            if usage_id.startswith(ENTRY_PREFIX):
                raise errors.InvalidInputError(
                    "usage_id", f"ids starting with {ENTRY_PREFIX!r} are entries' (use entry_id)"
                )
        if entry_id is not None:
            usage_id = entry_usage_id(check_id(entry_id, "entry_id"))
        timed = recorded_at is not None
        at = check_instant(recorded_at, "recorded_at") if recorded_at is not None else None
        check_session_lease(session_id, lease)
        asked = _make(
            session_id,
            usage_id or str(uuid6.uuid7()),
            (provider, protocol, model),
            figures,
            duration_ms=duration_ms,
            recorded_at=at or datetime.min,  # replaced by the store's clock unless timed
            run_id=run_id,
            entry_id=entry_id,
            source="record",
        )
        return self._fenced("record_usage", lease, lambda tx: record(tx, asked, timed, lease))

    def get(self, session_id: str, usage_id: str) -> UsageRecord | None:
        """The usage record ``usage_id`` of the session (``entry:<entry id>`` for
        an assistant entry's usage), or ``None``."""
        check_id(session_id, "session_id")
        check_id(usage_id, "usage_id")
        return self.db.read("get_usage", lambda tx: get(tx, session_id, usage_id))

    def list(self, session_id: str, *, run_id: str | None = None) -> list[UsageRecord]:
        """The session's usage records (only ``run_id``'s, when given), by
        ``recorded_at`` then id.

        Raises:
            SessionNotFoundError: no session has this id.
        """
        check_id(session_id, "session_id")
        where, params = "session_id = ?", [session_id]
        if run_id is not None:
            where, params = where + " AND run_id = ?", [*params, check_id(run_id, "run_id")]
        rows = self.db.read(
            "list_usage",
            lambda tx: tx.rows(
                f"SELECT {USAGE_COLS} FROM usage_records WHERE {where} ORDER BY recorded_at, id",
                params,
            ),
        )
        return self._inside(session_id, [usage_row(r) for r in rows])
