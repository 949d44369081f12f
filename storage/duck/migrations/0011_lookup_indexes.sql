-- DuckDB's additions to schema version 11 (run after storage/migrations/0011_lookup_indexes.sql).
-- One single-column index per lookup that finds a few rows by a column that is no
-- key of its own (the statements keep that column their scan's only filter:
-- storage/backend.py keyed()). Reads of a session's many rows (its entries for a
-- replay, its run events, its runs) get none: DuckDB fetches a row through an index
-- at about 25 microseconds, more than scanning a million rows costs for a session
-- of a thousand entries.

CREATE INDEX entries_by_id ON entries (id);
CREATE INDEX runs_by_intent ON runs (intent_id);
CREATE INDEX submissions_by_key ON submissions (key_digest);
CREATE INDEX delivery_operations_by_intent ON delivery_operations (intent_id);
CREATE INDEX tool_executions_by_run ON tool_executions (run_id);
CREATE INDEX tool_executions_by_turn ON tool_executions (local_turn_id);
