"""The bounded model checker (``model_tests/model_check/``): the models hold
at the CI bound, every guard of the modelled lifecycles removed gives its
stored counterexample (or is explained as equivalent), and every stored
counterexample replays against the real store on both backends, which
refuses where the mutant did not.

``make modelcheck`` runs the larger bound (``python -m model_check --bound large``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from model_check.__main__ import BOUNDS, COUNTEREXAMPLES, counterexample, main, path_of
from model_check.catalog import EQUIVALENT, FOUND, KEYWORD, LIFECYCLES
from model_check.explorer import Label, Result, explore
from model_check.mutations import guard_pairs, without
from model_check.replay import build, replay, script

import turnkeeper
from turnkeeper.fuzz import FakeClock
from turnkeeper.machines import machine_for
from turnkeeper.storage.ops import leases as lease_ops

ALL_PAIRS = {(name, e, g) for name, lc in LIFECYCLES.items() for e, g in guard_pairs(lc)}
STORED = sorted(COUNTEREXAMPLES.glob("*.json"))


# -- the explorer ----------------------------------------------------------------


@dataclass(frozen=True)
class Ladder:
    """A toy model: ``up`` adds 1, ``jump`` adds 2 from even rungs; rung 5 is bad."""

    name: str = "ladder"

    def initial(self) -> int:
        return 0

    def actions(self, s: int) -> Iterator[tuple[Label, int]]:
        if s < 8:
            yield ("up",), s + 1
        if s % 2 == 0 and s < 7:
            yield ("jump",), s + 2

    @property
    def invariants(self) -> dict[str, object]:
        return {"not five": lambda s: s != 5}


def test_explorer_returns_the_shortest_path_and_counts() -> None:
    result = explore(Ladder())  # type: ignore[arg-type]
    assert result.violation is not None
    # 0 -jump-> 2 -jump-> 4 -up-> 5: three steps, not the five of "up" alone
    assert result.violation.steps == (("jump",), ("jump",), ("up",))
    assert result.violation.invariant == "not five"
    assert not result.complete
    bounded = explore(Ladder(), max_depth=2)  # type: ignore[arg-type]
    assert bounded.violation is None and bounded.complete
    assert bounded.states == 5 and bounded.depth == 2  # 0, 1, 2, 3, 4


# -- the models at the CI bound ------------------------------------------------------


@functools.cache
def _plain(name: str) -> Result:
    """The unmutated model ``name`` explored at the CI bound (once per run)."""
    return explore(build(name, dict(BOUNDS["ci"])[name]))


@pytest.mark.parametrize("name", [n for n, _ in BOUNDS["ci"]])
def test_model_holds_at_the_ci_bound(name: str) -> None:
    result = _plain(name)
    print(result.summary())
    assert result.violation is None, result.violation
    assert result.complete and result.states > 1000 and result.depth >= 10


# -- every guard removed ------------------------------------------------------------


def test_every_guard_of_the_modelled_lifecycles_is_accounted_for() -> None:
    assert set(FOUND) | set(EQUIVALENT) == ALL_PAIRS
    assert not set(FOUND) & set(EQUIVALENT)
    assert {path_of(p) for p in FOUND} == set(STORED), "run python -m model_check --write"


@pytest.mark.parametrize("pair", sorted(FOUND), ids=".".join)
def test_guard_removed_gives_its_stored_counterexample(pair: tuple[str, str, str]) -> None:
    found = counterexample(pair)
    stored = json.loads(path_of(pair).read_text())
    assert found == stored


CHANGES_STATES = {("recovery", "supersede", "superseded")}
"""Equivalent pairs whose mutant reaches other states (none the invariants reject)."""


@pytest.mark.parametrize("pair", sorted(EQUIVALENT), ids=".".join)
def test_equivalent_guard_removed_finds_nothing(pair: tuple[str, str, str]) -> None:
    """The reason is in ``catalog.EQUIVALENT``; the mutant explores without a
    violation and, unless listed in CHANGES_STATES, the very same state space."""
    lifecycle, edge, guard = pair
    name = {"lease": "leases", "delivery": "delivery"}.get(lifecycle, "runs")
    kwargs = dict(BOUNDS["ci"])[name]
    plain = _plain(name)
    mutant = explore(
        build(name, kwargs, **{KEYWORD[lifecycle]: without(LIFECYCLES[lifecycle], edge, guard)})
    )
    assert mutant.violation is None, (EQUIVALENT[pair], mutant.violation)
    if pair not in CHANGES_STATES:
        assert (mutant.states, mutant.transitions) == (plain.states, plain.transitions)
    else:
        assert mutant.states != plain.states


# -- stored counterexamples against the real store -------------------------------------


@pytest.mark.parametrize("path", STORED, ids=[p.stem for p in STORED])
def test_counterexample_is_refused_by_the_store(
    path: Path, store: turnkeeper.BaseStore, clock: FakeClock
) -> None:
    cx = json.loads(path.read_text())
    verdicts = replay(store, clock, cx["model"], cx["bound"], cx["steps"], cx["mutation"])
    assert all(v.mutant.startswith("ok") for v in verdicts), verdicts
    # the store agrees with the unmutated model at every step ...
    assert [v.store for v in verdicts] == [v.model for v in verdicts], verdicts
    # ... and parts from the mutant where the removed guard mattered
    assert any(v.store != v.mutant for v in verdicts), verdicts


@pytest.mark.parametrize("store", ["duckdb"], indirect=True)
def test_replay_catches_a_store_whose_fence_is_gone(
    store: turnkeeper.BaseStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with the store's own lease machine taking ``expired`` off the
    takeover edge, the stored counterexample replays through (the store then
    says what the mutant says), so the test above would fail."""
    pair = ("lease", "takeover", "expired")
    broken = machine_for(without(LIFECYCLES["lease"], "takeover", "expired"))
    monkeypatch.setattr(lease_ops, "_MACHINE", broken)
    cx = json.loads(path_of(pair).read_text())
    verdicts = replay(store, clock, cx["model"], cx["bound"], cx["steps"], cx["mutation"])
    assert [v.store for v in verdicts] == [v.mutant for v in verdicts], verdicts


def test_a_counterexample_prints_as_a_script_that_replays(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The script a violation prints runs (DuckDB, from ``model_tests/``) and
    shows the store refusing the step the mutant took."""
    cx = json.loads(path_of(("lease", "takeover", "expired")).read_text())
    source = script(cx)
    exec(compile(source, "counterexample", "exec"), {})
    out = capsys.readouterr().out
    assert (
        "Verdict(label=('acquire', 'B', 's1'), mutant='ok', model='refused', store='refused')"
        in (out)
    )


def test_a_violation_exits_1_with_its_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--mutate", "run.admit.no_active_run"]) == 1
    out = capsys.readouterr().out
    assert "from model_check.replay import replay" in out
    assert "('admit', 'W1', 's1')," in out and "'one active run'" in out
