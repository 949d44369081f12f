"""The thread-record lifecycle (threadstore Record, Finalize, Resolve).

A record is ``active`` while its key's active mapping points at it and
``archived`` afterwards; ``absent`` is the pseudo-state before its first
save. At most one active record per key: the key mapping has the key as its
primary key, so the schema holds the rule as well as the code.

Facts the guards read inside the finalize transaction:

- ``key_available``: the record's key has no active mapping, maps to this
  record already, or the request rebinds it (``rebind_active``).
"""

from __future__ import annotations

from enum import StrEnum

from .lifecycle import Edge, Lifecycle, fact


class RecordStatus(StrEnum):
    """Storage lifecycle state of a thread record (threadstore Status)."""

    ACTIVE = "active"
    ARCHIVED = "archived"


THREAD_RECORD = Lifecycle(
    name="thread_record",
    states=("absent", "active", "archived"),
    initial="absent",
    edges=(
        Edge("create", "save", "absent", "active", guards=("key_available",)),
        Edge("update", "save", "active", "active", guards=("key_available",)),
        Edge("archive", "archive", "active", "archived"),
    ),
    guards={
        "key_available": (
            fact("key_available"),
            "the key is unbound, bound to this record, or rebound by the request",
        ),
    },
    invariants=(
        "at most one active record per key",
        "a record is active exactly when its key's active mapping points at it",
        "finalize writes nothing unless every held lease is valid",
        "an archived record is never saved or reactivated",
    ),
)
"""``save`` of an archived record has no edge: it is refused, never revived."""


def save_decision(source: str, key_available: bool) -> str:
    """What ``threads.finalize``'s save does to a record: the edge name, or a refusal.

    Refusals: ``revive`` (the record is archived: it is never saved again)
    and ``key_taken`` (the key is bound to another record, no rebind).

    pre: source in ("absent", "active", "archived")
    post: __return__ in ("create", "update", "revive", "key_taken")
    post: source != "archived" or __return__ == "revive"
    post: key_available or __return__ in ("revive", "key_taken")
    post: __return__ != "create" or source == "absent"
    """
    if not any(e.trigger == "save" and e.source == source for e in THREAD_RECORD.edges):
        return "revive"
    edge = THREAD_RECORD.select("save", source, {"key_available": key_available})
    return "key_taken" if edge is None else edge.name
