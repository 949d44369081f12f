-- turnkeeper schema version 27 (issue 19, attack round 2 finding F4): a catalog
-- entry's cursor (SessionMeta.last_journal_seq, the highest ledger sequence folded
-- into it) is a column of its own, ``folded_seq``, beside the JSON ``meta``.
--
-- An append whose records are all of kinds the catalog does not fold (a note, a
-- fence, a caller's own kind) only moves the cursor: it now writes this column alone,
-- ``UPDATE … SET folded_seq = <its last seq>, revision = revision + 1 WHERE
-- folded_seq = <its first seq - 1>`` (storage/ops/ledger/catalog_group.py
-- move_cursors), instead of decoding, folding and re-encoding the whole entry (whose
-- size grows with the session's loops and hustle buckets). An entry's cursor is the
-- larger of this column and the JSON's ``last_journal_seq``; every write of the whole
-- entry sets both.
--
-- No backfill: an entry stored before this version reads its cursor from its JSON
-- (the column is 0); its first cursor-only move finds the column behind and falls
-- back to the whole-entry update, which sets the column.

ALTER TABLE ledger_catalog ADD COLUMN folded_seq BIGINT NOT NULL DEFAULT 0;
