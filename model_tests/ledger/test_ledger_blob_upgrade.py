"""Blobs a schema-23 turnkeeper stored in the database (keys
``[tenants/<tenant>/]sessions/<id>/<sha256>``, filed under the session id
parsed from the key's first ``sessions/``) after the upgrade to schema 24
(attack on issue 19, F4): their keys are kept and read as before, migration
0024 files each under its tenant and session again, so a session delete
takes its blobs and nothing else, and new blobs get keys of the new shape
beside them. On both backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from older_stores import store_at

import turnkeeper
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.ops.ledger import blobs as blob_ops

BIG = bytes(range(256)) * 2
LEDGERS = [("user-sessions", "s1"), ("", "s2"), ("acme/", "s3"), ("acme", "sessions/s3")]


def _legacy_prefix(tenant: str, session_id: str) -> str:
    """Schema 23's blob_prefix."""
    head = f"tenants/{tenant}/" if tenant else ""
    return f"{head}sessions/{session_id}/"


def _legacy_parse(key: str) -> tuple[str, str, str]:
    """Schema 23's DatabaseBlobs filing: the session id after the key's first
    ``sessions/`` (its key_session); no tenant column."""
    head, _, digest = key.rpartition("/")
    return "", head[head.find("sessions/") + len("sessions/") :], digest


def _written_by_schema_23(monkeypatch: pytest.MonkeyPatch) -> Any:
    def write(store: turnkeeper.BaseStore) -> dict[str, str]:
        with monkeypatch.context() as patch:
            patch.setattr(blob_ops, "blob_prefix", _legacy_prefix)
            patch.setattr(blob_ops, "parse_key", _legacy_parse)
            for tenant, sid in LEDGERS:
                if store.sessions.get(sid) is None:
                    store.sessions.create(sid)
                lease = store.leases.acquire(f"session:{sid}", "w", 60.0)
                ledger = store.ledger.with_tenant(tenant).with_blobs(offload_threshold=64)
                with ledger.open(sid, lease) as w:
                    w.append("turn", BIG + f"{tenant}|{sid}".encode(), "old")
                store.leases.release(lease)
        return {}

    return write


def _rows(store: turnkeeper.BaseStore) -> dict[str, tuple[str, str]]:
    got = store.query("SELECT key, tenant, session_id FROM ledger_blobs", []).to_pylist()
    return {r["key"]: (r["tenant"], r["session_id"]) for r in got}


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_blobs_of_schema_23_are_read_refiled_and_deleted_with_their_session(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without migration 0024's refiling, the blob of tenant ``user-sessions``
    stays filed under session ``sessions/s1``: deleting ``s1`` leaves it."""
    where = store_at(backend, 23, tmp_path, monkeypatch, _written_by_schema_23(monkeypatch))
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
        rows = _rows(store)
        assert sorted(rows.values()) == sorted(LEDGERS)
        for key, (tenant, sid) in rows.items():
            assert key.startswith(_legacy_prefix(tenant, sid))
        for tenant, sid in LEDGERS:
            ledger = store.ledger.with_tenant(tenant)
            assert [r.payload for r in ledger.replay(sid)][1:] == [BIG + f"{tenant}|{sid}".encode()]
        # a new blob beside the old one, in the new shape; GC keeps both
        lease = store.leases.acquire("session:s2", "w", 60.0)
        ledger = store.ledger.with_blobs(offload_threshold=64)
        with ledger.open("s2", lease) as w:
            w.append("turn", BIG + b"new", "new")
        result = ledger.gc("s2", lease)
        assert (result.scanned, result.referenced, result.deleted) == (1, 1, 0)
        replayed = [r.payload for r in ledger.replay("s2") if r.kind == "turn"]
        assert replayed == [BIG + b"|s2", BIG + b"new"]
        assert len([k for k in _rows(store) if k.startswith(blob_ops.ROOT)]) == 1
        store.leases.release(lease)
        # a session delete takes its blobs, old and new, and no other session's
        store.sessions.delete("s1")
        store.sessions.delete("s2")
        assert sorted(_rows(store).values()) == [("acme", "sessions/s3"), ("acme/", "s3")]
        assert [(c.name, c.detail) for c in run_audit(store) if not c.passed] == []
        store.sessions.delete("sessions/s3")
        assert sorted(_rows(store).values()) == [("acme/", "s3")]
