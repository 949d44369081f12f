-- DuckDB's additions to schema version 13 (run after storage/migrations/0013_entries_written_at.sql).
-- A file made by the first version 1 (before commit f4a91ce) has entries without
-- written_at: the column is added and each entry already stored gets its own
-- timestamp (the entry's ts, the store's clock for an append that gave none). The
-- column stays nullable there: DuckDB adds no NOT NULL to an indexed table, and
-- every write names it. Elsewhere this adds nothing and updates no row.

ALTER TABLE entries ADD COLUMN IF NOT EXISTS written_at TIMESTAMPTZ;
UPDATE entries SET written_at = ts WHERE written_at IS NULL;
