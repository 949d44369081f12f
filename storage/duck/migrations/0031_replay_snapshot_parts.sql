-- DuckDB's additions to schema version 31 (run after storage/migrations/0031_replay_snapshot_parts.sql).
-- A part's body, stored as it is given: it is a Zstandard frame already, and DuckDB's own
-- ZSTD (which it chose for these long values) saved nothing but made a part's read
-- decompress the segment it shares with other parts, theirs too. The column stays
-- nullable: DuckDB adds no NOT NULL to an indexed table; every write gives it, and a part
-- without one fails its digest (storage/ops/replay_snapshots.py).

ALTER TABLE replay_snapshots ADD COLUMN body BLOB USING COMPRESSION uncompressed;
