"""Schema versions: numbered SQL files written once, plus each dialect's additions.

``storage/migrations/`` holds version 1 … :data:`SCHEMA_VERSION` in the SQL
both engines speak (``0001_initial.sql`` …); a backend package may hold a
``migrations/`` folder of its own with additions to some of those versions,
under the same numbers (PostgreSQL's partial unique indexes, indexes and
reader role; DuckDB's single-column lookup indexes), run in the same
transaction right after the shared file.
``schema_migrations`` records each applied version. Opening a database whose
newest version is above :data:`SCHEMA_VERSION` fails with
``SchemaVersionError`` naming both versions; nothing is changed.
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

SCHEMA_VERSION = 35
"""The newest schema version this turnkeeper knows (a test holds the shared
migrations to 1 … it)."""


def _files(package: str) -> dict[int, tuple[str, str]]:
    folder = resources.files(package).joinpath("migrations")
    if not folder.is_dir():
        return {}
    found: dict[int, tuple[str, str]] = {}
    for item in folder.iterdir():
        m = _NAME.match(item.name)
        if m:
            found[int(m.group(1))] = (item.name, item.read_text(encoding="utf-8"))
    return found


def load(dialect_package: str | None = None) -> list[tuple[int, str]]:
    """Every migration as ``(version, sql)`` in version order: the shared file,
    then ``dialect_package``'s additions to that version (if any).

    Raises:
        RuntimeError: the shared versions are not exactly 1 … :data:`SCHEMA_VERSION`,
            or an addition names a version or a file the shared ones lack.
    """
    shared = _files("turnkeeper.storage")
    if sorted(shared) != list(range(1, SCHEMA_VERSION + 1)):
        raise RuntimeError(f"shared migration versions must be 1..{SCHEMA_VERSION}")
    extra = _files(dialect_package) if dialect_package else {}
    for version, (name, _) in extra.items():
        if version not in shared or shared[version][0] != name:
            raise RuntimeError(f"{dialect_package}: {name} adds to no shared migration")
    return [(v, shared[v][1] + ("\n" + extra[v][1] if v in extra else "")) for v in sorted(shared)]


_CREATED = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?(?:TABLE|INDEX)\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE
)


def created_names(migrations: list[tuple[int, str]]) -> set[str]:
    """The names of the tables and indexes ``migrations`` create, and
    ``schema_migrations``: the names another object of the schema must not
    hold for the store to be created there."""
    names = {"schema_migrations"}
    for _, sql in migrations:
        names.update(m.group(1).lower() for m in _CREATED.finditer(sql))
    return names


def statements(sql: str) -> list[str]:
    """Split a migration file into statements (no semicolons inside literals here,
    except inside ``$$ … $$`` bodies, which are kept whole)."""
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    out: list[str] = []
    for i, chunk in enumerate(body.split("$$")):
        if i % 2:  # inside a dollar-quoted body: glue it to the statement around it
            out[-1] += "$$" + chunk + "$$"
            continue
        parts = chunk.split(";")
        if out and i:
            out[-1] += parts[0]
            parts = parts[1:]
        out.extend(parts)
    return [s.strip() for s in out if s.strip()]
