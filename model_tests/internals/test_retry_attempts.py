"""The transaction boundary's retries (``storage/retry.py``'s ``run_attempts``):
a first attempt that wins costs no retry machinery and no wait; one that lost
a race is retried as tenacity counts it (its waits, its attempts, at most
``MAX_ATTEMPTS``), and every call is counted once, with its attempts, in the
statement stats. Backend-free: the attempt is a plain function."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from turnkeeper import TransactionConflictError
from turnkeeper.storage import retry
from turnkeeper.storage.backend import Conflict


class _Attempts:
    """An attempt that loses ``losses`` races, then returns ``"done"``."""

    def __init__(self, losses: int, then: BaseException | None = None) -> None:
        self.losses = losses
        self.then = then
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.losses:
            raise Conflict(f"lost race {self.calls}") from ValueError(f"origin {self.calls}")
        if self.then is not None:
            raise self.then
        return "done"


def _run(attempt: _Attempts, waits: list[float]) -> tuple[Any, dict[str, float]]:
    """``attempt`` run to its end; its result and its call's stats."""
    stats = retry.Stats()
    got = retry.run_attempts("op", attempt, stats, lambda: 3, waits.append)
    return got, stats.as_dict()["op"]


def test_a_first_attempt_that_wins_is_run_once_and_never_waits() -> None:
    attempt, waits = _Attempts(0), []
    got, stats = _run(attempt, waits)
    assert (got, attempt.calls, waits) == ("done", 1, [])
    assert stats == {"calls": 1, "statements_per_call": 3.0, "retries": 0, "grouped": 0}


@pytest.mark.parametrize("losses", [1, 2, 5])
def test_lost_races_are_retried_each_after_a_wait(losses: int) -> None:
    attempt, waits = _Attempts(losses), []
    got, stats = _run(attempt, waits)
    assert (got, attempt.calls) == ("done", losses + 1)
    assert len(waits) == losses  # one wait before each retry, the first included
    assert all(0 <= w <= 0.05 for w in waits), waits
    assert stats["retries"] == losses and stats["calls"] == 1


def test_every_attempt_lost_is_a_transaction_conflict_naming_the_last_origin() -> None:
    attempt, waits = _Attempts(retry.MAX_ATTEMPTS + 5), []
    stats = retry.Stats()
    with pytest.raises(TransactionConflictError) as refused:
        retry.run_attempts("op", attempt, stats, lambda: 3, waits.append)
    assert attempt.calls == retry.MAX_ATTEMPTS
    assert len(waits) == retry.MAX_ATTEMPTS - 1
    assert isinstance(refused.value.__cause__, ValueError)
    assert str(refused.value.__cause__) == f"origin {retry.MAX_ATTEMPTS}"
    assert stats.as_dict()["op"]["retries"] == retry.MAX_ATTEMPTS - 1


def test_a_single_allowed_attempt_that_lost_is_a_conflict_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retry, "MAX_ATTEMPTS", 1)
    attempt, waits = _Attempts(1), []
    with pytest.raises(TransactionConflictError):
        retry.run_attempts("op", attempt, retry.Stats(), lambda: 3, waits.append)
    assert (attempt.calls, waits) == (1, [])


@pytest.mark.parametrize("losses", [0, 2])
@pytest.mark.parametrize(
    "raised", [KeyError("not a race"), asyncio.CancelledError(), KeyboardInterrupt()]
)
def test_anything_but_a_lost_race_passes_unchanged_and_is_not_retried(
    losses: int, raised: BaseException
) -> None:
    attempt, waits = _Attempts(losses, then=raised), []
    stats = retry.Stats()
    with pytest.raises(type(raised)) as got:
        retry.run_attempts("op", attempt, stats, lambda: 3, waits.append)
    assert got.value is raised
    assert attempt.calls == losses + 1 and len(waits) == losses
    assert stats.as_dict()["op"]["retries"] == losses  # counted, as every call is
