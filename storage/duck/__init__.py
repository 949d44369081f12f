"""The DuckDB backend (embedded default): one file, one writing process, many threads."""

from .store import DuckDBStore

__all__ = ["DuckDBStore"]
