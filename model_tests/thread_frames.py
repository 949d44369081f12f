"""Every thread's current frame, for the tests that wait until another thread
is blocked in a given function (an interrupt sent into a join's wait, a close
that waits for an operation).

``sys._current_frames()`` holds the interpreter's thread-list lock while it
builds its dict; on Python 3.11 an allocation can run the garbage collector
there, and a finalizer the collection runs may let go of the GIL (a store's
cursor closed when its thread's holder is collected waits for a lock). A
thread that then takes the GIL and needs the thread-list lock (one ending:
its thread state is deleted under it) waits for ever, and so does every other
thread (CPython gh-106883; 3.12 runs the collector only between bytecodes).
CI met it once: a share of the suite hung in
``test_close_waits_for_an_operation_whose_thread_an_interrupted_join_marked_ended``,
every thread waiting for the GIL. :func:`current_frames` keeps the collector
off for that one call.
"""

from __future__ import annotations

import gc
import sys
import threading
from types import FrameType


def current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()`` with the garbage collector off during the call
    (see the module docstring); on again after it if it was on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if was_on:
            gc.enable()


def frame_of(thread: threading.Thread) -> FrameType | None:
    """``thread``'s current frame (``None`` once it ended)."""
    return current_frames().get(thread.ident or 0)
