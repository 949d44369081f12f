"""turnkeeper.spec: the vocabulary every layer shares (pure, no I/O).

Lifecycles as data, the record types and the error hierarchy.
"""

from . import errors
from .delivery import DELIVERY, DeliveryStatus
from .lease import GRANTING_EDGES, LEASE, LeasePurpose
from .ledger import LEDGER_WRITER
from .lifecycle import Edge, Facts, Lifecycle
from .recovery import RECOVERY, RecoveryState
from .run import RUN, ActiveRunPolicy, RunStatus
from .thread_record import THREAD_RECORD, RecordStatus
from .tool_execution import TOOL_EXECUTION, ToolExecutionState

LIFECYCLES: tuple[Lifecycle, ...] = (
    LEASE,
    THREAD_RECORD,
    RUN,
    RECOVERY,
    DELIVERY,
    TOOL_EXECUTION,
    LEDGER_WRITER,
)
"""Every lifecycle, in the order the diagrams and tables list them."""

__all__ = [
    "DELIVERY",
    "GRANTING_EDGES",
    "LEASE",
    "LEDGER_WRITER",
    "LIFECYCLES",
    "RECOVERY",
    "RUN",
    "THREAD_RECORD",
    "TOOL_EXECUTION",
    "ActiveRunPolicy",
    "DeliveryStatus",
    "Edge",
    "Facts",
    "LeasePurpose",
    "Lifecycle",
    "RecordStatus",
    "RecoveryState",
    "RunStatus",
    "ToolExecutionState",
    "errors",
]
