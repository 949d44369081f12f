"""Schema versions: numbered SQL files, one set per dialect, the same numbers.

Each backend package holds a ``migrations/`` folder (``0001_initial.sql`` …)
written in its dialect; ``schema_migrations`` records each applied version.
Opening a database whose newest version is above :data:`SCHEMA_VERSION`
fails with ``SchemaVersionError`` naming both versions; nothing is changed.
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

SCHEMA_VERSION = 8
"""The newest schema version this turnkeeper knows; every dialect's
migrations run from 1 to it (a test holds them to it)."""


def load(package: str) -> list[tuple[int, str]]:
    """The migrations of ``package`` (its ``migrations/`` folder) as
    ``(version, sql)``, in version order.

    Raises:
        RuntimeError: the versions are not exactly 1 … :data:`SCHEMA_VERSION`.
    """
    found: list[tuple[int, str]] = []
    for item in resources.files(package).joinpath("migrations").iterdir():
        m = _NAME.match(item.name)
        if m:
            found.append((int(m.group(1)), item.read_text(encoding="utf-8")))
    found.sort()
    if [v for v, _ in found] != list(range(1, SCHEMA_VERSION + 1)):
        raise RuntimeError(f"{package}: migration versions must be 1..{SCHEMA_VERSION}")
    return found


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
