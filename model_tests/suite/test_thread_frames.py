"""``thread_frames.current_frames`` keeps the garbage collector off while
``sys._current_frames()`` runs (CPython gh-106883: see the module), and
leaves it as it found it."""

from __future__ import annotations

import gc
import sys

import pytest
from thread_frames import current_frames


def test_the_frames_are_read_with_the_collector_off_and_it_is_left_as_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[bool] = []

    def frames() -> dict:
        seen.append(gc.isenabled())
        return {}

    monkeypatch.setattr(sys, "_current_frames", frames)
    assert gc.isenabled()
    assert current_frames() == {}
    assert gc.isenabled()
    gc.disable()
    try:
        current_frames()
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()
    assert seen == [False, False]
