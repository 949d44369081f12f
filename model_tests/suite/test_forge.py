"""The tests' forge (``conftest.forge``) checks how many rows it changed: a
forged state that changed nothing leaves a test nothing to find."""

from __future__ import annotations

import pytest
from conftest import forge, forged_rows

import turnkeeper


def test_a_forge_that_changes_another_count_of_rows_fails(store: turnkeeper.BaseStore) -> None:
    store.sessions.create("s")
    with pytest.raises(AssertionError, match="changed 0 rows, not 1"):
        forge(store, "UPDATE sessions SET title = 'x' WHERE id = 'absent'", rows=1)
    with pytest.raises(AssertionError, match="changed 1 rows, not 2"):
        forge(store, "UPDATE sessions SET title = 'x' WHERE id = 's'", rows=2)
    forge(store, "UPDATE sessions SET title = 'y' WHERE id = ?", ["s"], rows=1)
    got = store.sessions.get("s")
    assert got is not None and got.title == "y"
    assert forged_rows(store, "DELETE FROM sessions WHERE id = 'absent'") == 0
