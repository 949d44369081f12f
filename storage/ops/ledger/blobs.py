"""Blob offload of large ledger payloads (sessionstore WithOffloadThreshold,
the offload and its pointer records, replay's blob verification).

A payload longer than the ledger's offload threshold (bytes) is written as a
*blob* before its record: the blob holds the record's envelope (the
idempotency id and kind, then the payload), is named by its sha256
(content-addressed: ``<prefix><sha256 hex>``, the prefix the tenant's and
session's, see :func:`blob_prefix`), and the ledger holds a *pointer record* in the
record's place: kind ``blobptr``, the record's idempotency id, and a JSON
payload naming the blob's key, sha256 and size. Both halves carry the same
idempotency id. A blob written whose pointer append then fails is an orphan,
never seen by replay, reclaimed by ledger GC (``gc.py``).

Blobs live in a :class:`BlobStore`: :class:`DatabaseBlobs` (the store's own
table ``ledger_blobs``, the default) or :class:`~.blob_files.FsspecBlobs` (a directory or
object store through ``fsspec``, the optional dependency ``turnkeeper[blobs]``,
in ``blob_files.py``).

Replay resolves a pointer (:func:`resolve`) and fails closed, typed, with the
pointer's sequence and the blob's key: ``DurableBodyTooLargeError`` (declared
size over the ceiling, the blob never fetched), ``BlobUnavailableError``
(absent or unreadable), ``BlobIntegrityError`` (bytes that do not hash to the
pointer's sha256), ``BlobPointerIDMismatchError`` (the blob's id is not the
pointer's), ``ReplayDecodeError`` (an undecodable pointer or envelope, a
pointer whose size is not a non-negative int or not the blob's length, or
whose key is not its own ledger's: ``<tenant's session prefix><its sha256>``).
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import BLOB_POINTER_KIND, LedgerEntry

from ... import bridge
from ...backend import STORE_NOW, Backend, Tx
from ...crypto.seal import OVERHEAD
from .records import envelope_error, loads_json, sha256

DEFAULT_OFFLOAD_THRESHOLD = 256 * 1024
"""Payloads longer than this many bytes are offloaded (sessionstore OffloadThreshold)."""

MAX_BODY_BYTES = 64 * 1024 * 1024
"""The replay ceiling: the largest blob (bytes, envelope included) a write
offloads and a replay fetches (sessionstore maxRuntimeBodyBytes)."""

_MAGIC = b"turnkeeper-blob/1\n"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_TEMP = re.compile(r"^[0-9a-f]{64}\.tmp-[0-9a-f]{32}$")

DEFAULT_TEMP_GRACE_S = 3600.0
"""How old (seconds) a put's temporary file must be before GC and the sweep
reclaim it (``<blob key>.tmp-<32 hex>``, left by a put killed mid-write):
younger, it may be a put still in progress in a live process."""


class BlobStore(Protocol):
    """Where offloaded blobs live, by key (text). ``put`` is idempotent (a key
    names its content); ``get`` returns the blob, only its first
    ``max_bytes`` bytes when it is longer (``None``: all of it), and raises
    ``BlobNotFoundError`` for an absent key; ``list`` returns the keys under
    a prefix (text, not a folder: ``a/b`` is under ``a/``), sorted;
    ``delete`` of an absent key does nothing. Other failures raise the
    store's own errors."""

    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str, max_bytes: int | None = None) -> bytes: ...
    def delete(self, key: str) -> None: ...
    def list(self, prefix: str) -> list[str]: ...


def blob_call(blobs: Any, method: str, *args: Any) -> Any:
    """``blobs.<method>(*args)``: a store of files or objects off the event loop
    of a native async store (``bridge.off_loop``); the database's own
    (:class:`DatabaseBlobs`) in the operation, as any of its statements."""
    call = getattr(blobs, method)
    if isinstance(blobs, DatabaseBlobs):
        return call(*args)
    return bridge.off_loop(call, *args)


def check_blob_store(blobs: object) -> None:
    """Refuse an object that cannot serve as a :class:`BlobStore`.

    Raises:
        InvalidBackendError: it lacks a callable ``put``, ``get``, ``delete``
            or ``list`` (``missing`` names the first).
    """
    for method in ("put", "get", "delete", "list"):
        if not callable(getattr(blobs, method, None)):
            raise errors.InvalidBackendError(
                method, detail=f"a {type(blobs).__name__} is not a blob store"
            )


_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_")
"""The bytes a key keeps as they are; every other byte of an id's UTF-8 is
``%XX`` (uppercase hex): no ``/``, ``.``, NUL or uppercase letter is left, so
no store can split, normalize or case-fold one id into another."""

_PIECE = 200
"""Characters of an escaped id per key segment: a longer id continues over
several segments, each but the last ending in ``+`` (so a segment stays
under 255 bytes, the common file-name limit)."""

ROOT = "blobs/"
"""The first segment of every blob key this turnkeeper makes. Keys written
before it (schema 23: ``[tenants/<tenant>/]sessions/<id>/<sha256>``, the ids
unescaped) begin with ``tenants/`` or ``sessions/``: still read by their
pointers, never taken for a key of this shape."""


def _segments(marker: str, text: str) -> str:
    escaped = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in text.encode())
    pieces = [escaped[i : i + _PIECE] for i in range(0, len(escaped), _PIECE)] or [""]
    return marker + "+/".join(pieces) + "/"


def blob_prefix(tenant: str, session_id: str) -> str:
    """The key prefix of ``session_id``'s blobs for ``tenant``:
    ``blobs/t=<tenant>/s=<session id>/``, each id escaped (every UTF-8 byte
    but ``a-z``, ``0-9``, ``-`` and ``_`` as ``%XX``) and, past 200
    characters, continued over segments ending in ``+``.

    The prefix is an injective function of the pair, no pair's prefix is a
    prefix of another's (a session ``a/b`` is no child of ``a``), and its
    segments are never empty, ``.``, ``..``, over 255 bytes, or different
    once case-folded: a directory store keeps every pair apart."""
    return ROOT + _segments("t=", tenant) + _segments("s=", session_id)


def _unescape(pieces: list[str]) -> str | None:
    text = "".join(pieces)
    try:
        raw = bytearray()
        at = 0
        while at < len(text):
            if text[at] == "%":
                raw.append(int(text[at + 1 : at + 3], 16))
                at += 3
            else:
                raw.append(ord(text[at]))
                at += 1
        return raw.decode()
    except (ValueError, UnicodeDecodeError):
        return None


def _take(parts: list[str], at: int, marker: str) -> tuple[str, int] | None:
    """The id whose segments start at ``parts[at]`` with ``marker``, and the
    index past them; ``None``: not an id's segments."""
    if at >= len(parts) or not parts[at].startswith(marker):
        return None
    pieces = [parts[at][len(marker) :]]
    while pieces[-1].endswith("+"):
        pieces[-1] = pieces[-1][:-1]
        at += 1
        if at >= len(parts):
            return None
        pieces.append(parts[at])
    text = _unescape(pieces)
    return None if text is None else (text, at + 1)


def split_key(key: str) -> tuple[str, str, str] | None:
    """``(tenant, session_id, rest)`` of a key under a :func:`blob_prefix`
    (``rest`` the text after it), only when the prefix is the one
    :func:`blob_prefix` makes of that pair; ``None`` for any other key."""
    if not key.startswith(ROOT):
        return None
    parts = key[len(ROOT) :].split("/")
    tenant = _take(parts, 0, "t=")
    session = _take(parts, tenant[1], "s=") if tenant else None
    if tenant is None or session is None or session[1] >= len(parts):
        return None
    prefix = blob_prefix(tenant[0], session[0])
    if not key.startswith(prefix):
        return None  # an escape this turnkeeper never writes (%2f, a split id): another key
    return tenant[0], session[0], key[len(prefix) :]


def parse_key(key: str) -> tuple[str, str, str]:
    """``(tenant, session_id, sha256 hex)`` of a blob key :func:`blob_prefix`
    made (its exact inverse).

    Raises:
        InvalidInputError: ``key`` is no such key.
    """
    found = split_key(key)
    if found is None or not _DIGEST.match(found[2]):
        raise errors.InvalidInputError("key", f"{key!r} is not a ledger blob key")
    return found


def is_blob_name(name: str) -> bool:
    """Whether ``name`` (a key less its session prefix) has the offload shape:
    a lowercase sha256 hex digest."""
    return bool(_DIGEST.match(name))


def is_temp_name(name: str) -> bool:
    """Whether ``name`` (a key less its session prefix) is the temporary file
    of a put (:class:`~.blob_files.FsspecBlobs`): a blob name, ``.tmp-`` and 32 lowercase
    hex digits."""
    return bool(_TEMP.match(name))


@runtime_checkable
class TempFiles(Protocol):
    """A blob store whose puts write temporary files under their keys'
    prefixes (:class:`~.blob_files.FsspecBlobs`): ``temp_ages`` gives the age in seconds
    (its clock less the file's last modification) of each of ``keys`` still
    there; a key gone meanwhile is left out. Other failures raise the
    store's own errors."""

    def temp_ages(self, keys: Sequence[str]) -> dict[str, float]: ...


def envelope(entry: LedgerEntry, gen: int = 0) -> bytes:
    """The blob of ``entry``: a magic line, a JSON line with its idempotency id
    and kind (and ``gen``, its generation, when above 0), then its payload
    exactly. A generation is the same record's blob under another sha256 (so
    another key), written when GC condemned the earlier one's key (``condemn.py``)."""
    return envelope_head(entry, gen) + entry.payload


def envelope_head(entry: LedgerEntry, gen: int = 0) -> bytes:
    """What :func:`envelope` puts before the payload: the magic line and the
    JSON head line (``id``, ``kind``, ``gen`` when above 0)."""
    head: dict[str, object] = {"id": entry.idempotency_id, "kind": entry.kind}
    if gen:
        head["gen"] = gen
    return _MAGIC + json.dumps(head, sort_keys=True).encode() + b"\n"


def offload(
    blobs: BlobStore,
    tenant: str,
    session_id: str,
    entry: LedgerEntry,
    max_bytes: int,
    gen: int = 0,
    seal: Callable[[str, bytes], bytes] | None = None,
) -> LedgerEntry:
    """Write ``entry``'s blob (generation ``gen``, see :func:`envelope`) to
    ``blobs`` and return its pointer entry (kind ``blobptr``, the same
    idempotency id). The pointer is a function of the entry and generation,
    so a redelivery makes the same pointer (and finds the original).
    ``seal(key, envelope)`` is the blob as stored (``sealing.seal_blob``: a
    sealed session's blob is sealed under its data key; default: as it is);
    the key, the pointer's ``sha256`` and ``size`` are the clear envelope's.

    Raises:
        DurableBodyTooLargeError: the blob would exceed ``max_bytes`` (``seq``
            0); nothing is written.
        KeyUnavailableError: ``seal``'s: no key for a sealed session.
        Exception: the blob store's failure; the pointer is not appended.
    """
    blob = envelope(entry, gen)
    digest = sha256(blob)
    key = blob_prefix(tenant, session_id) + digest
    if len(blob) > max_bytes:
        raise errors.DurableBodyTooLargeError(0, key, len(blob), max_bytes)
    blob_call(blobs, "put", key, blob if seal is None else seal(key, blob))
    pointer = json.dumps({"key": key, "sha256": digest, "size": len(blob)}, sort_keys=True)
    return LedgerEntry(BLOB_POINTER_KIND, pointer.encode(), entry.idempotency_id)


def size_valid(size: object) -> bool:
    """A pointer's declared size is a byte count: an ``int`` (not a ``bool``),
    not negative."""
    return isinstance(size, int) and not isinstance(size, bool) and size >= 0


def legacy_prefix(tenant: str, session_id: str) -> str:
    """The key prefix blobs had before schema 24 (``sessions/<id>/``, under
    ``tenants/<tenant>/`` for a tenant other than ``""``): their pointers
    still name such keys, read as before."""
    head = f"tenants/{tenant}/" if tenant else ""
    return f"{head}sessions/{session_id}/"


def pointer_in_ledger(key: str, digest: str, tenant: str, session_id: str) -> bool:
    """A pointer names its own ledger's blob: its key is ``tenant``'s
    ``session_id``'s prefix (:func:`blob_prefix`, or for a blob written
    before schema 24 :func:`legacy_prefix`) and its sha256, lowercase hex
    (content addressing; a blob of another session or tenant, or a key
    elsewhere, is refused whatever its id)."""
    return bool(_DIGEST.match(digest)) and key in (
        blob_prefix(tenant, session_id) + digest,
        legacy_prefix(tenant, session_id) + digest,
    )


def size_matches(size: int, got: int) -> bool:
    """The fetched blob is as long (bytes) as its pointer declares."""
    return size == got


def parse_pointer(tenant: str, session_id: str, seq: int, payload: bytes) -> tuple[str, str, int]:
    """A pointer record's ``(key, sha256, size)``, checked: ``size`` a
    non-negative ``int`` (:func:`size_valid`), the key the record's own
    ledger's blob (:func:`pointer_in_ledger`).

    Raises:
        ReplayDecodeError: the payload is not a pointer (an ``EnvelopeError``
            is ``__cause__``), or one whose size or key fails those checks.
    """
    try:
        body: Any = loads_json(payload)
        key, digest, size = body["key"], body["sha256"], body["size"]
        if not (isinstance(key, str) and isinstance(digest, str)):
            raise ValueError("key or sha256 of the wrong type")
        if not size_valid(size):
            raise ValueError(f"size {size!r} is not a non-negative integer")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as failure:
        raise errors.ReplayDecodeError(
            session_id, seq, detail="its blob pointer does not decode"
        ) from envelope_error("a blob pointer's body is not its JSON", failure)
    if not pointer_in_ledger(key, digest, tenant, session_id):
        raise errors.ReplayDecodeError(
            session_id,
            seq,
            detail=f"its blob pointer names {key!r}, not a blob of this ledger "
            f"({blob_prefix(tenant, session_id)}<its sha256>)",
        )
    return key, digest, size


def blob_hash_ok(want: str, got: str) -> bool:
    """Replay's hash fence: the fetched blob hashes to the pointer's sha256."""
    return hmac.compare_digest(want, got)


def resolve(
    blobs: BlobStore,
    tenant: str,
    session_id: str,
    seq: int,
    outer_id: str,
    payload: bytes,
    max_bytes: int,
    open_blob: Callable[[str, bytes], bytes] | None = None,
) -> tuple[str, bytes]:
    """The ``(kind, payload)`` of the offloaded record whose pointer, at ``seq``
    of ``tenant``'s ``session_id`` under idempotency id ``outer_id``, is
    ``payload``; verified (see the module docstring for the errors, each
    carrying ``seq`` and the key; a blob whose length is not the pointer's
    declared size is a ``ReplayDecodeError``). ``open_blob(key, stored)`` is
    the clear envelope of the stored blob (``sealing.open_blob``; default: as
    stored): it is opened before it is hashed and measured (a sealed blob is
    read up to its declared size plus the seal's overhead, and one byte).

    Raises (besides those above):
        PayloadAuthenticationError: a sealed session's blob that is clear or
            fails authentication (record id its key, field ``data``).
        KeyUnavailableError: no key to open it."""
    key, want, size = parse_pointer(tenant, session_id, seq, payload)
    if size > max_bytes:
        raise errors.DurableBodyTooLargeError(seq, key, size, max_bytes)
    try:  # one byte over the declared size is enough to tell a longer blob
        blob = blob_call(blobs, "get", key, size + OVERHEAD + 1)
    except Exception as failure:  # any store failure: fail closed, typed
        raise errors.BlobUnavailableError(seq, key) from failure
    if open_blob is not None:
        blob = open_blob(key, blob)
    got = sha256(blob)
    if not blob_hash_ok(want, got):
        raise errors.BlobIntegrityError(seq, key, want, got)
    if not size_matches(size, len(blob)):
        raise errors.ReplayDecodeError(
            session_id,
            seq,
            detail=f"its blob pointer says {size} bytes, blob {key!r} has {len(blob)}",
        )
    try:
        if not blob.startswith(_MAGIC):
            raise ValueError("no blob envelope")
        head, _, body = blob[len(_MAGIC) :].partition(b"\n")
        inner: Any = loads_json(head)
        inner_id, kind = inner["id"], inner["kind"]
        if not isinstance(inner_id, str) or not isinstance(kind, str):
            raise ValueError("id or kind of the wrong type")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as failure:
        raise errors.ReplayDecodeError(
            session_id, seq, detail=f"blob {key!r} does not decode"
        ) from envelope_error("a blob's envelope is not its magic line and JSON head", failure)
    if inner_id != outer_id:
        raise errors.BlobPointerIDMismatchError(seq, key, outer_id, inner_id)
    return kind, body


def _like(prefix: str) -> str:
    """``prefix`` as a LIKE pattern (escape ``\\``) matching the keys under it."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class DatabaseBlobs:
    """The default blob store: the store's own table ``ledger_blobs`` (each
    call one transaction of its own). Keys are ledger blob keys
    (:func:`blob_prefix`): the tenant and session id are kept with the blob
    in columns of their own (decoded exactly from the key), so a session
    delete removes its blobs and nothing else."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``; a key already stored is left as it is.

        Raises:
            InvalidInputError: not a ledger blob key.
            DatabaseError: the write failed.
        """
        tenant, session_id, _ = parse_key(key)
        self.db.write(
            "ledger_blob_put",
            lambda tx: tx.exec(
                "INSERT INTO ledger_blobs (key, tenant, session_id, data, size, written_at) "
                f"VALUES (?, ?, ?, ?, ?, {STORE_NOW}) ON CONFLICT (key) DO NOTHING",
                [key, tenant, session_id, data, len(data), tx.now],
            ),
        )

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """The bytes under ``key`` (only the first ``max_bytes`` of a longer
        blob: no more are read).

        Raises:
            BlobNotFoundError: none. DatabaseError: the read failed.
        """

        def read(tx: Tx) -> Any:
            if max_bytes is None:
                return tx.one("SELECT data FROM ledger_blobs WHERE key = ?", [key])
            head = tx.dialect.bytes_head("data")
            return tx.one(f"SELECT {head} FROM ledger_blobs WHERE key = ?", [max_bytes, key])

        row = self.db.read("ledger_blob_get", read)
        if row is None:
            raise errors.BlobNotFoundError(key)
        return bytes(row[0])

    def delete(self, key: str) -> None:
        """Remove the blob under ``key`` (none: nothing). Raises: DatabaseError."""
        self.db.write(
            "ledger_blob_delete",
            lambda tx: tx.exec("DELETE FROM ledger_blobs WHERE key = ?", [key]),
        )

    def list(self, prefix: str) -> list[str]:
        """The keys under ``prefix``, sorted. Raises: DatabaseError."""
        rows = self.db.read(
            "ledger_blob_list",
            lambda tx: tx.rows(
                "SELECT key FROM ledger_blobs WHERE key LIKE ? ESCAPE '\\' ORDER BY key",
                [_like(prefix)],
            ),
        )
        return sorted(str(r[0]) for r in rows)
