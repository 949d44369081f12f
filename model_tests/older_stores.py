"""Stores as an older turnkeeper left them, for the upgrade tests.

:func:`store_at` makes a store at schema version ``N`` holding what a scenario
wrote through the store API, as the turnkeeper of that time wrote it:

- its schema is the shipped migrations 1 … ``N`` (each file is the one that
  version ran, except version 1's first form, :data:`FIRST_V1`);
- its rows are written by this turnkeeper in a scratch store and copied
  over, leaving out the tables and columns added after ``N`` (the migrations
  that added them fill them from the rows, as they did), and every digest
  whose definition changed is put back in the definition of the time the row
  was written (:func:`old_submission`).

That projection is what the older code wrote: the last commit of each schema
version (83e51a3, 6ad4d32, a307d3e, 45192c9, e6f1d94, 1c69547 before 651f01c
and 0f87151 after it, 9018005, 1ad0850, 71bfc51), run from git history on the
same calls (sessions, appends, titles, keyed admissions and retries, runs
ended with a delivery plan, tool claims and completions, forks), left every
table row for row equal to this turnkeeper's projected rows (ids and times
aside; the key, plan, argument and fork request digests equal too), except the
submission digests before 651f01c.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

import turnkeeper
from turnkeeper.storage.migrations import load

FIRST_V1 = "\n".join(
    line for line in dict(load())[1].splitlines() if not line.lstrip().startswith("written_at")
)
"""Version 1 as turnkeeper first shipped it: commit f4a91ce later added
``entries.written_at`` to the same file, so a DuckDB file made before it has
entries without that column."""


CLEAR_COLUMNS_SQL = "".join(
    f"ALTER TABLE entries ADD COLUMN {c} VARCHAR;\n" for c in ("role", "provider", "model")
)
"""The columns of ``entries`` schema 33 added (the clear facts), which every entry
insert of this turnkeeper names."""


KEY_VERSION_SQL = "ALTER TABLE sessions ADD COLUMN key_version BIGINT;\n"
"""The column of ``sessions`` schema 34 added (its data key version), which every
append's head read and compare-and-set of this turnkeeper names."""

NAMED_BY_NOW = {33: CLEAR_COLUMNS_SQL, 34: KEY_VERSION_SQL}
"""Per schema version, the columns it added (``IF NOT EXISTS``) that this
turnkeeper's writes name."""


def written_by_now(migrations: list[tuple[int, str]], version: int) -> list[tuple[int, str]]:
    """``migrations`` cut to the first ``version``, for a store this turnkeeper
    writes into while it is held there: its last version also adds the
    columns later versions add that every write names (:data:`NAMED_BY_NOW`;
    those versions add them ``IF NOT EXISTS``). A store that must hold what
    an older turnkeeper wrote is made by :func:`store_at` instead."""
    cut = list(migrations[:version])
    extra = "".join(sql for v, sql in sorted(NAMED_BY_NOW.items()) if v > version)
    if not extra:
        return cut
    return [*cut[:-1], (cut[-1][0], cut[-1][1] + "\n" + extra)]


def request_only(request: Mapping[str, Any]) -> str:
    """The submission digest turnkeeper wrote before commit 651f01c (schema
    versions 2 to 8): sha256 of the request alone, as canonical JSON
    (``storage/duck/store_runs.py`` of 6ad4d32 … 1c69547)."""
    return hashlib.sha256(orjson.dumps(dict(request), option=orjson.OPT_SORT_KEYS)).hexdigest()


def key_digest(session_id: str, key: str) -> str:
    """A submission key's digest (one definition since schema version 2)."""
    return hashlib.sha256(f"{session_id}\x00{key}".encode()).hexdigest()


def _database(backend: str) -> Any:
    if backend == "postgres":
        from turnkeeper.storage.postgres import db

        return db
    from turnkeeper.storage.duck import db as duck_db

    return duck_db


def _where(backend: str, tmp_path: Path, name: str) -> str:
    if backend == "postgres":
        from conftest import new_pg_schema

        return new_pg_schema()
    return str(tmp_path / f"{name}.duckdb")


def _held_at(
    backend: str, where: str, version: int, monkeypatch: pytest.MonkeyPatch, first_v1: bool
) -> None:
    """Make ``where`` a store at schema ``version``: this turnkeeper opening it with
    its migrations cut to the first ``version`` (version 1 in its first form
    with ``first_v1``)."""
    db = _database(backend)
    shipped = db.MIGRATIONS[:version]
    if first_v1:
        shipped = [(1, FIRST_V1), *shipped[1:]]
    with monkeypatch.context() as patch:
        patch.setattr(db.Database, "migrations", lambda self: shipped)
        turnkeeper.open_store(where).close()


def _connect(backend: str, where: str) -> Any:
    if backend == "postgres":
        import psycopg

        return psycopg.connect(where)
    import duckdb

    return duckdb.connect(where)


def _columns(con: Any) -> dict[str, list[str]]:
    rows = con.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
    ).fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def _cursor_in_json(src: Any, names: list[str], rows: list[Any]) -> list[Any]:
    """Catalog entries as a turnkeeper before schema 27 wrote them: the cursor
    in the JSON alone (since 27 an append of kinds the catalog does not fold
    moves only the ``folded_seq`` column, leaving the JSON's behind)."""
    folded = dict(
        ((t, s), n)
        for t, s, n in src.execute(
            "SELECT tenant, session_id, folded_seq FROM ledger_catalog"
        ).fetchall()
    )
    at = {name: i for i, name in enumerate(names)}
    out = []
    for row in rows:
        row = list(row)
        meta = orjson.loads(row[at["meta"]])
        cursor = folded[(row[at["tenant"]], row[at["session_id"]])]
        meta["last_journal_seq"] = max(meta["last_journal_seq"], cursor)
        row[at["meta"]] = orjson.dumps(meta, option=orjson.OPT_SORT_KEYS).decode()
        out.append(row)
    return out


def _copy(backend: str, source: str, target: str, old: Mapping[str, str]) -> None:
    """Copy every row of ``source`` into ``target``, each table's columns that
    ``target`` has; then put each submission named in ``old`` (key digest →
    digest) back in its older digest."""
    mark = "%s" if backend == "postgres" else "?"
    src, dst = _connect(backend, source), _connect(backend, target)
    out = dst.cursor() if backend == "postgres" else dst  # DuckDB: one connection, autocommit
    try:
        have, want = _columns(src), _columns(dst)
        for table, columns in want.items():
            if table == "schema_migrations":
                continue
            names = [c for c in columns if c in have[table]]
            rows = src.execute(f"SELECT {', '.join(names)} FROM {table}").fetchall()
            if table == "ledger_catalog" and "folded_seq" not in names:
                rows = _cursor_in_json(src, names, rows)
            if rows:
                out.executemany(
                    f"INSERT INTO {table} ({', '.join(names)}) "
                    f"VALUES ({', '.join([mark] * len(names))})",
                    [list(r) for r in rows],
                )
        for key, digest in old.items():
            found = out.execute(
                f"UPDATE submissions SET request_fingerprint = {mark} WHERE key_digest = {mark} "
                "RETURNING 1",
                [digest, key],
            ).fetchall()
            assert len(found) == 1, key
        if backend == "postgres":
            dst.commit()
    finally:
        src.close()
        dst.close()


def store_at(
    backend: str,
    version: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    write: Callable[[turnkeeper.BaseStore], Mapping[str, str]],
    *,
    first_v1: bool = False,
) -> str:
    """Where a store of ``backend`` stands at schema ``version``, holding what
    ``write`` wrote through this turnkeeper as the turnkeeper of that version
    left it (see the module docstring). ``write`` returns the submissions an
    older turnkeeper wrote, by key digest: their digest of that time."""
    scratch = _where(backend, tmp_path, "scratch")
    with turnkeeper.open_store(scratch) as store:
        old = write(store)
    where = _where(backend, tmp_path, f"v{version}")
    _held_at(backend, where, version, monkeypatch, first_v1)
    _copy(backend, scratch, where, old)
    return where
