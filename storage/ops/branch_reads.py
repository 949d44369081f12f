"""Bounded reads of a session for framework adapters: the tail of a branch and
custom entries by type and key, without reading the whole session.

A branch's tail is read as the session's entries in a ``seq`` range (the
``(session_id, seq)`` key on PostgreSQL; on DuckDB a scan of the session's
rows that hands over only those in the range, as message paging does), then
walked from the leaf through the parent links in memory. An entry is stored
after its parent, so ``seq`` rises from root to leaf and the entries of the
path after a cursor all lie in the range after it. The walk's last parent is
looked up by id (one index lookup): a parent stored after the leaf (an import
in a file's order can store a child first) makes the read walk the whole path
(:func:`.entry_rows.path_to_leaf`): right, at the cost of a replay.

Custom entries (``EntryKind.CUSTOM``, ``payload["customType"]``) are keyed by
their entry id, which the appender chooses (``append(..., entry_id=key)``):
one is looked up through the entries' id index, and a type's entries are
paged newest first by ``seq``, optionally only the ids that start with a
prefix (a LangGraph checkpoint's writes under ``<checkpoint id>/``).
"""

from __future__ import annotations

from typing import Any

from turnkeeper.spec import errors
from turnkeeper.spec.entries import EntryKind
from turnkeeper.spec.records import Entry

from ..backend import Tx
from ..codec import check_id, check_text
from ..validate import check_int, check_limit
from . import entry_rows
from .base import Area

_RANGE = "FROM entries WHERE session_id = ? AND seq > ? AND seq <= ?"
_CUSTOM = (
    "FROM entries WHERE session_id = ? AND kind = 'custom' AND seq < ? "
    "AND {match} ORDER BY seq DESC LIMIT ?"
)
_MAX_SEQ = 2**63 - 1


def _leaf(tx: Tx, session_id: str, leaf_id: str | None) -> Entry | None:
    """The leaf to read from: ``leaf_id``'s entry, or the session's current leaf
    (``None`` for an empty session)."""
    head = tx.one("SELECT leaf_id FROM sessions WHERE id = ?", [session_id])
    if head is None:
        raise errors.SessionNotFoundError(session_id)
    name = head[0] if leaf_id is None else leaf_id
    if name is None:
        return None
    leaf = entry_rows.entry(tx, session_id, name)
    if leaf is None and leaf_id is not None:
        raise errors.EntryNotFoundError(session_id, leaf_id)
    return leaf


def _walk(
    tx: Tx, rows: list[tuple[Any, ...]], leaf_id: str, most: int | None
) -> tuple[list[Entry], str | None]:
    """Root → leaf through ``rows``, at most ``most`` entries from the leaf end;
    returns them and the next parent not walked (``None``: the root or a cycle)."""
    by_id = {row[1]: row for row in rows}
    ids: list[str] = []
    seen: set[str] = set()
    node: str | None = leaf_id
    while node is not None and node in by_id and (most is None or len(ids) < most):
        if node in seen:
            node = None
            break
        seen.add(node)
        ids.append(node)
        node = by_id[node][2]
    return [entry_rows.entry_row(tx, by_id[i]) for i in reversed(ids)], node


def _suffix(path: list[Entry], after_seq: int, most: int | None) -> list[Entry]:
    """The entries of ``path`` after its last one with ``seq <= after_seq``,
    at most ``most`` from the leaf end."""
    cut = next((i + 1 for i in range(len(path) - 1, -1, -1) if path[i].seq <= after_seq), 0)
    tail = path[cut:]
    return tail if most is None else tail[-most:]


def path_tail(
    tx: Tx, session_id: str, leaf: Entry, after_seq: int, most: int | None
) -> list[Entry]:
    """The entries of the root → ``leaf`` path below the nearest one to the leaf
    with ``seq <= after_seq`` (all of them when none is), root first; with
    ``most``, only the ``most`` nearest the leaf. On a path whose ``seq`` rises
    from the root (every path an append wrote) these are its entries with
    ``seq > after_seq``.

    Without ``most`` one statement reads the session's entries in
    ``(after_seq, leaf.seq]``, and one looks up the parent the walk stopped at.
    With it the range starts ``2 * most`` below the leaf and widens (at least
    doubling) until the walk has ``most`` entries or reaches the root: a few
    statements, reading at most about twice the entries stored since the
    oldest one returned. A parent stored after the leaf (an import in a file's
    order) makes it walk the whole path (:func:`.entry_rows.path_to_leaf`)."""
    lo = after_seq if most is None else max(after_seq, leaf.seq - 2 * most)
    cols = entry_rows.entry_columns(tx)
    while True:
        rows = tx.rows(f"SELECT {cols} {_RANGE}", [session_id, lo, leaf.seq])
        path, parent = _walk(tx, rows, leaf.id, most)
        if parent is None or (most is not None and len(path) >= most):
            return path
        above = entry_rows.entry(tx, session_id, parent)
        if above is None or above.seq <= after_seq:
            return path  # a missing parent ends the branch; or the cursor's entry
        if above.seq > leaf.seq:
            whole = entry_rows.path_to_leaf(tx, session_id, leaf.id)
            return _suffix(whole, after_seq, most)
        need = 2 * ((most or 0) - len(path))
        lo = max(after_seq, min(above.seq - need, leaf.seq - 2 * (leaf.seq - lo)))


def branch_path(
    tx: Tx, session_id: str, leaf_id: str | None, after_seq: int, most: int | None
) -> list[Entry]:
    leaf = _leaf(tx, session_id, leaf_id)
    return [] if leaf is None else path_tail(tx, session_id, leaf, after_seq, most)


def _custom_type(entry: Entry) -> object:
    return entry.payload.get("customType") if isinstance(entry.payload, dict) else None


def custom_entries(
    tx: Tx, session_id: str, custom_type: str, before_seq: int, limit: int, id_prefix: str
) -> list[Entry]:
    """The session's custom entries of ``custom_type`` with ``seq < before_seq``
    and an id starting with ``id_prefix``, newest first, at most ``limit``.

    The statement finds candidates by the type's JSON text in the payload
    (``"customType":"<type>"``, as the store encodes it), pages of ``limit``
    newest first; each is then checked on its decoded payload (the text could
    sit deeper in another entry's payload)."""
    if tx.one("SELECT 1 FROM sessions WHERE id = ?", [session_id]) is None:
        raise errors.SessionNotFoundError(session_id)
    needle = entry_rows.custom_type_text(custom_type)
    cols = entry_rows.entry_columns(tx)
    custom = _CUSTOM.format(match=entry_rows.or_sealed(tx, "strpos(payload, ?) > 0"))
    found: list[Entry] = []
    cursor = before_seq
    while len(found) < limit:
        rows = tx.rows(f"SELECT {cols} {custom}", [session_id, cursor, needle, limit])
        for row in rows:
            e = entry_rows.entry_row(tx, row)
            if _custom_type(e) == custom_type and e.id.startswith(id_prefix):
                found.append(e)
        if len(rows) < limit:
            break
        cursor = rows[-1][4]
    return found[:limit]


def custom_entry(tx: Tx, session_id: str, custom_type: str, key: str) -> Entry | None:
    if tx.one("SELECT 1 FROM sessions WHERE id = ?", [session_id]) is None:
        raise errors.SessionNotFoundError(session_id)
    e = entry_rows.entry(tx, session_id, key)
    if e is None or e.kind != EntryKind.CUSTOM or _custom_type(e) != custom_type:
        return None
    return e


class BranchReadsPart(Area):
    """Bounded reads for adapters: a branch's tail, custom entries by key."""

    def path_after(
        self,
        session_id: str,
        after_seq: int = 0,
        *,
        leaf_id: str | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        """The entries of the branch from the root to the current leaf (or to
        ``leaf_id``) with ``seq > after_seq`` (strictly after: pass the last
        ``seq`` you hold), root first; with ``limit``, the ``limit`` oldest of
        them (page on with the last one's ``seq``). ``after_seq=0`` starts at
        the root. An empty session (no leaf) gives ``[]``. On a branch with an
        entry stored before its parent (only an import in a file's order
        writes one) the entries are those below the nearest one to the leaf
        with ``seq <= after_seq``.

        Cost: the leaf, then one statement reading the session's entries stored
        in ``(after_seq, leaf's seq]`` (every branch's), not the whole session,
        then one lookup by id of the parent the walk stopped at; a parent
        stored after the leaf (an import) makes it read the whole path.

        Raises:
            SessionNotFoundError: no such session.
            EntryNotFoundError: ``leaf_id`` is no entry of the session.
            InvalidInputError: a negative ``after_seq``, a bad ``leaf_id`` or ``limit``.
        """
        check_id(session_id, "session_id")
        check_int(after_seq, "after_seq", 0)
        if leaf_id is not None:
            check_id(leaf_id, "leaf_id")
        if limit is not None:
            check_limit(limit)

        def read(tx: Tx) -> list[Entry]:
            path = branch_path(tx, session_id, leaf_id, after_seq, None)
            return path if limit is None else path[:limit]

        return self.db.read("path_after", read, snapshot=True)

    def path_latest(
        self, session_id: str, limit: int, *, leaf_id: str | None = None
    ) -> list[Entry]:
        """The ``limit`` newest entries of the branch ending at the current leaf
        (or at ``leaf_id``), root first (an OpenAI Agents session's
        ``get_items(limit)``); fewer when the branch is shorter. Its
        ``pop_item`` is ``path_latest(s, 1)`` then ``branch(s, newest.parent_id,
        expected_leaf=newest.id)``: of two concurrent pops one gets
        ``SessionModifiedError`` and reads again, so no two get the same entry.

        Cost: a few statements (the ``seq`` range doubles from ``2 * limit``
        below the leaf until the walk has ``limit`` entries or reaches the
        root), reading about twice the entries stored since the oldest
        returned, at most.

        Raises:
            SessionNotFoundError: no such session.
            EntryNotFoundError: ``leaf_id`` is no entry of the session.
            InvalidInputError: a bad ``limit`` or ``leaf_id``.
        """
        check_id(session_id, "session_id")
        check_limit(limit)
        if leaf_id is not None:
            check_id(leaf_id, "leaf_id")
        return self.db.read(
            "path_latest",
            lambda tx: branch_path(tx, session_id, leaf_id, 0, limit),
            snapshot=True,
        )

    def custom_entry(self, session_id: str, custom_type: str, key: str) -> Entry | None:
        """The custom entry (``EntryKind.CUSTOM``) whose id is ``key`` and whose
        ``payload["customType"]`` is ``custom_type``, or ``None`` (on any branch).
        The key is the entry id its appender chose (``append(..., entry_id=key)``;
        a LangGraph checkpoint id), found through the entries' id index.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad ``custom_type`` or ``key``.
        """
        check_id(session_id, "session_id")
        check_text(custom_type, "custom_type", allow_empty=False)
        check_id(key, "key")
        return self.db.read(
            "custom_entry",
            lambda tx: custom_entry(tx, session_id, custom_type, key),
            snapshot=True,
        )

    def custom_entries(
        self,
        session_id: str,
        custom_type: str,
        *,
        before_seq: int | None = None,
        key_prefix: str = "",
        limit: int = 100,
    ) -> list[Entry]:
        """The session's custom entries of ``custom_type`` (every branch), newest
        first: those with ``seq < before_seq`` (all without it) and an id
        (their key) starting with ``key_prefix``, at most ``limit`` (a LangGraph
        checkpointer's ``list(before=…, limit=…)``, or the writes of one
        checkpoint under the prefix ``"<checkpoint id>/"``).

        Cost: the session's custom entries newest first by ``seq``, in pages of
        ``limit``, until ``limit`` match; other custom types and other kinds are
        not handed over.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: a bad ``custom_type``, ``before_seq``, ``key_prefix``
                or ``limit``.
        """
        check_id(session_id, "session_id")
        check_text(custom_type, "custom_type", allow_empty=False)
        check_text(key_prefix, "key_prefix")
        check_limit(limit)
        before = _MAX_SEQ if before_seq is None else check_int(before_seq, "before_seq", 0)
        return self.db.read(
            "custom_entries",
            lambda tx: custom_entries(tx, session_id, custom_type, before, limit, key_prefix),
            snapshot=True,
        )
