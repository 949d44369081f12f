"""Fixed tests for the second mutation net's survivors in ``storage/ops/deletes.py``
(``mutation_net/survivors.py`` names each mutant a test here kills).

- ``max_age_s`` takes both ends of its range, 0 and :data:`MAX_AGE_S` (either
  comparison made strict survived: the tests gave values inside or well
  outside);
- the retention pass reads its candidates and their heads in one snapshot, so
  a session written while the pass chooses is kept as changed (``snapshot=False``
  survived: the tests wrote only after the choice);
- a pass drops this store object's caches of each session it removed (the
  loop made to run no iteration survived).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from test_retention import USER, aged, remaining

from turnkeeper import InvalidInputError, RetentionReport
from turnkeeper.storage.ops import deletes


def test_retention_takes_max_age_from_zero_to_its_bound_inclusive(store, clock):
    aged(store, clock, 2)
    lease = store.leases.acquire("retention:main", "janitor", 60)
    for max_age_s in (deletes.MAX_AGE_S, 0):
        assert isinstance(store.sessions.retain(lease, max_age_s=max_age_s), RetentionReport)
    assert remaining(store, ["s0", "s1"]) == []  # at 0, every session written before now
    for bad in (-math.ulp(0.0), math.nextafter(deletes.MAX_AGE_S, math.inf)):
        with pytest.raises(InvalidInputError, match="max_age_s"):
            store.sessions.retain(lease, max_age_s=bad)


def test_a_session_written_while_the_pass_chooses_is_kept(store, clock, monkeypatch):
    """Another writer appends to s1 after the pass's candidate query and before
    it reads s1's head: in one snapshot the head read is the one the query
    chose by, so the pass sees s1 changed and keeps it whole."""
    sids = aged(store, clock, 3)
    lease = store.leases.acquire("retention:main", "janitor", 600)
    real = deletes._family_heads
    wrote: list[Any] = []

    def heads_after_a_write(tx: Any, root: str) -> Any:
        if root == "s1" and not wrote:
            writer = threading.Thread(
                target=lambda: wrote.append(
                    store.sessions.append("s1", "message", {"message": USER})
                )
            )
            writer.start()
            writer.join(60)
            assert wrote, "the other writer's append did not return"
        return real(tx, root)

    monkeypatch.setattr(deletes, "_family_heads", heads_after_a_write)
    report = store.sessions.retain(lease, keep_last=0)
    assert report.skipped == {"s1": "changed"}, report
    assert [g.session_id for g in report.removed] == ["s0", "s2"]
    assert remaining(store, sids) == ["s1"]
    assert store.sessions.replay("s1").messages[-1] == USER


def test_a_pass_forgets_its_caches_of_each_session_it_removed(store, clock):
    sids = aged(store, clock, 2)
    for sid in sids:
        store.sessions.replay(sid)
        assert store.sessions._branches.get(sid) is not None
    lease = store.leases.acquire("retention:main", "janitor", 60)
    assert [g.session_id for g in store.sessions.retain(lease, keep_last=0).removed] == sids
    assert [store.sessions._branches.get(sid) for sid in sids] == [None, None]
