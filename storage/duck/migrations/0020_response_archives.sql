-- DuckDB's additions to schema version 19 (run after storage/migrations/0019_response_archives.sql).
-- A session's archive rows are found through an index of session_id alone (DuckDB scans
-- an index only for one filter on one indexed column: storage/backend.py keyed), not
-- through the tables' composite keys; PostgreSQL's primary keys lead with session_id.

CREATE INDEX response_runs_by_session ON response_runs (session_id);
CREATE INDEX response_turns_by_session ON response_turns (session_id);
CREATE INDEX response_items_by_session ON response_items (session_id);
