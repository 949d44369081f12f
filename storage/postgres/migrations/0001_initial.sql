-- PostgreSQL's additions to schema version 1 (run after storage/migrations/0001_initial.sql).

-- PostgreSQL's own guard of "one active record per key", beside the mapping
-- table the shared domain layer keeps: a partial unique index the engine checks.
CREATE UNIQUE INDEX thread_records_one_active_per_key ON thread_records (key)
    WHERE status = 'active';

-- Lookups the operations make, which DuckDB answers by scanning.
CREATE INDEX lease_events_by_target ON lease_events (target, epoch);
CREATE INDEX fence_events_by_target ON fence_events (target);
CREATE INDEX thread_records_by_key ON thread_records (key);
CREATE INDEX sessions_by_creation ON sessions (created_at DESC, id DESC);
