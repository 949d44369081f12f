"""``store.usage`` (session seed RecordUsage, RecordUsageFromProviderUsage) on both
backends: what a record keeps, how each provider's usage shape maps onto it,
idempotency by usage id, typed errors that write nothing, and the one
session-write rule (fenced under the lease, ``BusyError`` without one while
someone holds the session).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.spec import errors
from turnkeeper.spec.usage import MAX_TOKENS
from turnkeeper.storage.ops import usage as usage_ops

WHEN = datetime(2026, 5, 17, 13, 51, 26, 739000, tzinfo=UTC)


def _figures(r: turnkeeper.UsageRecord) -> tuple[Any, ...]:
    return (
        r.input_tokens,
        r.output_tokens,
        r.cache_read_tokens,
        r.cache_write_tokens,
        r.total_tokens,
        r.cost_usd,
    )


def _rows(store) -> int:
    return store.query("SELECT count(*) AS n FROM usage_records").to_pylist()[0]["n"]


def test_a_record_keeps_every_figure_and_reads_back(store):
    store.sessions.create("s")
    run = store.runs.admit("s", {"t": 1}, start=True)
    rec = store.usage.record(
        "s",
        provider="anthropic",
        protocol="anthropic-messages",
        model="claude\x00odd \u2028 name",
        input_tokens=3,
        output_tokens=88,
        cache_write_tokens=4442,
        cost_usd=0.0299775,
        duration_ms=1234,
        run_id=run.id,
        recorded_at=WHEN,
    )
    assert _figures(rec) == (3, 88, 0, 4442, 3 + 88 + 4442, 0.0299775)
    assert (rec.provider, rec.protocol, rec.model) == (
        "anthropic",
        "anthropic-messages",
        "claude\x00odd \u2028 name",
    )
    assert (rec.duration_ms, rec.run_id, rec.recorded_at, rec.source) == (
        1234,
        run.id,
        WHEN,
        "record",
    )
    assert store.usage.get("s", rec.id) == rec
    later = store.usage.record(
        "s", provider="p", model="m", total_tokens=7, recorded_at=WHEN + timedelta(seconds=1)
    )
    assert later.total_tokens == 7 and later.cost_usd is None and later.run_id is None
    assert store.usage.list("s") == [rec, later]
    assert store.usage.list("s", run_id=run.id) == [rec]
    assert store.usage.get("s", "nope") is None


def test_the_same_usage_id_returns_the_stored_record_and_other_figures_conflict(store):
    store.sessions.create("s")
    first = store.usage.record("s", provider="p", model="m", input_tokens=5, usage_id="req-1")
    again = store.usage.record("s", provider="p", model="m", input_tokens=5, usage_id="req-1")
    assert again == first and _rows(store) == 1
    with pytest.raises(errors.UsageConflictError) as err:
        store.usage.record("s", provider="p", model="m", input_tokens=6, usage_id="req-1")
    assert (err.value.session_id, err.value.usage_id) == ("s", "req-1")
    assert store.usage.list("s") == [first]
    # usage ids are per session
    store.sessions.create("t")
    other = store.usage.record("t", provider="p", model="m", input_tokens=6, usage_id="req-1")
    assert other.session_id == "t" and _rows(store) == 2


def test_an_entrys_usage_is_keyed_by_the_entry(store):
    store.sessions.create("s")
    reply = {"role": "assistant", "content": [], "provider": "p", "model": "m"}
    entry = store.sessions.append("s", EntryKind.MESSAGE, {"message": reply})
    rec = store.usage.record("s", provider="p", model="m", output_tokens=9, entry_id=entry.id)
    assert (rec.id, rec.entry_id) == (f"entry:{entry.id}", entry.id)
    with pytest.raises(errors.EntryNotFoundError):
        store.usage.record("s", provider="p", model="m", entry_id="missing")
    for kw in ({"usage_id": "u", "entry_id": entry.id}, {"usage_id": "entry:x"}):
        with pytest.raises(errors.InvalidInputError):
            store.usage.record("s", provider="p", model="m", **kw)
    assert store.usage.list("s") == [rec]


BAD_RECORDS: dict[str, dict[str, Any]] = {
    "negative": {"input_tokens": -1},
    "bool": {"output_tokens": True},
    "float": {"cache_read_tokens": 1.0},
    "str": {"cache_write_tokens": "3"},
    "too-many": {"input_tokens": MAX_TOKENS + 1},
    "total-negative": {"total_tokens": -5},
    "cost-nan": {"cost_usd": float("nan")},
    "cost-inf": {"cost_usd": float("inf")},
    "cost-negative": {"cost_usd": -0.01},
    "cost-str": {"cost_usd": "0.1"},
    "duration-negative": {"duration_ms": -1},
    "model-not-str": {"model": 3},
    "provider-surrogate": {"provider": "\ud800"},
    "recorded-naive": {"recorded_at": datetime(2026, 1, 1)},
    "usage-id-nul": {"usage_id": "a\x00b"},
    "run-id-blank": {"run_id": " "},
}


@pytest.mark.parametrize("name", sorted(BAD_RECORDS))
def test_bad_input_is_refused_and_writes_nothing(store, name):
    store.sessions.create("s")
    kw: dict[str, Any] = {"provider": "p", "model": "m", **BAD_RECORDS[name]}
    with pytest.raises(errors.InvalidInputError):
        store.usage.record("s", **kw)
    assert _rows(store) == 0


def test_missing_things_are_typed_errors_and_write_nothing(store):
    with pytest.raises(errors.SessionNotFoundError):
        store.usage.record("nope", provider="p", model="m")
    with pytest.raises(errors.SessionNotFoundError):
        store.usage.list("nope")
    store.sessions.create("s")
    with pytest.raises(errors.RunNotFoundError):
        store.usage.record("s", provider="p", model="m", run_id="r-missing")
    store.sessions.create("t")
    other = store.runs.admit("t", {"x": 1})
    with pytest.raises(errors.InvalidInputError):
        store.usage.record("s", provider="p", model="m", run_id=other.id)
    assert _rows(store) == 0 and store.usage.list("s") == []


# -- provider usage shapes -------------------------------------------------------------

SHAPES: dict[str, tuple[dict[str, Any], tuple[Any, ...]]] = {
    # (usage, expected (input, output, cache read, cache write, total, cost)):
    # each expected figure worked out by hand from the provider's documented meaning
    "openai-chat": (
        {
            "prompt_tokens": 1200,
            "completion_tokens": 300,
            "total_tokens": 1500,
            "prompt_tokens_details": {"cached_tokens": 1024},
            "completion_tokens_details": {"reasoning_tokens": 128},
        },
        (1200 - 1024, 300, 1024, 0, 1500, None),
    ),
    "openai-responses": (
        {
            "input_tokens": 5878 + 384,
            "input_tokens_details": {"cached_tokens": 384},
            "output_tokens": 242,
            "output_tokens_details": {"reasoning_tokens": 40},
            "total_tokens": 6504,
        },
        (5878, 242, 384, 0, 6504, None),
    ),
    "anthropic": (
        {
            "input_tokens": 1,
            "output_tokens": 101,
            "cache_read_input_tokens": 4442,
            "cache_creation_input_tokens": 8072,
            "service_tier": "standard",
        },
        (1, 101, 4442, 8072, 1 + 101 + 4442 + 8072, None),
    ),
    "anthropic-no-cache": ({"input_tokens": 10, "output_tokens": 2}, (10, 2, 0, 0, 12, None)),
    "gemini": (
        {
            "promptTokenCount": 900,
            "cachedContentTokenCount": 500,
            "candidatesTokenCount": 70,
            "thoughtsTokenCount": 30,
            "totalTokenCount": 1000,
        },
        (400, 100, 500, 0, 1000, None),
    ),
    "gemini-snake": (
        {
            "prompt_token_count": 900,
            "cached_content_token_count": None,
            "candidates_token_count": 70,
            "tool_use_prompt_token_count": 10,
        },
        (910, 70, 0, 0, 980, None),
    ),
    "pi": (
        {
            "input": 310,
            "output": 263,
            "cacheRead": 6208,
            "cacheWrite": 0,
            "totalTokens": 6781,
            "cost": {"input": 0.0003875, "total": 0.0022866},
        },
        (310, 263, 6208, 0, 6781, 0.0022866),
    ),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_provider_shape_maps_onto_the_record(store, name):
    store.sessions.create("s")
    usage, expected = SHAPES[name]
    rec = store.usage.record_from_provider(
        "s", usage, provider=name, protocol="api", model="m", duration_ms=50
    )
    assert _figures(rec) == expected
    assert (rec.provider, rec.duration_ms) == (name, 50)
    assert store.usage.list("s") == [rec]


def test_a_given_cost_wins_over_the_shapes(store):
    store.sessions.create("s")
    usage = SHAPES["pi"][0]
    rec = store.usage.record_from_provider("s", usage, provider="p", model="m", cost_usd=1.25)
    assert rec.cost_usd == 1.25


BAD_SHAPES: dict[str, Any] = {
    "not-a-mapping": [1, 2],
    "unknown": {"tokens": 5},
    "two-shapes": {"prompt_tokens": 1, "input_tokens": 1},
    "openai-and-anthropic": {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 1},
        "cache_read_input_tokens": 1,
    },
    "more-cached-than-prompt": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 6}},
    "negative": {"input_tokens": -3, "output_tokens": 1},
    "string-count": {"promptTokenCount": "12"},
    "bad-cost": {"input": 1, "cost": {"total": "free"}},
}


@pytest.mark.parametrize("name", sorted(BAD_SHAPES))
def test_a_usage_object_of_no_known_shape_is_refused(store, name):
    store.sessions.create("s")
    with pytest.raises(errors.InvalidInputError):
        store.usage.record_from_provider("s", BAD_SHAPES[name], provider="p", model="m")
    assert _rows(store) == 0


# -- the one session-write rule ------------------------------------------------------


WRITES = {
    "record": lambda s, **kw: s.usage.record("s", provider="p", model="m", input_tokens=1, **kw),
    "record-from-provider": lambda s, **kw: s.usage.record_from_provider(
        "s", {"input_tokens": 1, "output_tokens": 2}, provider="p", model="m", **kw
    ),
}


@pytest.fixture
def held(store):
    store.sessions.create("s")
    p1 = store.leases.acquire("session:s", "p1", 600, purpose="execution")
    return store, p1


@pytest.mark.parametrize("name", sorted(WRITES))
def test_without_a_lease_a_held_session_is_busy_and_nothing_is_written(held, name):
    store, p1 = held
    with pytest.raises(errors.BusyError) as err:
        WRITES[name](store)
    assert (err.value.target, err.value.holder) == ("session:s", "p1")
    assert _rows(store) == 0
    WRITES[name](store, lease=p1)
    assert _rows(store) == 1


def test_a_retry_under_its_usage_id_returns_the_record_even_while_busy(held):
    store, p1 = held
    rec = store.usage.record("s", provider="p", model="m", usage_id="u", lease=p1)
    assert store.usage.record("s", provider="p", model="m", usage_id="u") == rec


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_lost_lease_is_refused_recorded_and_writes_nothing(held, clock, name):
    store, p1 = held
    clock.advance(601)
    store.leases.acquire("session:s", "p2", 600)
    with pytest.raises(errors.LeaseLostError):
        WRITES[name](store, lease=p1)
    assert _rows(store) == 0
    fenced = store.query("SELECT operation FROM fence_events").to_pylist()
    assert fenced == [{"operation": "record_usage"}]


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_lease_on_another_session_is_refused(held, name):
    store, _p1 = held
    store.sessions.create("t")  # a runtime lease needs its session
    other = store.leases.acquire("session:t", "p1", 600)
    with pytest.raises(errors.InvalidInputError):
        WRITES[name](store, lease=other)
    assert _rows(store) == 0


@pytest.mark.parametrize("name", sorted(WRITES))
def test_control_without_the_fence_a_lease_less_and_a_stale_write_land(
    held, clock, monkeypatch, name
):
    """The guard the tests above rely on: ``fence_or_unheld`` patched out of the
    usage module lets both refused writes through."""
    store, p1 = held
    monkeypatch.setattr(usage_ops.leases, "fence_or_unheld", lambda tx, target, lease: None)
    WRITES[name](store)
    clock.advance(601)
    store.leases.acquire("session:s", "p2", 600)
    WRITES[name](store, lease=p1)
    assert _rows(store) == 2


def test_control_without_the_repeat_check_a_conflicting_usage_id_is_a_database_error(
    store, monkeypatch
):
    """The conflict check is what makes a reused id a typed error: without it the
    primary key refuses the row as a backend failure, not a UsageConflictError."""
    store.sessions.create("s")
    store.usage.record("s", provider="p", model="m", input_tokens=5, usage_id="u")
    monkeypatch.setattr(usage_ops, "get", lambda tx, sid, uid: None)
    with pytest.raises(turnkeeper.TurnkeeperError) as err:
        store.usage.record("s", provider="p", model="m", input_tokens=6, usage_id="u")
    assert not isinstance(err.value, errors.UsageConflictError)


def test_racing_retries_of_one_usage_id_store_one_record(store):
    """Two threads record the same request at once: one row, and both get it
    (the loser's duplicate key is a lost race, retried, that finds the winner's)."""
    import threading

    store.sessions.create("s")
    barrier = threading.Barrier(8)
    got: list[Any] = []

    def worker() -> None:
        barrier.wait(timeout=60)
        try:
            got.append(
                store.usage.record("s", provider="p", model="m", input_tokens=5, usage_id="race")
            )
        except Exception as exc:  # collected and asserted below
            got.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(got) == 8 and all(isinstance(r, turnkeeper.UsageRecord) for r in got), got
    assert len({r.recorded_at for r in got}) == 1 and _rows(store) == 1
