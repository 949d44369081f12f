-- turnkeeper schema version 35 (issue 23, encryption at rest of the ledger: the lead
-- renumbers it at merge; the task named it 0037). A sealed session's ledger payloads
-- (ledger_records.payload, ledger_blobs.data, blob files) are sealed under the session's
-- data key (storage/ops/ledger/sealing.py), so a blob pointer's key can no longer be read
-- from its payload by SQL. ``blob_key`` holds it in clear: a pointer record's blob key
-- (``blobs/t=<tenant>/s=<session id>/<sha256 hex>``, or a key written before schema 24),
-- NULL for every other record. The append's redelivery check (storage/ops/ledger/
-- condemn.py same_record) and the report's orphan figures read it. Records stored before
-- this version are all clear (no ledger payload was sealed before it): each dialect's
-- addition (same file name) backfills the column from the pointer's JSON; a pointer
-- whose payload is not JSON naming a key keeps NULL (its redelivery is judged by digest
-- only, and the report counts its blob as an orphan; replay and GC read the payload).

ALTER TABLE ledger_records ADD COLUMN blob_key VARCHAR;
