"""The tool-records machine's reading of the store (:mod:`.tools`): a call's
result or refusal as the model's outcome (:func:`attempt` and the shapes),
the records and events compared with :class:`~.tools_model.ToolModel`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from turnkeeper import (
    BusyError,
    InvalidInputError,
    InvalidTransitionError,
    LeaseLostError,
    OperationalError,
    RunNotFoundError,
    ToolExecution,
    ToolExecutionConflictError,
    ToolExecutionNotFoundError,
    ToolExecutionNotReclaimableError,
    TurnkeeperError,
)

from .ambiguous import INJECTED
from .oracle import Outcome
from .tools_model import Event, RecordModel, ToolModel, digest


def attempt(
    shape: Callable[[Any], Outcome], fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Outcome:
    """``fn(*args, **kwargs)`` as an outcome: ``("ok", *shape(result))`` or the
    refusal; the injected ``OperationalError`` (a lost reply) propagates, and
    any other error of the store is ``("unexpected", …)``, which no model
    outcome equals."""
    try:
        return ("ok", *shape(fn(*args, **kwargs)))
    except ToolExecutionConflictError as e:
        return ("conflict", e.field)
    except ToolExecutionNotReclaimableError as e:
        return ("not_reclaimable", e.reason)
    except InvalidTransitionError:
        return ("transition",)
    except ToolExecutionNotFoundError:
        return ("not_found",)
    except RunNotFoundError:
        return ("no_run",)
    except InvalidInputError as e:
        return ("invalid", e.field)
    except LeaseLostError:
        return ("lost",)
    except BusyError:
        return ("busy",)
    except OperationalError as e:
        if e.detail == INJECTED:  # a lost reply: ``ambiguously`` tells the caller
            raise
        return ("unexpected", type(e).__name__, str(e))
    except TurnkeeperError as e:  # any other typed error disagrees with the model
        return ("unexpected", type(e).__name__, str(e))


def _epoch(epoch: int | None) -> int:
    return -1 if epoch is None else epoch


def claimed(got: tuple[ToolExecution, bool]) -> Outcome:
    """A claim's result: (key, created, state, attempt)."""
    return (got[0].execution_key, got[1], got[0].state, got[0].attempt)


def completed(rec: ToolExecution) -> Outcome:
    """A completion's result: (state, result, is_error)."""
    return (rec.state, rec.result, rec.is_error)


def keys_of(recs: list[ToolExecution]) -> Outcome:
    """The records a call changed: (their execution keys,)."""
    return ([r.execution_key for r in recs],)


def reclaimed(rec: ToolExecution) -> Outcome:
    """A reclaim's result: (state, attempt, run id)."""
    return (rec.state, rec.attempt, rec.run_id)


def counted(n: int) -> Outcome:
    """A count's result: (n,)."""
    return (n,)


def stored_record(r: ToolExecution) -> tuple[Any, ...]:
    """A stored record's fields the machine compares (see :func:`model_record`)."""
    return (
        r.execution_key,
        r.run_id,
        r.local_turn_id,
        r.provider_call_id,
        r.tool_name,
        r.side_effecting,
        r.args_digest,
        r.state,
        r.result,
        r.is_error,
        r.reason,
        r.attempt,
        r.lease_epoch,
    )


def model_record(m: RecordModel) -> tuple[Any, ...]:
    """The model's record as :func:`stored_record` reads a stored one (its
    arguments as their digest)."""
    return (
        m.key,
        m.run_id,
        m.local_turn_id,
        m.provider_call_id,
        m.tool_name,
        m.side_effecting,
        digest(m.args),
        m.state,
        m.result,
        m.is_error,
        m.reason,
        m.attempt,
        m.lease_epoch,
    )


EVENT_COLUMNS = "execution_key, session_id, attempt, edge, dest, lease_epoch"
"""The columns of ``tool_execution_events`` :func:`check_events` reads."""


def check_events(rows: list[dict[str, Any]], model: ToolModel) -> None:
    """Assert that ``rows`` (every ``tool_execution_events`` row, as dicts of
    :data:`EVENT_COLUMNS`) are exactly ``model``'s transitions, and per
    execution key: one claim, at attempt 1; one reclaim per later attempt; at
    most one completion; the last event's destination is the record's state;
    no lease epoch above the last granted on its session.

    Raises:
        AssertionError: the first of those that does not hold, with what differs.
    """
    seen: Counter[Event] = Counter(
        (r["execution_key"], r["attempt"], r["edge"], _epoch(r["lease_epoch"])) for r in rows
    )
    assert seen == model.events, (seen - model.events, model.events - seen)
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault(r["execution_key"], []).append(r)
    for key, events in by_key.items():
        claims = sorted(e["attempt"] for e in events if e["edge"] == "claim")
        reclaims = sorted(e["attempt"] for e in events if e["edge"].startswith("reclaim"))
        assert claims == [1], (key, "one claim, at attempt 1", claims)
        assert reclaims == list(range(2, len(reclaims) + 2)), (key, reclaims)
        assert sum(e["edge"] == "complete" for e in events) <= 1, (key, "two results")
        last = max(events, key=lambda e: (e["attempt"], _ORDER[e["edge"]]))
        rec = model.records[key]
        assert last["dest"] == rec.state, (key, last, rec.state)
        granted = model.leases.leases.get(f"session:{last['session_id']}")
        top = 0 if granted is None else granted.epoch
        assert all(e["lease_epoch"] is None or e["lease_epoch"] <= top for e in events), (
            key,
            "an epoch never granted",
            events,
        )


_ORDER = {
    "claim": 0,
    "reclaim_running": 0,
    "reclaim_interrupted": 0,
    "reclaim_confirmed": 0,
    "interrupt": 1,
    "request_retry": 2,
    "complete": 3,
    "abandon_running": 3,
    "abandon_interrupted": 3,
    "abandon_retry_requested": 3,
}
"""Within one attempt, the order a record's edges can follow each other in (an
attempt begins with its claim and ends completed or abandoned)."""
