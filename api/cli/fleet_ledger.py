"""The demo workers' turns in the ledger (``store.ledger``): what a worker of
:mod:`.fleet` appends, under its session lease, as a turn goes.

After admitting a run, the worker opens the session's ledger writer (its
fence record, the lease's epoch) and appends, in one batch, the
``session_started`` record (idempotency id ``session_started``, its payload
the session's creation time: every worker writes the same one, so all but
the first are duplicates) and ``turn_started`` (the prompt as the user
text). A tool call adds a ``step_done``; the run's end adds a last
``step_done`` with the reply's usage and ``turn_done``, in one batch. A crash
appends nothing more (the turn stays active in the catalog); a stalled
worker's append with its expired lease must be refused. The kinds and
payloads are the catalog's (:mod:`turnkeeper.spec.catalog`), so the catalog
fills in; idempotency ids are ``<run id>:<what>``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from turnkeeper.spec.ledger import LedgerEntry
from turnkeeper.spec.records import Lease, Run
from turnkeeper.storage import BaseStore
from turnkeeper.storage.audit import Check
from turnkeeper.storage.ops.ledger import LedgerWriter

if TYPE_CHECKING:
    from .fleet import WorkerStats

LATE = ":step:late"
"""The end of a stalled worker's late ``step_done``'s idempotency id."""

LOOP_ID = "main"
"""The loop every demo step belongs to."""


def _entry(kind: str, body: dict[str, Any], rid: str) -> LedgerEntry:
    return LedgerEntry(kind, json.dumps(body, sort_keys=True).encode(), rid)


def _usage(usage: dict[str, int]) -> dict[str, int]:
    return {"input_tokens": usage["input"], "output_tokens": usage["output"]}


class TurnLedger:
    """One worker's ledger writes; ``created`` caches each session's creation
    time (the ``session_started`` payload)."""

    def __init__(self, store: BaseStore) -> None:
        self.store = store
        self.created: dict[str, str] = {}
        self.records = 0
        """Records this worker appended (duplicates not counted)."""

    def start(self, sid: str, lease: Lease, run: Run, prompt: str) -> LedgerWriter:
        """Open ``sid``'s writer under ``lease`` and append ``session_started``
        and ``turn_started``.

        Raises:
            LeaseLostError: the lease is not held (nothing written).
        """
        if sid not in self.created:
            session = self.store.sessions.get(sid)
            created = session.created_at if session is not None else None
            self.created[sid] = created.isoformat() if created is not None else ""
        writer = self.store.ledger.open(sid, lease)
        self._append(
            writer,
            [
                _entry(
                    "session_started",
                    {"created_at": self.created[sid], "agent_kind": "demo"},
                    "session_started",
                ),
                _entry(
                    "turn_started",
                    {"turn_id": run.turn_id, "user_text": prompt},
                    f"{run.id}:turn_started",
                ),
            ],
        )
        return writer

    def step(self, writer: LedgerWriter, run: Run, summary: str, usage: dict[str, int]) -> None:
        """A tool call's ``step_done``.

        Raises:
            LeaseLostError: the writer's lease was overtaken (nothing written).
        """
        body = {
            "loop_id": LOOP_ID,
            "turn_id": run.turn_id,
            "summary": summary,
            "usage": _usage(usage),
        }
        self._append(writer, [_entry("step_done", body, f"{run.id}:step:tool")])

    def done(self, writer: LedgerWriter, run: Run, summary: str, usage: dict[str, int]) -> None:
        """The reply's ``step_done`` and ``turn_done``, in one batch.

        Raises:
            LeaseLostError: the writer's lease was overtaken (nothing written).
        """
        step = {
            "loop_id": LOOP_ID,
            "turn_id": run.turn_id,
            "summary": summary,
            "usage": _usage(usage),
        }
        self._append(
            writer,
            [
                _entry("step_done", step, f"{run.id}:step:reply"),
                _entry("turn_done", {"turn_id": run.turn_id, "summary": summary}, f"{run.id}:done"),
            ],
        )

    def stale(self, writer: LedgerWriter, run: Run) -> None:
        """A stalled worker's late ``step_done`` (must be refused).

        Raises:
            LeaseLostError: refused, as it must be.
        """
        body = {"loop_id": LOOP_ID, "turn_id": run.turn_id, "summary": "late"}
        self._append(writer, [_entry("step_done", body, f"{run.id}{LATE}")])

    def _append(self, writer: LedgerWriter, entries: list[LedgerEntry]) -> None:
        results = writer.append_many(entries)
        self.records += sum(not r.duplicate for r in results)


def late_records(store: BaseStore, sessions: list[str]) -> list[str]:
    """The idempotency ids of stalled workers' late records stored in the
    ledgers of ``sessions``: every one was refused, so this must be empty."""
    found = store.query(
        "SELECT idempotency_id FROM ledger_records WHERE session_id IN "
        "(SELECT unnest(?::VARCHAR[])) AND idempotency_id LIKE ? ORDER BY idempotency_id",
        [sessions, f"%{LATE}"],
    ).to_pylist()
    return [str(r["idempotency_id"]) for r in found]


def late_check(store: BaseStore, sessions: list[str], stats: Sequence[WorkerStats]) -> Check:
    """The demo's audit check ``stale_ledger_appends_absent``: no late record
    (:func:`late_records`) was stored, out of the refused ones."""
    late = late_records(store, sessions)
    return Check(
        "stale_ledger_appends_absent",
        "no ledger record a stalled worker saw refused was stored",
        len(late),
        sum(s.stale_ledger_appends_fenced for s in stats),
        ", ".join(late[:3]),
    )
