"""Each fence, patched out in the test only, makes the stateful machine fail.

Nothing in the package can disable a fence: each test monkeypatches one
piece of the DuckDB backend (or the spec's guard) with a weakened copy.
Two kinds of test per fence:

- **replay**: the counterexample the machine found, stored here as its
  steps, is replayed on the patched store and must fail with an
  ``AssertionError`` (an oracle disagreement or a broken invariant), and
  pass on the real store. Fast and deterministic: CI never searches for it.
- **search** (``search``, on demand: ``HYPOTHESIS_PROFILE=nightly``):
  Hypothesis, derandomized, must find a counterexample by itself within its
  example budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from by_hand import Steps, kill_tests, search_test
from conftest import BACKENDS, opener

from turnkeeper.fuzz.leases import LeaseAndThreadMachine, machine
from turnkeeper.spec import LEASE
from turnkeeper.storage.backend import Tx
from turnkeeper.storage.ops import appends, leases, threads


def make_machine(backend: str) -> type[LeaseAndThreadMachine]:
    """The machine on the test store configuration ``backend`` (``conftest.opener``)."""
    return machine(opener(backend))


def target_only_fence(value: Callable[[str], str]) -> str:
    """The lease fence's identity condition (``leases.fence_condition``, which
    every fenced write uses) with only its target compared: no epoch, token or
    owner check (test-only copy; their parameters stay bound, to nothing). A
    forged token beside the right epoch and owner is
    ``test_forged_tokens.py``'s."""
    unused = " AND ".join(f"CAST({value(c)} AS VARCHAR) IS NOT NULL" for c in leases.FENCED[1:])
    return f"leases.target = {value('target')} AND {unused} AND leases.state = 'held'"


def without_expiry_check(mp: pytest.MonkeyPatch) -> None:
    """The fence's expiry judgement patched out: ``leases.unexpired`` (every
    fenced write in a transaction, and DuckDB's merged appends) passes any
    expiry, and so does the one-statement append's SQL (its ``?`` still bound)."""
    mp.setattr(leases, "unexpired", lambda tx, target, expires_at, server_now=None: tx.now)
    bound = "(?::TIMESTAMPTZ IS NULL OR TRUE)"
    mp.setattr(appends, "FENCE_UNEXPIRED", f"(o.expires_at IS NOT NULL AND {bound})")


def weak_renew(tx: Tx, lease, ttl_s: float):
    """Renew without the expiry (and state) check."""
    tx.exec(
        f"UPDATE leases SET expires_at = {leases.NOW} + ?::BIGINT * INTERVAL '1 microsecond' "
        "WHERE target = ? AND epoch = ? AND token_digest = ?",
        [tx.now, int(ttl_s * 1e6), lease.target, lease.epoch, leases.digest(lease.token)],
    )
    return lease


def finalize_without_key_cas(tx: Tx, req, columns):
    return REAL_FINALIZE(tx, dataclasses.replace(req, require_key_absent=False), columns)


REAL_FINALIZE = threads.finalize


def without_engine_guard(mp: pytest.MonkeyPatch, index: str) -> None:
    """PostgreSQL's migrations without the partial unique index ``index`` (test-only),
    so that a kill of the domain fence behind it is not caught by the engine first."""
    from turnkeeper.storage.postgres import db as pg_db

    trimmed = [
        (v, ";".join(s for s in sql.split(";") if f"INDEX {index} " not in s))
        for v, sql in pg_db.MIGRATIONS
    ]
    assert trimmed != pg_db.MIGRATIONS, index
    mp.setattr(pg_db, "MIGRATIONS", trimmed)


def drop_archive(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(threads, "_archive", lambda tx, record_id, key: None)
    without_engine_guard(mp, "thread_records_one_active_per_key")


A1 = {"tgt": "session:s1", "purpose": "execution"}


def rebind_step(rid: str, *, require_absent: bool = False) -> tuple[str, dict]:
    """A finalize of ``rid`` on key k1 that rebinds the key, holding no lease."""
    args = {"held": [], "rid": rid, "key": "k1", "previous": None, "rebind": True}
    return ("finalize", {**args, "require_absent": require_absent})


# fence name -> (what to patch, the stored counterexample as machine steps)
KILLS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], list[tuple[str, dict]]]] = {
    "acquire-expiry-guard": (
        lambda mp: mp.setitem(LEASE.guards, "expired", (lambda facts: True, "patched")),
        [
            ("acquire", {"owner": "A", "ttl": 5.0, **A1}),
            ("acquire", {"owner": "B", "ttl": 5.0, **A1}),
        ],
    ),
    "fence-identity-check": (
        lambda mp: mp.setattr(leases, "fence_condition", target_only_fence),
        [
            ("acquire", {"owner": "A", "ttl": 1.0, **A1}),
            ("advance_clock", {"seconds": 2.0}),
            ("acquire", {"owner": "B", "ttl": 5.0, **A1}),
            ("append_under_lease", {"held": 0, "session": "s1"}),
        ],
    ),
    "fence-identity-check-batch": (
        lambda mp: mp.setattr(leases, "fence_condition", target_only_fence),
        [
            ("acquire", {"owner": "A", "ttl": 1.0, **A1}),
            ("advance_clock", {"seconds": 2.0}),
            ("acquire", {"owner": "B", "ttl": 5.0, **A1}),
            ("append_many_under_lease", {"held": 0, "session": "s1", "n": 3}),
        ],
    ),
    "fence-expiry-check-batch": (
        without_expiry_check,
        [
            ("acquire", {"owner": "A", "ttl": 1.0, **A1}),
            ("advance_clock", {"seconds": 2.0}),
            ("append_many_under_lease", {"held": 0, "session": "s1", "n": 2}),
        ],
    ),
    "lease-target-check": (
        lambda mp: mp.setattr(appends, "check_session_lease", lambda sid, lease: lease),
        [
            ("acquire", {"owner": "A", "ttl": 5.0, **A1}),
            ("append_under_lease", {"held": 0, "session": "s2"}),
        ],
    ),
    "lease-target-check-batch": (
        lambda mp: mp.setattr(appends, "check_session_lease", lambda sid, lease: lease),
        [
            ("acquire", {"owner": "A", "ttl": 5.0, **A1}),
            ("append_many_under_lease", {"held": 0, "session": "s2", "n": 2}),
        ],
    ),
    "fence-expiry-check": (
        without_expiry_check,
        [
            ("acquire", {"owner": "A", "ttl": 1.0, **A1}),
            ("advance_clock", {"seconds": 2.0}),
            ("append_under_lease", {"held": 0, "session": "s1"}),
        ],
    ),
    "renew-expiry-check": (
        lambda mp: mp.setattr(leases, "renew", weak_renew),
        [
            ("acquire", {"owner": "A", "ttl": 1.0, **A1}),
            ("advance_clock", {"seconds": 2.0}),
            ("renew", {"held": 0, "ttl": 1.0}),
        ],
    ),
    "require-key-absent": (
        lambda mp: mp.setattr(threads, "finalize", finalize_without_key_cas),
        [
            rebind_step("r1"),
            rebind_step("r2", require_absent=True),
        ],
    ),
    "archive-on-rebind": (
        drop_archive,
        [
            rebind_step("r1"),
            rebind_step("r2"),
        ],
    ),
}


def script(steps: list[tuple[str, dict]]) -> Callable[[Steps], None]:
    """The stored steps as a script for ``by_hand`` (every invariant checked after
    each); ``held`` names leases by the order they were granted."""

    def run(machine: Steps) -> None:
        held: list[object] = []
        for name, args in steps:
            args = dict(args)
            if "held" in args:
                args["held"] = (
                    [held[i] for i in args["held"]]
                    if isinstance(args["held"], list)
                    else held[args["held"]]
                )
            result = getattr(machine, name)(**args)
            if name == "acquire" and hasattr(result, "lease"):
                held.append(result)

    return run


(
    test_stored_counterexample_passes_on_the_real_store,
    test_stored_counterexample_fails_with_the_fence_patched_out,
) = kill_tests(
    {name: (patch, script(steps)) for name, (patch, steps) in KILLS.items()}, make_machine
)


test_machine_finds_a_counterexample_with_the_fence_patched_out = search_test(
    KILLS, make_machine, examples=3000, backends=BACKENDS
)


@pytest.mark.postgres
def test_on_postgres_the_engine_alone_refuses_a_second_active_record(monkeypatch):
    """Defence in depth: with only the domain's archive patched out, PostgreSQL's
    partial unique index still refuses the second active record for the key."""
    from conftest import open_backend

    import turnkeeper
    from turnkeeper.spec.records import FinalizeRequest, ThreadRecord

    monkeypatch.setattr(threads, "_archive", lambda tx, record_id, key: None)
    with open_backend("postgres", None, None) as store:
        store.threads.finalize(FinalizeRequest(ThreadRecord("r1", "k1"), rebind_active=True))
        with pytest.raises(turnkeeper.TransactionConflictError) as err:
            store.threads.finalize(FinalizeRequest(ThreadRecord("r2", "k1"), rebind_active=True))
        assert "thread_records_one_active_per_key" in str(err.value)
        rows = store.query("SELECT id FROM thread_records WHERE status = 'active'").to_pylist()
        assert rows == [{"id": "r1"}]
