-- PostgreSQL: the record digest of every record stored before version 25 (see the shared
-- file), over each text's UTF-8 bytes (convert_to), as lowercase hex (encode … 'hex').
UPDATE ledger_records SET record_sha256 = encode(sha256(convert_to(
    'turnkeeper-ledger-record/1' || chr(10)
    || encode(sha256(convert_to(tenant, 'UTF8')), 'hex') || chr(10)
    || encode(sha256(convert_to(session_id, 'UTF8')), 'hex') || chr(10)
    || seq::text || chr(10)
    || encode(sha256(convert_to(kind, 'UTF8')), 'hex') || chr(10)
    || encode(sha256(convert_to(idempotency_id, 'UTF8')), 'hex') || chr(10)
    || epoch::text || chr(10) || payload_sha256, 'UTF8')), 'hex');
