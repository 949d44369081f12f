-- PostgreSQL's additions to schema version 31 (run after storage/migrations/0031_replay_snapshot_parts.sql).
-- A part's body (DuckDB's addition stores its own uncompressed; see there).

ALTER TABLE replay_snapshots ADD COLUMN body BYTEA NOT NULL;
