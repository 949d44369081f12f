"""A ledger record's stored digest binds everything replay yields or acts on
(attack on issue 19, F7): its tenant, session id, sequence, kind, idempotency
id, epoch and payload (``record_sha256``, see ``storage/ops/ledger/records.py``
``record_digest``). Before it, replay checked only the payload against its
sha256, the sequence and the epoch: a blob pointer relabelled as a ``note``
replayed as the pointer's JSON, ``ledger verify`` said ok and GC then deleted
the blob; a note turned into a fence, a changed idempotency id, two payloads
swapped between sequences, a row copied from another session or tenant all
replayed as verified records. A pointer's fields are validated too: its size
a non-negative int (not a bool) equal to the blob's length, its key the
record's own tenant's and session's. Each damage here fails closed, typed
(``ReplayDecodeError`` with the sequence) on every path that reads the ledger:
replay, ``ledger verify``'s check, the workspace lookups, catalog repair, the
command log and GC's reference scan (``GCScanError``; nothing deleted).

The damages are forged around the store with SQL. A pointer damage is forged
consistently (payload, its sha256 and, where the schema has it, the record
digest recomputed), so that what fails it is the pointer's own check, not the
record digest; the controls patch each new check out and see the damage pass.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import (
    BACKENDS,
    forge,
    ledger_payload,
    new_pg_schema,
    open_pg,
    stored_ledger_payload,
)

from turnkeeper import (
    CommandApplicationNotFoundError,
    GCScanError,
    PayloadAuthenticationError,
    ReplayDecodeError,
    WorkspaceJournalScanError,
)
from turnkeeper.cli.ledger import verify_session
from turnkeeper.cli.main import cli
from turnkeeper.spec.ledger import CommandApplication

TTL = 30.0
THRESHOLD = 64
S = "s"


def _h(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def seal(tenant: str, sid: str, seq: int, kind: str, rid: str, epoch: int, payload_sha: str) -> str:
    """The record digest as the README's ledger section defines it, computed
    here independently of the package (the canonical form is part of the
    stored format)."""
    lines = [
        "turnkeeper-ledger-record/1",
        _h(tenant),
        _h(sid),
        str(seq),
        _h(kind),
        _h(rid),
        str(epoch),
        payload_sha,
    ]
    return _h("\n".join(lines))


def has_digest(store: Any) -> bool:
    cols = store.query(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'ledger_records'"
    ).to_pylist()
    return "record_sha256" in {c["column_name"] for c in cols}


def row(store: Any, seq: int, sid: str = S, tenant: str = "") -> dict[str, Any]:
    rows = store.query(
        "SELECT * FROM ledger_records WHERE tenant = ? AND session_id = ? AND seq = ?",
        [tenant, sid, seq],
    ).to_pylist()
    assert len(rows) == 1, (tenant, sid, seq)
    return dict(rows[0])


def set_cols(store: Any, seq: int, values: dict[str, Any], sid: str = S) -> None:
    """Set ``values`` (column → value) on record ``seq`` of ``sid`` (tenant '')."""
    sets = ", ".join(f"{c} = ?" for c in values)
    forge(
        store,
        f"UPDATE ledger_records SET {sets} WHERE tenant = '' AND session_id = ? AND seq = ?",
        [*values.values(), sid, seq],
        rows=1,
    )


def reseal(store: Any, seq: int, payload: bytes) -> None:
    """Forge record ``seq`` of ``s`` consistently: ``payload``, its sha256 and
    (where the schema has one) its record digest."""
    r = row(store, seq)
    values: dict[str, Any] = {
        "payload": stored_ledger_payload(store, S, seq, payload),
        "payload_sha256": _h(payload),
    }
    if has_digest(store):
        values["record_sha256"] = seal(
            "", S, seq, r["kind"], r["idempotency_id"], r["epoch"], _h(payload)
        )
    set_cols(store, seq, values)


def _pointer(store: Any, seq: int, sid: str = S, tenant: str = "") -> dict[str, Any]:
    r = row(store, seq, sid, tenant)
    assert r["kind"] == "blobptr"
    return dict(json.loads(ledger_payload(store, seq, sid, tenant, stored=bytes(r["payload"]))))


def _moved(store: Any, r: dict[str, Any], seq: int, sid: str, to_seq: int) -> bytes:
    """Row ``r``'s payload (record ``seq`` of ``sid``) as a forger who holds
    the key stores it at ``to_seq`` of ``s``: opened, sealed again for its new
    place in a sealed store (a bare move fails authentication first:
    ``test_ledger_encryption``), so the digest checks are what refuse it."""
    clear = ledger_payload(store, seq, sid, stored=bytes(r["payload"]))
    return stored_ledger_payload(store, S, to_seq, clear)


def build(store: Any, ledger: Any, sid: str, upper: bool = False) -> None:
    """``sid``: fence 1, note 2, big (offloaded, id i3) 3, note 4; fence 5, note 6."""
    if store.sessions.get(sid) is None:
        store.sessions.create(sid)
    words = [w.upper() if upper else w for w in ("two", "four", "six")]
    lease = store.leases.acquire(f"session:{sid}", "w1", TTL)
    with ledger.open(sid, lease) as w:
        w.append("note", words[0].encode(), "i2")
        w.append("big", (b"D" if upper else b"B") * 100, "i3")
        w.append("note", words[1].encode(), "i4")
    store.leases.release(lease)
    lease = store.leases.acquire(f"session:{sid}", "w2", TTL)
    with ledger.open(sid, lease) as w:
        w.append("note", words[2].encode(), "i6")
    store.leases.release(lease)


def world(store: Any) -> Any:
    """``s`` and a donor ``d`` of the same shape (other payloads, the same ids),
    and tenant ``acme``'s ``s`` likewise; the default tenant's ledger."""
    ledger = store.ledger.with_blobs(offload_threshold=THRESHOLD)
    build(store, ledger, S)
    build(store, ledger, "d", upper=True)
    build(store, ledger.with_tenant("acme"), S, upper=True)
    return ledger


def _copy_from(store: Any, seq: int, sid: str, tenant: str) -> None:
    donor = row(store, seq, sid, tenant)
    cols = ["kind", "idempotency_id", "payload", "payload_sha256"]
    if has_digest(store):
        cols.append("record_sha256")
    donor["payload"] = _moved(store, donor, seq, sid, seq)
    set_cols(store, seq, {c: donor[c] for c in cols})


def _swap(store: Any) -> None:
    a, b = row(store, 2), row(store, 4)
    a["payload"], b["payload"] = _moved(store, a, 2, S, 4), _moved(store, b, 4, S, 2)
    cols = ["payload", "payload_sha256"] + (["record_sha256"] if has_digest(store) else [])
    set_cols(store, 2, {c: b[c] for c in cols})
    set_cols(store, 4, {c: a[c] for c in cols})


def _pointer_as(store: Any, **fields: Any) -> None:
    body = json.dumps({**_pointer(store, 3), **fields}, sort_keys=True).encode()
    reseal(store, 3, body)


DAMAGES: dict[str, tuple[int, Callable[[Any], None]]] = {
    # name: (the sequence that must fail, the damage)
    "pointer_relabelled_note": (3, lambda st: set_cols(st, 3, {"kind": "note"})),
    "note_turned_fence": (2, lambda st: set_cols(st, 2, {"kind": "fence"})),
    "idempotency_id_changed": (4, lambda st: set_cols(st, 4, {"idempotency_id": "forged"})),
    "payloads_swapped": (2, _swap),
    "row_copied_from_another_session": (2, lambda st: _copy_from(st, 2, "d", "")),
    "row_copied_from_another_tenant": (2, lambda st: _copy_from(st, 2, S, "acme")),
    "pointer_to_another_sessions_blob_same_id": (
        3,
        lambda st: reseal(st, 3, json.dumps(_pointer(st, 3, "d"), sort_keys=True).encode()),
    ),
    "pointer_to_another_tenants_blob_same_id": (
        3,
        lambda st: reseal(st, 3, json.dumps(_pointer(st, 3, S, "acme"), sort_keys=True).encode()),
    ),
    # larger than the blob: a smaller size reads size + 1 bytes, whose hash
    # fails first (BlobIntegrityError: test_ledger_blob_keys)
    "pointer_size_wrong": (3, lambda st: _pointer_as(st, size=_pointer(st, 3)["size"] + 10)),
    "pointer_size_negative": (3, lambda st: _pointer_as(st, size=-5)),
    "pointer_size_bool": (3, lambda st: _pointer_as(st, size=True)),
}


FOUND_ON_FETCH = {"pointer_size_wrong"}
"""Damage only a fetch of the blob can see (GC lists and scans, never fetches)."""


def _blob_count(store: Any) -> int:
    return int(store.query("SELECT count(*) AS n FROM ledger_blobs").to_pylist()[0]["n"])


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_record_fails_closed_everywhere_the_ledger_is_read(store, damage):
    """Before the fix (main 4e49e5f), every damage replayed silently: the
    replay returned 6 records and pytest printed ``Failed: DID NOT RAISE
    <class 'turnkeeper.spec.errors.ReplayDecodeError'>``."""
    ledger = world(store)
    seq, forge_it = DAMAGES[damage]
    forge_it(store)
    with pytest.raises(ReplayDecodeError) as err:
        list(ledger.replay(S))
    assert (err.value.session_id, err.value.seq) == (S, seq)
    # ledger verify's check (the CLI's verify_session): DAMAGED, named
    found = verify_session(store, "", None, S)
    assert (found.error, found.seq) == ("ReplayDecodeError", seq), found
    # the workspace lookups and catalog repair read the verified replay
    with pytest.raises(WorkspaceJournalScanError) as scan:
        ledger.workspace_live_refs([S])
    assert isinstance(scan.value.__cause__, ReplayDecodeError)
    with pytest.raises(ReplayDecodeError):
        ledger.catalog.repair(S)
    # GC fails closed and deletes nothing
    blobs = _blob_count(store)
    lease = store.leases.acquire(f"session:{S}", "gc", TTL)
    ledger.open(S, lease).close()
    if damage in FOUND_ON_FETCH:  # the pointer still names its own blob: GC keeps it
        assert ledger.gc(S, lease).deleted == 0
    else:
        with pytest.raises(GCScanError) as gc_err:
            ledger.gc(S, lease)
        assert isinstance(gc_err.value.__cause__, ReplayDecodeError)
        assert gc_err.value.__cause__.seq == seq
    assert _blob_count(store) == blobs


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A database for the CLI: a DuckDB file, or a fresh PostgreSQL schema's URL."""
    return str(tmp_path / "cli.duckdb") if request.param == "duckdb" else new_pg_schema()


def _open_db(url: str) -> Any:
    import turnkeeper

    return turnkeeper.open_store(url) if "://" not in url else open_pg(url)


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_ledger_verify_exits_1_naming_each_damage(db, damage):
    """``turnkeeper ledger verify s``: exit 1 and ``DAMAGED s: ReplayDecodeError
    at seq N``. Before the fix it printed ``ok s: 6 records, …`` and exited 0
    for every damage here."""
    with _open_db(db) as store:
        world(store)
        DAMAGES[damage][1](store)
    r = CliRunner().invoke(cli, ["ledger", "verify", S, "--db", db], catch_exceptions=False)
    assert r.exit_code == 1, r.output
    seq = DAMAGES[damage][0]
    assert r.stdout.startswith(f"DAMAGED s: ReplayDecodeError at seq {seq}: "), r.stdout


def test_an_undamaged_ledger_replays_whole_and_gc_keeps_its_blob(store):
    """The fixture's ledger itself verifies: the damage tests fail for the damage."""
    ledger = world(store)
    got = [(r.seq, r.kind, r.idempotency_id, r.payload) for r in ledger.replay(S)]
    assert got == [
        (1, "fence", got[0][2], b""),
        (2, "note", "i2", b"two"),
        (3, "big", "i3", b"B" * 100),
        (4, "note", "i4", b"four"),
        (5, "fence", got[4][2], b""),
        (6, "note", "i6", b"six"),
    ]
    assert verify_session(store, "", None, S).ok
    lease = store.leases.acquire(f"session:{S}", "gc", TTL)
    ledger.open(S, lease).close()
    result = ledger.gc(S, lease)
    assert (result.referenced, result.deleted) == (1, 0)


def _commands(store: Any) -> Any:
    ledger = store.ledger
    store.sessions.create(S)
    writer = ledger.open(S, store.leases.acquire(f"session:{S}", "w", TTL))
    log = ledger.command_log(S, writer)
    for n in (1, 2):
        log.append_command_application(CommandApplication(f"cmd-{n}", {"turn": n}))
    return ledger


def test_the_command_log_refuses_an_application_swapped_from_another_seq(store):
    """Before the fix, ``read_command_application_at(2)`` returned cmd-2 (the
    payload swapped in from seq 3) as the application at seq 2: pytest printed
    ``Failed: DID NOT RAISE <class '...CommandApplicationNotFoundError'>``."""
    ledger = _commands(store)
    assert ledger.read_command_application_at(S, 2).command_id == "cmd-1"
    _swap_23(store)
    for seq in (2, 3):
        with pytest.raises(CommandApplicationNotFoundError) as err:
            ledger.read_command_application_at(S, seq)
        assert err.value.seq == seq
        assert isinstance(err.value.__cause__, ReplayDecodeError)


def _swap_23(store: Any) -> None:
    a, b = row(store, 2), row(store, 3)
    a["payload"], b["payload"] = _moved(store, a, 2, S, 3), _moved(store, b, 3, S, 2)
    cols = ["payload", "payload_sha256"] + (["record_sha256"] if has_digest(store) else [])
    set_cols(store, 2, {c: b[c] for c in cols})
    set_cols(store, 3, {c: a[c] for c in cols})


# -- controls: each new check patched out, the damage passes -----------------------


@pytest.mark.parametrize(
    "damage",
    [
        "pointer_relabelled_note",
        "note_turned_fence",
        "idempotency_id_changed",
        "payloads_swapped",
        "row_copied_from_another_session",
        "row_copied_from_another_tenant",
    ],
)
def test_control_without_the_record_digest_check_the_damage_replays(store, damage, monkeypatch):
    from turnkeeper.storage.ops.ledger import records

    monkeypatch.setattr(records, "record_sealed", lambda *a: True)
    ledger = world(store)
    DAMAGES[damage][1](store)
    assert len(list(ledger.replay(S))) == 6
    if damage == "pointer_relabelled_note":  # and GC deletes the blob it still names
        lease = store.leases.acquire(f"session:{S}", "gc", TTL)
        ledger.open(S, lease).close()
        assert ledger.gc(S, lease).deleted == 1


def test_control_without_the_record_digest_check_the_command_log_reads_a_swap(store, monkeypatch):
    from turnkeeper.storage.ops.ledger import records

    monkeypatch.setattr(records, "record_sealed", lambda *a: True)
    ledger = _commands(store)
    _swap_23(store)
    assert ledger.read_command_application_at(S, 2).command_id == "cmd-2"


@pytest.mark.parametrize(
    ("damage", "guard"),
    [
        ("pointer_to_another_sessions_blob_same_id", "pointer_in_ledger"),
        ("pointer_to_another_tenants_blob_same_id", "pointer_in_ledger"),
        ("pointer_size_wrong", "size_matches"),
        ("pointer_size_negative", "size_valid"),
        ("pointer_size_bool", "size_valid"),
    ],
)
def test_control_without_the_pointer_checks_the_damage_replays(store, damage, guard, monkeypatch):
    from turnkeeper.storage.ops.ledger import blobs

    monkeypatch.setattr(blobs, guard, lambda *a: True)
    ledger = world(store)
    if guard == "size_valid":  # a negative size passes the ceiling; the length check too,
        monkeypatch.setattr(blobs, "size_matches", lambda *a: True)
        whole = type(ledger.blobs).get  # and the read bounded by the size reads it whole

        def unbounded(self: Any, key: str, max_bytes: int | None = None) -> bytes:
            return bytes(whole(self, key))

        monkeypatch.setattr(type(ledger.blobs), "get", unbounded)
    DAMAGES[damage][1](store)
    if damage == "pointer_to_another_sessions_blob_same_id" and store.db.keyring.encrypted:
        # sealed: d's blob is sealed under d's data key, for d: opened for s it
        # fails authentication, the pointer check patched out or not
        with pytest.raises(PayloadAuthenticationError) as err:
            list(ledger.replay(S))
        assert (err.value.session_id, err.value.field) == (S, "data")
        return
    records = list(ledger.replay(S))
    assert len(records) == 6 and records[2].kind == "big"


# -- the upgrade: records written at schema 23 get their digest in migration 25 -------


def _old_ledger(store: Any) -> dict[str, str]:
    """What a schema-23 turnkeeper wrote: ``s`` (a pointer among notes), ``d``,
    and tenant ``acme``'s ``s``, with non-ASCII ids and kinds (the migration's
    SQL hashes their UTF-8 like the package does)."""
    world(store)
    acme = store.ledger.with_tenant("acme")
    store.sessions.create("sé")
    lease = store.leases.acquire("session:sé", "w", TTL)
    with acme.open("sé", lease) as w:
        w.append("nöte", "héllo ✓".encode(), "ïd-1")
    return {}


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_a_ledger_written_at_schema_23_replays_after_the_upgrade_and_damage_still_fails(
    backend, tmp_path, monkeypatch
):
    """Before migration 25 computed the digests of the records already stored,
    a schema-23 ledger opened by this turnkeeper would have failed every
    record (no digest); and a damage forged before the upgrade must still fail
    after it (the digest binds the stored payload_sha256, not the payload)."""
    from older_stores import store_at

    import turnkeeper

    where = store_at(backend, 23, tmp_path, monkeypatch, _old_ledger)
    # a damage forged into the old store before the upgrade: the payload of d's seq 4
    damage = "UPDATE ledger_records SET payload = ? WHERE session_id = 'd' AND seq = 4"
    if backend == "postgres":
        import psycopg

        with psycopg.connect(where) as con:
            assert con.execute("SELECT max(version) FROM schema_migrations").fetchone() == (23,)
            assert con.execute(damage.replace("?", "%s"), [b"fouR"]).rowcount == 1
    else:
        import duckdb

        with duckdb.connect(where) as con:
            assert con.execute("SELECT max(version) FROM schema_migrations").fetchone() == (23,)
            assert con.execute(damage, [b"fouR"]).fetchone() == (1,)
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
        ledger = store.ledger.with_blobs(offload_threshold=THRESHOLD)
        got = [(r.seq, r.kind, r.idempotency_id, r.payload) for r in ledger.replay(S)]
        assert [g[1:] for g in got[1:4]] == [
            ("note", "i2", b"two"),
            ("big", "i3", b"B" * 100),
            ("note", "i4", b"four"),
        ]
        assert len(got) == 6
        acme = store.ledger.with_tenant("acme")
        assert [(r.kind, r.idempotency_id, r.payload) for r in acme.replay("sé")][1:] == [
            ("nöte", "ïd-1", "héllo ✓".encode())
        ]
        assert len(list(acme.replay(S))) == 6
        with pytest.raises(ReplayDecodeError) as err:  # the damage stays found
            list(ledger.replay("d"))
        assert err.value.seq == 4
        # the upgraded records are bound like new ones: a relabel fails
        set_cols(store, 3, {"kind": "note"})
        with pytest.raises(ReplayDecodeError) as err:
            list(ledger.replay(S))
        assert err.value.seq == 3
        # and the ledger goes on: a new writer appends, replay verifies old and new
        set_cols(store, 3, {"kind": "blobptr"})
        lease = store.leases.acquire(f"session:{S}", "w3", TTL)
        with ledger.open(S, lease) as w:
            w.append("note", b"eight", "i8")
        assert [r.payload for r in ledger.replay(S)][-1] == b"eight"


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_control_without_the_migrations_digests_an_old_ledger_fails_closed(
    backend, tmp_path, monkeypatch
):
    """Control: with version 25's dialect part (the UPDATE computing the stored
    records' digests) cut, the old records carry no digest ('') and the first
    one fails: the upgrade test above passes for the migration's SQL, whose
    digest is the package's."""
    from older_stores import _database, store_at

    import turnkeeper
    from turnkeeper.storage.migrations import load

    where = store_at(backend, 23, tmp_path, monkeypatch, _old_ledger)
    db = _database(backend)
    cut = [(v, sql) if v != 25 else (25, dict(load())[25]) for v, sql in db.MIGRATIONS]
    monkeypatch.setattr(db.Database, "migrations", lambda self: cut)
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == db.MIGRATIONS[-1][0]
        with pytest.raises(ReplayDecodeError) as err:
            list(store.ledger.replay(S))
        assert err.value.seq == 1 and "record digest" in str(err.value)
