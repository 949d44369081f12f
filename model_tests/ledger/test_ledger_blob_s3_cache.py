"""S3 blobs with s3fs's listings cache on, its default (attack round 2 on
issue 19, F3), on both backends, against moto's S3 server (``conftest.s3_endpoint``).

A fleet's other process writes a blob (an orphan: its pointer append
failed) after this process's GC listed the session's folder. The next pass
lists it, condemns it and must delete it from the bucket: before the fix
``FsspecBlobs.delete`` asked ``fs.exists``, which s3fs answered from the
listing cached by the previous pass, so GC reported the blob deleted
(``deleted_keys``) and left it in the bucket, pass after pass. The same
holds for a blob store made as the README builds it
(``FsspecBlobs("s3://...", fs=s3fs.S3FileSystem(...))``) and for the CLI's
``--blobs s3://...`` (fsspec's own filesystem for the URL, cached per process).
A listing, too, reads the store, not a cached listing of its parent.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import s3_options

import turnkeeper
from turnkeeper.cli.main import cli
from turnkeeper.storage.ops.ledger import blobs as blob_ops

TTL = 30.0
BIG = bytes(range(256)) * 4


def _fs(endpoint: str, cache: bool) -> Any:
    import s3fs  # type: ignore[import-untyped]

    return s3fs.S3FileSystem(**{**s3_options(endpoint), "use_listings_cache": cache})


def _in_bucket(endpoint: str, root: str, key: str) -> bool:
    """Whether the bucket holds ``key`` under ``root``, asked of S3 itself."""
    import boto3

    bucket, _, prefix = root.removeprefix("s3://").partition("/")
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    found = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/{key}")
    return any(o["Key"] == f"{prefix}/{key}" for o in found.get("Contents", []))


def _orphan(other: turnkeeper.FsspecBlobs, sid: str) -> str:
    """A blob of ``sid`` put by another process's store (its pointer never landed)."""
    data = os.urandom(300)
    key = blob_ops.blob_prefix("", sid) + hashlib.sha256(data).hexdigest()
    other.put(key, data)
    return key


def test_gc_deletes_an_orphan_another_process_wrote_after_its_cached_listing(
    store, s3_endpoint: str
) -> None:
    root = f"s3://turnkeeper-test/{uuid.uuid4().hex}"
    mine = turnkeeper.FsspecBlobs(root, fs=_fs(s3_endpoint, cache=True))
    other = turnkeeper.FsspecBlobs(root, fs=_fs(s3_endpoint, cache=True))
    ledger = store.ledger.with_blobs(mine, offload_threshold=64)
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "w", TTL)
    with ledger.open("s", lease) as w:
        w.append("turn", BIG, "t1")
    first = ledger.gc("s", lease)  # lists (and caches) the session's folder
    assert (first.scanned, first.deleted) == (1, 0)
    for _ in range(2):
        key = _orphan(other, "s")
        result = ledger.gc("s", lease)
        assert result.deleted_keys == (key,)
        assert not _in_bucket(s3_endpoint, root, key), "GC reported it deleted, it is still there"
    assert [r.payload for r in ledger.replay("s")][-1] == BIG


def test_a_listing_sees_a_session_folder_made_after_its_parent_was_cached(
    store, s3_endpoint: str
) -> None:
    """The sweep lists the tenant's folder (caching it), another process then
    writes the first blob of a new session; a listing of that session's
    prefix finds it (``exists`` of the folder from the cached parent said no)."""
    root = f"s3://turnkeeper-test/{uuid.uuid4().hex}"
    mine = turnkeeper.FsspecBlobs(root, fs=_fs(s3_endpoint, cache=True))
    other = turnkeeper.FsspecBlobs(root, fs=_fs(s3_endpoint, cache=True))
    _orphan(other, "a")
    assert len(mine.list(blob_ops.ROOT)) == 1  # caches blobs/ and blobs/t=/
    mine.fs.ls(f"{mine.root}/blobs/t=")  # the tenant's folder as a listing of its own
    key = _orphan(other, "b")
    assert mine.list(blob_ops.blob_prefix("", "b")) == [key]
    mine.delete(key)
    assert not _in_bucket(s3_endpoint, root, key)
    mine.delete(key)  # already gone: nothing


@pytest.fixture
def url_config(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """fsspec's configuration for ``s3://`` URLs pointed at the test endpoint
    (what ``FSSPEC_S3_*`` environment variables set for a real CLI run): the
    CLI's ``--blobs s3://...`` gets s3fs's defaults, the listings cache on,
    and fsspec's instance cache (one filesystem per process for the URL, as
    a long-lived worker making ``FsspecBlobs("s3://...")`` shares it)."""
    import fsspec.config  # type: ignore[import-untyped]

    drop = ("use_listings_cache", "skip_instance_cache")
    options = {k: v for k, v in s3_options(s3_endpoint).items() if k not in drop}
    monkeypatch.setitem(fsspec.config.conf, "s3", options)
    yield


def test_the_clis_gc_on_an_s3_url_deletes_what_it_reports(
    tmp_path: Path, s3_endpoint: str, url_config: None
) -> None:
    db = str(tmp_path / "cli.duckdb")
    root = f"s3://turnkeeper-test/{uuid.uuid4().hex}"
    with turnkeeper.open_store(db) as store:
        store.sessions.create("s")

    def tk(*args: str, stdin: bytes | None = None) -> dict[str, Any]:
        r = CliRunner().invoke(cli, [*args, "--db", db, "--blobs", root, "--json"], input=stdin)
        assert r.exit_code == 0, r.output
        return dict(json.loads(r.stdout))

    tk("ledger", "append", "s", "--kind", "turn", "--id", "t1", "--offload-threshold", "64",
       stdin=BIG)  # fmt: skip
    assert tk("ledger", "gc", "s")["gc"]["scanned"] == 1
    other = turnkeeper.FsspecBlobs(root, fs=_fs(s3_endpoint, cache=False))
    key = _orphan(other, "s")
    assert tk("ledger", "gc", "s")["gc"]["deleted_keys"] == [key]
    assert not _in_bucket(s3_endpoint, root, key)
