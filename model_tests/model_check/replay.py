"""Replay a model's steps against a real store, step by step beside the model.

A step label (``("acquire", "A", "s1")``, ``("tick",)`` …) becomes the store
call it stands for; a refusal is any :class:`turnkeeper.TurnkeeperError` (or
a step with no lease to present). At every step the store's verdict
(accepted or refused) must be the unmutated model's: the replay is a
differential check of the model against the store. :func:`replay` returns the
verdicts; a counterexample found with a guard removed replays with at least
one step the mutant accepted and the store refuses (its fence holds).

Sessions are the targets (``session:<id>``); one model tick is one second of
the injected clock; a lease lasts the model's ``ttl`` ticks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import turnkeeper
from model_check.catalog import KEYWORD, LIFECYCLES
from model_check.delivery import DEPENDS, OPS, DeliveryModel
from model_check.explorer import Label
from model_check.leases import PURPOSE, LeaseModel
from model_check.mutations import without
from model_check.runs import MAX_ATTEMPTS, RunsModel, purpose_of
from turnkeeper import DeliveryPlan, DeliveryStep, Lease, TurnkeeperError

MODELS: dict[str, Callable[..., Any]] = {
    "leases": LeaseModel,
    "runs": RunsModel,
    "delivery": DeliveryModel,
}
"""The models by name, as counterexample files name them."""


def build(model: str, bound: dict[str, Any], **lifecycles: Any) -> Any:
    """The model ``model`` at ``bound`` (JSON lists become tuples), with ``lifecycles``."""
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in bound.items()}
    return MODELS[model](**kwargs, **lifecycles)


@dataclass
class Replayer:
    """Applies step labels to ``store`` (a store on ``clock``, an object with ``advance``)."""

    store: turnkeeper.BaseStore
    clock: Any
    ttl: float
    model: str = "leases"
    held: dict[tuple[str, str], Lease] = field(default_factory=dict)
    run_ids: list[str] = field(default_factory=list)
    claims: dict[tuple[str, str], int] = field(default_factory=dict)
    intent: str = ""

    def apply(self, label: Label) -> str:
        """Run ``label`` on the store: its :func:`outcome` (``ok``, ``refused`` …)."""
        return _word(self._apply(label))

    def _apply(self, label: Label) -> Any:
        kind = label[0]
        if kind == "tick":
            self.clock.advance(1.0)
            return True
        if kind == "crash":
            for key in [k for k in self.held if k[0] == label[1]]:
                del self.held[key]
            for key in [k for k in self.claims if k[0] == label[1]]:
                del self.claims[key]
            return True
        if self.model == "delivery":
            return self._delivery(label)
        if kind == "request_cancel":
            return _ok(self.store.runs.request_cancel, self._run(label[1]))
        actor = label[1]
        if kind == "acquire":
            purpose = PURPOSE if self.model == "leases" else purpose_of(actor)
            try:
                lease = self.store.leases.acquire(
                    f"session:{label[2]}", actor, self.ttl, purpose=purpose
                )
            except TurnkeeperError:
                return False
            self.held[(actor, label[2])] = lease
            return True
        session = label[2] if kind in ("renew", "write", "release", "admit") else None
        if session is None:
            session = self.store.runs.get(self._run(label[2])).session_id
        lease = self.held.get((actor, session))
        if lease is None:
            return False
        return self._leased(label, lease, session)

    def _run(self, name: str) -> str:
        return self.run_ids[int(name[1:])]

    def _leased(self, label: Label, lease: Lease, session: str) -> Any:
        kind, actor = label[0], label[1]
        store = self.store
        if kind == "renew":
            try:
                self.held[(actor, session)] = store.leases.renew(lease, self.ttl)
            except TurnkeeperError:
                return False
            return True
        if kind == "release":
            if store.leases.release(lease):
                del self.held[(actor, session)]
                return True
            return False
        if kind == "write":
            payload = {"message": {"role": "user", "content": "x"}}
            return _ok(store.sessions.append, session, "message", payload, lease=lease)
        if kind == "admit":
            retry = self._run(label[3]) if len(label) > 3 else None
            try:
                run = store.runs.admit(session, {"q": 1}, lease=lease, retry_of=retry)
            except TurnkeeperError:
                return False
            self.run_ids.append(run.id)
            return True
        run_id = self._run(label[2])
        if kind in ("start", "wait"):
            return _ok(getattr(store.runs, kind), run_id, lease=lease)
        if kind == "finish":
            return _ok(store.runs.finish, run_id, label[3], lease=lease)
        if kind == "begin":
            return _ok(store.recovery.begin, run_id, lease)
        if kind == "fail":
            try:
                rec = store.recovery.fail(
                    run_id,
                    lease,
                    "model",
                    max_attempts=MAX_ATTEMPTS,
                    base_delay_s=0.5,
                    max_delay_s=0.5,
                )
            except TurnkeeperError:
                return "refused"
            return f"ok:{rec.state}"
        if kind == "converge":
            return _ok(store.recovery.converge, run_id, lease)
        raise ValueError(f"unknown step {label!r}")

    def _delivery(self, label: Label) -> bool:
        kind, worker, key = label
        op_id, outbox = f"{self.intent}:{key}", self.store.outbox
        if kind == "claim":
            try:
                claimed = outbox.claim(op_id, worker, self.ttl)
            except TurnkeeperError:
                return False
            self.claims[(worker, key)] = claimed.lease_epoch
            return True
        epoch = self.claims.get((worker, key))
        if epoch is None:
            return False
        if kind == "progress":
            return _ok(outbox.update_progress, op_id, worker, epoch)
        if kind == "deliver":
            done = _ok(outbox.finish, op_id, worker, epoch, "delivered")
        else:
            done = _ok(outbox.requeue, op_id, worker, epoch, delay_s=1.0)
        if done:
            del self.claims[(worker, key)]
        return done

    def plan(self) -> None:
        """The delivery model's intent: a run of session ``s1`` ended with a
        plan of :data:`OPS` (``b`` depends on ``a``)."""
        run = self.store.runs.admit("s1", {"q": 1}, start=True)
        steps = tuple(
            DeliveryStep(k, "message", depends_on=OPS[DEPENDS[i]] if i in DEPENDS else None)
            for i, k in enumerate(OPS)
        )
        self.store.runs.finish(run.id, "succeeded", delivery_plan=DeliveryPlan("chat", "t", steps))
        self.intent = f"{run.id}:delivery"


def _ok(fn: Callable[..., object], *args: object, **kwargs: object) -> bool:
    try:
        fn(*args, **kwargs)
    except TurnkeeperError:
        return False
    return True


def _word(result: Any) -> str:
    if isinstance(result, str):
        return result
    return "ok" if result else "refused"


def outcome(label: Label, accepted: bool, after: Any) -> str:
    """A model step's outcome as the replay compares it: ``refused``, ``ok``,
    or for a recovery ``fail`` ``ok:<the record's state after>`` (``failed``
    or ``dead_lettered``: the lifecycle chooses, the store reports it)."""
    if not accepted:
        return "refused"
    if label[0] == "fail":
        return f"ok:{after.runs[int(label[2][1:])].rec}"
    return "ok"


@dataclass(frozen=True)
class Verdict:
    """One replayed step's outcomes (:func:`outcome`): the mutant's (the
    lifecycle with the guard removed; ``ok`` on every step of its own
    counterexample), the unmutated model's and the store's."""

    label: Label
    mutant: str
    model: str
    store: str


def replay(
    store: turnkeeper.BaseStore,
    clock: Any,
    model: str,
    bound: dict[str, Any],
    steps: Sequence[Sequence[str]],
    mutation: str | None = None,
) -> list[Verdict]:
    """Replay ``steps`` on ``store`` (empty, on ``clock``) beside the unmutated
    ``model`` built with ``bound`` (its epoch bound lifted: the store has none)
    and its mutant (``mutation``: ``"<lifecycle>.<edge>.<guard>"`` removed;
    ``None``: the model again). Creates the model's sessions first. Returns one
    :class:`Verdict` a step."""
    spec = build(model, {**bound, "grants": 10_000})
    mutant = spec
    if mutation is not None:
        lifecycle, edge, guard = mutation.split(".")
        changed = without(LIFECYCLES[lifecycle], edge, guard)
        mutant = build(model, {**bound, "grants": 10_000}, **{KEYWORD[lifecycle]: changed})
    sessions = {"leases": "targets", "runs": "sessions"}
    for sid in getattr(spec, sessions[model]) if model in sessions else ("s1",):
        store.sessions.create(sid)
    player = Replayer(store, clock, float(spec.ttl), model=model)
    if model == "delivery":
        player.plan()
    state, mutated = spec.initial(), mutant.initial()
    verdicts = []
    for raw in steps:
        label = tuple(raw)
        accepted, state = spec.step(state, label)
        mutant_accepted, mutated = mutant.step(mutated, label)
        verdicts.append(
            Verdict(
                label,
                outcome(label, mutant_accepted, mutated),
                outcome(label, accepted, state),
                player.apply(label),
            )
        )
    return verdicts


def script(cx: dict[str, Any]) -> str:
    """A counterexample as a Python script that replays it (run from ``model_tests/``)."""
    steps = "".join(f"        {tuple(s)!r},\n" for s in cx["steps"])
    return (
        f"# {cx['model']}: {cx['mutation']} removed breaks {cx['invariant']!r}\n"
        "from conftest import close_backend, open_backend\n"
        "from turnkeeper.fuzz import FakeClock\n"
        "from model_check.replay import replay\n\n"
        "clock = FakeClock()\n"
        "store = open_backend('duckdb', None, clock)\n"
        "try:\n"
        f"    steps = [\n{steps}    ]\n"
        f"    for v in replay(store, clock, {cx['model']!r}, {cx['bound']!r}, steps,"
        f" {cx['mutation']!r}):\n"
        "        print(v)\n"
        "finally:\n"
        "    close_backend(store)\n"
    )
