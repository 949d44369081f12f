"""Every survivor of the second mutation net, classified.

A survivor is a mutant whose area's tests all passed. Each gets an entry here,
keyed by :class:`Site`: its file (inside the installed ``turnkeeper/``), the
cosmic-ray operator and the text of the mutated source line, stripped (found
in the file at least once, else the entry is stale: ``test_mutation_net.py``
checks it). Its :class:`Verdict` is either

- ``equivalent``: no test can tell the mutant from the shipped code; ``why``
  says why; or
- ``killed``: a real hole, closed since by the fixed tests ``tests`` (node ids
  relative to ``model_tests/``; they fail with the mutant applied and pass on
  the real code). When it is a fence or guard, the fence-mutant catalog
  (``mutants/catalog.py``) carries it too, under ``catalog``.

The report (``reports/MUTATION_NET.md``) reads this list; a survivor without
an entry makes ``make mutation-net`` fail.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Site:
    """Where a mutant is: file inside ``turnkeeper/``, operator, stripped source line."""

    file: str
    operator: str
    line: str


@dataclass(frozen=True)
class Verdict:
    """What a survivor is: ``equivalent`` (with ``why``) or ``killed`` (by ``tests``)."""

    kind: str  # "equivalent" or "killed"
    why: str
    tests: tuple[str, ...] = ()
    catalog: str = ""  # the fence-mutant catalog's id, for a fence or guard


KINDS = ("equivalent", "killed")

SURVIVORS: dict[Site, Verdict] = {}
"""Every survivor the runs found, with its classification."""
