-- turnkeeper schema version 25 (attack on issue 19, F7: replay verified a record's payload,
-- sequence and epoch, but not its kind or idempotency id, nor which ledger it belongs to).
-- ``record_sha256`` is each ledger record's digest over everything replay yields or acts on:
-- its tenant, session id, seq, kind, idempotency id, epoch and payload (its payload_sha256),
-- defined in storage/ops/ledger/journal.py ``record_digest``: the sha256 hex of the UTF-8
-- text of eight lines joined by a newline: 'turnkeeper-ledger-record/1', sha256 hex of
-- tenant, of session_id, seq in decimal, sha256 hex of kind, of idempotency_id, epoch in
-- decimal, payload_sha256 as stored. Every reader checks it (replay, verify, the workspace
-- lookups, catalog repair, the command log, GC's reference scan).
-- The records already stored get their digest here, computed in each dialect's SQL
-- (storage/duck/migrations and storage/postgres/migrations, same file name), over the
-- payload_sha256 as stored: a payload damaged before the upgrade still fails its own
-- sha256. Every row then carries a digest of one version (no per-row version to downgrade).
-- The default '' is no digest (every reader refuses it): the column is added NOT NULL with
-- a default, then filled, because DuckDB cannot set NOT NULL after an UPDATE in one
-- transaction on a table with indexes.

ALTER TABLE ledger_records ADD COLUMN record_sha256 VARCHAR NOT NULL DEFAULT '';
