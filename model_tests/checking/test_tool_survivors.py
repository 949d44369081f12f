"""Fixed test for the second mutation net's survivor in ``storage/ops/tools.py``
(``mutation_net/survivors.py`` names the mutant the test here kills).

A reclaim that names the run re-executing the call takes only a live run of
the record's own session (the check's first ``or`` made ``and`` survived: the
tests named only a run of the same session, live or ended).
"""

from __future__ import annotations

import pytest
from test_tool_executions import claim

from turnkeeper import InvalidInputError


def test_a_reclaim_names_only_a_live_run_of_the_records_own_session(store):
    claim(store, "k", sid="s", side=False)
    before = store.tools.get("k")
    store.sessions.create("o")
    other = store.runs.admit("o", {"q": 1})
    store.runs.start(other.id)
    for run_id in ("no-such-run", other.id):
        with pytest.raises(InvalidInputError, match="is not a live run of session 's'") as err:
            store.tools.reclaim("k", run_id=run_id)
        assert err.value.field == "run_id"
        assert store.tools.get("k") == before
    own = store.runs.admit("s", {"q": 2})
    store.runs.start(own.id)
    reopened = store.tools.reclaim("k", run_id=own.id)
    assert (reopened.run_id, reopened.local_turn_id, reopened.attempt) == (own.id, own.turn_id, 2)
