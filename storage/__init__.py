"""turnkeeper.storage: the store over one domain layer, and its backends.

``ops/`` holds the domain operations (one module per area, written once);
``store.py`` assembles them into ``BaseStore``; ``duck/`` and ``postgres/``
supply only what differs per engine (``backend.py`` says what that is).
"""

from .duck import DuckDBStore
from .migrations import SCHEMA_VERSION
from .protocol import Store
from .store import BaseStore

__all__ = ["SCHEMA_VERSION", "BaseStore", "DuckDBStore", "Store"]
