"""A Ctrl-C stops the demo's thread fleet only after its workers ended.

CI saw ``turnkeeper demo`` interrupted print a worker's "ledger catalog
update failed: … the store is closed" with its traceback: the demo had
closed its store under a running worker. On CPython before 3.13 a
``Thread.join`` that Ctrl-C interrupts marks the thread it waited for as
stopped (bpo-45274's handling), so the demo's later join returned at once
and ``is_alive`` said ``False`` while the thread still ran. The fleet's
threads now report their end by an event each (:class:`UnitThreads`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import pytest
from thread_frames import current_frames

from turnkeeper.cli.fleet_runners import UnitThreads


def _interrupted_join(join: Callable[[], None]) -> bool:
    try:
        join()
    except KeyboardInterrupt:
        return True
    return False


def _interrupting_body(gate: threading.Event, blocked_in: str) -> Callable[[], None]:
    """A thread body that sends this process a SIGINT once the main thread is
    blocked in the function ``blocked_in`` (a join's wait; it cannot return
    before this body ends, so the signal lands in the wait, however loaded
    the machine), then waits at ``gate``."""
    main = threading.main_thread().ident
    assert main is not None

    def body() -> None:
        while current_frames()[main].f_code.co_name != blocked_in:
            time.sleep(0.001)
        time.sleep(0.05)  # from the frame's first line into the lock's wait
        os.kill(os.getpid(), signal.SIGINT)  # a real signal: it interrupts a blocked wait
        gate.wait()

    return body


def test_a_unit_thread_is_alive_after_a_join_that_ctrl_c_interrupted() -> None:
    gate = threading.Event()
    threads = UnitThreads([("unit", _interrupting_body(gate, "wait"))])
    threads.start()
    try:
        assert _interrupted_join(lambda: threads.join(60.0))
        assert threads.alive()  # it waits at the gate
    finally:
        gate.set()
    threads.join(60.0)
    assert not threads.alive()


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="3.13 rewrote Thread.join")
def test_control_a_plain_thread_join_interrupted_by_ctrl_c_loses_the_thread() -> None:
    """What the fleet used to rely on: after the interrupted join, the thread
    still runs (it waits at the gate) but ``is_alive`` says it does not."""
    gate = threading.Event()
    body = _interrupting_body(gate, "_wait_for_tstate_lock")
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    try:
        assert _interrupted_join(lambda: thread.join(60.0))
        lost = not thread.is_alive()
    finally:
        gate.set()
    thread.join(60.0)
    assert lost
