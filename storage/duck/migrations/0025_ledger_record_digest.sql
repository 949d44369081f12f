-- DuckDB: the record digest of every record stored before version 25 (see the shared file;
-- DuckDB's sha256 of a VARCHAR hashes its UTF-8 bytes and returns lowercase hex).
UPDATE ledger_records SET record_sha256 = sha256(
    'turnkeeper-ledger-record/1' || chr(10) || sha256(tenant) || chr(10)
    || sha256(session_id) || chr(10) || CAST(seq AS VARCHAR) || chr(10)
    || sha256(kind) || chr(10) || sha256(idempotency_id) || chr(10)
    || CAST(epoch AS VARCHAR) || chr(10) || payload_sha256
);
