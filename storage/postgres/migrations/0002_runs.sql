-- PostgreSQL's additions to schema version 2 (run after storage/migrations/0002_runs.sql).

-- PostgreSQL's own guard of "at most one non-terminal run per session", beside
-- active_runs: a partial unique index over the non-terminal statuses.
CREATE UNIQUE INDEX runs_one_non_terminal_per_session ON runs (session_id)
    WHERE status IN ('admitted', 'running', 'waiting');

CREATE INDEX runs_by_session ON runs (session_id, started_at);
CREATE INDEX conversation_turns_by_session ON conversation_turns (session_id, end_seq);
