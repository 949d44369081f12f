"""Repairing a DuckDB store whose write-ahead log is damaged (``turnkeeper repair``).

DuckDB refuses a log with a damaged entry, and takes some damage for a write
torn by a crash and drops everything after it without a word
(:mod:`.wal`; the store refuses those too). Every transaction that ends
before the damage is intact: the log is cut at the end of the last one, and
DuckDB replays what is left and folds it into the database file (a
checkpoint). What is lost is the damaged transaction and every one after
it, which later ones may depend on, so none of them can be kept alone.

The originals are copied aside first (``<path>.before-repair-<stamp>`` and
``<path>.wal.before-repair-<stamp>``, never overwritten, never deleted); the
log is cut only after the copies are on disk. The file's POSIX lock is held
from before the log is read until DuckDB closed the repaired file, so no
other process opens it meanwhile; the database file is copied through the
locked descriptor, since closing any other descriptor of it would drop the
lock.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime

import duckdb

from turnkeeper.spec import errors

from . import files
from . import wal as wal_log

_CHUNK = 1 << 20
"""Bytes copied at a time."""


@dataclass(frozen=True)
class Repair:
    """What a repair did (offsets and sizes in bytes).

    The log of ``wal_size`` bytes was damaged at ``damage_at`` (the damaged
    entry's start; ``damage``: ``"checksum"``, ``"length"`` or ``"header"``);
    it was cut at ``kept_bytes``, keeping ``kept_transactions``, and the
    ``dropped_bytes`` after it held the damaged transaction and every later
    one (``later_transactions``: the whole transactions found ending after
    the damage). ``rows``: per table, rows at the last checkpoint (what the
    database file held before the repair) and after it.
    """

    path: str
    wal: str
    copies: tuple[str, str]
    wal_size: int
    damage_at: int
    damage: str
    kept_bytes: int
    kept_transactions: int
    dropped_bytes: int
    later_transactions: int
    rows: dict[str, tuple[int, int]] = field(default_factory=dict)


def repair(path: str, *, stamp: str | None = None) -> Repair:
    """Cut ``path``'s damaged write-ahead log after its last intact transaction,
    replay it and checkpoint, keeping the original files as copies beside it.

    Raises:
        StoreNotFoundError: there is no file at ``path``.
        ForeignDatabaseError: it is not a DuckDB database file.
        StoreLockedError: another process, or a store object of this one, has
            it open (nothing is changed).
        InvalidInputError: (``field="path"``) there is nothing to repair: no
            log, an intact one, one whose end a crash tore (opening the store
            drops that by itself), or one of a version this does not read.
        CorruptDatabaseError: replaying the cut log and checkpointing failed;
            the original log is put back (its copy stays).
        OperationalError: a file could not be read or written.
    """
    path = os.path.abspath(path)
    files.check_file(path, read_only=True)
    if files.open_here(path):
        raise errors.StoreLockedError(
            path, detail="a store object of this process has it open: close it first"
        )
    fd = _lock(path)
    try:
        return _repair(path, fd, stamp or datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ"))
    finally:
        os.close(fd)  # after DuckDB closed the file (its own close dropped the lock already)


def _lock(path: str) -> int:
    """A descriptor of ``path`` holding its POSIX write lock (DuckDB's kind).

    Raises:
        StoreLockedError: another process holds the file.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system: DuckDB's open decides
        return os.open(path, os.O_RDONLY)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise errors.OperationalError(detail=f"cannot open {path} to repair it: {exc}") from exc
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise errors.StoreLockedError(path, detail="another process has it open") from exc
    return fd


def _repair(path: str, fd: int, stamp: str) -> Repair:
    wal = f"{path}.wal"
    try:
        found = wal_log.scan(wal, verify=True)
    except FileNotFoundError:
        raise errors.InvalidInputError(
            "path", f"{path} has no write-ahead log ({wal}): nothing to repair"
        ) from None
    except OSError as exc:
        raise errors.OperationalError(detail=f"cannot read {wal}: {exc}") from exc
    if found is None:
        raise errors.InvalidInputError(
            "path", f"{wal} is empty, or of a version (encrypted, older) repair does not read"
        )
    if not found.damaged:
        if found.stop is None:
            why = f"{wal} is intact ({found.kept_commits} transactions): nothing to repair"
        else:
            why = (
                f"{wal} ends in a write a crash tore at byte {found.stop} of {found.size}: "
                "opening the store keeps every transaction before it and drops that by "
                "itself; nothing to repair"
            )
        raise errors.InvalidInputError("path", why)
    assert found.stop is not None and found.reason is not None
    copies = (f"{path}.before-repair-{stamp}", f"{wal}.before-repair-{stamp}")
    _copy(fd, path, copies[0])
    source = os.open(wal, os.O_RDONLY)
    try:
        _copy(source, wal, copies[1])
    finally:
        os.close(source)
    _sync_folder(path)
    os.truncate(wal, found.kept_end)
    _sync(wal)
    try:
        after = _replay(path)
    except duckdb.Error as exc:
        _put_back(copies[1], wal)
        raise errors.CorruptDatabaseError(
            path,
            wal,
            found.stop,
            detail=f"replaying the log cut at byte {found.kept_end} and checkpointing failed, "
            f"so the original log is back in place (its copy stays: {copies[1]}); "
            f"DuckDB said: {exc}",
        ) from exc
    before = _rows(copies[0])
    return Repair(
        path=path,
        wal=wal,
        copies=copies,
        wal_size=found.size,
        damage_at=found.stop,
        damage=found.reason,
        kept_bytes=found.kept_end,
        kept_transactions=found.kept_commits,
        dropped_bytes=found.dropped,
        later_transactions=found.later_commits,
        rows={t: (before.get(t, 0), n) for t, n in after.items()},
    )


def _copy(fd: int, name: str, target: str) -> None:
    """Copy the file open as ``fd`` (``name``) to a new file ``target``, synced."""
    try:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, os.fstat(fd).st_mode & 0o777)
    except OSError as exc:
        raise errors.OperationalError(detail=f"cannot create {target}: {exc}") from exc
    try:
        offset = 0
        while chunk := os.pread(fd, _CHUNK, offset):
            os.write(out, chunk)
            offset += len(chunk)
        os.fsync(out)
    except OSError as exc:
        raise errors.OperationalError(detail=f"cannot copy {name} to {target}: {exc}") from exc
    finally:
        os.close(out)


def _sync(name: str) -> None:
    out = os.open(name, os.O_RDONLY)
    try:
        os.fsync(out)
    finally:
        os.close(out)


def _sync_folder(path: str) -> None:
    with_folder = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(with_folder)
    finally:
        os.close(with_folder)


def _put_back(copy: str, wal: str) -> None:
    """Replace ``wal`` by its original, ``copy`` (which stays)."""
    source = os.open(copy, os.O_RDONLY)
    try:
        _copy(source, copy, f"{wal}.restoring")
    finally:
        os.close(source)
    os.replace(f"{wal}.restoring", wal)


def _replay(path: str) -> dict[str, int]:
    """Open ``path`` (DuckDB replays the log), checkpoint and close it; rows per table."""
    con = duckdb.connect(path)
    try:
        con.execute("CHECKPOINT")
        return _count(con)
    finally:
        con.close()


def _rows(copy: str) -> dict[str, int]:
    """Rows per table in the database file ``copy`` (read-only, without a log)."""
    con = duckdb.connect(copy, read_only=True)
    try:
        return _count(con)
    finally:
        con.close()


def _count(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    names = [
        r[0]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY 1"
        ).fetchall()
    ]
    out: dict[str, int] = {}
    for name in names:
        quoted = '"' + name.replace('"', '""') + '"'
        row = con.execute(f"SELECT count(*) FROM {quoted}").fetchone()
        out[name] = int(row[0]) if row else 0
    return out
