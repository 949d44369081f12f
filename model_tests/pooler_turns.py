"""A runtime's turns, for the tests that run them through PgBouncer (``test_pooler.py``).

:func:`turns` runs ``count`` whole turns of one worker, each on a session of its
own: create the session, take its lease, admit and start a run, append the
assistant's tool call, claim and complete the tool execution, finish the run
with the tool result, the reply and a one-step delivery plan, release the
lease, then claim and deliver the plan's operation. Every exception is kept
(none is expected: every session is the worker's own). :func:`check` reads
back what a worker's turns must have stored.

``python pooler_turns.py URL LISTEN_URL WORKER COUNT`` runs :func:`turns` in a
process of its own and prints its outcome as one JSON line (``LISTEN_URL``
``-`` for none).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind

PLAN = DeliveryPlan("chat", "room", steps=(DeliveryStep("reply", "message"),))


def turns(store: turnkeeper.BaseStore, worker: str, count: int) -> dict[str, Any]:
    """``count`` turns of ``worker``: ``{"turns": done, "errors": [...]}``."""
    done, failures = 0, []
    for t in range(count):
        sid = f"{worker}-{t}"
        try:
            store.sessions.create(sid)
            lease = store.leases.acquire(f"session:{sid}", worker, 120, purpose="execution")
            user = {"role": "user", "content": f"list {t}"}
            run = store.runs.admit(sid, {"t": t}, user_message=user, lease=lease, start=True)
            call = {"type": "toolCall", "id": "c1", "name": "ls", "arguments": {"t": t}}
            message = {"role": "assistant", "content": [call]}
            store.sessions.append(sid, EntryKind.MESSAGE, {"message": message}, lease=lease)
            key = f"{run.id}:c1"
            store.tools.claim(
                key,
                sid,
                local_turn_id=run.turn_id,
                provider_call_id="c1",
                tool_name="ls",
                side_effecting=False,
                arguments={"t": t},
                run_id=run.id,
                lease=lease,
            )
            store.tools.complete(key, {"out": t}, lease=lease)
            result = {
                "role": "toolResult",
                "toolCallId": "c1",
                "toolName": "ls",
                "content": [{"type": "text", "text": f"file-{t}"}],
                "isError": False,
            }
            store.runs.finish(
                run.id,
                "succeeded",
                entries=[(EntryKind.MESSAGE, {"message": result})],
                assistant_message={"role": "assistant", "content": f"done {t}"},
                lease=lease,
                delivery_plan=PLAN,
            )
            store.leases.release(lease)
            found = store.outbox.get_plan(f"{run.id}:delivery")
            assert found is not None, sid
            (op,) = found[1]
            claimed = store.outbox.claim(op.id, worker, 60)
            store.outbox.finish(
                op.id, worker, claimed.lease_epoch, "delivered", provider_message_id=f"m-{t}"
            )
            done += 1
        except Exception as exc:  # every one is a failure of the test: keep it
            failures.append(f"{sid}: {type(exc).__name__}: {exc}")
    return {"turns": done, "errors": failures}


def check(store: turnkeeper.BaseStore, worker: str, count: int) -> None:
    """Assert that every turn of ``worker`` stored what :func:`turns` wrote."""
    for t in range(count):
        sid = f"{worker}-{t}"
        messages = store.sessions.replay(sid).messages
        assert [m["role"] for m in messages] == ["user", "assistant", "toolResult", "assistant"]
        assert messages[0]["content"] == f"list {t}" and messages[-1]["content"] == f"done {t}"
        (run,) = store.runs.list(sid)
        assert run.status == "succeeded"
        (record,) = store.tools.list(sid)
        assert (record.state, record.result) == ("completed", {"out": t})
        found = store.outbox.get_plan(f"{run.id}:delivery")
        assert found is not None
        assert [(o.status, o.provider_message_id) for o in found[1]] == [("delivered", f"m-{t}")]


if __name__ == "__main__":
    url, listen, worker, count = sys.argv[1:5]
    extra = {} if listen == "-" else {"listen_url": listen}
    with turnkeeper.open_store(url, **extra) as store:
        outcome = turns(store, worker, int(count))
    print(json.dumps(outcome))
