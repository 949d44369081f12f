"""GC and the sweep reclaim the temporary files of puts that can no longer
finish (attack round 2 on issue 19, F7), on both backends, blobs in a local
directory and on S3 (moto).

An ``FsspecBlobs`` put writes ``<key>.tmp-<32 hex>`` and renames it into
place; a kill -9 between the two leaves the temporary file, up to the blob's
size. Before the fix GC counted it ``unreclaimable`` for good, and neither a
session delete nor the sweep took it. Now those older than the temp grace
(``DEFAULT_TEMP_GRACE_S``, one hour; ``temp_grace_s`` of ``gc`` and
``sweep_deleted``) are deleted and counted in ``temps_deleted``; a younger
one (a put in progress in a live process) is kept. The kill is planted (a
temporary file written as a killed put leaves it); ages come from the blob
store's injected clock and, in a directory, from ``os.utime``: no sleeps.
Control: the age check (``gc.temp_stale``) broken, a put in progress loses
its file and its append fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import s3_options

from turnkeeper import FsspecBlobs, InvalidInputError
from turnkeeper.cli.main import cli
from turnkeeper.storage.ops.ledger import DEFAULT_TEMP_GRACE_S, blob_files
from turnkeeper.storage.ops.ledger import blobs as blob_ops
from turnkeeper.storage.ops.ledger import gc as gc_ops

TTL = 30.0
BIG = bytes(range(256)) * 4
HOUR = 3600.0
HANG_S = 60.0


class Clock:
    """The blob store's wall clock: the real time plus ``offset`` seconds."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture(params=["directory", "s3"])
def site(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[FsspecBlobs, Clock]:
    clock = Clock()
    if request.param == "directory":
        return FsspecBlobs(str(tmp_path / "blobs"), clock=clock), clock
    import s3fs  # type: ignore[import-untyped]

    endpoint = request.getfixturevalue("s3_endpoint")
    fs = s3fs.S3FileSystem(**s3_options(endpoint))
    return FsspecBlobs(f"s3://turnkeeper-test/{uuid.uuid4().hex}", fs=fs, clock=clock), clock


def _killed_put(blobs: FsspecBlobs, sid: str, age_s: float | None = None) -> str:
    """The temporary file a put of ``sid`` killed mid-write leaves (its key);
    in a directory, ``age_s`` seconds old by its modification time."""
    data = os.urandom(2000)
    key = (
        blob_ops.blob_prefix("", sid)
        + hashlib.sha256(data).hexdigest()
        + f".tmp-{uuid.uuid4().hex}"
    )
    path = posixpath.join(blobs.root, key)
    blobs.fs.makedirs(posixpath.dirname(path), exist_ok=True)
    blobs.fs.pipe_file(path, data[:1000])
    if age_s is not None:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return key


def _writer(store: Any, ledger: Any, sid: str) -> Any:
    store.sessions.create(sid)
    return ledger.open(sid, store.leases.acquire(f"session:{sid}", "w", TTL))


def test_gc_reclaims_a_killed_puts_temp_file_only_once_past_the_grace(store, site) -> None:
    blobs, clock = site
    ledger = store.ledger.with_blobs(blobs, offload_threshold=64)
    w = _writer(store, ledger, "s")
    w.append("turn", BIG, "t1")
    prefix = blob_ops.blob_prefix("", "s")
    temp = _killed_put(blobs, "s")
    kept = ledger.gc("s", w.lease)  # just written: may be a put in progress
    assert (kept.temps_deleted, kept.temps_deleted_keys, kept.unreclaimable) == (0, (), 1)
    clock.offset = 2 * HOUR
    assert ledger.gc("s", w.lease, temp_grace_s=3 * HOUR).temps_deleted == 0  # a longer grace
    result = ledger.gc("s", w.lease)
    assert (result.temps_deleted, result.temps_deleted_keys) == (1, (temp,))
    assert (result.scanned, result.referenced, result.deleted, result.unreclaimable) == (1, 1, 0, 0)
    assert temp not in blobs.list(prefix) and len(blobs.list(prefix)) == 1
    assert [r.payload for r in ledger.replay("s")][-1] == BIG


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "control"])
def test_a_stale_temp_file_is_reclaimed_and_a_fresh_one_kept_in_one_pass(
    store, tmp_path, monkeypatch, fixed
) -> None:
    blobs = FsspecBlobs(str(tmp_path / "blobs"))
    ledger = store.ledger.with_blobs(blobs, offload_threshold=64)
    w = _writer(store, ledger, "s")
    stale = _killed_put(blobs, "s", age_s=DEFAULT_TEMP_GRACE_S + 60)
    fresh = _killed_put(blobs, "s", age_s=60)
    if not fixed:
        monkeypatch.setattr(gc_ops, "temp_stale", lambda age_s, grace_s: True)
    result = ledger.gc("s", w.lease)
    left = blobs.list(blob_ops.blob_prefix("", "s"))
    if fixed:
        assert left == [fresh], "the killed put's file is left, or the fresh one was taken"
        assert (result.temps_deleted_keys, result.unreclaimable) == ((stale,), 1)
    else:
        assert result.temps_deleted_keys == tuple(sorted([stale, fresh])) and left == []


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "control"])
def test_a_put_in_progress_keeps_its_temp_file_through_a_gc_pass(
    store, tmp_path, monkeypatch, fixed
) -> None:
    """A writer's put is paused after writing its temporary file (in its
    sync); GC runs meanwhile. The file is seconds old: kept, the put renames
    it and the append is acknowledged. Control: the age check broken, GC
    deletes it and the put fails (nothing acknowledged, nothing lost)."""
    blobs = FsspecBlobs(str(tmp_path / "blobs"))
    ledger = store.ledger.with_blobs(blobs, offload_threshold=64)
    w = _writer(store, ledger, "s")
    if not fixed:
        monkeypatch.setattr(gc_ops, "temp_stale", lambda age_s, grace_s: True)
    written, go = threading.Event(), threading.Event()
    real_sync = blob_files.sync_file

    def paused(fd: int) -> None:
        real_sync(fd)
        written.set()
        assert go.wait(HANG_S)

    monkeypatch.setattr(blob_files, "sync_file", paused)
    out: list[Any] = []

    def append() -> None:
        try:
            out.append(w.append("turn", BIG, "t1"))
        except Exception as failure:
            out.append(failure)

    t = threading.Thread(target=append)
    t.start()
    assert written.wait(HANG_S)
    result = ledger.gc("s", w.lease)
    go.set()
    t.join(HANG_S)
    if fixed:
        assert result.temps_deleted == 0 and out[0].seq == 2
        assert [r.payload for r in ledger.replay("s")][-1] == BIG
    else:
        assert result.temps_deleted == 1 and isinstance(out[0], FileNotFoundError)
        assert ledger.tip("s") == 1


def test_the_sweep_reclaims_a_deleted_sessions_stale_temp_files(store, site) -> None:
    blobs, clock = site
    ledger = store.ledger.with_blobs(blobs, offload_threshold=64)
    w = _writer(store, ledger, "gone")
    w.append("turn", BIG, "t1")
    temp = _killed_put(blobs, "gone")
    store.sessions.delete("gone", lease=w.lease)
    first = ledger.sweep_deleted()
    assert (first.deleted, first.temps_deleted, first.unreclaimable) == (1, 0, 1)
    clock.offset = 2 * HOUR
    again = ledger.sweep_deleted(["gone"])
    assert (again.deleted, again.temps_deleted_keys, again.unreclaimable) == (0, (temp,), 0)
    assert blobs.list(blob_ops.blob_prefix("", "gone")) == []


def test_a_temp_grace_that_is_not_seconds_is_refused(store, tmp_path) -> None:
    ledger = store.ledger.with_blobs(FsspecBlobs(str(tmp_path / "blobs")))
    w = _writer(store, ledger, "s")
    for bad in (-1, float("nan"), "60", True):
        with pytest.raises(InvalidInputError) as refused:
            ledger.gc("s", w.lease, temp_grace_s=bad)
        assert refused.value.field == "temp_grace_s"
        with pytest.raises(InvalidInputError):
            ledger.sweep_deleted(temp_grace_s=bad)


def test_the_clis_gc_takes_a_temp_grace(tmp_path) -> None:
    import turnkeeper

    db, root = str(tmp_path / "cli.duckdb"), str(tmp_path / "blobs")
    with turnkeeper.open_store(db) as store:
        store.sessions.create("s")
    blobs = FsspecBlobs(root)
    older = _killed_put(blobs, "s", age_s=120)
    newer = _killed_put(blobs, "s", age_s=10)
    r = CliRunner().invoke(
        cli, ["ledger", "gc", "s", "--db", db, "--blobs", root, "--temp-grace", "60", "--json"]
    )
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)["gc"]
    assert (result["temps_deleted_keys"], result["unreclaimable"]) == ([older], 1)
    assert blobs.list(blob_ops.blob_prefix("", "s")) == [newer]
