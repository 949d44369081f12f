"""Schema versions: numbered SQL files in ``migrations/``, applied in order.

``schema_migrations`` records each applied version. Opening a database whose
newest version is above :data:`SCHEMA_VERSION` fails with
``SchemaVersionError`` naming both versions; nothing is changed.
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def migrations() -> list[tuple[int, str]]:
    """Every migration as ``(version, sql)``, in version order."""
    found: list[tuple[int, str]] = []
    for item in resources.files("turnkeeper.storage").joinpath("migrations").iterdir():
        m = _NAME.match(item.name)
        if m:
            found.append((int(m.group(1)), item.read_text(encoding="utf-8")))
    found.sort()
    if [v for v, _ in found] != list(range(1, len(found) + 1)):
        raise RuntimeError("migration versions must be 1..N without gaps")
    return found


SCHEMA_VERSION = len(migrations())
"""The newest schema version this turnkeeper knows."""


def statements(sql: str) -> list[str]:
    """Split a migration file into statements (no semicolons inside literals here)."""
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]
