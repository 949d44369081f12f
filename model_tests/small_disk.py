"""A real full disk for DuckDB stores: a small tmpfs in a mount namespace of its own.

:func:`run` starts this file as a child process inside ``unshare`` (a user
namespace mapping the caller to root, so no root is needed where
unprivileged user namespaces are allowed; or, as root, a mount namespace
alone), where it mounts a tmpfs of a few MiB on a folder and runs one
scenario there: the store's files fill it, and DuckDB meets ENOSPC as on a
full disk. The namespace, and the tmpfs with it, ends with the child.
The child prints one JSON object (what it saw); the tests judge it.

Run as ``python small_disk.py SCENARIO FOLDER SIZE`` (inside the namespace).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

_PREFIXES = (
    ["unshare", "--user", "--map-root-user", "--mount"],
    ["unshare", "--mount"],  # root without user namespaces
)
_FOUND: list[list[str] | str] = []


def namespace() -> list[str] | str:
    """The ``unshare`` command line that lets a child mount a tmpfs, or why none
    works here (found once per test session)."""
    if _FOUND:
        return _FOUND[0]
    why = "unshare (util-linux) is not installed"
    if shutil.which("unshare") and shutil.which("mount"):
        why = "neither a user namespace nor root's mount namespace can mount a tmpfs here"
        probe = Path(f"/tmp/turnkeeper-small-disk-probe-{os.getpid()}")
        probe.mkdir(exist_ok=True)
        try:
            for prefix in _PREFIXES:
                if prefix == _PREFIXES[1] and os.geteuid() != 0:
                    continue
                done = subprocess.run(
                    [*prefix, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                    capture_output=True,
                    timeout=60,
                )
                if done.returncode == 0:
                    _FOUND.append(prefix)
                    return prefix
        finally:
            probe.rmdir()
    _FOUND.append(why)
    return why


def run(scenario: str, folder: Path, size_mib: int) -> dict[str, Any]:
    """Run ``scenario`` on a ``size_mib`` MiB tmpfs mounted on ``folder`` (in a
    child's own mount namespace); what it printed. Skips when no namespace can
    be made here, and fails instead under ``CI=true``: CI must run these."""
    prefix = namespace()
    if isinstance(prefix, str):
        why = f"full-disk tests need a small tmpfs: {prefix}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    folder.mkdir(exist_ok=True)
    done = subprocess.run(
        [*prefix, sys.executable, __file__, scenario, str(folder), str(size_mib)],
        capture_output=True,
        text=True,
        timeout=900,  # a hang's guard only
    )
    assert done.returncode == 0, done.stderr[-6000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


# -- inside the namespace ------------------------------------------------------------------

THRESHOLD = 16 * 2**20
"""DuckDB's automatic checkpoint threshold (``wal_autocheckpoint``, its default)."""
KIB = 1024


def fill(folder: str, leave: int) -> None:
    """Fill ``folder``'s file system, then free ``leave`` bytes of it (``filler``)."""
    path = os.path.join(folder, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for block in (1 << 20, 4 * KIB, 1):
            try:
                while True:
                    os.write(fd, b"\0" * block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        if leave:
            os.ftruncate(fd, os.fstat(fd).st_size - leave)
    finally:
        os.close(fd)


def wal_size(wal: str) -> int:
    return os.path.getsize(wal) if os.path.exists(wal) else 0


def make_room(folder: str, size: int) -> None:
    """Free ``size`` bytes of the filler."""
    path = os.path.join(folder, "filler")
    os.truncate(path, os.path.getsize(path) - size)


def free(folder: str) -> None:
    os.remove(os.path.join(folder, "filler"))


def outcome(call: Callable[[], Any]) -> dict[str, Any]:
    """What ``call()`` did: its result's type, or its error's class and message."""
    try:
        value = call()
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"ok": type(value).__name__, "id": getattr(value, "id", None)}


def queued_together(store: Any, calls: list[Callable[[], Any]]) -> list[dict[str, Any]]:
    """Run ``calls`` on threads that queue behind the held write lock, then let
    one leader run them as one group commit; each call's :func:`outcome`."""
    database = store.db
    out: list[dict[str, Any]] = [{} for _ in calls]

    def queued() -> int:
        with database._queue_lock:
            return len(database._queue)

    def run_one(i: int) -> None:
        out[i] = outcome(calls[i])

    threads = [threading.Thread(target=run_one, args=(i,)) for i in range(len(calls))]
    with database._write_lock:
        for i, t in enumerate(threads):
            t.start()
            deadline = time.monotonic() + 120  # a hang's guard only
            while queued() != i + 1:
                assert time.monotonic() < deadline, f"write {i} never queued"
                time.sleep(0.001)
    for t in threads:
        t.join()
    return out


def user(text: str) -> dict[str, Any]:
    return {"message": {"role": "user", "content": text}}


class Clock:
    """A fixed clock: every write stamps the same instant."""

    now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def full_disk(folder: str) -> dict[str, Any]:
    """Checkpoints meet a full disk under two store objects on one file: what
    each call did, and what a later open finds."""
    import duckdb

    import turnkeeper

    setting = duckdb.connect().execute("SELECT current_setting('wal_autocheckpoint')")
    assert setting.fetchone() == ("16.0 MiB",), "DuckDB's checkpoint threshold changed"
    path = os.path.join(folder, "s.duckdb")
    wal = f"{path}.wal"
    turnkeeper.open_store(path).close()
    store = turnkeeper.open_store(path, clock=Clock())
    other = turnkeeper.open_store(path)  # shares the DuckDB instance (storage/duck/files.py)
    store.sessions.create("s")
    acked: list[str] = []
    refused: list[str] = []

    def append(text: str, on: Any = store) -> dict[str, Any]:
        got = outcome(lambda: on.sessions.append("s", "message", user(text)))
        (acked if "ok" in got else refused).append(got.get("id") or text)
        return got

    while wal_size(wal) < THRESHOLD - 1024 * KIB:  # no checkpoint yet (it starts ~650 KiB below)
        append("x" * 64 * KIB)
    seen: dict[str, Any] = {"wal_before": wal_size(wal), "acked_before": len(acked)}
    fill(folder, leave=1024 * KIB)  # room for the log, none for a checkpoint
    crossing: dict[str, Any] = {}
    for i in range(2000):  # small writes until one's commit runs a checkpoint
        crossing = append(f"c{i}")
        if "error" in crossing:
            break
    seen["crossing"] = crossing
    seen["other_read"] = outcome(lambda: other.sessions.entries("s"))
    seen["store_read"] = outcome(lambda: store.sessions.get("s"))
    make_room(folder, 512 * KIB)  # a failed checkpoint leaves the disk full
    group = queued_together(
        store, [lambda i=i: store.sessions.append("s", "message", user(f"g{i}")) for i in range(8)]
    )
    seen["group"] = group
    for i, got in enumerate(group):
        (acked if "ok" in got else refused).append(got.get("id") or f"g{i}")
    seen["read_after_group"] = outcome(lambda: other.sessions.entries("s"))
    make_room(folder, 1024 * KIB)  # a failed checkpoint leaves the disk full
    leases: list[Any] = []
    seen["acquire"] = outcome(lambda: leases.append(store.leases.acquire("worker:w1", "w1", 30)))
    tried = 0
    while leases and tried < 20000:  # renewals until one's commit runs a checkpoint
        tried += 1
        seen["renew"] = outcome(lambda n=tried: store.leases.renew(leases[0], 300 + n))
        if "error" in seen["renew"]:
            break
    seen["renewals_tried"] = tried
    seen["renewed_expiry"] = (Clock.now + timedelta(seconds=300 + tried)).isoformat()
    seen["previous_expiry"] = (Clock.now + timedelta(seconds=300 + tried - 1)).isoformat()
    make_room(folder, 256 * KIB)
    seen["validate"] = outcome(lambda: store.leases.validate(leases[0]))
    outcome(
        lambda: other.sessions.entries("s")
    )  # open again (a reopen frees what failed checkpoints wrote)
    fill(folder, leave=0)  # not even room for the log
    seen["full"] = append("lost" * 2000)  # more than the log's last page has left
    seen["full_read"] = outcome(lambda: other.sessions.entries("s"))
    seen["query"] = outcome(lambda: store.query("SELECT count(*) AS n FROM entries"))
    free(folder)
    seen["after_free"] = append("after")
    seen["generation"] = getattr(store.db._file, "generation", None)
    seen["close_other"] = outcome(other.close)
    seen["close"] = outcome(store.close)
    seen["wal_left"] = wal_size(wal)
    with turnkeeper.open_store(path, read_only=True) as again:
        entries = again.sessions.entries("s")
        rows = again.query(
            "SELECT expires_at, (SELECT count(*) FROM lease_events WHERE edge = 'renew') AS n "
            "FROM leases WHERE target = 'worker:w1'"
        ).to_pylist()
    seen["expires_at"] = rows[0]["expires_at"].isoformat() if rows else None
    seen["renewals"] = rows[0]["n"] if rows else None
    ids = [e.id for e in entries]
    texts = {e.payload["message"]["content"] for e in entries}
    seen["missing"] = sorted(set(acked) - set(ids))
    seen["twice"] = len(ids) - len(set(ids))
    seen["refused_kept"] = sorted(set(refused) & texts)
    seen["acked"] = len(acked)
    seen["refused"] = refused
    return seen


SCENARIOS: dict[str, Callable[[str], dict[str, Any]]] = {"full_disk": full_disk}


def main(scenario: str, folder: str, size: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}m", "tmpfs", folder], check=True)
    print(json.dumps(SCENARIOS[scenario](folder), default=str))


if __name__ == "__main__":
    main(*sys.argv[1:])
