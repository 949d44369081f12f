"""Regenerate the deterministic files in reports/ from spec/ (run: make reports).

One markdown page with a mermaid diagram per lifecycle, the README's
lifecycle tables, and the assurance report (``reports/assurance.py``). ``model_tests``
compares these files with fresh output, so a stale diagram fails CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

from assurance import OUT as ASSURANCE
from assurance import report as assurance_report

from turnkeeper.machines import markdown
from turnkeeper.spec import LIFECYCLES

HERE = Path(__file__).resolve().parent


README = HERE.parent / "README.md"
BEGIN = "<!-- lifecycle tables: generated from spec/ by `make reports` -->"
END = "<!-- end lifecycle tables -->"


def readme_tables() -> str:
    """The README's lifecycle section: one edge table per lifecycle."""
    parts = [
        BEGIN,
        "The lifecycles, as data in `spec/` (diagrams in `reports/machine_*.md`):",
        "",
    ]
    for lc in LIFECYCLES:
        rows = [line for line in markdown(lc).splitlines() if line.startswith("|")]
        parts += [f"**{lc.name}**", "", *rows, ""]
    parts.append(END)
    return "\n".join(parts)


def readme() -> str:
    """README.md with its lifecycle section regenerated."""
    text = README.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + readme_tables() + text[end:]


def expected() -> dict[Path, str]:
    """Every deterministic generated file and its content (README included)."""
    files = {HERE / f"machine_{lc.name}.md": markdown(lc) for lc in LIFECYCLES}
    files[README] = readme()
    files[ASSURANCE] = assurance_report()
    return files


def main() -> int:
    for path, text in expected().items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
