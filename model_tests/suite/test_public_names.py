"""The public names of every package of turnkeeper, pinned (issue 17, item 9).

``turnkeeper.os``, ``.re``, ``.datetime`` and ``.Callable`` (and ``.annotations``,
the ``__future__`` flag, and ``.REPLAY_CACHE_BYTES`` outside ``__all__``) were
reachable as if they were turnkeeper's own: the package imported them for its
own use. Each public surface now has an ``__all__``, pinned here, and every
package's namespace holds only its ``__all__``, its submodules and private
(``_``) names, so nothing it merely imported is part of its API.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

import turnkeeper
from turnkeeper.spec import errors

TOP = {
    "ANY_LEAF",
    "DB_ENV",
    "DEFAULT_PATH",
    "REPLAY_CACHE_BYTES",
    "SCHEMA_VERSION",
    "BaseStore",
    "Binding",
    "CapabilityEvent",
    "ChannelToolConfig",
    "DeletedSession",
    "DeliveryIntent",
    "DeliveryOperation",
    "DeliveryPlan",
    "DeliveryStatus",
    "DeliveryStep",
    "DetailPage",
    "DuckDBStore",
    "Entry",
    "EntryKind",
    "ExecutionFacts",
    "FinalizeRequest",
    "Fork",
    "Guidance",
    "InputResourceEvent",
    "Lease",
    "LeasePurpose",
    "LeaseSnapshot",
    "NewEntry",
    "Project",
    "RecordStatus",
    "Recovery",
    "Replay",
    "ResponseItem",
    "ResponseReplayTurn",
    "ResponseRun",
    "ResponseState",
    "ResponseTurn",
    "RetentionReport",
    "KeyRotationReport",
    "Run",
    "RunEvent",
    "ConversationTurn",
    "ExecutionIntent",
    "RuntimeSubmission",
    "RunStatus",
    "SequencedCapabilityEvent",
    "ActiveRunPolicy",
    "RuntimeLeaseGroup",
    "RuntimeLeaseGuard",
    "RetainedLease",
    "Session",
    "SessionCapabilities",
    "SessionMetadata",
    "SequencedMessage",
    "SessionDetail",
    "SessionPage",
    "Store",
    "Subscription",
    "ThreadRecord",
    "ToolExecution",
    "ToolExecutionState",
    "Topic",
    "UsageRecord",
    "LEDGER_WRITER",
    "AppendResult",
    "CommandApplication",
    "LedgerEntry",
    "LedgerRecord",
    "LedgerWriter",
    "GCResult",
    "CheckpointSummary",
    "BlobStore",
    "DatabaseBlobs",
    "FsspecBlobs",
    "KeyProvider",
    "LocalKeyProvider",
    "RuntimeCommandLog",
    "Catalog",
    "ContextMeasurement",
    "EventSummary",
    "HustleUsageAggregate",
    "LoopUsageMeta",
    "SessionMeta",
    "acquire_many",
    "is_postgres",
    "open_store",
}
"""``turnkeeper``'s names besides its errors (it exports every one of those)."""

PINNED: dict[str, set[str]] = {
    "turnkeeper.fuzz": {"FakeClock", "Oracle", "OracleLease", "Outcome", "StoreOpener"},
    "turnkeeper.storage.crypto": {"DataKey", "KeyProvider", "LocalKeyProvider"},
    "turnkeeper.storage.audit": {"Check", "Scope", "run_audit"},
    "turnkeeper.formats": {"FORMATS", "FileImport", "LineIssue", "detect", "import_file"},
    "turnkeeper.adk": {
        "SessionExistsError",
        "SessionNotFoundError",
        "StaleSessionError",
        "TurnkeeperSessionService",
    },
    "turnkeeper.aio": {
        "WORKERS",
        "AsyncCatalog",
        "AsyncCommandLog",
        "AsyncLedger",
        "AsyncLedgerWriter",
        "AsyncStore",
        "AsyncSubscription",
        "NativeRunner",
        "Opening",
        "Runner",
        "open_store",
    },
    "turnkeeper.openai_agents": {
        "CHANNEL_TYPE",
        "ITEM_TYPE",
        "REPLACED_TYPE",
        "UNPARSED_TYPE",
        "SQLiteImportReport",
        "TurnkeeperSession",
        "import_sqlite",
    },
    "turnkeeper.spec": {
        "DELIVERY",
        "GRANTING_EDGES",
        "LEASE",
        "LEDGER_WRITER",
        "LIFECYCLES",
        "RECOVERY",
        "RUN",
        "THREAD_RECORD",
        "TOOL_EXECUTION",
        "DeliveryStatus",
        "Edge",
        "Facts",
        "LeasePurpose",
        "Lifecycle",
        "RecordStatus",
        "RecoveryState",
        "RunStatus",
        "ActiveRunPolicy",
        "ToolExecutionState",
        "errors",
    },
    "turnkeeper.machines": {"LifecycleMachine", "machine_for", "markdown", "mermaid"},
    "turnkeeper.storage": {"SCHEMA_VERSION", "BaseStore", "DuckDBStore", "Store"},
    "turnkeeper.storage.duck": {"DuckDBStore"},
    "turnkeeper.storage.postgres": {"PostgresStore"},
    "turnkeeper.langgraph": {
        "LEASE_KEY",
        "AsyncTurnkeeperSaver",
        "SqliteImport",
        "TurnkeeperSaver",
        "import_sqlite",
        "looks_like_sqlite",
    },
}
"""The other public surfaces, name by name."""


def error_classes() -> set[str]:
    """Every error class ``turnkeeper.spec.errors`` defines."""
    return {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, errors.TurnkeeperError)
        and value.__module__ == errors.__name__
    }


def packages() -> list[str]:
    """Every package of turnkeeper (each imported), the top one first."""
    importlib.import_module("turnkeeper.storage.postgres")
    found = ["turnkeeper"]
    for info in pkgutil.walk_packages(turnkeeper.__path__, "turnkeeper."):
        if info.ispkg:
            importlib.import_module(info.name)
            found.append(info.name)
    return found


def leaked(module: types.ModuleType) -> list[str]:
    """Public-looking names of ``module`` outside its ``__all__`` that are not its
    own submodules: what it only imported, or defined without exporting."""
    exported = set(getattr(module, "__all__", ()))
    out = []
    for name in dir(module):
        if name.startswith("_") or name in exported:
            continue
        value = getattr(module, name)
        own_submodule = isinstance(value, types.ModuleType) and value.__name__ == (
            f"{module.__name__}.{name}"
        )
        if not own_submodule:
            out.append(name)
    return sorted(out)


def test_turnkeeper_exports_exactly_its_names_and_every_error() -> None:
    assert set(turnkeeper.__all__) == TOP | error_classes()
    assert len(turnkeeper.__all__) == len(set(turnkeeper.__all__))


def test_the_error_module_exports_exactly_its_error_classes() -> None:
    assert set(errors.__all__) == error_classes()
    assert len(errors.__all__) == len(set(errors.__all__))


@pytest.mark.parametrize("name", sorted(PINNED))
def test_each_public_surface_exports_exactly_its_pinned_names(name: str) -> None:
    module = importlib.import_module(name)
    assert set(module.__all__) == PINNED[name]
    assert len(module.__all__) == len(set(module.__all__))


@pytest.mark.parametrize("name", [*packages(), "turnkeeper.spec.errors"])
def test_nothing_imported_leaks_into_a_public_namespace(name: str) -> None:
    module = importlib.import_module(name)
    assert leaked(module) == []
    for exported in getattr(module, "__all__", ()):
        assert hasattr(module, exported), exported


def test_the_surfaces_named_are_every_package_with_names_of_its_own() -> None:
    """A new package with public names of its own gets pinned here too."""
    pinned = {"turnkeeper", "turnkeeper.spec.errors", *PINNED}
    for name in packages():
        module = importlib.import_module(name)
        if hasattr(module, "__all__") and module.__all__:
            assert name in pinned, f"{name} has an __all__ no test pins"
