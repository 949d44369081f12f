"""How a LangGraph thread is laid out in its turnkeeper session, without I/O.

A thread is one session, found through its channel binding
``("langgraph", thread_id)``. Each checkpoint is one ``custom`` entry
(``customType`` :data:`CHECKPOINT`) and each pending write one more
(:data:`WRITE`); entries never change, so a write that LangGraph replaces
(its special channels: ``WRITES_IDX_MAP``) is a later entry of a higher
version under the same key, and the highest version wins on read.

Entry ids carry the keys, so that a point read finds a checkpoint and a
prefix read (``LIKE``) finds a namespace's checkpoints or a checkpoint's
writes without reading the session:

- checkpoint: ``lgc/<ns digest>/<checkpoint id as hex>``; hex of the UTF-8
  bytes keeps the byte order of the ids, so ``ORDER BY id`` is LangGraph's
  order (``checkpoint_id`` compared as a string) under any collation;
- write: ``lgw/<ns digest>/<checkpoint digest>/<task digest>/<idx>/<version>``.

Values are the saver's ``serde.dumps_typed`` output, the bytes in base64,
so every value round-trips exactly (``(type, bytes)``).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    CheckpointTuple,
    PendingWrite,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

CHANNEL_TYPE = "langgraph"
"""The channel type of a thread's binding: ``("langgraph", thread_id)``."""
CHECKPOINT = "langgraph.checkpoint"
"""``customType`` of a checkpoint entry."""
WRITE = "langgraph.write"
"""``customType`` of a pending-write entry."""
DIGEST_CHARS = 16


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS]


def checkpoint_prefix(ns: str | None) -> str:
    """``LIKE`` prefix of the checkpoint entries of namespace ``ns`` (every
    namespace: ``None``)."""
    return "lgc/" if ns is None else f"lgc/{_digest(ns)}/"


def checkpoint_entry_id(ns: str, checkpoint_id: str) -> str:
    """The entry id of checkpoint ``checkpoint_id`` in namespace ``ns``."""
    return checkpoint_prefix(ns) + checkpoint_id.encode("utf-8").hex()


def writes_prefix(ns: str, checkpoint_id: str) -> str:
    """``LIKE`` prefix of the write entries of one checkpoint."""
    return f"lgw/{_digest(ns)}/{_digest(checkpoint_id)}/"


def write_entry_id(ns: str, checkpoint_id: str, task_id: str, idx: int, version: int) -> str:
    return f"{writes_prefix(ns, checkpoint_id)}{_digest(task_id)}/{idx}/{version}"


def encode(typed: tuple[str, bytes]) -> list[str]:
    """``serde.dumps_typed`` output as JSON: ``[type, base64 of the bytes]``."""
    return [typed[0], base64.b64encode(typed[1]).decode("ascii")]


def decode(value: Sequence[str]) -> tuple[str, bytes]:
    return (value[0], base64.b64decode(value[1]))


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """One checkpoint entry's fields: namespace, id, parent id, the typed
    checkpoint and metadata (``serde`` output), the run id (for
    ``delete_for_runs``), and the entry id."""

    ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: tuple[str, bytes]
    metadata: tuple[str, bytes]
    run_id: str | None
    entry_id: str

    def payload(self) -> dict[str, Any]:
        return {
            "customType": CHECKPOINT,
            "data": {
                "ns": self.ns,
                "id": self.checkpoint_id,
                "parent": self.parent_id,
                "checkpoint": encode(self.checkpoint),
                "metadata": encode(self.metadata),
                "run_id": self.run_id,
            },
        }

    @classmethod
    def of(cls, entry_id: str, payload: Mapping[str, Any]) -> StoredCheckpoint:
        data = payload["data"]
        return cls(
            data["ns"],
            data["id"],
            data["parent"],
            decode(data["checkpoint"]),
            decode(data["metadata"]),
            data["run_id"],
            entry_id,
        )


@dataclass(frozen=True, slots=True)
class StoredWrite:
    """One pending write: its checkpoint, task, ``idx`` (``WRITES_IDX_MAP``'s
    negative index for a special channel), channel, typed value, the
    version under its key, and the entry id."""

    ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    idx: int
    channel: str
    value: tuple[str, bytes]
    version: int
    entry_id: str

    @property
    def key(self) -> tuple[str, int]:
        return (self.task_id, self.idx)

    def payload(self) -> dict[str, Any]:
        return {
            "customType": WRITE,
            "data": {
                "ns": self.ns,
                "checkpoint_id": self.checkpoint_id,
                "task_id": self.task_id,
                "task_path": self.task_path,
                "idx": self.idx,
                "channel": self.channel,
                "value": encode(self.value),
                "version": self.version,
            },
        }

    @classmethod
    def of(cls, entry_id: str, payload: Mapping[str, Any]) -> StoredWrite:
        d = payload["data"]
        return cls(
            d["ns"],
            d["checkpoint_id"],
            d["task_id"],
            d["task_path"],
            d["idx"],
            d["channel"],
            decode(d["value"]),
            d["version"],
            entry_id,
        )


def current_writes(stored: Iterable[StoredWrite]) -> list[StoredWrite]:
    """The writes in effect: per ``(task_id, idx)`` the highest version, in
    ``writes_sort_key`` order (``BaseCheckpointSaver.get_tuple``'s contract)."""
    latest: dict[tuple[str, int], StoredWrite] = {}
    for w in stored:
        seen = latest.get(w.key)
        if seen is None or w.version > seen.version:
            latest[w.key] = w
    return sorted(latest.values(), key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))


def new_writes(
    ns: str,
    checkpoint_id: str,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
    existing: Iterable[StoredWrite],
    serde: SerializerProtocol,
) -> list[StoredWrite]:
    """The entries that ``put_writes`` appends, as LangGraph's SQL savers decide
    (SqliteSaver, PostgresSaver): when every write is to a special channel
    (``WRITES_IDX_MAP``) each replaces the one under its ``(task_id, idx)``
    (INSERT OR REPLACE: a new version); otherwise a key already stored is
    left as it is (INSERT OR IGNORE)."""
    versions: dict[tuple[str, int], int] = {}
    for w in existing:
        versions[w.key] = max(versions.get(w.key, -1), w.version)
    replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
    out: dict[tuple[str, int], StoredWrite] = {}
    for i, (channel, value) in enumerate(writes):
        idx = WRITES_IDX_MAP.get(channel, i)
        key = (task_id, idx)
        if key in versions and not replace:
            continue
        version = versions.get(key, -1) + 1
        out[key] = StoredWrite(
            ns,
            checkpoint_id,
            task_id,
            task_path,
            idx,
            channel,
            serde.dumps_typed(value),
            version,
            write_entry_id(ns, checkpoint_id, task_id, idx, version),
        )
    return list(out.values())


def thread_config(thread_id: str, ns: str, checkpoint_id: str) -> dict[str, Any]:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def to_tuple(
    thread_id: str,
    stored: StoredCheckpoint,
    writes: Iterable[StoredWrite],
    serde: SerializerProtocol,
    config: Any = None,
) -> CheckpointTuple:
    """The ``CheckpointTuple`` of a stored checkpoint, as SqliteSaver builds it:
    ``config`` is the caller's when it named the checkpoint, else the
    checkpoint's own; ``parent_config`` only with a parent id."""
    pending: list[PendingWrite] = [
        (w.task_id, w.channel, serde.loads_typed(w.value)) for w in current_writes(writes)
    ]
    return CheckpointTuple(
        config if config is not None else thread_config(thread_id, stored.ns, stored.checkpoint_id),  # type: ignore[arg-type]
        serde.loads_typed(stored.checkpoint),
        serde.loads_typed(stored.metadata),
        (
            thread_config(thread_id, stored.ns, stored.parent_id)  # type: ignore[arg-type]
            if stored.parent_id
            else None
        ),
        pending,
    )


def metadata_matches(metadata: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    """``list``'s ``filter``: every key equal (InMemorySaver's rule)."""
    return not wanted or all(metadata.get(k) == v for k, v in wanted.items())


def keep_latest(checkpoints: Sequence[StoredCheckpoint], serde: SerializerProtocol) -> set[str]:
    """The checkpoint entry ids that ``prune(strategy="keep_latest")`` keeps.

    Per namespace the latest checkpoint, and every ancestor it still needs:
    a ``DeltaChannel`` (named in the latest's metadata
    ``counters_since_delta_snapshot``) that has no value in the latest's
    ``channel_values`` is rebuilt by ``get_delta_channel_history`` from the
    writes of its ancestors back to the nearest one that holds a value
    for it (a ``_DeltaSnapshot``), so that chain stays, the seed included,
    or the whole chain when no ancestor holds one. LangGraph documents that a
    naive keep-latest cuts it and the channel then rebuilds empty, with no
    error (``BaseCheckpointSaver.prune``).
    """
    by_ns: dict[str, dict[str, StoredCheckpoint]] = {}
    for c in checkpoints:
        by_ns.setdefault(c.ns, {})[c.checkpoint_id] = c
    kept: set[str] = set()
    for chain in by_ns.values():
        latest = chain[max(chain)]
        kept.add(latest.entry_id)
        metadata = serde.loads_typed(latest.metadata)
        counters = metadata.get("counters_since_delta_snapshot") or {}
        values = serde.loads_typed(latest.checkpoint).get("channel_values", {})
        needed = {ch for ch in counters if ch not in values}
        parent = latest.parent_id
        while needed and parent is not None and parent in chain:
            ancestor = chain[parent]
            if ancestor.entry_id in kept:  # a cycle: no stored chain has one
                break
            kept.add(ancestor.entry_id)
            needed -= set(serde.loads_typed(ancestor.checkpoint).get("channel_values", {}))
            parent = ancestor.parent_id
    return kept
