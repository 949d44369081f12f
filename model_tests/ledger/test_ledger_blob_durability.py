"""A local blob put is durable before the append that points at it commits
(attack round 2 on issue 19, F2), on both backends.

A power loss cannot be simulated here, so the test records the calls: every
``os.fsync`` (by the inode it synced), every ``os.replace``, and the start of
the ledger's append transaction. The blob file must be synced before its
rename, its directory after it, each directory the put made (its entry in
its parent) before the put returns, and all of it before the append. Each
half is shown able to fail: ``blob_files.sync_file`` or ``blob_files.sync_directory``
patched to do nothing, the check reports what is missing.

Manual confirmation (strace, not a test): ``strace -f -e
trace=openat,rename,fsync,fdatasync -o T python
attack19b-findings/f_local_blob_no_fsync.py`` shows ``fsync`` of the
``.tmp-`` file before its ``rename`` and of its directory after it, before
the WAL's ``fdatasync`` of the append.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from turnkeeper import FsspecBlobs
from turnkeeper.storage.ops.ledger import Ledger, blob_files
from turnkeeper.storage.ops.ledger import blobs as blob_ops

TTL = 30.0
BIG = bytes(range(256)) * 40  # 10240 bytes: offloaded at a threshold of 64


class Calls:
    """The recorded ``os.fsync`` (by ``(st_dev, st_ino)``), ``os.replace`` and
    append events, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, Any]] = []
        real_fsync, real_replace = os.fsync, os.replace
        real_append = Ledger._append

        def fsync(fd: int) -> None:
            st = os.fstat(fd)
            real_fsync(fd)
            self.events.append(("fsync", (st.st_dev, st.st_ino)))

        def replace(src: Any, dst: Any, **kw: Any) -> None:
            real_replace(src, dst, **kw)
            self.events.append(("replace", str(dst)))

        def append(ledger: Any, request: Any) -> Any:
            self.events.append(("append", request.session_id))
            return real_append(ledger, request)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(Ledger, "_append", append)


def _inode(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def missing_syncs(events: list[tuple[str, Any]], blob: str, made: list[str]) -> list[str]:
    """What the durability rule misses in ``events`` for the put of ``blob``
    (a path) that made the directories ``made``: empty when the file was
    synced before its rename, its directory after it, each made directory's
    parent after the rename, and all before the append."""
    names = [e[0] for e in events]
    renamed = names.index("replace") if "replace" in names else len(events)
    appended = names.index("append") if "append" in names else len(events)
    synced_before = {e[1] for e in events[:renamed] if e[0] == "fsync"}
    synced_after = {e[1] for e in events[renamed:appended] if e[0] == "fsync"}
    problems = []
    if _inode(blob) not in synced_before:
        problems.append("the blob file is not fsync'd before its rename")
    folder = os.path.dirname(blob)
    if _inode(folder) not in synced_after:
        problems.append("the blob's directory is not fsync'd after the rename")
    for d in made:
        if _inode(os.path.dirname(d)) not in synced_after:
            problems.append(f"the entry of {d} (made by the put) is not fsync'd")
    if appended < renamed:
        problems.append("the append ran before the blob was in place")
    return problems


@pytest.mark.parametrize("broken", [None, "sync_file", "sync_directory"])
def test_an_offloaded_append_syncs_its_blob_and_directories_before_the_append(
    store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str | None
) -> None:
    root = tmp_path / "blobs"  # made by the first put, with the session's directories
    ledger = store.ledger.with_blobs(FsspecBlobs(str(root)), offload_threshold=64)
    store.sessions.create("s")
    w = ledger.open("s", store.leases.acquire("session:s", "w", TTL))
    if broken is not None:
        monkeypatch.setattr(blob_files, broken, lambda *a: None)
    calls = Calls(monkeypatch)
    assert w.append("turn", BIG, "t1").seq == 2
    (key,) = ledger.blobs.list(blob_ops.blob_prefix("", "s"))
    blob = os.path.join(ledger.blobs.root, key)
    made = [str(root)]
    at = os.path.dirname(blob)
    while at != str(root):
        made.append(at)
        at = os.path.dirname(at)
    problems = missing_syncs(calls.events, blob, made)
    if broken is None:
        assert problems == []
        assert list(ledger.replay("s"))[-1].payload == BIG
    elif broken == "sync_file":
        assert problems == ["the blob file is not fsync'd before its rename"]
    else:
        assert "the blob's directory is not fsync'd after the rename" in problems
        assert len(problems) == 1 + len(made)


def test_a_second_put_in_a_known_directory_syncs_the_file_and_its_directory_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs = FsspecBlobs(str(tmp_path / "blobs"))
    prefix = blob_ops.blob_prefix("", "s")
    blobs.put(prefix + "a" * 64, b"first")
    calls = Calls(monkeypatch)
    blobs.put(prefix + "b" * 64, b"second")
    blob = os.path.join(blobs.root, prefix + "b" * 64)
    assert missing_syncs(calls.events, blob, []) == []
    assert [e[0] for e in calls.events] == ["fsync", "replace", "fsync"]


def test_a_platform_without_directory_sync_skips_it_and_a_failed_file_sync_fails_the_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs = FsspecBlobs(str(tmp_path / "blobs"))
    prefix = blob_ops.blob_prefix("", "s")
    real = os.fsync

    def refusing(kinds: str) -> Any:
        def fsync(fd: int) -> None:
            is_dir = _is_dir(fd)
            if ("dir" in kinds and is_dir) or ("file" in kinds and not is_dir):
                raise OSError(errno.EINVAL, "Invalid argument")
            real(fd)

        return fsync

    monkeypatch.setattr(os, "fsync", refusing("dir"))
    blobs.put(prefix + "a" * 64, b"kept")  # directories cannot be synced: skipped
    assert blobs.get(prefix + "a" * 64) == b"kept"
    monkeypatch.setattr(os, "fsync", refusing("file"))
    with pytest.raises(OSError) as failed:
        blobs.put(prefix + "b" * 64, b"lost")
    assert failed.value.errno == errno.EINVAL
    assert blobs.list(prefix) == [prefix + "a" * 64]  # no blob, no temporary file left

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", eio)  # a real failure of a directory's sync is not skipped
    with pytest.raises(OSError):
        blob_files.sync_directory(str(tmp_path))


def _is_dir(fd: int) -> bool:
    import stat

    return stat.S_ISDIR(os.fstat(fd).st_mode)
