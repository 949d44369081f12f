"""turnkeeper.storage: the store protocol, schema and migrations, and the backends."""

from .duck import DuckDBStore
from .migrations import SCHEMA_VERSION
from .protocol import Store

__all__ = ["SCHEMA_VERSION", "DuckDBStore", "Store"]
