"""Test-only copies of the installed package with one mutant applied.

Nothing here touches the installed package: :func:`mutated_copy` copies it
(``turnkeeper/`` from site-packages, its ``__pycache__`` folders left out)
into a folder of the caller's and rewrites one file of the copy. A process
run with ``PYTHONPATH`` at that folder imports the copy instead of the
installed package (``PYTHONPATH`` comes before site-packages on
``sys.path``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mutants.catalog import Mutant


class StaleMutantError(AssertionError):
    """A mutant's source text is not in its file exactly once (the catalog is
    stale: the shipped code changed under it)."""


def installed_package() -> Path:
    """The folder of the installed ``turnkeeper`` package (the one the tests import).

    Raises:
        RuntimeError: ``turnkeeper`` imports from somewhere that is not an
            installed package's folder (a ``PYTHONPATH`` copy, say).
    """
    import turnkeeper

    folder = Path(turnkeeper.__file__).resolve().parent
    if "site-packages" not in folder.parts:
        raise RuntimeError(f"turnkeeper imports from {folder}, not an installed package")
    return folder


def occurrences(mutant: Mutant, package: Path) -> int:
    """How often ``mutant.old`` occurs in its file of ``package`` (0 when the file is missing)."""
    path = package / mutant.file
    return path.read_text().count(mutant.old) if path.is_file() else 0


def mutated_text(mutant: Mutant, package: Path) -> str:
    """The text of ``mutant.file`` of ``package`` with ``mutant.old`` replaced by ``mutant.new``.

    Raises:
        StaleMutantError: ``mutant.old`` does not occur exactly once.
    """
    found = occurrences(mutant, package)
    if found != 1:
        raise StaleMutantError(
            f"mutant {mutant.id}: its source text occurs {found} times in {mutant.file} "
            f"(exactly once required):\n{mutant.old}"
        )
    return (package / mutant.file).read_text().replace(mutant.old, mutant.new, 1)


def copy_package(package: Path, into: Path) -> Path:
    """Copy ``package`` to ``into/turnkeeper`` (no ``__pycache__``); return the copy's folder."""
    target = into / "turnkeeper"
    shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def mutated_copy(mutant: Mutant | None, package: Path, into: Path) -> Path:
    """A copy of ``package`` in ``into`` (``into`` then goes on ``PYTHONPATH``) with
    ``mutant`` applied to it, or unmutated when ``mutant`` is ``None``.

    Raises:
        StaleMutantError: as :func:`mutated_text` raises it (nothing is copied).
    """
    text = None if mutant is None else mutated_text(mutant, package)
    copy = copy_package(package, into)
    if mutant is not None and text is not None:
        (copy / mutant.file).write_text(text)
    return copy
