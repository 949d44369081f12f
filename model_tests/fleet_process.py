"""One process of the multi-process PostgreSQL test (``test_postgres.py``).

``python fleet_process.py ROLE URL ACKS [INDEX]`` prints ``ready`` once its
store is open (the test waits for that, not for a time), then runs until
SIGTERM or a kill:

- ``worker INDEX``: sessions ``w<INDEX>-<n>``; per turn it takes the session's
  lease, admits and starts a run, appends three entries under the lease and
  finishes the run with a one-step delivery plan. After each write returns
  (acknowledged) it appends ``entry <session> <entry id>`` (or ``run …``) to
  the file ``ACKS`` and flushes it to disk, so a kill loses no acknowledged
  line;
- ``recovery``: converges orphaned runs (their worker was killed) under a
  recovery lease, woken by the store or its timeout;
- ``outbox``: claims and delivers due operations, woken likewise.

Every store error that is a fence doing its job (busy, lease lost, a run or
claim someone else moved, a session that awaits recovery) is expected;
anything else exits non-zero.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind

PLAN = DeliveryPlan("chat", "room", steps=(DeliveryStep("reply", "message"),))
FENCED = (
    turnkeeper.BusyError,
    turnkeeper.LeaseLostError,
    turnkeeper.DeliveryLeaseLostError,
    turnkeeper.DeliveryOperationBusyError,
    turnkeeper.RecoveryNotNeededError,
    turnkeeper.InvalidTransitionError,
    turnkeeper.SessionRunActiveError,
)
# A session whose run a killed worker left active waits for the recovery
# process: an execution lease on it is refused until that run converged.
AWAITS_RECOVERY = (turnkeeper.SessionRecoveryRequiredError,)
STOP = threading.Event()


def _ack(acks, line: str) -> None:
    acks.write(line + "\n")
    acks.flush()
    os.fsync(acks.fileno())


def worker(store: turnkeeper.BaseStore, index: int, acks) -> None:
    turn = 0
    while not STOP.is_set():
        sid = f"w{index}-{turn % 3}"
        turn += 1
        if store.sessions.get(sid) is None:
            store.sessions.create(sid)
        try:
            lease = store.leases.acquire(
                f"session:{sid}", f"worker-{index}-{os.getpid()}", 10, purpose="execution"
            )
        except turnkeeper.BusyError:
            continue
        except AWAITS_RECOVERY:
            STOP.wait(0.05)
            continue
        try:
            run = store.runs.admit(
                sid, {"turn": turn}, user_message={"role": "user", "content": "go"}, lease=lease
            )
            _ack(acks, f"run {sid} {run.id}")
            store.runs.start(run.id, lease=lease)
            for k in range(3):
                message = {"role": "assistant", "content": [{"type": "text", "text": f"{k}"}]}
                entry = store.sessions.append(
                    sid, EntryKind.MESSAGE, {"message": message}, lease=lease
                )
                _ack(acks, f"entry {sid} {entry.id}")
            store.runs.finish(run.id, "succeeded", lease=lease, delivery_plan=PLAN)
            store.leases.release(lease)
        except FENCED:
            continue


def recovery(store: turnkeeper.BaseStore) -> None:
    sub = store.subscribe("orphan", "lease_released")
    while not STOP.is_set():
        for run in store.recovery.list_orphans():
            try:
                lease = store.leases.acquire(
                    f"session:{run.session_id}", f"recovery-{os.getpid()}", 10, purpose="recovery"
                )
            except turnkeeper.BusyError:
                continue
            try:
                store.recovery.begin(run.id, lease, reason="worker killed")
                store.recovery.converge(run.id, lease, error="the worker was killed")
            except FENCED:
                pass
            finally:
                store.leases.release(lease)
        sub.wait(0.5)


def outbox(store: turnkeeper.BaseStore) -> None:
    sub = store.subscribe("delivery_due")
    owner = f"outbox-{os.getpid()}"
    while not STOP.is_set():
        due = store.outbox.list_due()
        for op in due:
            try:
                claim = store.outbox.claim(op.id, owner, 10)
                store.outbox.finish(op.id, owner, claim.lease_epoch, "delivered")
            except FENCED:
                pass
        if not due:
            sub.wait(0.5)


def main(argv: list[str]) -> int:
    role, url, acks_path = argv[:3]
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    with turnkeeper.open_store(url) as store, open(acks_path, "a") as acks:
        print("ready", flush=True)
        if role == "worker":
            worker(store, int(argv[3]), acks)
        elif role == "recovery":
            recovery(store)
        elif role == "outbox":
            outbox(store)
        else:
            raise SystemExit(f"unknown role {role!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
