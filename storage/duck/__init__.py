"""The DuckDB backend (embedded default): one file, one writing process, many threads.

What DuckDB supplies to the shared store: the connection and its transaction
boundary (:mod:`.db`), the analytics query defences (:mod:`.query`) and its
migrations (``migrations/``).
"""

from .store import DuckDBStore

__all__ = ["DuckDBStore"]
