-- DuckDB's additions to schema version 18 (run after storage/migrations/0018_session_listing.sql).
-- id_head is a session id's first 8 characters (storage/ops/open_ids.py HEAD), written
-- with the row: an id prefix of at least 8 characters is looked up by it through its
-- index (DuckDB reads no index for a range or a LIKE, nor for an expression). The
-- sessions already stored get theirs here, after the index is made (DuckDB makes no
-- index in a transaction with updates outstanding).

CREATE INDEX sessions_by_id_head ON sessions (id_head);
UPDATE sessions SET id_head = substr(id, 1, 8);
