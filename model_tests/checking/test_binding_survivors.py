"""Fixed tests for the second mutation net's survivor in ``storage/ops/bindings.py``
(``mutation_net/survivors.py`` names the mutant the test here kills).

A transfer refused for a lost lease notes the refusal in ``fence_events`` as one
autocommit statement, as every lease refusal does (``Area._record_fenced``):
``transaction=False`` made ``True`` survived, since a single-threaded test
reads the same row either way. The test reads the flags the transfer passes to
``db.write``, as ``test_thread_survivors.py`` does for a finalize.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_thread_survivors import write_flags

from turnkeeper import LeaseLostError


def test_a_transfer_refused_for_a_lost_lease_notes_the_refusal_as_one_statement(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for sid in ("a", "b"):
        store.sessions.create(sid)
    store.bindings.bind("a", "t", "1")
    stale = store.leases.acquire("session:b", "w", 30)
    assert store.leases.release(stale)
    asked = write_flags(store, monkeypatch)
    with pytest.raises(LeaseLostError):
        store.bindings.transfer("t", "1", "a", "b", leases=[stale])
    assert asked == [("transfer_binding", True), ("record_fenced", False)]
    refused = store.query("SELECT target, operation FROM fence_events").to_pylist()
    assert refused == [{"target": "session:b", "operation": "transfer_binding"}]
    assert store.bindings.find("t", "1").session_id == "a"
