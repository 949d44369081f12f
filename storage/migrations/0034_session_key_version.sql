-- turnkeeper schema version 34 (issue 23, "encryption at rest"): a session's data key
-- version on its own row, and the check value by which a wrong master key is refused.
--
-- sessions.key_version: the version of the data key the session's payloads are sealed
-- under (session_keys' newest), NULL for a session whose payloads are clear. Every append
-- reads it with the session's head and names it in the head's compare-and-set, so a store
-- object opened without keys never writes a clear payload into a sealed session (it sees
-- the version, typed refusal), a session whose key row is gone refuses writes instead of
-- writing clear, and an append that raced a rotation of the data key loses.
--
-- store_encryption.check_key_id, check_wrapped: a value the master key check_key_id
-- wrapped when the store was marked (or first opened with a provider after this
-- version): an open with a provider that cannot unwrap it (another key under that id, a
-- provider lacking it) is refused before it wraps anything.
--
-- The backfill gives each session holding a data key its newest version.

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS key_version BIGINT;

UPDATE sessions SET key_version = k.version FROM (
    SELECT session_id, max(version) AS version FROM session_keys GROUP BY session_id
) k WHERE sessions.id = k.session_id;

ALTER TABLE store_encryption ADD COLUMN IF NOT EXISTS check_key_id VARCHAR;
ALTER TABLE store_encryption ADD COLUMN IF NOT EXISTS check_wrapped BYTEA;
