"""OpenAI Agents SDK adapter (extra ``turnkeeper[openai-agents]``).

- :class:`TurnkeeperSession`: the SDK's ``Session`` protocol over a
  ``turnkeeper.aio`` store, with atomic ``pop_item``, crash-safe compaction and
  optional lease fencing.
- :func:`import_sqlite`: an SDK ``SQLiteSession`` database into a store, one
  turnkeeper session per SDK session.
"""

from .session import CHANNEL_TYPE, ITEM_TYPE, REPLACED_TYPE, UNPARSED_TYPE, TurnkeeperSession
from .sqlite_import import SQLiteImportReport, import_sqlite

__all__ = [
    "CHANNEL_TYPE",
    "ITEM_TYPE",
    "REPLACED_TYPE",
    "UNPARSED_TYPE",
    "SQLiteImportReport",
    "TurnkeeperSession",
    "import_sqlite",
]
