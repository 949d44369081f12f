"""A LangGraph graph that survives a kill and resumes from its last checkpoint.

    python examples/langgraph_resume.py pipeline.duckdb

Four deterministic steps, no LLM. Every step's checkpoint goes into a
turnkeeper DuckDB file (turnkeeper.langgraph.TurnkeeperSaver) before the
next step starts (``durability="sync"``; LangGraph's default writes them in
the background, so a kill can lose the last ones). Kill the
process mid-run (kill -9) and run it again: it resumes at the step that had
not finished, and the steps before it do not run again.

With ``--hang-in STEP MARKER`` the run stops inside STEP (after writing the
file MARKER) and waits there to be killed; the test does that.
"""

import operator
import sys
import time
from pathlib import Path
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

import turnkeeper
from turnkeeper.langgraph import TurnkeeperSaver

STEPS = ["fetch", "parse", "summarize", "publish"]
THREAD = {"configurable": {"thread_id": "pipeline-1"}}


class State(TypedDict):
    done: Annotated[list[str], operator.add]


def make_step(name: str, hang_in: str | None, marker: str | None):
    def step(state: State) -> dict[str, list[str]]:
        print(f"running {name}", flush=True)
        if name == hang_in and marker:
            Path(marker).write_text(name)
            time.sleep(3600)  # killed here
        return {"done": [name]}

    return step


def main(db: str, hang_in: str | None = None, marker: str | None = None) -> None:
    builder = StateGraph(State)
    previous = START
    for name in STEPS:
        builder.add_node(name, make_step(name, hang_in, marker))
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)
    with turnkeeper.open_store(db) as store:
        graph = builder.compile(checkpointer=TurnkeeperSaver(store))
        state = graph.get_state(THREAD)
        if state.next:
            print(f"resuming at {state.next[0]}", flush=True)
            result = graph.invoke(None, THREAD, durability="sync")  # from the last checkpoint
        elif state.values:
            result = state.values
        else:
            result = graph.invoke({"done": []}, THREAD, durability="sync")
        print("done: " + ", ".join(result["done"]), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 4 and args[1] == "--hang-in":
        main(args[0], args[2], args[3])
    elif len(args) == 1:
        main(args[0])
    else:
        sys.exit(__doc__)
