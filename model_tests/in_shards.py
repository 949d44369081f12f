"""Run a command (the test suite) as N processes side by side, each on a share of it.

``python model_tests/in_shards.py N CMD …`` starts ``CMD`` N times at once, the
``i``-th with ``TURNKEEPER_TEST_SHARD=i/N`` (its name) and all with
``TURNKEEPER_TEST_CLAIMS`` naming one new folder: ``conftest.py`` then collects
the whole suite and runs the files it claims there, one at a time, each as it
becomes free (``shares.py``), so that the shares end together. Share 0
prints as it runs; each other share's output is kept in a temporary file and
printed, under a header line, when every share has ended. The exit status is the
first non-zero one of the shares in share order (0 when all passed). ``N`` = 1
runs ``CMD`` itself, as it is.

Why: the suite is mostly one busy Python process (its stores are in-process
DuckDB and a PostgreSQL server that waits on it), and ``make test`` runs on
machines with two cores or more. Each share runs ``CMD`` whole, so
``with_postgres.py`` in ``CMD`` gives each share a throwaway server of its own:
a share's tests never see another share's connections, schemas or roles.

Ctrl-C reaches every share (one process group); SIGTERM is passed on to each, and
their servers are stopped by their own ``with_postgres.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from typing import IO

SHARD_ENV = "TURNKEEPER_TEST_SHARD"
CLAIMS_ENV = "TURNKEEPER_TEST_CLAIMS"  # shares.CLAIMS_ENV (this script imports no pytest)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: in_shards.py N CMD …  (N >= 1)", file=sys.stderr)
        return 2
    count, command = int(argv[0]), argv[1:]
    if count == 1:
        return subprocess.call(command)
    with ExitStack() as stack:
        claims = stack.enter_context(tempfile.TemporaryDirectory(prefix="turnkeeper-claims-"))
        logs: list[IO[bytes] | None] = [None] + [
            stack.enter_context(tempfile.TemporaryFile(prefix=f"turnkeeper-share-{i}-"))
            for i in range(1, count)
        ]
        children = [
            subprocess.Popen(
                command,
                env={**os.environ, SHARD_ENV: f"{i}/{count}", CLAIMS_ENV: claims},
                stdout=logs[i],
                stderr=subprocess.STDOUT if logs[i] is not None else None,
            )
            for i in range(count)
        ]

        def pass_on(signum: int, _frame: object) -> None:
            for child in children:
                if child.poll() is None:
                    child.send_signal(signum)

        signal.signal(signal.SIGTERM, pass_on)
        statuses = []
        for child in children:
            while True:
                try:
                    statuses.append(child.wait())
                    break
                except KeyboardInterrupt:  # the shares got the Ctrl-C too: wait for them
                    continue
        sys.stdout.flush()
        for i in range(1, count):
            log = logs[i]
            assert log is not None
            log.seek(0)
            print(f"\n== share {i}/{count} of the suite (exit {statuses[i]}) ==", flush=True)
            sys.stdout.buffer.write(log.read())
            sys.stdout.flush()
    # A share ended by a signal (negative status) exits as a shell reports it: 128 + signal.
    failed = [s if s > 0 else 128 - s for s in statuses if s != 0]
    if failed:
        print(f"\nshares failed: {len(failed)} of {count}", flush=True)
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
