"""Regenerate the deterministic files in reports/ from spec/ (run: make reports).

One markdown page with a mermaid diagram per lifecycle. ``model_tests``
compares these files with fresh output, so a stale diagram fails CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

from turnkeeper.machines import markdown
from turnkeeper.spec import LIFECYCLES

HERE = Path(__file__).resolve().parent


def expected() -> dict[Path, str]:
    """Every deterministic report file and its content."""
    return {HERE / f"machine_{lc.name}.md": markdown(lc) for lc in LIFECYCLES}


def main() -> int:
    for path, text in expected().items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
