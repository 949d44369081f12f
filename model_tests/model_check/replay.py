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

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import turnkeeper
from model_check.catalog import KEYWORD, LIFECYCLES
from model_check.delivery import DEPENDS, OPS, DeliveryModel
from model_check.explorer import Label
from model_check.leases import PURPOSE, LeaseModel
from model_check.ledger import DELETER, LedgerModel
from model_check.mutations import without
from model_check.runs import MAX_ATTEMPTS, RunsModel, purpose_of
from turnkeeper import DeliveryPlan, DeliveryStep, Lease, TurnkeeperError
from turnkeeper.spec import errors
from turnkeeper.spec.ledger import LedgerEntry
from turnkeeper.storage.ops.ledger import blobs as blob_ops
from turnkeeper.storage.ops.ledger import gc as gc_ops
from turnkeeper.storage.ops.ledger import journal
from turnkeeper.storage.ops.ledger.group import LedgerAppend

OFFLOAD = 16
"""The ledger models' offload threshold (bytes) in the replay: the worker's
offloaded record is one byte over it, every other record under it."""

MODELS: dict[str, Callable[..., Any]] = {
    "leases": LeaseModel,
    "runs": RunsModel,
    "delivery": DeliveryModel,
    "ledger": LedgerModel,
    "ledger_gc": LedgerModel,
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
    writers: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    """The ledger's writer handles by (worker, session, slot): ``(lease, tip
    read)`` while opening, then the ``LedgerWriter``."""
    appended: int = 0
    puts: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    """Each worker's offloaded record in flight, by (worker, session): its
    generation and, once put, its pointer entry."""
    passes: dict[tuple[str, str], Any] = field(default_factory=dict)
    """Each worker's GC pass, by (worker, session)."""
    _area: Any = None

    def area(self) -> Any:
        """The ledger area the steps use: offloading every payload over
        :data:`OFFLOAD` bytes (``store.ledger.with_blobs``, the database's blob table)."""
        if self._area is None:
            self._area = self.store.ledger.with_blobs(offload_threshold=OFFLOAD)
        return self._area

    def _blobs(self, label: Label) -> Any:
        """A ``ledger_gc`` step, as the store's own functions run it, cut
        where the model cuts it: ``put`` is ``blobs.offload`` of the worker's
        record (its generation's blob), ``append_ptr`` the fenced append of
        its pointer (``Ledger._append``: ``journal.append`` and its condemn
        check; a ``BlobCondemnedError`` moves the record to its next
        generation, as ``condemn.write_offloaded`` does: ``ok:regen``);
        ``gc_scan`` is ``gc.collect``'s fence, scan and listing, ``gc_condemn``
        its condemn transaction, ``gc_delete`` its deletes."""
        kind, actor, session = label[0], label[1], label[2]
        area, mine = self.area(), (actor, session)
        if kind in ("put", "append_ptr"):
            writer = self.writers.get((actor, session, label[3]))
            if writer is None or isinstance(writer, tuple):
                return False
            entry = LedgerEntry("note", b"x" * (OFFLOAD + 1), f"big-{actor}")
            gen, pointer = self.puts.get(mine, (0, None))
            if kind == "put":
                if writer.state != "open":
                    return False
                pointer = blob_ops.offload(
                    area.blobs, area.tenant, session, entry, area.max_body_bytes, gen
                )
                self.puts[mine] = (gen, pointer)
                return True
            if pointer is None:
                return False
            request = LedgerAppend(
                area.tenant, session, writer.lease, [pointer], area.catalog, [entry]
            )
            try:
                area._append(request)
            except errors.BlobCondemnedError:
                self.puts[mine] = (gen + 1, None)
                return "ok:regen"
            except TurnkeeperError:
                return False
            del self.puts[mine]
            return True
        lease = self.held.get(mine)
        if kind == "gc_scan":
            if lease is None:
                return False
            fence = partial(gc_ops.writer_fence, tenant=area.tenant, session_id=session)
            try:
                area._fenced("ledger_gc", lease, lambda tx: fence(tx, lease=lease))
            except TurnkeeperError:
                return False
            tip, live = gc_ops.referenced_keys(area.db, area.tenant, session)
            prefix = blob_ops.blob_prefix(area.tenant, session)
            listed = blob_ops.blob_call(area.blobs, "list", prefix)
            self.passes[mine] = (lease, tip, sorted(k for k in listed if k not in live), None)
            return True
        found = self.passes.get(mine)
        if found is None:
            return False
        lease, tip, orphans, doomed = found
        if kind == "gc_condemn":

            def condemn(tx: Any) -> list[str]:
                return gc_ops.condemn_orphans(
                    tx, area.tenant, session, lease, tip, orphans, uuid.uuid4().hex
                )

            try:
                doomed = area._fenced("ledger_gc", lease, condemn)
            except TurnkeeperError:
                return False
            self.passes[mine] = (lease, tip, orphans, doomed)
            if not doomed:
                del self.passes[mine]
            return True
        if not doomed:
            return False
        for key in doomed:
            blob_ops.blob_call(area.blobs, "delete", key)
        del self.passes[mine]
        return True

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
            for key in [k for k in self.writers if k[0] == label[1]]:
                del self.writers[key]
            for gone in (self.puts, self.passes):
                for key in [k for k in gone if k[0] == label[1]]:
                    del gone[key]
            return True
        if self.model == "delivery":
            return self._delivery(label)
        if self.model.startswith("ledger") and kind not in ("acquire", "release"):
            return self._ledger(label)
        if kind == "request_cancel":
            return _ok(self.store.runs.request_cancel, self._run(label[1]))
        actor = label[1]
        if kind == "acquire":
            purpose = (
                PURPOSE
                if self.model == "leases" or self.model.startswith("ledger")
                else purpose_of(actor)
            )
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

    def _ledger(self, label: Label) -> bool:
        """A ledger model's step (``model_check.ledger``): ``open`` reads the
        tip (``store.ledger.tip``, as ``Ledger.open`` reads it), ``plant`` runs
        the rest of ``store.ledger.open`` on the tip that read gave (its read
        answered from it: :func:`tip_read_as`), ``append`` and ``close`` go
        through the writer, ``delete`` is ``store.sessions.delete`` (``D``:
        without a lease); the blob and GC steps are :meth:`_blobs`'."""
        kind = label[0]
        if kind == "sweep":
            return _ok(self.area().sweep_deleted)
        actor, session = label[1], label[2]
        if kind in ("put", "append_ptr") or kind.startswith("gc_"):
            return self._blobs(label)
        if kind == "delete":
            lease = None if actor == DELETER else self.held.get((actor, session))
            if actor != DELETER and lease is None:
                return False
            return _ok(self.store.sessions.delete, session, lease=lease)
        if kind not in ("open", "plant", "append", "close"):
            raise ValueError(f"step {label!r} is not replayed")
        key = (actor, session, label[3])
        if kind == "open":
            lease = self.held.get((actor, session))
            if lease is None:
                return False
            self.writers[key] = (lease, self.store.ledger.tip(session))
            return True
        handle = self.writers.get(key)
        if kind == "plant":
            if not isinstance(handle, tuple):
                return False
            lease, tip = handle
            with tip_read_as(tip):
                try:
                    self.writers[key] = self.area().open(session, lease)
                except TurnkeeperError:
                    return False
            return True
        if handle is None or isinstance(handle, tuple):
            return False
        if kind == "close":
            return _ok(handle.close)
        self.appended += 1
        return _ok(handle.append, "note", b"x", f"note-{self.appended}")

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


@contextmanager
def tip_read_as(tip: int) -> Iterator[None]:
    """``Ledger.open``'s read of the tip (``journal.read_tip`` without the
    lock, before its transaction) answers ``tip``, the read a model's ``open``
    step made earlier; the opening transaction's own locked read is the
    store's. So an open replays cut where the model cuts it."""
    real = journal.read_tip

    def read_tip(tx: Any, tenant: str, session_id: str, *, lock: bool = False) -> tuple[int, int]:
        if lock:
            return real(tx, tenant, session_id, lock=True)
        return (tip, 0)

    journal.read_tip = read_tip  # type: ignore[assignment]
    try:
        yield
    finally:
        journal.read_tip = real  # type: ignore[assignment]


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
    sessions = {
        "leases": "targets",
        "runs": "sessions",
        "ledger": "sessions",
        "ledger_gc": "sessions",
    }
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
        said = getattr(spec, "outcome", outcome)
        verdicts.append(
            Verdict(
                label,
                said(label, mutant_accepted, mutated),
                said(label, accepted, state),
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
