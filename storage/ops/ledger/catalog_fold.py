"""Folding ledger records into a session's catalog entry (sessionstore
Catalog.UpdateOnEvent and the repair fold). The record kinds and payloads
folded are listed in :mod:`turnkeeper.spec.catalog`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
from turnkeeper.spec.ledger import WORKSPACE_CHECKPOINT_KIND, WORKSPACE_KINDS

from . import records, workspace
from .catalog_codec import hustle_key


@dataclass
class RepairState:
    """What only a whole-ledger fold tracks (``repair``): open hustle starts
    by run id and the compaction attempts that ended."""

    starts: dict[str, dict[str, Any]] = field(default_factory=dict)
    compactions_done: set[str] = field(default_factory=set)
    session_started: bool = False


def payload_of(session_id: str, seq: int, payload: bytes) -> dict[str, Any]:
    """The JSON object a catalog kind's record holds.

    Raises:
        ReplayDecodeError: not a UTF-8 JSON object, or one nested too deeply
            to decode here (``RecursionError`` as ``__cause__``; an append
            refuses a payload nested deeper than ``MAX_PAYLOAD_DEPTH``).
    """
    try:
        body = records.loads_json(payload)
    except (ValueError, UnicodeDecodeError) as failure:
        raise errors.ReplayDecodeError(
            session_id, seq, detail="a catalog record's payload is not UTF-8 JSON"
        ) from failure
    if not isinstance(body, dict):
        raise errors.ReplayDecodeError(
            session_id, seq, detail="a catalog record's payload is not a JSON object"
        )
    try:
        return dict(_unicode(body))
    except RecursionError as deep:
        raise errors.ReplayDecodeError(
            session_id, seq, detail="a catalog record's payload is nested too deeply"
        ) from deep


def _unicode(value: Any) -> Any:
    """``value`` (decoded JSON) with every lone surrogate in its text (JSON
    may escape one, ``"\\ud800"``; clients that cut an emoji in half write
    them) replaced by U+FFFD: the catalog stores UTF-8, which cannot hold one,
    and a derived title need not keep it (before, the entry could never be
    written again, nor repaired)."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {_unicode(k): _unicode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unicode(v) for v in value]
    return value


def _text(session_id: str, seq: int, body: dict[str, Any], key: str, required: bool = False) -> str:
    value = body.get(key, "")
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise errors.ReplayDecodeError(session_id, seq, detail=f"{key!r} is not text")
    return value


def _add(loop_id: str, a: Usage, b: Usage) -> Usage:
    total = Usage(a.input_tokens + b.input_tokens, a.output_tokens + b.output_tokens)
    if total.input_tokens > c.MAX_COUNT or total.output_tokens > c.MAX_COUNT:
        raise errors.CatalogUsageError(loop_id, detail="the cumulative usage overflows")
    return total


def usage_of(loop_id: str, value: object) -> Usage:
    """``value`` (a record's ``usage``) as :class:`Usage`.

    Raises:
        CatalogUsageError: not an object of counts in 0 … ``MAX_COUNT``.
    """
    if value is None:
        return Usage()
    if not isinstance(value, dict):
        raise errors.CatalogUsageError(loop_id, detail="usage is not an object")
    counts = []
    for key in ("input_tokens", "output_tokens"):
        n = value.get(key, 0)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= c.MAX_COUNT:
            raise errors.CatalogUsageError(loop_id, detail=f"usage.{key} is not a count: {n!r}")
        counts.append(n)
    return Usage(counts[0], counts[1])


def title_of(text: str) -> str:
    """The title a turn's user text gives: its first non-empty line, at most
    ``TITLE_MAX`` characters ("" when it has none)."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[: c.TITLE_MAX]
    return ""


def _loop(meta: SessionMeta, loop_id: str) -> tuple[list[LoopUsageMeta], int]:
    loops = list(meta.loops)
    for i, lp in enumerate(loops):
        if lp.loop_id == loop_id:
            return loops, i
    loops.append(LoopUsageMeta(loop_id))
    loops.sort(key=lambda lp: lp.loop_id)
    return loops, next(i for i, lp in enumerate(loops) if lp.loop_id == loop_id)


def _state(meta: SessionMeta, state: str) -> str:
    return meta.state if meta.state == c.STATE_STOPPED else state


def _step(meta: SessionMeta, sid: str, seq: int, body: dict[str, Any]) -> SessionMeta:
    loop_id = _text(sid, seq, body, "loop_id", required=True)
    loops, i = _loop(meta, loop_id)
    lp = loops[i]
    lp = replace(
        lp,
        cumulative_usage=_add(loop_id, lp.cumulative_usage, usage_of(loop_id, body.get("usage"))),
    )
    runtime = _text(sid, seq, body, "runtime")
    lp = replace(lp, runtime_seq=max(lp.runtime_seq, seq))
    if runtime and seq >= lp.runtime_value_seq:
        lp = replace(lp, runtime=runtime, runtime_value_seq=seq)
    if "context" in body:
        ctx = body["context"]
        if ctx is None:
            lp = replace(
                lp, context_seq=max(lp.context_seq, seq), context_value_seq=0, current_context=None
            )
        elif (
            isinstance(ctx, dict)
            and all(
                isinstance(ctx.get(k), int) and not isinstance(ctx.get(k), bool)
                for k in ("tokens", "window")
            )
            and 0 <= ctx["tokens"] <= ctx["window"] <= c.MAX_COUNT
        ):
            lp = replace(
                lp,
                context_seq=seq,
                context_value_seq=seq,
                current_context=ContextMeasurement(ctx["tokens"], ctx["window"]),
            )
        else:
            raise errors.ReplayDecodeError(sid, seq, detail="'context' is not a measurement")
    loops[i] = lp
    return replace(
        meta,
        loops=tuple(loops),
        last_step=EventSummary(
            "step_done", seq, _text(sid, seq, body, "turn_id"), _text(sid, seq, body, "summary")
        ),
    )


def _hustle(meta: SessionMeta, sid: str, seq: int, body: dict[str, Any]) -> SessionMeta:
    run_id = _text(sid, seq, body, "run_id", required=True)
    name = _text(sid, seq, body, "name", required=True)
    source = _text(sid, seq, body, "model_source", required=True)
    status = _text(sid, seq, body, "status", required=True)
    if source not in c.MODEL_SOURCES or status not in c.HUSTLE_STATUSES:
        raise errors.CatalogHustleError(
            c.HUSTLE_INVALID_LIFECYCLE, run_id, detail=f"source {source!r}, status {status!r}"
        )
    key = "" if source == "current_loop" else _text(sid, seq, body, "named_model_key")
    try:
        usage = usage_of(run_id, body.get("usage"))
    except errors.CatalogUsageError as bad:
        raise errors.CatalogHustleError(c.HUSTLE_USAGE_OVERFLOW, run_id) from bad
    # The bucket is (name, model source, named model key, status), never the
    # run's runtime: current-loop work records none (its resolved runtimes
    # cannot grow the catalog); named work keeps the one runtime its key
    # resolved to, on every status's bucket of it (sessionstore
    # HustleUsageAggregate, foldCatalogHustleTerminal).
    runtime = _text(sid, seq, body, "runtime") if source == "named" else ""
    hustles = list(meta.hustles)
    siblings = [i for i, h in enumerate(hustles) if hustle_key(h)[:3] == (name, source, key)]
    resolved = {hustles[i].runtime for i in siblings} - {""}
    if runtime and resolved - {runtime}:
        raise errors.CatalogHustleError(
            c.HUSTLE_RUNTIME_MISMATCH, run_id, detail="its named model resolved to another runtime"
        )
    runtime = runtime or next(iter(resolved), "")
    for i in siblings:
        hustles[i] = replace(hustles[i], runtime=runtime)
    bucket = HustleUsageAggregate(name, source, status, 1, key, runtime, usage)
    for i, h in enumerate(hustles):
        if hustle_key(h) == hustle_key(bucket):
            if h.runs + 1 > c.MAX_COUNT:
                raise errors.CatalogHustleError(c.HUSTLE_RUN_COUNT_OVERFLOW, run_id)
            try:
                total = _add(run_id, h.cumulative_usage, usage)
            except errors.CatalogUsageError as bad:
                raise errors.CatalogHustleError(c.HUSTLE_USAGE_OVERFLOW, run_id) from bad
            hustles[i] = replace(h, runs=h.runs + 1, cumulative_usage=total)
            break
    else:
        hustles.append(bucket)
        hustles.sort(key=hustle_key)
    return replace(meta, hustles=tuple(hustles))


def _repair_checks(state: RepairState, sid: str, seq: int, kind: str, body: dict[str, Any]) -> None:
    """The whole-ledger checks of ``repair``: hustle starts against their
    terminals, one compaction terminal per attempt."""
    if kind == "session_started":
        state.session_started = True
    elif kind == "hustle_started":
        run_id = _text(sid, seq, body, "run_id", required=True)
        if run_id in state.starts:
            raise errors.CatalogHustleError(c.HUSTLE_DUPLICATE_START, run_id)
        state.starts[run_id] = body
    elif kind == "hustle_done":
        run_id = _text(sid, seq, body, "run_id", required=True)
        start = state.starts.pop(run_id, None)
        if start is None:
            raise errors.CatalogHustleError(c.HUSTLE_TERMINAL_WITHOUT_START, run_id)
        for key in ("name", "model_source", "named_model_key"):
            if start.get(key, "") != body.get(key, ""):
                raise errors.CatalogHustleError(
                    c.HUSTLE_ATTRIBUTION_MISMATCH, run_id, detail=f"{key} differs from the start's"
                )
        if start.get("runtime", "") and start.get("runtime", "") != body.get("runtime", ""):
            raise errors.CatalogHustleError(c.HUSTLE_RUNTIME_MISMATCH, run_id)
    elif kind == "compaction_done":
        attempt = _text(sid, seq, body, "attempt_id", required=True)
        if attempt in state.compactions_done:
            raise errors.CatalogCompactionError(c.COMPACTION_DUPLICATE_TERMINAL, attempt)
        state.compactions_done.add(attempt)


def fold(
    meta: SessionMeta,
    seq: int,
    kind: str,
    payload: bytes,
    now: datetime,
    repair: RepairState | None = None,
) -> SessionMeta:
    """``meta`` with the record at ``seq`` folded in; ``now`` stamps activity.
    ``repair`` (a whole-ledger fold) adds the checks only it can make.

    Raises:
        CatalogOrderingError: ``seq`` is not after ``meta.last_journal_seq``.
        ReplayDecodeError: a catalog kind's payload does not decode.
        CatalogUsageError, CatalogHustleError, CatalogCompactionError: as named.
    """
    sid = meta.session_id
    if seq <= meta.last_journal_seq:
        raise errors.CatalogOrderingError(kind, seq, meta.last_journal_seq)
    meta = replace(meta, last_journal_seq=seq)
    if kind not in c.CATALOG_KINDS:
        return meta
    if kind in WORKSPACE_KINDS:
        found = workspace.decode_payload(sid, seq, kind, payload)
        point = replace(
            found,
            ref=_unicode(found.ref),
            event_id=_unicode(found.event_id),
            consistency=_unicode(found.consistency),
            turn_id=_unicode(found.turn_id),
        )  # the catalog's text holds no lone surrogate (see _unicode)
        if kind == WORKSPACE_CHECKPOINT_KIND:
            current = WorkspacePointer(point.ref, point.event_id, seq, c.SOURCE_CHECKPOINT)
            return replace(meta, last_checkpoint=point, current_workspace=current)
        current = WorkspacePointer(point.ref, point.event_id, seq, c.SOURCE_RESTORE)
        return replace(meta, current_workspace=current)
    body = payload_of(sid, seq, payload)
    if repair is not None:
        _repair_checks(repair, sid, seq, kind, body)
    if kind == "session_started":
        created = _text(sid, seq, body, "created_at", required=True)
        try:
            created_at = datetime.fromisoformat(created)
        except ValueError as bad:
            raise errors.ReplayDecodeError(sid, seq, detail="'created_at' is not a time") from bad
        if created_at.tzinfo is None:
            raise errors.ReplayDecodeError(sid, seq, detail="'created_at' has no time zone")
        return replace(
            meta,
            created_at=created_at,
            status=c.STATUS_ACTIVE if meta.status != c.STATUS_STOPPED else meta.status,
            state=_state(meta, c.STATE_IDLE),
            residency=c.RESIDENCY_RESIDENT,
            loop_count=max(1, meta.loop_count),
            agent_kind=_text(sid, seq, body, "agent_kind"),
            config_fingerprint=_text(sid, seq, body, "config_fingerprint"),
        )
    if kind == "turn_started":
        title = title_of(_text(sid, seq, body, "user_text"))
        return replace(
            meta,
            title=title or meta.title,
            active_turn_id=_text(sid, seq, body, "turn_id", required=True),
            state=_state(meta, c.STATE_RUNNING),
            last_active_at=now,
        )
    if kind in ("turn_done", "turn_failed", "turn_interrupted"):
        after = {"turn_done": c.STATE_IDLE, "turn_failed": c.STATE_FAILED}
        return replace(
            meta,
            active_turn_id="",
            state=_state(meta, after.get(kind, c.STATE_INTERRUPTED)),
            last_turn=EventSummary(
                kind,
                seq,
                _text(sid, seq, body, "turn_id", required=True),
                _text(sid, seq, body, "summary"),
            ),
        )
    if kind == "step_done":
        return replace(_step(meta, sid, seq, body), last_active_at=now)
    if kind == "loop_started":
        loop_id = _text(sid, seq, body, "loop_id", required=True)
        loops, i = _loop(meta, loop_id)
        runtime = _text(sid, seq, body, "runtime")
        lp = replace(loops[i], runtime_seq=max(loops[i].runtime_seq, seq))
        if runtime:
            lp = replace(lp, runtime=runtime, runtime_value_seq=seq)
        loops[i] = lp
        return replace(meta, loops=tuple(loops), loop_count=max(1, meta.loop_count) + 1)
    if kind == "gate_opened":
        gate = _text(sid, seq, body, "gate_id", required=True)
        return replace(meta, waiting_gate_id=gate, state=_state(meta, c.STATE_WAITING_ON_GATE))
    if kind == "gate_resolved":
        back = c.STATE_RUNNING if meta.active_turn_id else c.STATE_IDLE
        return replace(meta, waiting_gate_id="", state=_state(meta, back))
    if kind == "session_stopped":
        return replace(
            meta,
            status=c.STATUS_STOPPED,
            state=c.STATE_STOPPED,
            residency=c.RESIDENCY_COLD,
            active_turn_id="",
            waiting_gate_id="",
        )
    if kind == "residency_released":
        return replace(meta, residency=c.RESIDENCY_COLD)
    if kind == "restore_done":
        return replace(meta, residency=c.RESIDENCY_RESIDENT, last_active_at=now)
    if kind == "hustle_done":
        return _hustle(meta, sid, seq, body)
    return meta  # hustle_started, compaction_*: checked by repair only
