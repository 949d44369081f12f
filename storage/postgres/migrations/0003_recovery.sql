-- PostgreSQL's additions to schema version 3 (run after storage/migrations/0003_recovery.sql).

CREATE INDEX recovery_events_by_run ON recovery_events (run_id);
