"""turnkeeper.machines: ``transitions`` machines built once from ``turnkeeper.spec``."""

from .build import LifecycleMachine, machine_for
from .diagram import markdown, mermaid

__all__ = ["LifecycleMachine", "machine_for", "markdown", "mermaid"]
