"""The audit's ledger checks (``store.ledger``), over every tenant's ledgers of
the sessions in scope:

- ``ledger_tips_match_records``: each ledger's tip (``ledger_tips``) is its
  last record's sequence, its records are 1 … tip (as many as the tip), and
  the tip's epoch is its newest fence record's: read in the audit's snapshot;
- ``ledgers_verify``: each ledger replays whole and verified, as
  ``turnkeeper ledger verify`` does (hashes, sequence, fences, blob pointers
  and blobs in the database's table; a sealed ledger's payloads and blobs
  opened first, a value failing authentication is damage); the damage is
  named (error class, sequence, blob key). A store opened without its key
  verifies its clear ledgers; the sealed ones are said, not counted;
- ``ledger_catalog_lists_sessions``: the catalog lists each ledger's session
  (``catalog.list_sessions``, the catalog alone), readable, with the ledger's
  tip as the last sequence folded.

The last two read through ``store.ledger`` (a replay is many reads), after
the snapshot's checks: for a store other processes are still writing to,
they see it as it is then (``ledgers_verify`` replays each ledger up to the
tip it reads when it starts; a catalog entry may then trail an append in
flight).
"""

from __future__ import annotations

from turnkeeper.spec import errors
from turnkeeper.storage import BaseStore
from turnkeeper.storage.store import Snapshot

from .base import Check, Scope, one_line, sample
from .base import rows as query_rows
from .verify import describe_verified, verify_ledger


def check_ledger_tips(store: Snapshot, scope: Scope) -> Check:
    """``ledger_tips_match_records`` (see the module docstring)."""
    within = scope.sessions_in
    sql = f"""
    WITH {scope.cte()},
    r AS (SELECT tenant, session_id, count(*) AS n, max(seq) AS mx FROM ledger_records
          WHERE {within("session_id")} GROUP BY tenant, session_id),
    f AS (SELECT tenant, session_id, epoch,
                 row_number() OVER (PARTITION BY tenant, session_id ORDER BY seq DESC) AS rn
          FROM ledger_records WHERE kind = 'fence' AND {within("session_id")}),
    t AS (SELECT tenant, session_id, seq, epoch FROM ledger_tips WHERE {within("session_id")}),
    k AS (SELECT tenant, session_id FROM r UNION SELECT tenant, session_id FROM t)
    SELECT k.tenant, k.session_id,
           (t.seq IS DISTINCT FROM r.mx OR r.n IS DISTINCT FROM r.mx
            OR t.epoch IS DISTINCT FROM f.epoch) AS bad
    FROM k
    LEFT JOIN r ON r.tenant = k.tenant AND r.session_id = k.session_id
    LEFT JOIN t ON t.tenant = k.tenant AND t.session_id = k.session_id
    LEFT JOIN f ON f.tenant = k.tenant AND f.session_id = k.session_id AND f.rn = 1
    ORDER BY k.tenant, k.session_id
    """
    found = query_rows(store, sql, scope.params())
    bad = [_name(r["tenant"], r["session_id"]) for r in found if r["bad"]]
    return Check(
        "ledger_tips_match_records",
        "each ledger's tip is its last record's sequence and its newest fence's epoch, "
        "with records 1 … tip",
        len(bad),
        len(found),
        sample(bad),
    )


def _name(tenant: str, session_id: str) -> str:
    return f"{tenant}/{session_id}" if tenant else session_id


def _ledgers(store: BaseStore, scope: Scope) -> list[tuple[str, str, int]]:
    """``(tenant, session id, tip)`` of every ledger in scope."""
    found = store.query(
        f"WITH {scope.cte()} SELECT tenant, session_id, seq FROM ledger_tips "
        f"WHERE {scope.sessions_in('session_id')} ORDER BY tenant, session_id",
        scope.params(),
    ).to_pylist()
    return [(str(r["tenant"]), str(r["session_id"]), int(r["seq"])) for r in found]


def check_ledgers_verify(store: BaseStore, scope: Scope) -> Check:
    """``ledgers_verify`` (see the module docstring)."""
    damaged = []
    sealed: list[str] = []
    ledgers = _ledgers(store, scope)
    keyless = store.db.keyring.provider is None
    for tenant, sid, _ in ledgers:
        try:
            v = verify_ledger(store.ledger.with_tenant(tenant), sid, keyless=keyless)
        except errors.KeyUnavailableError as exc:
            if keyless:
                sealed.append(_name(tenant, sid))
            else:
                damaged.append(f"{_name(tenant, sid)}: {type(exc).__name__}: {one_line(str(exc))}")
            continue
        if not v.ok:
            found = describe_verified(v).removeprefix(f"DAMAGED {sid}: ")
            damaged.append(f"{_name(tenant, sid)}: {found}")
    detail = sample(damaged)
    if not damaged and sealed:
        detail = (
            f"{len(sealed)} ledger(s) are sealed and the store was opened without its key "
            "(--key-file or $TURNKEEPER_MASTER_KEY): not verified"
        )
    return Check(
        "ledgers_verify",
        "every ledger replays whole and verified (hashes, sequence, fences, blobs)",
        len(damaged),
        len(ledgers) - len(sealed),
        detail,
    )


def catalog_within(tip_before: int, folded: int, tip_after: int) -> bool:
    """``ledger_catalog_lists_sessions``' test: the entry's cursor, listed
    between two reads of the ledger's tip, lies between them."""
    return tip_before <= folded <= tip_after


def check_catalog(store: BaseStore, scope: Scope) -> Check:
    """``ledger_catalog_lists_sessions`` (see the module docstring)."""
    ledgers = _ledgers(store, scope)
    bad: list[str] = []
    for tenant in sorted({t for t, _, _ in ledgers}):
        unreadable: list[errors.CatalogReadError] = []
        catalog = store.ledger.with_tenant(tenant).catalog
        listed = {m.session_id: m for m in catalog.list_sessions(on_unreadable=unreadable.append)}
        broken = {e.session_id for e in unreadable}
        # The tips again, read after the listing: each entry is updated in its
        # append's transaction, so a ledger written meanwhile has its entry
        # between the two tips read, never outside them (behind: lagging;
        # ahead: a tail lost with its tip).
        after = {(t, s): tip for t, s, tip in _ledgers(store, scope)}
        for t, sid, tip in ledgers:
            if t != tenant:
                continue
            meta = listed.get(sid)
            if sid in broken:
                bad.append(f"{_name(t, sid)} (unreadable)")
            elif meta is None:
                bad.append(f"{_name(t, sid)} (not listed)")
            elif not catalog_within(tip, meta.last_journal_seq, after.get((t, sid), tip)):
                bad.append(f"{_name(t, sid)} (folded {meta.last_journal_seq} of {tip})")
    return Check(
        "ledger_catalog_lists_sessions",
        "the catalog lists each ledger's session, folded up to its tip",
        len(bad),
        len(ledgers),
        sample(bad),
    )


def ledger_checks(store: BaseStore, scope: Scope) -> list[Check]:
    """The checks that read through ``store.ledger`` (after the snapshot's)."""
    return [check_ledgers_verify(store, scope), check_catalog(store, scope)]
