"""One process of the failover test (``test_postgres_failover.py``).

``python failover_process.py ROLE URL ACKS ERRORS [INDEX]`` runs
:mod:`fleet_process`'s ``worker`` or ``recovery`` role (the same fenced
turns, the same ``ACKS`` lines, ``ready`` once the store is open) on one
store for the life of the process, through a failover of the database under
it: an error of turnkeeper's hierarchy (:class:`turnkeeper.TurnkeeperError`)
that escapes the role's loop is written to the file ``ERRORS`` as
``<type name> <its message on one line>`` (flushed) and the role's loop
runs again on the same store, as a worker of a fleet would go on. Anything
else (an untyped error) ends the process with its traceback and a non-zero
status: the test fails on it.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import IO

import fleet_process

import turnkeeper

PAUSE_S = 0.1
"""Seconds between an error and the next try (not to spin while the database is away)."""


def keep_going(body: Callable[[], None], errors: IO[str]) -> None:
    """Run ``body`` until :data:`fleet_process.STOP` is set: each time a
    :class:`turnkeeper.TurnkeeperError` escapes it, one line in ``errors``
    (its type's name, its message with each run of white space one space)
    and ``body`` runs again after :data:`PAUSE_S`. Any other exception propagates."""
    while not fleet_process.STOP.is_set():
        try:
            body()
        except turnkeeper.TurnkeeperError as exc:
            errors.write(f"{type(exc).__name__} {' '.join(str(exc).split())}\n")
            errors.flush()
            fleet_process.STOP.wait(PAUSE_S)


def main(argv: list[str]) -> int:
    role, url, acks_path, errors_path = argv[:4]
    signal.signal(signal.SIGTERM, lambda *_: fleet_process.STOP.set())
    with (
        turnkeeper.open_store(url) as store,
        open(acks_path, "a") as acks,
        open(errors_path, "a") as errors,
    ):
        print("ready", flush=True)
        if role == "worker":
            index = int(argv[4])
            keep_going(lambda: fleet_process.worker(store, index, acks), errors)
        elif role == "recovery":
            keep_going(lambda: fleet_process.recovery(store), errors)
        else:
            raise SystemExit(f"unknown role {role!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
