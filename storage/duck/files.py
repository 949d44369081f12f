"""Database files of the DuckDB backend: checks before opening, one connection per
file per process, and what a failure to open means.

One process has one DuckDB connection per database file, shared by every
store object on it (:func:`open_shared`), whatever path names the file (a
symlink, ``..``, or a hard link: files are told apart by device and inode).
So every store object on a file shares one instance, one write-ahead log and
one write lock, and only the last one to close checkpoints and closes the
file (a checkpoint beside another object's running write would fail).

Reopening. After a fatal error (a checkpoint that hit a full disk …) DuckDB
invalidates the database: every call on it fails until the file is opened
again, and nothing committed is lost (the write-ahead log holds it). A call
that meets this reopens the file for every store object on it
(:func:`reopen`): with the file's write lock and every lease stripe held (no
write of this process runs), it closes the connection (every cursor with
it) and connects again, which replays the write-ahead log. Closing the
connection drops the file's POSIX lock, so the old instance must be gone
before the new one opens (two instances of one file, and the old one closing
its descriptor later, would leave the file unlocked): an operation still
holding the old instance (an unfinished query result) makes DuckDB hand the
old, invalidated instance back, and the reopen waits for the next call.

A write-ahead log is read before DuckDB replays it (:func:`check_wal`):
DuckDB takes damage that makes an entry's length run past the end of the
file, or its header unreadable, for a write torn by a crash, and drops every
transaction after it without a word (:mod:`.wal`).
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import duckdb

from turnkeeper.spec import errors

from ..wakeups import Signals
from . import wal as wal_log
from .dialect import (
    committed_durably,
    configure,
    disk_full,
    interrupted,
    invalidated,
    translate,
)

T = TypeVar("T")

MAGIC = b"DUCK"
"""What a DuckDB database file holds at byte 8 (its header)."""

WAL_ADVICE = (
    "the write-ahead log {wal} is corrupt, so the store cannot replay the writes made "
    "since the last checkpoint: run `turnkeeper repair --db {path}` to keep every "
    "transaction before the damage (it copies both files aside first and reports what "
    "it kept and dropped), or restore the database and its .wal from a backup, or move "
    "{wal} aside to open the database in the state of the last checkpoint (every write "
    "made after it is lost)"
)
"""What the store says about a write-ahead log it cannot replay."""

_REPORTED = re.compile(r"entry at byte position (\d+)")
"""Where DuckDB says a damaged entry is: its payload's offset, :data:`~.wal.FRAME_HEAD`
bytes after the entry starts."""


def open_error(exc: duckdb.Error, path: str) -> errors.DatabaseError:
    """Translate a failure to open ``path`` (DuckDB's connect, which also replays the
    write-ahead log): a corrupt WAL or file, or a file that is not a DuckDB
    database, gets its own class and a message saying what the user can do
    (for a WAL, ``offset``: where the damaged entry starts); anything else goes
    through :func:`~.settings.translate`."""
    text = str(exc)
    wal = f"{path}.wal"
    if "while replaying WAL" in text:
        detail = f"{WAL_ADVICE.format(wal=wal, path=path)}; DuckDB said: {text}"
        found = _REPORTED.search(text)
        offset = int(found.group(1)) - wal_log.FRAME_HEAD if found else None
        return errors.CorruptDatabaseError(path, wal, offset, detail=detail)
    if "not a valid DuckDB database file" in text:
        return errors.ForeignDatabaseError(path, detail=f"not a DuckDB database file: {text}")
    if "database does not exist" in text:  # read-only, and the file went missing meanwhile
        return errors.StoreNotFoundError(path, detail=text)
    return translate(exc, path)


def check_file(path: str, *, read_only: bool) -> None:
    """Refuse a ``path`` that cannot hold a turnkeeper database before DuckDB tries
    it (DuckDB would, for a SQLite file, try to download an extension).

    Raises:
        InvalidInputError: ``path`` is a directory, or (to create a file) its
            folder does not exist.
        StoreNotFoundError: ``read_only`` and there is no file at ``path``.
        ForeignDatabaseError: the file is empty, or not a DuckDB database
            (another format: SQLite, Parquet, text …).
    """
    if path == ":memory:":
        return
    if os.path.isdir(path):
        raise errors.InvalidInputError("path", f"{path} is a directory, not a database file")
    if not os.path.exists(path):
        if read_only:
            raise errors.StoreNotFoundError(path)
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            raise errors.InvalidInputError(
                "path", f"the folder {folder} does not exist (a new database file needs one)"
            )
        return
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError as exc:
        raise errors.OperationalError(detail=f"cannot read {path}: {exc}") from exc
    if not head:
        raise errors.ForeignDatabaseError(
            path, detail="the file is empty (left by an open that failed?): delete it to start anew"
        )
    if head[8:12] != MAGIC:
        raise errors.ForeignDatabaseError(path, detail="not a DuckDB database file")


def check_wal(path: str) -> None:
    """Refuse to open ``path`` when its write-ahead log is damaged where DuckDB's
    replay would drop whole transactions without a word (:mod:`.wal`); a log
    whose end a crash tore, or one DuckDB refuses by itself, passes.

    Raises:
        CorruptDatabaseError: the log is damaged (``offset``: where; the message
            says how many transactions lie beyond and what to do).
        OperationalError: the log exists but cannot be read.
    """
    wal = f"{path}.wal"
    try:
        found = wal_log.scan(wal)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise errors.OperationalError(detail=f"cannot read {wal}: {exc}") from exc
    if found is None or not found.damaged:
        return
    try:  # where the damage starts: an entry before the stop may fail its checksum
        found = wal_log.scan(wal, verify=True) or found
    except OSError as exc:
        raise errors.OperationalError(detail=f"cannot read {wal}: {exc}") from exc
    detail = (
        f"it is damaged at byte {found.stop} of {found.size} "
        f"({wal_log.REASONS[found.reason or 'length']}): {found.kept_commits} transactions "
        f"end before that, {found.later_commits} whole transactions after it; "
        f"{WAL_ADVICE.format(wal=wal, path=path)}"
    )
    raise errors.CorruptDatabaseError(path, wal, found.stop, detail=detail)


def held_by_writer(path: str) -> bool:
    """Whether another process holds ``path`` to write (DuckDB's POSIX write
    lock on it); ``False`` where POSIX locks are not available. Opens and
    closes a descriptor of ``path``: call it only when this process does not
    have the file open (closing a descriptor drops the process's locks on it)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # refused only beside a write lock
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _identity(path: str) -> tuple[object, ...]:
    """What tells database files apart: device and inode (the same file under a
    hard link, a symlink or another spelling is one), else the resolved path."""
    try:
        st = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("inode", st.st_dev, st.st_ino)


TARGET_STRIPES = 1024
"""Locks a file's lease targets are spread over (see ``Tx.hold``)."""


@dataclass(eq=False)
class Targets:
    """A file's lease targets, spread over :data:`TARGET_STRIPES` stripes: each
    stripe's lock (``Tx.hold``; reentrant locks, which know their owner, so a
    cancellation landing as one is taken can be told taken or not), and the
    ticket of the last write on it that skipped the write lock (a renewal, a
    release), taken after its commit.
    ``ticket()`` hands out increasing numbers; a transaction takes one before
    its snapshot, so a stripe written since then has a larger one."""

    locks: tuple[threading.RLock, ...] = field(
        default_factory=lambda: tuple(threading.RLock() for _ in range(TARGET_STRIPES))
    )
    written: list[int] = field(default_factory=lambda: [0] * TARGET_STRIPES)
    ticket: Callable[[], int] = field(default_factory=lambda: itertools.count(1).__next__)


@dataclass(eq=False)
class SharedFile:
    """One database file's connection in this process, and who uses it.

    ``generation`` counts the times :func:`reopen` replaced ``con``;
    ``closed_by`` says why ``con`` is closed and not replaced yet (``None``
    while it is open)."""

    con: duckdb.DuckDBPyConnection
    read_only: bool
    keys: list[tuple[object, ...]]
    path: str = ":memory:"
    generation: int = 0
    closed_by: str | None = None
    write_lock: threading.RLock = field(default_factory=threading.RLock)
    targets: Targets = field(default_factory=Targets)
    signals: Signals = field(default_factory=Signals)
    users: weakref.WeakSet[object] = field(default_factory=weakref.WeakSet)
    """The store objects using it: one releasing twice is one release, and one
    lost before it could close (a cancellation as it opened) leaves the set
    when it is collected."""

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor on the connection.

        Raises:
            StoreInvalidatedError: the connection was closed to reopen the file,
                and that did not succeed yet (the next call tries again).
        """
        if self.closed_by is not None:
            raise errors.StoreInvalidatedError(self.path, detail=self.closed_by)
        try:
            return self.con.cursor()
        except duckdb.Error as exc:
            raise translate(exc, self.path) from exc


_FILES: dict[tuple[object, ...], SharedFile] = {}
_GUARD = threading.Lock()


def open_here(path: str) -> bool:
    """Whether a store object of this process has the file at ``path`` open."""
    with _GUARD:
        return _identity(path) in _FILES


def open_shared(path: str, *, read_only: bool, user: object, given: list[SharedFile]) -> SharedFile:
    """The connection to ``path`` for ``user`` (a store object): the one this
    process has, or a new one. It is appended to ``given`` before ``user`` is
    counted among its users, so a caller cancelled as this returns still has
    what to :func:`release`.

    The file's header is read (:func:`check_file`) only when this process does
    not have the file open yet: closing any descriptor of a file drops every
    POSIX lock the process holds on it, DuckDB's included, and another process
    could then open the file and write beside this one.

    A file another store object here holds read-only cannot be opened to write.

    Raises:
        StoreLockedError: another process holds the file; or this process
            holds it read-only and ``read_only`` is false.
        (and what :func:`check_file` and :func:`open_error` raise)
    """
    if path == ":memory:":
        shared = SharedFile(_connect(path, read_only, existed=True), read_only, [], path)
        given.append(shared)
        shared.users.add(user)
        return shared
    with _GUARD:
        key = _identity(path)
        found = _FILES.get(key)
        if found is not None:
            if found.read_only and not read_only:
                raise errors.StoreLockedError(
                    path, detail="another store object in this process has it open read-only"
                )
            given.append(found)
            found.users.add(user)
            return found
        check_file(path, read_only=read_only)
        existed = os.path.exists(path)
        if existed:
            try:
                check_wal(path)
            except errors.CorruptDatabaseError as exc:
                if held_by_writer(path):  # its writer may be writing the log as we read
                    detail = "another process has it open"
                    raise errors.StoreLockedError(path, detail=detail) from exc
                raise
        con = _connect(path, read_only, existed=existed)
        shared = SharedFile(con, read_only, [key, _identity(path)], path)
        given.append(shared)
        shared.users.add(user)
        for k in shared.keys:
            _FILES[k] = shared
        return shared


def _connect(path: str, read_only: bool, *, existed: bool) -> duckdb.DuckDBPyConnection:
    try:
        con = duckdb.connect(path, read_only=read_only)
    except duckdb.Error as exc:
        if not existed:  # leave no empty file behind to block the next open
            _remove_empty(path)
        raise open_error(exc, path) from exc
    try:
        configure(con)
    except (duckdb.Error, RuntimeError) as exc:
        con.close()
        if interrupted(exc):  # Ctrl-C as the store opened: a cancellation, never wrapped
            raise KeyboardInterrupt(str(exc)) from exc
        if not isinstance(exc, duckdb.Error):
            raise
        raise open_error(exc, path) from exc
    except BaseException:
        con.close()
        raise
    return con


def _remove_empty(path: str) -> None:
    try:
        if os.path.getsize(path) == 0:
            os.remove(path)
    except OSError:
        pass


def release(shared: SharedFile, user: object) -> bool:
    """``user`` is done with ``shared`` (again: nothing changes); returns whether
    no user is left (the last then checkpoints and closes the connection)."""
    with _GUARD:
        shared.users.discard(user)
        if shared.users:
            return False
        for k in shared.keys:
            if _FILES.get(k) is shared:
                del _FILES[k]
        return True


def recover(
    shared: SharedFile,
    call: Callable[[], T],
    *,
    writes: bool,
    started: list[bool] | None = None,
) -> T:
    """``call()`` (an operation on ``shared``), reopening the file when it found
    the database invalidated (:func:`reopen`) and calling once more if it
    committed nothing. A read (not ``writes``) also runs again when the file
    was reopened under it (its cursor closed as it fetched); a write cannot
    be (it holds the write lock or its lease stripe). ``started``: a read
    that hands rows to a caller's callback sets ``started[0]`` when it calls
    it; it then never runs again (the callback may have acted on what it got).

    Raises:
        StoreInvalidatedError: the file could not be reopened (yet), or the
            call it cut short had committed (an autocommit statement that did
            not get its result), or a callback had started, or the call run
            again met a database invalidated again.
        DiskFullError: a checkpoint found the disk full (the write's own
            commit's, or, run again, any): nothing of the write was committed.
    """
    seen = shared.generation
    try:
        return call()
    except errors.DatabaseError as exc:
        cause = exc.__cause__
        lost = isinstance(exc, errors.StoreInvalidatedError) or invalidated(cause)
        if not lost and (writes or shared.generation == seen):
            raise
        reopen(shared, seen)
        if committed_durably(cause):
            raise  # an autocommit statement that committed: never run twice
        if started is not None and started[0]:
            raise  # a caller's callback ran: never twice
    try:
        return call()
    except errors.StoreInvalidatedError as exc:
        cause = exc.__cause__
        if not writes or not disk_full(cause) or committed_durably(cause):
            raise
        # invalidated again by a checkpoint that found the disk full (a group's
        # commit, whose writes then each meet the invalidated database): the
        # write was not committed, and what helps is space
        detail = (
            "a checkpoint found the disk full and DuckDB invalidated the database, so "
            "nothing of this write was committed; free space and call again (the store "
            f"reopens the file at the next call); DuckDB said: {cause}"
        )
        raise errors.DiskFullError(shared.path, detail=detail) from cause


CLOSE_WAIT_S = 10.0
"""Longest :func:`reopen` waits (seconds) for the other threads' calls on an
invalidated connection to return (each fails at once) before it gives up."""


def reopen(shared: SharedFile, seen: int) -> None:
    """Open ``shared``'s file again after DuckDB invalidated the database (module
    docstring, reopening), unless it was reopened since generation ``seen``.

    Holds the file's write lock and every lease stripe (so no write of this
    process is running or committing), then, under the files' guard, closes
    the connection (every cursor of every store object on it), checks the
    write-ahead log (:func:`check_wal`) and connects again, which replays it.

    Raises:
        StoreInvalidatedError: the file could not be reopened now (``detail``
            says why; the connection stays closed and the next call tries
            again), or never (an in-memory database: its data is gone).
    """
    if shared.path == ":memory:":
        raise errors.StoreInvalidatedError(
            shared.path, detail="an in-memory database cannot be reopened: its data is gone"
        )
    held: list[threading.RLock] = []
    try:
        for lock in (shared.write_lock, *shared.targets.locks):
            held.append(lock)  # before the take: a cancellation never leaves one taken
            lock.acquire()
        if shared.generation != seen:
            return  # another call reopened it meanwhile
        with _GUARD:
            _close_when_idle(shared)
            try:
                check_wal(shared.path)
                con = _connect(shared.path, shared.read_only, existed=True)
            except errors.TurnkeeperError as exc:
                why = (
                    "reopening it found the old database still open (an unfinished query "
                    "result of this process?); the next call tries again"
                    if isinstance(exc, errors.StoreInvalidatedError)
                    else "reopening it failed; the next call tries again"
                )
                why = f"{why} ({type(exc).__name__}: {exc})"
                shared.closed_by = why
                raise errors.StoreInvalidatedError(shared.path, detail=why) from exc
            shared.con = con
            shared.closed_by = None
            shared.generation += 1
    finally:
        for lock in reversed(held):
            if lock._is_owned():  # type: ignore[attr-defined]
                lock.release()


def _close_when_idle(shared: SharedFile) -> None:
    """Close ``shared``'s connection and with it every cursor, waiting while
    another thread's call is running on one (DuckDB refuses to close a busy
    connection; on an invalidated database every call fails at once)."""
    deadline = time.monotonic() + CLOSE_WAIT_S
    pause = 0.001
    while True:
        try:
            shared.con.close()
        except duckdb.Error as exc:
            if "busy" not in str(exc) or time.monotonic() > deadline:
                why = f"its connection could not be closed to reopen it: {exc}"
                raise errors.StoreInvalidatedError(shared.path, detail=why) from exc
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            continue
        shared.closed_by = "its connection was closed to reopen it"
        return
