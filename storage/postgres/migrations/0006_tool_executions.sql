-- PostgreSQL's additions to schema version 6 (run after storage/migrations/0006_tool_executions.sql).

CREATE INDEX tool_executions_by_session ON tool_executions (session_id, local_turn_id);
