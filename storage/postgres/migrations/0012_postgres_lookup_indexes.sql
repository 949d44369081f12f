-- PostgreSQL's additions to schema version 12 (run after storage/migrations/0012_postgres_lookup_indexes.sql).
-- An index led by each column a hot statement looks its rows up by through
-- storage/backend.py keyed(), where no key of the table starts with it.

CREATE INDEX entries_by_id ON entries (id);
CREATE INDEX submissions_by_key ON submissions (key_digest);
CREATE INDEX tool_executions_by_run ON tool_executions (run_id);
CREATE INDEX tool_executions_by_turn ON tool_executions (local_turn_id);
