"""The suite's shares take its files one at a time, as each becomes free (``in_shards.py``).

``in_shards.py`` starts N pytest processes on the same suite, each with
:data:`CLAIMS_ENV` naming one folder. Each collects the whole suite and runs
:func:`run_claimed` as its test loop: it walks the files in one order (the
files with a test marked ``slow`` first, then the files with the most tests,
ties by name), and runs a file only after claiming it (creating its claim file
in the folder, which only one process can do, ``O_CREAT | O_EXCL``). A share
that ends a file claims the next free one, so the shares end together, whatever
the files cost: a split fixed before the run (by the files' number of tests)
left one share 8 minutes longer than the other once a test was added.

Every test runs in exactly one share and a file's tests in one process (its
module fixtures are set up once). A share claims its next file as the last test
of its current one starts (pytest decides which fixtures to tear down after a
test from the test that follows it): so a share can hold one file while its
last test runs. The tests a share left to others are
reported as deselected when it ends, and its progress counts only the tests it
ran or may still claim, so a share's line reads ``N passed, M deselected`` and
ends at 100 %.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

CLAIMS_ENV = "TURNKEEPER_TEST_CLAIMS"
"""The folder where the shares of one run claim files (``in_shards.py`` makes it)."""


def claim(folder: Path, name: str) -> bool:
    """Claim ``name`` (a test file's path) in ``folder``: True for the one
    process whose claim was first, False for every later one."""
    mark = folder / hashlib.sha256(name.encode()).hexdigest()[:32]
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def file_order(items: list[pytest.Item]) -> list[list[pytest.Item]]:
    """``items`` grouped by file, each file's in collection order: the files with
    a test marked ``slow`` first, then those with the most tests, ties by name
    (the dearest first, so that the last files, run while the other shares end
    theirs, are short)."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def cost(name: str) -> tuple[bool, int, str]:
        tests = files[name]
        slow = any(i.get_closest_marker("slow") is not None for i in tests)
        return (not slow, -len(tests), name)

    return [files[name] for name in sorted(files, key=cost)]


def run_claimed(session: pytest.Session, folder: Path) -> bool:
    """``pytest_runtestloop`` over the files this process claims in ``folder``
    (see the module's docstring); as pytest's own loop: stops on ``-x`` and
    ``--maxfail``, and after a collection error unless told to go on."""
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(
            f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''} "
            "during collection"
        )
    if session.config.option.collectonly:
        return True
    files = file_order(list(session.items))
    left: list[pytest.Item] = []

    def next_claimed(start: int) -> int | None:
        for index in range(start, len(files)):
            if claim(folder, files[index][0].nodeid.split("::", 1)[0]):
                return index
            left.extend(files[index])
            session.testscollected -= len(files[index])  # the progress counts what is ours
        return None

    current = next_claimed(0)
    while current is not None:
        tests = files[current]
        following: int | None = None
        for position, item in enumerate(tests):
            if position + 1 < len(tests):
                nextitem: pytest.Item | None = tests[position + 1]
            else:  # the next file is claimed before this one's last test ends, so
                # that the fixtures both use stay up (pytest tears down what
                # ``nextitem`` does not need)
                following = next_claimed(current + 1)
                nextitem = None if following is None else files[following][0]
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        current = following
    if left:
        session.config.hook.pytest_deselected(items=left)
    return True
