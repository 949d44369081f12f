"""The ledger's one entry check (``storage/ops/ledger/writer.py``
``check_entries``/``check_entry``, ``Ledger.check_entries``), run by every
write path before anything is written, on both backends: the writer's
``append``/``append_many`` (and the group commit they queue into), ``open``'s
``opening`` entries, the command log and ``turnkeeper ledger append``.

Each test failed before (attack round 2 on issue 19, attack19b-findings):
F6 a catalog kind's usage the fold refuses was accepted and froze the
session's catalog entry; F8 a refused CLI append left a fence record; F9 an
idempotency id shaped like a fence id was accepted and made the next open
spin on write-write conflicts; F10 deeply nested JSON was a bare
``RecursionError`` (a traceback from the CLI); F11 an opening entry skipped
the body ceiling.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import BACKENDS, new_pg_schema, open_pg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turnkeeper
from turnkeeper import (
    CatalogReadError,
    CommandApplication,
    CommandApplicationNotFoundError,
    DurableBodyTooLargeError,
    InvalidInputError,
    LedgerEntry,
    LedgerIdempotencyConflictError,
    ReplayDecodeError,
    TransactionConflictError,
    WorkspaceJournalScanError,
)
from turnkeeper.cli.main import cli
from turnkeeper.spec import catalog as c
from turnkeeper.spec.catalog import SessionMeta
from turnkeeper.spec.ledger import FENCE_ID_PREFIX, FENCE_KIND, MAX_PAYLOAD_DEPTH, fence_id
from turnkeeper.storage.ops.ledger import catalog_codec, catalog_fold, journal
from turnkeeper.storage.ops.ledger import writer as writer_mod

TTL = 30.0
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
STARTED = json.dumps({"created_at": T0.isoformat()}).encode()


def _j(**body: Any) -> bytes:
    return json.dumps(body).encode()


def _lease(store: Any, sid: str = "s") -> Any:
    return store.leases.acquire(f"session:{sid}", "w", TTL)


def _writer(store: Any, sid: str = "s") -> Any:
    store.sessions.create(sid)
    w = store.ledger.open(sid, _lease(store, sid))
    w.append("session_started", STARTED, "st")
    return w


def _deep(depth: int, kind: str = "turn_started") -> bytes:
    """A payload of ``kind`` whose extra member nests ``depth - 1`` arrays (the
    whole payload ``depth`` deep)."""
    head = {
        "workspace_checkpoint": b'{"ref":"r","event_id":"e","x":',
        "step_done": b'{"loop_id":"l","x":',
        "hustle_done": b'{"run_id":"r","name":"n","model_source":"named","status":"failed","x":',
    }.get(kind, b'{"turn_id":"t","x":')
    n = depth - 1
    return head + b"[" * n + b"]" * n + b"}"


def _unchecked(monkeypatch: Any) -> None:
    """Appends as before the check (a ledger an older version wrote)."""
    monkeypatch.setattr(writer_mod, "check_catalog_payload", lambda kind, payload, field: None)


BAD_USAGE = [
    ("step_done", b'{"loop_id": "l", "usage": {"input_tokens": -1}}', "usage.input_tokens"),
    ("step_done", b'{"loop_id": "l", "usage": {"input_tokens": NaN}}', "usage.input_tokens"),
    ("step_done", b'{"loop_id": "l", "usage": {"output_tokens": Infinity}}', "usage.output_tokens"),
    ("step_done", b'{"loop_id": "l", "usage": {"input_tokens": 1.5}}', "usage.input_tokens"),
    ("step_done", b'{"loop_id": "l", "usage": {"input_tokens": "3"}}', "usage.input_tokens"),
    ("step_done", b'{"loop_id": "l", "usage": {"input_tokens": true}}', "usage.input_tokens"),
    ("step_done", _j(loop_id="l", usage={"output_tokens": 2**63}), "usage.output_tokens"),
    ("step_done", b'{"loop_id": "l", "usage": [1, 2]}', "usage is not an object"),
    (
        "hustle_done",
        _j(run_id="r", name="n", model_source="named", status="failed", usage={"input_tokens": -2}),
        "usage.input_tokens",
    ),
    ("hustle_done", _j(run_id="r", name="n", model_source="named", status="won"), "won"),
]


# -- F6: a usage the catalog cannot fold ----------------------------------------------


@pytest.mark.parametrize(("kind", "payload", "named"), BAD_USAGE)
def test_an_append_refuses_a_usage_the_catalog_cannot_fold_and_the_entry_stays_current(
    store, kind, payload, named
):
    """F6: before, the append took it and every later catalog update, repair
    included, failed on it for good (the entry stuck at its old title)."""
    w = _writer(store)
    w.append("turn_started", _j(turn_id="t1", user_text="first"), "t1")
    with pytest.raises(InvalidInputError) as err:
        w.append(kind, payload, "bad")
    assert err.value.field == "entries[0].payload"
    assert named in err.value.reason, err.value.reason
    with pytest.raises(InvalidInputError):  # a batch with it: nothing of the batch written
        w.append_many([LedgerEntry("note", b"n", "n"), LedgerEntry(kind, payload, "bad")])
    with pytest.raises(InvalidInputError) as err:
        store.ledger.open("s", w.lease, opening=[LedgerEntry(kind, payload, "bad")])
    assert err.value.field == "opening[0].payload"
    assert store.ledger.tip("s") == 3
    w.append("turn_started", _j(turn_id="t2", user_text="second"), "t2")
    meta = store.ledger.catalog.read_meta("s")
    assert (meta.last_journal_seq, meta.title, meta.active_turn_id) == (4, "second", "t2")
    assert store.ledger.catalog.repair("s").title == "second"


def test_control_without_the_usage_check_the_entry_freezes(store, monkeypatch):
    """What the check prevents (the attack's f_catalog_frozen_by_bad_usage.py)."""
    seen: list[Exception] = []
    store.ledger.catalog.configure(on_update_failed=seen.append)
    _unchecked(monkeypatch)
    w = _writer(store)
    w.append("step_done", BAD_USAGE[0][1], "bad")
    w.append("turn_started", _j(turn_id="t2", user_text="second"), "t2")
    assert store.ledger.catalog.read_meta("s").last_journal_seq == 2 and seen
    with pytest.raises(turnkeeper.CatalogUsageError):
        store.ledger.catalog.repair("s")


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([0, 1, c.MAX_COUNT, c.MAX_COUNT + 1, -1]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.none(),
        st.text(max_size=4),
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=4,
    )


def _payloads() -> st.SearchStrategy[tuple[str, bytes]]:
    usage = st.one_of(
        _json_values(),
        st.fixed_dictionaries(
            {},
            optional={"input_tokens": _json_values(), "output_tokens": _json_values()},
        ),
    )
    context = st.one_of(
        st.none(),
        _json_values(),
        st.fixed_dictionaries({"tokens": _json_values(), "window": _json_values()}),
    )
    step = st.fixed_dictionaries(
        {"loop_id": st.sampled_from(["l", "", 3])},
        optional={"usage": usage, "context": context, "runtime": _json_values()},
    )
    hustle = st.fixed_dictionaries(
        {
            "run_id": st.sampled_from(["r", ""]),
            "name": st.just("n"),
            "model_source": st.sampled_from([*sorted(c.MODEL_SOURCES), "other"]),
            "status": st.sampled_from([*sorted(c.HUSTLE_STATUSES), "won"]),
        },
        optional={"usage": usage, "named_model_key": _json_values()},
    )
    return st.one_of(
        st.tuples(st.just("step_done"), step),
        st.tuples(st.just("hustle_done"), hustle),
        st.tuples(st.just("loop_started"), st.fixed_dictionaries({"loop_id": _json_values()})),
    ).map(lambda kb: (kb[0], json.dumps(kb[1], allow_nan=True).encode()))


def _lived() -> SessionMeta:
    """An entry that has seen a session start and some usage."""
    meta = SessionMeta("s")
    for seq, kind, body in [
        (1, "session_started", STARTED),
        (2, "step_done", _j(loop_id="l", usage={"input_tokens": 5, "output_tokens": 7})),
        (3, "hustle_done", _j(run_id="q", name="n", model_source="current_loop", status="failed")),
    ]:
        meta = catalog_fold.fold(meta, seq, kind, body, T0)
    return meta


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_payloads())
def test_every_payload_the_fold_refuses_the_append_refuses(kind_payload):
    """The check is the fold's own validation: a payload the catalog's fold
    refuses on a fresh entry is refused by the append, typed, its cause the
    fold's error; one the append takes folds into a lived entry too (only a
    total past ``MAX_COUNT``, which no single payload reaches here, could
    refuse it there)."""
    kind, payload = kind_payload
    try:
        catalog_fold.fold(SessionMeta("-"), 1, kind, payload, T0)
        refused = None
    except turnkeeper.TurnkeeperError as bad:
        refused = bad
    try:
        writer_mod.check_entry(LedgerEntry(kind, payload, "x"), "e")
        taken = True
    except InvalidInputError as err:
        taken = False
        assert type(err.__cause__) is type(refused), (payload, err)
    assert taken == (refused is None), (payload, refused)
    if taken:
        catalog_codec.encode(catalog_fold.fold(_lived(), 4, kind, payload, T0))


# -- F9: ids shaped like fence ids --------------------------------------------------


def test_an_id_shaped_like_a_fence_id_is_refused_on_every_path_and_the_next_open_works(store):
    """F9: before, ``fence:<epoch>:<seq>`` was taken; the next open under that
    epoch at that sequence collided with it: 40 retries, then
    TransactionConflictError."""
    store.sessions.create("s")
    lease = _lease(store)
    w = store.ledger.open("s", lease)
    squat = fence_id(lease.epoch, 3)
    assert squat.startswith(FENCE_ID_PREFIX)
    for call in (
        lambda: w.append("note", b"a", squat),
        lambda: w.append_many([LedgerEntry("note", b"a", "fine"), LedgerEntry("n", b"", squat)]),
        lambda: w.append("note", b"a", "fence:anything"),
        lambda: store.ledger.open("s", lease, opening=[LedgerEntry("note", b"a", squat)]),
        lambda: store.ledger.check_entries([LedgerEntry("note", b"a", squat)]),
    ):
        with pytest.raises(InvalidInputError) as err:
            call()
        assert err.value.field.endswith("].idempotency_id"), err.value.field
    assert store.ledger.tip("s") == 1
    w.append("note", b"a", "Fence:1:3")  # only the store's exact prefix is reserved
    again = store.ledger.open("s", lease)
    assert again.fence_seq == 3
    fences = [r for r in store.ledger.replay("s") if r.kind == FENCE_KIND]
    assert [r.idempotency_id for r in fences] == [fence_id(lease.epoch, 1), squat]


def test_a_fence_id_stored_before_the_check_refuses_the_open_typed(store, monkeypatch):
    """A ledger an older version wrote may hold such an id (here: the check
    patched out). Its open is refused at once, typed, nothing written (before:
    40 retries, then TransactionConflictError); a fresh lease opens. The
    control patches the open's own id fence out and sees the retried conflict."""
    with monkeypatch.context() as m:
        m.setattr(writer_mod, "FENCE_ID_PREFIX", "\x00not a prefix")
        store.sessions.create("s")
        lease = _lease(store)
        w = store.ledger.open("s", lease)
        w.append("note", b"a", fence_id(lease.epoch, 3))
    with pytest.raises(LedgerIdempotencyConflictError) as err:
        store.ledger.open("s", lease)
    assert (err.value.idempotency_id, err.value.seq) == (fence_id(lease.epoch, 3), 2)
    assert store.ledger.tip("s") == 2
    with monkeypatch.context() as m:
        m.setattr(journal, "refuse_taken_fence_id", lambda session_id, fid, seq: None)
        with pytest.raises(TransactionConflictError):
            store.ledger.open("s", lease)
    store.leases.release(lease)
    fresh = _lease(store)
    assert store.ledger.open("s", fresh).fence_seq == 3


# -- F10: deeply nested JSON ----------------------------------------------------------


@pytest.mark.parametrize(
    "kind", ["turn_started", "workspace_checkpoint", "step_done", "hustle_done"]
)
def test_deep_json_is_refused_typed_and_the_depth_bound_is_exact(store, kind):
    """F10: before, 100 000 levels were a bare RecursionError from the append."""
    w = _writer(store)
    for depth in (100_000, 2_000, MAX_PAYLOAD_DEPTH + 1):
        with pytest.raises(InvalidInputError) as err:
            w.append(kind, _deep(depth, kind), f"deep{depth}")
        assert err.value.field == "entries[0].payload"
    with pytest.raises(InvalidInputError):
        store.ledger.open("s", w.lease, opening=[LedgerEntry(kind, _deep(100_000, kind), "d")])
    assert store.ledger.tip("s") == 2
    assert w.append(kind, _deep(MAX_PAYLOAD_DEPTH, kind), "at-bound").seq == 3  # control


def test_every_decoder_of_record_bytes_fails_deep_json_typed(store, monkeypatch):
    """Records stored before the depth bound (or any kind the catalog does not
    read): the catalog's fold, the workspace scan, the command log and the
    catalog's own decoder raise their typed errors, never RecursionError."""
    _unchecked(monkeypatch)
    w = _writer(store)
    deep = 100_000
    w.append("command_application", _deep(deep), "cmd")  # not a catalog kind: the caller's bytes
    with pytest.raises(CommandApplicationNotFoundError):
        store.ledger.read_command_application_at("s", 3)
    w.append("workspace_checkpoint", _deep(deep, "workspace_checkpoint"), "ws")
    with pytest.raises(WorkspaceJournalScanError) as scan:
        store.ledger.workspace_checkpoint_by_seq("s", 4)
    assert isinstance(scan.value.__cause__, ReplayDecodeError)
    with pytest.raises(ReplayDecodeError):
        store.ledger.catalog.repair("s")
    with pytest.raises(CatalogReadError):
        catalog_codec.decode("s", '{"x":' + "[" * deep + "]" * deep + "}")
    log = store.ledger.command_log("s", w)
    with pytest.raises(InvalidInputError):
        nested: Any = "leaf"
        for _ in range(deep):
            nested = [nested]
        log.append_command_application(CommandApplication("c", {"x": nested}))


# -- F11: opening entries get the body ceiling ----------------------------------------


def test_an_opening_entry_is_held_to_the_body_ceiling_as_an_append_is(store):
    """F11: before, with the offload threshold above ``max_body_bytes``, an
    opening entry of 5000 bytes was written where an append refused it."""
    store.sessions.create("s")
    lease = _lease(store)
    led = store.ledger.with_blobs(offload_threshold=10_000_000, max_body_bytes=1000)
    with pytest.raises(DurableBodyTooLargeError) as opened:
        led.open("s", lease, opening=[LedgerEntry("note", b"z" * 5000, "b")])
    assert (opened.value.object_id, opened.value.declared_bytes, opened.value.max_bytes) == (
        "b",
        5000,
        1000,
    )
    assert store.ledger.tip("s") == 0  # not even the fence
    w = led.open("s", lease, opening=[LedgerEntry("note", b"z" * 1000, "at-ceiling")])
    with pytest.raises(DurableBodyTooLargeError):
        w.append("note", b"z" * 5000, "a")
    assert [len(r.payload) for r in store.ledger.replay("s")] == [0, 1000]


# -- one check on every path -----------------------------------------------------------


def test_every_write_path_runs_the_one_entry_check(store, monkeypatch):
    """The writer (append, append_many), the opening and the command log all
    check their entries with ``check_entry`` through ``check_entries`` (the
    CLI's path: ``test_a_refused_cli_append_writes_nothing``)."""
    seen: list[str] = []
    real = writer_mod.check_entry

    def spy(entry: object, field: str) -> LedgerEntry:
        seen.append(field)
        return real(entry, field)

    monkeypatch.setattr(writer_mod, "check_entry", spy)
    store.sessions.create("s")
    lease = _lease(store)
    w = store.ledger.open("s", lease, opening=[LedgerEntry("session_started", STARTED, "st")])
    w.append("note", b"n", "n")
    w.append_many([LedgerEntry("note", b"a", "a"), LedgerEntry("note", b"b", "b")])
    store.ledger.command_log("s", w).append_command_application(CommandApplication("c", {}))
    assert seen == ["opening[0]", "entries[0]", "entries[0]", "entries[1]", "entries[0]"]


# -- F8, F9, F10 through the CLI --------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    url = str(tmp_path / "cli.duckdb") if request.param == "duckdb" else new_pg_schema()
    with _open(url) as s:
        s.sessions.create("s")
    yield url


def _open(url: str) -> turnkeeper.BaseStore:
    return turnkeeper.open_store(url) if "://" not in url else open_pg(url)


def _records(url: str) -> int:
    with _open(url) as s:
        return int(s.query("SELECT count(*) AS n FROM ledger_records").to_pylist()[0]["n"])


def _cli_append(url: str, kind: str, payload: bytes, *extra: str) -> Result:
    return CliRunner().invoke(
        cli, ["ledger", "append", "s", "--kind", kind, "--db", url, *extra], input=payload
    )


@pytest.mark.parametrize(
    ("kind", "payload", "extra"),
    [
        ("blobptr", b"x", ()),
        ("fence", b"", ()),
        ("turn_started", b"not json", ()),
        ("bad\tkind", b"x", ()),
        ("step_done", BAD_USAGE[0][1], ()),
        ("note", b"x", ("--id", "fence:1:2")),
        ("turn_started", _deep(100_000), ()),
    ],
)
def test_a_refused_cli_append_writes_nothing(db, kind, payload, extra):
    """F8: before, each refusal still left a fence record (the writer was
    opened before the entry was checked); F10: deep JSON was a traceback,
    exit 1. Now: exit 2, one stderr line naming the error, no record."""
    assert _records(db) == 0
    r = _cli_append(db, kind, payload, *extra)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("turnkeeper: InvalidInputError"), r.stderr
    assert _records(db) == 0
    ok = _cli_append(db, "note", b"fine")  # control: the same command with good input appends
    assert ok.exit_code == 0, ok.output
    assert _records(db) == 2
