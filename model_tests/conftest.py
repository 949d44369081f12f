"""Shared fixtures: one store per backend, an injected clock, Hypothesis profiles.

Profiles (``HYPOTHESIS_PROFILE``): ``dev`` (default, quick), ``ci`` (bounded
for CI), ``nightly`` (long runs on demand).
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, settings
from shares import CLAIMS_ENV, run_claimed

import turnkeeper
from turnkeeper.fuzz import FakeClock

settings.register_profile(
    "dev",
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    max_examples=120,
    stateful_step_count=30,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "nightly",
    max_examples=5000,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# A runner that starts the suite in the background (a shell's ``cmd &`` without
# job control) leaves SIGINT ignored, and every process a test starts inherits
# that: the Ctrl-C tests would see no interrupt at all. Python's own handler is
# put back (a caught signal is reset to the default across exec, so the CLI
# processes the tests start answer Ctrl-C as they would in a terminal).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

BACKENDS = ["duckdb", "postgres"]
"""Every backend the conformance suite and the stateful machines run over."""

ENCRYPTED_ENV = "TURNKEEPER_TEST_ENCRYPTED"
"""Set to ``1``: the ``store`` and ``any_store`` fixtures and the stateful
machines run over :data:`ENCRYPTED` too (encryption at rest on, issue 23);
``only``: over :data:`ENCRYPTED` alone, and only the tests that run over them
(``make test-encrypted``, a CI pass of its own)."""

ENCRYPTED = ["duckdb+enc", "postgres+enc"]
"""Each backend with encryption at rest on (``open_store(..., encryption=TEST_KEYS)``)."""

STORES = {"1": BACKENDS + ENCRYPTED, "only": ENCRYPTED}.get(
    os.environ.get(ENCRYPTED_ENV, ""), BACKENDS
)
"""The store configurations the conformance suite and the machines run over:
:data:`BACKENDS`, and :data:`ENCRYPTED` when :data:`ENCRYPTED_ENV` is ``1``."""

TEST_KEYS = turnkeeper.LocalKeyProvider.from_text(
    "test-master:" + base64.b64encode(bytes(range(32))).decode()
)
"""The master key of the encrypted configurations (a fixed test key)."""


def engine(backend: str) -> str:
    """The engine of a store configuration (``"postgres+enc"`` → ``"postgres"``)."""
    return backend.split("+", 1)[0]


DUCKDB_SHARE = 2
"""The stateful machines' examples on DuckDB are the profile's divided by this,
on PostgreSQL by :data:`POSTGRES_SHARE`, and through PgBouncer by
:data:`POOLER_SHARE` (under the ``ci`` profile: 60 on DuckDB, 60 on
PostgreSQL, 30 through the pooler). The machines' domain logic is the same
one on both engines, so the search for new interleavings is split between
them, and each engine's share also checks its own SQL, locking and isolation,
which every operation of every example runs through. An example costs more on
DuckDB than on a local PostgreSQL server (measured at load 5 on 2 cores, 30
steps: 0.64-0.75 s against 0.29 s for the lease machine: a DuckDB commit is
the dearer one), so DuckDB's share is no longer the whole profile (it was
120, the CI run over its time budget, issue 22). The pooler's share checks
that the statements work through a transaction pooler, which the first
examples already send. The ``nightly`` profile runs every configuration at
full budget."""

POSTGRES_SHARE = 2
"""See :data:`DUCKDB_SHARE`."""

POOLER_SHARE = 4
"""See :data:`POSTGRES_SHARE`."""

ENCRYPTED_SHARE = 2
"""An encrypted configuration's examples are its backend's divided by this
too (60 on duckdb+enc, 30 on postgres+enc under ``ci``): every operation of
the first examples already seals and opens what it writes and reads; the
search for new interleavings is the clear configurations'."""


def machine_settings(backend: str, *, max_examples: int | None = None) -> settings:
    """The settings a stateful machine runs with on ``backend``: the loaded
    profile's, its examples (at most ``max_examples``) divided by the
    backend's share (:data:`DUCKDB_SHARE`, :data:`POSTGRES_SHARE`,
    :data:`ENCRYPTED_SHARE`) unless
    the profile is ``nightly`` (at least 10)."""
    profile = settings.default
    examples = profile.max_examples
    if max_examples is not None:
        examples = min(examples, max_examples)
    if os.environ.get("HYPOTHESIS_PROFILE") != "nightly":
        if engine(backend) == "duckdb":
            examples = max(10, examples // DUCKDB_SHARE)
        if engine(backend) == "postgres":
            examples = max(10, examples // (POOLER_SHARE if through_pooler() else POSTGRES_SHARE))
        if backend in ENCRYPTED:
            examples = max(10, examples // ENCRYPTED_SHARE)
    return settings(profile, max_examples=examples)


PG_ENV = "TURNKEEPER_TEST_PG"
"""A PostgreSQL URL the tests may create schemas in (``make test`` starts a
throwaway server and sets it); unset, the PostgreSQL tests skip (and fail
under ``CI=true``)."""

POOLER_ENV = "TURNKEEPER_TEST_PGBOUNCER"
"""A PgBouncer in transaction mode in front of the test server (``make test``
starts one where PgBouncer is installed); unset, the pooler tests skip (and
fail under ``CI=true``)."""

DIRECT_ENV = "TURNKEEPER_TEST_PG_DIRECT"
"""The test server itself: what :data:`PG_ENV` names, unless the suite runs
through PgBouncer (``with_postgres.py --through-pgbouncer``)."""

_SCHEMAS: list[tuple[str, str]] = []
_ROLES: list[str] = []
_DIRECT: dict[str, str] = {}


def pg_url() -> str:
    """The test server's URL, or skip (fail in CI) when there is none."""
    url = os.environ.get(PG_ENV)
    if not url:
        why = f"PostgreSQL tests skipped: no test server ({PG_ENV} is unset; make test starts one)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    return url


def with_schema(url: str, schema: str) -> str:
    """``url`` with ``search_path`` set to ``schema`` (libpq ``options``)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


def direct_url() -> str:
    """The test server itself (not through PgBouncer), or skip (fail in CI)."""
    return os.environ.get(DIRECT_ENV) or pg_url()


def pooler_url() -> str:
    """The PgBouncer in front of the test server, or skip (fail in CI)."""
    direct_url()
    url = os.environ.get(POOLER_ENV)
    if not url:
        why = f"PgBouncer tests skipped: no pooler ({POOLER_ENV} is unset; make test starts one)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    return url


def through_pooler() -> bool:
    """Whether the suite runs through PgBouncer (``--through-pgbouncer``)."""
    return bool(os.environ.get(PG_ENV)) and os.environ.get(PG_ENV) == os.environ.get(POOLER_ENV)


def as_user(url: str, user: str) -> str:
    """``url`` (``postgresql://postgres@…``) logging in as ``user``."""
    return url.replace("postgresql://postgres@", f"postgresql://{user}@", 1)


def new_pg_schema() -> str:
    """A fresh empty schema on the test server; its URL (dropped at the session's
    end). Through PgBouncer (:func:`through_pooler`) the URL logs in through the
    pooler as a role of the schema's own whose default ``search_path`` is that
    schema (the pooler drops the URL's ``options``); :func:`direct_for` gives
    the same schema and role on the server itself."""
    if through_pooler():
        return new_pooled_schema()[0]
    import psycopg

    url = pg_url()
    schema = f"tk_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    _SCHEMAS.append((url, schema))
    return with_schema(url, schema)


def new_pooled_schema() -> tuple[str, str]:
    """A fresh empty schema owned by a new role (a superuser, as ``postgres`` is)
    whose default ``search_path`` is that schema: its URL through PgBouncer and
    its direct URL (both with the schema in ``options`` too)."""
    import psycopg

    pooled, direct = pooler_url(), direct_url()
    name = f"tk_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN SUPERUSER")
        conn.execute(f"ALTER ROLE {name} SET search_path = {name}")
        conn.execute(f"CREATE SCHEMA {name} AUTHORIZATION {name}")
    _SCHEMAS.append((direct, name))
    _ROLES.append(name)
    urls = with_schema(as_user(pooled, name), name), with_schema(as_user(direct, name), name)
    _DIRECT[urls[0]] = urls[1]
    return urls


def direct_for(url: str) -> str:
    """The direct URL of a schema :func:`new_pg_schema` made (itself when it is direct)."""
    return _DIRECT.get(url, url)


def open_pg(url: str, **kwargs: Any) -> turnkeeper.BaseStore:
    """``turnkeeper.open_store(url, **kwargs)``, given the direct ``listen_url``
    wake-ups need when ``url`` goes through PgBouncer (:func:`listen_for`)."""
    listen = listen_for(url)
    return turnkeeper.open_store(
        url, **kwargs, **({} if listen is None else {"listen_url": listen})
    )


def with_listen(url: str) -> str:
    """``url`` carrying the ``listen_url`` parameter :func:`listen_for` gives (for
    a store in another process; libpq itself refuses the parameter)."""
    listen = listen_for(url)
    return url if listen is None else f"{url}&listen_url={quote(listen, safe='')}"


def listen_for(url: str) -> str | None:
    """What a store on ``url`` needs as ``listen_url`` for wake-ups: the direct
    URL when ``url`` goes through PgBouncer, else ``None``."""
    found = _DIRECT.get(url)
    return found if found is not None and found != url else None


def _on_postgres(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return item.get_closest_marker("postgres") is not None or any(
        isinstance(p, str) and engine(p) == "postgres" for p in params
    )


def _encrypted(item: pytest.Item) -> bool:
    """Whether ``item`` runs over an encrypted configuration (:data:`ENCRYPTED`)."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return any(isinstance(p, str) and p in ENCRYPTED for p in params)


def _param(item: pytest.Item, name: str) -> object:
    """``item``'s parameter ``name`` (``None`` when it has none)."""
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get(name)


_LEFT_OUT: list[int] = []
_SEARCHES_LEFT_OUT: list[int] = []
_CORPUS_LEFT_OUT: list[int] = []

SEARCHING = os.environ.get("HYPOTHESIS_PROFILE") == "nightly"
"""Whether the ``search`` tests run: Hypothesis searching from scratch for the
counterexample of a fence patched out. CI replays every kill's stored
counterexample instead (the ``test_stored_counterexample_*`` tests), so the
searches run on demand: ``HYPOTHESIS_PROFILE=nightly make test``, or
``pytest -m search``."""


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _uses_corpus(item: pytest.Item) -> bool:
    return bool({"pi_dir", "corpus_dir"} & set(getattr(item, "fixturenames", ())))


_CLAIMS = os.environ.pop(CLAIMS_ENV, None)
"""Where this process claims the files it runs, when it is one share of the
suite (``model_tests/in_shards.py``, which ``make test`` runs it under;
:mod:`shares`); taken out of the environment when the suite starts, with the
share's name (``TURNKEEPER_TEST_SHARD``): the pytest runs the tests start
(killing-test collection, mutants, suite gates) are whole suites of their own,
never a share of theirs."""
os.environ.pop("TURNKEEPER_TEST_SHARD", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The selection below (:func:`_select`)."""
    _select(config, items)


def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """In a share of the suite, the files this process claims (:mod:`shares`);
    else pytest's own loop."""
    if _CLAIMS is None:
        return None
    return run_claimed(session, Path(_CLAIMS))


def _select(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the ``search`` tests out unless :data:`SEARCHING` or ``-m`` names
    them; without the shared corpus the tests that read it (those using
    :func:`pi_dir` or :func:`corpus_dir`), and without a test server the PostgreSQL tests (one
    summary line says so for each); under ``CI=true`` the latter two are an
    error: CI must test both backends, on the real session files. Through
    PgBouncer (:func:`through_pooler`) only the PostgreSQL tests run, but for
    those marked ``own_servers`` (they form servers of their own)."""
    if not SEARCHING and "search" not in (config.option.markexpr or ""):
        searches = [i for i in items if i.get_closest_marker("search") is not None]
        if searches:
            items[:] = [i for i in items if i.get_closest_marker("search") is None]
            config.hook.pytest_deselected(items=searches)
            _SEARCHES_LEFT_OUT.append(len(searches))
    corpus = [] if (CORPUS / "pi").is_dir() else [i for i in items if _uses_corpus(i)]
    if corpus:
        if _in_ci():
            raise pytest.UsageError(
                f"CI=true and the corpus folder {CORPUS / 'pi'} is missing "
                f"({len(corpus)} tests read it; set {CORPUS_ENV})"
            )
        items[:] = [i for i in items if not _uses_corpus(i)]
        config.hook.pytest_deselected(items=corpus)
        _CORPUS_LEFT_OUT.append(len(corpus))
    if os.environ.get(ENCRYPTED_ENV) == "only":  # the encrypted configurations alone:
        # every other test ran in the clear pass already
        clear = [i for i in items if not _encrypted(i)]
        items[:] = [i for i in items if _encrypted(i)]
        config.hook.pytest_deselected(items=clear)

    # The async facade over an encrypted DuckDB store runs the synchronous
    # store's own calls on a thread (AsyncStore.wrap): the same sealing as the
    # sync facade's, and its own calls are the clear pass's. (On PostgreSQL it
    # is the native async store, a runner of its own: that one runs.)
    def twin(i: pytest.Item) -> bool:
        return _param(i, "any_store") == "duckdb+enc" and _param(i, "facade") == "aio"

    twins = [i for i in items if twin(i)]
    if twins:
        items[:] = [i for i in items if not twin(i)]
        config.hook.pytest_deselected(items=twins)
    if through_pooler():  # the PostgreSQL part, through PgBouncer: DuckDB's ran already
        # (and the tests forming servers of their own: the pooler changes nothing there)
        def ran(i: pytest.Item) -> bool:
            return not _on_postgres(i) or i.get_closest_marker("own_servers") is not None

        done = [i for i in items if ran(i)]
        items[:] = [i for i in items if not ran(i)]
        config.hook.pytest_deselected(items=done)
        return
    if os.environ.get(PG_ENV):
        return
    left = [i for i in items if _on_postgres(i)]
    if not left:
        return
    if _in_ci():
        raise pytest.UsageError(f"CI=true and {PG_ENV} is unset: no PostgreSQL test server")
    items[:] = [i for i in items if not _on_postgres(i)]
    config.hook.pytest_deselected(items=left)
    _LEFT_OUT.append(len(left))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SEARCHES_LEFT_OUT:
        terminalreporter.write_line(
            f"fence-kill searches left out ({sum(_SEARCHES_LEFT_OUT)}): every kill's stored "
            "counterexample ran instead; HYPOTHESIS_PROFILE=nightly (or -m search) runs them"
        )
    if _CORPUS_LEFT_OUT:
        terminalreporter.write_line(
            f"corpus tests skipped ({sum(_CORPUS_LEFT_OUT)}): the folder {CORPUS / 'pi'} is "
            f"missing (set {CORPUS_ENV} to the shared corpus; CI=true fails instead)"
        )
    if _LEFT_OUT:
        terminalreporter.write_line(
            f"PostgreSQL tests skipped ({sum(_LEFT_OUT)}): no test server ({PG_ENV} is unset; "
            "make test starts a throwaway one where PostgreSQL is installed)"
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Drop the schemas the tests created and this process's DDL watch (a
    throwaway server is dropped whole)."""
    for admin in _ADMIN:
        admin.close()
    if not _SCHEMAS:
        return
    import psycopg

    with psycopg.connect(direct_url(), autocommit=True) as conn:
        if _ADMIN:
            conn.execute(f"DROP EVENT TRIGGER IF EXISTS {_WATCH}")
            conn.execute(f"DROP FUNCTION IF EXISTS public.{_WATCH}()")
            conn.execute(f"DROP SEQUENCE IF EXISTS public.{_WATCH}")
        for _, schema in _SCHEMAS:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        for role in _ROLES:
            conn.execute(f"DROP OWNED BY {role} CASCADE")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


@dataclass(frozen=True)
class BackendOpener:
    """The machines' opener (``turnkeeper.fuzz.StoreOpener``) on a store
    configuration of :data:`STORES`: :func:`open_backend` and :func:`close_backend`."""

    name: str

    def open(self, clock: Callable[[], datetime]) -> turnkeeper.BaseStore:
        return open_backend(self.name, None, clock)

    def close(self, store: turnkeeper.BaseStore) -> None:
        close_backend(store)

    def peer(
        self, store: turnkeeper.BaseStore, clock: Callable[[], datetime]
    ) -> turnkeeper.BaseStore | None:
        """Another store object on ``store``'s schema (PostgreSQL), else ``None``."""
        if engine(self.name) != "postgres":
            return None
        keys = TEST_KEYS if self.name in ENCRYPTED else None
        return open_pg(_OPENED[id(store)], clock=clock, encryption=keys)


def opener(backend: str) -> BackendOpener:
    """The stateful machines' opener on ``backend`` (a :data:`STORES` configuration)."""
    return BackendOpener(backend)


def open_backend(
    backend: str, path: Path | None, clock: Callable[[], datetime] | None
) -> turnkeeper.BaseStore:
    """A new, empty store on ``backend``: a DuckDB file in ``path`` (without
    one, in a scratch folder: see below), or an empty schema on the PostgreSQL test server. Close it
    with :func:`close_backend`, which hands its schema to a later test.

    Both start from the newest schema already made: the DuckDB file is a copy
    of one migrated once per process (a byte copy: what a migration would
    write), and the PostgreSQL schema is one a test before emptied
    (:func:`close_backend`) or else a new one. A migration costs about 0.1 s
    on DuckDB and 0.4 s on PostgreSQL (90 DDL statements, server-side work),
    paid by every test before this (about a quarter of CI's time). Without
    ``path`` a DuckDB store is a copy of that file in :func:`_scratch` (in
    memory, ``/dev/shm``, where there is one), deleted by :func:`close_backend`:
    the stateful machines open one per example, and an in-memory store
    migrated anew cost twice as much as the copy (0.22 against 0.10 s, load 4.5);
    with test-patched migrations it is an in-memory store, migrated by them."""
    shipped = _migrations_as_shipped()
    keys = TEST_KEYS if backend in ENCRYPTED else None
    backend = engine(backend)
    if backend == "duckdb":
        if path is None and not shipped:
            return turnkeeper.open_store(":memory:", clock=clock, encryption=keys)
        if path is None:
            where = _scratch() / f"{uuid.uuid4().hex}.duckdb"
            shutil.copyfile(_duckdb_template(), where)
            store = turnkeeper.open_store(str(where), clock=clock, encryption=keys)
            _SCRATCH_FILES[id(store)] = where
            return store
        where = path / "store.duckdb"
        if shipped and not where.exists():
            shutil.copyfile(_duckdb_template(), where)
        return turnkeeper.open_store(str(where), clock=clock, encryption=keys)
    if backend == "postgres":
        if _SPARE and shipped:
            url = _SPARE.pop()
            _mark(url)  # before the open: a DDL statement the open runs counts
        else:  # a new schema is compared whole when it is closed
            url = new_pg_schema()
        store = open_pg(url, clock=clock, encryption=keys)
        _OPENED[id(store)] = url
        return store
    raise ValueError(backend)


def close_backend(store: turnkeeper.BaseStore) -> None:
    """Close a store :func:`open_backend` opened; on PostgreSQL, empty its
    schema for a later test when its tables, indexes, constraints, triggers,
    functions, grants and schema versions are still exactly a new schema's
    (:func:`schema_fingerprint`), else leave it to be dropped at the end."""
    store.close()
    url = _OPENED.pop(id(store), None)
    if url is not None:
        reuse_schema(url)
    scratch = _SCRATCH_FILES.pop(id(store), None)
    if scratch is not None:
        for name in (scratch, scratch.with_name(scratch.name + ".wal")):
            name.unlink(missing_ok=True)


def _shipped_migration_code() -> list[object]:
    from turnkeeper.storage import store as base_store
    from turnkeeper.storage.duck import db as duck_db
    from turnkeeper.storage.postgres import db as pg_db

    return [
        duck_db.MIGRATIONS,
        pg_db.MIGRATIONS,
        duck_db.Database.migrations,
        pg_db.Database.migrations,
        duck_db.Database.lock_migrations,
        pg_db.Database.lock_migrations,
        base_store.BaseStore._migrate,
    ]


_SHIPPED = _shipped_migration_code()
"""The migrations and the code that runs them, as imported: a test patching
one of them (a migration cut short, an index left out) gets a store its own
patched migrations make, not a copy or a reused schema."""


def _migrations_as_shipped() -> bool:
    return all(a is b for a, b in zip(_shipped_migration_code(), _SHIPPED, strict=True))


_OPENED: dict[int, str] = {}
"""The schema URL of each open PostgreSQL store :func:`open_backend` made (by ``id``)."""

_SPARE: list[str] = []
"""Migrated, emptied schemas' URLs, for :func:`open_backend` to hand out again."""

_PRISTINE: list[str] = []
"""A newly migrated schema's fingerprint, its ``schema_migrations`` versions,
and the statements that empty a schema like it (``{schema}`` to fill in):
computed once, on a schema of its own."""

_DUCKDB_TEMPLATE: list[Path] = []

_SCRATCH_FILES: dict[int, Path] = {}
"""The file of each open DuckDB store :func:`open_backend` made without a
``path`` (by ``id``), deleted when :func:`close_backend` closes it."""

_SCRATCH: list[Path] = []


def _scratch() -> Path:
    """A folder of this process's own for the DuckDB stores :func:`open_backend`
    makes without a ``path``: in ``/dev/shm`` (memory: their fsyncs cost
    nothing) where it is a writable folder, else in the temporary folder;
    removed at exit."""
    if not _SCRATCH:
        shm = Path("/dev/shm")
        where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
        folder = Path(tempfile.mkdtemp(prefix="turnkeeper-scratch-", dir=where))
        atexit.register(shutil.rmtree, folder, True)
        _SCRATCH.append(folder)
    return _SCRATCH[0]


def _duckdb_template() -> Path:
    """A DuckDB file this turnkeeper migrated and closed (checkpointed), once per process."""
    if not _DUCKDB_TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="turnkeeper-template-"))
        atexit.register(shutil.rmtree, folder, True)
        turnkeeper.open_store(str(folder / "store.duckdb")).close()
        _DUCKDB_TEMPLATE.append(folder / "store.duckdb")
    return _DUCKDB_TEMPLATE[0]


_FINGERPRINT = """
SELECT md5(string_agg(
  regexp_replace(replace(x, %(s)s, '~'), 'turnkeeper_reader_[0-9a-f]+', 'reader', 'g'),
  '|' ORDER BY x)) FROM (
  SELECT 'n:' || coalesce(n.nspacl::text, '') AS x FROM pg_namespace n WHERE n.nspname = %(s)s
  UNION ALL
  SELECT 'c:' || c.relname || ':' || c.relkind::text || ':' || pg_get_userbyid(c.relowner)
      || ':' || coalesce(c.relacl::text, '') || ':' || c.relrowsecurity::text
      || ':' || coalesce(pg_get_indexdef(c.oid), '')
      || ':' || CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) ELSE '' END
  FROM pg_class c WHERE c.relnamespace = %(s)s::regnamespace
  UNION ALL
  SELECT 'a:' || c.relname || ':' || a.attname || ':' || format_type(a.atttypid, a.atttypmod)
      || ':' || a.attnotnull::text || ':' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  WHERE c.relnamespace = %(s)s::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT 'k:' || conrelid::regclass::text || ':' || conname || ':' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = %(s)s::regnamespace
  UNION ALL
  SELECT 't:' || pg_get_triggerdef(t.oid) || ':' || t.tgenabled::text
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
  WHERE c.relnamespace = %(s)s::regnamespace
  UNION ALL
  SELECT 'r:' || r.rulename || ':' || pg_get_ruledef(r.oid)
  FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
  WHERE c.relnamespace = %(s)s::regnamespace AND r.rulename <> '_RETURN'
  UNION ALL
  SELECT 'p:' || pol.polname || ':' || pol.polrelid::regclass::text
  FROM pg_policy pol JOIN pg_class c ON c.oid = pol.polrelid
  WHERE c.relnamespace = %(s)s::regnamespace
  UNION ALL
  SELECT 'f:' || p.oid::regprocedure::text || ':' || md5(p.prosrc)
  FROM pg_proc p WHERE p.pronamespace = %(s)s::regnamespace
  UNION ALL
  SELECT 'y:' || t.typname FROM pg_type t
  WHERE t.typnamespace = %(s)s::regnamespace AND t.typrelid = 0 AND t.typelem = 0
  UNION ALL
  SELECT 'v:' || string_agg(version::text, ',' ORDER BY version) FROM {schema}.schema_migrations
) q"""


def schema_fingerprint(conn: Any, schema: str) -> str:
    """A digest of what ``schema`` is made of, its own name left out: tables,
    columns, defaults, indexes, constraints, triggers, rules, policies,
    functions, types, owners and grants, and the versions in
    ``schema_migrations``, with the name of the schema's reader role (one
    per schema) left out too. Equal for two schemas the same migrations made."""
    row = conn.execute(_FINGERPRINT.format(schema=schema), {"s": schema}).fetchone()
    return str(row[0])


def _schema_of(url: str) -> str:
    return url.rsplit("search_path%3D", 1)[1]


_WATCH = f"turnkeeper_test_ddl_{uuid.uuid4().hex[:12]}"
"""This process's DDL watch on the test server: an event trigger of that name
counting every DDL statement (``ddl_command_end``: CREATE, ALTER, DROP, GRANT,
REVOKE, ..., by any session, in any schema) in a sequence of that name.
Dropped when the suite ends (:func:`pytest_sessionfinish`)."""

_WATCH_DDL = f"""
SELECT pg_advisory_xact_lock(hashtext('turnkeeper_test_ddl'));
CREATE SEQUENCE IF NOT EXISTS public.{_WATCH};
CREATE OR REPLACE FUNCTION public.{_WATCH}() RETURNS event_trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
  AS $$ BEGIN PERFORM nextval('public.{_WATCH}'); END $$;
DROP EVENT TRIGGER IF EXISTS {_WATCH};
CREATE EVENT TRIGGER {_WATCH} ON ddl_command_end EXECUTE FUNCTION public.{_WATCH}();
ALTER EVENT TRIGGER {_WATCH} ENABLE ALWAYS;
"""

_ADMIN: list[Any] = []
"""The direct connection (autocommit) :func:`reuse_schema` works through, once
the DDL watch is installed on it."""

_MARKS: dict[str, tuple[int, bool]] = {}
"""The DDL watch's count just before :func:`open_backend` opened a store on a
spare schema (by URL)."""


def _admin() -> Any:
    import psycopg

    if _ADMIN and not _ADMIN[0].closed and not _ADMIN[0].broken:
        return _ADMIN[0]
    conn = psycopg.connect(direct_url(), autocommit=True)
    with conn.transaction():
        conn.execute(_WATCH_DDL)
    # A connection a test left holding a lock keeps its schema out of reuse:
    # no statement here waits on it for long (a read of schema_migrations too).
    conn.execute("SET lock_timeout = '2s'")
    _ADMIN[:] = [conn]
    return conn


def ddl_mark(conn: Any) -> tuple[int, bool]:
    """The DDL watch's count (its sequence's ``last_value`` and ``is_called``):
    it moves with every DDL statement the test server runs."""
    row = conn.execute(f"SELECT last_value, is_called FROM public.{_WATCH}").fetchone()
    return int(row[0]), bool(row[1])


def _mark(url: str) -> None:
    """Note the DDL watch's count for a store about to open on the spare schema
    ``url`` (exactly a new schema: :func:`reuse_schema` found it so)."""
    import psycopg

    try:
        _MARKS[url] = ddl_mark(_admin())
    except psycopg.Error:
        _MARKS.pop(url, None)


def _versions(conn: Any, schema: str) -> str:
    row = conn.execute(
        f"SELECT string_agg(version::text, ',' ORDER BY version) FROM {schema}.schema_migrations"
    ).fetchone()
    return str(row[0])


def reuse_schema(url: str) -> None:
    """Empty the schema of ``url`` (``DELETE`` from every table but
    ``schema_migrations``; the schema has no foreign keys or sequences) and
    keep it for :func:`open_backend`, when it is still exactly a newly migrated
    schema; else leave it as it is.

    Exactly a new schema: it was a spare (exactly a new schema then), no DDL
    statement ran on the server since just before its store opened (the DDL
    watch's count is the one :func:`_mark` noted) and its
    ``schema_migrations`` versions are a new schema's; or else its
    :func:`schema_fingerprint` is a new schema's (a schema made for the test,
    or one whose test made DDL here or anywhere, pays for the whole
    comparison)."""
    import psycopg

    schema = _schema_of(url)
    mark = _MARKS.pop(url, None)
    try:
        conn = _admin()
        if not _PRISTINE:
            fresh = new_pg_schema()
            open_pg(fresh).close()
            made = _schema_of(fresh)
            tables = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s "
                "AND tablename <> 'schema_migrations' ORDER BY 1",
                [made],
            ).fetchall()
            _PRISTINE.extend(
                [
                    schema_fingerprint(conn, made),
                    _versions(conn, made),
                    ";".join(f"DELETE FROM {{schema}}.{t}" for (t,) in tables),
                ]
            )
        fingerprint, versions, delete = _PRISTINE
        if mark is not None and ddl_mark(conn) == mark:
            if _versions(conn, schema) != versions:
                return
        elif schema_fingerprint(conn, schema) != fingerprint:
            return
        with conn.transaction():
            conn.execute(delete.format(schema=schema))
    except psycopg.Error:  # the server went away (a test stopped it) or a lock held on
        for conn in _ADMIN:
            conn.close()
        _ADMIN.clear()
        return
    _SPARE.append(url)


CORPUS_ENV = "TURNKEEPER_CORPUS"
"""Where the shared corpus is, when not ``../shared/corpus`` beside the checkout."""

CORPUS = Path(
    os.environ.get(CORPUS_ENV) or Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
)
"""The shared corpus of real session files (read in place, never copied)."""


@pytest.fixture(scope="session")
def pi_dir() -> Path:
    """The corpus's pi files. Without them the tests using this fixture are left
    out at collection (one summary line says so), and under ``CI=true`` the run
    fails (see :func:`pytest_collection_modifyitems`); this check is for a
    folder gone since."""
    folder = CORPUS / "pi"
    if not folder.is_dir():
        pytest.fail(f"corpus folder {folder} is missing (set {CORPUS_ENV})")
    return folder


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """The shared corpus folder (``claude-code/``, ``codex/``, ``pi/``), left
    out or failing under ``CI=true`` as :func:`pi_dir` is."""
    for sub in ("pi", "claude-code", "codex"):
        if not (CORPUS / sub).is_dir():
            pytest.fail(f"corpus folder {CORPUS / sub} is missing (set {CORPUS_ENV})")
    return CORPUS


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=STORES)
def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[turnkeeper.BaseStore]:
    s = open_backend(request.param, tmp_path, clock)
    yield s
    close_backend(s)


FACADES = ["sync", "aio"]
"""How the conformance suite calls the store: directly, or through ``turnkeeper.aio``."""


@pytest.fixture(params=FACADES)
def facade(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=STORES)
def any_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock, facade: str
) -> Iterator[Any]:
    """The conformance modules' store (they take it as ``store``): each backend,
    called directly and through the async store (``through_aio.ThroughAio``:
    every area call is ``turnkeeper.aio``'s, awaited on an event loop)."""
    from through_aio import ThroughAio

    s = open_backend(request.param, tmp_path, clock)
    if facade == "sync":
        yield s
    else:
        with ThroughAio(s) as view:
            yield view
            assert view.area_calls() > 0, "the test made no call through the async store"
    close_backend(s)


@pytest.fixture(params=BACKENDS)
def real_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[turnkeeper.BaseStore]:
    """A store on the database's own clock."""
    s = open_backend(request.param, tmp_path, None)
    yield s
    close_backend(s)


@pytest.fixture
def duck_real_store(tmp_path: Path) -> Iterator[turnkeeper.DuckDBStore]:
    """A DuckDB store on the database's own clock."""
    s = turnkeeper.open_store(str(tmp_path / "store.duckdb"))
    assert isinstance(s, turnkeeper.DuckDBStore)
    yield s
    s.close()


@pytest.fixture
def duck_store(tmp_path: Path, clock: FakeClock) -> Iterator[turnkeeper.DuckDBStore]:
    """A DuckDB store, for what only the embedded backend has (its file, its lock,
    its query parser)."""
    s = turnkeeper.open_store(str(tmp_path / "store.duckdb"), clock=clock)
    assert isinstance(s, turnkeeper.DuckDBStore)
    yield s
    s.close()


@pytest.fixture(params=["duckdb", "postgres"])
def enc(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Any]:
    """An encrypted store (:data:`TEST_KEYS`) on each engine, DuckDB's in a
    file (so :func:`reopen` can open another object on it)."""
    s = open_backend(f"{request.param}+enc", tmp_path, clock)
    yield s
    close_backend(s)


def reopen(store: turnkeeper.BaseStore, **kwargs: Any) -> Any:
    """Another store object on the same database as ``store`` (its own
    caches, keys and connections), opened with ``kwargs``
    (``encryption=``, ``clock=``…); the caller closes it."""
    url = getattr(store.db, "url", None) or getattr(store, "path", None)
    return turnkeeper.open_store(url, **kwargs)


def forge(
    store: turnkeeper.BaseStore, sql: str, params: list[Any] | None = None, *, rows: int | None
) -> None:
    """Write ``sql`` straight to the store's database, bypassing every check: tests
    use it to forge states the store itself never writes (``query`` only reads).

    ``rows`` is how many rows the statement must change, checked: a forged
    state that changed nothing leaves the test nothing to find, and it then
    fails for the wrong reason or, worse, passes (CI: a corruption's UPDATE
    found no row on a loaded machine). ``None`` only for a statement that
    changes no rows (DDL, ``ANALYZE``); :func:`forged_rows` when the count
    varies and the caller checks it."""
    if rows is None:
        store.db.write(
            "forge", lambda tx: tx.exec(sql, params or []), transaction=False, retry=False
        )
        return
    changed = forged_rows(store, sql, params)
    assert changed == rows, f"the forge changed {changed} rows, not {rows}: {sql}"


def reseal(
    store: turnkeeper.BaseStore,
    seq: int,
    payload: bytes | None = None,
    session_id: str = "s",
    tenant: str = "",
    *,
    epoch: int | None = None,
) -> None:
    """Forge record ``seq`` of ``tenant``'s ``session_id`` consistently: set its
    ``payload`` and/or ``epoch`` (``None``: kept), with its sha256 and its
    record digest recomputed (a forger who knows the format; tests use it to
    reach the checks past the record's own, such as a blob pointer's or the
    epoch fence)."""
    from turnkeeper.storage.ops.ledger import records

    where = "WHERE tenant = ? AND session_id = ? AND seq = ?"
    kind, rid, old_epoch, old_payload = store.db.read(
        "forge",
        lambda tx: tx.one(
            f"SELECT kind, idempotency_id, epoch, payload FROM ledger_records {where}",
            [tenant, session_id, seq],
        ),
    )
    body = (
        ledger_payload(store, seq, session_id, tenant, stored=bytes(old_payload))
        if payload is None
        else payload
    )
    stamp = old_epoch if epoch is None else epoch
    digest = records.sha256(body)
    sealed = records.record_digest(tenant, session_id, seq, kind, rid, stamp, digest)
    stored = (stored_ledger_payload(store, session_id, seq, body), digest, stamp, sealed)
    forge(
        store,
        "UPDATE ledger_records SET payload = ?, payload_sha256 = ?, epoch = ?, "
        f"record_sha256 = ? {where}",
        [*stored, tenant, session_id, seq],
        rows=1,
    )


def ledger_payload(
    store: Any, seq: int, session_id: str = "s", tenant: str = "", *, stored: bytes | None = None
) -> bytes:
    """The clear payload of ledger record ``seq`` of ``tenant``'s ``session_id``
    (``stored``: those stored bytes instead of the row's): opened under the
    session's data key in an encrypted store (``Keyring.open_bytes``), else as
    stored."""
    from turnkeeper.storage.ops.ledger import sealing

    db = getattr(store, "sync", store).db

    def body(tx: Any) -> bytes:
        raw = stored
        if raw is None:
            raw = bytes(
                tx.one(
                    "SELECT payload FROM ledger_records "
                    "WHERE tenant = ? AND session_id = ? AND seq = ?",
                    [tenant, session_id, seq],
                )[0]
            )
        opened: bytes = tx.keys.open_bytes(
            tx, session_id, sealing.record_id(seq), sealing.PAYLOAD, raw
        )
        return opened

    return bytes(db.read("open", body))


def stored_ledger_payload(store: Any, session_id: str, seq: int, payload: bytes) -> bytes:
    """``payload`` as the store would hold it at ledger record ``seq`` of
    ``session_id``: sealed under the session's data key in an encrypted store
    (for a forge of a ledger row), else as given."""
    from turnkeeper.storage.ops.ledger import sealing

    db = getattr(store, "sync", store).db
    return bytes(db.read("seal", lambda tx: sealing.sealer(tx, session_id)(seq, payload)))


def stored_blob(store: Any, session_id: str, key: str, blob: bytes) -> bytes:
    """The clear blob ``blob`` as the store would hold it under ``key`` (a
    blob of ``session_id``): sealed in an encrypted store, else as given."""
    from turnkeeper.storage.ops.ledger import sealing

    return sealing.seal_blob(getattr(store, "sync", store).db, session_id, key, blob)


def clear_blob(store: Any, session_id: str, key: str, stored: bytes) -> bytes:
    """The clear envelope of the blob ``stored`` under ``key``: opened in an
    encrypted store, else as stored."""
    from turnkeeper.storage.ops.ledger import sealing

    return sealing.open_blob(getattr(store, "sync", store).db, session_id, key, stored)


def stored_payload(store: Any, session_id: str, entry_id: str, payload_json: str) -> str:
    """``payload_json`` as the store would hold it for entry ``entry_id`` of
    ``session_id``: sealed under the session's data key in an encrypted store
    (for a forge of an entry row), else as given."""
    from turnkeeper.storage.ops.entry_rows import seal_payloads

    db = getattr(store, "sync", store).db
    return str(
        db.read("seal", lambda tx: seal_payloads(tx, session_id, [(entry_id, payload_json)])[0][0])
    )


def forged_rows(store: turnkeeper.BaseStore, sql: str, params: list[Any] | None = None) -> int:
    """Like :func:`forge`; returns how many rows ``sql`` changed, for the caller to check."""
    count: int = store.db.write(
        "forge", lambda tx: tx.count(sql, params or []), transaction=False, retry=False
    )
    return count


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """An S3 endpoint for the tests: moto's server (``moto[server]``, the test
    extra) in a thread on a free port of 127.0.0.1, with one bucket
    ``turnkeeper-test``; stopped when the session ends. Nothing leaves the
    machine (explicit fake credentials, the instance metadata lookup off)."""
    import boto3  # moto's own dependency
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    try:
        boto3.client(
            "s3",
            endpoint_url=url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket="turnkeeper-test")
        yield url
    finally:
        server.stop()


def s3_options(endpoint: str) -> dict[str, Any]:
    """``s3fs.S3FileSystem`` keywords for the test endpoint: fake credentials,
    no instance cache and no listings cache (a listing reads the store)."""
    return {
        "key": "testing",
        "secret": "testing",
        "endpoint_url": endpoint,
        "client_kwargs": {"region_name": "us-east-1"},
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }


@pytest.fixture
def s3_blobs(s3_endpoint: str) -> Callable[[], turnkeeper.FsspecBlobs]:
    """Makes a :class:`turnkeeper.FsspecBlobs` on the test S3 endpoint, under a
    prefix of its own in the bucket (one per test)."""
    import s3fs  # type: ignore[import-untyped]

    root = f"s3://turnkeeper-test/{uuid.uuid4().hex}"

    def make() -> turnkeeper.FsspecBlobs:
        return turnkeeper.FsspecBlobs(root, fs=s3fs.S3FileSystem(**s3_options(s3_endpoint)))

    return make
