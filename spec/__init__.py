"""turnkeeper.spec: the vocabulary every layer shares (pure, no I/O).

Lifecycles as data, the record types and the error hierarchy.
"""

from . import errors
from .lease import GRANTING_EDGES, LEASE, LeasePurpose
from .lifecycle import Edge, Facts, Lifecycle
from .recovery import RECOVERY, RecoveryState
from .run import RUN, RunStatus
from .thread_record import THREAD_RECORD, RecordStatus

LIFECYCLES: tuple[Lifecycle, ...] = (LEASE, THREAD_RECORD, RUN, RECOVERY)
"""Every lifecycle, in the order the diagrams and tables list them."""

__all__ = [
    "GRANTING_EDGES",
    "LEASE",
    "LIFECYCLES",
    "RECOVERY",
    "RUN",
    "THREAD_RECORD",
    "Edge",
    "Facts",
    "LeasePurpose",
    "Lifecycle",
    "RecordStatus",
    "RecoveryState",
    "RunStatus",
    "errors",
]
