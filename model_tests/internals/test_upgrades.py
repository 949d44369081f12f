"""An upgrade keeps idempotency (issue 17, item 4): a store an older turnkeeper
wrote, at each older schema version, opened in place by this one; every
retry of what it stored gets what it got then, and a different request
still conflicts, on both backends.

The stores are made by :mod:`older_stores` (the schema of their version, the
rows as the turnkeeper of that time wrote them, digests included). Session
``s`` is written by a turnkeeper from before commit 651f01c, which kept a
submission's request alone; from version 8 on, session ``t`` is written by
one after it, which keeps the whole admission.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from older_stores import key_digest, request_only, store_at

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind
from turnkeeper.spec import errors

POLICY = {"tools": ["read"], "budget": 3}
FIELDS = {"source": "chat", "model": "m-1", "mode": "build", "work_dir": "/w", "policy": POLICY}
FIRST = {"prompt": "summarise the logs", "n": 1}
RETRY = {"prompt": "summarise the logs, again", "n": 2}  # a retry's own request, as the demo's
LATER = {"prompt": "count the errors"}
PLAN = DeliveryPlan("slack", "C1", (DeliveryStep("send", "message", payload_digest="d1"),))
ARGS = {"path": "a.txt"}


def _message(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1}


def _call(call_id: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "toolCall", "id": call_id, "name": "read", "arguments": ARGS}],
        "timestamp": 2,
    }


def _result(call_id: str) -> dict[str, Any]:
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": "read",
        "content": [{"type": "text", "text": "contents"}],
        "isError": False,
        "timestamp": 3,
    }


def _scenario(version: int, ids: dict[str, str]) -> Any:
    """What an older turnkeeper at schema ``version`` stored, written through the
    API; ``ids`` gets the ids it made. Returns the submissions of session ``s``
    by key digest with the digest turnkeeper wrote for them then."""

    def write(store: turnkeeper.BaseStore) -> dict[str, str]:
        store.sessions.create("s", cwd="/w")
        store.sessions.append(
            "s", EntryKind.MESSAGE, {"message": _message("user", "hello")}, entry_id="e1"
        )
        store.sessions.set_title("s", "logs")
        old: dict[str, str] = {}
        first = store.runs.admit(
            "s", FIRST, submission_key="k1", user_message=_message("user", "please"), **FIELDS
        )
        store.runs.start(first.id)
        store.runs.finish(first.id, "failed", error="boom")
        retry = store.runs.admit(
            "s",
            RETRY,
            submission_key="k2",
            user_message=_message("user", "please, again"),
            retry_of=first.id,
            **FIELDS,
        )
        store.runs.start(retry.id)
        plan = {"delivery_plan": PLAN} if version >= 5 else {}
        store.runs.finish(
            retry.id, "succeeded", assistant_message=_message("assistant", "ok"), **plan
        )
        ids.update(first=first.id, retry=retry.id)
        old[key_digest("s", "k1")] = request_only(FIRST)
        old[key_digest("s", "k2")] = request_only(RETRY)
        if version >= 6:
            tool = store.runs.admit("s", LATER, submission_key="k3", start=True)
            store.sessions.append("s", EntryKind.MESSAGE, {"message": _call("c1")})
            store.tools.claim(
                f"{tool.id}:c1",
                "s",
                local_turn_id=tool.turn_id,
                provider_call_id="c1",
                tool_name="read",
                side_effecting=False,
                arguments=ARGS,
                run_id=tool.id,
            )
            store.tools.complete(f"{tool.id}:c1", {"text": "contents"})
            store.sessions.append("s", EntryKind.MESSAGE, {"message": _result("c1")})
            store.runs.finish(tool.id, "succeeded", assistant_message=_message("assistant", "read"))
            ids["tool"] = tool.id
            old[key_digest("s", "k3")] = request_only(LATER)
        if version >= 7:
            fork = store.forks.fork("s", request_id="f1", boundary_turn_id=retry.turn_id)
            ids["fork"] = fork.fork_session_id
        if version >= 8:  # written by a turnkeeper after 651f01c: the whole admission
            store.sessions.create("t")
            later = store.runs.admit(
                "t", LATER, submission_key="k1", user_message=_message("user", "count"), **FIELDS
            )
            ids["later"] = later.id
        return old

    return write


def _conflicts(store: turnkeeper.BaseStore, session_id: str, request: Any, **kw: Any) -> None:
    with pytest.raises(errors.SubmissionConflictError):
        store.runs.admit(session_id, request, **kw)


@pytest.mark.parametrize("version", range(2, turnkeeper.SCHEMA_VERSION))
@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_an_upgrade_keeps_every_retry_of_what_an_older_turnkeeper_stored(
    backend: str, version: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix every retried submission key of session ``s`` raised
    SubmissionConflictError: the key's row held a digest of the request alone,
    compared with a digest of the whole admission."""
    ids: dict[str, str] = {}
    where = store_at(backend, version, tmp_path, monkeypatch, _scenario(version, ids))
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
        first = store.runs.get(ids["first"])
        retry = store.runs.get(ids["retry"])
        please = _message("user", "please")
        again = _message("user", "please, again")
        # the same key, request, user message and intent fields: the original run
        assert (
            store.runs.admit("s", FIRST, submission_key="k1", user_message=please, **FIELDS)
            == first
        )
        same_retry = {"user_message": again, "retry_of": first.id, **FIELDS}
        assert store.runs.admit("s", RETRY, submission_key="k2", **same_retry) == retry
        # anything else under those keys is another request
        _conflicts(store, "s", FIRST, submission_key="k1", user_message=again, **FIELDS)
        _conflicts(store, "s", RETRY, submission_key="k1", user_message=please, **FIELDS)
        _conflicts(store, "s", FIRST, submission_key="k1", **FIELDS)
        _conflicts(store, "s", FIRST, submission_key="k1", user_message=please)
        _conflicts(
            store, "s", FIRST, submission_key="k1", user_message=please, **{**FIELDS, "model": "x"}
        )
        _conflicts(store, "s", FIRST, submission_key="k1", user_message=please, retry_of=first.id)
        _conflicts(store, "s", FIRST, submission_key="k2", **same_retry)
        _conflicts(store, "s", RETRY, submission_key="k2", **{**same_retry, "user_message": please})
        _conflicts(store, "s", RETRY, submission_key="k2", **{**same_retry, "retry_of": retry.id})
        _conflicts(store, "s", RETRY, submission_key="k2", user_message=again, **FIELDS)
        if version >= 5:
            assert store.runs.finish(retry.id, "succeeded", delivery_plan=PLAN) == retry
            other = DeliveryPlan("slack", "C2", PLAN.steps)
            with pytest.raises(errors.DeliveryPlanConflictError):
                store.runs.finish(retry.id, "succeeded", delivery_plan=other)
        if version >= 6:
            tool = store.runs.get(ids["tool"])
            assert store.runs.admit("s", LATER, submission_key="k3", start=True) == tool
            _conflicts(store, "s", FIRST, submission_key="k3", start=True)
            claim = {
                "local_turn_id": tool.turn_id,
                "provider_call_id": "c1",
                "tool_name": "read",
                "side_effecting": False,
                "run_id": tool.id,
            }
            record, created = store.tools.claim(f"{tool.id}:c1", "s", arguments=ARGS, **claim)
            assert not created and record.state == "completed"
            assert store.tools.complete(f"{tool.id}:c1", {"text": "contents"}) == record
            with pytest.raises(errors.ToolExecutionConflictError):
                store.tools.claim(f"{tool.id}:c1", "s", arguments={"path": "b"}, **claim)
        if version >= 7:
            fork = store.forks.get("f1")
            assert fork is not None and fork.fork_session_id == ids["fork"]
            assert store.forks.fork("s", request_id="f1", boundary_turn_id=retry.turn_id) == fork
            with pytest.raises(errors.ForkRequestConflictError):
                store.forks.fork("s", request_id="f1", boundary_turn_id=first.turn_id)
        if version >= 8:
            later = store.runs.get(ids["later"])
            count = _message("user", "count")
            again_later = store.runs.admit(
                "t", LATER, submission_key="k1", user_message=count, **FIELDS
            )
            assert again_later == later
            _conflicts(store, "t", LATER, submission_key="k1", user_message=please, **FIELDS)
        # and the store goes on: a new submission, retried
        new = store.runs.admit("s", {"prompt": "new"}, submission_key="k9", user_message=please)
        assert (
            store.runs.admit("s", {"prompt": "new"}, submission_key="k9", user_message=please)
            == new
        )
        assert store.sessions.get("s").title == "logs"


def test_a_file_of_the_first_version_1_takes_writes_after_the_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DuckDB file made by turnkeeper's first version 1 (before commit f4a91ce
    added ``entries.written_at`` to that version) migrated without the column,
    and every write to it then failed (ProgrammingError: Binder Error, Table
    "entries" does not have a column with name "written_at"). Version 13 adds
    it; each entry already stored gets its own timestamp."""
    where = store_at("duckdb", 1, tmp_path, monkeypatch, _first_entries, first_v1=True)
    with turnkeeper.open_store(where) as store:
        before = store.sessions.replay("s")
        entry = store.sessions.append(
            "s", EntryKind.MESSAGE, {"message": _message("user", "again")}
        )
        run = store.runs.admit("s", FIRST, submission_key="k1", user_message=_message("user", "go"))
        assert (
            store.runs.admit("s", FIRST, submission_key="k1", user_message=_message("user", "go"))
            == run
        )
        assert store.sessions.replay("s").messages[: len(before.messages)] == before.messages
        assert store.sessions.entry("s", entry.id) == entry
        stored = store.query("SELECT id, ts, written_at FROM entries WHERE id IN ('e1', 'e2')")
        rows = stored.to_pylist()
        assert len(rows) == 2 and all(r["written_at"] == r["ts"] for r in rows), rows


def _first_entries(store: turnkeeper.BaseStore) -> dict[str, str]:
    store.sessions.create("s", cwd="/w")
    for n, text in ((1, "hello"), (2, "more")):
        store.sessions.append(
            "s", EntryKind.MESSAGE, {"message": _message("user", text)}, entry_id=f"e{n}"
        )
    store.sessions.set_title("s", "logs")
    return {}


def _spelled(store: turnkeeper.BaseStore) -> tuple[Any, dict[str, Any]]:
    """A run admitted under key ``k`` in session ``s``, and a request that is
    the JSON object its admission digest hashes (so its request digest is the
    stored admission digest)."""
    store.sessions.create("s")
    please = _message("user", "please")
    run = store.runs.admit("s", FIRST, submission_key="k", user_message=please, **FIELDS)
    policy = store.query("SELECT policy FROM execution_intents").column(0)[0].as_py()
    spelled = {
        "request": FIRST,
        "user_message": please,
        "retry_of": None,
        **FIELDS,
        "policy": policy,
    }
    digest = store.query("SELECT request_fingerprint FROM submissions").column(0)[0].as_py()
    assert request_only(spelled) == digest
    return run, spelled


def test_a_request_that_spells_an_admission_is_never_taken_for_an_older_row(
    store: turnkeeper.BaseStore,
) -> None:
    """A row written before 651f01c is told by its digest equalling the digest of
    the request alone. A request that is itself the JSON object an admission
    digest hashes has that admission's digest as its own; it is another
    request, and conflicts."""
    _, spelled = _spelled(store)
    please = _message("user", "please")
    _conflicts(store, "s", spelled, submission_key="k", user_message=please, **FIELDS)


def test_control_without_the_shape_check_a_spelled_admission_gets_another_requests_run(
    store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with the check patched out (no request counts as an admission's
    object), that request is taken for an older row and gets the run of the
    admission it spells."""
    from turnkeeper.storage.ops import submissions

    monkeypatch.setattr(submissions, "_BODY", frozenset())
    run, spelled = _spelled(store)
    please = _message("user", "please")
    assert store.runs.admit("s", spelled, submission_key="k", user_message=please, **FIELDS) == run
