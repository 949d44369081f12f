"""Every stored column encryption at rest seals, in one list.

What walks all sealed values of a session (rotating its data key,
``turnkeeper encrypt`` sealing a clear session, a test that checks nothing
is left clear) reads :data:`SEALED` instead of naming tables itself; a part
that seals a new column adds it here, with the field name its writes and
reads pass to ``DataKey.seal``/``open`` (bound into the associated data).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SealedColumn:
    """One sealed column: ``table.column`` holds a value of session
    ``table.session`` (a column naming a ``sessions.id``), sealed for record
    id ``table.record`` (a column, or an SQL expression over the row's
    columns both engines evaluate; its value as text: a number's decimal
    digits; unique within the session) and field name ``field``; ``binary``: the column holds
    the sealed bytes (``BLOB``/``BYTEA``), else their text form (``enc1:``)."""

    table: str
    column: str
    session: str
    record: str
    field: str
    binary: bool = False


SEALED: tuple[SealedColumn, ...] = (
    SealedColumn("entries", "payload", "session_id", "id", "payload"),
    SealedColumn("tool_executions", "result", "session_id", "execution_key", "result"),
    SealedColumn(
        "tool_executions", "provider_metadata", "session_id", "execution_key", "provider_metadata"
    ),
    SealedColumn("execution_intents", "request", "session_id", "id", "request"),
    SealedColumn("run_events", "data", "session_id", "id", "data"),
    SealedColumn("esm_guidance", "guidance", "session_id", "id", "guidance"),
    SealedColumn("input_resource_events", "data", "session_id", "id", "data"),
    SealedColumn("response_turns", "request_summary", "session_id", "id", "request_summary"),
    SealedColumn("response_turns", "response_summary", "session_id", "id", "response_summary"),
    SealedColumn("response_items", "sanitized", "session_id", "id", "sanitized"),
    # ops/imports.opaque_record_id: <source>:<line>
    SealedColumn(
        "opaque_records", "raw", "session_id", "source || ':' || CAST(line AS VARCHAR)", "raw"
    ),
    # ops/replay_snapshots.MESSAGES: the clear bytes start with the part's header
    SealedColumn("replay_snapshots", "body", "session_id", "part_key", "messages", binary=True),
    SealedColumn("capability_events", "data", "session_id", "id", "data"),
    SealedColumn("delivery_intents", "transport_context", "session_id", "id", "transport_context"),
    # the ledger (storage/ops/ledger/sealing.py): record id the sequence in decimal
    # (unique per session only within one tenant: see sealing.py's known gaps);
    # a blob's its key. Blob files outside the database are not walked (sealing.py).
    SealedColumn("ledger_records", "payload", "session_id", "seq", "payload", binary=True),
    SealedColumn("ledger_blobs", "data", "session_id", "key", "data", binary=True),
)
"""The sealed columns (the README's "What is sealed" lists the same)."""
