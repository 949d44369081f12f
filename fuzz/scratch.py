"""Scratch stores for ``turnkeeper fuzz``, made with the user's configuration
but never on the user's data.

- A DuckDB path: a new folder ``.turnkeeper-fuzz-<random>`` beside the file
  (the same filesystem, so the same disk and mount options), where one store
  is migrated once as a template and each example gets a byte copy of it
  (what a migration writes; a migration per example costs more than the copy).
  The user's file is never opened, read or written (it need not exist). The
  folder is removed at the end.
- A PostgreSQL URL (or libpq string): a new schema ``turnkeeper_fuzz_<hex>``
  in that database for the run, migrated once; each example's store is that
  schema, emptied (``DELETE`` from every table but ``schema_migrations``)
  when the previous example closes. Emptying costs a fraction of a new
  schema's migration (README "Fuzzing your deployment" has the figures).
  The schema is dropped at the end, after a failure or an interrupt too.

:func:`scratch` is the context manager that makes the one opener of a run
and removes what it made however the block ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import turnkeeper
from turnkeeper.spec.errors import (
    InvalidInputError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
)
from turnkeeper.storage import BaseStore

SCHEMA_PREFIX = "turnkeeper_fuzz_"
"""Every scratch schema's name starts so (then 16 hex digits)."""

FOLDER_PREFIX = ".turnkeeper-fuzz-"
"""Every scratch folder's name starts so."""


def redacted(target: str) -> str:
    """``target`` with its password removed (a URL's ``user:password@``, a
    ``password`` parameter or libpq keyword); a DuckDB path unchanged."""
    if not turnkeeper.is_postgres(target):
        return target
    if "://" not in target:  # a libpq keyword string
        return re.sub(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", "password=***", target)
    parts = urlsplit(target)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = f"{userinfo.split(':', 1)[0]}@{host}"
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "password"])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def libpq(target: str) -> str:
    """``target`` without turnkeeper's own URL parameters (``pooler``,
    ``listen_url``), for a plain ``psycopg`` connection."""
    if "://" not in target:
        return target
    parts = urlsplit(target)
    query = [
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if k not in ("pooler", "listen_url")
    ]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


def in_schema(target: str, schema: str) -> str:
    """The PostgreSQL ``target`` with its ``search_path`` set to ``schema``
    (libpq ``options``; any ``search_path`` the target set is replaced)."""
    setting = f"-csearch_path={schema}"
    if "://" not in target:
        return f"{target} options={setting}"
    parts = urlsplit(target)
    query = []
    found = False
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "options":
            kept = [o for o in value.split() if not o.startswith("-csearch_path=")]
            value = " ".join([*kept, setting])
            found = True
        query.append((key, value))
    if not found:
        query.append(("options", setting))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


class DuckDBScratch:
    """Scratch DuckDB stores in a folder of their own beside the user's file
    (see the module). Use through :func:`scratch`."""

    def __init__(self, target: str, encryption: turnkeeper.KeyProvider | None) -> None:
        """Make the folder and the template store.

        Raises:
            InvalidInputError: (field ``db``) the folder ``target`` names is
                missing or not a folder, or no folder can be made in it.
        """
        parent = Path(target).expanduser().absolute().parent
        if not parent.is_dir():
            raise InvalidInputError("db", f"{parent} is not a folder to make scratch stores in")
        try:
            self.folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir=parent))
        except OSError as exc:
            raise InvalidInputError("db", f"cannot make a scratch folder in {parent}") from exc
        self.encryption = encryption
        self.name = "duckdb" + ("+enc" if encryption is not None else "")
        self._count = 0
        self._open: dict[int, tuple[BaseStore, Path]] = {}
        self._template = self.folder / "template.duckdb"
        try:
            turnkeeper.open_store(str(self._template)).close()
        except BaseException:
            self.remove()
            raise

    def open(self, clock: Callable[[], datetime]) -> BaseStore:
        """A new store: a copy of the template, on ``clock``."""
        self._count += 1
        where = self.folder / f"example-{self._count}.duckdb"
        shutil.copyfile(self._template, where)
        store = turnkeeper.open_store(str(where), clock=clock, encryption=self.encryption)
        self._open[id(store)] = (store, where)
        return store

    def close(self, store: BaseStore) -> None:
        """Close ``store`` and delete its file (and its write-ahead log)."""
        _, where = self._open.pop(id(store), (store, None))
        store.close()
        if where is not None:
            for name in (where, where.with_name(where.name + ".wal")):
                name.unlink(missing_ok=True)

    def peer(self, store: BaseStore, clock: Callable[[], datetime]) -> None:
        """No peer: a DuckDB file is one store per process."""
        return None

    def remove(self) -> None:
        """Close every store still open and remove the folder. Never raises."""
        for store, _ in list(self._open.values()):
            with contextlib.suppress(Exception):  # the run is over: remove the folder
                store.close()
        self._open.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


class PostgresScratch:
    """Scratch PostgreSQL stores in a schema of the run's own (see the
    module). Use through :func:`scratch`."""

    def __init__(self, target: str, encryption: turnkeeper.KeyProvider | None) -> None:
        """Create the schema and migrate it once.

        Raises:
            NotSupportedError: ``psycopg`` is not installed.
            OperationalError: the server cannot be reached with ``target``.
            ProgrammingError: the role may not create a schema in the database.
            InvalidInputError: (field ``db``) its connections do not keep the
                scratch schema as their ``search_path`` (a transaction pooler).
        """
        try:
            import psycopg
        except ImportError as exc:
            raise NotSupportedError(
                detail="PostgreSQL needs psycopg: pip install 'turnkeeper[postgres]'"
            ) from exc
        self._psycopg: Any = psycopg
        self.target = libpq(target)
        target = self.target
        self.schema = SCHEMA_PREFIX + secrets.token_hex(8)
        self.encryption = encryption
        self.name = "postgres" + ("+enc" if encryption is not None else "")
        self._open: dict[int, BaseStore] = {}
        self._peers: list[BaseStore] = []
        self._tables: list[str] = []
        self.url = in_schema(target, self.schema)
        shown = redacted(target)
        try:
            conn = psycopg.connect(target, autocommit=True)
        except psycopg.Error as exc:
            raise OperationalError(detail=f"cannot connect to {shown}: {exc}".strip()) from exc
        with conn:
            try:
                conn.execute(f"CREATE SCHEMA {self.schema}")
            except psycopg.errors.InsufficientPrivilege as exc:
                raise ProgrammingError(
                    detail=f"turnkeeper fuzz makes a scratch schema per run, and this role "
                    f"may not create one in {shown} (GRANT CREATE ON DATABASE … TO the role)"
                ) from exc
            except psycopg.Error as exc:
                raise OperationalError(
                    detail=f"cannot create a scratch schema in {shown}: {exc}"
                ) from exc
        try:
            self._check_search_path()
            turnkeeper.open_store(self.url).close()
            with psycopg.connect(target, autocommit=True) as conn:
                self._tables = [
                    r[0]
                    for r in conn.execute(
                        "SELECT tablename FROM pg_tables WHERE schemaname = %s "
                        "AND tablename <> 'schema_migrations' ORDER BY tablename",
                        [self.schema],
                    )
                ]
        except BaseException:
            self.remove()
            raise

    def _check_search_path(self) -> None:
        """Refuse a connection that does not keep the scratch schema as its
        ``search_path`` (a transaction pooler drops libpq ``options``): its
        stores would be made in the role's own schema, the user's data.

        Raises:
            InvalidInputError: (field ``db``) the connection is not in the schema.
        """
        with self._psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute("SELECT current_schema()").fetchone()
        if row is None or row[0] != self.schema:
            raise InvalidInputError(
                "db",
                f"a connection to {redacted(self.target)} is not in the scratch schema its "
                f"options set (it is in {None if row is None else row[0]!r}): give a direct "
                "URL to the server, not one through a transaction pooler",
            )

    def open(self, clock: Callable[[], datetime]) -> BaseStore:
        """The run's schema as a store on ``clock`` (empty: see :meth:`close`)."""
        store = turnkeeper.open_store(self.url, clock=clock, encryption=self.encryption)
        self._open[id(store)] = store
        return store

    def peer(self, store: BaseStore, clock: Callable[[], datetime]) -> BaseStore:
        """Another store object on the run's schema, on ``clock`` (its own
        connections); closed by the caller, and at the latest by :meth:`close`
        of the example's store or :meth:`remove`."""
        other = turnkeeper.open_store(self.url, clock=clock, encryption=self.encryption)
        self._peers.append(other)
        return other

    def close(self, store: BaseStore) -> None:
        """Close ``store`` and empty the schema for the next example."""
        self._open.pop(id(store), None)
        self._close_peers()
        store.close()
        with self._psycopg.connect(self.target, autocommit=True) as conn, conn.transaction():
            for table in self._tables:
                conn.execute(f"DELETE FROM {self.schema}.{table}")

    def _close_peers(self) -> None:
        """Close the peers the example made (closing one twice is a no-op)."""
        peers, self._peers = self._peers, []
        for other in peers:
            with contextlib.suppress(Exception):  # a peer's failure is the machine's, not ours
                other.close()

    def remove(self) -> None:
        """Close every store still open and drop the schema. Never raises
        (a server gone away leaves the schema, named in the warning)."""
        self._close_peers()
        for store in list(self._open.values()):
            with contextlib.suppress(Exception):  # the run is over: drop the schema
                store.close()
        self._open.clear()
        try:
            with self._psycopg.connect(self.target, autocommit=True) as conn:
                conn.execute("SET lock_timeout = '10s'")
                conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        except self._psycopg.Error as exc:
            import warnings

            warnings.warn(
                f"turnkeeper fuzz could not drop its scratch schema {self.schema}: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )


Scratch = DuckDBScratch | PostgresScratch


@contextmanager
def scratch(target: str, *, encrypted: bool = False) -> Iterator[Scratch]:
    """The scratch opener for ``target`` (a DuckDB path or a PostgreSQL URL),
    removed (folder deleted, schema dropped) when the block ends, however it
    ends. ``encrypted``: every store is opened with a throwaway key (a random
    256-bit master key that lives only in this process).

    Raises:
        InvalidInputError: (field ``db``) ``target`` is ``:memory:`` or a
            DuckDB path whose folder cannot hold a scratch folder.
        NotSupportedError: a PostgreSQL target without ``psycopg`` installed.
        OperationalError: the PostgreSQL server cannot be reached.
        ProgrammingError: the PostgreSQL role may not create a schema.
        InvalidInputError: (field ``db``) PostgreSQL connections that do not
            keep the scratch schema's ``search_path`` (a transaction pooler).
    """
    keys = None
    if encrypted:
        key = secrets.token_bytes(32)
        import base64

        keys = turnkeeper.LocalKeyProvider.from_text(
            "fuzz-throwaway:" + base64.b64encode(key).decode()
        )
    if target == ":memory:":
        raise InvalidInputError("db", "give the DuckDB file (or PostgreSQL URL) to fuzz beside")
    made: Scratch
    if turnkeeper.is_postgres(target):
        made = PostgresScratch(target, keys)
    else:
        made = DuckDBScratch(os.fspath(target), keys)
    try:
        yield made
    finally:
        made.remove()
