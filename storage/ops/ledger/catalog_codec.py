"""The catalog's stored form: a :class:`~turnkeeper.spec.catalog.SessionMeta`
as snake_case JSON text (sessionstore's catalog codec), decoded strictly:
a repeated member is an error (never last-value-wins), and the bounded loop
and hustle projections are validated against their invariants."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from typing import Any

from turnkeeper.spec import catalog as c
from turnkeeper.spec import errors
from turnkeeper.spec.catalog import (
    ContextMeasurement,
    EventSummary,
    HustleUsageAggregate,
    LoopUsageMeta,
    SessionMeta,
    Usage,
    WorkspacePointer,
)
from turnkeeper.spec.ledger import CheckpointSummary


def _usage(u: Usage) -> dict[str, int]:
    return {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens}


def _summary(s: EventSummary | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {"kind": s.kind, "seq": s.seq, "turn_id": s.turn_id, "summary": s.summary}


def _time(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def to_dict(meta: SessionMeta) -> dict[str, Any]:
    """``meta`` as the JSON object stored."""
    return {
        "session_id": meta.session_id,
        "title": meta.title,
        "created_at": _time(meta.created_at),
        "last_active_at": _time(meta.last_active_at),
        "status": meta.status,
        "agent_kind": meta.agent_kind,
        "loop_count": meta.loop_count,
        "config_fingerprint": meta.config_fingerprint,
        "residency": meta.residency,
        "state": meta.state,
        "last_journal_seq": meta.last_journal_seq,
        "active_turn_id": meta.active_turn_id,
        "waiting_gate_id": meta.waiting_gate_id,
        "last_turn": _summary(meta.last_turn),
        "last_step": _summary(meta.last_step),
        "loops": [
            {
                "loop_id": lp.loop_id,
                "runtime": lp.runtime,
                "runtime_seq": lp.runtime_seq,
                "runtime_value_seq": lp.runtime_value_seq,
                "cumulative_usage": _usage(lp.cumulative_usage),
                "context_seq": lp.context_seq,
                "context_value_seq": lp.context_value_seq,
                "current_context": None
                if lp.current_context is None
                else {"tokens": lp.current_context.tokens, "window": lp.current_context.window},
            }
            for lp in meta.loops
        ],
        "hustles": [
            {
                "name": h.name,
                "model_source": h.model_source,
                "named_model_key": h.named_model_key,
                "runtime": h.runtime,
                "status": h.status,
                "runs": h.runs,
                "cumulative_usage": _usage(h.cumulative_usage),
            }
            for h in meta.hustles
        ],
        "last_checkpoint": None
        if meta.last_checkpoint is None
        else {
            "ref": meta.last_checkpoint.ref,
            "event_id": meta.last_checkpoint.event_id,
            "seq": meta.last_checkpoint.seq,
            "consistency": meta.last_checkpoint.consistency,
            "turn_id": meta.last_checkpoint.turn_id,
        },
        "current_workspace": None
        if meta.current_workspace is None
        else {
            "ref": meta.current_workspace.ref,
            "event_id": meta.current_workspace.event_id,
            "seq": meta.current_workspace.seq,
            "source": meta.current_workspace.source,
        },
    }


def encode(meta: SessionMeta) -> str:
    """``meta`` as its stored JSON text (UTF-8 storable).

    Raises:
        CatalogEncodeError: it does not encode (text that is not valid
            Unicode, such as a lone surrogate); the encoder's error is ``__cause__``.
    """
    try:
        text = json.dumps(to_dict(meta), ensure_ascii=False, sort_keys=True, allow_nan=False)
        text.encode("utf-8")
    except (ValueError, TypeError, UnicodeEncodeError) as failure:
        raise errors.CatalogEncodeError(detail=str(failure)) from failure
    return text


class _Bad(Exception):
    """A structural decoding failure (the cause of a CatalogDecodeError)."""


def _pairs(path: list[str]) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen or key.lower() in {k.lower() for k in seen}:
                raise errors.CatalogDuplicateFieldError("$", key)
            seen[key] = value
        return seen

    return hook


def _get(obj: Any, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    if not isinstance(obj, dict):
        raise _Bad(f"expected an object holding {key!r}")
    value = obj.get(key, default)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise _Bad(f"{key!r} has the wrong type ({type(value).__name__})")
    return value


def _count(obj: Any, key: str) -> int:
    value = _get(obj, key, int, 0)
    if not 0 <= value <= c.MAX_COUNT:
        raise _Bad(f"{key!r} is out of range")
    return int(value)


def folded_through(text: object) -> int:
    """The ``last_journal_seq`` of a stored entry's text: the sequence its
    fold reached (replay's lost-tail fence reads it); 0 for an entry that is
    malformed (catalog damage is the catalog's to report, not the ledger's)."""
    try:
        obj = json.loads(str(text))
        return _count(obj, "last_journal_seq") if isinstance(obj, dict) else 0
    except (ValueError, RecursionError, _Bad):
        return 0


def _decode_usage(obj: Any) -> Usage:
    return Usage(_count(obj, "input_tokens"), _count(obj, "output_tokens"))


def _decode_time(obj: Any, key: str) -> datetime | None:
    value = _get(obj, key, (str, type(None)))
    if value is None:
        return None
    t = datetime.fromisoformat(value)
    if t.tzinfo is None:
        raise _Bad(f"{key!r} has no time zone")
    return t


def _decode_summary(obj: Any, key: str) -> EventSummary | None:
    value = _get(obj, key, (dict, type(None)))
    if value is None:
        return None
    return EventSummary(
        _get(value, "kind", str),
        _count(value, "seq"),
        _get(value, "turn_id", str, ""),
        _get(value, "summary", str, ""),
    )


def _decode_loop(obj: Any) -> LoopUsageMeta:
    ctx = _get(obj, "current_context", (dict, type(None)))
    return LoopUsageMeta(
        loop_id=_get(obj, "loop_id", str, ""),
        runtime=_get(obj, "runtime", str, ""),
        runtime_seq=_count(obj, "runtime_seq"),
        runtime_value_seq=_count(obj, "runtime_value_seq"),
        cumulative_usage=_decode_usage(_get(obj, "cumulative_usage", dict, {})),
        context_seq=_count(obj, "context_seq"),
        context_value_seq=_count(obj, "context_value_seq"),
        current_context=None
        if ctx is None
        else ContextMeasurement(_count(ctx, "tokens"), _count(ctx, "window")),
    )


def _decode_hustle(obj: Any) -> HustleUsageAggregate:
    return HustleUsageAggregate(
        name=_get(obj, "name", str),
        model_source=_get(obj, "model_source", str),
        status=_get(obj, "status", str),
        runs=_count(obj, "runs"),
        named_model_key=_get(obj, "named_model_key", str, ""),
        runtime=_get(obj, "runtime", str, ""),
        cumulative_usage=_decode_usage(_get(obj, "cumulative_usage", dict, {})),
    )


def _decode_checkpoint(obj: Any) -> CheckpointSummary | None:
    value = _get(obj, "last_checkpoint", (dict, type(None)))
    if value is None:
        return None
    return CheckpointSummary(
        _get(value, "ref", str),
        _get(value, "event_id", str),
        _count(value, "seq"),
        _get(value, "consistency", str, ""),
        _get(value, "turn_id", (str, type(None))),
    )


def _decode_workspace(obj: Any) -> WorkspacePointer | None:
    value = _get(obj, "current_workspace", (dict, type(None)))
    if value is None:
        return None
    source = _get(value, "source", str, c.SOURCE_UNKNOWN)  # absent: stored before it existed
    if source not in c.WORKSPACE_SOURCES:
        raise _Bad(f"'source' is not one of {sorted(c.WORKSPACE_SOURCES)}")
    return WorkspacePointer(
        _get(value, "ref", str), _get(value, "event_id", str), _count(value, "seq"), source
    )


def from_dict(obj: Any) -> SessionMeta:
    """The entry ``obj`` (a decoded JSON object) holds; raises ``_Bad``."""
    enum_fields = {
        "status": c.SESSION_STATUSES,
        "state": c.SESSION_STATES,
        "residency": c.SESSION_RESIDENCIES,
    }
    for key, allowed in enum_fields.items():
        value = _get(obj, key, str, "")
        if value and value not in allowed:
            raise _Bad(f"{key!r} is not one of {sorted(allowed)}")
    return SessionMeta(
        session_id=_get(obj, "session_id", str),
        title=_get(obj, "title", str, ""),
        created_at=_decode_time(obj, "created_at"),
        last_active_at=_decode_time(obj, "last_active_at"),
        status=_get(obj, "status", str, ""),
        agent_kind=_get(obj, "agent_kind", str, ""),
        loop_count=_count(obj, "loop_count"),
        config_fingerprint=_get(obj, "config_fingerprint", str, ""),
        residency=_get(obj, "residency", str, ""),
        state=_get(obj, "state", str, ""),
        last_journal_seq=_count(obj, "last_journal_seq"),
        active_turn_id=_get(obj, "active_turn_id", str, ""),
        waiting_gate_id=_get(obj, "waiting_gate_id", str, ""),
        last_turn=_decode_summary(obj, "last_turn"),
        last_step=_decode_summary(obj, "last_step"),
        loops=tuple(_decode_loop(x) for x in _get(obj, "loops", list, [])),
        hustles=tuple(_decode_hustle(x) for x in _get(obj, "hustles", list, [])),
        last_checkpoint=_decode_checkpoint(obj),
        current_workspace=_decode_workspace(obj),
    )


def validate(meta: SessionMeta) -> None:
    """Check the bounded projections' invariants (sessionstore CatalogMetaRule).

    Raises:
        CatalogMetaValidationError: a loop breaks one (its index, field, rule).
        CatalogHustleMetaValidationError: a hustle aggregate breaks one.
    """
    previous = ""
    for i, lp in enumerate(meta.loops):
        if not lp.loop_id:
            raise errors.CatalogMetaValidationError(i, c.FIELD_LOOP_ID, c.RULE_REQUIRED)
        if i and lp.loop_id <= previous:
            raise errors.CatalogMetaValidationError(i, c.FIELD_LOOP_ORDER, c.RULE_SORTED_UNIQUE)
        previous = lp.loop_id
        if lp.runtime_value_seq > lp.runtime_seq:
            raise errors.CatalogMetaValidationError(i, c.FIELD_RUNTIME_SEQ, c.RULE_EXCEEDS_RUNTIME)
        if not lp.runtime and lp.runtime_value_seq:
            raise errors.CatalogMetaValidationError(i, c.FIELD_RUNTIME_SEQ, c.RULE_LEGACY_VALUE)
        if lp.context_value_seq > lp.context_seq:
            raise errors.CatalogMetaValidationError(
                i, c.FIELD_CONTEXT_VALUE_SEQ, c.RULE_EXCEEDS_CONTEXT
            )
        if lp.current_context is None and lp.context_value_seq:
            raise errors.CatalogMetaValidationError(
                i, c.FIELD_CONTEXT_VALUE_SEQ, c.RULE_CONTEXT_ABSENT
            )
        if lp.current_context is not None:
            if lp.context_value_seq != lp.context_seq:
                raise errors.CatalogMetaValidationError(
                    i, c.FIELD_CONTEXT_VALUE_SEQ, c.RULE_CONTEXT_CURRENT
                )
            if lp.current_context.tokens > lp.current_context.window:
                raise errors.CatalogMetaValidationError(i, c.FIELD_CURRENT_CONTEXT, c.RULE_INVALID)
    keys: list[tuple[str, ...]] = []
    named_runtimes: dict[tuple[str, ...], str] = {}
    for i, h in enumerate(meta.hustles):
        if not h.name:
            raise errors.CatalogHustleMetaValidationError(i, c.RULE_REQUIRED)
        if (
            h.model_source not in c.MODEL_SOURCES
            or h.status not in c.HUSTLE_STATUSES
            or h.runs < 1
            or (h.model_source == "current_loop" and (h.named_model_key or h.runtime))
        ):
            raise errors.CatalogHustleMetaValidationError(i, c.RULE_INVALID)
        keys.append(hustle_key(h))
        runtime = named_runtimes.setdefault(hustle_key(h)[:3], h.runtime)
        if runtime != h.runtime:  # one named model key's buckets hold one runtime
            raise errors.CatalogHustleMetaValidationError(i, c.RULE_INVALID)
    if keys != sorted(set(keys)):
        raise errors.CatalogHustleMetaValidationError(
            next(i for i in range(1, len(keys)) if keys[i] <= keys[i - 1]), c.RULE_SORTED_UNIQUE
        )


def upgraded_hustles(
    hustles: tuple[HustleUsageAggregate, ...],
) -> tuple[HustleUsageAggregate, ...]:
    """The hustle buckets of an entry written before schema 27, which keyed a
    bucket by its runtime too, as the seed keys them (what a repair of the
    same ledger folds): current-loop buckets lose their runtime and merge
    (runs and usage summed), and a named key's buckets take the one runtime
    it resolved to. Returned unchanged when they cannot be: a named key that
    resolved to two runtimes (``validate`` then refuses the entry and a
    repair reports ``runtime_mismatch``), or a sum past ``MAX_COUNT``."""
    resolved: dict[tuple[str, ...], set[str]] = {}
    for h in hustles:
        if h.model_source != "current_loop" and h.runtime:
            resolved.setdefault(hustle_key(h)[:3], set()).add(h.runtime)
    if any(len(runtimes) > 1 for runtimes in resolved.values()):
        return hustles
    merged: dict[tuple[str, ...], HustleUsageAggregate] = {}
    for h in hustles:
        if h.model_source == "current_loop":
            h = replace(h, runtime="")
        else:
            h = replace(h, runtime=next(iter(resolved.get(hustle_key(h)[:3], {""}))))
        seen = merged.get(hustle_key(h))
        if seen is not None:
            usage = Usage(
                seen.cumulative_usage.input_tokens + h.cumulative_usage.input_tokens,
                seen.cumulative_usage.output_tokens + h.cumulative_usage.output_tokens,
            )
            runs = seen.runs + h.runs
            if max(runs, usage.input_tokens, usage.output_tokens) > c.MAX_COUNT:
                return hustles
            h = replace(seen, runs=runs, cumulative_usage=usage)
        merged[hustle_key(h)] = h
    return tuple(sorted(merged.values(), key=hustle_key))


def hustle_key(h: HustleUsageAggregate) -> tuple[str, ...]:
    """The bucket an aggregate is sorted and merged by: name, model source,
    named model key, status (sessionstore's catalogHustleKey; not the runtime)."""
    return (h.name, h.model_source, h.named_model_key, h.status)


def decode(session_id: str, text: object, folded: int = 0) -> SessionMeta:
    """The entry stored as ``text`` for ``session_id``; its cursor
    (``last_journal_seq``) is the larger of the JSON's and ``folded``, the
    entry's ``folded_seq`` column (moved alone by an append of kinds the
    catalog does not fold: ``catalog_group.move_cursors``).

    Raises:
        CatalogReadError: it does not decode; ``__cause__`` is a
            ``CatalogDecodeError``, whose ``__cause__`` is the
            ``CatalogDuplicateFieldError``, ``CatalogMetaValidationError``,
            ``CatalogHustleMetaValidationError`` or the structural failure
            (a ``RecursionError`` for text nested too deeply to decode).
    """
    try:
        try:
            if not isinstance(text, str):
                raise _Bad(f"expected JSON text, got {type(text).__name__}")
            meta = from_dict(json.loads(text, object_pairs_hook=_pairs([])))
            if meta.session_id != session_id:
                raise _Bad(f"it names session {meta.session_id!r}")
            if folded == 0:  # written before schema 27 (every entry since sets the column)
                meta = replace(meta, hustles=upgraded_hustles(meta.hustles))
            validate(meta)
            if folded > meta.last_journal_seq:
                meta = replace(meta, last_journal_seq=folded)
        except (
            _Bad,
            ValueError,
            RecursionError,  # a damaged entry nested too deeply: typed as any other
            errors.CatalogDuplicateFieldError,
            errors.CatalogMetaValidationError,
            errors.CatalogHustleMetaValidationError,
        ) as failure:
            raise errors.CatalogDecodeError(detail=str(failure)) from failure
    except errors.CatalogDecodeError as bad:
        raise errors.CatalogReadError(session_id, detail="its catalog value is malformed") from bad
    return meta
