"""How a store reaches its PostgreSQL server: turnkeeper's own URL parameters,
and the connection pooler between the two, if any.

A transaction-mode pooler (PgBouncer ``pool_mode = transaction``, and the
poolers that work like it) lends a server connection to a client for one
transaction only, so nothing a session holds lasts from one transaction to
the next. What the store needs of a session, and what it does behind such a
pooler (its *pooler mode*):

- **prepared statements**: psycopg prepares a statement on its fifth run
  (``_pg3_N``); behind the pooler the next transaction runs on another server
  connection, where the name is missing (``prepared statement "_pg3_N" does
  not exist``) or names another statement (a wrong bind, or another plan's
  rows). Pooler mode prepares nothing (``prepare_threshold=None``);
- **``LISTEN``** lasts only as long as the session: a listener behind the
  pooler hears nothing. Wake-ups then need ``listen_url``, a direct URL to the
  same server and database; without one, subscribing raises
  ``PoolerError(feature="LISTEN")``. A ``listen_url`` that goes through a
  transaction pooler too, or reaches another server or database, is refused
  when the listener first connects (``feature="listen_url"``);
- **the schema**: a URL's ``options`` (``-c search_path=…``) is a startup
  parameter, which PgBouncer refuses (``unsupported startup parameter:
  options``, raised as ``PoolerError(feature="options")``) or, listed in
  ``ignore_startup_parameters``, drops without a word. Behind a pooler the
  schema is the role's (or the database's) default ``search_path``
  (``ALTER ROLE … SET search_path = …``); the store checks at open that it is
  the one the URL's ``options`` name, if they name one
  (``feature="search_path"``);
- **the search path itself**: PgBouncer 1.18 neither tracks nor resets
  ``search_path`` in transaction mode, so a client of the same pool that ran
  ``SET search_path`` leaves it on the server connection for the next one.
  The open reads the session's default (:data:`PROBE_SQL`), and pooler mode
  pins that path in every transaction (:func:`pin_sql`, sent with its
  ``BEGIN``) and every autocommit statement (:func:`pinned`);
- **settings**: the store sets only ``TimeZone`` per connection, which
  PgBouncer tracks per client and restores on every server connection it
  lends (and the store's SQL does not depend on it: every timestamp it reads
  is converted to UTC); ``lock_timeout`` and the query reader's role are
  ``SET LOCAL`` (one transaction); the migration lock is
  ``pg_advisory_xact_lock`` (one transaction); analytics cursors live inside
  their transaction. No temporary tables.

A pooler is *detected* at open: a pooler answers the connection's start-up
with a process id of its own (PgBouncer: a random cancel key), so it differs
from the ``pg_backend_pid()`` of the server connection behind it. Whether it
pools sessions or transactions cannot be seen, so a detected pooler is taken
to pool transactions unless the store was told ``pooler="session"``.

turnkeeper's parameters may be given as keyword arguments or in the URL
(``postgresql://…?pooler=transaction&listen_url=postgresql%3A%2F%2F…``, or
``pooler=transaction`` in a ``key=value`` string); they are taken out before
the URL reaches libpq.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
import psycopg.sql
from psycopg.conninfo import conninfo_to_dict

from turnkeeper.spec import errors

from ..backend import present
from ..codec import check_text
from . import faults

MODES = ("transaction", "session")
"""The pooler modes a store may be told: ``"transaction"`` (and statement-by-
statement poolers that keep a transaction on one server connection) or
``"session"`` (a pooler that keeps each client on one server connection: the
store then uses it as it would the server)."""

PARAMETERS = ("pooler", "listen_url")
"""turnkeeper's own connection parameters, taken out of a URL before libpq reads it."""

SETUP_HINT = (
    "behind a transaction-mode pooler the schema is the role's default search_path "
    "(ALTER ROLE <user> SET search_path = <schema>, or … IN DATABASE <db> SET …), not the "
    "URL's options"
)

_KEY_VALUE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*('(?:[^'\\]|\\.)*'|(?:[^\s'\\]|\\.)*)")
_SEARCH_PATH = re.compile(r"(?:-c\s*|--)search_path=((?:\\.|\S)+)")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a store connects: ``url`` for libpq (turnkeeper's parameters taken
    out), the ``pooler`` mode it was told (``None``: detect), and the direct
    ``listen_url`` for ``LISTEN``, if any."""

    url: str
    pooler: str | None
    listen_url: str | None


@dataclass(frozen=True, slots=True)
class Probe:
    """What one connection reached: whether a pooler sits between (``pooled``),
    the schema it lands in and its ``search_path`` (the session's default:
    what its login gave it, whatever a ``SET`` changed since), the database,
    when the server behind it started (which tells one server from another),
    and the schemas of that search_path that exist (``path``, in order)."""

    pooled: bool
    schema: str | None
    search_path: str
    database: str
    started: datetime
    path: tuple[str, ...] = ()


PROBE_SQL = (
    "SET LOCAL search_path TO DEFAULT; "
    "SELECT pg_backend_pid(), current_schema(), current_setting('search_path'), "
    "current_database(), pg_postmaster_start_time(), current_schemas(false)"
)
"""One simple query (one implicit transaction): the search_path is the session's
default for the SELECT only. Behind a transaction pooler the server connection
may carry a ``SET search_path`` another client of the pool left (PgBouncer 1.18
neither tracks nor resets it in transaction mode)."""

PIN_SQL = "SELECT pg_catalog.set_config('search_path', %s, true)"
"""The statement that pins the search_path of one autocommit statement (its
implicit transaction's), sent in the same round trip (:func:`pinned`)."""


def target(url: str, pooler: object = None, listen_url: object = None) -> Target:
    """``url`` split into libpq's URL and turnkeeper's parameters, merged with
    the keyword arguments ``pooler`` and ``listen_url``.

    Raises:
        InvalidInputError: ``pooler`` is not one of :data:`MODES`; the URL and
            the argument disagree; ``listen_url`` is empty, not text, or holds
            turnkeeper parameters of its own.
    """
    cleaned, given = split(url)
    mode = _merge("pooler", given.get("pooler"), pooler)
    if mode is not None and mode not in MODES:
        raise errors.InvalidInputError(
            "pooler", f"must be one of {', '.join(MODES)} (or left out to detect), got {mode!r}"
        )
    listen = _merge("listen_url", given.get("listen_url"), listen_url)
    if listen is not None:
        check_text(listen, "listen_url", allow_empty=False)
        if split(listen)[1]:
            raise errors.InvalidInputError(
                "listen_url", "a direct URL to the server: no pooler or listen_url of its own"
            )
    return Target(cleaned, mode, listen)


def _merge(name: str, in_url: str | None, argument: object) -> str | None:
    if argument is not None and not isinstance(argument, str):
        raise errors.InvalidInputError(name, f"must be text, got {type(argument).__name__}")
    if in_url is not None and argument is not None and in_url != argument:
        raise errors.InvalidInputError(
            name, f"the URL says {name}={redact(in_url)!r} and the argument {redact(argument)!r}"
        )
    return argument if argument is not None else in_url


def split(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without turnkeeper's :data:`PARAMETERS`, and their values. Every
    other parameter is kept as it was written (a URL's query items are not
    re-encoded: libpq reads ``+`` as itself, not as a space)."""
    if "://" in url:
        base, sep, rest = url.partition("?")
        if not sep:
            return url, {}
        query, hash_, fragment = rest.partition("#")
        kept: list[str] = []
        found: dict[str, str] = {}
        for item in query.split("&"):
            key, _, value = item.partition("=")
            if unquote(key) in PARAMETERS:
                found[unquote(key)] = unquote(value)
            elif item:
                kept.append(item)
        rebuilt = base + ("?" + "&".join(kept) if kept else "")
        return rebuilt + (hash_ + fragment if hash_ else ""), found
    spans: list[tuple[int, int]] = []
    found = {}
    pos = 0
    while pos < len(url.rstrip()):
        m = _KEY_VALUE.match(url, pos)
        if m is None or m.end() == pos:
            return url, {}  # not key=value text libpq reads: let libpq say why
        if m.group(1) in PARAMETERS:
            spans.append((m.start(), m.end()))
            found[m.group(1)] = _unquote_value(m.group(2))
        pos = m.end()
    for start, end in reversed(spans):
        url = url[:start] + url[end:]
    return url.strip(), found


def _unquote_value(value: str) -> str:
    if value.startswith("'") and value.endswith("'") and len(value) >= 2:
        value = value[1:-1]
    return re.sub(r"\\(.)", r"\1", value)


def probe(conn: psycopg.Connection[Any]) -> Probe:
    """What ``conn`` reached (one round trip).

    Raises:
        psycopg.Error: the server failed the query (``faults.DriverError``:
            psycopg failed with an exception not its own).
        UnexpectedResultError: it answered with no row.
    """
    with faults.driver():
        cur = conn.execute(PROBE_SQL, prepare=False)
        found = cur.fetchone() if cur.nextset() else None
    row = present(found, "the connection probe's row")
    pid, schema, search_path, database, started, path = row
    pooled = pid != conn.info.backend_pid
    return Probe(pooled, schema, search_path, database, started, tuple(path))


def pinned_path(found: Probe, user: str) -> str:
    """The search_path a store behind a transaction pooler pins in every
    transaction and autocommit statement: the schemas of ``found.path`` as
    quoted identifiers, comma-separated; when none exists, the one the store
    creates (:func:`missing_schema`; ``""`` for none)."""
    names = found.path or tuple(filter(None, [missing_schema(found, user)]))
    return ", ".join(psycopg.sql.Identifier(name).as_string() for name in names)


def missing_schema(found: Probe, user: str) -> str | None:
    """The schema the store creates at open: the first of ``found``'s
    search_path when no schema of it exists (``current_schema()`` is NULL,
    where PostgreSQL says "no schema has been selected to create in"), as
    the server names it (an unquoted name in lower case, ``$user`` as
    ``user``); ``None`` when a schema of it exists, or it is empty."""
    if found.schema is not None:
        return None
    first = first_in_path(found.search_path)
    return user if first == "$user" else first


def path_names(search_path: str) -> list[str]:
    """The schema names of a ``search_path`` setting's text (``agents,
    public``, ``"My Schema", public``, ``"$user", public``), in order, as the
    server reads them: quoted as written (``""`` for ``"``), unquoted folded
    as PostgreSQL folds an identifier, its ASCII letters only to lower case
    (``Ägents`` stays ``Ägents``, where ``str.lower`` would give ``ägents``)."""
    names = []
    for found in re.finditer(r'\s*(?:"((?:[^"]|"")*)"|([^,]*?))\s*(?:,|$)', search_path):
        quoted, bare = found.group(1), found.group(2)
        if quoted is not None:
            names.append(quoted.replace('""', '"'))
        elif bare:
            names.append(bare.translate(_ASCII_LOWER))
        if found.end() >= len(search_path):
            break
    return names


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def first_in_path(search_path: str) -> str | None:
    """The first schema name of a ``search_path`` setting's text
    (:func:`path_names`); ``None`` for an empty path."""
    names = path_names(search_path)
    return names[0] if names else None


def creates_in_temporary(found: Probe, user: str) -> bool:
    """Whether tables created on the probed connection would go to its
    session's temporary schema, dropped when the connection closes: the
    first schema of its search_path that exists (``$user`` as ``user``) or
    ``pg_temp`` (which PostgreSQL makes on the first create) is ``pg_temp``,
    or the connection's current schema is a temporary one."""
    if found.schema is not None and found.schema.startswith("pg_temp_"):
        return True
    for name in path_names(found.search_path):
        name = user if name == "$user" else name
        if name == "pg_temp" or name.startswith("pg_temp_"):
            return True
        if name in found.path:
            return False
    return False


def pin_sql(path: str) -> str:
    """The ``SET LOCAL`` that pins a transaction's search_path to ``path``
    (:func:`pinned_path`), sent in one pipeline with its ``BEGIN`` and its
    first statement (:mod:`.ahead`)."""
    return f"SET LOCAL search_path TO {path or repr('')}"


def pinned(
    conn: psycopg.Connection[Any],
    path: str,
    query: str,
    params: list[Any] | None,
    binary: bool = False,
) -> psycopg.Cursor[Any]:
    """Run one autocommit statement with the search_path pinned to ``path``:
    :data:`PIN_SQL` and the statement in one pipeline, one implicit
    transaction and one round trip. Where libpq has no pipeline mode (before
    14) the statement runs in a transaction of its own instead (three round
    trips).

    A ``VACUUM`` (which cannot run in a pipeline or a transaction) is sent
    alone, unpinned: its caller names its tables with their schema.

    Raises:
        psycopg.Error: the server failed the statement (nothing of it is kept).
    """
    if query.lstrip()[:6].upper() == "VACUUM":
        return conn.execute(query, params, binary=binary)
    if psycopg.Pipeline.is_supported():
        with conn.pipeline():
            conn.execute(PIN_SQL, [path])
            return conn.execute(query, params, binary=binary)
    conn.execute(f"BEGIN; {pin_sql(path)}")
    try:
        cur = conn.execute(query, params, binary=binary)
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(Exception):
            conn.execute("ROLLBACK")
        raise
    return cur


def url_schema(url: str) -> str | None:
    """The schema the URL's ``options`` (or ``PGOPTIONS``) put first on the
    ``search_path``, as the server folds it (:func:`path_names`);
    ``None`` when they set none, or put ``$user`` first."""
    try:
        options = conninfo_to_dict(url).get("options")
    except psycopg.Error:
        return None
    if options is None:
        options = os.environ.get("PGOPTIONS")
    found = _SEARCH_PATH.search(str(options or ""))
    if found is None:
        return None
    first = first_in_path(re.sub(r"\\(.)", r"\1", found.group(1)))
    return None if first == "$user" else first


def check_schema(path: str, url: str, found: Probe) -> None:
    """Behind a pooler: the connection must land in the schema the URL names.

    Raises:
        PoolerError: ``feature="search_path"``: it lands elsewhere (the pooler
            dropped the URL's ``options``). A schema that does not exist
            while its search_path names it first and no other of it exists
            passes: the open creates it (:func:`missing_schema`).
    """
    wanted = url_schema(url)
    if wanted is None or found.schema == wanted:
        return
    path_now = found.search_path
    if found.schema is None and first_in_path(path_now) == wanted:
        return  # the role's search_path names it, and the open creates it
    if first_in_path(path_now) == wanted:
        why = f"the search_path is {path_now!r}, but schema {wanted!r} does not exist"
    else:
        why = (
            f"the URL's options set search_path to {wanted!r}, but the pooler's server "
            f"connections use {path_now!r} (schema {found.schema!r}): the pooler dropped "
            f"the options (PgBouncer's ignore_startup_parameters); {SETUP_HINT}"
        )
    raise errors.PoolerError(path, "search_path", detail=why)


def refused(exc: psycopg.Error, path: str) -> errors.PoolerError | None:
    """The typed error for a connection a pooler refused for a startup
    parameter (PgBouncer: ``unsupported startup parameter: options``), or ``None``."""
    text = str(exc)
    found = re.search(r"unsupported startup parameter(?: in options)?: ?(\S+)", text)
    if found is None:
        return None
    name = found.group(1).split("=")[0]
    return errors.PoolerError(
        path,
        "options",
        detail=f"the pooler refused the startup parameter {name!r}; {SETUP_HINT} (and other "
        "settings the role's: ALTER ROLE … SET …); leave options out of the URL, or keep "
        "only search_path there and list options in PgBouncer's ignore_startup_parameters "
        "(the store then checks the schema it lands in)",
    )


def listen_check(
    expected: Probe | None, allow_pooled: bool
) -> Callable[[psycopg.Connection[Any], bool], str | None]:
    """A listener's check of each connection it opens (``first``: its first):
    what is wrong with it, or ``None``. ``expected`` is the store's own server
    (the first connection must reach it; later ones, the same database)."""

    def check(conn: psycopg.Connection[Any], first: bool) -> str | None:
        found = probe(conn)
        if found.pooled and not allow_pooled:
            return (
                "listen_url goes through a connection pooler too (its process id is not "
                "the server's): LISTEN needs a direct connection to the server"
            )
        if expected is None:
            return None
        if found.database != expected.database:
            return (
                f"listen_url reaches database {found.database!r}, the store's is "
                f"{expected.database!r}: a NOTIFY reaches listeners of its own database only"
            )
        if first and found.started != expected.started:
            return (
                f"listen_url reaches a server started at {found.started.isoformat()}, the "
                f"store's started at {expected.started.isoformat()}: another server (or the "
                "server restarted meanwhile: subscribe again)"
            )
        return None

    return check


_SECRET_KEYWORD = re.compile(r"\b(\w*password)\s*=\s*(?:'(?:\\.|[^'\\])*'?|\S+)", re.IGNORECASE)
"""A ``password=`` or ``sslpassword=`` keyword of a key=value conninfo, its value
quoted (an unterminated quote: to the end) or not."""


def redact(url: str) -> str:
    """``url`` without its secrets (what the store shows as its ``path``, in every
    message): each password libpq would read, as ``user:password@``, a query
    parameter or a key=value keyword whose name ends in ``password``
    (``password``, ``sslpassword``), is shown as ``***``; the rest as given."""
    if "://" not in url:
        return _SECRET_KEYWORD.sub(lambda m: f"{m.group(1)}=***", url)
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:  # the user info ends at the last @ (a host has none)
        user, _, hosts = netloc.rpartition("@")
        if ":" in user:
            user = user.split(":", 1)[0] + ":***"
        netloc = f"{user}@{hosts}"
    query = "&".join(
        f"{pair.split('=', 1)[0]}=***" if _is_secret(pair) else pair
        for pair in parts.query.split("&")
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _is_secret(pair: str) -> bool:
    return unquote(pair.split("=", 1)[0]).strip().lower().endswith("password")
