"""One writer process of ``test_bindings_processes.py``: moves one channel to its own
sessions, racing the other processes.

``python binding_process.py URL INDEX GO ROUNDS``: opens the store at ``URL``,
prints ``ready``, waits until the file ``GO`` exists (so that every process
starts together), then ``ROUNDS`` times finds the channel's session and, when it
is another process's, moves the channel to its own session ``p<INDEX>``
(``store.bindings.transfer``; every third round through a new session,
``store.bindings.rotate`` then ``transfer``). A lost race is
``BindingNotFoundError`` and writes nothing. Exits 0, or prints the unexpected
error and exits 1.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

import turnkeeper


def main(url: str, index: int, go: Path, rounds: int) -> int:
    mine = f"p{index}"
    with turnkeeper.open_store(url) as store:
        print("ready", flush=True)
        while not go.exists():  # a start gate, not a timing: the parent creates it
            time.sleep(0.01)
        try:
            for n in range(rounds):
                holder = store.bindings.find("chat", "room")
                if holder is None:
                    raise AssertionError("the channel lost its session")
                if holder.session_id == mine:
                    continue
                try:
                    if n % 3 == 2:
                        made = store.bindings.rotate(
                            "chat", "room", holder.session_id, session_id=f"{mine}-{n}"
                        )
                        store.bindings.transfer("chat", "room", made.id, mine)
                    else:
                        store.bindings.transfer("chat", "room", holder.session_id, mine)
                except turnkeeper.BindingNotFoundError:
                    pass  # another process moved it first
        except Exception:
            traceback.print_exc()
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])))
