"""The bounded model checker (``model_tests/model_check/``): the models hold
at the CI bound, every guard of the modelled lifecycles removed gives its
stored counterexample (or is explained as equivalent), and every stored
counterexample replays against the real store on both backends, which
refuses where the mutant did not. The ledger's GC and sweep rules, patched
out of the model one at a time, give counterexamples (controls), and the GC
races the ``ledger_gc`` model finds replay against the store step by step.

``make modelcheck`` runs the larger bound (``python -m model_check --bound large``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from model_check import ledger as ledger_model
from model_check.__main__ import BOUNDS, COUNTEREXAMPLES, counterexample, main, path_of
from model_check.catalog import EQUIVALENT, FOUND, KEYWORD, LIFECYCLES, MODEL_OF
from model_check.explorer import Label, Result, explore
from model_check.mutations import guard_pairs, without
from model_check.replay import build, replay, script

import turnkeeper
from turnkeeper.fuzz import FakeClock
from turnkeeper.machines import machine_for
from turnkeeper.storage.ops import leases as lease_ops
from turnkeeper.storage.ops.ledger import condemn as condemn_ops
from turnkeeper.storage.ops.ledger import journal as journal_ops

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
    name = MODEL_OF.get(lifecycle, "runs")
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


# -- the ledger's GC and deleters: their fences, shown able to fail ----------------------


def _ledger_gc(**extra: object) -> Result:
    """The ``ledger_gc`` model at its CI bound (with ``extra``), explored."""
    return explore(build("ledger_gc", {**dict(BOUNDS["ci"])["ledger_gc"], **extra}))


def test_ledger_gc_control_without_the_condemn_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: with the append's condemn check (``condemn.refuse_condemned``,
    which the model calls) patched out, GC condemns a put blob, the writer
    points at it, GC deletes it: an acknowledged pointer dangles."""
    monkeypatch.setattr(condemn_ops, "refuse_condemned", lambda *a: None)
    result = _ledger_gc()
    assert result.violation is not None and result.violation.invariant == "no dangling pointer"
    kinds = [s[0] for s in result.violation.steps]
    assert kinds.index("gc_condemn") < kinds.index("append_ptr") < kinds.index("gc_delete")


def test_ledger_gc_control_without_referenced_since(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: with the condemn transaction's re-read of the pointers
    appended since the scan (``gc.referenced_since``) taken away, a pointer
    appended between GC's scan and its condemn loses its blob."""
    monkeypatch.setattr(ledger_model, "referenced_since", lambda *a: frozenset())
    result = _ledger_gc()
    assert result.violation is not None and result.violation.invariant == "no dangling pointer"
    kinds = [s[0] for s in result.violation.steps]
    assert kinds.index("gc_scan") < kinds.index("append_ptr") < kinds.index("gc_condemn")


def test_ledger_gc_control_without_the_ledger_epoch_fence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Control: with the ledger's own fence (``journal.check_epoch``, GC's
    ``writer_fence`` after the lease fence) patched out, a pass condemns
    under a lease that is not the ledger's newest fence's."""
    monkeypatch.setattr(journal_ops, "check_epoch", lambda *a: None)
    result = _ledger_gc()
    assert result.violation is not None and result.violation.invariant == "no stale GC"


def test_ledger_sweep_control_without_its_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: a sweep that takes every session for deleted (its guard,
    ``sweep.deleted_sessions``, gone) deletes a live ledger's blob."""
    monkeypatch.setattr(ledger_model, "sweepable", lambda s, t: True)
    result = _ledger_gc(deleter=True)
    assert result.violation is not None and result.violation.invariant == "no dangling pointer"
    assert result.violation.steps[-1] == ("sweep", "D")


@pytest.mark.parametrize("store", ["duckdb"], indirect=True)
def test_replay_catches_a_ledger_open_without_its_lease_fence(
    store: turnkeeper.BaseStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with the lease fence of the opening transaction gone from the
    store (``journal.leases.fence`` returning the clock unchecked), the stored
    counterexample of ``plant_fence`` without ``lease_held`` replays through:
    the store plants a released lease's fence, as the mutant does."""
    real = lease_ops.fence

    def unchecked(tx: object, lease: turnkeeper.Lease) -> object:
        try:
            return real(tx, lease)  # type: ignore[arg-type]
        except turnkeeper.LeaseLostError:
            return clock()

    monkeypatch.setattr(lease_ops, "fence", unchecked)
    cx = json.loads(path_of(("ledger_writer", "plant_fence", "lease_held")).read_text())
    verdicts = replay(store, clock, cx["model"], cx["bound"], cx["steps"], cx["mutation"])
    assert [v.store for v in verdicts] == [v.mutant for v in verdicts], verdicts


WITNESSES: dict[str, tuple[Callable[[Any], bool], tuple[Label, ...]]] = {
    "a condemned blob's record written again": (
        lambda s: any(r.kind == "P" and r.key.endswith("1") for led in s.ledgers for r in led),
        (),
    ),
    "an orphan deleted by GC": (lambda s: any(c not in s.blobs for c in s.condemned), ()),
    "a pass whose lease was taken over, then its condemn": (
        lambda s: any(p is not None and p.epoch < s.top[0] for row in s.passes for p in row),
        (("gc_condemn", "A", "s1"),),
    ),
    "a pointer appended between the scan and the condemn, then the condemn": (
        lambda s: any(
            p is not None
            and p.doomed is None
            and any(r.kind == "P" and r.seq > p.tip and r.key in p.orphans for r in s.ledgers[0])
            for row in s.passes
            for p in row
        ),
        (("gc_condemn", "A", "s1"), ("gc_delete", "A", "s1")),
    ),
}
"""States of the ``ledger_gc`` model (CI bound, worker ``A`` on ``s1``)
whose shortest paths race GC with a writer, and the steps then probed (the
model refusing some): each replayed against the real store."""


@pytest.mark.parametrize("witness", sorted(WITNESSES))
def test_ledger_gc_race_replays_as_the_model_says(
    witness: str, store: turnkeeper.BaseStore, clock: FakeClock
) -> None:
    """The shortest path to each witness state of ``ledger_gc`` (puts, pointer
    appends, GC scans, condemns and deletes interleaved), then its probes,
    replay against the real store with the store agreeing with the model at
    every step, refusals included: the model's GC rules are the store's."""
    reached, probes = WITNESSES[witness]
    bound = dict(BOUNDS["ci"])["ledger_gc"]
    model = build("ledger_gc", bound)
    model.invariants = {witness: lambda s: not reached(s)}
    found = explore(model).violation
    assert found is not None, witness
    verdicts = replay(store, clock, "ledger_gc", bound, [*found.steps, *probes])
    assert [v.store for v in verdicts] == [v.model for v in verdicts], verdicts
    kinds = {v.label[0] for v in verdicts}
    assert {"gc_scan", "gc_condemn"} <= kinds, verdicts


def test_ledger_control_without_the_session_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: with the write paths' session check (``session_exists``) gone
    from the model, a writer whose lease outlived its session's delete writes
    to the deleted session's ledger."""
    monkeypatch.setattr(ledger_model, "session_exists", lambda s, t: True)
    result = explore(build("ledger", dict(BOUNDS["ci"])["ledger"]))
    assert result.violation is not None and result.violation.invariant == "deleted stays empty"
    assert "delete" in [s[0] for s in result.violation.steps]
