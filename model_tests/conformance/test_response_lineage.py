"""Response lineage compare-and-swap (session seed CompareAndSwapResponseSessionState)."""

from __future__ import annotations

import threading

import pytest

from turnkeeper import InvalidInputError, ResponseState, SessionNotFoundError


def test_swaps_advance_only_from_the_version_seen(store):
    store.sessions.create("s")
    assert store.lineage.get("s") is None
    first = ResponseState("s", state_mode="chain", previous_response_id="resp_1", model="m")
    assert store.lineage.compare_and_swap(first, 0) is True
    assert store.lineage.compare_and_swap(first, 0) is False  # someone already began
    got = store.lineage.get("s")
    assert (got.previous_response_id, got.version) == ("resp_1", 1)
    nxt = ResponseState("s", state_mode="chain", previous_response_id="resp_2", model="m")
    assert store.lineage.compare_and_swap(nxt, 0) is False
    assert store.lineage.compare_and_swap(nxt, 2) is False
    assert store.lineage.compare_and_swap(nxt, 1) is True
    assert store.lineage.get("s").version == 2


def test_two_turns_racing_from_one_version_cannot_both_swap(real_store):
    real_store.sessions.create("s")
    real_store.lineage.compare_and_swap(ResponseState("s", previous_response_id="r0"), 0)
    for round_ in range(1, 6):
        barrier, wins = threading.Barrier(4), []

        def turn(n: int, version: int = round_, barrier=barrier, wins=wins) -> None:
            barrier.wait()
            state = ResponseState("s", previous_response_id=f"r{version}-{n}")
            if real_store.lineage.compare_and_swap(state, version):
                wins.append(n)

        threads = [threading.Thread(target=turn, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1
        assert real_store.lineage.get("s").version == round_ + 1


def test_bad_swaps_are_refused(store):
    with pytest.raises(SessionNotFoundError):
        store.lineage.compare_and_swap(ResponseState("nope"), 0)
    store.sessions.create("s")
    for state, version in [(ResponseState("s"), -1), (ResponseState("s"), True), ("x", 0)]:
        with pytest.raises(InvalidInputError):
            store.lineage.compare_and_swap(state, version)
    assert store.lineage.get("s") is None
