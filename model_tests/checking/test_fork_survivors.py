"""Fixed tests for the second mutation net's survivors in ``storage/ops/forks.py``
(``mutation_net/survivors.py`` names each mutant a test here kills).

- a completed turn whose recorded end names an entry that is not its own
  ``turn_end`` is no boundary to fork at (the check's ``or`` made ``and``
  survived: no test gave a turn such an end, which only a damaged or forged
  row gives);
- a fork into a taken session id says whether a deleted session held it (the
  detail's condition flipped survived: no test read the detail).
"""

from __future__ import annotations

import pytest
from conftest import forged_rows
from test_forks import nothing_written, turn

from turnkeeper import ForkUnavailableError, SessionIDExistsError


def _entry_seq(store, sid: str, entry_id: str) -> int:
    (seq,) = [e.seq for e in store.sessions.entries(sid) if e.id == entry_id]
    return seq


@pytest.mark.parametrize("named", ["the other turns turn_end", "its own turn_start"])
def test_a_turn_whose_end_names_another_entry_is_no_fork_boundary(store, named):
    """Turn two's row is forged to end at turn one's ``turn_end`` (a turn_end, of
    another turn) or at its own ``turn_start`` (its turn id, not a turn_end):
    either way a fork at turn two is unavailable and writes nothing, never a
    fork at some other entry."""
    store.sessions.create("s")
    one = turn(store, "s", "one")
    two = turn(store, "s", "two")
    end = one.turn_id + "-end" if named == "the other turns turn_end" else two.turn_id + "-start"
    forged = forged_rows(
        store,
        "UPDATE conversation_turns SET end_seq = ? WHERE id = ? AND session_id = ?",
        [_entry_seq(store, "s", end), two.turn_id, "s"],
    )
    assert forged == 1
    with nothing_written(store), pytest.raises(ForkUnavailableError, match="not in the transcript"):
        store.forks.fork("s", request_id="r", boundary_turn_id=two.turn_id)


def test_a_fork_into_a_taken_id_says_whether_a_deleted_session_held_it(store):
    """A live session's id: the plain refusal; a deleted session's id: the
    refusal says such an id is never reused."""
    store.sessions.create("s")
    turn(store, "s", "one")
    store.sessions.create("live")
    store.sessions.create("gone")
    store.sessions.delete("gone")
    with pytest.raises(SessionIDExistsError) as live:
        store.forks.fork("s", request_id="r1", fork_session_id="live")
    assert live.value.session_id == "live"
    assert "never reused" not in str(live.value)
    with pytest.raises(
        SessionIDExistsError, match="a deleted session's id is never reused"
    ) as gone:
        store.forks.fork("s", request_id="r2", fork_session_id="gone")
    assert gone.value.session_id == "gone"
