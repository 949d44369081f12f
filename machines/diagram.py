"""Mermaid state diagrams drawn from the lifecycles in ``turnkeeper.spec``."""

from __future__ import annotations

from turnkeeper.spec.lifecycle import Lifecycle


def mermaid(lifecycle: Lifecycle) -> str:
    """A mermaid ``stateDiagram-v2`` for ``lifecycle``: one arrow per edge.

    Labels read ``edge: trigger [guards] [not unless]``. The text is
    deterministic so ``reports/`` can be stale-checked.
    """
    lines = ["stateDiagram-v2", f"    [*] --> {lifecycle.initial}"]
    for e in lifecycle.edges:
        label = f"{e.name}: {e.trigger}"
        conds = [*e.guards, *(f"not {u}" for u in e.unless)]
        if conds:
            label += " [" + " and ".join(conds) + "]"
        lines.append(f"    {e.source} --> {e.dest}: {label}")
    return "\n".join(lines) + "\n"


def markdown(lifecycle: Lifecycle) -> str:
    """A markdown page for ``lifecycle``: the diagram, guards and invariants."""
    out = [
        f"# {lifecycle.name} lifecycle",
        "",
        "Generated from `spec/` by `make reports`; do not edit.",
        "",
        "```mermaid",
        mermaid(lifecycle).rstrip("\n"),
        "```",
        "",
        "| edge | trigger | source | dest | guards | unless |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for e in lifecycle.edges:
        out.append(
            f"| {e.name} | {e.trigger} | {e.source} | {e.dest} | "
            f"{', '.join(e.guards) or '-'} | {', '.join(e.unless) or '-'} |"
        )
    out += ["", "Guards:", ""]
    out += [f"- `{name}`: {desc}" for name, (_, desc) in lifecycle.guards.items()]
    out += ["", "Invariants:", ""]
    out += [f"- {inv}" for inv in lifecycle.invariants]
    return "\n".join(out) + "\n"
