"""Each thread's DuckDB cursor on a store object's connection.

DuckDB connections are not thread-safe, cursors on one instance are, so every
thread gets a cursor of its own (:meth:`Cursors.holder`), opened on first use
and closed when the thread ends (its thread-local holder is collected) or the
store closes: a long-lived store used by many short threads gathers none.

A cursor whose last transaction did not end cleanly is replaced before its
next use. A transaction marks its cursor unclean before ``BEGIN`` and clean
once its ``COMMIT`` or ``ROLLBACK`` returned; a cancellation landing anywhere
between (in the rollback itself too, which DuckDB may report as an
interrupted query) leaves it unclean. Were the cursor used again, its next
"autocommit" statement would run inside the open transaction and never
commit (a renewal acknowledged and lost), and its next ``BEGIN`` would fail.
Closing the cursor rolls that transaction back.

A cursor of an older connection (the file was reopened since, see
:func:`~.files.reopen`, which closed every cursor) is replaced too.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Protocol

import duckdb


class Source(Protocol):
    """Where cursors come from: the file's connection (``generation`` counts the
    times it was replaced)."""

    generation: int

    def cursor(self) -> duckdb.DuckDBPyConnection: ...


class Holder:
    """A thread's cursor (``box[0]``, shared with the finalizer that closes
    it when the thread ends), whether its last transaction ended cleanly, and
    the generation of the connection it came from."""

    __slots__ = ("__weakref__", "box", "clean", "generation")

    def __init__(self, cursor: duckdb.DuckDBPyConnection, generation: int = 0) -> None:
        self.box = [cursor]
        self.clean = True
        self.generation = generation

    @property
    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self.box[0]


class Cursors:
    """The cursors one store object takes from ``source`` (the file's
    connection); ``lock`` guards them (the store's gate lock)."""

    def __init__(self, source: Source, lock: threading.Lock) -> None:
        self._source = source
        self._lock = lock
        self._local = threading.local()
        self._open: set[duckdb.DuckDBPyConnection] = set()
        self.closed = False

    def _new(self) -> tuple[duckdb.DuckDBPyConnection, int]:
        with self._lock:
            generation = self._source.generation  # before the cursor: never newer than it
            cur = self._source.cursor()  # inherits the connection's settings, locked
            self._open.add(cur)
        return cur, generation

    def holder(self) -> Holder:
        """This thread's cursor holder; its cursor replaced first when its last
        transaction did not end cleanly, or the file was reopened since
        (module docstring).

        Raises:
            StoreInvalidatedError: the file's connection is closed to be reopened.
        """
        holder: Holder | None = getattr(self._local, "holder", None)
        if holder is None:
            holder = Holder(*self._new())
            weakref.finalize(holder, _drop, weakref.ref(self), holder.box)
            self._local.holder = holder
        elif not holder.clean or holder.generation != self._source.generation:
            old = holder.box[0]
            holder.box[0], holder.generation = self._new()
            holder.clean = True
            self.forget(old)
        return holder

    def forget(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Close ``cur`` (rolling back what it left open) unless the store closed."""
        with self._lock:
            if self.closed or cur not in self._open:
                return
            self._open.discard(cur)
            with contextlib.suppress(duckdb.Error):
                cur.close()

    def close_all(self) -> None:
        """Close every cursor (the store is closing; call with ``lock`` held)."""
        self.closed = True
        for cur in self._open:
            with contextlib.suppress(duckdb.Error):
                cur.close()


def _drop(cursors: weakref.ref[Cursors], box: list[duckdb.DuckDBPyConnection]) -> None:
    owner = cursors()
    if owner is not None:
        owner.forget(box[0])
