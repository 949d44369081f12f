-- DuckDB: each blob pointer's key from its JSON payload (see the shared file); try()
-- gives NULL for a payload that is not UTF-8 or not JSON.
UPDATE ledger_records SET blob_key = try(json_extract_string(decode(payload), '$.key'))
WHERE kind = 'blobptr';
