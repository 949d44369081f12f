"""PostgreSQL: the writes a transaction held (``Tx.later``, see
``storage/backend.py``) as one statement of data-modifying ``WITH`` items.

Each held write becomes one item ``wN AS (<write> RETURNING 1)``, and the
statement selects how many rows each changed, so a compare-and-set among
them is still judged by its own count. PostgreSQL runs every item to
completion against the snapshot the statement starts with (an item does not
see another's rows) and checks constraints as the statement ends: one round
trip instead of one per write, all or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backend import check_changes

Held = tuple[str, Sequence[Any], int | None]
"""One held write: its SQL (``?`` placeholders), its parameters, and the rows
it must change (``None``: any number)."""


def statement(held: Sequence[Held]) -> tuple[str, list[Any]]:
    """The one statement that runs every write of ``held`` (two or more), in
    order, and returns one row: the number of rows each changed."""
    items = ", ".join(f"w{i} AS ({sql} RETURNING 1)" for i, (sql, _, _) in enumerate(held))
    counts = ", ".join(f"(SELECT count(*) FROM w{i})" for i in range(len(held)))
    params = [p for _, values, _ in held for p in values]
    return f"WITH {items} SELECT {counts}", params


def check(held: Sequence[Held], counts: Sequence[int]) -> None:
    """Judge each held write by the rows it changed (``check_changes``).

    Raises:
        Conflict: a write changed another number of rows than it must (a
            row moved since it was read: the transaction is retried).
    """
    for (sql, _, changes), n in zip(held, counts, strict=True):
        check_changes(sql, changes, n)
