"""PostgreSQL: the writes a transaction held (``Tx.later``, see
``storage/backend.py``) as one statement of data-modifying ``WITH`` items.

Each held write becomes one item ``wN AS (<write> RETURNING 1)``, and the
statement selects how many rows each changed, so a compare-and-set among
them is still judged by its own count. PostgreSQL runs every item to
completion against the snapshot the statement starts with (an item does not
see another's rows) and checks constraints as the statement ends: one round
trip instead of one per write, all or nothing.

When the writes are the last statement of a transaction whose ``COMMIT``
checks a lease's expiry first (``Tx.commit_statement``), they go in one
pipeline with that check and the ``COMMIT`` (``Tx.commit_held``), so the
statement is *marked* (:func:`statement` with ``marked``): it also records in
the transaction-local setting :data:`MARK` whether every compare-and-set
among them changed the rows it must, and the check before ``COMMIT``
(:data:`HELD_CHECK`) fails with :data:`HELD` when one did not, so the server
skips the ``COMMIT``: a lost race is still judged by its row counts, before
anything commits, and is retried as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backend import check_changes

HELD = "TKHLD"
"""The SQLSTATE of the check before COMMIT that a marked statement's
compare-and-set changed another number of rows than it must."""

MARK = "turnkeeper.held"
"""The transaction-local setting a marked statement sets: ``'lost'`` when one
of its compare-and-sets changed another number of rows, else ``'ok'``."""

HELD_CHECK = (
    f"IF current_setting('{MARK}', true) = 'lost' THEN RAISE EXCEPTION USING "
    f"ERRCODE = '{HELD}', MESSAGE = 'turnkeeper: a held write changed another number "
    "of rows than it must'; END IF; "
)
"""The PL/pgSQL statement (in the ``DO`` block before COMMIT) that fails the
transaction when a marked statement recorded a lost race (a setting never
set reads as ``''`` or NULL: the check passes)."""

Held = tuple[str, Sequence[Any], int | None]
"""One held write: its SQL (``?`` placeholders), its parameters, and the rows
it must change (``None``: any number)."""


def statement(held: Sequence[Held], *, marked: bool = False) -> tuple[str, list[Any]]:
    """The one statement that runs every write of ``held`` (two or more, or
    one when ``marked``), in order, and returns one row: the number of rows
    each changed, then, when ``marked``, the :data:`MARK` it set (:func:`mark`)."""
    items = ", ".join(f"w{i} AS ({sql} RETURNING 1)" for i, (sql, _, _) in enumerate(held))
    counts = ", ".join(f"(SELECT count(*) FROM w{i})" for i in range(len(held)))
    params = [p for _, values, _ in held for p in values]
    if marked:
        counts += f", {mark(held)}"
    return f"WITH {items} SELECT {counts}", params


def mark(held: Sequence[Held]) -> str:
    """The SQL expression that sets :data:`MARK` for ``held``'s items:
    ``'ok'`` when every write with a count to change (``changes`` not
    ``None``) changed exactly that many rows, else ``'lost'``."""
    judged = [
        f"(SELECT count(*) FROM w{i}) = {n}" for i, (_, _, n) in enumerate(held) if n is not None
    ]
    ok = " AND ".join(judged) or "TRUE"
    return f"set_config('{MARK}', CASE WHEN {ok} THEN 'ok' ELSE 'lost' END, true)"


def check(held: Sequence[Held], counts: Sequence[Any]) -> None:
    """Judge each held write by the rows it changed (``check_changes``);
    ``counts`` may end with a marked statement's mark (ignored).

    Raises:
        Conflict: a write changed another number of rows than it must (a
            row moved since it was read: the transaction is retried).
    """
    for (sql, _, changes), n in zip(held, counts[: len(held)], strict=True):
        check_changes(sql, changes, n)
