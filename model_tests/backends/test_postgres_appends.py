"""PostgreSQL's one-statement plain append (``storage/ops/appends.py``).

A plain append is one autocommit statement: it locks the lease row (shared)
under the fence, so a takeover committed meanwhile is re-read and refuses it,
and one still open makes it wait; a refused one writes nothing, not even the
lease row; anything it cannot judge falls back to the transaction, which
raises the error that applies.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from conftest import new_pg_schema, through_pooler

import turnkeeper
from turnkeeper import EntryKind, NewEntry
from turnkeeper.spec import errors
from turnkeeper.storage.backend import Dialect

pytestmark = pytest.mark.postgres

M = EntryKind.MESSAGE


def user(text: str) -> dict[str, Any]:
    return {"message": {"role": "user", "content": text}}


def lease_row(url: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT target, epoch, fenced_writes, unleased_checks FROM leases ORDER BY target"
        ).fetchall()


def test_a_plain_append_is_one_statement_and_a_refused_one_writes_nothing() -> None:
    url = new_pg_schema()
    with turnkeeper.open_store(url) as store:
        store.sessions.create("s")
        store.sessions.create("free")
        lease = store.leases.acquire("session:s", "w1", 600)
        first = store.sessions.append("s", M, user("a"), lease=lease)
        got = store.sessions.append_many(
            "s", [(M, user("b")), NewEntry(M, user("c"), timestamp=first.timestamp)], lease=lease
        )
        assert [e.parent_id for e in got] == [first.id, got[0].id]
        assert got[1].timestamp == first.timestamp
        store.sessions.append("free", M, user("x"))
        stats = store.statement_stats()
        one = 1 + through_pooler()  # behind a pooler its search_path is pinned with it
        assert stats["append"]["statements_per_call"] == one
        assert stats["append_many"]["statements_per_call"] == one
        before = lease_row(url)
        stale = dataclasses.replace(lease, token="not-the-token")
        for call, error in [
            (
                lambda: store.sessions.append("s", M, user("stale"), lease=stale),
                errors.LeaseLostError,
            ),
            (lambda: store.sessions.append("s", M, user("no lease")), errors.BusyError),
            (
                lambda: store.sessions.append(
                    "s", M, user("moved"), lease=lease, expected_leaf=first.id
                ),
                errors.SessionModifiedError,
            ),
            (lambda: store.sessions.append("nobody", M, user("x")), errors.SessionNotFoundError),
        ]:
            with pytest.raises(error):
                call()
        assert [e.payload["message"]["content"] for e in store.sessions.entries("s")] == [
            "a",
            "b",
            "c",
        ]
        # the refused appends' own statement locked, never wrote, the lease row;
        # only their fallback transactions' fences ran, and rolled back
        assert lease_row(url) == before


def takeover_racing_an_append(url: str) -> Any:
    """A takeover of the session's lease, open (uncommitted) in another
    connection while the old holder appends, then committed; what the append
    got."""
    import psycopg

    with turnkeeper.open_store(url) as store:
        store.sessions.create("s")
        old = store.leases.acquire("session:s", "w1", 600)
        outcome: dict[str, Any] = {}
        with psycopg.connect(url) as other:
            taken = other.execute(
                "UPDATE leases SET epoch = epoch + 1, owner = 'w2', token_digest = 'other' "
                "WHERE target = 'session:s'"
            )  # the takeover's transaction, still open
            assert taken.rowcount == 1

            def append() -> None:
                try:
                    outcome["got"] = store.sessions.append("s", M, user("stale?"), lease=old)
                except errors.TurnkeeperError as exc:
                    outcome["got"] = exc

            writer = threading.Thread(target=append)
            writer.start()
            writer.join(1.0)  # it waits for the takeover (or, unlocked, is done)
            outcome["waited"] = writer.is_alive()
            other.commit()
            writer.join(30)
        outcome["entries"] = store.sessions.entries("s")
        return outcome


def test_an_append_waits_for_an_open_takeover_and_then_is_refused() -> None:
    outcome = takeover_racing_an_append(new_pg_schema())
    assert outcome["waited"]
    assert isinstance(outcome["got"], errors.LeaseLostError)
    assert outcome["entries"] == []


def test_control_without_the_row_lock_the_append_does_not_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Dialect, "share_lock", lambda self: "")
    outcome = takeover_racing_an_append(new_pg_schema())
    with pytest.raises(AssertionError):
        assert outcome["waited"] and isinstance(outcome["got"], errors.LeaseLostError)


def first_grant_racing_a_lease_less_append(url: str, *, chosen_id: bool) -> dict[str, Any]:
    """A lease-less append to a session never leased (no lease row to lock)
    slowed inside its insert (a trigger in this test's schema sleeps), and the
    session's first grant meanwhile; what the holder saw right after its
    grant, and at the end. ``chosen_id``: the append runs as a transaction
    (a caller's id is not plain), else as one statement."""
    import time

    import psycopg

    with turnkeeper.open_store(url) as store, psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "CREATE FUNCTION slow_entry() RETURNS trigger AS $$ BEGIN "
            "IF NEW.payload LIKE '%SLOW%' THEN PERFORM pg_sleep(1.5); END IF; RETURN NEW; "
            "END $$ LANGUAGE plpgsql"
        )
        admin.execute(
            "CREATE TRIGGER slow_entry BEFORE INSERT ON entries "
            "FOR EACH ROW EXECUTE FUNCTION slow_entry()"
        )
        store.sessions.create("s")
        out: dict[str, Any] = {}

        def lease_less() -> None:
            extra = {"entry_id": "chosen"} if chosen_id else {}
            try:
                out["append"] = store.sessions.append("s", M, user("SLOW"), **extra)
            except errors.TurnkeeperError as exc:
                out["append"] = exc

        writer = threading.Thread(target=lease_less)
        writer.start()
        for _ in range(3000):  # until the append sleeps inside its insert
            sleeping = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
            ).fetchone()
            if sleeping and sleeping[0]:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the append never reached its insert")
        lease = store.leases.acquire("session:s", "holder", 60)
        out["seen"] = [e.id for e in store.sessions.entries("s")]
        writer.join(30)
        out["end"] = [e.id for e in store.sessions.entries("s")]
        out["lease"] = lease
        return out


@pytest.mark.parametrize("chosen_id", [False, True], ids=["one-statement", "transaction"])
def test_a_first_grant_and_a_lease_less_append_are_ordered(chosen_id: bool) -> None:
    """Found by an attack helper: a lease-less write to a session without a lease
    row could commit after the session's first grant, so the holder's view
    moved under it. A grant now writes the session row, and both paths meet
    it there: the append commits first (the grant waits, and its holder sees
    the entry) or is refused."""
    out = first_grant_racing_a_lease_less_append(new_pg_schema(), chosen_id=chosen_id)
    assert out["end"] == out["seen"], out
    assert isinstance(out["append"], (turnkeeper.Entry, errors.BusyError))


def test_control_without_the_grant_touching_the_session_the_view_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from turnkeeper.storage.ops import leases

    monkeypatch.setattr(leases, "touch_session", lambda tx, target: None)
    out = first_grant_racing_a_lease_less_append(new_pg_schema(), chosen_id=False)
    assert out["end"] != out["seen"]  # the entry appeared after the holder looked


# -- the tool-call pairing rule on the one-statement path (issue 17 item 2) ------------------


def _call(call_id: str) -> dict[str, Any]:
    content = [{"type": "toolCall", "id": call_id, "name": "ls", "arguments": {}}]
    return {"message": {"role": "assistant", "content": content}}


def test_a_message_after_an_open_call_is_refused_on_the_one_statement_path() -> None:
    """The store object remembers the calls open at its session's head: a plain
    message after an open call is judged and refused without a statement; a
    result and then messages go on as one statement each."""
    url = new_pg_schema()
    with turnkeeper.open_store(url) as store:
        store.sessions.create("s")
        store.sessions.append("s", M, _call("c1"))
        with pytest.raises(errors.ToolCallsUnansweredError) as err:
            store.sessions.append("s", M, user("too soon"))
        assert err.value.tool_call_ids == ("c1",)
        result = {"role": "toolResult", "toolCallId": "c1", "toolName": "ls", "content": []}
        store.sessions.append("s", M, {"message": result})

        def statements() -> float:
            stats = store.statement_stats()["append"]
            return stats["calls"] * stats["statements_per_call"]

        before = statements()
        store.sessions.append("s", M, user("now"))
        store.sessions.append("s", M, user("and again"))
        assert round(statements() - before) == 2 * (1 + through_pooler())  # one each (+ pin)
        assert [e.payload["message"]["role"] for e in store.sessions.entries("s")] == [
            "assistant",
            "toolResult",
            "user",
            "user",
        ]


def stale_view_append(url: str) -> tuple[Any, list[Any]]:
    """Store object A remembers session s at a head where no call is open; B
    (another process, say) then appends a call; A appends a user message.
    What A got, and the faults of the stored tree."""
    from turnkeeper.storage.pairing import tree_faults

    with turnkeeper.open_store(url) as a, turnkeeper.open_store(url) as b:
        a.sessions.create("s")
        a.sessions.append("s", M, user("hi"))
        b.sessions.append("s", M, _call("c1"))
        try:
            got: Any = a.sessions.append("s", M, user("after the call"))
        except errors.TurnkeeperError as exc:
            got = exc
        return got, tree_faults({e.id: e for e in a.sessions.entries("s")})


def test_a_stale_view_of_the_head_never_lets_a_message_past_an_open_call() -> None:
    """A's remembered head is stale: the rule accepts its message there, so the
    statement writes only while the head is still the judged one; it is not,
    and the transaction that follows reads the call and refuses."""
    got, faults = stale_view_append(new_pg_schema())
    assert isinstance(got, errors.ToolCallsUnansweredError), got
    assert faults == []


def test_control_a_one_statement_append_without_the_judged_head_lets_it_past(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from turnkeeper.storage.ops import appends

    real = appends.one_statement
    monkeypatch.setattr(
        appends, "one_statement", lambda tx, r: real(tx, dataclasses.replace(r, known=None))
    )
    got, faults = stale_view_append(new_pg_schema())
    assert isinstance(got, turnkeeper.Entry)
    assert [f.reason for f in faults] == ["unanswered"]
