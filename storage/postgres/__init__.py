"""The PostgreSQL backend: several worker processes and hosts on one store.

What PostgreSQL supplies to the shared store: the connection pool and its
transaction boundary (:mod:`.db`), the exact text code (:mod:`.text`), the
analytics query defences (:mod:`.query`), wake-ups (:mod:`.notify`) and its
migrations (``migrations/``). ``psycopg`` and ``psycopg_pool`` are imported
only when this package is (``pip install 'turnkeeper[postgres]'``).
"""

from .store import PostgresStore

__all__ = ["PostgresStore"]
