"""No write makes a session tree the writes' own rule cannot judge, and the audit
judges every entry of what is stored (attack round 2 F2, F3, F5).

- An import whose entries' parents form a cycle (or a self-loop) is refused:
  a cycle has no leaf, so neither the import's pairing judgement nor the
  audit's ``tool_results_in_context`` saw the unpaired result it held, and
  replay built a context a provider rejects.
- The audit's pairing check judges every entry, on a cycle or not.
- An id an entry names as its missing parent (an entry imported without its
  parent) is not free for an append: written, it would silently become that
  parent and move the imported entry's branch under itself, unjudged.
- While a run has not ended, the ids the store will write for it are its
  own: an import may not take one or hang an entry under one.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import forge, stored_payload

from turnkeeper import (
    EntryCycleError,
    EntryIdReservedError,
    EntryKind,
    NewEntry,
    ToolCallsUnansweredError,
)
from turnkeeper.cli.main import cli
from turnkeeper.formats import pi
from turnkeeper.spec.records import Entry, ImportBatch, ImportEntry
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.pairing import tree_faults

AT = datetime(2026, 1, 1, tzinfo=UTC)
USER = {"message": {"role": "user", "content": "hi"}}
NOCALL = {"message": {"role": "toolResult", "toolCallId": "nocall", "content": []}}


def calls(*ids: str) -> dict[str, Any]:
    blocks = [{"type": "toolCall", "id": i, "name": "f", "arguments": {}} for i in ids]
    return {"message": {"role": "assistant", "content": blocks}}


def batch(sid: str, *entries: tuple[str, str | None, dict[str, Any]]) -> ImportBatch:
    rows = tuple(ImportEntry(i, p, "message", AT, payload) for i, p, payload in entries)
    return ImportBatch(sid, "/", AT, {}, rows, rows[-1].id)


def failing(store, sid: str) -> dict[str, str]:
    """The audit's failing checks on session ``sid``: name → detail."""
    return {c.name: c.detail for c in run_audit(store, [sid]) if not c.passed}


# -- F2: cycles -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entries, cycle",
    [
        ((("a1", "b1", USER), ("b1", "a1", NOCALL)), ("a1", "b1")),
        ((("s1", "s1", NOCALL),), ("s1",)),
        ((("r", None, USER), ("a1", "c1", USER), ("b1", "a1", USER), ("c1", "b1", NOCALL)), None),
    ],
    ids=["two entries", "self-loop", "three, beside a root"],
)
def test_an_import_whose_parents_form_a_cycle_is_refused(store, entries, cycle):
    """Attack round 2 F2: ``a1`` (parent ``b1``, a user message) and ``b1``
    (parent ``a1``, a result without a call) imported with exit 0, and replay
    gave ``[user, toolResult nocall]``. The import is refused, naming the
    cycle, and writes nothing."""
    with pytest.raises(EntryCycleError) as err:
        store.sessions.import_batch(batch("cyc", *entries))
    assert err.value.session_id == "cyc"
    found = set(err.value.entry_ids)
    assert found == (set(cycle) if cycle else {"a1", "b1", "c1"})
    assert store.sessions.get("cyc") is None


def test_an_import_that_closes_a_cycle_through_a_stored_entry_is_refused(store):
    """A stored entry imported without its parent ``X``; a later import supplies
    ``X`` under that very entry: a cycle, refused."""
    store.sessions.import_batch(batch("s", ("u1", None, USER), ("u2", "X", USER)))
    before = store.sessions.entries("s")
    with pytest.raises(EntryCycleError) as err:
        store.sessions.import_batch(
            batch("s", ("u1", None, USER), ("u2", "X", USER), ("X", "u2", USER))
        )
    assert set(err.value.entry_ids) == {"u2", "X"}
    assert store.sessions.entries("s") == before


def test_a_pi_file_with_a_cycle_fails_its_import_and_names_the_entries(tmp_path: Path):
    lines = [
        {"type": "session", "version": 3, "id": "cyc", "timestamp": "2026-01-01T00:00:00Z"},
        {"type": "message", "id": "a1", "parentId": "b1", "timestamp": "2026-01-01T00:00:01Z"}
        | USER,
        {"type": "message", "id": "b1", "parentId": "a1", "timestamp": "2026-01-01T00:00:02Z"}
        | NOCALL,
    ]
    path = tmp_path / "cycle.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    db = str(tmp_path / "store.duckdb")
    done = CliRunner().invoke(cli, ["import", "--db", db, str(path)])
    assert done.exit_code == 1
    assert "EntryCycleError" in done.output and "'a1'" in done.output


def test_the_audit_judges_entries_on_a_cycle(store):
    """The audit's ``tool_results_in_context`` walked only from leaves, and a
    cycle has none: a result without its call stored on one (raw SQL, an
    older turnkeeper) went unseen. Every entry is judged now."""
    store.sessions.import_batch(batch("s", ("a1", None, USER)))
    forge(
        store,
        "INSERT INTO entries (session_id, id, parent_id, kind, seq, ts, payload, lease_epoch, "
        "written_at) VALUES ('s', 'b1', 'a1', 'message', 2, now(), ?, NULL, now())",
        [stored_payload(store, "s", "b1", json.dumps(NOCALL))],
        rows=1,
    )
    forge(store, "UPDATE entries SET parent_id = 'b1' WHERE session_id = 's' AND id = 'a1'", rows=1)
    forge(store, "UPDATE sessions SET next_seq = 3, entry_count = 2 WHERE id = 's'", rows=1)
    found = failing(store, "s")
    assert found["session_trees_well_formed"] == "s: cycle through a1"
    assert found["tool_results_in_context"] == "s/b1: unpaired 'nocall'"


def test_tree_faults_judges_every_entry_leaf_or_not():
    def entry(eid: str, parent: str | None, payload: dict[str, Any]) -> Entry:
        return Entry("s", eid, parent, "message", 0, AT, payload)

    tree = {
        "r": entry("r", None, USER),
        "leaf": entry("leaf", "r", NOCALL),
        "a1": entry("a1", "b1", USER),
        "b1": entry("b1", "a1", {"message": {"role": "toolResult", "toolCallId": "c9"}}),
    }
    assert sorted((f.entry_id, f.tool_call_id) for f in tree_faults(tree)) == [
        ("b1", "c9"),
        ("leaf", "nocall"),
    ]


# -- F3: an id an entry names as its missing parent --------------------------------------------


@pytest.mark.parametrize("how", ["append", "append_many"])
def test_an_append_may_not_take_the_missing_parent_of_an_imported_entry(store, how):
    """Attack round 2 F3: ``u2`` was imported with a missing parent ``X``; then
    ``append(assistant toolCall cX, entry_id="X")`` under ``u1`` was accepted,
    judged only at its own leaf: ``X`` became ``u2``'s parent, so the user
    message ``u2`` followed the unanswered ``cX``, and the audit failed
    ``tool_results_in_context``. The id is refused: EntryIdReservedError
    naming ``u2``; nothing is written."""
    store.sessions.import_batch(batch("s", ("u1", None, USER), ("u2", "X", USER)))
    store.sessions.branch("s", "u1")
    before = store.sessions.entries("s")
    with pytest.raises(EntryIdReservedError) as err:
        if how == "append":
            store.sessions.append("s", EntryKind.MESSAGE, calls("cX"), entry_id="X")
        else:
            store.sessions.append_many(
                "s",
                [NewEntry(EntryKind.MESSAGE, USER), NewEntry(EntryKind.MESSAGE, calls("cX"), "X")],
            )
    assert (err.value.session_id, err.value.entry_id, err.value.reason, err.value.by) == (
        "s",
        "X",
        "parent",
        "u2",
    )
    assert store.sessions.entries("s") == before
    assert "tool_results_in_context" not in failing(store, "s")
    store.sessions.append("s", EntryKind.MESSAGE, calls("cX"), entry_id="Y")  # another id goes in


def test_an_import_may_still_supply_a_missing_parent_and_is_judged_whole(store):
    """Supplying a missing parent stays an import's (a grown file whose line
    now parses): it judges the whole tree, so a parent that would leave the
    adopted entry after unanswered calls is refused."""
    store.sessions.import_batch(batch("s", ("u1", None, USER), ("u2", "X", USER)))
    with pytest.raises(ToolCallsUnansweredError) as err:
        store.sessions.import_batch(
            batch("s", ("u1", None, USER), ("X", "u1", calls("cX")), ("u2", "X", USER))
        )
    assert (err.value.entry_id, err.value.tool_call_ids) == ("u2", ("cX",))
    done = store.sessions.import_batch(
        batch("s", ("u1", None, USER), ("X", "u1", USER), ("u2", "X", USER))
    )
    assert done.added == 1
    assert failing(store, "s") == {}


# -- F5: a live run's ids ----------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["turn-end", "assistant", "c1:interrupted"])
@pytest.mark.parametrize("as_parent", [False, True], ids=["as its id", "as a missing parent"])
def test_an_import_may_not_take_an_id_of_a_run_that_has_not_ended(store, suffix, as_parent):
    """While a run of the session has not ended, the store will write
    ``<run>:turn-end``, ``<run>:assistant`` and ``<run>:<call>:interrupted``
    itself: an import taking one made the run's end fail for good
    (EntryExistsError), and one naming it as a missing parent would be
    adopted by it. Refused: EntryIdReservedError (reason ``run``)."""
    store.sessions.import_batch(batch("s", ("u1", None, USER)))
    run = store.runs.admit("s", {"q": 1}, start=True)
    reserved = f"{run.id}:{suffix}"
    entry = ("o", reserved, USER) if as_parent else (reserved, "u1", USER)
    with pytest.raises(EntryIdReservedError) as err:
        store.sessions.import_batch(batch("s", ("u1", None, USER), entry))
    assert (err.value.entry_id, err.value.reason, err.value.by) == (reserved, "run", run.id)
    store.runs.finish(run.id, "succeeded", assistant_message={"role": "assistant", "content": []})
    store.sessions.import_batch(
        batch("s", ("u1", None, USER), entry)
    )  # the run ended: its ids are done
    assert failing(store, "s").keys() <= {"session_trees_well_formed"}


def test_an_exported_session_with_the_stores_own_ids_imports_back(store, tmp_path: Path):
    """The store's own ids of runs that ended (turn entries, replies,
    interrupted results) are what an exported session holds: they import."""
    store.sessions.create("s")
    run = store.runs.admit("s", {"q": 1}, user_message=USER["message"], start=True)
    store.sessions.append("s", EntryKind.MESSAGE, calls("c1"))
    store.tools.claim(
        "k",
        "s",
        local_turn_id=run.turn_id,
        provider_call_id="c1",
        tool_name="f",
        side_effecting=False,
        run_id=run.id,
    )
    store.runs.finish(run.id, "failed", error="x")
    out = tmp_path / "s.jsonl"
    pi.export_file(store, "s", out)
    text = out.read_text(encoding="utf-8").replace('"id":"s"', '"id":"copy"', 1)
    out.write_text(text, encoding="utf-8")
    pi.import_file(store, out)
    assert [e.id for e in store.sessions.entries("copy")] == [
        e.id for e in store.sessions.entries("s")
    ]
    assert store.sessions.entry("copy", "k:interrupted") is not None
