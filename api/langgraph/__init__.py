"""LangGraph checkpointers over a turnkeeper store (``pip install turnkeeper[langgraph]``).

- :class:`TurnkeeperSaver`: ``TurnkeeperSaver(store)`` over an open store
  (``turnkeeper.open_store``), a ``langgraph.checkpoint.base.BaseCheckpointSaver``;
- :class:`AsyncTurnkeeperSaver`: the same over an async store
  (``turnkeeper.aio.open_store``);
- :func:`import_sqlite`: a LangGraph SQLite checkpoint database
  (``langgraph-checkpoint-sqlite``'s ``SqliteSaver``) into a store, each thread a session.
"""

from turnkeeper.langgraph._aio import AsyncTurnkeeperSaver
from turnkeeper.langgraph._saver import LEASE_KEY, TurnkeeperSaver
from turnkeeper.langgraph._sqlite_import import SqliteImport, import_sqlite, looks_like_sqlite

__all__ = [
    "LEASE_KEY",
    "AsyncTurnkeeperSaver",
    "SqliteImport",
    "TurnkeeperSaver",
    "import_sqlite",
    "looks_like_sqlite",
]
