"""DuckDB's write-ahead log read as bytes: where DuckDB's replay stops, and
whether whole transactions lie beyond that point.

The format (WAL version 2, what DuckDB 2.x writes for a database that is not
encrypted; ``src/storage/write_ahead_log.cpp`` and ``wal_replay.cpp``): a
header entry without length or checksum (serialized fields: 100, the entry
type ``WAL_VERSION`` (98); 101, the version; 102, the database's 16-byte
identifier; 103, the checkpoint iteration; then the end mark ``0xFFFF``),
then frames: the payload's length (8 bytes, little-endian), its checksum (8
bytes, :func:`checksum`) and the payload, which starts with field 100, the
entry's type. Each transaction's entries end with a ``WAL_FLUSH`` entry,
whose frame is always the same 21 bytes (:data:`FLUSH`). DuckDB reports a
damaged entry at its payload's offset, 16 bytes after the frame starts.

What DuckDB's replay does with damage: an entry whose checksum does not match
refuses the open; a length running past the end of the file, or a header it
cannot read, it takes for a write torn by a crash, and it replays every
transaction before that point and drops the rest without a word (the next
write then truncates the file there). A crash can tear only the last
transaction, so whole transactions after that point (their ``WAL_FLUSH``
frames) mean damage, not a torn write: :attr:`Scan.damaged`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

WAL_VERSION_TYPE = 98
"""The header entry's type."""
SUPPORTED_VERSION = 2
"""The one WAL version read here."""
OTHER_VERSIONS = (1, 3)
"""Versions DuckDB reads that are not judged here: 1 (old, without checksums), 3
(encrypted); any other version is a damaged header."""
FLUSH = struct.pack("<QQ", 5, 0x5E3DED2F727DFEE7) + b"\x64\x00\x64\xff\xff"
"""A ``WAL_FLUSH`` frame (the end of a transaction): length 5, its checksum, and
the payload (field 100 = 100, end mark)."""
FRAME_HEAD = 16
"""Bytes before a frame's payload: its length and its checksum."""
_HEADER_MAX = 256
"""Bytes read for the header (it takes about 40)."""
_CHUNK = 1 << 20
"""Bytes read at a time while looking for :data:`FLUSH` frames."""
_MASK = (1 << 64) - 1

REASONS = {
    "header": "its header cannot be read",
    "length": "an entry's length runs past the end of the file",
    "checksum": "an entry's checksum does not match",
}
"""What each :attr:`Scan.reason` means, in words."""


@dataclass(frozen=True, slots=True)
class Scan:
    """A write-ahead log as DuckDB's replay would take it (offsets and sizes in
    bytes from the file's start).

    ``stop`` is the first frame replay cannot take (``None``: it takes every
    frame to the end of the file), for ``reason``: ``"header"`` (the header
    cannot be read), ``"length"`` (a length runs past the end of the file, or
    fewer than 16 bytes remain), or ``"checksum"`` (only when checksums were
    verified). Replay keeps what ends at ``kept_end`` (the end of the last
    whole transaction before ``stop``, or the header), ``kept_commits``
    transactions; ``later_commits`` whole transactions end after ``stop``.
    """

    size: int
    header_end: int | None
    stop: int | None
    reason: str | None
    kept_end: int
    kept_commits: int
    later_commits: int

    @property
    def damaged(self) -> bool:
        """Whether replay would refuse the file or drop whole transactions: a
        checksum that does not match, or committed transactions after the stop
        (a torn write, which a crash leaves, has none after it)."""
        return self.stop is not None and (self.reason == "checksum" or self.later_commits > 0)

    @property
    def dropped(self) -> int:
        """Bytes after :attr:`kept_end`: what replay (or a repair) leaves out."""
        return self.size - self.kept_end


def checksum(data: bytes) -> int:
    """DuckDB's checksum of ``data`` (``src/common/checksum.cpp``): each 8-byte
    word times a constant, XORed into 5381, and the 0-7 remaining bytes
    through MurmurHash64A (seed ``0xe17a1465``)."""
    words = len(data) // 8
    result = 5381
    for (word,) in struct.iter_unpack("<Q", data[: words * 8]):
        result ^= (word * 0xBF58476D1CE4E5B9) & _MASK
    rest = data[words * 8 :]
    if rest:
        m = 0xC6A4A7935BD1E995
        h = (0xE17A1465 ^ (len(rest) * m)) & _MASK
        h = ((h ^ int.from_bytes(rest, "little")) * m) & _MASK
        h ^= h >> 47
        h = (h * m) & _MASK
        h ^= h >> 47
        result ^= h
    return result


class _Header:
    """Reads the header entry's serialized fields."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def field(self) -> int:
        if self.at + 2 > len(self.data):
            raise ValueError("the header ends early")
        value = int.from_bytes(self.data[self.at : self.at + 2], "little")
        self.at += 2
        return value

    def varint(self) -> int:
        value = shift = 0
        while True:
            if self.at >= len(self.data) or shift > 63:
                raise ValueError("a bad number in the header")
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value


def _header_end(data: bytes) -> int | None:
    """The offset after the header entry, ``-1`` when it cannot be read (damage),
    or ``None`` when it is a version not read here."""
    h = _Header(data)
    try:
        if h.field() != 100 or h.varint() != WAL_VERSION_TYPE or h.field() != 101:
            return -1
        version = h.varint()
        if version in OTHER_VERSIONS:
            return None
        if version != SUPPORTED_VERSION:
            return -1
        field = h.field()
        if field == 102:
            if h.varint() != 16:
                return -1
            for _ in range(16):
                h.varint()
            field = h.field()
        if field == 103:
            h.varint()
            field = h.field()
        return h.at if field == 0xFFFF else -1
    except ValueError:
        return -1


def _later_flushes(f: BinaryIO, start: int) -> int:
    """How many :data:`FLUSH` frames begin at or after ``start``."""
    count = 0
    f.seek(start)
    carry = b""
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            return count
        data = carry + chunk
        at = data.find(FLUSH)
        while at >= 0:
            count += 1
            at = data.find(FLUSH, at + len(FLUSH))
        # keep a tail shorter than a frame: a frame split across reads is found
        # once, and one found already is never found again
        carry = data[-(len(FLUSH) - 1) :]


def scan(wal: str, *, verify: bool = False) -> Scan | None:
    """Read the write-ahead log at ``wal`` as DuckDB's replay would (frame
    lengths; with ``verify`` every checksum too); ``None`` for a log of a
    version not read here (encrypted, or an old one) or an empty file.

    Raises:
        OSError: the file cannot be read (``FileNotFoundError``: there is none).
    """
    with open(wal, "rb", buffering=_CHUNK) as f:
        size = f.seek(0, 2)
        if size == 0:
            return None
        f.seek(0)
        header = _header_end(f.read(_HEADER_MAX))
        if header is None:
            return None
        if header < 0:
            return Scan(size, None, 0, "header", 0, 0, _later_flushes(f, 0))
        at, kept_end, commits = header, header, 0
        stop: int | None = None
        reason: str | None = None
        while at < size:
            f.seek(at)
            head = f.read(FRAME_HEAD)
            if len(head) < FRAME_HEAD:
                stop, reason = at, "length"
                break
            length, stored = struct.unpack("<QQ", head)
            end = at + FRAME_HEAD + length
            if end > size:
                stop, reason = at, "length"
                break
            if verify or length == 5:
                payload = f.read(length)
                if verify and checksum(payload) != stored:
                    stop, reason = at, "checksum"
                    break
                if head + payload == FLUSH:
                    kept_end, commits = end, commits + 1
            at = end
        later = 0 if stop is None else _later_flushes(f, stop + 1)
        return Scan(size, header, stop, reason, kept_end, commits, later)
