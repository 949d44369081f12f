"""pi session files written from a store (:func:`export_lines`, :func:`export_file`):
version 3, the form :mod:`.pi` reads back."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from turnkeeper.spec.errors import SessionNotFoundError
from turnkeeper.storage.protocol import Store

from .pi_parse import format_timestamp

CURRENT_VERSION = 3
"""The pi session format version this module writes (pi ``CURRENT_SESSION_VERSION``)."""

_HEADER_FIRST = ("type", "version", "id", "timestamp", "cwd")


def _dumps(value: Mapping[str, Any]) -> str:
    return orjson.dumps(value).decode("utf-8")


def export_lines(store: Store, session_id: str) -> Iterator[str]:
    """The session as pi version 3 JSONL lines (no trailing newlines), header first.

    Header: ``type``, ``version`` (3), ``id``, ``timestamp`` (the session's
    creation time, see :func:`~turnkeeper.formats.pi_parse.format_timestamp`),
    ``cwd``, then every other stored header field (``parentSession``, fields
    pi ignores) in stored order, ``channelType`` and ``channelId`` those of the
    session's binding when it is bound (``store.bindings``). Then every entry in sequence order as
    ``{"type", "id", "parentId", "timestamp", **payload}``. Opaque records
    are not exported.

    pi takes the last entry of a file as the leaf, so a leaf moved elsewhere
    with ``Store.branch`` (not persisted by pi either) is not represented.

    Raises:
        SessionNotFoundError: no session has this id (raised on first iteration).
    """
    session = store.sessions.get(session_id)
    if session is None:
        raise SessionNotFoundError(session_id)
    header: dict[str, Any] = {
        "type": "session",
        "version": CURRENT_VERSION,
        "id": session.id,
        "timestamp": format_timestamp(session.created_at),
        "cwd": session.cwd,
    }
    header.update((k, v) for k, v in session.header.items() if k not in _HEADER_FIRST)
    if session.channel_type is not None:  # its binding (store.bindings), as the seed's Header
        header["channelType"] = session.channel_type
        header["channelId"] = session.channel_id
    yield _dumps(header)
    for e in store.sessions.entries(session_id):
        base = {"type": e.kind, "id": e.id, "parentId": e.parent_id}
        yield _dumps({**base, "timestamp": format_timestamp(e.timestamp), **e.payload})


def export_file(store: Store, session_id: str, path: str | os.PathLike[str]) -> int:
    """Write the session to ``path`` as a pi version 3 file (UTF-8, ``\\n`` after
    every line; see :func:`export_lines`) and return the number of lines.

    The file is written to a new file in the target's folder, flushed to disk
    and renamed over the target, so a failure never leaves a half-written
    session file. When ``path`` is a symbolic link, the file it points at is
    replaced and the link kept (see :func:`_resolve_target`). A new file gets
    mode ``0o666`` less the umask (as ``open(path, "w")`` would); a replaced
    file keeps its permission bits. A target that is not a regular file (a
    device such as ``/dev/stdout``, a FIFO) is written to, never replaced.

    Raises:
        SessionNotFoundError: no session has this id; nothing is written.
        OSError: the file cannot be written (``ELOOP`` for a symlink loop); its
            ``filename`` is ``path`` as given, never the temporary file's.
    """
    target = _resolve_target(path)
    lines = list(export_lines(store, session_id))
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    mode = None if st is None else stat.S_IMODE(st.st_mode)
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    if st is not None and not stat.S_ISREG(st.st_mode):
        # A device, pipe or socket (/dev/stdout, a FIFO): written to, never replaced.
        try:
            with open(target, "wb") as out:
                out.write(data)
        except OSError as exc:
            if exc.errno is None:
                raise
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc
        return len(lines)
    try:
        fd, tmp = _create_beside(target)
        try:
            with os.fdopen(fd, "wb") as out:
                if mode is not None:
                    os.fchmod(out.fileno(), mode)
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as exc:  # name the file the caller asked for, not the temporary one
        if exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc
    return len(lines)


def _resolve_target(path: str | os.PathLike[str]) -> Path:
    """The file that writing ``path`` should replace: ``path`` with every symbolic
    link followed (a dangling link gives the missing file it names).

    Raises:
        OSError: ``ELOOP`` when the links form a loop.
    """
    target = Path(os.path.realpath(path))
    if target.is_symlink():  # realpath stops inside a loop without raising
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fspath(path))
    return target


_CREATE_ATTEMPTS = 100
"""Unique temporary names tried before giving up (a clash is ~impossible)."""


def _create_beside(target: Path) -> tuple[int, str]:
    """Create a new, empty file in ``target``'s folder: ``(descriptor, path)``.

    Created with ``os.open(..., O_CREAT | O_EXCL, 0o666)`` under a random
    name, so the process umask applies as for any new file (no umask read,
    which would race with other threads) and no existing file is reused.

    Raises:
        OSError: the folder does not exist or is not writable.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_CREATE_ATTEMPTS):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), os.fspath(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", os.fspath(target.parent))
