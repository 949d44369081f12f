"""Blobs in a directory or object store through ``fsspec``
(:class:`FsspecBlobs`, ``turnkeeper[blobs]``): durable local puts (attack
finding F2 on issue 19), deletes and listings that never trust a cached
listing (F3), the ages of killed puts' temporary files for GC (F7). The
keys, the envelope and the :class:`~.blobs.BlobStore` protocol are
``blobs.py``'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from turnkeeper.spec import errors

from .blobs import split_key


def canonical_directory(given: str, path: str) -> str:
    """``path`` (the local directory ``given`` names, made absolute) with its
    symbolic links resolved; it need not exist yet.

    Raises:
        PersistencePathError: a symbolic-link loop or another failure to
            examine it (the ``OSError`` is ``__cause__``), a NUL byte in it, or
            it is not a directory.
    """
    try:
        os.stat(path)
    except FileNotFoundError:
        pass  # made on the first put: resolve what exists of it
    except (OSError, ValueError) as failure:  # ValueError: a NUL byte in it
        raise errors.PersistencePathError(given, detail=str(failure)) from failure
    else:
        if not os.path.isdir(path):
            raise errors.PersistencePathError(given, detail="not a directory")
    return os.path.realpath(path).rstrip("/") or "/"


_LOCAL_PATH_BYTES = 4095
"""The longest local path (bytes) a put makes (Linux's PATH_MAX less its NUL)."""

_OBJECT_KEY_BYTES = 1024
"""The longest path (bytes, the bucket's name included) a put makes on an
object store: S3's key limit."""

_TEMP_SUFFIX_BYTES = len(".tmp-") + 32
"""What a put's temporary file adds to the blob's path."""


_SYNCED_MAX = 4096
"""The most directories a local :class:`FsspecBlobs` remembers as synced
(then it forgets them all and syncs each chain once again)."""

_NO_DIRECTORY_SYNC = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF})
"""The errors of ``fsync`` on a directory that mean the platform or
filesystem does not sync directories (skipped), not a failed write."""


def sync_file(fd: int) -> None:
    """``os.fsync`` of an open file: its bytes are on disk when it returns.

    Raises:
        OSError: the sync failed.
    """
    os.fsync(fd)


def sync_directory(path: str) -> None:
    """``os.fsync`` of directory ``path`` (opened read-only), so the entries
    made or renamed in it are on disk. Skipped quietly where directories
    cannot be synced: Windows (no directory descriptor) and a filesystem
    whose ``fsync`` of a directory fails with ``EINVAL``, ``ENOTSUP`` or
    ``EBADF``.

    Raises:
        OSError: the directory cannot be opened, or its sync failed otherwise.
    """
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as failure:
        if failure.errno not in _NO_DIRECTORY_SYNC:
            raise
    finally:
        os.close(fd)


def _longer_id(key: str) -> str:
    """The field a too-long ``key`` is too long for: ``tenant`` or
    ``session_id``, whichever is longer (``key`` for another key)."""
    found = split_key(key)
    if found is None:
        return "key"
    return "tenant" if len(found[0].encode()) > len(found[1].encode()) else "session_id"


class FsspecBlobs:
    """A blob store in a directory or object store through ``fsspec``
    (``turnkeeper[blobs]``): blob ``key`` is the file ``<root>/<key>``.
    Without ``fs`` (an ``fsspec.AbstractFileSystem``), ``root`` is a local
    path or an fsspec URL naming its filesystem (``s3://bucket/prefix``:
    ``turnkeeper[s3]``; ``file://…``). A put writes a temporary file next to the blob and moves it
    into place, so a reader never sees half a blob under its key; on a local
    directory the put is durable when it returns (the file and its
    directory fsync'd, :meth:`put`), so an acknowledged pointer's blob
    survives a power loss or an OS crash.

    A put killed mid-write leaves its temporary file
    (``<key>.tmp-<32 hex>``); :meth:`temp_ages` tells GC and the sweep how old
    each is, by ``clock`` (default ``time.time``), so they reclaim those older
    than their grace.

    A local ``root`` is made canonical once, here (absolute, its symbolic
    links resolved), so a later change of directory or link does not move
    the blobs.

    Raises:
        PersistencePathError: a local ``root`` that resolves through a
            symbolic-link loop, cannot be examined, or is not a directory.
        InvalidInputError: a URL of a protocol fsspec does not know, or
            whose filesystem's package is not installed.
    """

    def __init__(
        self, root: str, fs: Any = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        given = root
        self.clock = clock
        """The wall clock (seconds since the epoch) a temporary file's age is
        judged by (:meth:`temp_ages`)."""
        if fs is None:
            from fsspec.core import url_to_fs  # type: ignore[import-untyped]

            try:
                fs, root = url_to_fs(root)
            except (ValueError, ImportError) as failure:
                raise errors.InvalidInputError(
                    "root", f"{root!r} names no filesystem fsspec can open: {failure}"
                ) from failure
        self.fs = fs
        self.root = str(fs._strip_protocol(root)).rstrip("/")
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        self.max_path = _OBJECT_KEY_BYTES
        self.local = "file" in protocols or "local" in protocols
        """Whether the blobs are files of this machine (under ``root``)."""
        if self.local:
            self.root = canonical_directory(given, self.root)
            self.max_path = _LOCAL_PATH_BYTES
        self._synced: set[str] = set()
        """Local directories whose chain up to the root's parent this store
        has fsync'd (at most :data:`_SYNCED_MAX`)."""

    def _path(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise errors.InvalidInputError("key", f"{key!r} leaves the blob root")
        return posixpath.join(self.root, key)

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` (a temporary file moved into place; on
        a local directory fsync'd, renamed, its directory fsync'd: durable
        when this returns).

        Raises:
            InvalidInputError: a key leaving the root (``key``), or whose path
                (with its temporary suffix) is longer than the filesystem
                takes (``tenant`` or ``session_id``, the longer: an id of
                thousands of bytes); nothing is written.
            Exception: the filesystem's errors.
        """
        path = self._path(key)
        if len(path.encode()) + _TEMP_SUFFIX_BYTES > self.max_path:
            raise errors.InvalidInputError(
                _longer_id(key),
                f"its blob path is {len(path.encode())} bytes, over the "
                f"{self.max_path - _TEMP_SUFFIX_BYTES} this blob store takes",
            )
        temp = f"{path}.tmp-{uuid.uuid4().hex}"
        if self.local:
            self._put_local(path, temp, data)
            return
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.fs.pipe_file(temp, data)
        self.fs.mv(temp, path)

    def _put_local(self, path: str, temp: str, data: bytes) -> None:
        """A durable local put (attack finding F2 on issue 19): the blob is on
        disk before the put returns, so before the append that points at it
        commits. The temporary file is written and fsync'd, renamed over
        ``path``, then the blob's directory is fsync'd (the rename's entry),
        and, the first time this store puts into a directory, each directory
        above it up to the root (entries a ``makedirs`` may just have made;
        the root's parent too when this put made the root). A failed
        put removes its temporary file."""
        folder = os.path.dirname(path)
        root_made = not os.path.isdir(self.root)
        os.makedirs(folder, exist_ok=True)
        try:
            with open(temp, "xb") as out:
                out.write(data)
                out.flush()
                sync_file(out.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        sync_directory(folder)
        if folder not in self._synced:
            at, inside = folder, self.root.rstrip("/") + "/"
            while at != self.root and at.startswith(inside):
                at = os.path.dirname(at)
                sync_directory(at)  # the entry of the directory below it
            if root_made:
                sync_directory(os.path.dirname(self.root) or self.root)
            if len(self._synced) >= _SYNCED_MAX:
                self._synced.clear()
            self._synced.add(folder)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """The bytes under ``key`` (only the first ``max_bytes`` of a longer
        blob: a ranged read).

        Raises: BlobNotFoundError (no such file); the filesystem's other errors."""
        try:
            return bytes(self.fs.cat_file(self._path(key), start=0, end=max_bytes))
        except FileNotFoundError as missing:
            raise errors.BlobNotFoundError(key) from missing

    def delete(self, key: str) -> None:
        """Remove the blob under ``key`` (none: nothing). The delete is asked
        of the store itself, never judged from a cached listing (s3fs's
        listings cache, on by default, answered ``exists`` from a listing
        taken before another process wrote the blob: attack finding F3);
        ``FileNotFoundError`` means it is already gone.

        Raises: the filesystem's other errors."""
        path = self._path(key)
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass  # already gone
        finally:
            self.fs.invalidate_cache(path)

    def temp_ages(self, keys: Sequence[str]) -> dict[str, float]:
        """The age (seconds: :attr:`clock` less the file's last modification)
        of each of ``keys`` still there (see :class:`TempFiles`).

        Raises: the filesystem's errors but ``FileNotFoundError``."""
        ages: dict[str, float] = {}
        for key in keys:
            try:
                when = self.fs.modified(self._path(key))
            except FileNotFoundError:
                continue  # renamed into place or reclaimed meanwhile
            if isinstance(when, datetime) and when.tzinfo is None:
                when = when.replace(tzinfo=UTC)  # fsspec's naive times are UTC
            stamp = when.timestamp() if isinstance(when, datetime) else float(when)
            ages[key] = self.clock() - stamp
        return ages

    def list(self, prefix: str) -> list[str]:
        """The keys under ``prefix`` (a folder path ending in ``/``), sorted,
        as the store holds them now: the filesystem's cached listings of the
        folder and its parents are dropped first.

        Raises: the filesystem's errors."""
        folder = self._path(prefix.rstrip("/"))
        self.fs.invalidate_cache(folder)
        if not self.fs.exists(folder):
            return []
        start = len(self.root) + 1
        return sorted(str(p)[start:] for p in self.fs.find(folder))
